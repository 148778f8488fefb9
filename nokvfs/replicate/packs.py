"""Pack framing: checkpoint packs (a compacted LMDB copy) and increment packs (outbox ranges).

All integers are unsigned big-endian. Packs are immutable once uploaded; the manifest descriptor
(SHA-256 and size of the whole pack) is authoritative and is checked before a pack is used. The
framing adds its own checks so that a pack is also self-describing and closed.

Checkpoint pack (restorable alone: the data file holds every tree, the outbox after its
truncation point and the System rows)::

    b"NOKVCKP1" | logical_shard_id[16] | through_lsn u64 | commit_version u64
    | chain_digest[32] | owner_epoch u64 | data_length u64 | data_sha256[32]
    | data (the `data.mdb` of `Environment.copy(compact=True)`, data_length bytes)

Increment pack (a contiguous range of recovery-outbox records, each with its storage header, so
every record carries its previous and current chain digest)::

    b"NOKVINC1" | logical_shard_id[16] | first_lsn u64 | last_lsn u64
    | previous_chain_digest[32] | chain_digest[32] | record_count u32
    | record_count x ( lsn u64 | u32 len(header) | OutboxHeader bytes | u64 len(payload) | payload )
    | b"NOKVEND1"
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.engine.outbox import OutboxEntry
from nokvfs.engine.records import OutboxHeader
from nokvfs.engine.shard import verify_outbox_record
from nokvfs.errors import FormatError
from nokvfs.replicate.errors import PackCorrupt

CHECKPOINT_MAGIC = b"NOKVCKP1"
INCREMENT_MAGIC = b"NOKVINC1"
INCREMENT_END = b"NOKVEND1"

_CHECKPOINT_HEADER = struct.Struct(">8s16sQQ32sQQ32s")
CHECKPOINT_HEADER_SIZE = _CHECKPOINT_HEADER.size
_INCREMENT_HEADER = struct.Struct(">8s16sQQ32s32sI")
_RECORD_LSN_HEADER = struct.Struct(">QI")
_U64 = struct.Struct(">Q")
COPY_CHUNK = 8 * 1024 * 1024


# --- checkpoint packs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointHeader:
    logical_shard_id: bytes
    through_lsn: int
    commit_version: int
    chain_digest: bytes
    owner_epoch: int
    data_length: int
    data_sha256: bytes

    def encode(self) -> bytes:
        return _CHECKPOINT_HEADER.pack(
            CHECKPOINT_MAGIC,
            self.logical_shard_id,
            self.through_lsn,
            self.commit_version,
            self.chain_digest,
            self.owner_epoch,
            self.data_length,
            self.data_sha256,
        )

    @classmethod
    def decode(cls, raw: bytes) -> CheckpointHeader:
        if len(raw) != CHECKPOINT_HEADER_SIZE:
            raise PackCorrupt(f"checkpoint pack header is {len(raw)} bytes, expected {CHECKPOINT_HEADER_SIZE}")
        magic, shard, lsn, version, chain, epoch, length, digest = _CHECKPOINT_HEADER.unpack(raw)
        if magic != CHECKPOINT_MAGIC:
            raise PackCorrupt(f"not a checkpoint pack (magic {magic!r})")
        return cls(shard, lsn, version, chain, epoch, length, digest)


def _file_sha256(path: str) -> tuple[bytes, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.digest(), size


def write_checkpoint_pack(
    data_path: str,
    pack_path: str,
    *,
    logical_shard_id: bytes,
    through_lsn: int,
    commit_version: int,
    chain_digest: bytes,
    owner_epoch: int,
) -> tuple[bytes, int]:
    """Frame the LMDB data file at `data_path` into `pack_path`; return (pack SHA-256, pack size)."""
    data_sha, data_len = _file_sha256(data_path)
    header = CheckpointHeader(
        logical_shard_id, through_lsn, commit_version, chain_digest, owner_epoch, data_len, data_sha
    )
    h = hashlib.sha256()
    size = 0
    with open(pack_path, "wb", opener=filemodes.opener) as out, open(data_path, "rb") as data:
        for chunk in _chunks_of(header.encode(), data):
            h.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return h.digest(), size


def _chunks_of(first: bytes, f):
    yield first
    while chunk := f.read(COPY_CHUNK):
        yield chunk


class CheckpointSink:
    """Receives a checkpoint pack's bytes as they download: the header is kept, the data goes
    straight into `data_path`, and both SHA-256s are computed on the way, so the pack is never
    held in memory or on disk twice. Nothing is trusted until `finish` checked the digests."""

    def __init__(self, data_path: str):
        self._header = bytearray()
        self._data = open(data_path, "wb", opener=filemodes.opener)
        self._data_sha = hashlib.sha256()
        self._data_len = 0

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        need = CHECKPOINT_HEADER_SIZE - len(self._header)
        if need > 0:
            self._header += view[:need]
            view = view[need:]
        if view:
            self._data.write(view)
            self._data_sha.update(view)
            self._data_len += len(view)

    def finish(self) -> CheckpointHeader:
        """The header, once the data file is durable and matches the header's length and SHA-256."""
        self._data.flush()
        os.fsync(self._data.fileno())
        self._data.close()
        header = CheckpointHeader.decode(bytes(self._header))
        if header.data_length != self._data_len or header.data_sha256 != self._data_sha.digest():
            raise PackCorrupt("checkpoint pack data differs from the length or SHA-256 its header states")
        return header

    def close(self) -> None:
        if not self._data.closed:
            self._data.close()


