"""CommandDedupe rows: a result longer than 128 bytes is stored deflated with the preset dictionary
(DeflatedCommandDedupe, version 3) when that is smaller; an exact replay returns the exact result
either way, and retention reads the commit version of both forms."""

from __future__ import annotations

import pytest

from nokvfs.engine import dedupe
from nokvfs.engine.command import Put
from nokvfs.engine.compression import DICTIONARY_1
from nokvfs.engine.records import DeflatedCommandDedupe
from nokvfs.errors import CorruptRecord, UnknownVersion
from nokvfs.schema import keys
from nokvfs.schema.enums import RetainedFamily
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import CommandDedupe

RESULT = DICTIONARY_1[-300:]  # shaped like a publish's result


def test_short_results_keep_the_seed_record_and_long_ones_are_deflated():
    short = CommandDedupe(b"\xc3" * 32, b"ok", 4, 5)
    assert dedupe.encode(short) == short.encode() and dedupe.decode(short.encode()) == short
    long = CommandDedupe(b"\xc3" * 32, RESULT, 4, 5)
    stored = dedupe.encode(long)
    assert stored[0] == 3 and len(stored) < len(long.encode()) - 100
    assert DeflatedCommandDedupe.decode(stored).result_length == len(RESULT)
    assert dedupe.decode(stored) == long
    incompressible = CommandDedupe(b"\xc3" * 32, bytes(range(256)), 4, 5)
    assert dedupe.encode(incompressible) == incompressible.encode()


def test_damaged_or_unknown_dedupe_rows_fail_closed():
    stored = DeflatedCommandDedupe.decode(dedupe.encode(CommandDedupe(b"\xc3" * 32, RESULT, 4, 5)))
    for bad in (
        DeflatedCommandDedupe(stored.command_digest, len(RESULT) + 1, stored.deflated_result, 4, 5),
        DeflatedCommandDedupe(stored.command_digest, len(RESULT), stored.deflated_result[:-2], 4, 5),
    ):
        with pytest.raises(CorruptRecord):
            dedupe.decode(bad.encode())
    with pytest.raises(UnknownVersion):
        dedupe.decode(b"\x04" + bad.encode()[1:])


def test_an_exact_replay_returns_the_long_result_after_reopen(shard_env):
    request = new_id16()
    command = shard_env.command(
        request_id=request, mutations=[Put("path_current", b"\x05" * 20, b"\x02v")], result=RESULT
    )
    first = shard_env.shard.apply(command)
    with shard_env.shard._env.begin() as txn:
        raw = shard_env.stored(txn, "command_dedupe", keys.CommandDedupeKey(shard_env.root_id, request).encode())
    assert raw[0] == 3
    shard = shard_env.reopen(verify=True)
    again = shard.apply(command)
    assert again.replayed and (again.commit_version, again.recovery_lsn, again.result) == (
        first.commit_version,
        first.recovery_lsn,
        RESULT,
    )


def test_retention_reads_the_commit_version_of_deflated_rows(shard_env):
    old = shard_env.command(mutations=[Put("path_current", b"\x06" * 20, b"\x02v")], result=RESULT)
    shard_env.shard.apply(old)
    key = keys.CommandDedupeKey(shard_env.root_id, old.request_id).encode()
    shard = shard_env.shard
    shard.observe_lease_clock(int.from_bytes(new_id16()[:6], "big") + 10_000)
    with shard.read(shard.commit_version - 1) as view:
        assert view.get("command_dedupe", key) is None  # filtered by its commit version
    shard.prune_retained(
        owner_epoch=shard.owner_epoch,
        family=RetainedFamily.CommandDedupe,
        floor_version=shard.commit_version,
        horizon_ms=shard.lease_clock_ms,
        start_key=b"",
    )
    with shard.read() as view:
        assert view.get("command_dedupe", key) is None
