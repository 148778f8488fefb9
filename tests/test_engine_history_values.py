"""History values are stored deflated with the preset dictionary when that is smaller
(DeflatedHistoryValue, version 2), else as a HistoryValue (version 1), or as the deflated row
they were read from (RowHistoryValue, version 3); all read back the same."""

from __future__ import annotations

import zlib

import pytest

from nokvfs.engine import history, rows
from nokvfs.engine.command import Delete, Put
from nokvfs.engine.compression import DICTIONARY_1, SHORT_VALUE
from nokvfs.engine.records import DeflatedHistoryValue, HistoryValue
from nokvfs.errors import CorruptRecord, UnknownVersion
from nokvfs.schema import keys
from tests.conftest import stored_rows

# A PathEntry-like value: long, and sharing structure with the dictionary.
LONG = DICTIONARY_1[100:400]


def test_short_values_and_tombstones_stay_history_values():
    assert history.encode_value(None) == HistoryValue(None).encode() == bytes.fromhex("0100")
    assert history.encode_value(b"k") == bytes.fromhex("0101000000016b")
    assert history.encode_value(b"x" * 128)[0] == 1  # 128 bytes or fewer: raw
    for value in (None, b"", b"k", b"x" * 128):
        assert history.decode_value(history.encode_value(value)) == value


def test_long_values_are_deflated_with_the_preset_dictionary():
    stored = history.encode_value(LONG)
    assert stored[0] == 2 and len(stored) < len(HistoryValue(LONG).encode()) // 2
    record = DeflatedHistoryValue.decode(stored)
    assert record.previous_length == len(LONG)
    assert zlib.decompressobj(zdict=DICTIONARY_1).decompress(record.deflated) == LONG
    assert history.decode_value(stored) == LONG
    incompressible = bytes(range(256))
    assert history.encode_value(incompressible) == HistoryValue(incompressible).encode()


def test_a_short_value_is_the_32k_window_stream_but_for_its_header_and_both_read():
    """compression.deflate gives a value of up to SHORT_VALUE bytes an 8 KiB window (a copied
    primed deflater): the stream a 32 KiB window gave but for the two header bytes, so History
    values written before it (32 KiB window) and after it read the same."""
    for value in (LONG, DICTIONARY_1[:SHORT_VALUE], DICTIONARY_1[-700:] + bytes(range(256)) * 4):
        assert len(value) <= SHORT_VALUE
        old = zlib.compressobj(6, zdict=DICTIONARY_1)
        old_stream = old.compress(value) + old.flush()
        stored = history.encode_value(value)
        new_stream = DeflatedHistoryValue.decode(stored).deflated
        assert new_stream[:1] == b"\x58" and old_stream[:1] == b"\x78"  # CINFO: 8 KiB vs 32 KiB window
        assert new_stream[2:] == old_stream[2:]
        written_before = DeflatedHistoryValue(len(value), old_stream).encode()
        assert history.decode_value(written_before) == history.decode_value(stored) == value
    # Longer values keep the 32 KiB window, in which the dictionary and the value both fit.
    longer = DICTIONARY_1 * 2
    assert DeflatedHistoryValue.decode(history.encode_value(longer)).deflated[:1] == b"\x78"
    assert history.decode_value(history.encode_value(longer)) == longer


def test_damaged_or_unknown_history_values_fail_closed():
    record = DeflatedHistoryValue.decode(history.encode_value(LONG))
    for bad in (
        DeflatedHistoryValue(record.previous_length + 1, record.deflated),  # another length
        DeflatedHistoryValue(record.previous_length - 1, record.deflated),
        DeflatedHistoryValue(record.previous_length, record.deflated[:-1]),  # truncated stream
        DeflatedHistoryValue(record.previous_length, record.deflated + b"\x00"),  # trailing bytes
    ):
        with pytest.raises(CorruptRecord):
            history.decode_value(bad.encode())
    with pytest.raises(UnknownVersion):  # 3 is RowHistoryValue since 2026-12-03
        history.decode_value(b"\x04" + history.encode_value(LONG)[1:])


