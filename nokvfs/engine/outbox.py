"""The recovery outbox: header and chunk rows with a SHA-256 hash chain.

header key: 0x00 | u64 recovery_lsn
chunk key:  0x01 | u64 recovery_lsn | u32 chunk_index

chain_digest(lsn) = SHA-256("nokv.recovery.chain.v1\\0" | previous chain digest | u64 lsn |
u8 record kind | u64 commit version | u64 payload length | payload SHA-256); the chain starts at
SHA-256("nokv.recovery.genesis.v1\\0" | logical shard id).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from nokvfs.engine import rows
from nokvfs.engine.records import (
    OUTBOX_CHUNK_BYTES,
    OUTBOX_CHUNK_PREFIX,
    OUTBOX_HEADER_PREFIX,
    OutboxChunk,
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


def frame(lsn: int, kind: OutboxRecordKind, commit_version: int, payload: bytes, previous: bytes):
    """The (key, value) rows of one outbox record and its chain digest."""
    chunks = [payload[i : i + OUTBOX_CHUNK_BYTES] for i in range(0, len(payload), OUTBOX_CHUNK_BYTES)]
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
    rows += [(chunk_key(lsn, i), OutboxChunk(c).encode()) for i, c in enumerate(chunks)]
    return rows, digest


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


def iterate(txn, db, genesis: bytes, *, start_lsn: int = 1):
    """Yield every outbox entry from `start_lsn`, verifying framing and chain as it goes.

    Raises OutboxCorrupt saying where: a gap in LSNs, a header that does not decode, a payload
    whose length or SHA-256 differs, a chain digest that does not follow, a missing or orphan chunk.
    """
    headers = txn.cursor(db)
    chunks = txn.cursor(db)
    previous = genesis
    expected = start_lsn
    if start_lsn != 1:
        raise OutboxCorrupt("verification from a later LSN needs a checkpointed digest")
    more_chunks = chunks.set_range(OUTBOX_CHUNK_PREFIX)
    ok = headers.set_range(OUTBOX_HEADER_PREFIX)
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
            try:
                parts.append(OutboxChunk.decode(rows.unseal(OUTBOX_TREE, chunks.key(), chunks.value())).data)
            except FormatError as exc:
                raise OutboxCorrupt(f"outbox chunk {lsn}/{index} does not decode: {exc}") from None
            more_chunks = chunks.next()
        payload = b"".join(parts)
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


def verify(txn, db, genesis: bytes) -> OutboxSummary:
    last = OutboxSummary(0, genesis, 0, 0)
    for entry in iterate(txn, db, genesis):
        last = OutboxSummary(
            entry.lsn, entry.header.chain_digest, max(last.last_commit_version, entry.header.commit_version), last.records + 1
        )
    return last
