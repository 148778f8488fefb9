"""Golden bytes, round trips and fail-closed decoding of the records only the engine writes: System
rows, History values, the recovery outbox framing and the logical outbox records.

As in tests/test_records.py the expected hex is written by hand from the declared layout (u8 value
version, then the fields in order), never computed by the codec.
"""

from __future__ import annotations

import inspect

import pytest

from nokvfs.engine import records as E
from nokvfs.errors import CorruptRecord, UnknownDiscriminant, UnknownVersion
from nokvfs.schema.enums import MutationKind, OutboxPayloadEncoding, OutboxRecordKind, PredicateKind, RetainedFamily

A16 = b"\xa1" * 16
B16 = b"\xb2" * 16
C32 = b"\xc3" * 32
D32 = b"\xd4" * 32
E32 = b"\xe5" * 32
X_HEX = "0000000178"  # "x" (u32 length)
K_HEX = "000000016b"  # b"k"

# record -> (sample, expected hex, offsets of enum bytes)
GOLDEN = {
    E.SchemaMarker: (E.SchemaMarker(1, "x", 8), "0100000001" + X_HEX + "00000008", ()),
    E.TreeRegistry: (
        E.TreeRegistry((E.TreeEntry("x", 3), E.TreeEntry("x", 0))),
        "0100000002" + X_HEX + "03" + X_HEX + "00",
        (),
    ),
    E.ShardIdentity: (E.ShardIdentity(A16, 7), "01" + "a1" * 16 + "0000000000000007", ()),
    E.CommitClock: (E.CommitClock(9), "010000000000000009", ()),
    E.RecoveryTail: (E.RecoveryTail(5, C32), "010000000000000005" + "c3" * 32, ()),
    E.OwnerRecord: (E.OwnerRecord(2), "010000000000000002", ()),
    E.LeaseClock: (E.LeaseClock(1_700_000_000_000), "010000018bcfe56800", ()),
    E.HistoryFloor: (E.HistoryFloor(12), "01000000000000000c", ()),
    E.StateDigest: (
        E.StateDigest((E.TreeDigest("x", 3, C32),)),
        "0100000001" + X_HEX + "0000000000000003" + "c3" * 32,
        (),
    ),
    E.HistoryValue: (E.HistoryValue(b"k"), "0101" + K_HEX, ()),
    E.DeflatedHistoryValue: (E.DeflatedHistoryValue(3, b"k"), "02" + "00000003" + K_HEX, ()),
    E.RowHistoryValue: (E.RowHistoryValue(b"k"), "03" + K_HEX, ()),
    E.DeflatedCommandDedupe: (
        E.DeflatedCommandDedupe(C32, 3, b"k", 4, 5),
        "03" + "c3" * 32 + "00000003" + K_HEX + "0000000000000004" + "0000000000000005",
        (),
    ),
    E.OutboxHeader: (
        E.OutboxHeader(OutboxRecordKind.HistoryPrune, 6, 1, 40, C32, D32, E32),
        "01040000000000000006000000010000000000000028" + "c3" * 32 + "d4" * 32 + "e5" * 32,
        (1,),
    ),
    E.StoredOutboxHeader: (
        E.StoredOutboxHeader(OutboxRecordKind.HistoryPrune, 6, 1, 40, C32, OutboxPayloadEncoding.DeflatePreset1, E32),
        "02040000000000000006000000010000000000000028" + "c3" * 32 + "02" + "e5" * 32,
        (1, 54),
    ),
    E.InlineOutboxRecord: (
        E.InlineOutboxRecord(
            OutboxRecordKind.HistoryPrune, 6, 40, C32[:8], OutboxPayloadEncoding.DeflatePrevious, E32, b"k"
        ),
        "0304" + "0000000000000006" + "0000000000000028" + "c3" * 8 + "03" + "e5" * 32 + K_HEX,
        (1, 26),
    ),
    E.OutboxChunk: (E.OutboxChunk(b"k"), "01" + K_HEX, ()),
    E.OutboxDeflatedChunk: (E.OutboxDeflatedChunk(b"k"), "02" + K_HEX, ()),
    E.RetentionFloors: (
        E.RetentionFloors(3, C32, 2, 9, 1_700_000_000_000, 8),
        "010000000000000003" + "c3" * 32 + "000000000000000200000000000000090000018bcfe568000000000000000008",
        (),
    ),
    E.OutboxTruncateRecord: (
        E.OutboxTruncateRecord(
            owner_epoch=2, through_lsn=5, through_chain_digest=C32, through_commit_version=4, removed_records=5
        ),
        "0100000000000000020000000000000005" + "c3" * 32 + "00000000000000040000000000000005",
        (),
    ),
    E.RetentionPruneRecord: (
        E.RetentionPruneRecord(
            owner_epoch=2,
            family=RetainedFamily.CommandDedupe,
            floor_version=17,
            horizon_ms=1_700_000_000_000,
            start_key=b"",
            end_key=None,
            pruned_rows=3,
            pruned_digest=C32,
        ),
        "0100000000000000020200000000000000110000018bcfe5680000000000000000000000000003" + "c3" * 32,
        (9,),
    ),
    E.CommandRecord: (
        E.CommandRecord(
            schema_id="x",
            root_id=A16,
            logical_shard_id=B16,
            placement_generation=1,
            owner_epoch=2,
            request_id=A16,
            command_digest=C32,
            read_version=3,
            commit_version=4,
            fence_install=False,
            predicates=(E.PredicateRow(PredicateKind.Exists, "x", b"k", None, None, None, None),),
            mutations=(E.MutationRow(MutationKind.Put, "x", b"k", b"k"),),
            events=(b"k",),
            result=b"",
        ),
        "02" + X_HEX + "a1" * 16 + "b2" * 16 + "0000000000000001"
        "0000000000000002" + "a1" * 16 + "c3" * 32 + "0000000000000003"
        "0000000000000004"
        "00" + "00000001"
        "01" + X_HEX + K_HEX + "00"
        "00"
        "00"
        "00" + "00000001"
        "01" + X_HEX + K_HEX + "01" + K_HEX + "00000001" + K_HEX + "00000000",
        (123, 142),
    ),
    E.LeaseClockRecord: (E.LeaseClockRecord(1_700_000_000_000), "020000018bcfe56800", ()),
    E.OwnerEpochRecord: (E.OwnerEpochRecord(3), "020000000000000003", ()),
    E.HistoryPruneRecord: (
        E.HistoryPruneRecord(
            owner_epoch=2, floor_version=17, start_key=b"", end_key=b"k", pruned_rows=4096, pruned_digest=C32
        ),
        "02000000000000000200000000000000110000000001" + K_HEX + "0000000000001000" + "c3" * 32,
        (),
    ),
}

