"""The recovery outbox's stored form from header format 2 on (StoredOutboxHeader, chunks right
after their header, payloads compressed with a preset dictionary), and stores written before it
(OutboxHeader version 1, chunks under 0x01) still opening, reading, growing and truncating."""

from __future__ import annotations

import hashlib
import zlib

import lmdb
import pytest

from nokvfs.engine import outbox, rows
from nokvfs.engine.command import Put
from nokvfs.engine.compression import DICTIONARY_1
from nokvfs.engine.records import InlineOutboxRecord, OutboxChunk, OutboxDeflatedChunk, StoredOutboxHeader
from nokvfs.engine.shard import Shard
from nokvfs.errors import OutboxCorrupt
from nokvfs.schema.enums import OutboxPayloadEncoding, OutboxRecordKind

TREE = "recovery_outbox"


def test_the_preset_dictionary_never_changes():
    # Stored records inflate only with these exact bytes: a new dictionary is a new encoding.
    assert len(DICTIONARY_1) == 4669
    assert (
        hashlib.sha256(DICTIONARY_1).hexdigest() == "8adc6a9740f606684b2a144f9988035e03359baba93d8bda7023ea80877e8f43"
    )


def test_a_small_record_is_a_raw_header_and_one_chunk_right_after_it(format_2_records):
    previous = b"\x11" * 32
    framed, digest = outbox.frame(5, OutboxRecordKind.MetadataCommand, 7, b"abc", previous)
    assert digest == outbox.chain_digest(previous, 5, OutboxRecordKind.MetadataCommand, 7, b"abc")
    sha = hashlib.sha256(b"abc").hexdigest()
    assert [(k.hex(), v.hex()) for k, v in framed] == [
        (
            "000000000000000005",
            "02" + "01" + "0000000000000007" + "00000001" + "0000000000000003" + sha + "01" + digest.hex(),
        ),
        ("00000000000000000500000000", "01" + "00000003" + "616263"),
    ]


def test_a_larger_record_is_deflated_with_the_preset_dictionary(format_2_records):
    payload = bytes(range(256)) * 2 + DICTIONARY_1[:300]
    framed, _ = outbox.frame(1, OutboxRecordKind.MetadataCommand, 1, payload, b"\0" * 32)
    header = StoredOutboxHeader.decode(framed[0][1])
    assert header.encoding == OutboxPayloadEncoding.DeflatePreset1
    stream = b"".join(OutboxChunk.decode(v).data for _, v in framed[1:])
    # RFC 1950: FDICT set, and the dictionary's Adler-32 follows the two header bytes.
    assert stream[1] & 0x20 and stream[2:6] == zlib.adler32(DICTIONARY_1).to_bytes(4, "big")
    inflater = zlib.decompressobj(zdict=DICTIONARY_1)
    assert inflater.decompress(stream) == payload
    assert len(stream) < len(zlib.compress(payload, 6))  # the dictionary is what makes it smaller


def _commands(shard_env, count, start=0):
    for i in range(start, start + count):
        # Every other value is long enough to be compressed.
        value = b"\x02" + (b"v" * 300 if i % 2 else b"v")
        shard_env.apply(mutations=[Put("path_current", i.to_bytes(16, "big"), value)])


def _as_version_1(shard, through_lsn):
    """Rewrite records 1..through_lsn in the layout written before header format 2."""
    db = shard._dbs[TREE]
    _, entries = shard.outbox_after(0, through_lsn=through_lsn)
    with shard._env.begin(write=True) as txn:
        for entry in entries:
            lsn = entry.lsn
            header = outbox.read_header(txn, db, lsn)
            for index in range(header.chunk_count):
                txn.delete(outbox.chunk_key(lsn, index), db=db)
            deflated = len(entry.payload) > outbox.COMPRESS_ABOVE
            chunk = OutboxDeflatedChunk(zlib.compress(entry.payload)) if deflated else OutboxChunk(entry.payload)
            rows.put(txn, db, TREE, outbox.header_key(lsn), entry.header.encode())  # version 1
            rows.put(txn, db, TREE, outbox.legacy_chunk_key(lsn, 0), chunk.encode())
    return entries


def _keys(shard):
    with shard._env.begin() as txn:
        return [k for k, _ in txn.cursor(shard._dbs[TREE])]


