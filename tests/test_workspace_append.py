"""Append: a new revision whose manifest reuses the base's rows, with one RevisionDependency
reference to every distinct owner of a reused block, within 64 owners and depth 8; beyond either
limit the complete body is rematerialised under the new revision with no dependencies. Always a
generation CAS on the base.
"""

from __future__ import annotations

import hashlib
import threading

import pytest

from nokvfs.engine.command import Absent, Put
from nokvfs.errors import GenerationConflict, NotFound, ReservedPath
from nokvfs.schema import keys
from nokvfs.schema.enums import (
    ChangeEventKind,
    PublishPhase,
    ReferenceKind,
    RevisionState,
)
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import ArtifactManifest, ArtifactRevision, PathEntry
from nokvfs.workspace import append, namespace, publish
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    BLOCK,
    WB,
    bench_fixture,
    block_keys,
    body,
    data_dir_fixture,
    entry,
    get_bytes,
    manifest,
    present_keys,
    publish_ops,
    refs_owned_by,
    refs_to,
    revision,
    root_fixture,
)

PATH = "logs/train.log"


def _owners(rows) -> set[bytes]:
    return {r.physical_owner_revision_id for r in rows}


def _dependency_targets(root, child: bytes) -> set[bytes]:
    return {k.artifact_revision_id for k in refs_owned_by(root, ReferenceKind.RevisionDependency, child)}


def _path_owner(root, path=PATH) -> bytes:
    return publish.path_owner(wb.get(root, WB).incarnation_id, tuple(path.split("/")))


def test_append_reuses_the_base_rows_and_depends_on_their_owner(bench):
    root = bench
    base_data = body(2 * BLOCK + 300, "base")
    base = namespace.put(root, WB, PATH, base_data, content_type="text/plain", producer="trainer")
    delta = body(BLOCK + 10, "delta")
    child = append.append(root, WB, PATH, delta)
    version = root.shard.commit_version

    assert child.generation == 2
    assert child.logical_size == len(base_data) + len(delta)
    assert child.body_digest_uri == "sha256:" + hashlib.sha256(base_data + delta).hexdigest()
    assert (child.content_type, child.producer) == ("text/plain", "trainer")
    assert get_bytes(root, PATH) == base_data + delta

    base_rows = manifest(root, base.artifact_revision_id)
    rows = manifest(root, child.artifact_revision_id)
    assert rows[: len(base_rows)] == base_rows  # the base rows, unchanged (owner, index, key)
    own = rows[len(base_rows) :]
    assert [(r.physical_owner_revision_id, r.physical_object_index) for r in own] == [
        (child.artifact_revision_id, 0),
        (child.artifact_revision_id, 1),
    ]
    assert [r.object_key for r in own] == block_keys(root, child.artifact_revision_id, 2)
    assert [r.logical_offset for r in rows] == [0, BLOCK, 2 * BLOCK, 2 * BLOCK + 300, 3 * BLOCK + 300]

    rev = revision(root, child.artifact_revision_id)
    assert (rev.dependency_count, rev.dependency_depth) == (1, 1)
    assert (child.dependency_count, child.dependency_depth) == (1, 1)
    assert rev.dependency_digest == hashlib.sha256(base.artifact_revision_id).digest()
    assert rev.block_count == 5
    assert (rev.strong_reference_count, rev.reference_epoch) == (1, 1)
    assert [k.reference_kind for k, _ in refs_to(root, child.artifact_revision_id)] == [ReferenceKind.Path]

    # The base lost its Path reference and gained the child's dependency: still one, epoch 3.
    base_rev = revision(root, base.artifact_revision_id)
    assert (base_rev.strong_reference_count, base_rev.reference_epoch) == (1, 3)
    ((ref_key, ref),) = refs_to(root, base.artifact_revision_id)
    assert (ref_key.reference_kind, ref_key.reference_owner_id) == (
        ReferenceKind.RevisionDependency,
        child.artifact_revision_id,
    )
    assert ref.created_version == version
    assert _dependency_targets(root, child.artifact_revision_id) == {base.artifact_revision_id}


