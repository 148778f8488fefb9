"""GC killed (SIGKILL) with a batch in flight -- after its claim command, after its deletes --
and a batch delete one object of which the filesystem refuses.

The seed's order holds per revision whatever the batch: objects are deleted only once the claim
is durable, rows go only once the objects are gone. So a collector killed between the steps
leaves Deleting operations, and the next run finishes them: no object and no row of a freed
revision stays (with an audit window of 0). A refused object quarantines its revision alone."""

from __future__ import annotations

import os

import pytest

from nokvfs.errors import StoreError
from nokvfs.schema import keys
from nokvfs.schema.enums import GcClaimState, GcPhase, RevisionState
from nokvfs.schema.records import ArtifactRevision, GcCandidate
from nokvfs.workspace import datadir, fsck, gc, listing, namespace, reading, retention, workbench
from nokvfs.workspace.operations import CRASH_ENV
from nokvfs.workspace.retention import RetentionSettings
from tests.test_gc_growth import rows_naming
from tests.workspace_fixtures import KILLED, run_crash_child
from tests.workspace_helpers import undeletable

BATCH = 8


def _collect_worker(data_dir: str, crash_at: str) -> None:
    root = datadir.open_root(data_dir)
    os.environ[CRASH_ENV] = crash_at
    try:
        gc.collect(root, batch_revisions=BATCH)
    except Exception:
        os._exit(3)
    os._exit(0)


def _populate(data_dir: str) -> None:
    """36 revisions to free (40 puts over 4 paths), one object each."""
    datadir.init(data_dir, block_size=4096, retention=RetentionSettings(versions=0, request_seconds=0))
    root = datadir.open_root(data_dir)
    try:
        workbench.create(root, "w")
        for n in range(40):
            namespace.put(root, "w", f"outputs/f{n % 4}", b"body %d " % n * 300)
    finally:
        root.close()


def _stored(root) -> set:
    return {info.key for info in root.store.list("nokv/artifacts/")}


def _live_objects(root) -> set:
    keys = set()
    with root.read() as view:
        for n in range(4):
            entry = listing.stat(view, root, "w", f"outputs/f{n}").entry
            keys |= {row.object_key for row in gc._own_objects(view, root, entry.artifact_revision_id)}
    return keys


def _deleting(root) -> list:
    with root.read() as view:
        return [op for _, op in gc.ROWS.matching(view, root, lambda op: op.phase == GcPhase.Deleting)]


@pytest.mark.parametrize("crash_at", ["gc-claimed", "gc-deleted"])
def test_a_collector_killed_with_a_batch_in_flight_is_finished_by_the_next_run(tmp_path, crash_at):
    data_dir = str(tmp_path / "data")
    _populate(data_dir)
    assert run_crash_child(_collect_worker, data_dir, crash_at) == KILLED
    root = datadir.open_root(data_dir)
    try:
        # What the killed collector left: its first batch claimed (durably), not finished; when it
        # died after that batch's deletes, the second batch was claimed as well (its deletes
        # overlap the first's finish) and its objects may be gone or not.
        in_flight = _deleting(root)
        assert len(in_flight) == (BATCH if crash_at == "gc-claimed" else 2 * BATCH)
        first = min(op.created_version for op in in_flight)
        with root.read() as view:
            owned = {
                row.object_key
                for op in in_flight
                if op.created_version == first
                for row in gc._own_objects(view, root, op.artifact_revision_id)
            }
        assert len(owned) == BATCH
        # Killed before its deletes, every object is there; after them, none is.
        assert (owned <= _stored(root)) if crash_at == "gc-claimed" else not (owned & _stored(root))
        report = gc.collect(root)
        retention.run(root)  # `nokvfs gc` runs both: the change events naming them go too
        gc.prune_history(root)
        freed = [bytes.fromhex(h) for h in report.freed]
        assert len(freed) == 36 and report.quarantined == 0
        assert {op.artifact_revision_id for op in in_flight} <= set(freed)
        assert _deleting(root) == []
        assert _stored(root) == _live_objects(root)
        leftover = [(tree, key) for tree, key in rows_naming(root, freed) if tree != "recovery_outbox"]
        assert leftover == []
        with root.read() as view:
            for n in range(4):
                entry = listing.stat(view, root, "w", f"outputs/f{n}").entry
                assert reading.read(root, entry) == b"body %d " % (36 + n) * 300
        assert fsck.check(root).ok
    finally:
        root.close()


def _revision(root, revision_id: bytes) -> ArtifactRevision | None:
    with root.read() as view:
        raw = view.get("artifact_revision", keys.ArtifactRevisionKey(root.root_id, revision_id).encode())
    return None if raw is None else ArtifactRevision.decode(raw)


def _candidate(root, revision_id: bytes) -> GcCandidate:
    epoch = _revision(root, revision_id).reference_epoch
    with root.read() as view:
        return GcCandidate.decode(
            view.get("gc_candidate", keys.GcCandidateKey(root.root_id, revision_id, epoch).encode())
        )


def test_an_object_the_filesystem_refuses_to_delete_quarantines_only_its_revision(tmp_path):
    data_dir = str(tmp_path / "data")
    _populate(data_dir)
    root = datadir.open_root(data_dir)
    try:
        to_free = gc.collect(root, dry_run=True).freed
        assert len(to_free) == 36
        stuck = bytes.fromhex(to_free[5])  # inside the first batch of 256
        with root.read() as view:
            (stuck_key,) = [row.object_key for row in gc._own_objects(view, root, stuck)]
        with undeletable(os.path.join(root.store.root, *stuck_key.split("/"))):
            report = gc.collect(root)
            assert (report.quarantined, report.freed_revisions) == (1, 35)
            (failure,) = report.failures
            assert (failure.revision, failure.object_key) == (stuck.hex(), stuck_key)
            assert type(failure.error) is StoreError and "Operation not permitted" in str(failure.error)
            assert _stored(root) == _live_objects(root) | {stuck_key}
            assert _revision(root, stuck).state == RevisionState.Quarantined
            candidate = _candidate(root, stuck)
            assert candidate.claim_state == GcClaimState.Quarantined
            assert "Operation not permitted" in candidate.quarantine_evidence
            # Still refused: taken up again and quarantined again; nothing else changes.
            again = gc.collect(root)
            assert (again.reconciled, again.quarantined, again.freed_revisions) == (1, 1, 0)
            assert _candidate(root, stuck).retry_count == 2
        report = gc.collect(root)
        assert (report.reconciled, report.freed_revisions, report.failures) == (1, 1, [])
        assert _revision(root, stuck) is None  # Deleted, and pruned at once (an audit window of 0)
        assert _stored(root) == _live_objects(root)
        assert fsck.check(root).ok
    finally:
        root.close()
