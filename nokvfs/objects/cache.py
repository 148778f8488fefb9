"""The local block cache: verified block bytes on local disk, keyed by their durable digest.

Entries live at ``<dir>/<sha256 hex[:2]>/<sha256 hex>`` and are bounded in total bytes with
least-recently-used eviction. The key is the block's SHA-256 digest URI, so a cached block is
shared by every revision whose manifest names the same bytes (the object key stays the revision's
own; only the local copy is shared).

Verification chain. `put` accepts bytes only if their SHA-256 equals the key, then records the
BLAKE3 of those same bytes. Every hit re-hashes the file with BLAKE3 and compares: a mismatch (a
flipped bit, a truncated file, a file replaced behind our back) drops the entry and reports a
miss, so corrupt bytes are never returned. BLAKE3 is for local content only; durable integrity
stays SHA-256 (`nokvfs.objects.blocks` checks it on every read from the store).

Persistence. ``<dir>/index.json`` holds ``[sha256 hex, size, blake3 hex]`` in LRU order (oldest
first). It is rewritten every `index_every` changes and on `close`. On open, files the index
names with the right size keep their recorded BLAKE3 (checked on the next hit anyway); files it
does not name (a crash since the last index write) are re-hashed with SHA-256 against their name
and admitted with a fresh BLAKE3, or deleted. A missing or unreadable index just means every file
is re-hashed.

The cache is best-effort: an I/O error on a read is a miss and on a write leaves the block
uncached; neither fails the caller. One process owns a cache directory at a time (flock).

Filling in the background. Writing a block's local copy (a new 4 MiB file) costs a reader more
than fetching and verifying it from a local store, so a mount hands verified blocks to
`put_later`: one thread writes them, up to a bound of waiting bytes beyond which blocks are
simply not cached; `close` writes what waits first.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import threading

import blake3

from nokvfs import filemodes
from nokvfs.errors import IntegrityError, InvalidInput, StoreError
from nokvfs.objects import zeros
from nokvfs.objects.keys import parse_sha256_uri

log = logging.getLogger(__name__)

INDEX_NAME = "index.json"
DEFAULT_PENDING_BYTES = 64 * 1024 * 1024  # of blocks waiting for `put_later`'s thread
LOCK_NAME = ".lock"
_TMP_PREFIX = ".tmp-"
_INDEX_VERSION = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX2 = re.compile(r"[0-9a-f]{2}")


@dataclasses.dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    bytes: int
    entries: int
    evictions: int
    corrupt_drops: int
    max_bytes: int


@dataclasses.dataclass(frozen=True)
class _Entry:
    size: int
    blake3_hex: str


class BlockCache:
    """A byte-bounded LRU of verified blocks in `directory`. Thread-safe."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int, *, index_every: int = 256):
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidInput(f"cache max_bytes must be a non-negative integer, got {max_bytes!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_bytes = max_bytes
        self._index_every = max(1, index_every)
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = self._corrupt = 0
        self._dirty = 0
        self._closed = False
        self.pending_bytes_max = DEFAULT_PENDING_BYTES
        self._pending: dict[str, int] = {}  # hex digest -> size, queued for the filler thread
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._filler: threading.Thread | None = None
        try:
            filemodes.makedirs(self.directory)
            self._lock_fd = os.open(
                os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, filemodes.FILE_MODE
            )
        except OSError as exc:
            raise StoreError(f"cannot open block cache {self.directory}: {exc.strerror}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(f"block cache {self.directory} is in use by another cache instance") from None
            raise StoreError(f"cannot lock block cache {self.directory}: {exc.strerror}") from exc
        self._load()

    # --- paths --------------------------------------------------------------------------------

    def _path(self, hex_digest: str) -> str:
        return os.path.join(self.directory, hex_digest[:2], hex_digest)

    # --- the interface ------------------------------------------------------------------------

    def get(self, digest_uri: str) -> bytes | None:
        """The cached bytes of `digest_uri` if present and intact, else None."""
        hex_digest = parse_sha256_uri(digest_uri).hex()
        with self._lock:
            entry = self._entries.get(hex_digest)
            if entry is None:
                self._misses += 1
                return None
        try:
            with open(self._path(hex_digest), "rb") as f:
                data = f.read(entry.size + 1)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("block cache read of %s failed: %s", hex_digest, exc)
            self._drop(hex_digest, entry, corrupt=False)
            return None
        if len(data) != entry.size or blake3.blake3(data).hexdigest() != entry.blake3_hex:
            log.warning("block cache entry %s failed BLAKE3 verification; dropped", hex_digest)
            self._drop(hex_digest, entry, corrupt=True)
            return None
        with self._lock:
            if self._entries.get(hex_digest) is entry:
                self._entries.move_to_end(hex_digest)
            self._hits += 1
        return data

    def put(self, digest_uri: str, data: bytes) -> bool:
        """Cache `data` under `digest_uri`; True if it is cached afterwards.

        Bytes whose SHA-256 is not the digest are IntegrityError and are never cached. A block
        larger than the whole cache, or a local write failure, leaves it uncached (False).
        """
        digest = parse_sha256_uri(digest_uri)
        data = bytes(data)
        if zeros.sha256_of(data) != digest:
            raise IntegrityError(f"refusing to cache bytes whose SHA-256 is not {digest_uri}")
        return self.put_checked(digest, data)

    def put_later(self, digest: bytes, data: bytes) -> None:
        """`put_checked` in the cache's own thread (module docstring): returns at once. Nothing
        happens when the block is cached or queued already, or when the waiting bytes would
        exceed `pending_bytes_max`."""
        hex_digest = digest.hex()
        with self._lock:
            if (
                self._closed
                or hex_digest in self._entries
                or hex_digest in self._pending
                or sum(self._pending.values()) + len(data) > self.pending_bytes_max
            ):
                return
            self._pending[hex_digest] = len(data)
            if self._filler is None:
                self._filler = threading.Thread(target=self._fill, name="block-cache-fill", daemon=True)
                self._filler.start()
        self._queue.put((digest, data))

    def _fill(self) -> None:
        while (item := self._queue.get()) is not None:
            digest, data = item
            try:
                self.put_checked(digest, data)
            except Exception as exc:  # noqa: BLE001 - best-effort: the block is just not cached
                log.warning("block cache fill of %s failed: %s", digest.hex(), exc)
            finally:
                with self._lock:
                    self._pending.pop(digest.hex(), None)

    def put_checked(self, digest: bytes, data: bytes) -> bool:
        """`put` of bytes whose SHA-256 the caller has just computed and found equal to `digest`
        (nokvfs.objects.blocks verifies every block it reads): the same, without hashing twice."""
        hex_digest = digest.hex()
        size = len(data)
        if size > self.max_bytes:
            return False
        with self._lock:
            if hex_digest in self._entries:
                self._entries.move_to_end(hex_digest)
                return True
        entry = _Entry(size, blake3.blake3(data).hexdigest())
        path = self._path(hex_digest)
        tmp = os.path.join(os.path.dirname(path), _TMP_PREFIX + os.urandom(8).hex())
        try:
            filemodes.makedirs(os.path.dirname(path))
            with open(tmp, "xb", opener=filemodes.opener) as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("block cache write of %s failed: %s", hex_digest, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        with self._lock:
            if hex_digest in self._entries:  # a concurrent put of the same bytes won
                self._entries.move_to_end(hex_digest)
                return True
            self._entries[hex_digest] = entry
            self._bytes += size
            self._evict_locked()
            self._changed_locked()
        return True

    def discard(self, digest_uri: str) -> None:
        """Forget one entry (if present)."""
        hex_digest = parse_sha256_uri(digest_uri).hex()
        with self._lock:
            entry = self._entries.get(hex_digest)
        if entry is not None:
            self._drop(hex_digest, entry, corrupt=False, count_miss=False)

    def __contains__(self, digest_uri: str) -> bool:
        with self._lock:
            return parse_sha256_uri(digest_uri).hex() in self._entries

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                bytes=self._bytes,
                entries=len(self._entries),
                evictions=self._evictions,
                corrupt_drops=self._corrupt,
                max_bytes=self.max_bytes,
            )

    def flush(self) -> None:
        """Write the index now."""
        with self._lock:
            self._write_index_locked()

    def close(self) -> None:
        """Write what waits for `put_later`, then the index, and release the directory. Idempotent."""
        filler, self._filler = self._filler, None
        if filler is not None:
            self._queue.put(None)
            filler.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._write_index_locked()
        os.close(self._lock_fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # --- internals ----------------------------------------------------------------------------

    def _drop(self, hex_digest: str, entry: _Entry, *, corrupt: bool, count_miss: bool = True) -> None:
        with self._lock:
            if count_miss:
                self._misses += 1
            if corrupt:
                self._corrupt += 1
            if self._entries.get(hex_digest) is not entry:
                return  # replaced meanwhile by a fresh, verified put
            del self._entries[hex_digest]
            self._bytes -= entry.size
            with contextlib.suppress(OSError):
                os.unlink(self._path(hex_digest))
            self._changed_locked()

    def _evict_locked(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            hex_digest, entry = self._entries.popitem(last=False)
            self._bytes -= entry.size
            self._evictions += 1
            with contextlib.suppress(OSError):
                os.unlink(self._path(hex_digest))

    def _changed_locked(self) -> None:
        self._dirty += 1
        if self._dirty >= self._index_every:
            self._write_index_locked()

    def _write_index_locked(self) -> None:
        if not self._dirty:
            return
        payload = json.dumps(
            {"v": _INDEX_VERSION, "entries": [[h, e.size, e.blake3_hex] for h, e in self._entries.items()]},
            separators=(",", ":"),
        ).encode()
        path = os.path.join(self.directory, INDEX_NAME)
        tmp = path + _TMP_PREFIX + os.urandom(4).hex()
        try:
            with open(tmp, "xb", opener=filemodes.opener) as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._dirty = 0
        except OSError as exc:
            log.warning("block cache index write failed: %s", exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _read_index(self) -> dict[str, _Entry]:
        try:
            with open(os.path.join(self.directory, INDEX_NAME), "rb") as f:
                parsed = json.loads(f.read())
            if parsed.get("v") != _INDEX_VERSION:
                return {}
            indexed = {}
            for hex_digest, size, blake3_hex in parsed["entries"]:
                if _HEX64.fullmatch(hex_digest) and isinstance(size, int) and isinstance(blake3_hex, str):
                    indexed[hex_digest] = _Entry(size, blake3_hex)
            return indexed
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _load(self) -> None:
        indexed = self._read_index()
        on_disk: dict[str, tuple[int, float]] = {}
        with contextlib.suppress(FileNotFoundError):
            for bucket in os.scandir(self.directory):
                if not (_HEX2.fullmatch(bucket.name) and bucket.is_dir(follow_symlinks=False)):
                    if bucket.name.startswith(INDEX_NAME + _TMP_PREFIX):
                        with contextlib.suppress(OSError):
                            os.unlink(bucket.path)
                    continue
                for item in os.scandir(bucket.path):
                    if (
                        _HEX64.fullmatch(item.name)
                        and item.name[:2] == bucket.name
                        and item.is_file(follow_symlinks=False)
                    ):
                        st = item.stat(follow_symlinks=False)
                        on_disk[item.name] = (st.st_size, st.st_mtime)
                    else:  # a temp file from a crashed put, or something that is not ours
                        with contextlib.suppress(OSError):
                            os.unlink(item.path)
        # Unindexed files first (oldest by mtime), then the index's LRU order.
        unindexed = sorted(
            (h for h, (size, _) in on_disk.items() if h not in indexed or indexed[h].size != size),
            key=lambda h: on_disk[h][1],
        )
        for hex_digest in unindexed:
            entry = self._rehash(hex_digest)
            if entry is not None:
                self._entries[hex_digest] = entry
                self._bytes += entry.size
        for hex_digest, entry in indexed.items():
            if hex_digest in on_disk and on_disk[hex_digest][0] == entry.size:
                self._entries[hex_digest] = entry
                self._bytes += entry.size
        self._evict_locked()
        self._dirty = 1
        self._write_index_locked()

    def _rehash(self, hex_digest: str) -> _Entry | None:
        path = self._path(hex_digest)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != hex_digest:
            log.warning("block cache file %s does not match its SHA-256 name; deleted", path)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        return _Entry(len(data), blake3.blake3(data).hexdigest())
