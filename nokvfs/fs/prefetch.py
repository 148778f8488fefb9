"""Where a mount's reads get their bytes: whole blocks, kept in memory, fetched ahead of readers.

A kernel read asks for at most 1 MiB; a block is up to the root's block size (4 MiB by default)
and can only be verified whole. So each manifest row is fetched once through the facade
(`reading.read` over exactly that row: the block cache, else the store, SHA-256-verified either
way), kept in a small byte-bounded LRU in memory, and kernel reads are sliced out of it.

Per open handle, a read that starts where the previous one ended extends a sequential streak;
while the streak lasts, the next `window` blocks are fetched in the background (bounded by the
background limiter) so the reader finds them in memory. A random read fetches only the blocks it
touches and prefetches nothing. Concurrent requests for one block share one fetch.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict

import trio

from nokvfs.errors import IntegrityError, NokvError
from nokvfs.objects import zeros
from nokvfs.workspace import reading

log = logging.getLogger(__name__)

DEFAULT_MEMORY_BYTES = 96 * 1024 * 1024
DEFAULT_WINDOW = 8


class Stream:
    """The read pattern of one open handle."""

    __slots__ = ("next_offset", "streak")

    def __init__(self):
        self.next_offset = 0
        self.streak = 0


class BlockFetcher:
    def __init__(self, root, workers, *, memory_bytes: int = DEFAULT_MEMORY_BYTES, window: int = DEFAULT_WINDOW):
        self.root = root
        self.workers = workers
        self.memory_bytes = memory_bytes
        self.window = window
        self._memory: OrderedDict = OrderedDict()
        self._held = 0
        self._inflight: dict[tuple, trio.Event] = {}
        self._nursery = None
        self.fetched = 0
        self.prefetched = 0
        self.hits = 0

    def start(self, nursery) -> None:
        self._nursery = nursery

    @property
    def held_bytes(self) -> int:
        """Bytes of blocks kept in memory now."""
        return self._held

    def rows(self, entry):
        """(row start offsets, manifest rows) of the entry's revision (cached; inline LMDB scan)."""
        return self.root.manifests.get(self.root, entry.artifact_revision_id)

    async def read(self, entry, offset: int, size: int, stream: Stream | None = None) -> bytes | memoryview:
        """Bytes [offset, offset + size) of the entry's revision (clipped at its end): bytes, or a
        read-only view into a block kept in memory."""
        size = max(0, min(size, entry.logical_size - offset))
        if size == 0 or offset < 0:
            return b""
        starts, rows = self.rows(entry)
        first = max(0, bisect.bisect_right(starts, offset) - 1)
        parts = []
        last = first
        for index in range(first, len(rows)):
            row = rows[index]
            if row.logical_offset >= offset + size:
                break
            if row.logical_offset + row.length <= offset:
                continue
            data = await self._block(entry, row)
            lo = max(offset, row.logical_offset) - row.logical_offset
            hi = min(offset + size, row.logical_offset + row.length) - row.logical_offset
            # A view, not a copy: the kernel's reply is copied out of the block once, by libfuse.
            parts.append(data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi])
            last = index
        if stream is not None:
            self._follow(stream, entry, rows, offset, size, last)
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(out) != size:
            raise IntegrityError(
                f"manifest of revision {entry.artifact_revision_id.hex()} does not cover bytes "
                f"{offset}..{offset + size}"
            )
        return out

    def _follow(self, stream: Stream, entry, rows, offset: int, size: int, last: int) -> None:
        if offset == stream.next_offset:
            stream.streak += 1
        else:
            stream.streak = 0
        stream.next_offset = offset + size
        if stream.streak == 0 or self._nursery is None:
            return
        for index in range(last + 1, min(len(rows), last + 1 + self.window)):
            key = _key(rows[index])
            if key not in self._memory and key not in self._inflight:
                self._inflight[key] = trio.Event()
                self._nursery.start_soon(self._prefetch, entry, rows[index], key)

    async def _block(self, entry, row) -> bytes:
        key = _key(row)
        data = self._memory.get(key)
        if data is not None:
            self._memory.move_to_end(key)
            self.hits += 1
            return data
        pending = self._inflight.get(key)
        if pending is not None:
            await pending.wait()
            data = self._memory.get(key)
            if data is not None:
                self.hits += 1
                return data
        event = self._inflight.setdefault(key, trio.Event())
        try:
            data = await self.workers.run(reading.read, self.root, entry, row.logical_offset, row.length)
            self.fetched += 1
            self._keep(key, data)
        finally:
            if self._inflight.get(key) is event:
                del self._inflight[key]
            event.set()
        return data

    async def _prefetch(self, entry, row, key) -> None:
        event = self._inflight[key]
        try:
            data = await self.workers.speculate(reading.read, self.root, entry, row.logical_offset, row.length)
            self.prefetched += 1
            self._keep(key, data)
        except NokvError as exc:
            log.debug("prefetch of %s failed: %s", row.object_key, exc)
        finally:
            if self._inflight.get(key) is event:
                del self._inflight[key]
            event.set()

    def keep_published(self, entry, data: bytes) -> None:
        """Keep the bytes this mount has just published as `entry`'s revision when they are its
        one block (checked against the manifest's digest): the first read of a file the mount
        wrote is then served from memory."""
        _, rows = self.rows(entry)
        if len(rows) != 1 or rows[0].object_offset != 0 or rows[0].length != len(data):
            return
        if rows[0].digest_uri != "sha256:" + zeros.sha256_of(data).hex():
            log.warning("the bytes published as %s are not its block's digest", entry.artifact_revision_id.hex())
            return
        self._keep(_key(rows[0]), data)

    def _keep(self, key, data: bytes) -> None:
        if len(data) > self.memory_bytes or key in self._memory:
            return
        self._memory[key] = data
        self._held += len(data)
        while self._held > self.memory_bytes and self._memory:
            _, dropped = self._memory.popitem(last=False)
            self._held -= len(dropped)


def _key(row) -> tuple:
    # Object keys are owned by one never-reused revision and never rewritten, so the row's key and
    # range name its bytes exactly; append revisions share their base's rows and so its entries.
    return (row.object_key, row.object_offset, row.length)
