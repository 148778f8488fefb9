"""Reconciliation of Quarantined state machines, and the reaper finishing a killed reap.

Every store here is a real one (the local directory store, or S3 on the loopback moto server);
an outage is a wrapper that makes the real store's calls fail the way an unreachable endpoint
does (StoreError), or land and then lose their answer (AmbiguousResult).
"""

from __future__ import annotations

import os
import time

import pytest

from nokvfs.errors import AmbiguousResult, StoreError
from nokvfs.schema import keys
from nokvfs.schema.enums import (
    BuildCommitPhase,
    ChangeEventKind,
    HistoryHoldKind,
    PublishPhase,
    RestorePhase,
    SnapshotState,
    WorkspaceState,
)
from nokvfs.schema.records import SnapshotRef
from nokvfs.workspace import (
    changes,
    commit,
    datadir,
    fsck,
    gc,
    namespace,
    publish,
    restore,
    snapshot,
)
from nokvfs.workspace import workbench as wb
from tests.conftest import sigkill_once_ready
from tests.workspace_helpers import opened_root

pytest_plugins = ["tests.s3_fixtures"]

BLOCK = 4096
WB = "src"
DEST = "copy"


class Outage:
    """A real store behind an endpoint that may go away.

    While `down`, every call fails as an unreachable endpoint does (StoreError). With
    `lost_answer`, the first PUT lands but loses its answer (AmbiguousResult: the bytes are
    stored, the caller cannot know) and the endpoint goes down. After `puts_before_outage`
    successful PUTs the endpoint goes down by itself.
    """

    def __init__(self, store, *, down=False, lost_answer=False, puts_before_outage=None):
        self._store = store
        self.down = down
        self.lost_answer = lost_answer
        self.puts_left = puts_before_outage

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.down:
                raise StoreError(f"{name}: the endpoint does not answer")
            if name == "put" and self.lost_answer:
                attr(*args, **kwargs)
                self.down = True
                raise AmbiguousResult("put: timed out after sending")
            result = attr(*args, **kwargs)
            if name == "put" and self.puts_left is not None:
                self.puts_left -= 1
                if self.puts_left <= 0:
                    self.down = True
            return result

        return call


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=(WB,), block_size=BLOCK) as r:
        yield r


@pytest.fixture
def s3_root(tmp_path, s3_bucket, s3_endpoint):
    datadir.init(str(tmp_path / "data"), block_size=BLOCK, store=f"s3://{s3_bucket}/leak", endpoint_url=s3_endpoint)
    r = datadir.open_root(str(tmp_path / "data"))
    wb.create(r, WB)
    yield r
    r.close()


class using:
    """Swap the root's store for a wrapper of it for a `with` block."""

    def __init__(self, root, **outage):
        self.root, self.outage = root, outage

    def __enter__(self) -> Outage:
        self.real = self.root.store
        self.root.store = Outage(self.real, **self.outage)
        return self.root.store

    def __exit__(self, *exc):
        self.root.store = self.real


def quarantined_findings(root) -> list[str]:
    return [f"{f.subject}: {f.detail}" for f in fsck.check(root).findings if f.code == "QUARANTINED"]


def stored_keys(root) -> set[str]:
    return {info.key for info in root.store.list("nokv/artifacts/")}


def snapshot_ref(root, snap) -> SnapshotRef:
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, WB)
        return SnapshotRef.decode(
            view.get(
                "snapshot_ref", keys.SnapshotRefKey(root.root_id, workbench.incarnation_id, snap.snapshot_id).encode()
            )
        )


def restore_hold(root, op_id) -> bytes | None:
    with root.read() as view:
        return view.get("history_hold", keys.HistoryHoldKey(root.root_id, HistoryHoldKind.Restore, op_id).encode())


def only_restore(root) -> tuple[bytes, object]:
    with root.read() as view:
        (found,) = restore.ROWS.matching(view, root, lambda op: True)
    return found


# --- restore ----------------------------------------------------------------------------------


