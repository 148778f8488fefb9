"""The recovery outbox: header and chunk rows with a SHA-256 hash chain.

header key: 0x00 | u64 recovery_lsn
chunk key:  0x00 | u64 recovery_lsn | u32 chunk_index   (records written before format 2 of the
            header: 0x01 | u64 recovery_lsn | u32 chunk_index)

From format 3 a record whose stored payload fits one chunk is one row, InlineOutboxRecord, under
its header key (no chunk rows); a longer one is a StoredOutboxHeader and its chunks.

chain_digest(lsn) = SHA-256("nokv.recovery.chain.v1\\0" | previous chain digest | u64 lsn |
u8 record kind | u64 commit version | u64 payload length | payload SHA-256); the chain starts at
SHA-256("nokv.recovery.genesis.v1\\0" | logical shard id).

A record is written as one InlineOutboxRecord row, or (a stored payload over one chunk) as a
StoredOutboxHeader and its chunks right after it in key order, so every row is appended (LMDB
fills its pages instead of splitting them in half, as it did when headers and chunks were two
interleaved runs). The stored payload is compressed with a preset dictionary
(nokvfs.engine.compression) when that is smaller, else raw. The logical
OutboxHeader -- what entries, replay and shipped packs carry -- is rebuilt on reading with the
previous digest of the chain being verified, and the payload length and SHA-256 are always the
payload's own, so the chain and the packs see the same bytes whatever the stored form. Records
of the earlier layout (OutboxHeader version 1, chunks under 0x01, raw or deflated without a
dictionary) are read as before.

Truncation (Shard.truncate_outbox) removes the records at or below a floor LSN and keeps that
record's chain digest (System `retention`), so the chain is verified from the floor onwards.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from nokvfs.engine import compression, rows
from nokvfs.engine.records import (
    OUTBOX_CHUNK_BYTES,
    OUTBOX_CHUNK_PREFIX,
    OUTBOX_HEADER_PREFIX,
    InlineOutboxRecord,
    OutboxChunk,
    OutboxDeflatedChunk,
    OutboxHeader,
    StoredOutboxHeader,
)
from nokvfs.errors import FormatError, OutboxCorrupt
from nokvfs.schema.enums import OutboxPayloadEncoding, OutboxRecordKind

OUTBOX_TREE = "recovery_outbox"
_LSN = struct.Struct(">Q")
_CHUNK = struct.Struct(">QI")


def genesis_digest(logical_shard_id: bytes) -> bytes:
    return hashlib.sha256(b"nokv.recovery.genesis.v1\0" + logical_shard_id).digest()


def chain_digest(
    previous: bytes, lsn: int, kind: int, commit_version: int, payload: bytes, payload_sha256: bytes | None = None
) -> bytes:
    """`payload_sha256`: the payload's SHA-256 when the caller has it already."""
    h = hashlib.sha256(b"nokv.recovery.chain.v1\0")
    h.update(previous)
    h.update(struct.pack(">QBQQ", lsn, int(kind), commit_version, len(payload)))
    h.update(hashlib.sha256(payload).digest() if payload_sha256 is None else payload_sha256)
    return h.digest()


def header_key(lsn: int) -> bytes:
    return OUTBOX_HEADER_PREFIX + _LSN.pack(lsn)


def chunk_key(lsn: int, index: int) -> bytes:
    """The key of a chunk of a record with a StoredOutboxHeader: right after its header."""
    return OUTBOX_HEADER_PREFIX + _CHUNK.pack(lsn, index)


def legacy_chunk_key(lsn: int, index: int) -> bytes:
    """The key of a chunk of a record with a version 1 OutboxHeader (written before format 2)."""
    return OUTBOX_CHUNK_PREFIX + _CHUNK.pack(lsn, index)


