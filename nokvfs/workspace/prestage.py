"""Blocks of a file being written, stored ahead of its publication where the store can stage.

A file written in order completes its blocks one after the other, long before close(2). Once the
spool's running hash (nokvfs.workspace.body.WrittenBody) has taken a completed block's digest, the
block's own bytes -- the immutable buffers the writes passed, the very bytes that digest is of --
are written to the store by a background thread as a staged put (`nokvfs.objects.store.stage_put`:
the bytes durable under no key). Nothing is read back from the spool and nothing is hashed again.
The publication then only links the staged bytes at their keys, after its begin command made the
ledger own those keys (seed 000, "Upload And Append": the ledger owns every key before any
upload). A staged put is not an upload: nothing can name its bytes, and a crash leaves nothing
behind (an unnamed temp vanishes, a named one is swept as stale). So the store's writes and
flushes overlap the writes into the spool instead of following close(2).

Correctness never rests on the staged bytes being the file's. A staged block is linked only when
its digest (of exactly the bytes staged) and length equal the publication's plan for that block.
A block rewritten after it was staged, or a truncate, makes the digests differ, and the block is
then uploaded from the spool, as it would be without staging.

Bounded: at most MAX_STAGED blocks in the whole process are staged or being staged (each holds a
temp file and its descriptor), and at most MAX_QUEUED_BYTES of written bytes wait in memory for
a thread to stage them; further blocks are uploaded at publication as before.
`NOKVFS_PRESTAGE_BLOCKS` overrides the first bound (0 turns staging ahead off).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from dataclasses import dataclass

from nokvfs.errors import NokvError
from nokvfs.objects.store import stage_put

log = logging.getLogger(__name__)

MAX_STAGED = int(os.environ.get("NOKVFS_PRESTAGE_BLOCKS", "64"))
MAX_QUEUED_BYTES = 64 * 1024 * 1024

_lock = threading.Lock()
_held = 0  # blocks staged or being staged, process-wide (under _lock)
_queued = 0  # bytes of blocks waiting for a thread to stage them, process-wide (under _lock)
# Process-wide, for the daemon's log: blocks staged ahead, and of those the publications linked.
COUNTS = {"staged": 0, "linked": 0}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="nokvfs-prestage")
        return _pool


def _reserve(size: int) -> bool:
    """Room for one more block of `size` bytes waiting to be staged."""
    global _held, _queued
    with _lock:
        if _held >= MAX_STAGED or _queued + size > MAX_QUEUED_BYTES:
            return False
        _held += 1
        _queued += size
        return True


def _dequeued(size: int) -> None:
    global _queued
    with _lock:
        _queued -= size


def _release() -> None:
    global _held
    with _lock:
        _held -= 1


@dataclass
class StagedBlock:
    """One block's bytes staged in the store under no key, with what they are."""

    index: int
    length: int
    sha256: bytes
    staged: object  # the store's StagedPut: commit(key, wait=) / wait() / discard()
    linked: bool = False  # set by the publication that linked it at its key

    def matches(self, block) -> bool:
        """Whether these bytes are exactly the planned block (a BlockPlan)."""
        return block.index == self.index and block.length == self.length and block.sha256 == self.sha256