def test_a_quarantined_restore_is_reconciled_once_the_store_recovers(root):
    """Seed, Restore Closure: "After the cleanup cursor proves every destination path/reference
    is removed, its terminal command releases the source HistoryHold plus snapshot consumer, or
    the source commit consumer, exactly once. Quarantined retains that source until
    reconciliation completes."

    The restore manifest's PUT lands but its answer is lost, and the endpoint then stops
    answering: the abort cannot delete it, the attempt and the restore are Quarantined, and the
    snapshot (consumer and hold) and the destination name stay held. Once the store answers,
    the next gc finishes the cleanup and releases all three exactly once.
    """
    namespace.put(root, WB, "outputs/a.txt", b"a" * 5_000)
    snap = snapshot.mint(root, WB, alias="s")
    with using(root, lost_answer=True):
        with pytest.raises(AmbiguousResult):
            restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)
    op_id, op = only_restore(root)
    assert op.phase == RestorePhase.Quarantined
    ((attempt_id, attempt),) = restore.attempts_of(op_id).made(root)
    assert attempt.phase == PublishPhase.Quarantined
    # Everything the restore held is still held: consumer, hold, destination name.
    assert snapshot_ref(root, snap).consumer_count == 1 and restore_hold(root, op_id) is not None
    with pytest.raises(snapshot.ForkRetentionActive):
        snapshot.retire(root, WB, snap.snapshot_id)
    with root.read() as view:
        assert wb.read_current(view, root.root_id, DEST)[1].state == WorkspaceState.Staging
    with pytest.raises(restore.RestoreAborted):
        restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)  # an exact retry: the same aborted restore
    manifest_keys = stored_keys(root) - {row.object_key for row in _live_manifest_rows(root)}
    assert len(manifest_keys) == 1  # the landed PUT
    findings = quarantined_findings(root)
    assert any(
        s.startswith(f"restore {op_id.hex()}") and f"snapshot {snap.snapshot_id}" in s and repr(DEST) in s
        for s in findings
    )
    assert any(
        s.startswith(f"publish {attempt_id.hex()}") and f"1 object(s), {attempt.logical_size} bytes" in s
        for s in findings
    )

    # The store still does not answer: nothing is guessed, nothing changes.
    with using(root, down=True):
        report = gc.collect(root)
    assert report.operations_quarantined == 1 and report.operations_reconciled == 0
    assert restore.operation(root, op_id) == op and publish.ROWS.get(root, attempt_id) == attempt

    report = gc.collect(root)
    assert report.operations_reconciled == 1 and report.operations_quarantined == 0
    assert restore.operation(root, op_id).phase == RestorePhase.Cleaned
    assert publish.ROWS.get(root, attempt_id).phase == PublishPhase.Cleaned
    assert stored_keys(root) == {row.object_key for row in _live_manifest_rows(root)}  # the manifest object is gone
    # Released exactly once: the consumer, the hold, the destination name.
    ref = snapshot_ref(root, snap)
    assert ref.consumer_count == 0 and ref.consumer_epoch == 2 and restore_hold(root, op_id) is None
    with root.read() as view:
        assert wb.read_current(view, root.root_id, DEST)[1].state == WorkspaceState.Retired
    assert quarantined_findings(root) == [] and fsck.check(root).ok
    # The name is free again: the same request now restores (a new attempt, a new incarnation).
    result = restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)
    assert result.operation_id != op_id and wb.get(root, DEST).incarnation_id == result.destination_incarnation
    assert snapshot.retire(root, WB, snap.snapshot_id) == snap.snapshot_id
    assert gc.collect(root).operations_reconciled == 0  # nothing left to reconcile


def _live_manifest_rows(root):
    with root.read() as view:
        for key, _ in _iter(view, "artifact_revision", root.root_id):
            revision_id = key[16:]
            yield from publish.read_manifest(view, root, revision_id)


def _iter(view, tree, prefix):
    from nokvfs.engine.scan import iter_prefix

    return list(iter_prefix(view, tree, prefix))


# --- commit build -----------------------------------------------------------------------------


def test_a_quarantined_commit_build_is_reconciled_and_its_retry_stays_aborted(root):
    """Seed, Commit Closure: "Cleanup must own Aborting before removing any member, revision
    reference, parent consumer, or hold ... cleanup cannot tear down a published commit and
    publication cannot revive a cleaned build." Reconciliation only finishes the cleanup of the
    staged run manifest the failed upload left in doubt; an exact retry of the request still
    returns the aborted outcome, never a new commit."""
    namespace.put(root, WB, "outputs/m.bin", b"m" * 3_000)
    request_id = os.urandom(16)
    with using(root, lost_answer=True):
        with pytest.raises(AmbiguousResult):
            commit.build(root, WB, request_id=request_id)
    op_id = commit.operation_id(root.root_id, request_id)
    assert commit.operation(root, op_id).phase == BuildCommitPhase.Quarantined
    assert [f for f in quarantined_findings(root) if f.startswith(f"build-commit {op_id.hex()}")]
    report = gc.collect(root)
    assert report.operations_reconciled == 1
    assert commit.operation(root, op_id).phase == BuildCommitPhase.Cleaned
    with pytest.raises(commit.CommitAborted):
        commit.build(root, WB, request_id=request_id)  # replay stays exact
    assert commit.head(root, WB) is None and fsck.check(root).ok
    assert commit.build(root, WB).member_count == 2  # the file and the run manifest


# --- publish on loopback S3 ---------------------------------------------------------------------