# A record whose stored payload is at most this long is one row (InlineOutboxRecord), which
# keeps the first PAYLOAD_CHECK_BYTES of the payload's SHA-256.
INLINE_BYTES = OUTBOX_CHUNK_BYTES
PAYLOAD_CHECK_BYTES = 8

# Payloads this long or shorter are stored raw (as before the preset dictionary).
COMPRESS_ABOVE = compression.COMPRESS_ABOVE


# A DeflatePrevious record is primed with the payloads of the records before it in its block of
# KEYFRAME_EVERY LSNs, at most WINDOW_RECORDS of them (a publish is three commands), each at most
# PREVIOUS_LIMIT long. The first record of a block (LSN a multiple of KEYFRAME_EVERY) stands
# alone, so reading any record inflates at most KEYFRAME_EVERY - 1 records before it.
WINDOW_RECORDS = 3
PREVIOUS_LIMIT = 64 * 1024
KEYFRAME_EVERY = 16


def window_start(lsn: int) -> int:
    """The first record whose payload primes a DeflatePrevious record `lsn` (`lsn` itself when
    none does: the first record of a block)."""
    return max(lsn - lsn % KEYFRAME_EVERY, lsn - WINDOW_RECORDS)


def frame(
    lsn: int,
    kind: OutboxRecordKind,
    commit_version: int,
    payload: bytes,
    previous: bytes,
    window: list[bytes] | None = None,
):
    """The (key, value) rows of one outbox record, in key order, and its chain digest.

    `window`: the payloads of records window_start(lsn)..lsn - 1 when all are kept; the record
    is then stored against them (DeflatePrevious) when that is the smallest form."""
    stored, encoding = payload, OutboxPayloadEncoding.Raw
    deflated = compression.deflate(payload)
    if deflated is not None:
        stored, encoding = deflated, OutboxPayloadEncoding.DeflatePreset1
    if (
        window
        and len(window) == lsn - window_start(lsn)
        and all(len(p) <= PREVIOUS_LIMIT for p in window)
        and len(payload) > COMPRESS_ABOVE
    ):
        delta = compression.deflate_with(payload, compression.previous_dictionary(window))
        if len(delta) < len(stored):
            stored, encoding = delta, OutboxPayloadEncoding.DeflatePrevious
    payload_sha256 = hashlib.sha256(payload).digest()  # hashed once: the chain and the stored check use it
    digest = chain_digest(previous, lsn, kind, commit_version, payload, payload_sha256)
    if len(stored) <= INLINE_BYTES:
        inline = InlineOutboxRecord(
            record_kind=kind,
            commit_version=commit_version,
            payload_length=len(payload),
            payload_check=payload_sha256[:PAYLOAD_CHECK_BYTES],
            encoding=encoding,
            chain_digest=digest,
            stored=stored,
        )
        return [(header_key(lsn), inline.encode())], digest
    chunks = [stored[i : i + OUTBOX_CHUNK_BYTES] for i in range(0, len(stored), OUTBOX_CHUNK_BYTES)]
    header = StoredOutboxHeader(
        record_kind=kind,
        commit_version=commit_version,
        chunk_count=len(chunks),
        payload_length=len(payload),
        payload_sha256=payload_sha256,
        encoding=encoding,
        chain_digest=digest,
    )
    rows = [(header_key(lsn), header.encode())]
    rows += [(chunk_key(lsn, i), OutboxChunk(c).encode()) for i, c in enumerate(chunks)]
    return rows, digest


def needs_previous(header) -> bool:
    """Whether the record's payload can only be inflated with the previous record's payload."""
    return (
        isinstance(header, (StoredOutboxHeader, InlineOutboxRecord))
        and header.encoding == OutboxPayloadEncoding.DeflatePrevious
    )


