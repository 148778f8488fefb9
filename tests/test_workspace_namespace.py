"""Put, replace, rename and remove, and the strong references each of them leaves.

Every strong reference is one RevisionRef row; the command that adds or removes it updates
ArtifactRevision.strong_reference_count and increments reference_epoch; when a count reaches zero
the same command stores last_zero_ref_version and a GcCandidate keyed by the new epoch.
"""

from __future__ import annotations

import io
import os

import pytest

from nokvfs.errors import (
    GenerationConflict,
    IndexValueInvalid,
    InvalidInput,
    IsADirectory,
    NotFound,
)
from nokvfs.schema import index_codec, keys
from nokvfs.schema.enums import (
    ChangeEventKind,
    GcClaimState,
    PublishPhase,
    ReferenceKind,
    RevisionState,
)
from nokvfs.schema.records import ChangeEvent, IndexField, SecondaryIndex
from nokvfs.workspace import append, namespace, publish
from nokvfs.workspace import workbench as wb
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    BLOCK,
    WB,
    all_rows,
    bench_fixture,
    block_keys,
    body,
    data_dir_fixture,
    entry,
    gc_candidates,
    get_bytes,
    manifest,
    present_keys,
    publish_ops,
    refs_to,
    revision,
    root_fixture,
    workspace_row,
)


def _owner(root, path: str) -> bytes:
    return publish.path_owner(wb.get(root, WB).incarnation_id, tuple(path.split("/")))


def assert_references(root, revision_id: bytes, *, count: int, epoch: int, owners: list[tuple[ReferenceKind, bytes]]):
    """The revision's count and epoch, and exactly one RevisionRef row per reference."""
    rev = revision(root, revision_id)
    assert rev is not None
    assert (rev.strong_reference_count, rev.reference_epoch) == (count, epoch)
    rows = refs_to(root, revision_id)
    assert len(rows) == count
    assert sorted((k.reference_kind, k.reference_owner_id) for k, _ in rows) == sorted(owners)
    return rev


def assert_gc_candidate(root, revision_id: bytes, *, epoch: int, version: int):
    rev = revision(root, revision_id)
    assert rev.strong_reference_count == 0
    assert rev.last_zero_ref_version == version
    candidates = gc_candidates(root, revision_id)
    assert epoch in candidates, candidates
    assert candidates[epoch].last_zero_ref_version == version
    assert candidates[epoch].claim_state == GcClaimState.Candidate


# --- put --------------------------------------------------------------------------------------


def test_put_creates_an_available_revision_with_one_path_reference(bench):
    root = bench
    data = body(3 * BLOCK + 100, "put")
    before = workspace_row(root, WB).workspace_revision
    found = namespace.put(root, WB, "outputs/a.bin", data, content_type="application/x-test", producer="unit")
    version = root.shard.commit_version
    assert found.generation == 1
    assert found.logical_size == len(data)
    assert found.created_version == found.modified_version == version
    assert (found.content_type, found.producer) == ("application/x-test", "unit")
    assert found.manifest_id == found.artifact_revision_id
    assert get_bytes(root, "outputs/a.bin") == data

    rev = assert_references(
        root, found.artifact_revision_id, count=1, epoch=1, owners=[(ReferenceKind.Path, _owner(root, "outputs/a.bin"))]
    )
    assert rev.state == RevisionState.Available
    assert rev.created_version == version
    assert rev.block_count == 4 and rev.dependency_count == 0 and rev.dependency_depth == 0
    assert rev.body_digest_uri == found.body_digest_uri
    ((ref_key, ref),) = refs_to(root, found.artifact_revision_id)
    assert ref.reference_epoch_at_add == 1 and ref.created_version == version
    assert gc_candidates(root, found.artifact_revision_id) == {}
    rows = manifest(root, found.artifact_revision_id)
    assert [(r.physical_owner_revision_id, r.physical_object_index, r.logical_offset, r.length) for r in rows] == [
        (found.artifact_revision_id, i, i * BLOCK, min(BLOCK, len(data) - i * BLOCK)) for i in range(4)
    ]
    assert [r.object_key for r in rows] == block_keys(root, found.artifact_revision_id, 4)
    assert workspace_row(root, WB).workspace_revision == before + 1
    (op,) = publish_ops(root).values()
    assert op.phase == PublishPhase.Published


