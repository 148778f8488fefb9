"""Pack framing and the engine helpers replication reads through (Shard.copy_to, outbox_after)."""

from __future__ import annotations

import os

import pytest

from nokvfs.engine.command import Put
from nokvfs.engine.shard import Shard
from nokvfs.errors import OutboxCorrupt
from nokvfs.replicate.errors import PackCorrupt
from nokvfs.replicate.packs import (
    CHECKPOINT_HEADER_SIZE,
    CheckpointHeader,
    CheckpointSink,
    build_increment,
    parse_increment,
    write_checkpoint_pack,
)


def _fill(env, n=5):
    for i in range(n):
        env.apply(mutations=[Put("path_current", b"\x01" * 16 + bytes([i]), b"\x02" + os.urandom(70_000 * (i % 2)))])
    env.shard.observe_lease_clock(123)
    env.shard.advance_owner_epoch(env.shard.owner_epoch + 1)


def test_outbox_after_returns_verified_entries_from_any_point(shard_env):
    _fill(shard_env)
    everything = list(shard_env.shard.outbox_entries())
    digest, entries = shard_env.shard.outbox_after(0)
    assert entries == everything
    digest, entries = shard_env.shard.outbox_after(3, max_records=2)
    assert digest == everything[2].header.chain_digest and [e.lsn for e in entries] == [4, 5]
    assert shard_env.shard.outbox_after(4, through_lsn=5)[1] == everything[4:5]
    assert [e.lsn for e in shard_env.shard.outbox_after(2, max_bytes=1)[1]] == [3], "at least one entry"
    last = everything[-1].lsn
    assert shard_env.shard.outbox_after(last) == (everything[-1].header.chain_digest, [])
    assert shard_env.shard.outbox_after(last + 1) == (None, [])


def test_outbox_after_refuses_a_broken_record(shard_env):
    _fill(shard_env)
    from nokvfs.engine import outbox

    shard = shard_env.shard
    with shard._env.begin(write=True) as txn:
        txn.delete(outbox.chunk_key(4, 0), db=shard._dbs["recovery_outbox"])
    with pytest.raises(OutboxCorrupt, match="missing chunk"):
        shard.outbox_after(2)


def test_copy_to_is_a_consistent_compacted_copy_and_says_where_it_is(shard_env, tmp_path):
    _fill(shard_env)
    os.mkdir(tmp_path / "copy")
    point = shard_env.shard.copy_to(str(tmp_path / "copy"))
    tail = shard_env.shard.recovery_tail
    assert (point.applied_lsn, point.chain_digest) == (tail.applied_lsn, tail.chain_digest)
    assert point.commit_version == shard_env.shard.commit_version and point.owner_epoch == shard_env.shard.owner_epoch
    with Shard.open(str(tmp_path / "copy"), verify=True) as copy:
        assert copy.recovery_tail == tail


def test_an_increment_pack_round_trips_and_every_break_is_pack_corrupt(shard_env):
    _fill(shard_env)
    previous, entries = shard_env.shard.outbox_after(2)
    data = build_increment(shard_env.shard.logical_shard_id, previous, entries)
    pack = parse_increment(data)
    assert pack.entries == entries and (pack.first_lsn, pack.last_lsn) == (3, entries[-1].lsn)
    assert pack.previous_chain_digest == previous and pack.chain_digest == entries[-1].header.chain_digest
    broken = {
        "truncated": data[:-9],
        "trailing": data + b"\x00",
        "magic": b"X" + data[1:],
        "payload": data[:200] + bytes([data[200] ^ 1]) + data[201:],
        "previous": data[:40] + bytes(32) + data[72:],
    }
    for bad in broken.values():
        with pytest.raises(PackCorrupt):
            parse_increment(bad)
    # A chain that does not follow: drop the first record but keep the header's previous digest.
    with pytest.raises(PackCorrupt, match="previous chain digest"):
        parse_increment(build_increment(shard_env.shard.logical_shard_id, previous, entries[1:]))


def test_a_checkpoint_pack_streams_into_a_sink_that_checks_its_header(shard_env, tmp_path):
    os.mkdir(tmp_path / "copy")
    point = shard_env.shard.copy_to(str(tmp_path / "copy"))
    data_path = str(tmp_path / "copy" / "data.mdb")
    pack_path = str(tmp_path / "c.pack")
    _, size = write_checkpoint_pack(
        data_path,
        pack_path,
        logical_shard_id=shard_env.shard.logical_shard_id,
        through_lsn=point.applied_lsn,
        commit_version=point.commit_version,
        chain_digest=point.chain_digest,
        owner_epoch=point.owner_epoch,
    )
    with open(pack_path, "rb") as f:
        raw = f.read()
    assert size == len(raw) == CHECKPOINT_HEADER_SIZE + os.path.getsize(data_path)
    sink = CheckpointSink(str(tmp_path / "out.mdb"))
    for i in range(0, len(raw), 7):  # chunks that split the header
        sink.write(raw[i : i + 7])
    header = sink.finish()
    assert header.through_lsn == point.applied_lsn and header.logical_shard_id == shard_env.shard.logical_shard_id
    with open(tmp_path / "out.mdb", "rb") as out, open(data_path, "rb") as data:
        assert out.read() == data.read()
    sink = CheckpointSink(str(tmp_path / "bad.mdb"))
    sink.write(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(PackCorrupt):
        sink.finish()
    with pytest.raises(PackCorrupt):
        CheckpointHeader.decode(b"NOTACKPT" + raw[8:CHECKPOINT_HEADER_SIZE])
