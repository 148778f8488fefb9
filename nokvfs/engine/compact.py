"""Compaction: a shard rewritten without its free pages, swapped in under an exclusive lock.

LMDB never gives pages back to the file system: a shard that once held much more than it holds
now keeps its size (pages are reused, not returned). `compact(path)` writes a compacting copy
(`Shard.copy_to`: LMDB's compacting copy, live pages only, in key order) and swaps it in.

Every process that opens a shard holds a shared flock on `compact.lock` in its directory
(`ShardLock`; a lock taken on a file the swap has since replaced is taken again on the one in
place); compaction takes it exclusively (`ShardBusy` when another process has the shard
open -- a mount, a CLI command), so no writer can exist while it runs. The swap:

  1. copy into `<path>.compact-tmp`, with the files beside data.mdb (commit witness, outbox
     horizon), fsync; open the copy and verify it fully; its recovery tail must be the source's
  2. rename it to `<path>.compact-new` (complete from now on)
  3. rename `<path>` to `<path>.compact-old`
  4. rename `<path>.compact-new` to `<path>`
  5. remove `<path>.compact-old`

A crash anywhere leaves either the old shard at `<path>` (steps 1-2: the leftovers are
removed) or no `<path>` and a complete `<path>.compact-new` (step 3: it is renamed into place),
or both shards (step 4: the old one is removed). `recover` does this (the leftovers are removed
only under the exclusive lock), and `Shard.open` calls it whenever a leftover is there.

A mount compacts the shard it has open (`Shard.compact_live`, from its background maintenance)
when it is the only process that has it open: it turns its own shared lock into the exclusive
one, copies while requests go on, and swaps only if no write transaction committed since the
copy's (else it tries again later). flock turns a lock shared -> exclusive by dropping it first,
so a failed attempt holds nothing for a moment: every exclusive taker (this, `compact`, the
leftover recovery) first takes `<path>.compact-gate` (a file beside the shard directory, which
survives the swap) exclusively, so none can slip into that moment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import time

from nokvfs import filemodes
from nokvfs.errors import NotFound, ShardBusy, ShardCorrupt

SUFFIXES = (".compact-tmp", ".compact-new", ".compact-old")
# Files beside data.mdb that belong to the shard's state (the integrity alarm refuses compaction).
SIDE_FILES = ("commit-witness", "outbox-horizon")
CRASH_ENV = "NOKVFS_COMPACT_CRASH"  # tests: the step after which the process dies
SHARED_WAIT = 60.0  # seconds an opener waits for a running compaction
# A live compaction holds writes back during its copy only below this many bytes in use (the copy
# and its verification run at roughly 100 MB/s here, so writes wait well under 2 s).
HOLD_LIMIT = 128 << 20


LOCK_NAME = "compact.lock"
GATE_SUFFIX = ".compact-gate"


def lock_path(path: str) -> str:
    return os.path.join(path, LOCK_NAME)


def _take_gate(path: str) -> int | None:
    """The exclusive gate every exclusive taker holds (module docstring), or None when another
    process holds it now."""
    try:
        fd = os.open(path + GATE_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, filemodes.FILE_MODE)
    except FileNotFoundError:
        raise NotFound(f"no directory for a shard at {path}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class ShardLock:
    """A flock on the shard's lock file: shared while a process has the shard open, exclusive
    while it is compacted."""

    def __init__(self, path: str):
        self.path = path
        self._gate: int | None = None  # the gate's fd while this lock is (or is turning) exclusive
        try:
            self._fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, filemodes.FILE_MODE)
        except FileNotFoundError:
            raise NotFound(f"no shard at {path}") from None

    def _still_in_place(self) -> bool:
        """Whether the locked file is the one at the path now (a swap may have replaced it)."""
        try:
            return os.stat(lock_path(self.path)).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False

    @classmethod
    def shared(cls, path: str, *, wait: float = SHARED_WAIT) -> "ShardLock":
        deadline = time.monotonic() + wait
        while True:
            lock = cls(path)
            try:
                fcntl.flock(lock._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                if lock._still_in_place():
                    return lock
            except BlockingIOError:
                pass
            lock.release()
            if time.monotonic() > deadline:
                raise ShardBusy(f"{path} is being compacted (waited {wait:g} s)")
            time.sleep(0.05)

    @classmethod
    def exclusive(cls, path: str) -> "ShardLock | None":
        """The exclusive lock, or None when another process has the shard open."""
        gate = _take_gate(path)
        if gate is None:
            return None
        lock = cls(path)
        lock._gate = gate
        try:
            fcntl.flock(lock._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.release()
            return None
        if not lock._still_in_place():
            lock.release()
            return None
        return lock

    def upgrade(self) -> bool:
        """Turn this shared lock exclusive (True), or keep it shared (False) when another process
        has the shard open or is compacting it."""
        gate = _take_gate(self.path)
        if gate is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The failed conversion dropped the shared lock; nobody can be exclusive while the
            # gate is held, so taking it again does not wait.
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            os.close(gate)
            return False
        self._gate = gate
        return True

    def downgrade(self) -> None:
        """Back to shared after `upgrade` (shared -> shared is a no-op)."""
        if self._gate is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        os.close(self._gate)
        self._gate = None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
        if self._gate is not None:
            os.close(self._gate)
            self._gate = None


def has_leftovers(path: str) -> bool:
    return any(os.path.lexists(path + suffix) for suffix in SUFFIXES)


def recover(path: str) -> None:
    """Finish or undo an interrupted compaction (the module docstring's cases). A missing shard
    is put back in place at once (nothing can have it open); the leftovers are removed only
    under the exclusive lock (without it the shard is open elsewhere, or being compacted)."""
    _put_back(path)
    if not os.path.exists(path):
        return
    lock = ShardLock.exclusive(path)
    if lock is None:
        return
    try:
        _recover_locked(path)
    finally:
        lock.release()


def _put_back(path: str) -> None:
    if os.path.exists(path):
        return
    for candidate in (path + ".compact-new", path + ".compact-old"):  # the complete copy first
        try:
            os.rename(candidate, path)
        except (FileNotFoundError, FileExistsError, IsADirectoryError, OSError):
            continue  # absent, or another process put one back first
        filemodes.fsync_directory(os.path.dirname(os.path.abspath(path)))
        return


def _recover_locked(path: str) -> None:
    new, old, tmp = path + ".compact-new", path + ".compact-old", path + ".compact-tmp"
    _put_back(path)
    for leftover in (tmp, new, old):
        if os.path.lexists(leftover):
            shutil.rmtree(leftover)


@dataclasses.dataclass(frozen=True)
class CompactReport:
    before_bytes: int
    after_bytes: int
    applied_lsn: int


def _crash(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os._exit(137)


def _fsync_tree(directory: str) -> None:
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    filemodes.fsync_directory(directory)


def _copy_verified(source, path: str, *, side_files: bool) -> "CopyPoint":  # noqa: F821
    """Steps 1: a compacting copy of the open `source` into `<path>.compact-tmp`, fsync'd, opened
    and fully verified, ending where the copy's transaction saw the shard end."""
    from nokvfs.engine.shard import Shard

    tmp = path + ".compact-tmp"
    filemodes.makedirs(tmp)
    point = source.copy_to(tmp)
    os.chmod(os.path.join(tmp, "data.mdb"), filemodes.FILE_MODE)  # LMDB's copy is made 0644
    if side_files:
        _copy_side_files(path, tmp)
    _fsync_tree(tmp)
    copy = Shard.open(tmp, verify=True, locked=True)
    try:
        if (copy.recovery_tail.applied_lsn, copy.recovery_tail.chain_digest) != (
            point.applied_lsn,
            point.chain_digest,
        ):
            raise ShardCorrupt(f"the compacted copy of {path} does not end where the shard does")
    finally:
        copy.close()
    for name in ("lock.mdb", LOCK_NAME):  # made afresh at the next open
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(tmp, name))
    _crash("copied")
    return point