class Prestager:
    """The blocks staged ahead for one file. `block_hashed` is cheap (it only queues the work);
    `take` and `forget` are for the spool's owner, which serializes them with its writes (and
    `take` follows the settling of the file's hashes, so every block_hashed call is in)."""

    def __init__(self, store, block_size: int):
        self.store = store
        self.block_size = block_size
        self._mutex = threading.Lock()
        self._generation = 0  # bumped by forget: work started before it is dropped when done
        self._ready: dict[int, StagedBlock] = {}
        self._jobs: list[concurrent.futures.Future] = []  # staging work queued or running

    @classmethod
    def for_store(cls, store, block_size: int) -> Prestager | None:
        """A Prestager when the store can stage puts and staging ahead is on, else None."""
        inner = store
        while getattr(inner, "inner", None) is not None:  # a wrapper (MeteredStore) stages through
            inner = inner.inner
        if MAX_STAGED <= 0 or getattr(type(inner), "stage_put", None) is None:
            return None
        return cls(store, block_size)

    def block_hashed(self, index: int, digest: bytes, pieces: list | None) -> None:
        """Block `index` of the file is complete, `pieces` its bytes in order (immutable) and
        `digest` their SHA-256: stage them in the background if there is room (else the block is
        uploaded at publication). Cheap (it only queues the work): the thread that hashed the
        block calls it (WrittenBody's on_block)."""
        if pieces is None or sum(len(piece) for piece in pieces) != self.block_size:
            return
        if not _reserve(self.block_size):
            return
        with self._mutex:
            generation = self._generation
            self._jobs = [job for job in self._jobs if not job.done()]
            try:
                job = _executor().submit(self._stage, index, digest, pieces, generation)
            except RuntimeError:  # the interpreter is shutting down
                _dequeued(self.block_size)
                _release()
                return
            self._jobs.append(job)

    def _stage(self, index: int, digest: bytes, pieces: list, generation: int) -> None:
        staged = None
        try:
            # Many small writes: one buffer (one write) rather than a system call per piece.
            # `digest` was taken of exactly these pieces: the store may keep it (content_sha256).
            staged = stage_put(self.store, b"".join(pieces) if len(pieces) > 16 else pieces, content_sha256=digest)
        except (OSError, NokvError) as exc:
            log.debug("staging block %d ahead failed (it is uploaded at publication): %s", index, exc)
        finally:
            _dequeued(self.block_size)
        if staged is None:
            _release()
            return
        with self._mutex:
            if generation == self._generation and index not in self._ready:
                self._ready[index] = StagedBlock(index, self.block_size, digest, staged)
                with _lock:
                    COUNTS["staged"] += 1
                return
        staged.discard()
        _release()

    def _settle_jobs(self) -> None:
        """Cancel the work not started yet; wait for the rest."""
        with self._mutex:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            if job.cancel():
                _dequeued(self.block_size)
                _release()
        concurrent.futures.wait(jobs)

    def take(self) -> dict[int, StagedBlock]:
        """The blocks staged so far, for one publication (`release` them after it)."""
        self._settle_jobs()
        with self._mutex:
            ready, self._ready = self._ready, {}
        return ready

    def forget(self) -> None:
        """The file changed other than by appending in order: drop every staged block (the
        digest check would refuse them anyway; this frees their temps now). Cheap: the event
        loop calls it, so the discards (each waits for its temp's fsync) run in the background."""
        with self._mutex:
            self._generation += 1
            ready, self._ready = self._ready, {}
        if ready:
            try:
                future = _executor().submit(_give_back, ready)
            except RuntimeError:  # the interpreter is shutting down
                _give_back(ready)
                return
            with _lock:
                _giving_back.add(future)
            future.add_done_callback(_gave_back)


def release(blocks: dict[int, StagedBlock]) -> None:
    """After a publication: discard the staged blocks it did not link (a linked one's discard
    does nothing) and give back their room."""
    linked = sum(1 for block in blocks.values() if block.linked)
    with _lock:
        COUNTS["linked"] += linked
    _give_back(blocks)


_giving_back: set = set()  # give-backs running in the background (under _lock)


def _gave_back(future) -> None:
    with _lock:
        _giving_back.discard(future)


def wait_idle() -> None:
    """Wait for the give-backs started so far (tests: the room is then exactly what is held)."""
    with _lock:
        running = list(_giving_back)
    concurrent.futures.wait(running)


def _give_back(blocks: dict[int, StagedBlock]) -> None:
    for block in blocks.values():
        try:
            block.staged.discard()
        except OSError as exc:
            log.debug("discarding staged block %d: %s", block.index, exc)
        _release()
