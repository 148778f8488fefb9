"""Artifact bodies before publication: split into blocks and hashed before any upload.

The StagedObject ledger must own every key, length and digest before the first byte is sent, so a
body is hashed in one pass first: bytes in memory as they are, a file where it lies, a stream
spooled to a local file. Upload re-reads each block and re-checks its SHA-256, so a source that
changes under the upload aborts instead of publishing bytes its digests do not describe.

A file written in place (a mount's spool) can be hashed while it is written instead
(`WrittenBody`): publication then reads nothing twice when the writes came in order, and only
re-hashes the blocks a write went back over otherwise.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.errors import IntegrityError, StoreError, StoreFull
from nokvfs.objects import zeros

DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
_READ_CHUNK = 1024 * 1024
# WrittenBody: writes of at least this many bytes are hashed in the background, with at most
# HASH_BACKLOG_MAX bytes waiting per running hash (beyond it the writer hashes them itself).
HASH_IN_BACKGROUND_MIN = 64 * 1024
HASH_BACKLOG_MAX = 64 * 1024 * 1024


@dataclass(frozen=True)
class _BlockEnd:
    """The last piece of a block: update its hash, then record the block's digest (and hand it,
    with the block's pieces when they are immutable, to `on_block`)."""

    hash: object
    digests: dict
    index: int
    pieces: list | None = None
    on_block: object = None

    def __call__(self, piece) -> None:
        self.hash.update(piece)
        digest = self.digests[self.index] = self.hash.digest()
        if self.on_block is not None:
            self.on_block(self.index, digest, self.pieces)


@dataclass(frozen=True)
class BlockPlan:
    index: int
    offset: int
    length: int
    sha256: bytes


class Body:
    """A hashed, block-planned body read from memory or a local file."""

    def __init__(
        self,
        size: int,
        sha256: bytes,
        blocks: list[BlockPlan],
        *,
        data: bytes | None = None,
        path: str | None = None,
        owned_spool: bool = False,
        hasher=None,
    ):
        self.size = size
        self.sha256 = sha256
        # The whole-body SHA-256 object that gave `sha256` (nokvfs.workspace.hashstates), if kept.
        self.hasher = hasher
        self.blocks = blocks
        self._data = data
        self.path = path
        self.owned_spool = owned_spool
        # Blocks already staged in the store (nokvfs.workspace.prestage): index -> StagedBlock.
        self.prestaged: dict = {}

    @property
    def digest_uri(self) -> str:
        return "sha256:" + self.sha256.hex()

    def read_block(self, block: BlockPlan) -> bytes:
        if self._data is not None:
            data = self._data[block.offset : block.offset + block.length]
        else:
            with open(self.path, "rb") as f:
                f.seek(block.offset)
                data = f.read(block.length)
        if len(data) != block.length or zeros.sha256_of(data) != block.sha256:
            raise IntegrityError(f"block {block.index} of the source changed while it was being published")
        return data

    def discard(self) -> None:
        if self.owned_spool and self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def from_bytes(data: bytes, block_size: int = DEFAULT_BLOCK_SIZE) -> Body:
    data = bytes(data)
    blocks = [
        BlockPlan(i, off, len(data[off : off + block_size]), hashlib.sha256(data[off : off + block_size]).digest())
        for i, off in enumerate(range(0, len(data), block_size))
    ]
    whole = hashlib.sha256(data)
    return Body(len(data), whole.digest(), blocks, data=data, hasher=whole)


def from_file(path: str, block_size: int = DEFAULT_BLOCK_SIZE, *, owned_spool: bool = False) -> Body:
    whole = hashlib.sha256()
    blocks = []
    offset = 0
    try:
        with open(path, "rb") as f:
            while True:
                block = hashlib.sha256()
                length = 0
                while length < block_size:
                    chunk = f.read(min(_READ_CHUNK, block_size - length))
                    if not chunk:
                        break
                    block.update(chunk)
                    whole.update(chunk)
                    length += len(chunk)
                if length == 0:
                    break
                blocks.append(BlockPlan(len(blocks), offset, length, block.digest()))
                offset += length
                if length < block_size:
                    break
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    return Body(offset, whole.digest(), blocks, path=path, owned_spool=owned_spool, hasher=whole)


