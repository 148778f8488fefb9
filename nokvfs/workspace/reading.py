"""Reading artifact bodies by range through their manifests.

Manifest rows name the physical owner and key of every block, so a read follows them directly
(never the dependency graph). Manifests are immutable, so they are cached per revision.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict

from nokvfs.errors import IntegrityError, InvalidInput
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import publish


class ManifestCache:
    """Revision id -> (row start offsets, rows); bounded by revision count, LRU."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._rows: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, root, revision_id: bytes, view=None):
        with self._lock:
            hit = self._rows.get(revision_id)
            if hit is not None:
                self._rows.move_to_end(revision_id)
                return hit
        if view is None:
            with root.read() as fresh:
                rows = publish.read_manifest(fresh, root, revision_id)
        else:
            rows = publish.read_manifest(view, root, revision_id)
        starts = [r.logical_offset for r in rows]
        value = (starts, rows)
        with self._lock:
            self._rows[revision_id] = value
            while len(self._rows) > self.capacity:
                self._rows.popitem(last=False)
        return value

    def forget(self, revision_id: bytes) -> None:
        with self._lock:
            self._rows.pop(revision_id, None)


def blocks_for_range(starts, rows, offset: int, size: int):
    """The manifest rows overlapping [offset, offset + size)."""
    first = max(0, bisect.bisect_right(starts, offset) - 1)
    for row in rows[first:]:
        if row.logical_offset >= offset + size:
            break
        if row.logical_offset + row.length > offset:
            yield row


def read(root, entry: PathEntry, offset: int = 0, size: int | None = None, *, view=None) -> bytes:
    """Bytes [offset, offset+size) of the entry's revision, each block verified by SHA-256."""
    if offset < 0 or (size is not None and size < 0):
        raise InvalidInput("offset and size must not be negative")
    if size is None:
        size = entry.logical_size - offset
    size = max(0, min(size, entry.logical_size - offset))
    if size == 0:
        return b""
    starts, rows = root.manifests.get(root, entry.artifact_revision_id, view)
    parts = []
    for row in blocks_for_range(starts, rows, offset, size):
        data = root.blocks.read_block(row.object_key, row.digest_uri, row.length)
        lo = max(offset, row.logical_offset) - row.logical_offset
        hi = min(offset + size, row.logical_offset + row.length) - row.logical_offset
        parts.append(data[row.object_offset + lo : row.object_offset + hi])
    out = b"".join(parts)
    if len(out) != size:
        raise IntegrityError(
            f"manifest of revision {entry.artifact_revision_id.hex()} does not cover bytes {offset}..{offset + size}"
        )
    return out


def iter_body(root, entry: PathEntry, chunk: int | None = None):
    """The whole body in order, a block at a time (for get and append's rehash)."""
    chunk = chunk or root.block_size
    offset = 0
    while offset < entry.logical_size:
        data = read(root, entry, offset, chunk)
        yield data
        offset += len(data)
