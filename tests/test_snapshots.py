"""Leased snapshots: mint/remint, renew, retire, the reaper and MVCC reads at the held version."""

from __future__ import annotations

import dataclasses
import time

import pytest

from nokvfs.engine.command import Put
from nokvfs.errors import InvalidInput, NameInvalid, NotFound, PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.enums import HistoryHoldKind, SnapshotState
from nokvfs.schema.records import HistoryHold, SnapshotAlias, SnapshotRef
from nokvfs.workspace import datadir, listing, namespace, reading, snapshot
from nokvfs.workspace.root import Built, intent_digest
from tests.workspace_helpers import opened_root


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("w",)) as r:
        yield r


def now_ms():
    return time.time_ns() // 1_000_000


def hold(root, snapshot_id):
    with root.read() as view:
        raw = view.get(
            "history_hold",
            keys.HistoryHoldKey(root.root_id, HistoryHoldKind.Snapshot, snapshot_id.to_bytes(8, "big")).encode(),
        )
    return None if raw is None else HistoryHold.decode(raw)


def tree(root, snap):
    with root.read() as view:
        at = snapshot.view_at(view, root, snap)
        return {c.name: reading.read(root, c.entry, view=at) for c in listing.list_recursive(at, root, "w").children}


def test_mint_creates_ref_alias_and_hold_atomically(root):
    namespace.put(root, "w", "outputs/a", b"v1")
    snap = snapshot.mint(root, "w", alias="base", annotation="before the run")
    assert snap.ref.state == SnapshotState.Active and snap.ref.alias == "base"
    assert hold(root, snap.snapshot_id).read_version == snap.read_version
    assert snapshot.get(root, "w", "base").snapshot_id == snap.snapshot_id
    assert snapshot.get(root, "w", snap.snapshot_id).ref.annotation == "before the run"


def test_a_snapshot_keeps_showing_exactly_what_it_showed_while_the_live_view_changes(root):
    namespace.put(root, "w", "outputs/a", b"v1")
    namespace.put(root, "w", "logs/l", b"log")
    snap = snapshot.mint(root, "w")
    before = tree(root, snap)
    namespace.put(root, "w", "outputs/a", b"v2")
    namespace.remove(root, "w", "logs/l")
    namespace.put(root, "w", "outputs/new", b"n")
    namespace.rename(root, "w", "outputs/a", "scripts/a")
    assert tree(root, snap) == before == {"logs/l": b"log", "outputs/a": b"v1"}


def test_reminting_a_name_moves_it_and_the_older_snapshot_stays_addressable_by_id(root):
    first = snapshot.mint(root, "w", alias="x")
    namespace.put(root, "w", "outputs/a", b"v")
    second = snapshot.mint(root, "w", alias="x")
    assert second.snapshot_id > first.snapshot_id
    assert snapshot.get(root, "w", "x").snapshot_id == second.snapshot_id
    assert snapshot.get(root, "w", first.snapshot_id).ref.state == SnapshotState.Active
    with root.read() as view:
        alias = SnapshotAlias.decode(
            view.get(
                "snapshot_alias", keys.SnapshotAliasKey(root.root_id, first.workbench.incarnation_id, "x").encode()
            )
        )
    assert alias.alias_generation == 2


def test_a_terminal_latest_snapshot_does_not_fall_back_to_an_earlier_mint(root):
    first = snapshot.mint(root, "w", alias="x")
    second = snapshot.mint(root, "w", alias="x")
    snapshot.retire(root, "w", "x")
    assert snapshot.get(root, "w", "x").snapshot_id == second.snapshot_id
    assert snapshot.get(root, "w", "x").ref.state == SnapshotState.Retired
    assert snapshot.get(root, "w", first.snapshot_id).ref.state == SnapshotState.Active


def test_remint_between_resolve_and_apply_fails_instead_of_redirecting(root, monkeypatch):
    snapshot.mint(root, "w", alias="x")
    original = snapshot._pin

    def pin_then_remint(*args):
        pinned = original(*args)
        snapshot.mint(root, "w", alias="x")
        return pinned

    monkeypatch.setattr(snapshot, "_pin", pin_then_remint)
    with pytest.raises(PredicateFailed, match="reminted"):
        snapshot.retire(root, "w", "x")
    monkeypatch.undo()
    assert [s.ref.state for s in snapshot.list_snapshots(root, "w")] == [SnapshotState.Active] * 2


