"""The recovery outbox: header and chunk rows with a SHA-256 hash chain.

header key: 0x00 | u64 recovery_lsn
chunk key:  0x01 | u64 recovery_lsn | u32 chunk_index

chain_digest(lsn) = SHA-256("nokv.recovery.chain.v1\\0" | previous chain digest | u64 lsn |
u8 record kind | u64 commit version | u64 payload length | payload SHA-256); the chain starts at
SHA-256("nokv.recovery.genesis.v1\\0" | logical shard id).

Chunks store the payload compressed (OutboxDeflatedChunk: one zlib stream split into chunks)
when that is smaller, else raw (OutboxChunk); the header's length and SHA-256 are always the
payload's own, so the chain, replay and shipped packs see the same bytes either way.

Truncation (Shard.truncate_outbox) removes the records at or below a floor LSN and keeps that
record's chain digest (System `retention`), so the chain is verified from the floor onwards.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

from nokvfs.engine import rows
from nokvfs.engine.records import (
    OUTBOX_CHUNK_BYTES,
    OUTBOX_CHUNK_PREFIX,
    OUTBOX_HEADER_PREFIX,
    OutboxChunk,
    OutboxDeflatedChunk,
    OutboxHeader,
)
from nokvfs.errors import FormatError, OutboxCorrupt
from nokvfs.schema.enums import OutboxRecordKind

OUTBOX_TREE = "recovery_outbox"
_LSN = struct.Struct(">Q")
_CHUNK = struct.Struct(">QI")


def genesis_digest(logical_shard_id: bytes) -> bytes:
    return hashlib.sha256(b"nokv.recovery.genesis.v1\0" + logical_shard_id).digest()


def chain_digest(previous: bytes, lsn: int, kind: int, commit_version: int, payload: bytes) -> bytes:
    h = hashlib.sha256(b"nokv.recovery.chain.v1\0")
    h.update(previous)
    h.update(struct.pack(">QBQQ", lsn, int(kind), commit_version, len(payload)))
    h.update(hashlib.sha256(payload).digest())
    return h.digest()


def header_key(lsn: int) -> bytes:
    return OUTBOX_HEADER_PREFIX + _LSN.pack(lsn)


def chunk_key(lsn: int, index: int) -> bytes:
    return OUTBOX_CHUNK_PREFIX + _CHUNK.pack(lsn, index)


# Payloads shorter than this are stored raw: compressing them saves too little to pay its cost.
COMPRESS_ABOVE = 128
_COMPRESSION_LEVEL = 6


def frame(lsn: int, kind: OutboxRecordKind, commit_version: int, payload: bytes, previous: bytes):
    """The (key, value) rows of one outbox record and its chain digest."""
    stored, chunk_record = payload, OutboxChunk
    if len(payload) > COMPRESS_ABOVE:
        deflated = zlib.compress(payload, _COMPRESSION_LEVEL)
        if len(deflated) < len(payload):
            stored, chunk_record = deflated, OutboxDeflatedChunk
    chunks = [stored[i : i + OUTBOX_CHUNK_BYTES] for i in range(0, len(stored), OUTBOX_CHUNK_BYTES)]
    digest = chain_digest(previous, lsn, kind, commit_version, payload)
    header = OutboxHeader(
        record_kind=kind,
        commit_version=commit_version,
        chunk_count=len(chunks),
        payload_length=len(payload),
        payload_sha256=hashlib.sha256(payload).digest(),
        previous_chain_digest=previous,
        chain_digest=digest,
    )
    rows = [(header_key(lsn), header.encode())]
    rows += [(chunk_key(lsn, i), chunk_record(c).encode()) for i, c in enumerate(chunks)]
    return rows, digest


def decode_chunk(raw: bytes, lsn: int, index: int) -> tuple[bytes, bool]:
    """(the chunk's bytes, whether they are a piece of a zlib stream), or OutboxCorrupt."""
    try:
        if raw[:1] == bytes([OutboxDeflatedChunk.VERSION]):
            return OutboxDeflatedChunk.decode(raw).data, True
        return OutboxChunk.decode(raw).data, False
    except FormatError as exc:
        raise OutboxCorrupt(f"outbox chunk {lsn}/{index} does not decode: {exc}") from None


def join_chunks(parts: list[tuple[bytes, bool]], header: OutboxHeader, lsn: int) -> bytes:
    """The payload the chunks of record `lsn` hold (inflated when they are a zlib stream).

    Inflation stops one byte past the header's payload length, so damage cannot make it
    allocate more than the record states."""
    if not parts or not parts[0][1]:
        if any(deflated for _, deflated in parts):
            raise OutboxCorrupt(f"outbox record {lsn} mixes raw and compressed chunks")
        return b"".join(data for data, _ in parts)
    if not all(deflated for _, deflated in parts):
        raise OutboxCorrupt(f"outbox record {lsn} mixes raw and compressed chunks")
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(b"".join(data for data, _ in parts), header.payload_length + 1)
    except zlib.error as exc:
        why = f"the stored zlib stream does not inflate ({exc})"
    else:
        if inflater.eof and not inflater.unused_data and not inflater.unconsumed_tail:
            return payload
        why = "the stored zlib stream is not exactly one stream of the header's length"
    raise OutboxCorrupt(f"outbox record {lsn}: payload SHA-256 cannot match its header: {why}")


def verify_record(lsn: int, header: OutboxHeader, payload: bytes, previous: bytes) -> bytes:
    """The chain digest of record `lsn`, or OutboxCorrupt: its payload must match its header and
    its chain must follow `previous`. Used on open, on outbox ranges and on shipped packs."""
    if len(payload) != header.payload_length:
        raise OutboxCorrupt(f"outbox record {lsn}: payload length differs from its header")
    if hashlib.sha256(payload).digest() != header.payload_sha256:
        raise OutboxCorrupt(f"outbox record {lsn}: payload SHA-256 differs from its header")
    if header.previous_chain_digest != previous:
        raise OutboxCorrupt(f"outbox record {lsn}: previous chain digest does not follow")
    digest = chain_digest(previous, lsn, header.record_kind, header.commit_version, payload)
    if digest != header.chain_digest:
        raise OutboxCorrupt(f"outbox record {lsn}: chain digest does not verify")
    return digest


@dataclass(frozen=True)
class OutboxEntry:
    lsn: int
    header: OutboxHeader
    payload: bytes


@dataclass(frozen=True)
class OutboxSummary:
    last_lsn: int
    chain_digest: bytes
    last_commit_version: int
    records: int


def check_floor(txn, db, floor_lsn: int) -> None:
    """OutboxCorrupt unless nothing of the outbox is left at or below the truncation point: the
    first header is record floor_lsn + 1 (or there is none) and so is the first chunk's."""
    cursor = txn.cursor(db)
    if cursor.set_range(OUTBOX_HEADER_PREFIX) and cursor.key()[:1] == OUTBOX_HEADER_PREFIX:
        key = cursor.key()
        if len(key) != 9 or _LSN.unpack_from(key, 1)[0] != floor_lsn + 1:
            raise OutboxCorrupt(
                f"the outbox's first record is {key.hex()}, not LSN {floor_lsn + 1} after the truncation point "
                f"{floor_lsn}"
            )
    if cursor.set_range(OUTBOX_CHUNK_PREFIX):
        key = cursor.key()
        if len(key) != 13 or _CHUNK.unpack_from(key, 1)[0] <= floor_lsn:
            raise OutboxCorrupt(f"outbox chunk {key.hex()} is left at or below the truncation point {floor_lsn}")


def iterate(txn, db, start_digest: bytes, *, after_lsn: int = 0):
    """Yield every outbox entry after record `after_lsn` (whose chain digest is `start_digest`:
    the genesis digest at 0, the truncation point's digest, or that record's own), verifying
    framing and chain as it goes.

    Raises OutboxCorrupt saying where: a gap in LSNs, a header that does not decode, a payload
    whose length or SHA-256 differs, a chain digest that does not follow, a missing or orphan chunk.
    """
    headers = txn.cursor(db)
    chunks = txn.cursor(db)
    previous = start_digest
    expected = after_lsn + 1
    more_chunks = chunks.set_range(chunk_key(expected, 0))
    ok = headers.set_range(header_key(expected))
    while ok and headers.key()[:1] == OUTBOX_HEADER_PREFIX:
        key = headers.key()
        if len(key) != 9:
            raise OutboxCorrupt(f"outbox header key of {len(key)} bytes")
        lsn = _LSN.unpack_from(key, 1)[0]
        if lsn != expected:
            raise OutboxCorrupt(f"outbox LSN gap: expected {expected}, found {lsn}")
        try:
            header = OutboxHeader.decode(rows.unseal(OUTBOX_TREE, key, headers.value()))
        except FormatError as exc:
            raise OutboxCorrupt(f"outbox header {lsn} does not decode: {exc}") from None
        parts = []
        for index in range(header.chunk_count):
            if not more_chunks or chunks.key() != chunk_key(lsn, index):
                raise OutboxCorrupt(f"outbox record {lsn} is missing chunk {index}")
            parts.append(decode_chunk(rows.unseal(OUTBOX_TREE, chunks.key(), chunks.value()), lsn, index))
            more_chunks = chunks.next()
        payload = join_chunks(parts, header, lsn)
        digest = verify_record(lsn, header, payload, previous)
        yield OutboxEntry(lsn, header, payload)
        previous = digest
        expected += 1
        ok = headers.next()
    if more_chunks:
        key = chunks.key()
        if key[:1] == OUTBOX_CHUNK_PREFIX and len(key) == 13:
            raise OutboxCorrupt(f"orphan outbox chunk {_CHUNK.unpack_from(key, 1)}")
        raise OutboxCorrupt(f"unexpected outbox key {key.hex()}")


def verify(txn, db, floor_digest: bytes, *, floor_lsn: int = 0, floor_commit_version: int = 0) -> OutboxSummary:
    """The whole chain after the truncation point, verified: O(records kept)."""
    check_floor(txn, db, floor_lsn)
    last = OutboxSummary(floor_lsn, floor_digest, floor_commit_version, 0)
    for entry in iterate(txn, db, floor_digest, after_lsn=floor_lsn):
        last = OutboxSummary(
            entry.lsn,
            entry.header.chain_digest,
            max(last.last_commit_version, entry.header.commit_version),
            last.records + 1,
        )
    return last


def verify_recent(txn, db, floor_digest: bytes, *, floor_lsn: int, tail_lsn: int, records: int) -> OutboxSummary | None:
    """The last `records` records before the tail verified (framing, payload and chain from the
    record before them), and nothing left below the truncation point: O(records), whatever
    the length of the outbox. None when the header a verification starts from is missing (the
    caller reports the tail mismatch). Opening uses this; `verify` is the full walk."""
    check_floor(txn, db, floor_lsn)
    start = max(floor_lsn, tail_lsn - records)
    if start == floor_lsn:
        digest = floor_digest
    else:
        raw = rows.get(txn, db, OUTBOX_TREE, header_key(start))
        if raw is None:
            return None
        try:
            digest = OutboxHeader.decode(raw).chain_digest
        except FormatError as exc:
            raise OutboxCorrupt(f"outbox header {start} does not decode: {exc}") from None
    last = OutboxSummary(start, digest, 0, 0)
    for entry in iterate(txn, db, digest, after_lsn=start):
        last = OutboxSummary(
            entry.lsn,
            entry.header.chain_digest,
            max(last.last_commit_version, entry.header.commit_version),
            last.records + 1,
        )
    return last
