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


LOCK_NAME = "compact.lock"


def lock_path(path: str) -> str:
    return os.path.join(path, LOCK_NAME)


class ShardLock:
    """A flock on the shard's lock file: shared while a process has the shard open, exclusive
    while it is compacted."""

    def __init__(self, path: str):
        self.path = path
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
        lock = cls(path)
        try:
            fcntl.flock(lock._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.release()
            return None
        if not lock._still_in_place():
            lock.release()
            return None
        return lock

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


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
        _fsync_dir(os.path.dirname(os.path.abspath(path)))
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


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: str) -> None:
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _fsync_dir(directory)


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
        tmp = path + ".compact-tmp"
        filemodes.makedirs(tmp)
        source = Shard.open(path, locked=True)
        try:
            point = source.copy_to(tmp)
        finally:
            source.close()
        os.chmod(os.path.join(tmp, "data.mdb"), filemodes.FILE_MODE)  # LMDB's copy is made 0644
        for name in SIDE_FILES:
            with contextlib.suppress(FileNotFoundError):
                shutil.copy2(os.path.join(path, name), os.path.join(tmp, name))
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
        parent = os.path.dirname(path)
        os.rename(tmp, path + ".compact-new")
        _fsync_dir(parent)
        _crash("new")
        os.rename(path, path + ".compact-old")
        _fsync_dir(parent)
        _crash("old")
        os.rename(path + ".compact-new", path)
        _fsync_dir(parent)
        _crash("swapped")
        shutil.rmtree(path + ".compact-old")
        after = os.path.getsize(os.path.join(path, "data.mdb"))
        return CompactReport(before, after, point.applied_lsn)
    except BaseException:
        if os.path.exists(path):  # failed before the swap: the shard is untouched
            with contextlib.suppress(OSError):
                shutil.rmtree(path + ".compact-tmp")
        raise
    finally:
        lock.release()