def test_reads_at_every_version_through_deflated_history_after_reopen(shard_env):
    key = shard_env.root_id + b"\x07" * 20
    values = [b"\x02" + LONG, b"\x02" + LONG[::-1], None, b"\x02" + LONG[50:] + b"tail"]
    versions = {}
    for value in values:
        mutation = Put("path_current", key, value) if value else Delete("path_current", key)
        versions[shard_env.apply(mutations=[mutation]).commit_version] = value
    shard = shard_env.reopen(verify=True)
    tag = keys.FAMILY_BY_NAME["path_current"].tag
    with shard._env.begin() as txn:
        stored = [v for k, v in stored_rows(txn, shard, "history") if k[0] == tag and k[5:-8] == key]
    assert sorted(v[0] for v in stored) == [1, 1, 2, 2]  # two tombstone-or-short, two deflated
    for version, value in versions.items():
        with shard.read(version) as view:
            assert view.get("path_current", key) == value


def _plant_history_row(shard, key: bytes, version: int, stored: bytes, *, counted: bool) -> bytes:
    """Put `stored` (raw, as LMDB holds it) at the History key a change of path_current `key`
    committing at `version` writes; `counted`: also in the state digest, as a row the engine
    wrote would be."""
    from nokvfs.engine.records import SYS_STATE_DIGEST, StateDigest
    from nokvfs.engine.shard import _Digests

    history_key = keys.history_key(keys.FAMILY_BY_NAME["path_current"].tag, key, version)
    with shard._env.begin(write=True) as txn:
        txn.put(history_key, stored, db=shard._dbs["history"])
        if counted:
            digests = _Digests(shard._system(txn, SYS_STATE_DIGEST, StateDigest))
            digests.change("history", history_key, None, rows.unseal("history", history_key, stored))
            shard._put_system(txn, SYS_STATE_DIGEST, digests.record())
    return history_key


def test_a_history_row_already_where_a_command_writes_its_own_is_replaced_and_counted(shard_env):
    """A command's History key (at its new commit version) is new but for damage; a row found
    there anyway is read, verified, and replaced, and the state digest still recomputes."""
    key = shard_env.root_id + b"\x08" * 20
    first = shard_env.apply(mutations=[Put("path_current", key, b"\x02" + LONG)]).commit_version
    stray = history.encode_value(b"\x02stray")
    history_key = keys.history_key(keys.FAMILY_BY_NAME["path_current"].tag, key, first + 1)
    _plant_history_row(shard_env.shard, key, first + 1, rows.seal("history", history_key, stray), counted=True)
    second = shard_env.apply(mutations=[Put("path_current", key, b"\x02" + LONG[::-1])]).commit_version
    assert second == first + 1
    shard = shard_env.reopen(verify=True)  # the digests recompute to the stored ones
    with shard.read(first) as view:
        assert view.get("path_current", key) == b"\x02" + LONG
    with shard._env.begin() as txn:
        assert history.decode_value(shard_env.stored(txn, "history", history_key)) == b"\x02" + LONG


def test_a_damaged_history_row_where_a_command_writes_its_own_refuses_the_command(shard_env):
    from nokvfs.errors import RowCorrupt

    key = shard_env.root_id + b"\x09" * 20
    first = shard_env.apply(mutations=[Put("path_current", key, b"\x02" + LONG)]).commit_version
    _plant_history_row(shard_env.shard, key, first + 1, b"\x01" + b"\x00" * 8 + b"\x01\x00", counted=False)
    with pytest.raises(RowCorrupt):
        shard_env.apply(mutations=[Put("path_current", key, b"\x02" + LONG[::-1])])
    assert shard_env.shard.commit_version == first


MANIFEST_KEY = b"\x01" * 16 + b"\x02" * 16 + b"m" * 8


def test_a_row_stored_deflated_without_a_tail_is_kept_as_it_is():
    value = b"\x02" + LONG
    stored = rows.seal("artifact_manifest", MANIFEST_KEY, value)
    assert stored[0] == 2 and stored[13] == 0  # deflated, no raw tail
    kept = history.encode_value(value, stored)
    # Golden: u8 version 3 | u32 len(body) | the row's body (u32 len(value) | u8 0 | zlib stream).
    assert kept == b"\x03" + len(stored[9:]).to_bytes(4, "big") + stored[9:]
    assert kept[5:10].hex() == f"{len(value):08x}00" and kept[10:12] == b"\x58\xa4"
    assert len(kept) <= len(history.encode_value(value)) + 8
    assert history.decode_value(kept) == value
    rows._INFLATED.clear()
    assert history.decode_value(kept) == value  # inflated, not only remembered
    # Anything else is deflated (or kept raw) as before: a raw row, no row.
    raw_row = rows.seal("path_current", MANIFEST_KEY, value)
    for other in (raw_row, None):
        assert history.encode_value(value, other) == history.encode_value(value)
    assert history.encode_value(None, stored) == HistoryValue(None).encode()


