"""When a command is durable: LMDB runs with MDB_NOMETASYNC and the shard flushes the meta page
itself after every commit (nokvfs.engine.environment.SyncingEnv), except for a command applied with
`durable=False`, whose flush the next durable commit, `sync`, `close`, or any reader that ships
outbox records (`outbox_after`, `outbox_entries`, `copy_to`) does first.

A power loss cannot be staged in a test; what is checked is the order of the calls that make a
commit durable (each flush after its commit, none skipped for a durable one) and that nothing
outside the shard -- the commit witness, a shipped outbox range -- learns of a command before it
is flushed."""

from __future__ import annotations

import threading
import time

from nokvfs.engine.command import Put
from nokvfs.engine.meta import CommitWitness
from nokvfs.engine.shard import Shard


class RecordingEnv:
    """The real LMDB environment, with its flushes and write commits recorded in order."""

    def __init__(self, env, calls):
        self._env, self._calls = env, calls

    def __getattr__(self, name):
        return getattr(self._env, name)

    def sync(self, force=False):
        self._calls.append("flush")
        return self._env.sync(force)

    def begin(self, *args, write=False, **kwargs):
        txn = self._env.begin(*args, write=write, **kwargs)
        return RecordingWrite(txn, self._calls) if write else txn


class RecordingWrite:
    def __init__(self, txn, calls):
        self._txn, self._calls = txn, calls

    def __enter__(self):
        return self._txn

    def __exit__(self, *exc):
        result = self._txn.__exit__(*exc)
        self._calls.append("commit")
        return result


def _syncing(shard: Shard):
    """The shard's SyncingEnv (behind the compaction gate where there is one)."""
    env = shard._env
    return getattr(env, "inner", env)


def _record(shard: Shard) -> list[str]:
    calls: list[str] = []
    _syncing(shard)._env = RecordingEnv(_syncing(shard)._env, calls)
    return calls


def _put(env, n: int, *, durable: bool = True):
    command = env.command(mutations=[Put("path_current", b"\x0c" * 32 + n.to_bytes(4, "big"), b"\x02v")])
    return env.shard.apply(command, durable=durable)


def test_the_environment_defers_the_meta_flush_to_the_shard(shard_env):
    flags = shard_env.shard._env.flags()
    assert flags["sync"] is True and flags["metasync"] is False


def test_a_durable_command_is_flushed_after_its_commit(shard_env):
    calls = _record(shard_env.shard)
    outcome = _put(shard_env, 1)
    assert calls == ["commit", "flush"]
    assert CommitWitness(shard_env.path).read() == outcome.recovery_lsn


def test_a_command_applied_without_its_flush_is_witnessed_and_shipped_only_once_flushed(shard_env):
    first = _put(shard_env, 1)
    calls = _record(shard_env.shard)
    second = _put(shard_env, 2, durable=False)
    assert calls == ["commit"]
    assert shard_env.shard.recovery_tail.applied_lsn == second.recovery_lsn
    assert CommitWitness(shard_env.path).read() == first.recovery_lsn  # not witnessed yet

    # A reader that ships records flushes it before it reads: the range it gets is durable.
    _, entries = shard_env.shard.outbox_after(first.recovery_lsn)
    assert [e.lsn for e in entries] == [second.recovery_lsn]
    assert calls == ["commit", "flush"]
    assert CommitWitness(shard_env.path).read() == second.recovery_lsn
    shard_env.shard.outbox_after(first.recovery_lsn)
    assert calls == ["commit", "flush"]  # nothing left to flush


def test_every_shipping_reader_flushes_first(shard_env, tmp_path):
    (tmp_path / "copy").mkdir()
    for index, read in enumerate(
        [
            lambda shard: list(shard.outbox_entries()),
            lambda shard: shard.copy_to(str(tmp_path / "copy")),
            lambda shard: shard.outbox_after(0),
        ]
    ):
        calls = _record(shard_env.shard)
        _put(shard_env, 10 + index, durable=False)
        read(shard_env.shard)
        assert calls == ["commit", "flush"]
        _syncing(shard_env.shard)._env = _syncing(shard_env.shard)._env._env


def test_close_flushes_a_command_applied_without_its_flush(shard_env):
    outcome = _put(shard_env, 1, durable=False)
    calls = _record(shard_env.shard)
    shard_env.reopen()
    assert calls == ["flush"]
    assert CommitWitness(shard_env.path).read() == outcome.recovery_lsn
    assert shard_env.shard.recovery_tail.applied_lsn == outcome.recovery_lsn


def test_a_reader_racing_unflushed_commits_ships_only_flushed_ones(shard_env):
    """Commands applied without their flush in one thread, outbox ranges read in another: every
    record a reader gets is flushed (the witness, written only for flushed LSNs, covers it)."""
    stop = threading.Event()
    applied = []

    def writer():
        n = 0
        while not stop.is_set():
            n += 1
            applied.append(_put(shard_env, 1000 + n, durable=False).recovery_lsn)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        shipped = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline or not shipped:
            _, entries = shard_env.shard.outbox_after(shipped)
            if entries:
                shipped = entries[-1].lsn
                assert CommitWitness(shard_env.path).read() >= shipped
    finally:
        stop.set()
        thread.join()
    assert applied and shipped >= applied[0]