def test_an_append_continues_the_hash_of_a_base_this_process_published(monkeypatch, bench):
    """`echo line >> log`: the seed's digest covers the whole body, but the base this process
    just published (or appended) is not read back to hash it (nokvfs.workspace.hashstates); a
    base it does not know is read, and the digests are the same either way."""
    from nokvfs.workspace import hashstates, reading

    root = bench
    reads = []
    real_iter_body = reading.iter_body
    monkeypatch.setattr(reading, "iter_body", lambda *a, **kw: reads.append(a) or real_iter_body(*a, **kw))
    whole = body(2 * BLOCK + 300, "base")
    namespace.put(root, WB, PATH, whole)
    for n in range(5):
        line = b"line %d\n" % n
        child = append.append(root, WB, PATH, line)
        whole += line
        assert child.body_digest_uri == "sha256:" + hashlib.sha256(whole).hexdigest()
    assert reads == [] and get_bytes(root, PATH) == whole
    hashstates.STATES.clear()  # another process, or a state pushed out: the base is read
    child = append.append(root, WB, PATH, b"after\n")
    assert len(reads) == 1 and child.body_digest_uri == "sha256:" + hashlib.sha256(whole + b"after\n").hexdigest()
    append.append(root, WB, PATH, b"and again\n")
    assert len(reads) == 1  # kept again from that append on


def test_a_hash_state_is_kept_only_under_the_digest_it_gives():
    import hashlib as h

    from nokvfs.workspace.hashstates import HashStates

    states = HashStates(limit=2)
    states.remember(b"r1", 3, h.sha256(b"abc"), "sha256:" + h.sha256(b"abd").hexdigest())
    assert states.resume(b"r1", 3) is None and len(states) == 0
    states.remember(b"r1", 3, h.sha256(b"abc"), "sha256:" + h.sha256(b"abc").hexdigest())
    assert states.resume(b"r1", 4) is None  # another size: not this state
    resumed = states.resume(b"r1", 3)
    resumed.update(b"d")
    assert states.resume(b"r1", 3).hexdigest() == h.sha256(b"abc").hexdigest()  # a copy was handed out
    for name in (b"r2", b"r3"):
        states.remember(name, 1, h.sha256(b"x"), "sha256:" + h.sha256(b"x").hexdigest())
    assert states.resume(b"r1", 3) is None and len(states) == 2  # bounded, least recently used out


def test_each_append_depends_on_every_distinct_owner_and_counts_stay_exact(bench):
    root = bench
    data = body(1000, "a0")
    revisions = [namespace.put(root, WB, PATH, data).artifact_revision_id]
    for i in range(1, 5):
        chunk = body(700 + i, f"a{i}")
        data += chunk
        found = append.append(root, WB, PATH, chunk)
        revisions.append(found.artifact_revision_id)
        assert get_bytes(root, PATH) == data
        assert (found.dependency_count, found.dependency_depth) == (i, i)
        assert _dependency_targets(root, found.artifact_revision_id) == set(revisions[:i])
        rev = revision(root, found.artifact_revision_id)
        assert rev.dependency_digest == hashlib.sha256(b"".join(sorted(revisions[:i]))).digest()
    # r_k is referenced by the path (if current) and by every later revision's dependency.
    last = len(revisions) - 1
    for k, revision_id in enumerate(revisions):
        rev = revision(root, revision_id)
        expected = (last - k) + (1 if k == last else 0)
        assert rev.strong_reference_count == expected == len(refs_to(root, revision_id))
        assert rev.state == RevisionState.Available