def test_empty_body_is_a_revision_with_no_blocks(bench):
    found = namespace.put(bench, WB, "logs/empty", b"")
    assert found.logical_size == 0
    assert get_bytes(bench, "logs/empty") == b""
    assert revision(bench, found.artifact_revision_id).block_count == 0
    assert_references(
        bench, found.artifact_revision_id, count=1, epoch=1, owners=[(ReferenceKind.Path, _owner(bench, "logs/empty"))]
    )


def test_put_from_a_stream_spools_and_publishes(bench):
    data = body(5 * BLOCK + 7, "stream")
    found = namespace.put(bench, WB, "input/stream", io.BytesIO(data))
    assert found.logical_size == len(data)
    assert get_bytes(bench, "input/stream") == data
    assert os.listdir(bench.spool_dir) == []  # the spool file is gone once published


def test_replace_moves_the_path_reference_and_zeroes_the_old_revision(bench):
    root = bench
    first = namespace.put(root, WB, "outputs/f", body(5000, "v1"))
    second = namespace.put(root, WB, "outputs/f", body(7000, "v2"))
    version = root.shard.commit_version
    assert second.generation == 2
    assert second.created_version == first.created_version
    assert second.modified_version == version
    assert second.artifact_revision_id != first.artifact_revision_id
    assert get_bytes(root, "outputs/f") == body(7000, "v2")
    owner = _owner(root, "outputs/f")
    assert_references(root, second.artifact_revision_id, count=1, epoch=1, owners=[(ReferenceKind.Path, owner)])
    assert_references(root, first.artifact_revision_id, count=0, epoch=2, owners=[])
    assert_gc_candidate(root, first.artifact_revision_id, epoch=2, version=version)
    assert gc_candidates(root, second.artifact_revision_id) == {}
    # The zero-referenced revision keeps its manifest and objects until GC claims it.
    assert len(present_keys(root.store, block_keys(root, first.artifact_revision_id, 2))) == 2


def test_a_stale_expected_generation_fails_before_anything_is_uploaded(bench):
    root = bench
    namespace.put(root, WB, "outputs/f", b"one", expected_generation=0)
    version = root.shard.commit_version
    with pytest.raises(GenerationConflict):
        namespace.put(root, WB, "outputs/f", b"again", expected_generation=0)
    with pytest.raises(GenerationConflict):
        namespace.put(root, WB, "outputs/f", body(3 * BLOCK, "lost"), expected_generation=7)
    assert root.shard.commit_version == version  # no operation, no ledger, no upload
    assert sorted(op.phase.name for op in publish_ops(root).values()) == ["Published"]
    assert get_bytes(root, "outputs/f") == b"one"


def test_expected_generation_is_a_cas_and_a_race_loser_is_cleaned(bench, monkeypatch):
    root = bench
    namespace.put(root, WB, "outputs/f", b"one", expected_generation=0)
    # A concurrent writer wins between the precheck and the final command: the CAS decides.
    monkeypatch.setattr(publish, "_precheck", lambda root, pub: None)
    with pytest.raises(GenerationConflict):
        namespace.put(root, WB, "outputs/f", b"again", expected_generation=0)
    with pytest.raises(GenerationConflict):
        namespace.put(root, WB, "outputs/f", body(3 * BLOCK, "lost"), expected_generation=7)
    assert get_bytes(root, "outputs/f") == b"one"
    ops = publish_ops(root)
    assert sorted(op.phase.name for op in ops.values()) == ["Cleaned", "Cleaned", "Published"]
    for op in ops.values():
        if op.phase == PublishPhase.Cleaned:
            assert revision(root, op.artifact_revision_id) is None
            assert present_keys(root.store, block_keys(root, op.artifact_revision_id, max(op.object_count, 1))) == []
            assert "GenerationConflict" in op.terminal_error
    found = namespace.put(root, WB, "outputs/f", b"two", expected_generation=1)
    assert found.generation == 2


def test_put_into_a_missing_workbench_is_not_found_and_publishes_nothing(root):
    with pytest.raises(NotFound):
        namespace.put(root, "nobody", "outputs/x", b"x")
    assert publish_ops(root) == {}


# --- remove -----------------------------------------------------------------------------------


