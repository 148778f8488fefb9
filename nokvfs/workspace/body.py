"""Artifact bodies before publication: split into blocks and hashed before any upload.

The StagedObject ledger must own every key, length and digest before the first byte is sent, so a
body is hashed in one pass first: bytes in memory as they are, a file where it lies, a stream
spooled to a local file. Upload re-reads each block and re-checks its SHA-256, so a source that
changes under the upload aborts instead of publishing bytes its digests do not describe.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.errors import IntegrityError, StoreError, StoreFull

DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
_READ_CHUNK = 1024 * 1024


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
    ):
        self.size = size
        self.sha256 = sha256
        self.blocks = blocks
        self._data = data
        self.path = path
        self.owned_spool = owned_spool

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
        if len(data) != block.length or hashlib.sha256(data).digest() != block.sha256:
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
    return Body(len(data), hashlib.sha256(data).digest(), blocks, data=data)


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
    return Body(offset, whole.digest(), blocks, path=path, owned_spool=owned_spool)


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