def test_depth_limit_rematerialises_the_whole_body_under_the_new_revision(bench):
    root = bench
    data = body(5000, "d0")
    namespace.put(root, WB, PATH, data)
    depths = []
    for i in range(1, 10):
        chunk = body(3000, f"d{i}")
        data += chunk
        found = append.append(root, WB, PATH, chunk)
        depths.append(found.dependency_depth)
    assert depths == [1, 2, 3, 4, 5, 6, 7, 8, 0]
    assert found.dependency_count == 0
    assert found.generation == 10
    rev = revision(root, found.artifact_revision_id)
    assert (rev.dependency_count, rev.dependency_depth) == (0, 0)
    assert rev.dependency_digest == hashlib.sha256(b"").digest()
    rows = manifest(root, found.artifact_revision_id)
    assert _owners(rows) == {found.artifact_revision_id}
    assert [r.physical_object_index for r in rows] == list(range(len(rows)))
    assert [r.length for r in rows] == [BLOCK] * (len(data) // BLOCK) + [len(data) % BLOCK]
    assert len(present_keys(root.store, block_keys(root, found.artifact_revision_id, len(rows)))) == len(rows)
    assert _dependency_targets(root, found.artifact_revision_id) == set()
    assert get_bytes(root, PATH) == data
    assert found.body_digest_uri == "sha256:" + hashlib.sha256(data).hexdigest()
    # It is still an append (event kind, generation CAS), and the next append depends on it alone.
    (op,) = [op for op in publish_ops(root).values() if op.artifact_revision_id == found.artifact_revision_id]
    assert op.event_kind == ChangeEventKind.PathAppended and op.expected_generation == 9
    after = append.append(root, WB, PATH, b"tail")
    assert (after.dependency_count, after.dependency_depth) == (1, 1)
    assert _dependency_targets(root, after.artifact_revision_id) == {found.artifact_revision_id}
    assert get_bytes(root, PATH) == data + b"tail"


def test_owner_limit_rematerialises_when_lowered(monkeypatch, bench):
    root = bench
    monkeypatch.setattr(append, "MAX_DEPENDENCY_OWNERS", 3)
    data = body(100, "o0")
    namespace.put(root, WB, PATH, data)
    counts = []
    for i in range(1, 6):
        chunk = body(50, f"o{i}")
        data += chunk
        counts.append(append.append(root, WB, PATH, chunk).dependency_count)
        assert get_bytes(root, PATH) == data
    assert counts == [1, 2, 3, 0, 1]


def _compose(root, path: str, sources: list[PathEntry]) -> PathEntry:
    """Publish at `path` a revision that reuses the first block of each source file (so it has as
    many distinct owners as sources, at depth 1), through the same reference rules as publish."""
    revision_id = new_id16()
    rows, data, offset = [], b"", 0
    for source in sources:
        first = manifest(root, source.artifact_revision_id)[0]
        rows.append(
            ArtifactManifest(
                first.physical_owner_revision_id,
                first.physical_object_index,
                first.object_key,
                offset,
                0,
                first.length,
                first.digest_uri,
                None,
            )
        )
        data += root.blocks.read_block(first.object_key, first.digest_uri, first.length)
        offset += first.length
    owners = sorted(_owners(rows))
    components = tuple(path.split("/"))

    def build(view):
        version = view.version + 1
        raw_wb, bench = wb.visible(view, root.root_id, WB)
        refs = References(view, root.root_id)
        rev = ArtifactRevision(
            logical_size=offset,
            body_digest_uri="sha256:" + hashlib.sha256(data).hexdigest(),
            manifest_digest_uri="sha256:" + publish.manifest_digest(rows).hex(),
            block_count=len(rows),
            dependency_count=len(owners),
            dependency_depth=1,
            dependency_digest=hashlib.sha256(b"".join(owners)).digest(),
            content_type="application/octet-stream",
            state=RevisionState.Available,
            reference_epoch=0,
            strong_reference_count=0,
            last_zero_ref_version=0,
            created_version=version,
        )
        refs.create(revision_id, rev)
        refs.add(ReferenceKind.Path, publish.path_owner(bench.incarnation_id, components), revision_id)
        for owner in owners:
            refs.add(ReferenceKind.RevisionDependency, revision_id, owner)
        found = PathEntry(
            1,
            revision_id,
            offset,
            rev.body_digest_uri,
            rev.manifest_digest_uri,
            len(owners),
            1,
            rev.content_type,
            "",
            revision_id,
            version,
            version,
            (),
        )
        predicates, mutations = refs.rows()
        key = keys.path_current_key(root.root_id, bench.incarnation_id, components)
        wb_pred, wb_mut = wb.advance_revision(root.root_id, WB, raw_wb, version)
        predicates += [Absent("path_current", key), wb_pred]
        mutations += [Put("path_current", key, found), wb_mut]
        mutations += [
            Put("artifact_manifest", keys.ArtifactManifestKey(root.root_id, revision_id, i).encode(), r)
            for i, r in enumerate(rows)
        ]
        return Built(predicates=predicates, mutations=mutations, value=found)

    _, built = root.apply(build, digest=intent_digest("test.compose", revision_id))
    assert get_bytes(root, path) == data
    return built.value


@pytest.mark.parametrize("owners, rematerialised", [(64, False), (65, True)])
def test_the_64_owner_limit(bench, owners, rematerialised):
    root = bench
    sources = [namespace.put(root, WB, f"input/part{i:03d}", body(BLOCK, f"p{i}")) for i in range(owners)]
    composite = _compose(root, PATH, sources)
    before = get_bytes(root, PATH)
    found = append.append(root, WB, PATH, b"+delta")
    assert get_bytes(root, PATH) == before + b"+delta"
    rows = manifest(root, found.artifact_revision_id)
    deps = _dependency_targets(root, found.artifact_revision_id)
    if rematerialised:
        assert (found.dependency_count, found.dependency_depth) == (0, 0)
        assert deps == set()
        assert _owners(rows) == {found.artifact_revision_id}
    else:
        assert (found.dependency_count, found.dependency_depth) == (64, 1)  # the composite owns no block
        assert deps == {s.artifact_revision_id for s in sources}
        assert revision(root, found.artifact_revision_id).dependency_count == 64
    # The composite lost its path reference; with no dependents it is a GC candidate.
    comp = revision(root, composite.artifact_revision_id)
    assert comp.strong_reference_count == 0 == len(refs_to(root, composite.artifact_revision_id))


def test_append_is_a_generation_cas(bench):
    root = bench
    namespace.put(root, WB, PATH, b"0")
    append.append(root, WB, PATH, b"1", expected_generation=1)
    with pytest.raises(GenerationConflict):
        append.append(root, WB, PATH, b"stale", expected_generation=1)
    assert get_bytes(root, PATH) == b"01"


def test_an_append_that_loses_to_a_replace_is_cleaned(monkeypatch, bench):
    root = bench
    namespace.put(root, WB, PATH, b"base")
    real_finalize = publish.finalize
    replaced = []

    def finalize_then_race(root_, operation_id, **kwargs):
        real_finalize(root_, operation_id, **kwargs)
        if not replaced:  # another writer replaces the path between finalize and publish
            replaced.append(True)
            namespace.put(root, WB, PATH, b"replacement")

    monkeypatch.setattr(publish, "finalize", finalize_then_race)
    with pytest.raises(GenerationConflict):
        append.append(root, WB, PATH, body(2 * BLOCK, "late"))
    assert get_bytes(root, PATH) == b"replacement"
    lost = [op for op in publish_ops(root).values() if op.event_kind == ChangeEventKind.PathAppended]
    assert len(lost) == 1 and lost[0].phase == PublishPhase.Cleaned
    assert revision(root, lost[0].artifact_revision_id) is None
    assert present_keys(root.store, block_keys(root, lost[0].artifact_revision_id, 2)) == []


def test_concurrent_appends_have_one_winner(bench):
    root = bench
    namespace.put(root, WB, PATH, b"start|")
    for _round in range(5):
        generation = entry(root, PATH).generation
        before = get_bytes(root, PATH)
        barrier = threading.Barrier(2)
        outcomes = []

        def go(tag):
            barrier.wait()
            try:
                outcomes.append(("won", tag, append.append(root, WB, PATH, tag, expected_generation=generation)))
            except GenerationConflict:
                outcomes.append(("conflict", tag, None))

        threads = [threading.Thread(target=go, args=(t,)) for t in (b"A" * 5000, b"B" * 5000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [o for o in outcomes if o[0] == "won"]
        assert len(won) == 1 and len(outcomes) == 2
        assert get_bytes(root, PATH) == before + won[0][1]
        assert entry(root, PATH).generation == generation + 1
    phases = sorted(op.phase.name for op in publish_ops(root).values())
    assert phases.count("Cleaned") == 5 and phases.count("Published") == 6


def test_append_refusals(bench):
    root = bench
    with pytest.raises(NotFound):
        append.append(root, WB, "logs/missing", b"x")
    with pytest.raises(ReservedPath):
        append.append(root, WB, "metadata/run_manifest.json", b"x")
    with pytest.raises(NotFound):
        append.append(root, "no-such-bench", PATH, b"x")
    assert publish_ops(root) == {}


def test_empty_append_reuses_everything_and_uploads_nothing(bench):
    root = bench
    base = namespace.put(root, WB, PATH, body(BLOCK + 1, "e"))
    found = append.append(root, WB, PATH, b"")
    assert found.generation == 2 and found.logical_size == BLOCK + 1
    assert manifest(root, found.artifact_revision_id) == manifest(root, base.artifact_revision_id)
    assert _dependency_targets(root, found.artifact_revision_id) == {base.artifact_revision_id}
    assert get_bytes(root, PATH) == body(BLOCK + 1, "e")
