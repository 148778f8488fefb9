"""GC: exactly the bytes nothing references are freed, never a referenced or held object."""

from __future__ import annotations

import os
import threading

import pytest

from nokvfs.errors import AmbiguousResult
from nokvfs.objects.store import ObjectStore
from nokvfs.schema import keys
from nokvfs.schema.enums import GcClaimState, GcPhase, OperationKind, RevisionState
from nokvfs.schema.records import ArtifactRevision, GcCandidate, GcOperation
from nokvfs.workspace import (
    append,
    datadir,
    fsck,
    gc,
    listing,
    namespace,
    reading,
    snapshot,
    workbench,
)
from tests.workspace_helpers import opened_root

BLOCK = 4096


pytest_plugins = ["tests.s3_fixtures"]


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("w",), block_size=BLOCK) as r:
        yield r


@pytest.fixture(params=["local", "s3"])
def any_root(request, tmp_path):
    """A root on the local store, then on the loopback S3 endpoint."""
    options = {}
    if request.param == "s3":
        options = dict(
            store=f"s3://{request.getfixturevalue('s3_bucket')}/gc", endpoint_url=request.getfixturevalue("s3_endpoint")
        )
    datadir.init(str(tmp_path / "data"), block_size=BLOCK, **options)
    r = datadir.open_root(str(tmp_path / "data"))
    workbench.create(r, "w")
    yield r
    r.close()


def stored_bytes(root):
    total = 0
    for info in root.store.list("nokv/artifacts/"):
        total += info.size
    return total


def revision(root, revision_id):
    with root.read() as view:
        return ArtifactRevision.decode(
            view.get("artifact_revision", keys.ArtifactRevisionKey(root.root_id, revision_id).encode())
        )


def read(root, path):
    with root.read() as view:
        return reading.read(root, listing.stat(view, root, "w", path).entry)


def test_removing_a_path_frees_exactly_its_bytes(root):
    keep = namespace.put(root, "w", "outputs/keep", b"k" * 10_000)
    gone = namespace.put(root, "w", "outputs/gone", b"g" * 9_000)
    assert stored_bytes(root) == 19_000
    assert gc.collect(root).freed_revisions == 0  # everything is referenced
    namespace.remove(root, "w", "outputs/gone")
    report = gc.collect(root)
    assert (report.freed_revisions, report.freed_bytes, report.deleted_objects) == (1, 9_000, 3)
    assert stored_bytes(root) == 10_000
    assert revision(root, gone.artifact_revision_id).state == RevisionState.Deleted
    assert revision(root, keep.artifact_revision_id).state == RevisionState.Available
    assert read(root, "outputs/keep") == b"k" * 10_000


def test_replacing_a_file_frees_the_old_revision_and_rename_frees_nothing(root):
    old = namespace.put(root, "w", "outputs/f", b"1" * 5_000)
    namespace.put(root, "w", "outputs/f", b"2" * 3_000)
    namespace.rename(root, "w", "outputs/f", "logs/f")
    report = gc.collect(root)
    assert report.freed == [old.artifact_revision_id.hex()] and report.freed_bytes == 5_000
    assert read(root, "logs/f") == b"2" * 3_000


def test_dry_run_reports_and_changes_nothing(root):
    namespace.put(root, "w", "outputs/f", b"x" * 5_000)
    namespace.remove(root, "w", "outputs/f")
    version = root.shard.commit_version
    report = gc.collect(root, dry_run=True)
    assert report.freed_bytes == 5_000 and report.freed_revisions == 0
    assert root.shard.commit_version == version and stored_bytes(root) == 5_000


def test_a_snapshot_hold_keeps_a_zero_reference_revision_until_it_is_retired(root):
    namespace.put(root, "w", "outputs/f", b"old" * 1_000)
    snap = snapshot.mint(root, "w")
    namespace.remove(root, "w", "outputs/f")
    report = gc.collect(root)
    assert report.freed_revisions == 0 and report.held == 1
    with root.read() as view:
        at = snapshot.view_at(view, root, snapshot.get(root, "w", snap.snapshot_id))
        assert reading.read(root, listing.stat(at, root, "w", "outputs/f").entry, view=at) == b"old" * 1_000
    snapshot.retire(root, "w", snap.snapshot_id)
    assert gc.collect(root).freed_bytes == 3_000