def test_a_store_written_before_header_format_2_opens_reads_grows_and_truncates(format_2_records, shard_env):
    _commands(shard_env, 6)
    tail = shard_env.shard.recovery_tail
    before = _as_version_1(shard_env.shard, tail.applied_lsn)
    assert any(k[:1] == b"\x01" for k in _keys(shard_env.shard))
    shard = shard_env.reopen(verify=True)  # the whole chain, verified
    assert shard.outbox_after(0) == (outbox.genesis_digest(shard.logical_shard_id), before)
    assert list(shard.outbox_entries()) == before
    # New records follow in the new layout; the chain runs across the two.
    _commands(shard_env, 4, start=6)
    shard = shard_env.reopen(verify=True)
    digest, entries = shard.outbox_after(0)
    assert entries[: len(before)] == before and len(entries) == len(before) + 4
    with shard._env.begin() as txn:
        versions = [outbox.read_header(txn, shard._dbs[TREE], e.lsn).VERSION for e in entries]
    assert versions == [1] * len(before) + [2] * 4
    # Truncating through a version 1 record removes its 0x01 chunks; then through the new ones.
    shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=3)
    assert min(int.from_bytes(k[1:9], "big") for k in _keys(shard) if k[:1] == b"\x01") == 4
    shard = shard_env.reopen(verify=True)
    shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=len(before) + 2)
    assert not any(k[:1] == b"\x01" for k in _keys(shard))
    shard = shard_env.reopen(verify=True)
    assert [e.lsn for e in shard.outbox_after(len(before) + 2)[1]] == list(
        range(len(before) + 3, shard.recovery_tail.applied_lsn + 1)
    )


def _rewrite(path, key, value):
    """Store `value` (sealed) at `key` of a closed shard's outbox, as damage would."""
    env = lmdb.open(path, max_dbs=64, subdir=True)
    try:
        with env.begin(write=True) as txn:
            rows.put(txn, env.open_db(TREE.encode(), txn=txn, create=False), TREE, key, value)
    finally:
        env.close()


def _stored(shard, key):
    with shard._env.begin() as txn:
        return rows.unseal(TREE, key, txn.get(key, db=shard._dbs[TREE]))


def test_an_unknown_header_version_or_encoding_refuses_to_open(format_2_records, shard_env):
    _commands(shard_env, 2)
    lsn = shard_env.shard.recovery_tail.applied_lsn
    good = _stored(shard_env.shard, outbox.header_key(lsn))
    # The second record is stored against the first (format 2, DeflatePrevious).
    assert good[0] == 2 and good[54] == OutboxPayloadEncoding.DeflatePrevious
    shard_env.shard.close()
    # Version 3 is InlineOutboxRecord (format 3): 4 is the first unknown version.
    for patched, why in ((b"\x04" + good[1:], "version 4"), (good[:54] + b"\x09" + good[55:], "OutboxPayloadEncoding")):
        _rewrite(shard_env.path, outbox.header_key(lsn), patched)
        with pytest.raises(OutboxCorrupt, match=why):
            Shard.open(shard_env.path)
    _rewrite(shard_env.path, outbox.header_key(lsn), good)
    shard_env.shard = Shard.open(shard_env.path, verify=True)


def test_a_format_2_record_whose_chunk_is_a_version_1_deflated_chunk_is_corrupt(format_2_records, shard_env):
    _commands(shard_env, 2)
    lsn = shard_env.shard.recovery_tail.applied_lsn
    good = _stored(shard_env.shard, outbox.chunk_key(lsn, 0))
    shard_env.shard.close()
    _rewrite(shard_env.path, outbox.chunk_key(lsn, 0), OutboxDeflatedChunk(b"x").encode())
    with pytest.raises(OutboxCorrupt, match=f"chunk of outbox record {lsn} does not decode"):
        Shard.open(shard_env.path)
    _rewrite(shard_env.path, outbox.chunk_key(lsn, 0), good)
    shard_env.shard = Shard.open(shard_env.path, verify=True)


def test_outbox_rows_are_appended_so_their_pages_fill_up(shard_env):
    # Header and chunk rows of a record sort after every row already there: LMDB appends them
    # instead of splitting pages in half (the headers alone used to leave half-empty pages).
    _commands(shard_env, 600)
    shard = shard_env.shard
    with shard._env.begin() as txn:
        stat = txn.stat(shard._dbs[TREE])
        stored = sum(len(k) + len(v) + 10 for k, v in txn.cursor(shard._dbs[TREE]))  # 10: LMDB's node overhead
    pages = stat["leaf_pages"] * shard._env.stat()["psize"]
    assert stored / pages > 0.85


# --- DeflatePrevious: a record stored against the payload of the record before it --------------