def decode_header(raw: bytes, lsn: int) -> OutboxHeader | StoredOutboxHeader | InlineOutboxRecord:
    """The stored header of record `lsn` (any format; an InlineOutboxRecord is the whole
    record), or OutboxCorrupt."""
    try:
        if raw[:1] == bytes([InlineOutboxRecord.VERSION]):
            return InlineOutboxRecord.decode(raw)
        if raw[:1] == bytes([StoredOutboxHeader.VERSION]):
            return StoredOutboxHeader.decode(raw)
        return OutboxHeader.decode(raw)
    except FormatError as exc:
        raise OutboxCorrupt(f"outbox header {lsn} does not decode: {exc}") from None


def chunk_key_of(header: OutboxHeader | StoredOutboxHeader | InlineOutboxRecord):
    """Where the chunks of a record with this stored header are."""
    return legacy_chunk_key if isinstance(header, OutboxHeader) else chunk_key


def stored_payload(lsn: int, header, chunk_values: list[bytes], window=None) -> bytes:
    """The payload record `lsn` holds, from its stored header and its chunk rows' values (in
    index order, out of their envelopes); the caller checks it (verify_record, payloads).
    `window`: for a DeflatePrevious record, the payloads of records window_start(lsn)..lsn - 1
    or a function returning them; OutboxCorrupt if anything fails."""
    if isinstance(header, (StoredOutboxHeader, InlineOutboxRecord)):
        if isinstance(header, InlineOutboxRecord):
            stored = header.stored
        else:
            try:
                stored = b"".join(OutboxChunk.decode(value).data for value in chunk_values)
            except FormatError as exc:
                raise OutboxCorrupt(f"a chunk of outbox record {lsn} does not decode: {exc}") from None
        if header.encoding == OutboxPayloadEncoding.DeflatePreset1:
            payload = _inflate(stored, header.payload_length, lsn, compression.DICTIONARY_1)
        elif header.encoding == OutboxPayloadEncoding.DeflatePrevious:
            before = window() if callable(window) else window
            if before is None or len(before) != lsn - window_start(lsn) or not before:
                raise OutboxCorrupt(f"outbox record {lsn} is stored against records before it that are not kept")
            payload = _inflate(stored, header.payload_length, lsn, compression.previous_dictionary(before))
        else:
            payload = stored
    else:
        parts = [decode_chunk(value, lsn, index) for index, value in enumerate(chunk_values)]
        payload = join_chunks(parts, header, lsn)
    return payload