def _copy_side_files(path: str, tmp: str) -> None:
    for name in SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(os.path.join(path, name), os.path.join(tmp, name))


def _swap(path: str) -> None:
    """Steps 2-5 (module docstring), each rename made durable before the next."""
    parent = os.path.dirname(path)
    os.rename(path + ".compact-tmp", path + ".compact-new")
    filemodes.fsync_directory(parent)
    _crash("new")
    os.rename(path, path + ".compact-old")
    filemodes.fsync_directory(parent)
    _crash("old")
    os.rename(path + ".compact-new", path)
    filemodes.fsync_directory(parent)
    _crash("swapped")
    shutil.rmtree(path + ".compact-old")


def _discard_copy(path: str) -> None:
    if os.path.exists(path):  # failed before the swap: the shard is untouched
        with contextlib.suppress(OSError):
            shutil.rmtree(path + ".compact-tmp")


def compact(path: str) -> CompactReport:
    """Compact the shard at `path` in place (module docstring). ShardBusy when another process
    has it open; the shard is untouched by any failure before the swap."""
    from nokvfs.engine.alarm import ALARM_NAME
    from nokvfs.engine.shard import Shard

    path = os.path.abspath(path)
    _put_back(path)
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise NotFound(f"no shard at {path}")
    lock = ShardLock.exclusive(path)
    if lock is None:
        raise ShardBusy(f"{path} is open in another process (a mount, a command): stop it to compact")
    try:
        _recover_locked(path)
        if not os.path.exists(os.path.join(path, "data.mdb")):
            raise NotFound(f"no shard at {path}")
        if os.path.exists(os.path.join(path, ALARM_NAME)):
            raise ShardCorrupt(f"{path} has an integrity alarm: run fsck before compacting")
        before = os.path.getsize(os.path.join(path, "data.mdb"))
        source = Shard.open(path, locked=True)
        try:
            point = _copy_verified(source, path, side_files=True)
        finally:
            source.close()
        _swap(path)
        after = os.path.getsize(os.path.join(path, "data.mdb"))
        return CompactReport(before, after, point.applied_lsn)
    except BaseException:
        _discard_copy(path)
        raise
    finally:
        lock.release()


