"""Batched GC as a replica and a reader see it: a replica replaying the collector's outbox is the
source row for row, the report says what is left, and a batch's operation locks exclude any
other driver until the batch lets them go."""

from __future__ import annotations

from nokvfs.engine.replay import replay
from nokvfs.engine.shard import Shard
from nokvfs.schema.enums import GcClaimState, RevisionState
from nokvfs.schema.records import ArtifactRevision, GcCandidate
from nokvfs.workspace import gc, namespace, operations
from tests.workspace_helpers import opened_root


def _rows_but_identity(shard) -> dict:
    with shard._env.begin() as txn:
        rows = {name: list(txn.cursor(db).iternext()) for name, db in shard._dbs.items()}
    rows["system"] = [(k, v) for k, v in rows["system"] if k != b"shard"]  # its creation time differs
    return rows


def _rewrite(root, paths: int, rounds: int) -> None:
    for n in range(paths * rounds):
        namespace.put(root, "w", f"outputs/f{n % paths}", b"x" * 100 + str(n).encode())


def test_a_replica_replaying_a_batched_collection_equals_the_source(tmp_path):
    with opened_root(tmp_path, workbenches=("w",)) as root:
        _rewrite(root, paths=5, rounds=9)
        report = gc.collect(root, batch_revisions=7)
        assert report.freed_revisions == 40 and not report.quarantined
        replica = Shard.create(str(tmp_path / "replica"), root.shard.logical_shard_id)
        try:
            for entry in root.shard.outbox_entries():
                replay(replica, entry)
            assert _rows_but_identity(replica) == _rows_but_identity(root.shard)
        finally:
            replica.close()
        reopened = Shard.open(str(tmp_path / "replica"), verify=True)  # chain and state digests check out
        reopened.close()


def test_the_report_says_what_is_left_after_the_last_pass(tmp_path):
    with opened_root(tmp_path, workbenches=("w",)) as root:
        _rewrite(root, paths=3, rounds=4)
        report = gc.collect(root, batch_revisions=2)
        assert report.freed_revisions == 9
        # Nothing collectable is left, as a scan after the collection finds.
        assert (report.candidates, report.collectable, report.held, report.stale_candidates) == (0, 0, 0, 0)
        with root.read() as view:
            states = [
                GcCandidate.decode(value).claim_state for _, value in _prefix_rows(view, "gc_candidate", root.root_id)
            ]
        assert states and set(states) == {GcClaimState.Complete}
        again = gc.collect(root)
        assert (again.freed_revisions, again.candidates, again.collectable) == (0, 0, 0)


def test_reads_at_a_version_before_the_collection_still_see_the_revision(tmp_path):
    with opened_root(tmp_path, workbenches=("w",)) as root:
        _rewrite(root, paths=2, rounds=3)
        with root.read() as view:
            before = view.version
            revisions = list(_prefix_rows(view, "artifact_revision", root.root_id))
        gc.collect(root, batch_revisions=3, keep_versions=10_000)
        with root.read() as view:
            old = view.at(before)
            for key, value in revisions:
                assert old.get("artifact_revision", key) == value  # History kept what the batches changed
                assert ArtifactRevision.decode(view.get("artifact_revision", key)).state in (
                    RevisionState.Available,
                    RevisionState.Deleted,
                )


def _prefix_rows(view, tree: str, prefix: bytes):
    from nokvfs.engine.scan import iter_prefix

    return iter_prefix(view, tree, prefix)


def test_a_batchs_locks_exclude_other_drivers_until_released(tmp_path):
    run_dir = str(tmp_path / "run")
    ids = [bytes([n]) * 16 for n in range(1, 6)]
    batch = operations.OperationLocks(run_dir)
    assert all(batch.try_acquire(op_id) for op_id in ids)
    for op_id in ids:
        other = operations.OperationLock(run_dir, op_id)
        assert not other.try_acquire()  # held through the batch's descriptor
    another_batch = operations.OperationLocks(run_dir)
    assert not another_batch.try_acquire(ids[0])
    assert another_batch.try_acquire(b"\x77" * 16)  # an operation the batch does not hold
    another_batch.release()
    batch.release()
    for op_id in ids:
        lock = operations.OperationLock(run_dir, op_id)
        assert lock.try_acquire()
        lock.release()
