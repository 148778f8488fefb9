"""Blocks of a file being written, stored ahead of its publication where the store can stage.

A file written in order completes its blocks one after the other, long before close(2). Each
completed block is read back from the spool (still in the page cache) by a background thread,
hashed, and written to the store as a staged put (`nokvfs.objects.store.stage_put`: the bytes
durable under no key). The publication then only links the staged bytes at their keys, after its
begin command made the ledger own those keys (seed 000, "Upload And Append": the ledger owns
every key before any upload). A staged put is not an upload: nothing can name its bytes, and a
crash leaves nothing behind (an unnamed temp vanishes, a named one is swept as stale). So the
store's writes and flushes overlap the writes into the spool instead of following close(2).

Correctness never rests on the staged bytes being the file's. A staged block is linked only when
its own SHA-256 (of exactly the bytes staged) and length equal the publication's plan for that
block. A block rewritten after it was staged, a truncate, or a read racing a rewrite makes the
digests differ, and the block is then uploaded from the spool, as it would be without staging.

Bounded: at most MAX_STAGED blocks in the whole process are staged or being staged (each holds a
temp file and its descriptor); further blocks are uploaded at publication as before.
`NOKVFS_PRESTAGE_BLOCKS` overrides the bound (0 turns staging ahead off).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import threading
from dataclasses import dataclass

from nokvfs.errors import NokvError
from nokvfs.objects.store import stage_put

log = logging.getLogger(__name__)

MAX_STAGED = int(os.environ.get("NOKVFS_PRESTAGE_BLOCKS", "64"))

_lock = threading.Lock()
_held = 0  # blocks staged or being staged, process-wide (under _lock)
# Process-wide, for the daemon's log: blocks staged ahead, and of those the publications linked.
COUNTS = {"staged": 0, "linked": 0}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="nokvfs-prestage")
        return _pool


def _reserve() -> bool:
    global _held
    with _lock:
        if _held >= MAX_STAGED:
            return False
        _held += 1
        return True


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
    """The blocks staged ahead for one file. `block_done` is cheap (it only queues the work), so
    the event loop may call it after each write; `take` and `forget` are for the spool's owner,
    which serializes them with its writes."""

    def __init__(self, store, block_size: int):
        self.store = store
        self.block_size = block_size
        self._mutex = threading.Lock()
        self._generation = 0  # bumped by forget: work started before it is dropped when done
        self._ready: dict[int, StagedBlock] = {}
        self._jobs: list[tuple[concurrent.futures.Future, int]] = []  # (work, its descriptor)

    @classmethod
    def for_store(cls, store, block_size: int) -> Prestager | None:
        """A Prestager when the store can stage puts and staging ahead is on, else None."""
        inner = store
        while getattr(inner, "inner", None) is not None:  # a wrapper (MeteredStore) stages through
            inner = inner.inner
        if MAX_STAGED <= 0 or getattr(type(inner), "stage_put", None) is None:
            return None
        return cls(store, block_size)

    def block_done(self, index: int, fd: int) -> None:
        """Block `index` of the file whose spool descriptor is `fd` is complete: stage it in the
        background if there is room (else it is uploaded at publication)."""
        if not _reserve():
            return
        try:
            own = os.dup(fd)  # the spool may close or replace its descriptor meanwhile
        except OSError:
            _release()
            return
        with self._mutex:
            generation = self._generation
            self._jobs = [(f, d) for f, d in self._jobs if not f.done()]
            try:
                future = _executor().submit(self._stage, index, own, generation)
            except RuntimeError:  # the interpreter is shutting down
                os.close(own)
                _release()
                return
            self._jobs.append((future, own))

    def _stage(self, index: int, fd: int, generation: int) -> None:
        staged = None
        try:
            data = os.pread(fd, self.block_size, index * self.block_size)
            if len(data) == self.block_size:
                digest = hashlib.sha256(data).digest()
                staged = stage_put(self.store, data)
        except (OSError, NokvError) as exc:
            log.debug("staging block %d ahead failed (it is uploaded at publication): %s", index, exc)
        finally:
            os.close(fd)
        if staged is None:
            _release()
            return
        with self._mutex:
            if generation == self._generation and index not in self._ready:
                self._ready[index] = StagedBlock(index, len(data), digest, staged)
                with _lock:
                    COUNTS["staged"] += 1
                return
        staged.discard()
        _release()

    def _settle_jobs(self) -> None:
        """Cancel the work not started yet; wait for the rest."""
        with self._mutex:
            jobs, self._jobs = self._jobs, []
        for future, fd in jobs:
            if future.cancel():
                os.close(fd)
                _release()
        concurrent.futures.wait([future for future, _ in jobs])

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
