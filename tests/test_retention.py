"""Retention contracts of the engine (README "Retention"): an exact replay older than the replay
window is RequestExpired and never applied again; the recovery outbox truncated behind a point
stays verifiable from it; ChangeEvent rows below the event floor go; and a replica restored from
a bucket after all of it is identical to the source."""

from __future__ import annotations

import os

import pytest

from nokvfs.engine import horizon
from nokvfs.engine.command import Put
from nokvfs.engine.shard import Shard
from nokvfs.errors import HistoryNotRetained, OwnerFenced, RequestExpired, ShardCorrupt
from nokvfs.replicate.replicator import Replicator
from nokvfs.schema.enums import OutboxRecordKind, RetainedFamily
from nokvfs.schema.ids import derived_id16, uuid7_from
from tests.conftest import make_shard_env
from tests.test_replicate import assert_equal_shards, populate, raw_rows, restored_shard, s3_store  # noqa: F401

pytest_plugins = ["tests.s3_fixtures"]

T0 = 1_700_000_000_000


def request_at(ms: int) -> bytes:
    return uuid7_from(ms.to_bytes(6, "big"), os.urandom(10))


def put(n: int) -> Put:
    return Put("path_current", b"\x01" * 16 + n.to_bytes(4, "big"), b"\x02value%d" % n)


def prune_all(shard, family, **floors):
    removed = 0
    start = b""
    while True:
        outcome = shard.prune_retained(owner_epoch=shard.owner_epoch, family=family, start_key=start, **floors)
        removed += outcome.pruned_rows
        if outcome.next_key is None:
            return removed
        start = outcome.next_key


def rows_of(shard, tree):
    with shard._env.begin() as txn:
        return [k for k, _ in txn.cursor(shard._dbs[tree])]


@pytest.fixture
def env(tmp_path):
    env = make_shard_env(tmp_path)
    yield env
    env.shard.close()


# --- CommandDedupe: an expired exact replay is refused, never re-executed -------------------------


def test_an_exact_replay_older_than_the_window_is_request_expired_and_not_applied(env):
    shard = env.shard
    old = env.command(mutations=[put(1)], request_id=request_at(T0), result=b"first")
    assert shard.apply(old).replayed is False
    kept_id = derived_id16(b"\x55" * 32)  # a derived id carries no time: kept forever
    kept = env.command(mutations=[put(2)], request_id=kept_id, result=b"kept")
    shard.apply(kept)
    assert shard.apply(old).replayed is True  # inside the window: answered from its dedupe row
    shard.observe_lease_clock(T0 + 3_600_000)
    removed = prune_all(shard, RetainedFamily.CommandDedupe, floor_version=shard.commit_version, horizon_ms=T0 + 60_000)
    assert removed == 1
    floors = shard.retention_floors
    assert floors.request_horizon_ms == T0 + 60_000 and floors.request_floor_version == shard.commit_version
    version, tail = shard.commit_version, shard.recovery_tail
    with pytest.raises(RequestExpired):
        shard.apply(old)
    # A new command with an id that old is refused too: its result could have been removed.
    with pytest.raises(RequestExpired):
        shard.apply(env.command(mutations=[put(3)], request_id=request_at(T0 + 1)))
    assert (shard.commit_version, shard.recovery_tail) == (version, tail)
    assert shard.apply(kept).replayed is True  # the derived id's row stayed
    assert shard.apply(env.command(mutations=[put(4)])).replayed is False  # a fresh request runs
    env.reopen(verify=True)
    with pytest.raises(RequestExpired):
        env.shard.apply(old)


def test_the_request_horizon_never_passes_the_lease_clock_nor_moves_back(env):
    shard = env.shard
    old = request_at(T0)
    shard.apply(env.command(mutations=[put(1)], request_id=old))
    shard.observe_lease_clock(T0 - 1)
    prune_all(shard, RetainedFamily.CommandDedupe, floor_version=shard.commit_version, horizon_ms=T0 + 10**9)
    assert shard.retention_floors.request_horizon_ms == T0 - 1
    assert any(k.endswith(old) for k in rows_of(shard, "command_dedupe")), (
        "a request the lease clock has not passed is kept"
    )
    shard.observe_lease_clock(T0 + 10_000)
    prune_all(shard, RetainedFamily.CommandDedupe, floor_version=shard.commit_version, horizon_ms=T0 + 5)
    prune_all(shard, RetainedFamily.CommandDedupe, floor_version=0, horizon_ms=0)
    assert shard.retention_floors.request_horizon_ms == T0 + 5
    assert not any(k.endswith(old) for k in rows_of(shard, "command_dedupe"))
    assert rows_of(shard, "command_dedupe"), "requests made now (the fence's) are newer than the horizon"


def test_retention_is_refused_to_a_fenced_owner(env):
    shard = env.shard
    with pytest.raises(OwnerFenced):
        shard.prune_retained(owner_epoch=shard.owner_epoch + 1, family=RetainedFamily.ChangeEvent, floor_version=1)
    with pytest.raises(OwnerFenced):
        shard.truncate_outbox(owner_epoch=shard.owner_epoch + 1, through_lsn=1)


# --- ChangeEvent rows below the event floor ---------------------------------------------------------


