"""Blocking work off the event loop, with bounded concurrency and a deadline per syscall.

Uploads, downloads, hashing, fsync and every facade call that writes a MetadataCommand (an LMDB
write transaction that syncs) run in worker threads. Two limiters keep foreground requests from
queueing behind speculative work: `foreground` for what a syscall is waiting on, `background` for
prefetch. LMDB point reads and bounded scans stay inline: they cost microseconds.

A syscall never waits longer than the deadline (`--syscall-timeout`, default 30 s) for work that
makes no progress: `bounded` runs the work as a task of the daemon's own nursery and waits for it
that long, and once more each time the work's `progress` (a counter it advances, such as the blocks
a publication has stored) moved meanwhile: a large file stored at a healthy pace is not an error,
however long it takes, where a store that stops answering is. When the
deadline passes the syscall answers ETIMEDOUT-as-EIO (`SyscallTimeout`) while the work goes on and
finishes what it started (a publication still lands, or fails and keeps its spool); the work
itself updates the mount's state, so nothing depends on the waiter still being there, and work
that needs a lock holds it itself (`bounded_holding`): a waiter giving up never frees it early.
The daemon keeps serving other requests meanwhile. (pyfuse3 does not deliver FUSE interrupts, so a caller's
signal cannot shorten the wait; the deadline bounds it.)
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading

import outcome
import trio

from nokvfs.errors import SyscallTimeout

log = logging.getLogger(__name__)

DEFAULT_SYSCALL_TIMEOUT = 30.0


class _Threads:
    """The worker threads: a job queue, and threads that wait on it once idle. A thread is
    started only when none is idle, so there are never more than the most jobs that ever ran at
    once (the limiters bound that).

    `trio.to_thread.run_sync` costs about 120 us a round trip on this machine kind, 40 more than
    this: it supports calls back into trio from the thread (`trio.from_thread`), which nothing
    here makes, and every close, fsync and publication makes at least one round trip."""

    def __init__(self):
        self.forget()

    def forget(self) -> None:
        """No threads and no jobs (in a forked child: the parent's are not there)."""
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    async def run(self, fn, args, limiter: trio.CapacityLimiter):
        """fn(*args) in a worker thread. Like trio.to_thread.run_sync: a cancellation waits for
        the thread to finish (and is delivered at the next checkpoint)."""
        async with limiter:
            task = trio.lowlevel.current_task()
            token = trio.lowlevel.current_trio_token()

            def deliver(result) -> None:
                try:
                    token.run_sync_soon(trio.lowlevel.reschedule, task, result)
                except trio.RunFinishedError:  # the daemon's loop ended meanwhile: nobody waits
                    pass

            self._submit((fn, args, deliver))
            return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def _submit(self, job) -> None:
        with self._lock:
            start = not self._idle
            if not start:
                self._idle -= 1
        if start:
            threading.Thread(target=self._serve, name="nokvfs-worker", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            fn, args, deliver = self._jobs.get()
            result = outcome.capture(fn, *args)
            del fn, args  # nothing of the job outlives it here
            with self._lock:  # idle before the caller can submit again: no thread beyond need
                self._idle += 1
            deliver(result)
            del deliver, result


_THREADS = _Threads()
os.register_at_fork(after_in_child=_THREADS.forget)


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
        return await _THREADS.run(call, () if kwargs else args, self.foreground)

    async def speculate(self, fn, *args):
        """Run fn(*args) in a worker thread for work nobody waits on yet (prefetch)."""
        return await _THREADS.run(fn, args, self.background)

    async def bounded(self, what: str, async_fn, *args, timeout: float | None = None, progress=None):
        """await async_fn(*args), but give up waiting after the syscall deadline (or `timeout`)
        passed without `progress()` (a counter the work advances, if given) moving.

        Without a nursery (kernel-less tests before start) the work is simply awaited.
        """
        timeout = self.syscall_timeout if timeout is None else timeout
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
        await self._wait_while_progressing(done, timeout, progress)
        if not done.is_set():
            box["abandoned"] = True
            self.timeouts += 1
            raise SyscallTimeout(
                f"{what} did not finish within {self.syscall_timeout:g} s"
                f"{'' if progress is None else ' of no progress'} (it goes on in the background)"
            )
        if "error" in box:
            raise box["error"]
        return box["value"]

    async def _wait_while_progressing(self, done: trio.Event, timeout: float, progress) -> None:
        """Wait for `done` for `timeout`, then for a whole deadline more each time `progress()`
        moved meanwhile."""
        seen = None if progress is None else progress()
        while True:
            with trio.move_on_after(timeout):
                await done.wait()
                return
            if progress is None or progress() == seen:
                return
            seen, timeout = progress(), self.syscall_timeout

    async def bounded_holding(
        self, what: str, lock: trio.Semaphore, async_fn, *args, inline: bool = False, progress=None
    ):
        """bounded(), with `lock` taken by the syscall and released by the work when it ends.

        The syscall takes the lock in its turn (at once, without yielding, when it is free: calls
        on one file keep the order they arrived in), both waits within one deadline. The lock is a
        trio.Semaphore(1) because it has no owner: a syscall that gives up waiting leaves it held
        until the work ends, so nothing else runs on what it guards meanwhile (a second
        publication of the same spool, a write that the first one's end would mark published).
        `inline` runs the work in the syscall's own task (for work without I/O, or that bounds
        its own).
        """
        window = trio.current_time()  # when the current deadline started
        seen = None if progress is None else progress()
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            while True:
                with trio.move_on_after(self.syscall_timeout - (trio.current_time() - window)) as waiting:
                    await lock.acquire()
                if not waiting.cancelled_caught:
                    break
                if progress is None or progress() == seen:
                    self.timeouts += 1
                    raise SyscallTimeout(
                        f"{what} did not start within {self.syscall_timeout:g} s (the file is busy with a publication"
                        f"{'' if progress is None else ' that made no progress meanwhile'})"
                    ) from None
                seen, window = progress(), trio.current_time()

        async def holding():
            try:
                return await async_fn(*args)
            finally:
                lock.release()

        if inline:
            return await holding()
        return await self.bounded(
            what, holding, timeout=self.syscall_timeout - (trio.current_time() - window), progress=progress
        )