def test_remove_releases_the_reference_and_records_a_gc_candidate(bench):
    root = bench
    found = namespace.put(root, WB, "logs/run.log", body(100, "log"))
    removed = namespace.remove(root, WB, "logs/run.log")
    version = root.shard.commit_version
    assert removed == found
    assert entry(root, "logs/run.log") is None
    assert_references(root, found.artifact_revision_id, count=0, epoch=2, owners=[])
    assert_gc_candidate(root, found.artifact_revision_id, epoch=2, version=version)
    with pytest.raises(NotFound):
        namespace.remove(root, WB, "logs/run.log")
    # A new put at the path is a new revision at generation 1 again.
    again = namespace.put(root, WB, "logs/run.log", b"fresh")
    assert again.generation == 1 and again.artifact_revision_id != found.artifact_revision_id


def test_remove_with_a_stale_generation_is_a_conflict_and_changes_nothing(bench):
    root = bench
    namespace.put(root, WB, "logs/a", b"1")
    found = namespace.put(root, WB, "logs/a", b"2")
    version = root.shard.commit_version
    with pytest.raises(GenerationConflict):
        namespace.remove(root, WB, "logs/a", expected_generation=1)
    assert root.shard.commit_version == version
    assert_references(
        root, found.artifact_revision_id, count=1, epoch=1, owners=[(ReferenceKind.Path, _owner(root, "logs/a"))]
    )
    namespace.remove(root, WB, "logs/a", expected_generation=2)
    assert entry(root, "logs/a") is None


def test_removing_a_directory_is_not_found(bench):
    namespace.put(bench, WB, "outputs/d/x", b"x")
    with pytest.raises(NotFound):
        namespace.remove(bench, WB, "outputs/d")


# --- rename -----------------------------------------------------------------------------------


def test_rename_moves_the_reference_in_one_command(bench):
    root = bench
    found = namespace.put(root, WB, "outputs/old", body(2 * BLOCK, "mv"))
    version = root.shard.commit_version
    moved = namespace.rename(root, WB, "outputs/old", "outputs/sub/new")
    assert root.shard.commit_version == version + 1
    assert moved.artifact_revision_id == found.artifact_revision_id
    assert moved.generation == 1
    assert entry(root, "outputs/old") is None
    assert get_bytes(root, "outputs/sub/new") == body(2 * BLOCK, "mv")
    # add (+1) then remove (+1): one reference, epoch 3, never zero so no candidate.
    assert_references(
        root,
        found.artifact_revision_id,
        count=1,
        epoch=3,
        owners=[(ReferenceKind.Path, _owner(root, "outputs/sub/new"))],
    )
    assert gc_candidates(root, found.artifact_revision_id) == {}


def test_rename_over_an_existing_file_releases_the_target_revision(bench):
    root = bench
    src = namespace.put(root, WB, "outputs/a", b"A")
    namespace.put(root, WB, "outputs/b", b"B1")
    dst = namespace.put(root, WB, "outputs/b", b"B2")
    with pytest.raises(GenerationConflict):
        namespace.rename(root, WB, "outputs/a", "outputs/b", replace=False)
    moved = namespace.rename(root, WB, "outputs/a", "outputs/b")
    version = root.shard.commit_version
    assert moved.generation == dst.generation + 1 == 3
    assert get_bytes(root, "outputs/b") == b"A"
    assert entry(root, "outputs/a") is None
    assert_references(
        root, src.artifact_revision_id, count=1, epoch=3, owners=[(ReferenceKind.Path, _owner(root, "outputs/b"))]
    )
    assert_references(root, dst.artifact_revision_id, count=0, epoch=2, owners=[])
    assert_gc_candidate(root, dst.artifact_revision_id, epoch=2, version=version)


def test_rename_refusals(bench):
    root = bench
    namespace.put(root, WB, "outputs/file", b"f")
    namespace.put(root, WB, "outputs/dir/x", b"x")
    version = root.shard.commit_version
    with pytest.raises(NotFound):
        namespace.rename(root, WB, "outputs/missing", "outputs/y")
    with pytest.raises(InvalidInput):
        namespace.rename(root, WB, "outputs/file", "outputs/file")
    with pytest.raises(InvalidInput):  # below a file
        namespace.rename(root, WB, "outputs/dir/x", "outputs/file/x")
    with pytest.raises(InvalidInput):  # onto a directory
        namespace.rename(root, WB, "outputs/file", "outputs/dir")
    with pytest.raises(InvalidInput):  # onto a section
        namespace.rename(root, WB, "outputs/file", "logs")
    assert root.shard.commit_version == version


