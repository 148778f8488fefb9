"""The LMDB environment as a shard uses it: write transactions flushed in LMDB's order by the
shard itself (`SyncingEnv`, so one command may skip its flush), behind a gate that lets a live
compaction replace the environment while the process runs (`GatedEnv`)."""

from __future__ import annotations

import contextlib
import threading
import time

import lmdb


class SyncingEnv:
    """An LMDB environment opened with MDB_NOMETASYNC whose write transactions are durable when
    they return anyway: after the commit (LMDB fdatasyncs the data pages, then writes the meta page
    unsynced) one more fdatasync flushes the meta page -- the two flushes, in the order, LMDB's
    default makes. `begin(write=True, durable=False)` leaves out the second flush: that commit is
    atomic and consistent (LMDB's guarantee for NOMETASYNC) but a power loss may undo it, until
    the next durable commit or `sync` flushes it with its own. Only a command whose loss recovery
    resolves by itself may ask for that (publish.finalize, followed by the durable publication).
    Read transactions are LMDB's own, untouched; every other call goes to the environment."""

    def __init__(self, env: lmdb.Environment, *, flush: bool):
        self._env = env
        self._flush = flush  # False: an environment opened with sync=False (`Shard.sync` flushes)

    def __getattr__(self, name):
        return getattr(self._env, name)

    def begin(self, *args, write: bool = False, durable: bool = True, **kwargs):
        txn = self._env.begin(*args, write=write, **kwargs)
        if not write or kwargs.get("parent") is not None:
            return txn  # a read, or a nested transaction: its top-level one flushes
        return SyncedWrite(self._env, txn, durable and self._flush)


class SyncedWrite:
    __slots__ = ("_env", "_txn", "_durable")

    def __init__(self, env, txn, durable: bool):
        self._env, self._txn, self._durable = env, txn, durable

    def __enter__(self):
        return self._txn.__enter__()

    def __exit__(self, kind, exc, tb):
        self._txn.__exit__(kind, exc, tb)
        if kind is None and self._durable:
            self._env.sync(True)
        return False


class GatedEnv:
    """The LMDB environment behind a gate, so that `Shard.compact_live` can close and reopen it
    while the process runs. Every transaction enters the gate. `exclusive` waits until none is
    open and holds new ones back while the environment is replaced; `hold_writes` holds new write
    transactions back (reads go on) while a copy is made. A thread that already has a
    transaction open is never held back from opening another (nesting cannot deadlock on the
    gate): at worst its write commits after the copy, which the compactor sees and gives up.
    Everything else is the environment's own."""

    def __init__(self, env: lmdb.Environment):
        self.inner = env
        self._cond = threading.Condition()
        self._open = 0
        self._open_writes = 0
        self._swapping = False
        self._writes_held = False
        self._depth = threading.local()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def begin(self, **kwargs) -> "GatedTxn":
        return GatedTxn(self, kwargs)

    def last_txnid(self) -> int | None:
        """The id of the last transaction committed here, by any process (LMDB's meta page);
        None while the environment is being replaced or cannot say."""
        with self._cond:
            if self._swapping:
                return None
            try:
                return self.inner.info()["last_txnid"]
            except lmdb.Error:
                return None

    def _enter(self, write: bool) -> None:
        depth = getattr(self._depth, "n", 0)
        with self._cond:
            if not depth:
                while self._swapping or (write and self._writes_held):
                    self._cond.wait()
            self._open += 1
            self._open_writes += write
        self._depth.n = depth + 1

    def _leave(self, write: bool) -> None:
        self._depth.n -= 1
        with self._cond:
            self._open -= 1
            self._open_writes -= write
            self._cond.notify_all()

    def _wait_until(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(what)
            self._cond.wait(left)

    def hold_writes(self, timeout: float):
        """No write transaction open, and none begins (but nested ones), inside the block;
        TimeoutError when one stayed open for `timeout` seconds."""
        return self._barred("_writes_held", lambda: not self._open_writes, timeout, "a write transaction stayed open")

    def exclusive(self, timeout: float):
        """No transaction open, and none begins, inside the block; TimeoutError when some stayed
        open for `timeout` seconds. Lets held writes go (a nested one must not wait for this)."""
        return self._barred("_swapping", lambda: not self._open, timeout, "transactions stayed open", free_writes=True)

    @contextlib.contextmanager
    def _barred(self, flag: str, done, timeout: float, what: str, *, free_writes: bool = False):
        with self._cond:
            setattr(self, flag, True)
            if free_writes:
                self._writes_held = False
                self._cond.notify_all()
            try:
                self._wait_until(done, timeout, what)
            except BaseException:
                setattr(self, flag, False)
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                setattr(self, flag, False)
                self._cond.notify_all()


class GatedTxn:
    __slots__ = ("_gate", "_kwargs", "_txn", "_write")

    def __init__(self, gate: GatedEnv, kwargs: dict):
        self._gate = gate
        self._kwargs = kwargs
        self._write = bool(kwargs.get("write"))

    def __enter__(self):
        self._gate._enter(self._write)
        try:
            self._txn = self._gate.inner.begin(**self._kwargs)
            return self._txn.__enter__()
        except BaseException:
            self._gate._leave(self._write)
            raise

    def __exit__(self, *exc):
        try:
            return self._txn.__exit__(*exc)
        finally:
            self._gate._leave(self._write)