def compact_open(
    shard, *, attempts: int = 2, gate_wait: float = 5.0, hold_limit: int = HOLD_LIMIT
) -> CompactReport | None:
    """Compact the shard this process has open, without closing it for longer than the swap
    (module docstring). None when another process has it open, or when every attempt saw a
    write commit during its copy (try again later).

    The first attempts copy while everything goes on; transactions wait only while the swap
    itself runs (the renames and the reopen). Writes that keep committing make such a copy
    stale, so the last attempt holds new write transactions back while it copies (reads go on)
    -- only when at most `hold_limit` bytes are in use, which bounds that wait."""
    from nokvfs.engine import horizon
    from nokvfs.engine.alarm import ALARM_NAME

    path = shard.path
    lock = shard._lock
    if lock is None or os.path.exists(os.path.join(path, ALARM_NAME)):
        return None
    if not lock.upgrade():
        return None
    try:
        _recover_locked(path)
        before = os.path.getsize(os.path.join(path, "data.mdb"))
        used, _ = shard.space()
        for attempt in range(attempts):
            hold = attempt == attempts - 1 and used <= hold_limit
            try:
                with shard.writes_held(gate_wait) if hold else contextlib.nullcontext():
                    point = _copy_verified(shard, path, side_files=False)
                    # A shared lock on the copy's own lock file before it is in place, so that no
                    # other process can take it exclusively between the swap and this one's reopen.
                    new_lock = ShardLock(path + ".compact-tmp")
                    fcntl.flock(new_lock._fd, fcntl.LOCK_SH)
                    try:
                        with shard.swap_gate(gate_wait), horizon.RECORDING:
                            if shard.last_txn_id() != point.txn_id:
                                raise _Stale
                            _copy_side_files(path, path + ".compact-tmp")
                            _fsync_tree(path + ".compact-tmp")
                            shard.reopen_after(lambda: _swap(path))
                    except BaseException:
                        new_lock.release()
                        raise
            except (_Stale, TimeoutError):
                _discard_copy(path)
                continue
            except BaseException:
                _discard_copy(path)
                raise
            new_lock.path = path
            old, shard._lock = lock, new_lock
            old.release()
            lock = None
            return CompactReport(before, os.path.getsize(os.path.join(path, "data.mdb")), point.applied_lsn)
        return None
    finally:
        if lock is not None:
            lock.downgrade()


class _Stale(Exception):
    """A write committed while the copy was made: it would be lost by the swap."""
