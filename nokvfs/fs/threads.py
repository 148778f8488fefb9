"""Blocking work off the event loop, with bounded concurrency.

Uploads, downloads, hashing, fsync and every facade call that writes a MetadataCommand (an LMDB
write transaction that syncs) run in worker threads. Two limiters keep foreground requests from
queueing behind speculative work: `foreground` for what a syscall is waiting on, `background` for
prefetch. LMDB point reads and bounded scans stay inline: they cost microseconds.
"""

from __future__ import annotations

import functools

import trio


class Workers:
    def __init__(self, foreground: int = 8, background: int = 2):
        self.foreground = trio.CapacityLimiter(foreground)
        self.background = trio.CapacityLimiter(background)

    async def run(self, fn, *args, **kwargs):
        """Run fn(*args, **kwargs) in a worker thread for a waiting syscall."""
        call = functools.partial(fn, *args, **kwargs) if kwargs else fn
        return await trio.to_thread.run_sync(call, *(() if kwargs else args), limiter=self.foreground)

    async def speculate(self, fn, *args):
        """Run fn(*args) in a worker thread for work nobody waits on yet (prefetch)."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.background)