def test_an_append_chain_is_freed_child_first_in_one_collect(root):
    namespace.put(root, "w", "logs/l", b"a" * 5_000)
    for i in range(3):
        append.append(root, "w", "logs/l", bytes([98 + i]) * 1_000)
    assert read(root, "logs/l") == b"a" * 5_000 + b"b" * 1_000 + b"c" * 1_000 + b"d" * 1_000
    namespace.remove(root, "w", "logs/l")
    report = gc.collect(root)
    assert report.freed_revisions == 4 and report.freed_bytes == 8_000
    assert stored_bytes(root) == 0


def test_a_base_stays_readable_while_its_appended_child_lives(root):
    base = namespace.put(root, "w", "logs/l", b"a" * 5_000)
    append.append(root, "w", "logs/l", b"b" * 10)
    # The base has no Path reference any more, only the child's RevisionDependency.
    assert revision(root, base.artifact_revision_id).strong_reference_count == 1
    assert gc.collect(root).freed_revisions == 0
    assert read(root, "logs/l") == b"a" * 5_000 + b"b" * 10


def test_a_stale_candidate_is_never_claimed(root):
    entry = namespace.put(root, "w", "outputs/f", b"x" * 100)
    namespace.rename(root, "w", "outputs/f", "outputs/g")  # add then remove: count never hit zero
    with root.read() as view:
        prefix = root.root_id + entry.artifact_revision_id
        assert view.seek("gc_candidate", prefix, within=prefix) is None
    namespace.remove(root, "w", "outputs/g")
    # Re-reference by a new publication of different bytes does not resurrect; the zero stands.
    report = gc.collect(root)
    assert report.freed_revisions == 1


