"""Where blocks are fetched and verified, and how bodies are cut into blocks.

An artifact body is stored as bounded blocks (`DEFAULT_BLOCK_SIZE`, 4 MiB), one object each at
its revision-owned key (`nokvfs.objects.keys.artifact_block_key`), each named in the manifest by
its SHA-256 digest URI and length. `BlockReader` is the only read path from the store to a
caller: a block is returned only after its length and SHA-256 matched the manifest, whether it
came from the store or from the cache (whose entries are re-verified with BLAKE3 on every hit).
The SHA-256 is the one the store vouches for when it can (`ObjectStore.get_vouched`: the local
store, for bytes it has just found unchanged since they were written with that digest), else
hashed here.

All calls block; the filesystem runs them in worker threads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from nokvfs.errors import IntegrityError, InvalidInput
from nokvfs.objects import zeros
from nokvfs.objects.cache import BlockCache
from nokvfs.objects.keys import parse_sha256_uri, sha256_uri
from nokvfs.objects.store import MiB, ObjectStore

DEFAULT_BLOCK_SIZE = 4 * MiB
MAX_BLOCK_SIZE = 64 * MiB


class Block(NamedTuple):
    """One block of a body: its index, bytes and raw SHA-256 digest."""

    index: int
    data: bytes
    sha256: bytes

    @property
    def digest_uri(self) -> str:
        return sha256_uri(self.sha256)


def split_blocks(fileobj: BinaryIO, block_size: int = DEFAULT_BLOCK_SIZE) -> Iterator[Block]:
    """Cut `fileobj` into full blocks of `block_size` (the last may be shorter).

    Short reads are retried until a block is full or the input ends, so the cut depends only on
    the bytes, never on how the file object delivers them. An empty input yields no blocks.
    """
    _check_block_size(block_size)
    index = 0
    while True:
        pieces = []
        remaining = block_size
        while remaining:
            piece = fileobj.read(remaining)
            if not piece:
                break
            pieces.append(piece)
            remaining -= len(piece)
        if not pieces:
            return
        data = b"".join(pieces)
        yield Block(index, data, hashlib.sha256(data).digest())
        index += 1
        if remaining:
            return


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidInput(f"block size must be 1..{MAX_BLOCK_SIZE} bytes, got {block_size!r}")


class BlockReader:
    """Verified block reads: the cache if it has the block, else the store (then cached)."""

    def __init__(self, store: ObjectStore, cache: BlockCache | None = None):
        self.store = store
        self.cache = cache
        # A mount sets this: a block read from the store goes into the cache in the cache's own
        # thread, so the reader does not wait for its local copy to be written.
        self.fill_in_background = False

    def read_block(self, object_key: str, digest_uri: str, expected_length: int) -> bytes:
        """The whole block at `object_key`, which must be `expected_length` bytes with SHA-256
        `digest_uri`. A mismatch is IntegrityError naming the key, and the bytes are discarded;
        an absent object is ObjectMissing."""
        digest = parse_sha256_uri(digest_uri)
        _check_length(expected_length)
        if self.cache is not None:
            cached = self.cache.get(digest_uri)
            if cached is not None:
                if len(cached) != expected_length:
                    raise IntegrityError(
                        f"manifest says block {object_key} is {expected_length} bytes, "
                        f"but {digest_uri} is {len(cached)} bytes"
                    )
                return cached
        # Ask for one byte more than expected, so an over-long object is detected without
        # pulling all of it.
        data, vouched = self.store.get_vouched(object_key, expected_length + 1)
        if len(data) > expected_length:
            raise IntegrityError(f"block {object_key} is longer than the manifest's {expected_length} bytes")
        if len(data) < expected_length:
            raise IntegrityError(f"block {object_key} is {len(data)} bytes, the manifest says {expected_length}")
        actual = vouched if vouched == digest else zeros.sha256_of(data)
        if actual != digest:
            raise IntegrityError(f"block {object_key} has SHA-256 {sha256_uri(actual)}, manifest says {digest_uri}")
        if self.cache is not None:
            if self.fill_in_background:
                self.cache.put_later(digest, data)  # verified above
            else:
                self.cache.put_checked(digest, data)  # verified above
        return data

    def keep_written(self, digest: bytes, data: bytes) -> None:
        """Bytes a publication has just stored, which it checked against `digest` (their
        SHA-256): put in the cache by the cache's own thread when a mount fills it that way, so
        the first read after a remount (or after the mount's memory let the block go) is local,
        not a download. Anything else does nothing (a CLI put leaves the cache to the mount)."""
        if self.cache is not None and self.fill_in_background:
            self.cache.put_later(digest, data)

    def read_range(self, object_key: str, digest_uri: str, expected_length: int, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` of the verified block, clipped at its end.

        Blocks are bounded, so the whole block is fetched and verified and then sliced: a partial
        read cannot be checked against the block's digest.
        """
        _check_length(expected_length)
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= expected_length:
            raise InvalidInput(f"range start must be within 0..{expected_length}, got {start!r}")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise InvalidInput(f"range length must be a non-negative integer, got {length!r}")
        if length == 0 or start == expected_length:
            return b""
        return self.read_block(object_key, digest_uri, expected_length)[start : start + length]


def _check_length(expected_length: int) -> None:
    if (
        not isinstance(expected_length, int)
        or isinstance(expected_length, bool)
        or not 0 <= expected_length <= MAX_BLOCK_SIZE
    ):
        raise InvalidInput(f"block length must be 0..{MAX_BLOCK_SIZE} bytes, got {expected_length!r}")


class BlockWriter:
    """Upload blocks at revision-owned keys, creating each key exactly once.

    Keys are owned by one never-reused revision, so every upload is ``if_none_match``: a key that
    already exists means a ledger bug or a replayed upload and is PreconditionFailed, never a
    silent overwrite. An uploaded block is also placed in the cache when one is given.
    """

    def __init__(self, store: ObjectStore, cache: BlockCache | None = None):
        self.store = store
        self.cache = cache

    def write_block(self, object_key: str, block: Block) -> str:
        """Upload one block; return the object's etag."""
        etag = self.store.put(object_key, block.data, if_none_match=True)
        if self.cache is not None:
            self.cache.put(block.digest_uri, block.data)
        return etag
