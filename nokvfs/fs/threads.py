"""Blocking work off the event loop, with bounded concurrency and a deadline per syscall.

Uploads, downloads, hashing, fsync and every facade call that writes a MetadataCommand (an LMDB
write transaction that syncs) run in worker threads. Two limiters keep foreground requests from
queueing behind speculative work: `foreground` for what a syscall is waiting on, `background` for
prefetch. LMDB point reads and bounded scans stay inline: they cost microseconds.

A syscall never waits longer than the deadline (`--syscall-timeout`, default 30 s): `bounded` runs
the work as a task of the daemon's own nursery and waits for it at most that long. When the
deadline passes the syscall answers ETIMEDOUT-as-EIO (`SyscallTimeout`) while the work goes on and
finishes what it started (a publication still lands, or fails and keeps its spool); the work
itself updates the mount's state, so nothing depends on the waiter still being there. The daemon
keeps serving other requests meanwhile. (pyfuse3 does not deliver FUSE interrupts, so a caller's
signal cannot shorten the wait; the deadline bounds it.)
"""

from __future__ import annotations

import functools
import logging

import trio

from nokvfs.errors import SyscallTimeout

log = logging.getLogger(__name__)

DEFAULT_SYSCALL_TIMEOUT = 30.0


class Workers:
    def __init__(self, foreground: int = 8, background: int = 2, *, syscall_timeout: float = DEFAULT_SYSCALL_TIMEOUT):
        self.foreground = trio.CapacityLimiter(foreground)
        self.background = trio.CapacityLimiter(background)
        self.syscall_timeout = syscall_timeout
        self._nursery = None
        self.timeouts = 0

    def start(self, nursery) -> None:
        """Work handed to `bounded` runs in this nursery from now on (the daemon's)."""
        self._nursery = nursery

    async def run(self, fn, *args, **kwargs):
        """Run fn(*args, **kwargs) in a worker thread for a waiting syscall."""
        call = functools.partial(fn, *args, **kwargs) if kwargs else fn
        return await trio.to_thread.run_sync(call, *(() if kwargs else args), limiter=self.foreground)

    async def speculate(self, fn, *args):
        """Run fn(*args) in a worker thread for work nobody waits on yet (prefetch)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.background)

    async def bounded(self, what: str, async_fn, *args):
        """await async_fn(*args), but give up waiting after the syscall deadline.

        Without a nursery (kernel-less tests before start) the work is simply awaited.
        """
        if self._nursery is None:
            return await async_fn(*args)
        done = trio.Event()
        box: dict = {}

        async def work():
            try:
                box["value"] = await async_fn(*args)
            except Exception as exc:  # noqa: BLE001 - handed to the waiter (or logged if it left)
                box["error"] = exc
                if box.get("abandoned"):
                    log.warning("%s failed after its syscall gave up waiting: %s: %s", what, type(exc).__name__, exc)
            finally:
                done.set()

        self._nursery.start_soon(work)
        with trio.move_on_after(self.syscall_timeout):
            await done.wait()
        if not done.is_set():
            box["abandoned"] = True
            self.timeouts += 1
            raise SyscallTimeout(
                f"{what} did not finish within {self.syscall_timeout:g} s (it goes on in the background)"
            )
        if "error" in box:
            raise box["error"]
        return box["value"]