def test_a_row_stored_deflated_with_a_raw_tail_is_kept_as_it_is_tail_included():
    # An ArtifactRevision row keeps its last 33 bytes raw (rows.DEFLATED_TREES): since 2026-12-07
    # its History value is its body too (GC and every reference change rewrite such rows).
    value = b"\x02" + LONG
    stored = rows.seal("artifact_revision", MANIFEST_KEY, value)
    assert stored[0] == 2 and stored[13] == 33
    kept = history.encode_value(value, stored)
    # Golden: u8 version 3 | u32 len(body) | the row's body (u32 len(value) | u8 33 | zlib stream
    # of the value but its last 33 bytes | those 33 bytes, raw).
    assert kept == b"\x03" + len(stored[9:]).to_bytes(4, "big") + stored[9:]
    assert kept[5:10].hex() == f"{len(value):08x}21" and kept[10:12] == b"\x58\xa4"
    assert kept.endswith(value[-33:])
    assert len(kept) <= len(history.encode_value(value)) + 40
    rows._INFLATED.clear()
    assert history.decode_value(kept) == value
    # A row sealed before 2026-12-07 kept it deflated anew: both are read.
    assert history.decode_value(history.encode_value(value)) == value


@pytest.mark.parametrize("tree", ["artifact_manifest", "artifact_revision"], ids=["no-tail", "tail"])
def test_a_damaged_row_history_value_fails_closed(tree):
    # artifact_revision rows keep a 33-byte raw tail in the body History keeps (since 2026-12-07).
    from nokvfs.engine.records import RowHistoryValue

    value = b"\x02" + LONG
    body = RowHistoryValue.decode(history.encode_value(value, rows.seal(tree, MANIFEST_KEY, value))).body
    tail = body[4]
    rows._INFLATED.clear()
    for bad in (
        body[:-1],  # truncated
        body + b"\x00",  # trailing bytes
        (len(value) + 1).to_bytes(4, "big") + body[4:],  # another length
        body[:4] + bytes([tail + 5]) + body[5:],  # a raw tail the stream then lacks
        body[:4] + bytes([tail + 1]) + body[5:],  # the tail one byte longer: the stream ends early
        body[:4] + bytes([len(body)]) + body[5:],  # a tail longer than the body
        *([body[:4] + b"\x00" + body[5:]] if tail else []),  # no tail: the stream is followed by raw bytes
        body[:3],  # shorter than its length
    ):
        with pytest.raises(CorruptRecord):
            history.decode_value(RowHistoryValue(bad).encode())


@pytest.mark.parametrize(
    "tree, key_tail",
    [("artifact_manifest", b"\x0a" * 16 + b"m" * 8), ("artifact_revision", b"\x0a" * 16)],
    ids=["manifest", "revision"],
)
def test_reads_at_every_version_through_row_history_values_after_reopen(shard_env, tree, key_tail):
    # artifact_revision: rows stored with a raw tail, whose bodies History keeps tail included.
    key = shard_env.root_id + key_tail
    values = [b"\x02" + LONG, b"\x02" + LONG[::-1], None, b"\x02" + LONG[50:] + b"tail"]
    versions = {}
    for value in values:
        mutation = Put(tree, key, value) if value else Delete(tree, key)
        versions[shard_env.apply(mutations=[mutation]).commit_version] = value
    shard = shard_env.reopen(verify=True)  # the state digest recomputes over the kept bodies
    rows._INFLATED.clear()
    tag = keys.FAMILY_BY_NAME[tree].tag
    with shard._env.begin() as txn:
        stored = [v for k, v in stored_rows(txn, shard, "history") if k[0] == tag and k[5:-8] == key]
    assert sorted(v[0] for v in stored) == [1, 1, 3, 3]  # two tombstones (the creations), two kept rows
    for version, value in versions.items():
        with shard.read(version) as view:
            assert view.get(tree, key) == value
