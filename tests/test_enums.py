"""The durable enum registry: the seed's discriminants, exactly, and fail-closed decoding."""

from __future__ import annotations

from enum import IntEnum

import pytest

from nokvfs.errors import FormatError, UnknownDiscriminant
from nokvfs.schema import enums
from nokvfs.schema.enums import decode_enum

# Transcribed by hand from the seed's "Initial durable enum discriminants" table, independently of
# nokvfs.schema.enums. "These numeric values are the complete initial registry."
SEED_TABLE = """
WorkspaceState:  Staging=1, Visible=2, Retired=3
RevisionState:   Available=1, Deleting=2, Deleted=3, Quarantined=4
CommitState:     Sealed=1, Retiring=2, Retired=3
SnapshotState:   Active=1, ReapClaimed=2, Reaped=3, Retired=4
ReferenceKind:   Path=1, Commit=2, RevisionDependency=3
HistoryHoldKind: Snapshot=1, BuildCommit=2, Restore=3
HistoryHoldState: Active=1, Releasing=2
RootActivationState: Installing=1, Active=2, Draining=3, Fenced=4
RootPlacementLifecycle: Provisioning=1, Active=2, Draining=3, Retired=4
CommitConsumerKind: WorkbenchHead=1, Tag=2, Lease=3, ChildCommit=4
RestoreSourceKind: Snapshot=1, Commit=2
OperationKind:   Publish=1, BuildCommit=2, Restore=3, CommitRetire=4, Gc=5
PublishPhase:    Uploading=1, Finalizing=2, Published=3, Aborting=4,
                 Cleaning=5, Cleaned=6, Quarantined=7
BuildCommitPhase: Building=1, Sealing=2, Complete=3, Aborting=4,
                  Cleaning=5, Cleaned=6, Quarantined=7
RestorePhase:    Preparing=1, Copying=2, SourceSealed=3, Ready=4,
                 Complete=5, Aborting=6, Cleaning=7, Cleaned=8,
                 Quarantined=9
CommitRetirePhase: Claiming=1, Releasing=2, Complete=3, Quarantined=4
GcPhase:         Queued=1, Claimed=2, Deleting=3, Deleted=4, Quarantined=5
StagedProviderState: Planned=1, Uploading=2, Uploaded=3, AbortPending=4,
                     Aborted=5, Ambiguous=6
StagedCleanupState: Owned=1, DeletePending=2, Deleted=3, Quarantined=4
GcClaimState:    Candidate=1, Claimed=2, Complete=3, Quarantined=4
"""


def _parse_table(text: str) -> dict[str, dict[str, int]]:
    """Parse the table as printed in the seed, continuation lines included."""
    table: dict[str, dict[str, int]] = {}
    current = None
    for line in text.strip().splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip().isidentifier() and not line[0].isspace():
            current = head.strip()
            table[current] = {}
        else:
            rest = line
        for item in rest.split(","):
            item = item.strip()
            if item:
                name, _, value = item.partition("=")
                table[current][name.strip()] = int(value)
    return table


SEED = _parse_table(SEED_TABLE)


def test_table_transcription_is_complete():
    assert len(SEED) == 20
    assert sum(len(members) for members in SEED.values()) == 87
    assert SEED["RestorePhase"]["Quarantined"] == 9
    assert SEED["StagedProviderState"]["Ambiguous"] == 6


@pytest.mark.parametrize("enum_name", list(SEED))
def test_seed_discriminants_exact(enum_name):
    enum_type = getattr(enums, enum_name)
    assert issubclass(enum_type, IntEnum)
    # Exactly these members, no more and no fewer, with exactly these values.
    assert {m.name: m.value for m in enum_type} == SEED[enum_name]


def test_seed_registry_lists_every_seed_enum_in_order():
    assert [e.__name__ for e in enums.SEED_REGISTRY] == list(SEED)
    assert enums.REGISTRY[: len(enums.SEED_REGISTRY)] == enums.SEED_REGISTRY
    names = [e.__name__ for e in enums.REGISTRY]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("enum_type", enums.REGISTRY, ids=lambda e: e.__name__)
def test_every_registered_member_decodes_to_itself(enum_type):
    for member in enum_type:
        decoded = decode_enum(enum_type, member.value)
        assert decoded is member and type(decoded) is enum_type


@pytest.mark.parametrize("enum_type", enums.REGISTRY, ids=lambda e: e.__name__)
def test_unknown_discriminants_fail_closed(enum_type):
    top = max(m.value for m in enum_type)
    for unknown in (0, top + 1, top + 100, 255, 256, -1):
        with pytest.raises(UnknownDiscriminant):
            decode_enum(enum_type, unknown)


def test_unknown_discriminant_is_a_format_error_naming_the_enum():
    with pytest.raises(FormatError, match="WorkspaceState"):
        decode_enum(enums.WorkspaceState, 4)


def test_same_names_in_different_enums_are_not_interchangeable():
    # RootPlacementLifecycle.Active and RootActivationState.Active are different enums.
    assert enums.RootPlacementLifecycle.Active is not enums.RootActivationState.Active
    assert decode_enum(enums.RootPlacementLifecycle, 4) is enums.RootPlacementLifecycle.Retired
    with pytest.raises(UnknownDiscriminant):
        decode_enum(enums.RootActivationState, 5)


def test_path_attributes_changed_is_extension_discriminant_12_in_a_change_event():
    """The metadata-only change event (README "Durable format"): golden bytes, decode, and the
    next value still refused."""
    from nokvfs.schema.records import ChangeEvent

    assert enums.ChangeEventKind.PathAttributesChanged == 12
    assert max(enums.ChangeEventKind) is enums.ChangeEventKind.PathAttributesChanged
    revision = bytes(range(16))
    event = ChangeEvent("wb-1", b"\xb2" * 16, enums.ChangeEventKind.PathAttributesChanged, "a/b", revision, revision)
    expected = (
        "02"
        + "00000004"
        + b"wb-1".hex()
        + "b2" * 16
        + "0c"  # value version 2, workbench, incarnation, kind 12
        + "01"
        + "00000003"
        + b"a/b".hex()
        + ("01" + "00000010" + revision.hex()) * 2
    )
    assert event.encode().hex() == expected
    assert ChangeEvent.decode(bytes.fromhex(expected)) == event
    unknown = bytearray.fromhex(expected)
    unknown[25] = 13
    with pytest.raises(UnknownDiscriminant):
        ChangeEvent.decode(bytes(unknown))
