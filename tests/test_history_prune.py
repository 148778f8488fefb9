"""History pruning below the floor (Shard.prune_history): what goes, what stays, who may prune,
and that a replica replaying the HistoryPrune records ends up with exactly the same rows."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.engine.command import Delete, Put
from nokvfs.engine.history import RETAINED_TREES
from nokvfs.engine.records import HistoryPruneRecord
from nokvfs.engine.shard import Shard
from nokvfs.errors import HistoryNotRetained, IntegrityError, OwnerFenced
from nokvfs.replicate.errors import ReplayFailed
from nokvfs.replicate.restore import replay
from nokvfs.schema import keys
from nokvfs.schema.enums import (
    HistoryHoldKind,
    HistoryHoldState,
    OutboxRecordKind,
    WorkspaceState,
)
from nokvfs.schema.records import HistoryHold, WorkspaceCurrent
from tests.conftest import make_shard_env, sigkill_once_ready

PATH_TAG = keys.FAMILY_BY_NAME["path_current"].tag
WS_TAG = keys.FAMILY_BY_NAME["workspace_current"].tag
INCARNATIONS = [bytes([0x10 + i]) * 16 for i in range(3)]


def pkey(n: int) -> bytes:
    return b"\x0a" * 32 + bytes([n]) + b"\x01"


def wkey(n: int) -> bytes:
    return b"\x0a" * 16 + b"\x00\x00\x00\x02w" + bytes([0x30 + n])


def marker(incarnation: int, state: WorkspaceState, revision: int) -> bytes:
    return WorkspaceCurrent(INCARNATIONS[incarnation], revision, state, None, 1, revision).encode()


def visibility(raw):
    if raw is None:
        return None
    decoded = WorkspaceCurrent.decode(raw)
    return decoded.workspace_incarnation_id, decoded.state


def history_rows(shard) -> list:
    with shard._env.begin() as txn:
        return list(txn.cursor(shard._dbs["history"]).iternext())


def prune_all(shard, floor, **limits) -> tuple[int, int, int]:
    """(floor reached, rows pruned, records written) over a whole pass of batches."""
    pruned, records, start = 0, 0, b""
    while True:
        outcome = shard.prune_history(owner_epoch=shard.owner_epoch, floor_version=floor, start_key=start, **limits)
        pruned += outcome.pruned_rows
        records += outcome.recovery_lsn is not None
        if outcome.next_key is None:
            return outcome.floor_version, pruned, records
        start = outcome.next_key


def hold(env, read_version: int, hold_id: bytes = b"\x01" * 16, *, remove: bool = False):
    key = keys.HistoryHoldKey(env.root_id, HistoryHoldKind.BuildCommit, hold_id).encode()
    if remove:
        return env.apply(mutations=[Delete("history_hold", key)])
    return env.apply(
        mutations=[Put("history_hold", key, HistoryHold(read_version, None, HistoryHoldState.Active, 1).encode())]
    )


# A workload: each step is one command of puts/deletes over a few path keys and workbench markers.
step = st.lists(
    st.one_of(
        st.tuples(st.just("path"), st.integers(0, 4), st.one_of(st.none(), st.binary(min_size=1, max_size=6))),
        st.tuples(
            st.just("ws"),
            st.integers(0, 2),
            st.one_of(
                st.none(), st.tuples(st.integers(0, 2), st.sampled_from(list(WorkspaceState)), st.integers(1, 9))
            ),
        ),
    ),
    min_size=1,
    max_size=4,
)


def run_workload(env, steps) -> dict:
    """Apply the steps; return {version: {(tree, key): value}} of the expected state after each."""
    state: dict = {}
    expected = {env.shard.commit_version: dict(state)}
    for mutations in steps:
        rows = {}
        for kind, n, value in mutations:
            if kind == "path":
                rows[("path_current", pkey(n))] = None if value is None else b"\x02" + value
            else:
                rows[("workspace_current", wkey(n))] = None if value is None else marker(*value)
        env.apply(mutations=[Put(t, k, v) if v is not None else Delete(t, k) for (t, k), v in rows.items()])
        state.update(rows)
        expected[env.shard.commit_version] = {k: v for k, v in state.items() if v is not None}
    return expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=25), data=st.data())
def test_reads_at_and_above_the_floor_are_unchanged_and_visibility_stays_exact_below_it(tmp_path_factory, steps, data):
    env = make_shard_env(tmp_path_factory.mktemp("prop"))
    try:
        expected = run_workload(env, steps)
        shard = env.shard
        floor = data.draw(st.integers(0, shard.commit_version), label="floor")
        reached, pruned, _ = prune_all(
            shard, floor, max_rows=data.draw(st.integers(1, 50), label="max_rows"), max_visits=7
        )
        assert reached == floor == shard.history_floor
        for version, rows in expected.items():
            with shard.read() as view:
                if version < floor:
                    with pytest.raises(HistoryNotRetained):
                        view.at(version)
                    at = view.at(version, visibility=True)
                    for n in range(3):
                        assert visibility(at.get("workspace_current", wkey(n))) == visibility(
                            rows.get(("workspace_current", wkey(n)))
                        )
                    continue
                at = view.at(version)
                for n in range(5):
                    assert at.get("path_current", pkey(n)) == rows.get(("path_current", pkey(n)))
                for n in range(3):
                    assert at.get("workspace_current", wkey(n)) == rows.get(("workspace_current", wkey(n)))
                seen = []
                position = b""
                while (found := at.seek("path_current", position)) is not None:
                    seen.append(found)
                    position = found[0] + b"\x00"
                assert seen == sorted((k, v) for (t, k), v in rows.items() if t == "path_current")
        for key, _value in history_rows(shard):
            tag, user, version = keys.decode_history_key(key)
            if version <= floor:
                # Below the floor only WorkspaceCurrent rows that change the visibility remain.
                assert tag == WS_TAG
        assert env.reopen().history_floor == floor  # full verification: digests, outbox
    finally:
        env.shard.close()


def test_visibility_views_point_read_only_the_retained_trees(shard_env):
    shard_env.apply(mutations=[Put("workspace_current", wkey(0), marker(0, WorkspaceState.Staging, 1))])
    shard_env.apply(
        mutations=[
            Put("workspace_current", wkey(0), marker(0, WorkspaceState.Visible, 2)),
            Put("path_current", pkey(0), b"\x02a"),
        ]
    )
    for n in range(3):
        shard_env.apply(mutations=[Put("workspace_current", wkey(0), marker(0, WorkspaceState.Visible, 3 + n))])
    before = len(history_rows(shard_env.shard))
    floor, pruned, _ = prune_all(shard_env.shard, shard_env.shard.commit_version)
    # Kept: the creation (absent -> Staging) and Staging -> Visible; the three revision bumps went.
    assert [keys.decode_history_key(k)[0] for k, _ in history_rows(shard_env.shard)].count(WS_TAG) == 2
    assert pruned == before - 2
    with shard_env.shard.read() as view:
        at = view.at(floor - 3, visibility=True)  # the Staging -> Visible command
        assert visibility(at.get("workspace_current", wkey(0))) == (INCARNATIONS[0], WorkspaceState.Visible)
        assert visibility(view.at(floor - 4, visibility=True).get("workspace_current", wkey(0))) == (
            INCARNATIONS[0],
            WorkspaceState.Staging,
        )
        assert view.at(floor - 5, visibility=True).get("workspace_current", wkey(0)) is None
        with pytest.raises(HistoryNotRetained):
            at.get("path_current", pkey(0))
        with pytest.raises(HistoryNotRetained):
            at.seek("workspace_current", b"")
        assert view.at(floor, visibility=True).get("path_current", pkey(0)) == b"\x02a"  # at the floor: a normal view
    assert RETAINED_TREES == {"workspace_current"}


def test_the_floor_is_clamped_to_the_oldest_hold_and_never_moves_back(shard_env):
    for n in range(5):
        shard_env.apply(mutations=[Put("path_current", pkey(0), b"\x02%d" % n)])
    held = shard_env.shard.commit_version
    hold(shard_env, held)
    for n in range(5):
        shard_env.apply(mutations=[Put("path_current", pkey(0), b"\x02later%d" % n)])
    floor, _, _ = prune_all(shard_env.shard, shard_env.shard.commit_version)
    assert floor == held
    with shard_env.shard.read(held) as view:
        assert view.get("path_current", pkey(0)) == b"\x024"
    hold(shard_env, 0, remove=True)
    assert prune_all(shard_env.shard, shard_env.shard.commit_version)[0] == shard_env.shard.commit_version
    # Asking for an older floor later neither lowers it nor writes anything.
    tail = shard_env.shard.recovery_tail
    assert prune_all(shard_env.shard, 1) == (shard_env.shard.commit_version, 0, 0)
    assert shard_env.shard.recovery_tail == tail


def test_a_hold_created_after_the_floor_was_chosen_is_still_honoured(shard_env):
    # The engine clamps inside its own transaction: the caller's floor is only a wish.
    for n in range(4):
        shard_env.apply(mutations=[Put("path_current", pkey(1), b"\x02%d" % n)])
    wish = shard_env.shard.commit_version
    hold(shard_env, wish - 2)
    assert prune_all(shard_env.shard, wish)[0] == wish - 2
    with shard_env.shard.read(wish - 2) as view:
        assert view.get("path_current", pkey(1)) == b"\x021"


def test_a_stale_owner_epoch_is_fenced_and_prunes_nothing(shard_env):
    for n in range(3):
        shard_env.apply(mutations=[Put("path_current", pkey(0), b"\x02%d" % n)])
    stale = shard_env.shard.owner_epoch
    shard_env.shard.advance_owner_epoch(stale + 1)
    rows, tail = history_rows(shard_env.shard), shard_env.shard.recovery_tail
    with pytest.raises(OwnerFenced):
        shard_env.shard.prune_history(owner_epoch=stale, floor_version=shard_env.shard.commit_version)
    assert history_rows(shard_env.shard) == rows and shard_env.shard.recovery_tail == tail
    assert shard_env.shard.history_floor == 0


def test_a_batch_that_changes_nothing_writes_no_record(shard_env):
    shard_env.apply(mutations=[Put("path_current", pkey(0), b"\x02a")])
    assert prune_all(shard_env.shard, shard_env.shard.commit_version)[2] == 1
    tail = shard_env.shard.recovery_tail
    outcome = shard_env.shard.prune_history(
        owner_epoch=shard_env.shard.owner_epoch, floor_version=shard_env.shard.commit_version
    )
    assert (outcome.pruned_rows, outcome.recovery_lsn, outcome.next_key) == (0, None, None)
    assert shard_env.shard.recovery_tail == tail


def test_prunable_history_counts_exactly_what_a_pass_removes(shard_env):
    rng = random.Random(3)
    for n in range(40):
        shard_env.apply(
            mutations=[
                Put("path_current", pkey(rng.randrange(6)), b"\x02%d" % n),
                Put(
                    "workspace_current",
                    wkey(rng.randrange(2)),
                    marker(rng.randrange(2), rng.choice(list(WorkspaceState)), n + 1),
                ),
            ]
        )
    target = shard_env.shard.commit_version - 10
    floor, count = shard_env.shard.prunable_history(target)
    assert floor == target and count > 0
    assert prune_all(shard_env.shard, target, max_rows=7)[1] == count
    assert shard_env.shard.prunable_history(target) == (target, 0)


def _replica(tmp_path, source: Shard) -> Shard:
    replica = Shard.create(str(tmp_path / "replica"), source.logical_shard_id)
    for entry in source.outbox_entries():
        replay(replica, entry)
    return replica


def _rows_but_identity(shard) -> dict:
    with shard._env.begin() as txn:
        rows = {name: list(txn.cursor(db).iternext()) for name, db in shard._dbs.items()}
    rows["system"] = [(k, v) for k, v in rows["system"] if k != b"shard"]  # its creation time differs
    return rows


def test_replaying_the_prune_records_builds_an_identical_replica(shard_env, tmp_path):
    rng = random.Random(7)
    for _round in range(4):
        for n in range(30):
            shard_env.apply(
                mutations=[
                    Put("path_current", pkey(rng.randrange(8)), b"\x02%d" % n),
                    Put(
                        "workspace_current",
                        wkey(rng.randrange(3)),
                        marker(rng.randrange(3), rng.choice(list(WorkspaceState)), n + 1),
                    ),
                ],
                events=[b"\x02e"],
            )
        prune_all(
            shard_env.shard,
            shard_env.shard.commit_version - rng.randrange(20),
            max_rows=rng.randint(1, 40),
            max_visits=rng.randint(5, 200),
        )
    kinds = [e.header.record_kind for e in shard_env.shard.outbox_entries()]
    assert kinds.count(OutboxRecordKind.HistoryPrune) > 4
    replica = _replica(tmp_path, shard_env.shard)
    try:
        assert replica.recovery_tail == shard_env.shard.recovery_tail
        assert replica.history_floor == shard_env.shard.history_floor
        assert _rows_but_identity(replica) == _rows_but_identity(shard_env.shard)
    finally:
        replica.close()


@pytest.mark.parametrize("tamper", ["rows", "digest", "end", "floor"])
def test_a_prune_record_that_does_not_match_the_replica_does_not_replay(shard_env, tmp_path, tamper):
    for n in range(20):
        shard_env.apply(mutations=[Put("path_current", pkey(n % 3), b"\x02%d" % n)])
    prune_all(shard_env.shard, shard_env.shard.commit_version - 5)
    entries = list(shard_env.shard.outbox_entries())
    replica = Shard.create(str(tmp_path / "replica"), shard_env.shard.logical_shard_id)
    try:
        for entry in entries[:-1]:
            replay(replica, entry)
        record = HistoryPruneRecord.decode(entries[-1].payload)
        bad = {
            "rows": dict(pruned_rows=record.pruned_rows + 1),
            "digest": dict(pruned_digest=b"\x00" * 32),
            # A range that ends inside the pruned rows (History keys are tag | u32 len | key | version).
            "end": dict(end_key=bytes([PATH_TAG]) + len(pkey(1)).to_bytes(4, "big") + pkey(1)),
            "floor": dict(floor_version=record.floor_version + 1),
        }[tamper]
        import dataclasses

        rows, tail = history_rows(replica), replica.recovery_tail
        with pytest.raises(IntegrityError):
            replica.replay_history_prune(dataclasses.replace(record, **bad))
        assert history_rows(replica) == rows and replica.recovery_tail == tail
        # The untampered record replays (restore.replay also checks the chain it appends).
        replay(replica, entries[-1])
        assert replica.recovery_tail == shard_env.shard.recovery_tail
    finally:
        replica.close()


def test_replay_refuses_a_prune_of_rows_the_replica_does_not_have(shard_env, tmp_path):
    for n in range(10):
        shard_env.apply(mutations=[Put("path_current", pkey(0), b"\x02%d" % n)])
    prune_all(shard_env.shard, shard_env.shard.commit_version)
    entries = list(shard_env.shard.outbox_entries())
    replica = Shard.create(str(tmp_path / "replica"), shard_env.shard.logical_shard_id)
    try:
        for entry in entries[:3]:
            replay(replica, entry)
        with pytest.raises(ReplayFailed):
            replay(replica, entries[-1])  # out of order: does not follow the tail
    finally:
        replica.close()


# --- a killed pruner --------------------------------------------------------------------------


def _pruner(path, ready):
    shard = Shard.open(path, verify=False)
    start = b""
    while True:
        outcome = shard.prune_history(
            owner_epoch=shard.owner_epoch,
            floor_version=shard.commit_version,
            start_key=start,
            max_rows=5,
            max_visits=20,
        )
        ready.set()
        start = outcome.next_key or b""
        if outcome.next_key is None:
            time.sleep(0.001)


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_a_pruner_killed_mid_pass_leaves_whole_batches_and_a_later_pass_finishes(shard_env, delay):
    for n in range(600):
        shard_env.apply(
            mutations=[
                Put("path_current", pkey(n % 7), b"\x02%d" % n),
                Put("workspace_current", wkey(n % 3), marker(n % 2, WorkspaceState.Visible, n + 1)),
            ]
        )
    with shard_env.shard.read() as view:
        final = {n: view.get("path_current", pkey(n)) for n in range(7)}
    shard_env.shard.close()
    sigkill_once_ready(_pruner, (shard_env.path,), delay=delay)
    shard = shard_env.shard = Shard.open(shard_env.path)  # full verification: outbox chain, digests
    prune_all(shard, shard.commit_version)
    assert shard.history_floor == shard.commit_version
    assert all(keys.decode_history_key(k)[0] == WS_TAG for k, _ in history_rows(shard))
    with shard.read() as view:
        assert {n: view.get("path_current", pkey(n)) for n in range(7)} == final
