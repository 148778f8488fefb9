"""Golden bytes, round trips and fail-closed decoding of every durable value record.

The expected hex of each sample is written by hand from the declared layout (u8 version, then the
fields in order: fixed-width big-endian integers, raw ids, u32-length strings, u16-length labels,
u8 enums, u8 presence flags, u32 list counts), never computed by the codec.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nokvfs.errors import (
    CorruptRecord,
    FormatError,
    UnknownDiscriminant,
    UnknownVersion,
)
from nokvfs.schema import codec
from nokvfs.schema import records as R
from nokvfs.schema.enums import (
    BuildCommitPhase,
    ChangeEventKind,
    CommitRetirePhase,
    CommitState,
    GcClaimState,
    GcPhase,
    HistoryHoldState,
    OperationKind,
    PublishPhase,
    RestorePhase,
    RestoreSourceKind,
    RevisionState,
    RootActivationState,
    RootPlacementLifecycle,
    SnapshotState,
    StagedCleanupState,
    StagedProviderState,
    WorkspaceState,
)

A16 = b"\xa1" * 16
B16 = b"\xb2" * 16
F16 = b"\xf6" * 16
C32 = b"\xc3" * 32
D32 = b"\xd4" * 32
E32 = b"\xe5" * 32
URI = "sha256:" + "ab" * 32
URI2 = "sha256:" + "cd" * 32

# Hand-encoded fields (u32 length, then the UTF-8 bytes).
URI_HEX = "000000477368613235363a" + "6162" * 32  # 71 = 0x47 bytes: "sha256:" + 64 hex chars
URI2_HEX = "000000477368613235363a" + "6364" * 32
TEXT_PLAIN_HEX = "0000000a746578742f706c61696e"  # "text/plain"
AGENT_HEX = "000000056167656e74"  # "agent"
WB1_HEX = "0000000477622d31"  # "wb-1"
AB_HEX = "00000003612f62"  # "a/b"
X_HEX = "0000000178"  # "x"
B0102_HEX = "000000020102"  # b"\x01\x02"
EMPTY_HEX = "00000000"  # b""
IDX = R.IndexField("x", b"\x01\x02")
IDX_HEX = "00000001" + X_HEX + B0102_HEX  # list of one IndexField
T_1700000000 = "000000006553f100"  # 1_700_000_000 seconds

# name -> (sample, expected hex, offsets of every enum byte)
GOLDEN: dict[type, tuple[object, str, tuple[int, ...]]] = {
    R.RootPlacement: (
        R.RootPlacement(A16, 7, RootPlacementLifecycle.Active),
        "01" + "a1" * 16 + "0000000000000007" + "02",
        (25,),
    ),
    R.RootFence: (
        R.RootFence(A16, 7, RootActivationState.Draining),
        "01" + "a1" * 16 + "0000000000000007" + "03",
        (25,),
    ),
    R.WorkspaceCurrent: (
        R.WorkspaceCurrent(B16, 5, WorkspaceState.Staging, R.OperationRef(OperationKind.Restore, A16), 9, 10),
        "02"
        + "b2" * 16
        + "0000000000000005"
        + "01"
        + "01"
        + "03"
        + "a1" * 16
        + "0000000000000009"
        + "000000000000000a",
        (25, 27),
    ),
    R.WorkspaceIncarnationClaim: (
        R.WorkspaceIncarnationClaim("wb-1"),
        "01" + WB1_HEX,
        (),
    ),
    R.PathEntry: (
        R.PathEntry(
            generation=3,
            artifact_revision_id=A16,
            logical_size=0x100,
            body_digest_uri=URI,
            manifest_digest_uri=URI2,
            dependency_count=1,
            dependency_depth=2,
            content_type="text/plain",
            producer="agent",
            manifest_id=A16,
            created_version=4,
            modified_version=6,
            typed_index_projection=(IDX,),
        ),
        "02"
        + "0000000000000003"
        + "a1" * 16
        + "0000000000000100"
        + URI_HEX
        + URI2_HEX
        + "00000001"
        + "00000002"
        + TEXT_PLAIN_HEX
        + AGENT_HEX
        + "a1" * 16
        + "0000000000000004"
        + "0000000000000006"
        + IDX_HEX,
        (),
    ),
    R.ArtifactRevision: (
        R.ArtifactRevision(
            logical_size=0x100,
            body_digest_uri=URI,
            manifest_digest_uri=URI2,
            block_count=2,
            dependency_count=0,
            dependency_depth=0,
            dependency_digest=C32,
            content_type="text/plain",
            state=RevisionState.Available,
            reference_epoch=3,
            strong_reference_count=1,
            last_zero_ref_version=0,
            created_version=4,
        ),
        "02"
        + "0000000000000100"
        + URI_HEX
        + URI2_HEX
        + "0000000000000002"
        + "00000000"
        + "00000000"
        + "c3" * 32
        + TEXT_PLAIN_HEX
        + "01"
        + "0000000000000003"
        + "0000000000000001"
        + "0000000000000000"
        + "0000000000000004",
        (221,),
    ),
    R.RevisionRef: (
        R.RevisionRef(3, 4),
        "01" + "0000000000000003" + "0000000000000004",
        (),
    ),
    R.ArtifactManifest: (
        R.ArtifactManifest(A16, 5, "x", 0, 0x10, 0x20, URI, R.AppendSegment(2, URI2)),
        "02"
        + "a1" * 16
        + "0000000000000005"
        + X_HEX
        + "0000000000000000"
        + "0000000000000010"
        + "0000000000000020"
        + URI_HEX
        + "01"
        + "00000002"
        + URI2_HEX,
        (),
    ),
    R.Commit: (
        R.Commit(
            source_workspace_incarnation_id=B16,
            source_workbench_id="wb-1",
            projection_input_digest=C32,
            committed_at_unix_seconds=1_700_000_000,
            build_operation_id=A16,
            tree_manifest_revision=7,
            run_manifest_revision_id=F16,
            tree_digest_uri=URI,
            member_count=2,
            member_digest=D32,
            unique_revision_count=1,
            revision_digest=E32,
            parents=(C32,),
            parent_count=1,
            parent_digest=D32,
            producer="agent",
            lineage="x",
            consumer_count=1,
            consumer_epoch=2,
            last_zero_consumer_version=0,
            state=CommitState.Sealed,
            retirement_cursor=b"",
            created_version=8,
        ),
        "02"
        + "b2" * 16
        + WB1_HEX
        + "c3" * 32
        + T_1700000000
        + "a1" * 16
        + "0000000000000007"
        + "f6" * 16
        + URI_HEX
        + "0000000000000002"
        + "d4" * 32
        + "0000000000000001"
        + "e5" * 32
        + "00000001"
        + "c3" * 32
        + "00000001"
        + "d4" * 32
        + AGENT_HEX
        + X_HEX
        + "0000000000000001"
        + "0000000000000002"
        + "0000000000000000"
        + "01"
        + EMPTY_HEX
        + "0000000000000008",
        (370,),
    ),
    R.CommitMember: (
        R.CommitMember(A16, 3, URI, URI2, 0x100, 0, 0, "text/plain", "agent", A16, (IDX,)),
        "02"
        + "a1" * 16
        + "0000000000000003"
        + URI_HEX
        + URI2_HEX
        + "0000000000000100"
        + "00000000"
        + "00000000"
        + TEXT_PLAIN_HEX
        + AGENT_HEX
        + "a1" * 16
        + IDX_HEX,
        (),
    ),
    R.WorkbenchCommitHead: (
        R.WorkbenchCommitHead(C32, 2),
        "01" + "c3" * 32 + "0000000000000002",
        (),
    ),
    R.Tag: (
        R.Tag(C32, 3),
        "01" + "c3" * 32 + "0000000000000003",
        (),
    ),
    R.CommitConsumer: (
        R.CommitConsumer(2, 9),
        "01" + "0000000000000002" + "0000000000000009",
        (),
    ),
    R.SnapshotRef: (
        R.SnapshotRef(5, "nightly", 0x0102030405060708, SnapshotState.Active, 0, 1, "x"),
        "01" + "0000000000000005" + "01" + "0007"
        "6e696768746c79" + "0102030405060708" + "01" + "0000000000000000" + "0000000000000001" + "01" + X_HEX,
        (27,),
    ),
    R.SnapshotAlias: (
        R.SnapshotAlias(42, 2, SnapshotState.Retired),
        "01" + "000000000000002a" + "0000000000000002" + "01" + "04",
        (18,),
    ),
    R.HistoryHold: (
        R.HistoryHold(5, 42, HistoryHoldState.Releasing, 6),
        "01" + "0000000000000005" + "01" + "000000000000002a" + "02" + "0000000000000006",
        (18,),
    ),
    R.SecondaryIndex: (
        R.SecondaryIndex(3, b"\x01\x02"),
        "01" + "0000000000000003" + B0102_HEX,
        (),
    ),
    R.ChangeEvent: (
        R.ChangeEvent("wb-1", B16, ChangeEventKind.PathPut, "a/b", None, b"\x01\x02"),
        "02" + WB1_HEX + "b2" * 16 + "02" + "01" + AB_HEX + "00" + "01" + B0102_HEX,
        (25,),
    ),
    R.CommandDedupe: (
        R.CommandDedupe(C32, b"\x01\x02", 7, 9),
        "02" + "c3" * 32 + B0102_HEX + "0000000000000007" + "0000000000000009",
        (),
    ),
    R.RestoreMember: (
        R.RestoreMember("a/b", A16, 3, D32),
        "01" + AB_HEX + "a1" * 16 + "0000000000000003" + "d4" * 32,
        (),
    ),
    R.StagedObject: (
        R.StagedObject(A16, "x", "u1", 0x20, URI, StagedProviderState.Uploaded, StagedCleanupState.Owned),
        "01" + "a1" * 16 + X_HEX + "01" + "000000027531" + "0000000000000020" + URI_HEX + "03" + "01",
        (112, 113),
    ),
    R.GcCandidate: (
        R.GcCandidate(4, GcClaimState.Claimed, 1, "x"),
        "01" + "0000000000000004" + "02" + "00000001" + "01" + X_HEX,
        (9,),
    ),
    R.GcBarrier: (
        R.GcBarrier(3),
        "01" + "0000000000000003",
        (),
    ),
    R.PublishOperation: (
        R.PublishOperation(
            workbench_id="wb-1",
            workspace_incarnation_id=B16,
            path="a/b",
            artifact_revision_id=A16,
            expected_generation=3,
            base_revision_id=None,
            phase=PublishPhase.Finalizing,
            object_count=2,
            reused_count=0,
            logical_size=0x100,
            body_digest_uri=URI,
            content_type="text/plain",
            producer="agent",
            index_fields=(),
            event_kind=ChangeEventKind.PathPut,
            request_id=F16,
            created_version=5,
            result=None,
            terminal_error=None,
            cleanup_cursor=b"",
            expected_revision_id=B16,
        ),
        "02" + WB1_HEX + "b2" * 16 + AB_HEX + "a1" * 16 + "01"
        "0000000000000003"
        + "00"
        + "02"
        + "00000002"
        + "00000000"
        + "0000000000000100"
        + URI_HEX
        + TEXT_PLAIN_HEX
        + AGENT_HEX
        + "00000000"
        + "02"
        + "f6" * 16
        + "0000000000000005"
        + "00"
        + "00"
        + EMPTY_HEX
        + "01"
        + "b2" * 16,
        (58, 58 + 1 + 4 + 4 + 8 + len(URI_HEX) // 2 + len(TEXT_PLAIN_HEX) // 2 + len(AGENT_HEX) // 2 + 4),
    ),
    R.BuildCommitOperation: (
        R.BuildCommitOperation(
            initialization_digest=C32,
            projection_input_digest=D32,
            commit_id=E32,
            workbench_id="wb-1",
            source_workspace_incarnation_id=B16,
            read_version=5,
            tree_revision=4,
            expected_head=None,
            expected_head_generation=0,
            content_digest_uri=URI,
            manifest_digest_uri=URI2,
            replace=True,
            run_manifest_expected_generation=None,
            committed_at_unix_seconds=1_700_000_000,
            producer="agent",
            lineage="x",
            parents=(C32,),
            request_id=F16,
            phase=BuildCommitPhase.Sealing,
            run_manifest=R.RunManifestBinding(B16, A16, 0x20, URI, URI2, "text/plain", F16),
            member_cursor=b"\x01\x02",
            member_count=2,
            member_digest=D32,
            revision_cursor=b"",
            unique_revision_count=1,
            revision_digest=E32,
            parent_cursor=b"",
            parent_count=1,
            parent_digest=C32,
            cleanup_cursor=b"",
            result=None,
            terminal_error=None,
            created_version=6,
        ),
        "05"
        + "c3" * 32
        + "d4" * 32
        + "e5" * 32
        + WB1_HEX
        + "b2" * 16
        + "0000000000000005"
        + "0000000000000004"
        + "00"
        + "0000000000000000"
        + URI_HEX
        + URI2_HEX
        + "01"
        + "00"
        + T_1700000000
        + AGENT_HEX
        + X_HEX
        + "00000001"
        + "c3" * 32
        + "f6" * 16
        + "02"
        + "01"
        + "b2" * 16
        + "a1" * 16
        + "0000000000000020"
        + URI_HEX
        + URI2_HEX
        + TEXT_PLAIN_HEX
        + "f6" * 16
        + B0102_HEX
        + "0000000000000002"
        + "d4" * 32
        + EMPTY_HEX
        + "0000000000000001"
        + "e5" * 32
        + EMPTY_HEX
        + "00000001"
        + "c3" * 32
        + EMPTY_HEX
        + "00"
        + "00"
        + "0000000000000006",
        (372,),
    ),
    R.RestoreOperation: (
        R.RestoreOperation(
            identity_digest=C32,
            initialization_digest=D32,
            source_workbench_id="wb-1",
            source_workspace_incarnation_id=B16,
            source_kind=RestoreSourceKind.Snapshot,
            source_selector=R.snapshot_selector(42),
            source_read_version=5,
            destination_workbench_id="x",
            destination_workspace_incarnation_id=A16,
            restore_manifest_entry=b"\x01\x02",
            phase=RestorePhase.Copying,
            source_cursor=b"",
            member_sequence=3,
            source_eof=False,
            member_count=0,
            member_digest=R.ZERO_DIGEST,
            cleanup_cursor=b"",
            result=None,
            terminal_error=None,
            created_version=6,
        ),
        "04" + "c3" * 32 + "d4" * 32 + WB1_HEX + "b2" * 16 + "01" + "00000008"
        "000000000000002a"
        + "0000000000000005"
        + X_HEX
        + "a1" * 16
        + B0102_HEX
        + "02"
        + EMPTY_HEX
        + "0000000000000003"
        + "00"
        + "0000000000000000"
        + "00" * 32
        + EMPTY_HEX
        + "00"
        + "00"
        + "0000000000000006",
        (89, 137),
    ),
    R.CommitRetireOperation: (
        R.CommitRetireOperation(C32, 4, CommitRetirePhase.Releasing, b"", b"\x01\x02", b"", 2, 1, 0, None, "x", 7),
        "01"
        + "c3" * 32
        + "0000000000000004"
        + "02"
        + EMPTY_HEX
        + B0102_HEX
        + EMPTY_HEX
        + "0000000000000002"
        + "0000000000000001"
        + "0000000000000000"
        + "00"
        + "01"
        + X_HEX
        + "0000000000000007",
        (41,),
    ),
    R.GcOperation: (
        R.GcOperation(A16, 3, GcPhase.Deleting, 2, b"\x01\x02", 1, b"", b"\x01\x02", None, 8),
        "01"
        + "a1" * 16
        + "0000000000000003"
        + "03"
        + "0000000000000002"
        + B0102_HEX
        + "0000000000000001"
        + EMPTY_HEX
        + "01"
        + B0102_HEX
        + "00"
        + "0000000000000008",
        (25,),
    ),
}

EXPECTED_VERSIONS = {
    R.WorkspaceCurrent: 2,
    R.PathEntry: 2,
    R.ArtifactRevision: 2,
    R.ArtifactManifest: 2,
    R.Commit: 2,
    R.CommitMember: 2,
    R.ChangeEvent: 2,
    R.CommandDedupe: 2,
    R.BuildCommitOperation: 5,
    R.RestoreOperation: 4,
    # nokvfs extension: version 2 adds the exact expected revision (README, "Durable format").
    R.PublishOperation: 2,
}

ALL = list(R.ALL_VALUE_RECORDS)
IDS = [cls.__name__ for cls in ALL]


def _has_enum(codec_):
    if isinstance(codec_, codec.EnumField):
        return True
    if isinstance(codec_, (codec.Optional, codec.ListOf)):
        return _has_enum(codec_.inner)
    if isinstance(codec_, codec.Nested):
        return any(_has_enum(c) for _, c in codec_.record_type.__codec_fields__)
    return False


def test_every_value_record_has_a_golden_sample():
    assert set(GOLDEN) == set(R.ALL_VALUE_RECORDS)
    assert len(R.ALL_VALUE_RECORDS) == len(set(R.ALL_VALUE_RECORDS)) == 28


def test_every_record_with_an_enum_lists_its_enum_offsets():
    for cls in ALL:
        has_enum = any(_has_enum(c) for _, c in cls.__codec_fields__)
        assert bool(GOLDEN[cls][2]) == has_enum, cls.__name__


def test_value_versions_follow_the_registry_reading():
    for cls in ALL:
        assert cls.VERSION == EXPECTED_VERSIONS.get(cls, 1), cls.__name__
    for cls in R.NESTED_RECORDS:
        assert cls.VERSION is None


def test_record_names_are_unique_among_all_codec_records():
    names = [cls.__name__ for cls in codec.ALL_RECORDS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_golden_bytes(cls):
    sample, expected_hex, _ = GOLDEN[cls]
    assert type(sample) is cls
    assert sample.encode().hex() == expected_hex
    assert cls.decode(bytes.fromhex(expected_hex)) == sample


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_round_trip(cls):
    sample = GOLDEN[cls][0]
    assert cls.decode(sample.encode()) == sample
    assert cls.decode(bytearray(sample.encode())) == sample


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_unknown_version_fails_closed(cls):
    data = bytearray(GOLDEN[cls][0].encode())
    for version in {0, cls.VERSION - 1, cls.VERSION + 1, 0xFF} - {cls.VERSION}:
        data[0] = version
        with pytest.raises(UnknownVersion):
            cls.decode(bytes(data))


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_truncated_and_trailing_bytes_are_corrupt(cls):
    data = GOLDEN[cls][0].encode()
    for n in range(len(data)):
        with pytest.raises(CorruptRecord):
            cls.decode(data[:n])
    with pytest.raises(CorruptRecord):
        cls.decode(data + b"\x00")


@pytest.mark.parametrize("cls", [c for c in ALL if GOLDEN[c][2]], ids=lambda c: c.__name__)
def test_unknown_discriminant_fails_closed(cls):
    sample, expected_hex, offsets = GOLDEN[cls]
    data = bytes.fromhex(expected_hex)
    for offset in offsets:
        assert 1 <= data[offset] <= 11, f"{cls.__name__}: offset {offset} is not an enum byte"
        for bad in (0, 0xEE):
            patched = bytearray(data)
            patched[offset] = bad
            with pytest.raises(UnknownDiscriminant):
                cls.decode(bytes(patched))


def test_presence_and_flag_bytes_other_than_0_or_1_are_corrupt():
    data = bytearray(GOLDEN[R.HistoryHold][0].encode())
    data[9] = 2  # source_snapshot_id presence byte
    with pytest.raises(CorruptRecord):
        R.HistoryHold.decode(bytes(data))
    data = bytearray(GOLDEN[R.RestoreOperation][0].encode())
    eof_offset = 137 + 1 + 4 + 8
    assert data[eof_offset] == 0
    data[eof_offset] = 2
    with pytest.raises(CorruptRecord):
        R.RestoreOperation.decode(bytes(data))


def test_a_list_count_beyond_the_remaining_bytes_is_corrupt():
    data = bytearray(GOLDEN[R.PathEntry][0].encode())
    count_at = len(data) - len(bytes.fromhex(IDX_HEX))
    data[count_at : count_at + 4] = b"\xff\xff\xff\xff"
    with pytest.raises(CorruptRecord):
        R.PathEntry.decode(bytes(data))


def test_invalid_utf8_text_is_corrupt():
    data = bytearray(GOLDEN[R.WorkspaceIncarnationClaim][0].encode())
    data[5] = 0xFF
    with pytest.raises(CorruptRecord):
        R.WorkspaceIncarnationClaim.decode(bytes(data))


def test_encoding_rejects_values_outside_their_field_type():
    with pytest.raises(CorruptRecord):
        R.GcBarrier(1 << 64).encode()
    with pytest.raises(CorruptRecord):
        R.RevisionRef(-1, 0).encode()
    with pytest.raises(CorruptRecord):
        R.Tag(b"\x00" * 31, 1).encode()
    with pytest.raises(CorruptRecord):
        R.WorkspaceIncarnationClaim("\ud800").encode()
    with pytest.raises(CorruptRecord):
        R.RootFence(A16, 1, RootPlacementLifecycle.Active).encode()  # the other lifecycle enum


# --- operations ------------------------------------------------------------------------------


def test_operation_records_cover_every_kind():
    assert set(R.OPERATION_RECORDS) == set(OperationKind)
    assert R.OPERATION_RECORDS[OperationKind.Publish] is R.PublishOperation
    assert R.OPERATION_RECORDS[OperationKind.BuildCommit] is R.BuildCommitOperation
    assert R.OPERATION_RECORDS[OperationKind.Restore] is R.RestoreOperation
    assert R.OPERATION_RECORDS[OperationKind.CommitRetire] is R.CommitRetireOperation
    assert R.OPERATION_RECORDS[OperationKind.Gc] is R.GcOperation
    assert all(R.OPERATION_KIND_OF[cls] == kind for kind, cls in R.OPERATION_RECORDS.items())


def test_decode_operation_dispatches_by_kind():
    for kind, cls in R.OPERATION_RECORDS.items():
        sample = GOLDEN[cls][0]
        assert R.decode_operation(kind, sample.encode()) == sample
        assert R.decode_operation(int(kind), sample.encode()) == sample
    with pytest.raises(UnknownDiscriminant):
        R.decode_operation(9, GOLDEN[R.GcOperation][0].encode())
    with pytest.raises(FormatError):  # a Gc value under the Publish kind does not decode
        R.decode_operation(OperationKind.Publish, GOLDEN[R.GcOperation][0].encode())


def test_restore_selector_width_is_bound_to_the_source_kind():
    sample = GOLDEN[R.RestoreOperation][0]
    assert sample.source_snapshot_id == 42 and sample.source_commit_id is None
    commit = dataclasses.replace(sample, source_kind=RestoreSourceKind.Commit, source_selector=C32)
    assert commit.source_commit_id == C32 and commit.source_snapshot_id is None
    assert R.RestoreOperation.decode(commit.encode()) == commit
    with pytest.raises(CorruptRecord):
        dataclasses.replace(sample, source_kind=RestoreSourceKind.Commit)  # 8-byte selector
    with pytest.raises(CorruptRecord):
        dataclasses.replace(sample, source_selector=C32)
    data = bytearray(sample.encode())
    data[89] = int(RestoreSourceKind.Commit)  # durable bytes with a mismatched selector
    with pytest.raises(CorruptRecord):
        R.RestoreOperation.decode(bytes(data))
    with pytest.raises(CorruptRecord):
        R.snapshot_selector(1 << 64)


def test_path_current_is_the_path_entry_record():
    assert R.PathCurrent is R.PathEntry


# --- generated round trips -------------------------------------------------------------------


def _strategy(c: codec.FieldCodec):
    if isinstance(c, codec.UInt):
        return st.integers(0, c.max)
    if isinstance(c, codec.Bool):
        return st.booleans()
    if isinstance(c, codec.FixedBytes):
        return st.binary(min_size=c.length, max_size=c.length)
    if isinstance(c, codec.LenStr):
        return st.text(max_size=12)
    if isinstance(c, codec.LenBytes):
        return st.one_of(st.binary(max_size=12), st.binary(min_size=8, max_size=8), st.binary(min_size=32, max_size=32))
    if isinstance(c, codec.EnumField):
        return st.sampled_from(list(c.enum_type))
    if isinstance(c, codec.Optional):
        return st.none() | _strategy(c.inner)
    if isinstance(c, codec.ListOf):
        return st.lists(_strategy(c.inner), max_size=3).map(tuple)
    if isinstance(c, codec.Nested):
        return _record_strategy(c.record_type)
    raise AssertionError(f"no strategy for {c!r}")


def _record_strategy(cls):
    return st.fixed_dictionaries({name: _strategy(c) for name, c in cls.__codec_fields__})


@st.composite
def _instances(draw, cls):
    fields = draw(_record_strategy(cls))

    def build(record_type, values):
        out = {}
        for name, c in record_type.__codec_fields__:
            out[name] = _materialize(c, values[name])
        return record_type(**out)

    def _materialize(c, value):
        if isinstance(c, codec.Nested):
            return build(c.record_type, value)
        if isinstance(c, codec.Optional) and value is not None:
            return _materialize(c.inner, value)
        if isinstance(c, codec.ListOf):
            return tuple(_materialize(c.inner, v) for v in value)
        return value

    try:
        return build(cls, fields)
    except CorruptRecord:
        assume(False)


@pytest.mark.parametrize("cls", ALL, ids=IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_generated_round_trip(cls, data):
    sample = data.draw(_instances(cls))
    encoded = sample.encode()
    assert encoded[0] == cls.VERSION
    assert cls.decode(encoded) == sample
    with pytest.raises(CorruptRecord):
        cls.decode(encoded[:-1])
