"""The complete durable enum registry with the seed's discriminants.

The seed's registry is listed first, exactly. Enums nokvfs adds for engine framing (change-event
kinds, outbox record kinds, predicate kinds) are listed after it under EXTENSIONS and documented
in the README's "Durable format" section; they follow the same rule: unknown values fail closed.
"""

from __future__ import annotations

from enum import IntEnum

from nokvfs.errors import UnknownDiscriminant


class WorkspaceState(IntEnum):
    Staging = 1
    Visible = 2
    Retired = 3


class RevisionState(IntEnum):
    Available = 1
    Deleting = 2
    Deleted = 3
    Quarantined = 4


class CommitState(IntEnum):
    Sealed = 1
    Retiring = 2
    Retired = 3


class SnapshotState(IntEnum):
    Active = 1
    ReapClaimed = 2
    Reaped = 3
    Retired = 4


class ReferenceKind(IntEnum):
    Path = 1
    Commit = 2
    RevisionDependency = 3


class HistoryHoldKind(IntEnum):
    Snapshot = 1
    BuildCommit = 2
    Restore = 3


class HistoryHoldState(IntEnum):
    Active = 1
    Releasing = 2


class RootActivationState(IntEnum):
    Installing = 1
    Active = 2
    Draining = 3
    Fenced = 4


class RootPlacementLifecycle(IntEnum):
    Provisioning = 1
    Active = 2
    Draining = 3
    Retired = 4


class CommitConsumerKind(IntEnum):
    WorkbenchHead = 1
    Tag = 2
    Lease = 3
    ChildCommit = 4


class RestoreSourceKind(IntEnum):
    Snapshot = 1
    Commit = 2


class OperationKind(IntEnum):
    Publish = 1
    BuildCommit = 2
    Restore = 3
    CommitRetire = 4
    Gc = 5


class PublishPhase(IntEnum):
    Uploading = 1
    Finalizing = 2
    Published = 3
    Aborting = 4
    Cleaning = 5
    Cleaned = 6
    Quarantined = 7


class BuildCommitPhase(IntEnum):
    Building = 1
    Sealing = 2
    Complete = 3
    Aborting = 4
    Cleaning = 5
    Cleaned = 6
    Quarantined = 7


class RestorePhase(IntEnum):
    Preparing = 1
    Copying = 2
    SourceSealed = 3
    Ready = 4
    Complete = 5
    Aborting = 6
    Cleaning = 7
    Cleaned = 8
    Quarantined = 9


class CommitRetirePhase(IntEnum):
    Claiming = 1
    Releasing = 2
    Complete = 3
    Quarantined = 4


class GcPhase(IntEnum):
    Queued = 1
    Claimed = 2
    Deleting = 3
    Deleted = 4
    Quarantined = 5


class StagedProviderState(IntEnum):
    Planned = 1
    Uploading = 2
    Uploaded = 3
    AbortPending = 4
    Aborted = 5
    Ambiguous = 6


class StagedCleanupState(IntEnum):
    Owned = 1
    DeletePending = 2
    Deleted = 3
    Quarantined = 4


class GcClaimState(IntEnum):
    Candidate = 1
    Claimed = 2
    Complete = 3
    Quarantined = 4


SEED_REGISTRY: tuple[type[IntEnum], ...] = (
    WorkspaceState,
    RevisionState,
    CommitState,
    SnapshotState,
    ReferenceKind,
    HistoryHoldKind,
    HistoryHoldState,
    RootActivationState,
    RootPlacementLifecycle,
    CommitConsumerKind,
    RestoreSourceKind,
    OperationKind,
    PublishPhase,
    BuildCommitPhase,
    RestorePhase,
    CommitRetirePhase,
    GcPhase,
    StagedProviderState,
    StagedCleanupState,
    GcClaimState,
)


# --- nokvfs extensions (engine framing; documented in the README's "Durable format" section) ------------------------


class ChangeEventKind(IntEnum):
    """The typed event of a ChangeEvent row."""

    WorkspaceCreated = 1
    PathPut = 2
    PathRemoved = 3
    PathRenamed = 4
    PathAppended = 5
    SnapshotMinted = 6
    SnapshotRetired = 7
    CommitPublished = 8
    TagSet = 9
    TagDeleted = 10
    WorkspaceRestored = 11
    # A metadata-only change of a path (mode, owner, times): before = after = its revision id.
    PathAttributesChanged = 12


class OutboxRecordKind(IntEnum):
    """The shard-local write entrypoints the recovery outbox covers: the seed's three, and the
    nokvfs retention entrypoints (replicas must remove exactly the same rows): History pruning,
    outbox truncation, and ChangeEvent / CommandDedupe retention."""

    MetadataCommand = 1
    LeaseClockObservation = 2
    OwnerEpochAdvance = 3
    HistoryPrune = 4
    OutboxTruncate = 5
    RetentionPrune = 6


class RetainedFamily(IntEnum):
    """The engine-written families a RetentionPrune record removes rows of."""

    ChangeEvent = 1
    CommandDedupe = 2


class OutboxPayloadEncoding(IntEnum):
    """How an outbox record's chunks (header version 2) store its payload."""

    Raw = 1
    # One zlib stream (RFC 1950) compressed with the preset dictionary
    # nokvfs.engine.compression.DICTIONARY_1.
    DeflatePreset1 = 2
    # One zlib stream primed with DICTIONARY_1 followed by the payloads of up to three records
    # before it in its block of 16 LSNs (nokvfs.engine.outbox.window_start; the last 32 KiB:
    # zlib's window). A publish's three commands repeat most of their rows.
    DeflatePrevious = 3


class PredicateKind(IntEnum):
    """Typed predicates of a MetadataCommand, as framed in its logical outbox record."""

    Exists = 1
    Absent = 2
    ValueEquals = 3
    FieldEquals = 4
    Generation = 5
    State = 6


class MutationKind(IntEnum):
    Put = 1
    Delete = 2


EXTENSIONS: tuple[type[IntEnum], ...] = (
    ChangeEventKind,
    OutboxRecordKind,
    RetainedFamily,
    OutboxPayloadEncoding,
    PredicateKind,
    MutationKind,
)

REGISTRY: tuple[type[IntEnum], ...] = SEED_REGISTRY + EXTENSIONS


def decode_enum(enum_type: type[IntEnum], value: int):
    """The member with discriminant `value`, or UnknownDiscriminant: unknown values fail closed."""
    try:
        return enum_type(value)
    except ValueError:
        raise UnknownDiscriminant(f"{enum_type.__name__} has no discriminant {value}") from None