class _HashChain:
    """Updates of running hashes applied in submission order, in a shared pool's thread when a
    piece is large (a big write then returns before its bytes are hashed: the spool's next write
    and the hashing proceed side by side) and in the caller's thread otherwise. `settle` waits
    until everything submitted is applied."""

    _pool: concurrent.futures.ThreadPoolExecutor | None = None
    _pool_lock = threading.Lock()

    def __init__(self):
        self._lock = threading.Lock()  # held while items are applied, so they apply in order
        self._items: collections.deque = collections.deque()
        self._queued = 0  # bytes of the pieces waiting (under _count_lock: two threads change it)
        self._count_lock = threading.Lock()

    def submit(self, apply, piece, *, background: bool) -> None:
        with self._count_lock:
            self._queued += len(piece)
            queued = self._queued
        self._items.append((apply, piece))
        if not background or len(piece) < HASH_IN_BACKGROUND_MIN or queued > HASH_BACKLOG_MAX:
            self.settle()  # small (a pool round trip would cost more), or too much waiting
        else:
            self.pool().submit(self.settle)

    def settle(self) -> None:
        with self._lock:
            while self._items:
                apply, piece = self._items.popleft()
                apply(piece)
                with self._count_lock:
                    self._queued -= len(piece)

    @classmethod
    def pool(cls) -> concurrent.futures.ThreadPoolExecutor:
        with cls._pool_lock:
            if cls._pool is None:
                # Two threads: the whole-body and the block hash of one file run side by side.
                cls._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="nokvfs-hash")
            return cls._pool