def test_a_record_is_stored_against_the_records_before_it_in_its_block_when_that_is_smaller(format_2_records):
    window = [b"\x02" + bytes(range(200)), b"operation" * 20, b"\x02 and more"]
    payload = b"\x02" + bytes(range(200)) + b"operation" * 20 + b"and a little more"
    assert outbox.window_start(5) == 2 and outbox.window_start(17) == 16 and outbox.window_start(32) == 32
    framed, digest = outbox.frame(5, OutboxRecordKind.MetadataCommand, 7, payload, b"\x11" * 32, window)
    header = StoredOutboxHeader.decode(framed[0][1])
    assert header.encoding == OutboxPayloadEncoding.DeflatePrevious == 3
    assert digest == outbox.chain_digest(b"\x11" * 32, 5, OutboxRecordKind.MetadataCommand, 7, payload)
    stream = b"".join(OutboxChunk.decode(v).data for _, v in framed[1:])
    # Golden: one zlib stream (level 6) primed with DICTIONARY_1 then records 2, 3 and 4's payloads.
    dictionary = DICTIONARY_1 + b"".join(window)
    assert stream[2:6] == zlib.adler32(dictionary).to_bytes(4, "big")
    deflater = zlib.compressobj(6, zdict=dictionary)
    assert stream == deflater.compress(payload) + deflater.flush()
    assert zlib.decompressobj(zdict=dictionary).decompress(stream) == payload
    assert outbox.stored_payload(5, header, [v for _, v in framed[1:]], window) == payload
    for missing in (None, window[1:]):
        with pytest.raises(OutboxCorrupt, match="not kept"):
            outbox.stored_payload(5, header, [v for _, v in framed[1:]], missing)
    # The first record of a block, a window not whole, or none: the preset dictionary alone.
    for lsn, previous in ((outbox.KEYFRAME_EVERY * 3, window), (5, window[1:]), (5, None)):
        framed, _ = outbox.frame(lsn, OutboxRecordKind.MetadataCommand, 7, payload, b"\x11" * 32, previous)
        assert StoredOutboxHeader.decode(framed[0][1]).encoding == OutboxPayloadEncoding.DeflatePreset1


def _encodings(shard):
    with shard._env.begin() as txn:
        db = shard._dbs[TREE]
        tail = shard.recovery_tail.applied_lsn
        return {
            lsn: outbox.read_header(txn, db, lsn).encoding
            for lsn in range(1, tail + 1)
            if outbox.read_header(txn, db, lsn) is not None
        }


def test_records_stored_against_the_previous_one_reopen_read_and_ship_the_same(shard_env):
    _commands(shard_env, 40)
    encodings = _encodings(shard_env.shard)
    assert OutboxPayloadEncoding.DeflatePrevious in encodings.values()
    assert all(encodings[lsn] != OutboxPayloadEncoding.DeflatePrevious for lsn in encodings if lsn % 16 == 0)
    written = list(shard_env.shard.outbox_entries())
    shard = shard_env.reopen(verify=True)  # the whole chain, verified
    assert list(shard.outbox_entries()) == written
    # Ranges starting anywhere (point reads back to the last keyframe) are the same entries.
    for start in (0, 1, 17, 30, 39):
        assert shard.outbox_after(start)[1] == written[start:]
    # A fresh process (no payload kept in memory) goes on compressing against what is stored.
    _commands(shard_env, 3, start=40)
    shard = shard_env.reopen(verify=True)
    assert len(list(shard.outbox_entries())) == len(written) + 3
    assert _encodings(shard)[shard.recovery_tail.applied_lsn] == OutboxPayloadEncoding.DeflatePrevious


@pytest.mark.parametrize("through", [5, 15, 16, 21])
def test_truncation_stores_the_first_kept_record_alone(shard_env, through):
    _commands(shard_env, 30)
    shard = shard_env.shard
    written = list(shard.outbox_entries())
    primed = {
        lsn
        for lsn, encoding in _encodings(shard).items()
        if encoding == OutboxPayloadEncoding.DeflatePrevious and outbox.window_start(lsn) <= through < lsn
    }
    assert through + 1 in primed or (through + 1) % 16 == 0
    shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=through)
    assert all(_encodings(shard)[lsn] == OutboxPayloadEncoding.DeflatePreset1 for lsn in primed)
    shard = shard_env.reopen(verify=True)
    kept = list(shard.outbox_entries())
    assert kept[: len(written) - through] == written[through:]
    assert shard.outbox_after(through)[1][: len(written) - through] == written[through:]
    # Truncating through the tail: the truncation record is not stored against a removed one.
    shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=shard.recovery_tail.applied_lsn)
    shard = shard_env.reopen(verify=True)
    assert [e.header.record_kind for e in shard.outbox_entries()] == [OutboxRecordKind.OutboxTruncate]
    _commands(shard_env, 2, start=30)
    assert len(list(shard_env.reopen(verify=True).outbox_entries())) == 3