class AmbiguousDeletes:
    """A real store whose deletes time out after sending: the outcome is unknown."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def delete(self, key):
        raise AmbiguousResult(f"timed out deleting {key}")

    delete_many = ObjectStore.delete_many  # key by key through this wrapper's `delete`


class UnansweringHeads(AmbiguousDeletes):
    """A store that cannot even say whether an object exists."""

    def head(self, key):
        raise AmbiguousResult(f"timed out probing {key}")


class DeletesThatLandButTimeOut(AmbiguousDeletes):
    def delete(self, key):
        self._store.delete(key)
        raise AmbiguousResult(f"timed out after deleting {key}")


def candidate_of(root, revision_id):
    epoch = revision(root, revision_id).reference_epoch
    with root.read() as view:
        return GcCandidate.decode(
            view.get("gc_candidate", keys.GcCandidateKey(root.root_id, revision_id, epoch).encode())
        )


def collect_with(root, store, **kw):
    real = root.store
    root.store = store(real)
    try:
        return gc.collect(root, **kw)
    finally:
        root.store = real


def test_an_ambiguous_delete_quarantines_and_is_reconciled_once_the_store_answers(any_root):
    root = any_root
    entry = namespace.put(root, "w", "outputs/f", b"q" * 5_000)
    namespace.remove(root, "w", "outputs/f")
    report = collect_with(root, AmbiguousDeletes)
    assert report.quarantined == 1 and report.freed_revisions == 0
    assert revision(root, entry.artifact_revision_id).state == RevisionState.Quarantined
    candidate = candidate_of(root, entry.artifact_revision_id)
    assert candidate.claim_state == GcClaimState.Quarantined and "timed out" in candidate.quarantine_evidence
    assert [f.code for f in fsck.check(root).findings] == ["QUARANTINED"]
    # A store that cannot answer a probe: nothing is guessed, nothing changes.
    version = root.shard.commit_version
    report = collect_with(root, UnansweringHeads)
    assert (report.reconciled, report.freed_revisions) == (0, 0) and root.shard.commit_version == version
    # Probes answer but deletes still time out: taken up, and quarantined again with a retry more.
    report = collect_with(root, AmbiguousDeletes)
    assert (report.reconciled, report.quarantined, report.freed_revisions) == (1, 1, 0)
    assert candidate_of(root, entry.artifact_revision_id).retry_count == 2
    assert stored_bytes(root) == 5_000
    # The store answers: the next run finishes the collection.
    report = gc.collect(root)
    assert (report.reconciled, report.freed_revisions, report.freed_bytes) == (1, 1, 5_000)
    assert revision(root, entry.artifact_revision_id).state == RevisionState.Deleted
    assert candidate_of(root, entry.artifact_revision_id).claim_state == GcClaimState.Complete
    assert stored_bytes(root) == 0 and fsck.check(root).ok


def test_a_delete_that_landed_before_its_answer_was_lost_is_reconciled_to_deleted(any_root):
    root = any_root
    entry = namespace.put(root, "w", "outputs/f", b"d" * 9_000)
    namespace.remove(root, "w", "outputs/f")
    assert collect_with(root, DeletesThatLandButTimeOut).quarantined == 1
    # One object is gone, the others are not: fsck says quarantined, not missing blocks.
    assert [f.code for f in fsck.check(root).findings] == ["QUARANTINED"]
    report = gc.collect(root)
    assert (report.reconciled, report.freed_revisions, report.freed_bytes) == (1, 1, 9_000)
    assert revision(root, entry.artifact_revision_id).state == RevisionState.Deleted
    assert stored_bytes(root) == 0 and fsck.check(root).ok


def test_a_killed_collector_is_resumed_by_the_next_run(root):
    entry = namespace.put(root, "w", "outputs/f", b"z" * 5_000)
    namespace.remove(root, "w", "outputs/f")
    epoch = revision(root, entry.artifact_revision_id).reference_epoch
    gc._advance_barrier(root)
    gc._claim(root, entry.artifact_revision_id, epoch)  # the collector dies right after claiming
    op_key = keys.OperationKey(
        root.root_id, OperationKind.Gc, gc.operation_id(root.root_id, entry.artifact_revision_id, epoch)
    ).encode()
    report = gc.collect(root)
    assert report.freed_revisions == 1 and stored_bytes(root) == 0
    with root.read() as view:
        assert GcOperation.decode(view.get("operation", op_key)).phase == GcPhase.Deleted


def test_gc_never_deletes_a_referenced_object_under_concurrent_publishes(root):
    stop = threading.Event()
    errors = []

    def churn(worker):
        i = 0
        while not stop.is_set() and i < 40:
            path = f"outputs/w{worker}/f{i % 5}"
            try:
                namespace.put(root, "w", path, os.urandom(1_000 + i))
                if i % 3 == 0:
                    namespace.remove(root, "w", path)
            except Exception as exc:
                errors.append(exc)
            i += 1

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for _ in range(5):
        gc.collect(root)
    for t in threads:
        t.join()
    stop.set()
    gc.collect(root)
    unexpected = [e for e in errors if type(e).__name__ not in ("GenerationConflict", "NotFound")]
    assert not unexpected, [f"{type(e).__name__}: {e}" for e in unexpected]
    with root.read() as view:
        files = listing.list_recursive(view, root, "w").children
    referenced = sum(c.entry.logical_size for c in files)
    for child in files:
        with root.read() as view:
            assert len(reading.read(root, child.entry, view=view)) == child.entry.logical_size
    assert stored_bytes(root) == referenced


def test_a_killed_collector_is_resumed_behind_more_than_one_page_of_finished_operations(root):
    """Finished GC operations accumulate; resumption must look past the first bounded page."""
    from nokvfs.engine.command import Put
    from nokvfs.workspace.root import Built, intent_digest

    # 300 finished operations whose ids sort before any real (hash-derived) one.
    finished = [
        Put(
            "operation",
            keys.OperationKey(root.root_id, OperationKind.Gc, bytes(14) + i.to_bytes(2, "big")).encode(),
            GcOperation(bytes(16), 1, GcPhase.Deleted, 0, b"", 0, b"", None, None, 1),
        )
        for i in range(300)
    ]
    root.apply(lambda view: Built(mutations=finished), digest=intent_digest("test.finished-gc-ops"))
    stuck = namespace.put(root, "w", "outputs/stuck", b"s" * 100)
    namespace.remove(root, "w", "outputs/stuck")
    epoch = revision(root, stuck.artifact_revision_id).reference_epoch
    gc._advance_barrier(root)
    gc._claim(root, stuck.artifact_revision_id, epoch)  # the collector dies right after claiming
    report = gc.collect(root)
    assert stuck.artifact_revision_id.hex() in report.freed
    assert revision(root, stuck.artifact_revision_id).state == RevisionState.Deleted


@pytest.mark.parametrize("way", ["remove", "replace", "retire-commit", "reap-snapshot"])
def test_each_way_a_reference_goes_frees_exactly_the_bytes_nothing_else_references(any_root, way):
    from nokvfs.workspace import commit

    root = any_root
    kept = namespace.put(root, "w", "outputs/kept", b"k" * 6_000)
    old = namespace.put(root, "w", "outputs/f", b"o" * 9_000)
    assert gc.collect(root).freed_revisions == 0
    if way == "remove":
        namespace.remove(root, "w", "outputs/f")
        expected = {old.artifact_revision_id}
    elif way == "replace":
        namespace.put(root, "w", "outputs/f", b"n" * 100)
        expected = {old.artifact_revision_id}
    elif way == "retire-commit":
        built = commit.build(root, "w")
        manifest = commit.operation(root, built.operation_id).run_manifest.artifact_revision_id
        namespace.put(root, "w", "outputs/f", b"n" * 100)  # now only the commit holds the old bytes
        assert old.artifact_revision_id.hex() not in gc.collect(root).freed
        commit.build(root, "w", parents=[])  # the head moves off the first commit
        commit.retire(root, built.commit_id)
        expected = {old.artifact_revision_id, manifest}
    else:
        snap = snapshot.mint(root, "w", lease_seconds=1)
        namespace.put(root, "w", "outputs/f", b"n" * 100)  # now only the snapshot holds the old bytes
        assert old.artifact_revision_id.hex() not in gc.collect(root).freed
        assert snapshot.reap(root, now_ms=snap.ref.lease_deadline + 120_000, skew_grace_ms=0) == [snap.snapshot_id]
        expected = {old.artifact_revision_id}
    before = stored_bytes(root)
    report = gc.collect(root)
    assert {bytes.fromhex(h) for h in report.freed} == expected
    assert old.artifact_revision_id.hex() in report.freed and report.freed_bytes == before - stored_bytes(root)
    assert read(root, "outputs/kept") == b"k" * 6_000 and kept.artifact_revision_id.hex() not in report.freed
    assert gc.collect(root).freed_revisions == 0 and fsck.check(root).ok


def test_gc_sweeps_the_temp_files_of_writers_that_are_gone(root):
    """Issue 13: `.nokv-tmp-*` temporary files older than any live writer are swept by gc (and at
    open); a temp whose writer still holds it is kept."""
    import time

    namespace.put(root, "w", "outputs/a", b"a" * 100)
    temp_dir = os.path.join(root.data_dir, "objects", ".nokv-tmp")
    dead = os.path.join(temp_dir, ".nokv-tmp-deadwriter")
    beside_key = os.path.join(root.data_dir, "objects", "nokv", ".nokv-tmp-olderversion")
    for path in (dead, beside_key):
        with open(path, "wb") as f:
            f.write(b"half a block")
        past = time.time() - 3 * 86400
        os.utime(path, (past, past))
    live_fd, live, _, _ = root.store._write_temp([b"a write in progress"], {}, named=True)
    try:
        os.utime(live, (time.time() - 3 * 86400,) * 2)
        assert gc.collect(root, dry_run=True).temp_files_removed == 0 and os.path.exists(dead)
        report = gc.collect(root)
        assert report.temp_files_removed == 2
        assert not os.path.exists(dead) and not os.path.exists(beside_key) and os.path.exists(live)
    finally:
        os.close(live_fd)
        os.unlink(live)
    assert read(root, "outputs/a") == b"a" * 100