class WrittenBody:
    """The block plan of a local file being written, hashed as its bytes arrive.

    In-order writes (each starting where the hashed bytes end) feed the whole-body SHA-256 and the
    SHA-256 of the block in progress, so `body` needs no read of what was hashed. Any other change
    (a write elsewhere, a shrinking truncate) stops the in-order hashing and forgets the digests of
    the blocks it touched: `body` then reads the file once, hashing the whole body and only the
    blocks whose digests are unknown. Block boundaries are the publisher's (`block_size`), so the
    plan is the one `from_file` would make of the same bytes; upload still re-checks every block.
    The two hashes of a large write are computed in the background (`_HashChain`); every other
    method first waits for them. Not thread-safe otherwise: the owner serializes writes,
    truncates and `body`.
    """

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, *, on_change=None, on_block=None):
        self.block_size = block_size
        # Called whenever the in-order hashes stop describing the file's blocks (reset, forget,
        # any change other than an in-order write): what was derived from them is stale.
        self.on_change = on_change
        # Called as on_block(index, digest, pieces) once a block written in order is hashed, in
        # the thread that hashed it: `pieces` are the block's bytes in order, exactly what the
        # digest is of (views of immutable `bytes`), or None when a write passed a mutable buffer.
        self.on_block = on_block
        self._whole_chain = _HashChain()
        self._block_chain = _HashChain()
        self.reset()

    def _settle(self) -> None:
        self._whole_chain.settle()
        self._block_chain.settle()

    def reset(self) -> None:
        """The file is empty now."""
        self._settle()
        self.hashed = 0  # bytes [0, hashed) went through the running hashes
        self._whole = hashlib.sha256()
        self._block = hashlib.sha256()  # of bytes [hashed // block_size * block_size, hashed)
        self._digests: dict[int, bytes] = {}  # block index -> digest of a complete block
        self._pieces = self._new_pieces()  # of the block in progress, for on_block
        if self.on_change is not None:
            self.on_change()

    def _new_pieces(self) -> list | None:
        return [] if self.on_block is not None else None

    def forget(self) -> None:
        """Nothing about the file's bytes is known (it was rewritten some other way)."""
        self.reset()
        self._whole = None

    @property
    def in_order(self) -> bool:
        return self._whole is not None

    def wrote(self, offset: int, data) -> None:
        """Bytes [offset, offset + len(data)) of the file are now `data`."""
        size = len(data)
        if size == 0:
            return
        if offset != self.hashed or self._whole is None:
            self.changed(offset, offset + size)
            return
        view = memoryview(data).cast("B")
        background = isinstance(data, bytes)  # immutable: safe to hash after the write returns
        self._whole_chain.submit(self._whole.update, view, background=background)
        bs = self.block_size
        position = offset
        while view:
            piece = view[: bs - position % bs]
            position += len(piece)
            view = view[len(piece) :]
            if self._pieces is not None:
                if background:
                    self._pieces.append(piece)
                else:
                    self._pieces = None  # a mutable buffer: this block's bytes are not kept
            if position % bs == 0:
                # The block ends here: its digest is taken after its last piece, in the chain.
                end = _BlockEnd(self._block, self._digests, position // bs - 1, self._pieces, self.on_block)
                self._block_chain.submit(end, piece, background=background)
                self._block = hashlib.sha256()
                self._pieces = self._new_pieces()
            else:
                self._block_chain.submit(self._block.update, piece, background=background)
        self.hashed = position

    def truncated(self, size: int) -> None:
        """The file is `size` bytes now (a larger size adds zeros, hashed by `body`)."""
        if size < self.hashed or self._whole is None:
            self.changed(size, None)

    def changed(self, start: int, end: int | None) -> None:
        """Bytes from `start` (to `end`, or the end of the file) changed some other way."""
        self._settle()
        bs = self.block_size
        first, last = start // bs, None if end is None else (end - 1) // bs
        for index in [i for i in self._digests if i >= first and (last is None or i <= last)]:
            del self._digests[index]
        self._whole = None
        if self.on_change is not None:
            self.on_change()

    def body(self, path: str, size: int, progress=None) -> Body:
        """The Body of the file at `path`, which holds `size` bytes: from the running hashes,
        reading only what they do not cover (`progress()` is called after each block read)."""
        self._settle()
        bs = self.block_size
        if self._whole is not None and self.hashed <= size:
            whole, offset = self._whole.copy(), self.hashed
            blocks = [BlockPlan(i, i * bs, bs, self._digests[i]) for i in range(offset // bs)]
            block = self._block.copy() if offset % bs else None  # the block in progress
        else:
            whole, offset, blocks, block = hashlib.sha256(), 0, [], None
        try:
            with open(path, "rb", buffering=0) as f:
                while offset < size or block is not None:
                    index = offset // bs
                    start = index * bs
                    length = min(bs, size - start)
                    known = None
                    # A block read from its start is hashed only once a byte in it is not zero
                    # (a hole of a sparse spool: its digest is known, nokvfs.objects.zeros).
                    holed = block is None
                    if block is None:
                        known = self._digests.get(index) if length == bs else None
                        block = hashlib.sha256() if known is None else None
                    end = start + length
                    while offset < end:
                        chunk = os.pread(f.fileno(), min(_READ_CHUNK, end - offset), offset)
                        if not chunk:
                            raise StoreError(f"{path} ended at {offset} bytes, expected {size}")
                        whole.update(chunk)
                        if block is not None:
                            if holed and not zeros.is_zero(chunk):
                                holed = False
                                if offset > start:
                                    block.update(zeros.zeros(offset - start))  # the zeros skipped
                            if not holed:
                                block.update(chunk)
                        offset += len(chunk)
                    if block is not None and holed:
                        known, block = zeros.zero_sha256(length), None
                    blocks.append(BlockPlan(index, start, length, known if block is None else block.digest()))
                    block = None
                    if progress is not None:
                        progress()
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror}") from None
        return Body(size, whole.digest(), blocks, path=path, hasher=whole)


def from_stream(stream, spool_dir: str, block_size: int = DEFAULT_BLOCK_SIZE) -> Body:
    """Spool a stream (stdin, a socket) to a local file, then plan it like a file."""
    filemodes.makedirs(spool_dir)
    fd, path = tempfile.mkstemp(prefix="stream-", dir=spool_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = stream.read(_READ_CHUNK)
                if not chunk:
                    break
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        os.unlink(path)
        if exc.errno == 28:
            raise StoreFull(f"no space left to spool the stream in {spool_dir}") from None
        raise StoreError(f"cannot spool the stream: {exc.strerror}") from None
    return from_file(path, block_size, owned_spool=True)