def test_a_record_stored_against_a_damaged_previous_one_refuses_to_open(shard_env):
    _commands(shard_env, 4)
    tail = shard_env.shard.recovery_tail.applied_lsn
    assert _encodings(shard_env.shard)[tail] == OutboxPayloadEncoding.DeflatePrevious
    # The previous record's header now says "raw" for a stream: its payload (and so the
    # dictionary) no longer matches what the chain and the next record were built from.
    previous = _stored(shard_env.shard, outbox.header_key(tail - 1))
    shard_env.shard.close()
    _rewrite(shard_env.path, outbox.header_key(tail - 1), previous[:54] + b"\x01" + previous[55:])
    with pytest.raises(OutboxCorrupt):
        Shard.open(shard_env.path, verify=True)


def test_a_record_written_in_a_transaction_that_aborted_never_primes_the_next(shard_env, monkeypatch):
    """The payloads a process keeps to prime its next record describe an aborted record too
    (they are set before the commit): the next record must be primed with what is stored."""
    from nokvfs.engine import shard as shard_module

    _commands(shard_env, 5)
    shard = shard_env.shard
    real = shard_module.Shard._put_system

    def fail_on_clock(self, txn, key, value):
        if key == shard_module.SYS_CLOCK:
            raise RuntimeError("the transaction aborts after the outbox record was framed")
        return real(self, txn, key, value)

    monkeypatch.setattr(shard_module.Shard, "_put_system", fail_on_clock)
    with pytest.raises(RuntimeError):
        shard_env.apply(mutations=[Put("path_current", b"\xee" * 16, b"\x02" + b"w" * 300)])
    monkeypatch.setattr(shard_module.Shard, "_put_system", real)
    _commands(shard_env, 3, start=5)
    assert _encodings(shard)[shard.recovery_tail.applied_lsn] == OutboxPayloadEncoding.DeflatePrevious
    shard = shard_env.reopen(verify=True)
    assert [e.lsn for e in shard.outbox_entries()] == list(range(1, shard.recovery_tail.applied_lsn + 1))


# --- format 3: a record whose stored payload fits one chunk is one row --------------------------


def test_a_small_record_is_one_inline_row():
    previous = b"\x11" * 32
    framed, digest = outbox.frame(5, OutboxRecordKind.MetadataCommand, 7, b"abc", previous)
    assert digest == outbox.chain_digest(previous, 5, OutboxRecordKind.MetadataCommand, 7, b"abc")
    check = hashlib.sha256(b"abc").hexdigest()[:16]
    # u8 version 3 | u8 kind | u64 commit version | u64 payload length | 8 first bytes of the
    # payload's SHA-256 | u8 encoding | 32 chain digest | u32 length | stored payload
    assert [(k.hex(), v.hex()) for k, v in framed] == [
        (
            "000000000000000005",
            "03" + "01" + "0000000000000007" + "0000000000000003" + check + "01" + digest.hex() + "00000003" + "616263",
        )
    ]
    record = InlineOutboxRecord.decode(framed[0][1])
    assert record.chunk_count == 0 and outbox.stored_payload(5, record, []) == b"abc"


def test_inline_records_keep_the_encodings_and_rebuild_the_format_2_logical_header():
    payload = b"\x02" + bytes(range(200)) + b"operation" * 20 + b"and a little more"
    window = [b"\x02" + bytes(range(200)), b"operation" * 20, b"\x02 and more"]
    for previous, encoding in (
        (None, OutboxPayloadEncoding.DeflatePreset1),
        (window, OutboxPayloadEncoding.DeflatePrevious),
    ):
        framed, digest = outbox.frame(5, OutboxRecordKind.MetadataCommand, 7, payload, b"\x11" * 32, previous)
        (key, value), *rest = framed
        record = InlineOutboxRecord.decode(value)
        assert not rest and record.encoding == encoding and len(record.stored) < len(payload)
        entry, chain = outbox.assemble(5, record, [], b"\x11" * 32, previous)
        assert entry.payload == payload and chain == digest
        # The logical header (what packs ship) is the one a format 2 record of one chunk gives.
        assert entry.header == outbox.OutboxHeader(
            OutboxRecordKind.MetadataCommand, 7, 1, len(payload), hashlib.sha256(payload).digest(), b"\x11" * 32, digest
        )
        assert outbox.needs_previous(record) == (encoding == OutboxPayloadEncoding.DeflatePrevious)