ENGINE_VALUE_RECORDS = [
    cls
    for _, cls in inspect.getmembers(E, inspect.isclass)
    if cls.__module__ == E.__name__ and getattr(cls, "VERSION", None) is not None
]
IDS = [cls.__name__ for cls in GOLDEN]


def test_every_engine_value_record_has_a_golden_sample():
    assert set(GOLDEN) == set(ENGINE_VALUE_RECORDS)


@pytest.mark.parametrize("cls", list(GOLDEN), ids=IDS)
def test_golden_bytes_and_round_trip(cls):
    sample, expected_hex, _ = GOLDEN[cls]
    assert sample.encode().hex() == expected_hex
    assert cls.decode(bytes.fromhex(expected_hex)) == sample


@pytest.mark.parametrize("cls", list(GOLDEN), ids=IDS)
def test_unknown_versions_truncation_and_trailing_bytes_fail_closed(cls):
    data = bytes.fromhex(GOLDEN[cls][1])
    for version in {0, cls.VERSION - 1, cls.VERSION + 1, 0xFF} - {cls.VERSION}:
        with pytest.raises(UnknownVersion):
            cls.decode(bytes([version]) + data[1:])
    for n in range(len(data)):
        with pytest.raises(CorruptRecord):
            cls.decode(data[:n])
    with pytest.raises(CorruptRecord):
        cls.decode(data + b"\x00")


@pytest.mark.parametrize("cls", [c for c in GOLDEN if GOLDEN[c][2]], ids=lambda c: c.__name__)
def test_unknown_discriminants_fail_closed(cls):
    _, expected_hex, offsets = GOLDEN[cls]
    data = bytes.fromhex(expected_hex)
    for offset in offsets:
        assert 1 <= data[offset] <= 6, f"{cls.__name__}: offset {offset} is not an enum byte"
        for bad in (0, 0xEE):
            patched = bytearray(data)
            patched[offset] = bad
            with pytest.raises(UnknownDiscriminant):
                cls.decode(bytes(patched))


def test_an_outbox_header_of_a_kind_after_history_prune_is_refused():
    data = bytearray(bytes.fromhex(GOLDEN[E.OutboxHeader][1]))
    data[1] = max(OutboxRecordKind) + 1
    with pytest.raises(UnknownDiscriminant, match="OutboxRecordKind"):
        E.OutboxHeader.decode(bytes(data))


def test_a_history_prune_record_end_key_presence_byte_other_than_0_or_1_is_corrupt():
    data = bytearray(bytes.fromhex(GOLDEN[E.HistoryPruneRecord][1]))
    assert data[21] == 1  # version, epoch, floor, empty start key, then the end key's presence
    data[21] = 2
    with pytest.raises(CorruptRecord):
        E.HistoryPruneRecord.decode(bytes(data))