# --- one file beside or below another ----------------------------------------------------------


def test_a_path_cannot_be_both_a_file_and_a_directory(bench):
    root = bench
    namespace.put(root, WB, "outputs/a", b"file")
    namespace.put(root, WB, "outputs/d/e/f", b"deep")
    with pytest.raises(InvalidInput):
        namespace.put(root, WB, "outputs/a/b", b"below a file")
    with pytest.raises(InvalidInput):
        namespace.put(root, WB, "outputs/d/e", b"over a directory")
    with pytest.raises(InvalidInput):
        namespace.put(root, WB, "outputs/d", b"over a directory")
    with pytest.raises(IsADirectory):
        append.append(root, WB, "outputs/d", b"x")
    # Siblings sharing a prefix are independent.
    namespace.put(root, WB, "outputs/a-b", b"sibling")
    namespace.put(root, WB, "outputs/ab", b"sibling")
    namespace.put(root, WB, "outputs/d-e", b"sibling")
    assert get_bytes(root, "outputs/a") == b"file"
    # Refused publishes left nothing behind.
    for op in publish_ops(root).values():
        assert op.phase in (PublishPhase.Published, PublishPhase.Cleaned)
        if op.phase == PublishPhase.Cleaned:
            assert revision(root, op.artifact_revision_id) is None


# --- index rows and events follow the path in the same command ---------------------------------


def test_secondary_index_rows_follow_put_rename_and_remove(bench):
    root = bench
    inc = wb.get(root, WB).incarnation_id
    field = IndexField("kind", index_codec.encode(index_codec.string("model")))

    def index_rows():
        return sorted(
            (keys.SecondaryIndexKey.decode(k).path, SecondaryIndex.decode(v).path_generation)
            for k, v in all_rows(root, "secondary_index", root.root_id)
        )

    namespace.put(root, WB, "outputs/m", b"m", index_fields=[field])
    assert index_rows() == [(("outputs", "m"), 1)]
    namespace.rename(root, WB, "outputs/m", "outputs/n")
    assert index_rows() == [(("outputs", "n"), 1)]
    namespace.put(root, WB, "outputs/n", b"m2")  # no fields: the row goes
    assert index_rows() == []
    namespace.put(root, WB, "outputs/n", b"m3", index_fields=[field])
    namespace.remove(root, WB, "outputs/n")
    assert index_rows() == []
    assert inc == wb.get(root, WB).incarnation_id


def test_each_change_emits_one_event(bench):
    root = bench
    namespace.put(root, WB, "outputs/e", b"1")
    namespace.rename(root, WB, "outputs/e", "outputs/f")
    append.append(root, WB, "outputs/f", b"2")
    namespace.remove(root, WB, "outputs/f")
    events = [ChangeEvent.decode(v) for _, v in all_rows(root, "change_event", root.root_id)]
    assert [(e.kind, e.path) for e in events] == [
        (ChangeEventKind.WorkspaceCreated, None),
        (ChangeEventKind.PathPut, "outputs/e"),
        (ChangeEventKind.PathRenamed, "outputs/f"),
        (ChangeEventKind.PathAppended, "outputs/f"),
        (ChangeEventKind.PathRemoved, "outputs/f"),
    ]
    assert {e.workbench_id for e in events} == {WB}


@pytest.mark.parametrize(
    "fields",
    [
        [IndexField("kind", b"\x05model")],  # not the codec's version byte
        [IndexField("kind", index_codec.encode(index_codec.string("m")) + b"trailing")],
        [IndexField("kind", b"")],
        [IndexField("", index_codec.encode(index_codec.null()))],
        [IndexField("a\x00b", index_codec.encode(index_codec.null()))],
        [
            IndexField("k", index_codec.encode(index_codec.int_(1))),
            IndexField("k", index_codec.encode(index_codec.int_(2))),
        ],
    ],
)
def test_invalid_index_fields_are_refused_before_upload(bench, fields):
    version = bench.shard.commit_version
    with pytest.raises(IndexValueInvalid):
        namespace.put(bench, WB, "outputs/i", b"x", index_fields=fields)
    assert bench.shard.commit_version == version
    assert all_rows(bench, "secondary_index", bench.root_id) == []