# --- increment packs ----------------------------------------------------------------------------


def build_increment(logical_shard_id: bytes, previous_chain_digest: bytes, entries: list[OutboxEntry]) -> bytes:
    """The increment pack of `entries` (contiguous, verified), which follow `previous_chain_digest`."""
    if not entries:
        raise ValueError("an increment pack holds at least one record")
    parts = [
        _INCREMENT_HEADER.pack(
            INCREMENT_MAGIC,
            logical_shard_id,
            entries[0].lsn,
            entries[-1].lsn,
            previous_chain_digest,
            entries[-1].header.chain_digest,
            len(entries),
        )
    ]
    for entry in entries:
        header = entry.header.encode()
        parts += [_RECORD_LSN_HEADER.pack(entry.lsn, len(header)), header, _U64.pack(len(entry.payload)), entry.payload]
    parts.append(INCREMENT_END)
    return b"".join(parts)


@dataclass(frozen=True)
class IncrementPack:
    logical_shard_id: bytes
    first_lsn: int
    last_lsn: int
    previous_chain_digest: bytes
    chain_digest: bytes
    entries: list


def parse_increment(data: bytes) -> IncrementPack:
    """Parse and verify an increment pack's framing and its chain; PackCorrupt says where it breaks."""
    if len(data) < _INCREMENT_HEADER.size + len(INCREMENT_END):
        raise PackCorrupt(f"increment pack of {len(data)} bytes is truncated")
    magic, shard, first, last, previous, chain, count = _INCREMENT_HEADER.unpack_from(data, 0)
    if magic != INCREMENT_MAGIC:
        raise PackCorrupt(f"not an increment pack (magic {magic!r})")
    if last < first or count != last - first + 1:
        raise PackCorrupt(f"increment pack header states LSNs {first}..{last} and {count} records")
    pos = _INCREMENT_HEADER.size
    entries = []
    running = previous
    for expected in range(first, last + 1):
        try:
            lsn, header_len = _RECORD_LSN_HEADER.unpack_from(data, pos)
            pos += _RECORD_LSN_HEADER.size
            raw_header = data[pos : pos + header_len]
            pos += header_len
            (payload_len,) = _U64.unpack_from(data, pos)
            pos += _U64.size
        except struct.error:
            raise PackCorrupt(f"increment pack is truncated in record {expected}") from None
        if lsn != expected:
            raise PackCorrupt(f"increment pack record {expected} is framed as LSN {lsn}")
        payload = data[pos : pos + payload_len]
        pos += payload_len
        if len(raw_header) != header_len or len(payload) != payload_len:
            raise PackCorrupt(f"increment pack is truncated in record {lsn}")
        try:
            header = OutboxHeader.decode(raw_header)
            running = verify_outbox_record(lsn, header, payload, running)
        except FormatError as exc:  # OutboxCorrupt included
            raise PackCorrupt(f"increment pack record {lsn}: {exc}") from None
        entries.append(OutboxEntry(lsn, header, payload))
    if data[pos:] != INCREMENT_END:
        raise PackCorrupt("increment pack does not end with its end marker (trailing or missing bytes)")
    if running != chain:
        raise PackCorrupt("increment pack's last chain digest differs from its header")
    return IncrementPack(shard, first, last, previous, chain, entries)