def assemble(lsn: int, header, chunk_values: list[bytes], previous: bytes, window=None) -> tuple["OutboxEntry", bytes]:
    """The verified entry of record `lsn` from its stored header and its chunk rows' values (in
    index order, out of their envelopes), and its chain digest; OutboxCorrupt if anything fails.
    `window` as for `stored_payload`."""
    payload = stored_payload(lsn, header, chunk_values, window)
    if isinstance(header, (StoredOutboxHeader, InlineOutboxRecord)):
        chunks, sha256 = header.chunk_count, getattr(header, "payload_sha256", None)
        if isinstance(header, InlineOutboxRecord):
            chunks = -(-len(header.stored) // OUTBOX_CHUNK_BYTES)  # what format 2 would have stored
            sha256 = payload_sha256(lsn, header, payload)
        logical = OutboxHeader(
            record_kind=header.record_kind,
            commit_version=header.commit_version,
            chunk_count=chunks,
            payload_length=header.payload_length,
            payload_sha256=sha256,
            previous_chain_digest=previous,
            chain_digest=header.chain_digest,
        )
    else:
        logical = header
    return OutboxEntry(lsn, logical, payload), verify_record(lsn, logical, payload, previous)


def _chunk_values(txn, db, lsn: int, header) -> list[bytes]:
    key_of = chunk_key_of(header)
    values = []
    for index in range(header.chunk_count):
        value = rows.get(txn, db, OUTBOX_TREE, key_of(lsn, index))
        if value is None:
            raise OutboxCorrupt(f"outbox record {lsn} is missing chunk {index}")
        values.append(value)
    return values


def payloads(txn, db, first: int, last: int) -> list[bytes] | None:
    """The payloads of records first..last by point reads, each checked against its header
    (inflating from the start of first's block the records a DeflatePrevious record is primed
    with), or None when one of first..last is not kept."""
    known: dict[int, bytes] = {}
    for lsn in range(max(1, first - first % KEYFRAME_EVERY), last + 1):
        header = read_header(txn, db, lsn)
        if header is None:
            if lsn >= first:
                return None
            continue  # truncated: no record kept is primed with it (Shard._truncate)
        window = None
        if needs_previous(header):
            try:
                window = [known[n] for n in range(window_start(lsn), lsn)]
            except KeyError:
                raise OutboxCorrupt(
                    f"outbox record {lsn} is stored against records before it that are not kept"
                ) from None
        payload = stored_payload(lsn, header, _chunk_values(txn, db, lsn, header), window)
        if len(payload) != header.payload_length:
            raise OutboxCorrupt(f"outbox record {lsn}: payload length or SHA-256 differs from its header")
        payload_sha256(lsn, header, payload)
        known[lsn] = payload
    return [known[lsn] for lsn in range(first, last + 1)]


def read_header(txn, db, lsn: int) -> OutboxHeader | StoredOutboxHeader | InlineOutboxRecord | None:
    """The stored header of record `lsn` (verified and decoded), or None when there is none."""
    raw = rows.get(txn, db, OUTBOX_TREE, header_key(lsn))
    return None if raw is None else decode_header(raw, lsn)


def read_record(txn, db, lsn: int, previous: bytes) -> tuple["OutboxEntry", bytes] | None:
    """The verified entry of record `lsn` and its chain digest by point reads (the record must
    follow `previous`), or None when there is no record `lsn`."""
    header = read_header(txn, db, lsn)
    if header is None:
        return None
    values = _chunk_values(txn, db, lsn, header)
    return assemble(lsn, header, values, previous, lambda: payloads(txn, db, window_start(lsn), lsn - 1))


def decode_chunk(raw: bytes, lsn: int, index: int) -> tuple[bytes, bool]:
    """(the chunk's bytes, whether they are a piece of a zlib stream), or OutboxCorrupt."""
    try:
        if raw[:1] == bytes([OutboxDeflatedChunk.VERSION]):
            return OutboxDeflatedChunk.decode(raw).data, True
        return OutboxChunk.decode(raw).data, False
    except FormatError as exc:
        raise OutboxCorrupt(f"outbox chunk {lsn}/{index} does not decode: {exc}") from None


def join_chunks(parts: list[tuple[bytes, bool]], header: OutboxHeader, lsn: int) -> bytes:
    """The payload the chunks of a version 1 record `lsn` hold (inflated when they are a zlib
    stream)."""
    if not parts or not parts[0][1]:
        if any(deflated for _, deflated in parts):
            raise OutboxCorrupt(f"outbox record {lsn} mixes raw and compressed chunks")
        return b"".join(data for data, _ in parts)
    if not all(deflated for _, deflated in parts):
        raise OutboxCorrupt(f"outbox record {lsn} mixes raw and compressed chunks")
    return _inflate(b"".join(data for data, _ in parts), header.payload_length, lsn)


def _inflate(stream: bytes, length: int, lsn: int, dictionary: bytes = b"") -> bytes:
    try:
        return compression.inflate(stream, length, dictionary)
    except ValueError as exc:
        raise OutboxCorrupt(f"outbox record {lsn}: payload SHA-256 cannot match its header: {exc}") from None


def payload_sha256(lsn: int, header, payload: bytes) -> bytes:
    """The SHA-256 of record `lsn`'s payload as its stored header records it (an
    InlineOutboxRecord keeps its first PAYLOAD_CHECK_BYTES only, the rest is computed), or
    OutboxCorrupt when the payload does not match it."""
    if not isinstance(header, InlineOutboxRecord):
        if hashlib.sha256(payload).digest() != header.payload_sha256:
            raise OutboxCorrupt(f"outbox record {lsn}: payload SHA-256 differs from its header")
        return header.payload_sha256
    digest = hashlib.sha256(payload).digest()
    if digest[:PAYLOAD_CHECK_BYTES] != header.payload_check:
        raise OutboxCorrupt(f"outbox record {lsn}: payload SHA-256 differs from its header")
    return digest


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
    rows_ = txn.cursor(db)  # headers, and the chunks that follow them
    legacy = txn.cursor(db)  # chunks of version 1 headers
    previous = start_digest
    expected = after_lsn + 1
    # The payloads of the last records read (a DeflatePrevious record is inflated with them).
    recent: dict[int, bytes] = {}
    more_legacy = legacy.set_range(legacy_chunk_key(expected, 0))
    ok = rows_.set_range(header_key(expected))
    while ok and rows_.key()[:1] == OUTBOX_HEADER_PREFIX:
        key = rows_.key()
        if len(key) != 9:
            _stray(rows_, key, expected)
        lsn = _LSN.unpack_from(key, 1)[0]
        if lsn != expected:
            raise OutboxCorrupt(f"outbox LSN gap: expected {expected}, found {lsn}")
        header = decode_header(rows.unseal(OUTBOX_TREE, key, rows_.value()), lsn)
        values = []
        for index in range(header.chunk_count):
            if not isinstance(header, OutboxHeader):
                if not rows_.next() or rows_.key() != chunk_key(lsn, index):
                    raise OutboxCorrupt(f"outbox record {lsn} is missing chunk {index}")
                values.append(rows.unseal(OUTBOX_TREE, rows_.key(), rows_.value()))
            else:
                if not more_legacy or legacy.key() != legacy_chunk_key(lsn, index):
                    raise OutboxCorrupt(f"outbox record {lsn} is missing chunk {index}")
                values.append(rows.unseal(OUTBOX_TREE, legacy.key(), legacy.value()))
                more_legacy = legacy.next()
        first = window_start(lsn)
        window = (
            [recent[n] for n in range(first, lsn)]
            if all(n in recent for n in range(first, lsn))
            else (lambda first=first, lsn=lsn: payloads(txn, db, first, lsn - 1))
        )
        entry, previous = assemble(lsn, header, values, previous, window)
        recent[lsn] = entry.payload
        recent.pop(lsn - WINDOW_RECORDS, None)
        yield entry
        expected += 1
        ok = rows_.next()
    if more_legacy:
        key = legacy.key()
        if key[:1] == OUTBOX_CHUNK_PREFIX and len(key) == 13:
            raise OutboxCorrupt(f"orphan outbox chunk {_CHUNK.unpack_from(key, 1)}")
        raise OutboxCorrupt(f"unexpected outbox key {key.hex()}")


def _stray(cursor, key: bytes, expected: int):
    """Raise for a row where header `expected` belongs: the LSN gap when its header is missing
    (the next header is another record's), else the orphan chunk."""
    while len(cursor.key()) != 9 and cursor.next() and cursor.key()[:1] == OUTBOX_HEADER_PREFIX:
        pass
    following = cursor.key()
    if following[:1] == OUTBOX_HEADER_PREFIX and len(following) == 9:
        found = _LSN.unpack_from(following, 1)[0]
        if found != expected:
            raise OutboxCorrupt(f"outbox LSN gap: expected {expected}, found {found}")
    raise OutboxCorrupt(f"orphan outbox chunk or key {key.hex()} where header {expected} belongs")


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
        header = read_header(txn, db, start)
        if header is None:
            return None
        digest = header.chain_digest
    last = OutboxSummary(start, digest, 0, 0)
    for entry in iterate(txn, db, digest, after_lsn=start):
        last = OutboxSummary(
            entry.lsn,
            entry.header.chain_digest,
            max(last.last_commit_version, entry.header.commit_version),
            last.records + 1,
        )
    return last