def test_change_events_at_or_below_the_event_floor_go_and_newer_ones_stay(env):
    shard = env.shard
    for n in range(10):
        env.apply(mutations=[put(n)], events=[b"\x02e%d" % n])
    from nokvfs.engine.retention import event_version

    floor = shard.commit_version - 4
    below = [k for k in rows_of(shard, "change_event") if event_version(k) <= floor]
    assert len(below) >= 6
    removed = prune_all(shard, RetainedFamily.ChangeEvent, floor_version=floor, max_rows=3)
    assert removed == len(below)

    assert sorted(event_version(k) for k in rows_of(shard, "change_event")) == list(
        range(floor + 1, shard.commit_version + 1)
    )
    assert shard.retention_floors.event_floor_version == floor


# --- the recovery outbox: truncation and the chain from the truncation point ----------------------


def test_a_truncated_outbox_verifies_from_the_truncation_point_and_refuses_older_ranges(env):
    shard = env.shard
    populate(env, 40)
    tail = shard.recovery_tail.applied_lsn
    through = tail - 10
    removed = 0
    while True:
        outcome = shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=through, max_records=7)
        removed += outcome.removed_records
        if outcome.floor_lsn >= through:
            break
    assert removed == through
    floors = shard.retention_floors
    assert floors.outbox_floor_lsn == through
    entries = list(shard.outbox_entries())
    assert entries[0].lsn == through + 1
    assert floors.outbox_floor_digest == entries[0].header.previous_chain_digest
    kinds = [e.header.record_kind for e in entries]
    assert kinds.count(OutboxRecordKind.OutboxTruncate) >= 1
    with pytest.raises(HistoryNotRetained):
        shard.outbox_after(through - 1)
    digest, after = shard.outbox_after(through)
    assert digest == floors.outbox_floor_digest and after[0].lsn == through + 1
    shard = env.reopen(verify=True)  # the whole chain, verified from the truncation point
    assert shard.recovery_tail.applied_lsn > tail
    # A record left below the truncation point is damage found at open.
    with shard._env.begin(write=True) as txn:
        from nokvfs.engine import outbox, rows
        from nokvfs.engine.records import OutboxChunk

        rows.put(
            txn,
            shard._dbs["recovery_outbox"],
            "recovery_outbox",
            outbox.chunk_key(through, 0),
            OutboxChunk(b"x").encode(),
        )
    shard.close()
    with pytest.raises(ShardCorrupt):
        Shard.open(env.path, verify=True)


def test_a_replica_restored_after_truncation_and_retention_equals_the_source(s3_bucket, s3_endpoint, tmp_path):
    env = make_shard_env(tmp_path / "source")
    try:
        with s3_store(s3_bucket, s3_endpoint) as store:
            replicator = Replicator(env.shard, store, checkpoint_packs=3)
            replicator.push_once()
            shard = env.shard
            for round_ in range(5):
                populate(env, 12, seed=round_)
                shard.apply(env.command(mutations=[put(round_)], request_id=request_at(T0 + 10_000 * round_ + 1)))
                shard.observe_lease_clock(T0 + 10_000 * (round_ + 1))
                prune_all(shard, RetainedFamily.ChangeEvent, floor_version=shard.commit_version - 5, max_rows=4)
                prune_all(
                    shard,
                    RetainedFamily.CommandDedupe,
                    floor_version=shard.commit_version - 3,
                    horizon_ms=T0 + 10_000 * round_,
                    max_rows=2,
                )
                replicator.push_once()
                durable = horizon.read(shard.path, shard.logical_shard_id)
                if durable:
                    shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=durable)
            replicator.push_once()
            kinds = [e.header.record_kind for e in shard.outbox_entries()]
            assert OutboxRecordKind.RetentionPrune in kinds
            assert shard.retention_floors.outbox_floor_lsn > 0, "the bucket's checkpoint let the outbox be truncated"
            result, restored = restored_shard(store, tmp_path)
            with restored:
                assert restored.retention_floors == shard.retention_floors
                assert_equal_shards(shard, restored, versions=[shard.commit_version])
    finally:
        env.shard.close()


def test_the_outbox_horizon_file_golden_bytes_and_unknown_fields(tmp_path):
    path = str(tmp_path)
    shard_id = b"\x11" * 16
    assert horizon.read(path, shard_id) is None  # never published
    horizon.record(path, shard_id, 7, b"\x22" * 32)
    with open(tmp_path / horizon.HORIZON_NAME, "rb") as f:
        assert (
            f.read() == b'{"chainDigest":"' + b"22" * 32 + b'","logicalShardId":"' + b"11" * 16 + b'","throughLsn":7}'
        )
    horizon.record(path, shard_id, 5, b"\x33" * 32)  # never moves back
    assert horizon.read(path, shard_id) == 7
    assert horizon.read(path, b"\x12" * 16) == 0  # another shard's: nothing truncated on its word
    (tmp_path / horizon.HORIZON_NAME).write_text(
        '{"chainDigest":"","logicalShardId":"' + "11" * 16 + '","throughLsn":7,"extra":1}'
    )
    assert horizon.read(path, shard_id) == 0
    (tmp_path / horizon.HORIZON_NAME).write_text("not json")
    assert horizon.read(path, shard_id) == 0


def test_retention_settings_in_nokvfs_json_refuse_unknown_fields():
    from nokvfs.errors import InvalidInput
    from nokvfs.workspace.retention import RetentionSettings

    assert RetentionSettings.from_config({}) == RetentionSettings()
    assert RetentionSettings.from_config({"retention": {"versions": 3}}).versions == 3
    for bad in ({"retention": {"version": 3}}, {"retention": [1]}, {"retention": {"versions": -1}}):
        with pytest.raises(InvalidInput):
            RetentionSettings.from_config(bad)