def test_format_2_and_format_3_records_in_one_store_open_read_ship_and_truncate(
    format_2_records, shard_env, monkeypatch
):
    _commands(shard_env, 10)
    shard = shard_env.shard
    format_2 = shard.recovery_tail.applied_lsn
    monkeypatch.setattr(outbox, "INLINE_BYTES", outbox.OUTBOX_CHUNK_BYTES)  # this nokvfs from here on
    _commands(shard_env, 10, start=10)
    written = list(shard.outbox_entries())
    with shard._env.begin() as txn:
        db = shard._dbs[TREE]
        versions = [outbox.read_header(txn, db, e.lsn).VERSION for e in written]
        chunk_rows = [k for k, _ in txn.cursor(db) if len(k) == 13]
    assert versions == [2] * format_2 + [3] * (len(written) - format_2)
    assert len(chunk_rows) == format_2  # one chunk row per format 2 record, none for format 3
    assert {e.header.chunk_count for e in written} == {1}
    shard = shard_env.reopen(verify=True)  # the whole chain, verified across both formats
    assert list(shard.outbox_entries()) == written
    for start in (0, format_2 - 1, format_2, format_2 + 3):
        assert shard.outbox_after(start)[1] == written[start:]
    # Truncation across the boundary stores the first kept record alone, as one row.
    shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=format_2 + 1)
    shard = shard_env.reopen(verify=True)
    assert shard.outbox_after(format_2 + 1)[1][: len(written) - format_2 - 1] == written[format_2 + 1 :]
    with shard._env.begin() as txn:
        assert not [k for k, _ in txn.cursor(shard._dbs[TREE]) if len(k) == 13]


def test_a_record_longer_than_one_chunk_is_still_a_header_and_its_chunks(shard_env, monkeypatch):
    monkeypatch.setattr(outbox, "INLINE_BYTES", 40)
    monkeypatch.setattr(outbox, "OUTBOX_CHUNK_BYTES", 40)
    _commands(shard_env, 6)
    shard = shard_env.reopen(verify=True)
    with shard._env.begin() as txn:
        db = shard._dbs[TREE]
        versions = {outbox.read_header(txn, db, lsn).VERSION for lsn in range(1, shard.recovery_tail.applied_lsn + 1)}
    assert versions == {2, 3}
    assert len(list(shard.outbox_entries())) == shard.recovery_tail.applied_lsn


def test_a_damaged_inline_record_refuses_to_open_saying_where(shard_env):
    _commands(shard_env, 3)
    lsn = shard_env.shard.recovery_tail.applied_lsn
    good = _stored(shard_env.shard, outbox.header_key(lsn))
    assert good[0] == 3
    shard_env.shard.close()
    for patched, why in (
        (b"\x04" + good[1:], "version 4"),
        (good[:20] + bytes([good[20] ^ 1]) + good[21:], f"record {lsn}: payload SHA-256"),
        (good[:-1] + bytes([good[-1] ^ 1]), f"record {lsn}"),
        (good + b"\x00", "trailing"),
    ):
        _rewrite(shard_env.path, outbox.header_key(lsn), patched)
        with pytest.raises(OutboxCorrupt, match=why):
            Shard.open(shard_env.path)
    _rewrite(shard_env.path, outbox.header_key(lsn), good)
    # A chunk row after an inline record is an orphan.
    _rewrite(shard_env.path, outbox.chunk_key(lsn - 1, 0), OutboxChunk(b"x").encode())
    with pytest.raises(OutboxCorrupt, match="orphan outbox chunk"):
        Shard.open(shard_env.path)
    env = lmdb.open(shard_env.path, max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        txn.delete(outbox.chunk_key(lsn - 1, 0), db=env.open_db(TREE.encode(), txn=txn, create=False))
    env.close()
    shard_env.shard = Shard.open(shard_env.path, verify=True)


def test_shipping_refuses_a_damaged_inline_record(shard_env):
    _commands(shard_env, 4)
    shard = shard_env.shard
    lsn = shard.recovery_tail.applied_lsn - 1
    good = _stored(shard, outbox.header_key(lsn))
    with shard._env.begin(write=True) as txn:
        rows.put(txn, shard._dbs[TREE], TREE, outbox.header_key(lsn), good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(OutboxCorrupt, match=f"record {lsn}"):
        shard.outbox_after(lsn - 1)
    with shard._env.begin(write=True) as txn:
        rows.put(txn, shard._dbs[TREE], TREE, outbox.header_key(lsn), good)
    assert [e.lsn for e in shard.outbox_after(lsn - 1)[1]] == [lsn, lsn + 1]