def test_a_publish_leaked_by_an_outage_is_reported_and_gc_leaves_no_unreferenced_object(s3_root):
    """Seed, Upload And Append: "Ambiguous multipart completion, late PUT, or DELETE remains
    ledger-owned and Quarantined until reconciled. Object listing is never used to discover
    staged ownership." And for GC: "neither reference addition nor metadata deletion is allowed
    until reconciliation proves all objects present or absent and performs an explicit state
    transition."

    The endpoint goes away after 10 of 14 blocks: the publish fails, its cleanup cannot delete,
    and 10 objects (to 13: those in flight) stay in the bucket owned by a Quarantined ledger.
    fsck reports the operation and its bytes; gc leaves it alone while the store does not
    answer, and once it answers deletes them: the bucket then holds only objects a manifest
    references."""
    root = s3_root
    kept = namespace.put(root, WB, "outputs/kept.bin", b"k" * 5_000)
    body = os.urandom(14 * BLOCK)
    before = stored_keys(root)
    with using(root, puts_before_outage=10):
        with pytest.raises(StoreError):
            namespace.put(root, WB, "outputs/big.bin", body)
    leaked = stored_keys(root) - before
    # Blocks go up four at a time (publish.upload): those already sent when the endpoint went
    # down land too.
    assert 10 <= len(leaked) <= 10 + publish.UPLOAD_BLOCKS_IN_FLIGHT - 1
    with root.read() as view:
        ((op_id, op),) = publish.ROWS.matching(view, root, lambda op: op.phase == PublishPhase.Quarantined)
    assert op.path == "outputs/big.bin"
    (finding,) = quarantined_findings(root)
    assert (
        finding.startswith(f"publish {op_id.hex()} (outputs/big.bin)") and f"14 object(s), {len(body)} bytes" in finding
    )
    assert not [f for f in fsck.check(root).findings if f.code == "ORPHAN_OBJECT"]  # owned, not orphaned

    with using(root, down=True):
        report = gc.collect(root)
    assert (report.operations_quarantined, report.operations_reconciled) == (1, 0)
    assert stored_keys(root) - before == leaked

    report = gc.collect(root)
    assert (report.operations_quarantined, report.operations_reconciled) == (1 - 1, 1)
    assert publish.ROWS.get(root, op_id).phase == PublishPhase.Cleaned
    referenced = {row.object_key for row in _live_manifest_rows(root)}
    assert stored_keys(root) == referenced and len(referenced) == kept.logical_size // BLOCK + 1
    assert fsck.check(root).ok
    # The path was never published; publishing it now works.
    assert namespace.put(root, WB, "outputs/big.bin", body).logical_size == len(body)


# --- the reaper ---------------------------------------------------------------------------------


def _reaper(data_dir: str, ready) -> None:
    """Reap; right after the first claim command, say so and wait to be killed."""
    from nokvfs.workspace import datadir as dd
    from nokvfs.workspace import snapshot as snaps

    root = dd.open_root(data_dir)
    claim = snaps._claim_reap

    def claim_then_wait(*args):
        claim(*args)
        ready.set()
        time.sleep(120)

    snaps._claim_reap = claim_then_wait
    snaps.reap(root, skew_grace_ms=0, now_ms=int(time.time() * 1000) + 10_000_000)


def test_a_killed_reaper_is_resumed_by_the_next(tmp_path):
    """Seed, Snapshot Lifecycle: a leased snapshot moves Active -> ReapClaimed -> Reaped
    (SnapshotState: Active=1, ReapClaimed=2, Reaped=3); the claim releases the HistoryHold.
    A reaper SIGKILLed between the claim and the finish leaves the snapshot ReapClaimed; the
    next reaper finishes it -- Reaped, its SnapshotRetired event exactly once -- and reaps the
    rest."""
    data_dir = str(tmp_path / "data")
    datadir.init(data_dir, block_size=BLOCK)
    root = datadir.open_root(data_dir)
    try:
        wb.create(root, WB)
        namespace.put(root, WB, "outputs/f", b"f")
        snaps = [snapshot.mint(root, WB, alias=f"s{i}", lease_seconds=1) for i in range(3)]
    finally:
        root.close()
    sigkill_once_ready(_reaper, (data_dir,))
    root = datadir.open_root(data_dir)
    try:
        states = [snapshot.get(root, WB, s.snapshot_id).ref.state for s in snaps]
        assert states == [SnapshotState.ReapClaimed, SnapshotState.Active, SnapshotState.Active]
        with root.read() as view:
            assert (
                view.get(
                    "history_hold",
                    keys.HistoryHoldKey(
                        root.root_id, HistoryHoldKind.Snapshot, snaps[0].snapshot_id.to_bytes(8, "big")
                    ).encode(),
                )
                is None
            )
        far = int(time.time() * 1000) + 10_000_000
        assert snapshot.reap(root, skew_grace_ms=0, now_ms=far) == [s.snapshot_id for s in snaps]
        assert [snapshot.get(root, WB, s.snapshot_id).ref.state for s in snaps] == [SnapshotState.Reaped] * 3
        assert snapshot.reap(root, skew_grace_ms=0, now_ms=far) == []
        retired = [
            c
            for c in changes.read_changes(root, workbench_id=WB, limit=1000).changes
            if c.kind == ChangeEventKind.SnapshotRetired
        ]
        assert sorted(int.from_bytes(c.before, "big") for c in retired) == [s.snapshot_id for s in snaps]
        assert fsck.check(root).ok
    finally:
        root.close()