def test_renewal_only_extends_and_revives_an_expired_unclaimed_snapshot(root):
    snap = snapshot.mint(root, "w", lease_seconds=0.001)
    time.sleep(0.01)
    snapshot.observe_clock(root)
    assert snapshot.get(root, "w", snap.snapshot_id).expired
    long = snapshot.renew(root, "w", snap.snapshot_id, lease_seconds=3600)
    assert not snapshot.get(root, "w", snap.snapshot_id).expired
    shorter = snapshot.renew(root, "w", snap.snapshot_id, lease_seconds=1)
    assert shorter.ref.lease_deadline == long.ref.lease_deadline
    with pytest.raises(InvalidInput):
        snapshot.renew(root, "w", snap.snapshot_id, lease_seconds=0)


def test_the_reaper_waits_for_the_skew_grace_then_claims_and_releases_the_hold(root):
    snap = snapshot.mint(root, "w", lease_seconds=1)
    deadline = snap.ref.lease_deadline
    assert snapshot.reap(root, now_ms=deadline + 1, skew_grace_ms=5_000) == []
    assert snapshot.reap(root, now_ms=deadline + 5_001, skew_grace_ms=5_000) == [snap.snapshot_id]
    assert snapshot.get(root, "w", snap.snapshot_id).ref.state == SnapshotState.Reaped
    assert hold(root, snap.snapshot_id) is None
    with pytest.raises(PredicateFailed):
        snapshot.renew(root, "w", snap.snapshot_id)
    with pytest.raises(PredicateFailed):
        snapshot.retire(root, "w", snap.snapshot_id)
    with root.read() as view, pytest.raises(NotFound):
        snapshot.view_at(view, root, snapshot.get(root, "w", snap.snapshot_id))


def test_a_wall_clock_below_the_persisted_lease_clock_never_reaps(root):
    snap = snapshot.mint(root, "w", lease_seconds=1)
    root.shard.observe_lease_clock(snap.ref.lease_deadline + 60_000)
    # The wall clock went back below the high water: nothing is reaped until it catches up.
    assert snapshot.reap(root, now_ms=snap.ref.lease_deadline + 30_000, skew_grace_ms=0) == []
    assert snapshot.reap(root, now_ms=snap.ref.lease_deadline + 61_000, skew_grace_ms=0) == [snap.snapshot_id]


def test_retire_releases_the_hold_and_is_terminal(root):
    snap = snapshot.mint(root, "w", alias="r")
    assert snapshot.retire(root, "w", "r") == snap.snapshot_id
    assert hold(root, snap.snapshot_id) is None
    with pytest.raises(PredicateFailed):
        snapshot.retire(root, "w", snap.snapshot_id)


def _attach_consumer(root, snap):
    key = keys.SnapshotRefKey(root.root_id, snap.workbench.incarnation_id, snap.snapshot_id).encode()

    def build(view):
        ref = SnapshotRef.decode(view.get("snapshot_ref", key))
        return Built(
            mutations=[
                Put(
                    "snapshot_ref",
                    key,
                    dataclasses.replace(ref, consumer_count=1, consumer_epoch=ref.consumer_epoch + 1),
                )
            ]
        )

    root.apply(build, digest=intent_digest("test.attach", snap.snapshot_id))


def test_a_live_fork_consumer_blocks_retire_and_reap(root):
    snap = snapshot.mint(root, "w", lease_seconds=1)
    _attach_consumer(root, snap)
    with pytest.raises(snapshot.ForkRetentionActive):
        snapshot.retire(root, "w", snap.snapshot_id)
    assert snapshot.reap(root, now_ms=snap.ref.lease_deadline + 10**6, skew_grace_ms=0) == []
    assert hold(root, snap.snapshot_id) is not None


def test_bad_selectors_and_names_are_typed_errors(root):
    with pytest.raises(NotFound):
        snapshot.get(root, "w", "missing")
    with pytest.raises(NotFound):
        snapshot.get(root, "w", 10**9)
    with pytest.raises(NameInvalid):
        snapshot.mint(root, "w", alias="a\x00b")
    with pytest.raises(NameInvalid):
        snapshot.mint(root, "w", alias="x" * 129)
    with pytest.raises(NotFound):
        snapshot.mint(root, "nope")


def test_snapshots_survive_reopen(root, tmp_path):
    namespace.put(root, "w", "outputs/a", b"v1")
    snap = snapshot.mint(root, "w", alias="keep")
    namespace.put(root, "w", "outputs/a", b"v2")
    root.close()
    again = datadir.open_root(str(tmp_path / "data"))
    try:
        assert tree(again, snapshot.get(again, "w", "keep")) == {"outputs/a": b"v1"}
        assert snapshot.get(again, "w", "keep").snapshot_id == snap.snapshot_id
    finally:
        again.close()
