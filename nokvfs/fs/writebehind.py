"""Write-behind: the bytes of a file that will be synced at its close are sent to the disk while
the file is still being written, so that the fsync at close waits for the last few MiB instead of
the whole file.

A write-back mount's close(2) returns once the file is durable here: a spool too big for the
journal is fdatasync'ed then (nokvfs.fs.writeback). Until that fsync the kernel holds every byte
written as a dirty page, so close(2) used to wait for the whole file to reach the disk, after
the writes: 0.06-0.08 s for 128 MiB on this machine kind. Linux's sync_file_range(2) with
SYNC_FILE_RANGE_WRITE starts writeback of a range's dirty pages and returns; asked for each
WINDOW bytes as the spool grows, the disk writes them while the next ones arrive, and the
fdatasync at close had 0.001-0.002 s left to wait for (128 MiB in 1 MiB writes at the FUSE pace,
then fdatasync, 2026-12-07).

It is only a hint: durability still comes from the fsync at close, so a failed or skipped
request changes nothing but that fsync's duration, and errors are ignored. Starting I/O can
block while the device's queue is full, and no FUSE request may wait on that, so the request
runs in a helper thread on a duplicate of the descriptor (valid however long it waits, whatever
the spool does meanwhile; the spool's flock, which the duplicate shares, outlasts a close of the
spool by as long as the request takes). At most MAX_IN_FLIGHT requests wait at a time,
process-wide; beyond that they are skipped. Not on a memory spool (tmpfs has no disk behind it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger(__name__)

# Bytes of growth between two requests (two default blocks); NOKVFS_WRITEBEHIND_WINDOW sets it,
# 0 turns write-behind off (an A/B of the same code).
WINDOW = int(os.environ.get("NOKVFS_WRITEBEHIND_WINDOW", 8 * 1024 * 1024))
MAX_IN_FLIGHT = 8
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait

_lock = threading.Lock()
_in_flight = 0  # requests submitted and not finished (under _lock)
_pool: concurrent.futures.ThreadPoolExecutor | None = None
# Process-wide, for the daemon's log: bytes whose writeback was started early, requests skipped.
COUNTS = {"bytes": 0, "skipped": 0}


def _load():
    """libc's sync_file_range, or None where there is none (not Linux)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_sync_file_range = _load()
AVAILABLE = _sync_file_range is not None


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing `length` bytes of `fd` from `offset` to the disk now
    (blocking while the device queue is full); OSError if it refuses the call."""
    if _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nokvfs-writebehind")
        return _pool


class WriteBehind:
    """The write-behind of one spool file: `grown(fd, end)` after each write that may have made
    the file longer, `shrunk(size)` after a truncate, `reset()` for a new file."""

    __slots__ = ("started_to",)

    def __init__(self):
        self.started_to = 0  # writeback was requested for every byte before this offset

    def reset(self) -> None:
        self.started_to = 0

    def shrunk(self, size: int) -> None:
        self.started_to = min(self.started_to, size)

    def grown(self, fd: int, end: int) -> None:
        """The file's bytes up to `end` are written: once WINDOW more than were sent, send them."""
        if not AVAILABLE or WINDOW <= 0 or end - self.started_to < WINDOW:
            return
        global _in_flight
        offset, length = self.started_to, end - self.started_to
        with _lock:
            if _in_flight >= MAX_IN_FLIGHT:
                COUNTS["skipped"] += 1
                return  # the disk is behind already; the fsync at close covers these bytes
            _in_flight += 1
        try:
            duplicate = os.dup(fd)
        except OSError:
            _finished()
            return
        self.started_to = end
        _executor().submit(_request, duplicate, offset, length)


def _request(fd: int, offset: int, length: int) -> None:
    try:
        start_writeback(fd, offset, length)
        COUNTS["bytes"] += length
    except OSError as exc:
        log.debug("write-behind of %d bytes at %d not started: %s", length, offset, exc)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
        _finished()


def _finished() -> None:
    global _in_flight
    with _lock:
        _in_flight -= 1


def wait_idle(timeout: float = 10.0) -> bool:
    """Whether every request submitted so far has finished within `timeout` seconds (tests)."""
    pool = _pool
    if pool is None:
        return True
    return not concurrent.futures.wait([pool.submit(lambda: None)], timeout=timeout).not_done
