"""Every durable value record of the metadata families, declared once with the one codec.

Each class below is a `@record(version=N)`: its bytes are the u8 value version, then the fields in
declared order (nokvfs.schema.codec). Field names follow the seed's value descriptions, in the
seed's order; where the seed names a group ("member count/digest") it becomes one field each.

Value versions. The seed's "Durable Format Registry" paragraph is read as follows (the lead's
decision, recorded in the README's "Durable format" section):

* version 2: the publication-owned workspace/path/revision records and the immutable commit
  records -- WorkspaceCurrent, PathCurrent (PathEntry), ArtifactRevision, ArtifactManifest,
  Commit, CommitMember -- plus ChangeEvent and CommandDedupe (bound to its recovery LSN);
* version 5: BuildCommitOperation;
* version 4: RestoreOperation;
* version 2 (a nokvfs extension): PublishOperation, which adds `expected_revision_id`;
* version 1: every other record -- RootPlacement, RootFence, WorkspaceIncarnationClaim,
  RevisionRef, WorkbenchCommitHead, Tag, SnapshotRef, SnapshotAlias, HistoryHold,
  CommitConsumer, SecondaryIndex, RestoreMember, StagedObject,
  CommitRetireOperation, GcOperation, GcCandidate, GcBarrier.

Type conventions. Digest URIs ("sha256:<64 lowercase hex>": body_digest_uri, manifest_digest_uri,
digest_uri, tree_digest_uri, ...) are `Str`; raw 32-byte SHA-256 digests (member/revision/parent/
dependency/identity/initialization/input/command/row digests) and CommitIds are `Id32`; every
16-byte storage id is `Id16`; SnapshotId, versions, generations, epochs, sizes, offsets and
indexes are `U64`; counts bounded by a u32 key field are `U32`. A running closure digest that is
not sealed yet is 32 zero bytes (`ZERO_DIGEST`); a version that has not happened yet is 0 (commit
versions start at 1). Cursors are opaque `Bytes` owned by the state machine that writes them;
the empty cursor means "from the beginning". Enums are their registry type (nokvfs.schema.enums).

Nested records (version None, embedded without a version byte): IndexField, AppendSegment,
OperationRef, RunManifestBinding.

The Operation family's key carries the OperationKind, so its value record is chosen by kind:
`OPERATION_RECORDS` and `decode_operation`.
"""

from __future__ import annotations

from nokvfs.errors import CorruptRecord
from nokvfs.schema.codec import (
    U32,
    U64,
    Bytes,
    Enum,
    Flag,
    Id16,
    Id32,
    Label,
    List,
    Opt,
    Str,
    Struct,
    record,
)
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
    decode_enum,
)

ZERO_DIGEST = bytes(32)


# --- nested records ----------------------------------------------------------------------------


@record(version=None)
class IndexField:
    """One typed index projection entry: the field name and its order-preserving encoded value.

    `encoded_value` comes from the index codec (nokvfs.schema.index_codec) and is opaque here.
    """

    name: Str
    encoded_value: Bytes


@record(version=None)
class AppendSegment:
    """The append segment an ArtifactManifest row belongs to: its ordinal in the revision's
    append history and that segment's own SHA-256 digest URI."""

    segment_index: U32
    segment_digest_uri: Str


@record(version=None)
class OperationRef:
    """A point-readable Operation: its key is root_id | operation_kind | operation_id."""

    operation_kind: Enum(OperationKind)
    operation_id: Id16


@record(version=None)
class RunManifestBinding:
    """The immutable binding of the staged canonical run manifest (Commit Closure step 2).

    `publish_operation_id` is the PublishOperation that staged it; its durable result is the
    replay authority for terminal success.
    """

    workspace_incarnation_id: Id16
    artifact_revision_id: Id16
    logical_size: U64
    body_digest_uri: Str
    manifest_digest_uri: Str
    content_type: Str
    publish_operation_id: Id16


# --- placement -------------------------------------------------------------------------------


@record(version=1)
class RootPlacement:
    """Control-plane record (not a shard family): root_id -> logical shard and lifecycle."""

    logical_shard_id: Id16
    placement_generation: U64
    lifecycle: Enum(RootPlacementLifecycle)


@record(version=1)
class RootFence:
    logical_shard_id: Id16
    placement_generation: U64
    activation_state: Enum(RootActivationState)


# --- workspace and namespace -----------------------------------------------------------------


@record(version=2)
class WorkspaceCurrent:
    """The workbench marker. `owning_operation` is the operation that staged the incarnation
    (a Restore), or None for a direct create."""

    workspace_incarnation_id: Id16
    workspace_revision: U64
    state: Enum(WorkspaceState)
    owning_operation: Opt(Struct(OperationRef))
    created_version: U64
    modified_version: U64


@record(version=1)
class WorkspaceIncarnationClaim:
    workbench_id: Str


@record(version=2)
class PathEntry:
    """The PathCurrent value: the union of both PathEntry descriptions of the seed.

    `manifest_id` is the manifest identity of the artifact revision: the ArtifactRevisionId whose
    ArtifactManifest rows (key root_id | manifest_id | object_index) describe the body. In format
    8 every revision owns its manifest rows, so it equals `artifact_revision_id`.
    """

    generation: U64
    artifact_revision_id: Id16
    logical_size: U64
    body_digest_uri: Str
    manifest_digest_uri: Str
    dependency_count: U32
    dependency_depth: U32
    content_type: Str
    producer: Str
    manifest_id: Id16
    created_version: U64
    modified_version: U64
    typed_index_projection: List(Struct(IndexField))


PathCurrent = PathEntry


# --- artifact revisions ----------------------------------------------------------------------


@record(version=2)
class ArtifactRevision:
    """`last_zero_ref_version` is 0 while the strong-reference count has never reached zero."""

    logical_size: U64
    body_digest_uri: Str
    manifest_digest_uri: Str
    block_count: U64
    dependency_count: U32
    dependency_depth: U32
    dependency_digest: Id32
    content_type: Str
    state: Enum(RevisionState)
    reference_epoch: U64
    strong_reference_count: U64
    last_zero_ref_version: U64
    created_version: U64


@record(version=1)
class RevisionRef:
    reference_epoch_at_add: U64
    created_version: U64


@record(version=2)
class ArtifactManifest:
    """One ordered manifest row. `physical_owner_revision_id`/`physical_object_index` name the
    block's physical key; the key's object_index is only the row position. `append_segment` is
    present on rows written by an append."""

    physical_owner_revision_id: Id16
    physical_object_index: U64
    object_key: Str
    logical_offset: U64
    object_offset: U64
    length: U64
    digest_uri: Str
    append_segment: Opt(Struct(AppendSegment))


# --- commits ---------------------------------------------------------------------------------


@record(version=2)
class Commit:
    """A sealed commit. The facade identity inputs are the source workbench id, the Agent's
    projection_input_digest, the first owner-observed commit time and the build operation that
    sealed it. `tree_manifest_revision` is the source WorkspaceCurrent.workspace_revision the
    tree was frozen at; `run_manifest_revision_id` is the staged run-manifest revision."""

    source_workspace_incarnation_id: Id16
    source_workbench_id: Str
    projection_input_digest: Id32
    committed_at_unix_seconds: U64
    build_operation_id: Id16
    tree_manifest_revision: U64
    run_manifest_revision_id: Id16
    tree_digest_uri: Str
    member_count: U64
    member_digest: Id32
    unique_revision_count: U64
    revision_digest: Id32
    parents: List(Id32)
    parent_count: U32
    parent_digest: Id32
    producer: Str
    lineage: Str
    consumer_count: U64
    consumer_epoch: U64
    last_zero_consumer_version: U64
    state: Enum(CommitState)
    retirement_cursor: Bytes
    created_version: U64


@record(version=2)
class CommitMember:
    artifact_revision_id: Id16
    path_generation: U64
    body_digest_uri: Str
    manifest_digest_uri: Str
    logical_size: U64
    dependency_count: U32
    dependency_depth: U32
    content_type: Str
    producer: Str
    manifest_id: Id16
    typed_projection: List(Struct(IndexField))


@record(version=1)
class WorkbenchCommitHead:
    commit_id: Id32
    head_generation: U64


@record(version=1)
class Tag:
    commit_id: Id32
    tag_generation: U64


@record(version=1)
class CommitConsumer:
    consumer_epoch_at_add: U64
    created_version: U64


# --- snapshots and history holds -------------------------------------------------------------


@record(version=1)
class SnapshotRef:
    """`lease_deadline` is in the shard's persisted lease clock (Unix milliseconds)."""

    read_version: U64
    alias: Opt(Label)
    lease_deadline: U64
    state: Enum(SnapshotState)
    consumer_count: U64
    consumer_epoch: U64
    annotation: Opt(Str)


@record(version=1)
class SnapshotAlias:
    """`terminal_state` projects the aliased snapshot's lifecycle once it is terminal (Reaped or
    Retired); None while it is not, so a terminal latest mint never falls back."""

    snapshot_id: U64
    alias_generation: U64
    terminal_state: Opt(Enum(SnapshotState))


@record(version=1)
class HistoryHold:
    read_version: U64
    source_snapshot_id: Opt(U64)
    state: Enum(HistoryHoldState)
    created_version: U64


# --- indexes, events, dedupe -----------------------------------------------------------------


@record(version=1)
class SecondaryIndex:
    """A SecondaryIndex row value: the indexed path's generation and an opaque compact
    projection for catalog results."""

    path_generation: U64
    projection: Bytes


@record(version=2)
class ChangeEvent:
    """`before`/`after` are compact projections, opaque here."""

    workbench_id: Str
    workspace_incarnation_id: Id16
    kind: Enum(ChangeEventKind)
    path: Opt(Str)
    before: Opt(Bytes)
    after: Opt(Bytes)


@record(version=2)
class CommandDedupe:
    command_digest: Id32
    result: Bytes
    commit_version: U64
    recovery_lsn: U64


# --- operation ledgers -----------------------------------------------------------------------


@record(version=1)
class RestoreMember:
    """`path` is the normalized destination path text."""

    path: Str
    artifact_revision_id: Id16
    path_generation: U64
    row_digest: Id32


@record(version=1)
class StagedObject:
    """`upload_id` is the multipart upload id, None for a single-request PUT."""

    artifact_revision_id: Id16
    object_key: Str
    upload_id: Opt(Str)
    expected_length: U64
    expected_digest_uri: Str
    provider_state: Enum(StagedProviderState)
    cleanup_state: Enum(StagedCleanupState)


@record(version=1)
class GcCandidate:
    last_zero_ref_version: U64
    claim_state: Enum(GcClaimState)
    retry_count: U32
    quarantine_evidence: Opt(Str)


@record(version=1)
class GcBarrier:
    generation: U64


# --- operations (one value record per OperationKind) ------------------------------------------


@record(version=2)
class PublishOperation:
    """The complete publication request, so a crash in Finalizing resumes from the ledger alone.

    `path` is the normalized path text. `expected_generation`: None publishes unconditionally,
    0 requires the path to be absent, N requires generation N. `expected_revision_id` (value
    version 2, a nokvfs extension): the exact ArtifactRevisionId the path must hold when the
    publication lands, so a writer cannot be fooled by remove-and-recreate restarting the
    generation at 1 (revision ids are never reused). `object_count` bounds the
    StagedObject ledger (object_sequence is a u32). An append names its base revision and how
    many of the base's manifest rows the new revision reuses before its own objects.
    """

    workbench_id: Str
    workspace_incarnation_id: Id16
    path: Str
    artifact_revision_id: Id16
    expected_generation: Opt(U64)
    base_revision_id: Opt(Id16)
    phase: Enum(PublishPhase)
    object_count: U32
    reused_count: U32
    logical_size: U64
    body_digest_uri: Str
    content_type: Str
    producer: Str
    index_fields: List(Struct(IndexField))
    event_kind: Enum(ChangeEventKind)
    request_id: Id16
    created_version: U64
    result: Opt(Bytes)
    terminal_error: Opt(Str)
    cleanup_cursor: Bytes
    expected_revision_id: Opt(Id16) = None


@record(version=5)
class BuildCommitOperation:
    """The complete exact commit request plus the closure state (seed "Commit Closure").

    Request: commit_id is the facade CommitId (the Agent's commit_identity, bound into
    projection_input_digest; needed before the seal for the Commit RevisionRefs);
    `tree_revision` is the frozen source WorkspaceCurrent.workspace_revision;
    `content_digest_uri`/`manifest_digest_uri` are the caller's explicit run-manifest digests;
    `expected_head` None means "no head yet"; `run_manifest_expected_generation` is the
    publication condition of metadata/run_manifest.json (None: must be absent);
    `committed_at_unix_seconds` is the first owner-observed time. `run_manifest` is None until
    the staged run manifest is bound (step 2), then immutable.
    """

    initialization_digest: Id32
    projection_input_digest: Id32
    commit_id: Id32
    workbench_id: Str
    source_workspace_incarnation_id: Id16
    read_version: U64
    tree_revision: U64
    expected_head: Opt(Id32)
    expected_head_generation: U64
    content_digest_uri: Str
    manifest_digest_uri: Str
    replace: Flag
    run_manifest_expected_generation: Opt(U64)
    committed_at_unix_seconds: U64
    producer: Str
    lineage: Str
    parents: List(Id32)
    request_id: Id16
    phase: Enum(BuildCommitPhase)
    run_manifest: Opt(Struct(RunManifestBinding))
    member_cursor: Bytes
    member_count: U64
    member_digest: Id32
    revision_cursor: Bytes
    unique_revision_count: U64
    revision_digest: Id32
    parent_cursor: Bytes
    parent_count: U32
    parent_digest: Id32
    cleanup_cursor: Bytes
    result: Opt(Bytes)
    terminal_error: Opt(Str)
    created_version: U64


@record(version=4)
class RestoreOperation:
    """Everything "Restore Closure" needs for source-independent terminal replay.

    `source_selector` is the concrete source identity: the u64 big-endian SnapshotId (8 bytes)
    for a Snapshot source, the CommitId (32 bytes) for a Commit source; any other width is
    corrupt. `source_read_version` is the read version the source is held at.
    `restore_manifest_entry` is the encoded PathEntry of metadata/restore_manifest.json sealed
    into the operation (the initialization descriptor). `member_sequence` is the next
    RestoreMember sequence; `source_eof` records end-of-source.
    """

    identity_digest: Id32
    initialization_digest: Id32
    source_workbench_id: Str
    source_workspace_incarnation_id: Id16
    source_kind: Enum(RestoreSourceKind)
    source_selector: Bytes
    source_read_version: U64
    destination_workbench_id: Str
    destination_workspace_incarnation_id: Id16
    restore_manifest_entry: Bytes
    phase: Enum(RestorePhase)
    source_cursor: Bytes
    member_sequence: U64
    source_eof: Flag
    member_count: U64
    member_digest: Id32
    cleanup_cursor: Bytes
    result: Opt(Bytes)
    terminal_error: Opt(Str)
    created_version: U64

    def __post_init__(self):
        expected = _SELECTOR_WIDTH.get(self.source_kind)
        if expected is not None and (
            not isinstance(self.source_selector, (bytes, bytearray)) or len(self.source_selector) != expected
        ):
            kind = getattr(self.source_kind, "name", self.source_kind)
            raise CorruptRecord(
                f"RestoreOperation.source_selector: a {kind} source is {expected} bytes, "
                f"got {_width(self.source_selector)}"
            )

    @property
    def source_snapshot_id(self) -> int | None:
        if self.source_kind != RestoreSourceKind.Snapshot:
            return None
        return int.from_bytes(self.source_selector, "big")

    @property
    def source_commit_id(self) -> bytes | None:
        if self.source_kind != RestoreSourceKind.Commit:
            return None
        return bytes(self.source_selector)


_SELECTOR_WIDTH = {RestoreSourceKind.Snapshot: 8, RestoreSourceKind.Commit: 32}


def _width(value) -> str:
    return f"{len(value)} bytes" if isinstance(value, (bytes, bytearray)) else type(value).__name__


def snapshot_selector(snapshot_id: int) -> bytes:
    """The RestoreOperation.source_selector of a Snapshot source."""
    if not isinstance(snapshot_id, int) or not 0 <= snapshot_id < 1 << 64:
        raise CorruptRecord(f"snapshot id {snapshot_id!r} is not a u64")
    return snapshot_id.to_bytes(8, "big")


@record(version=1)
class CommitRetireOperation:
    """Releases a Retiring commit's members/indexes, revision refs and parent consumers.

    `consumer_epoch` is the epoch the Sealed -> Retiring CAS observed; the released counts are
    checked against the commit's seals before Retired is published.
    """

    commit_id: Id32
    consumer_epoch: U64
    phase: Enum(CommitRetirePhase)
    member_cursor: Bytes
    revision_cursor: Bytes
    parent_cursor: Bytes
    released_member_count: U64
    released_revision_count: U64
    released_parent_count: U64
    result: Opt(Bytes)
    terminal_error: Opt(Str)
    created_version: U64


@record(version=1)
class GcOperation:
    """Deletes one claimed revision's own objects (object_cursor over its manifest rows), then
    releases its sealed dependency set (dependency_cursor)."""

    artifact_revision_id: Id16
    reference_epoch: U64
    phase: Enum(GcPhase)
    object_count: U64
    object_cursor: Bytes
    deleted_object_count: U64
    dependency_cursor: Bytes
    result: Opt(Bytes)
    terminal_error: Opt(Str)
    created_version: U64


OPERATION_RECORDS: dict[OperationKind, type] = {
    OperationKind.Publish: PublishOperation,
    OperationKind.BuildCommit: BuildCommitOperation,
    OperationKind.Restore: RestoreOperation,
    OperationKind.CommitRetire: CommitRetireOperation,
    OperationKind.Gc: GcOperation,
}

OPERATION_KIND_OF: dict[type, OperationKind] = {cls: kind for kind, cls in OPERATION_RECORDS.items()}


def decode_operation(kind: OperationKind | int, data: bytes):
    """Decode an Operation value under the record its key's operation_kind selects."""
    if not isinstance(kind, OperationKind):
        if isinstance(kind, bool) or not isinstance(kind, int):
            raise CorruptRecord(f"operation kind {kind!r} is not an OperationKind")
        kind = decode_enum(OperationKind, kind)
    return OPERATION_RECORDS[kind].decode(data)


NESTED_RECORDS: tuple[type, ...] = (IndexField, AppendSegment, OperationRef, RunManifestBinding)

ALL_VALUE_RECORDS: tuple[type, ...] = (
    RootPlacement,
    RootFence,
    WorkspaceCurrent,
    WorkspaceIncarnationClaim,
    PathEntry,
    ArtifactRevision,
    RevisionRef,
    ArtifactManifest,
    Commit,
    CommitMember,
    WorkbenchCommitHead,
    Tag,
    CommitConsumer,
    SnapshotRef,
    SnapshotAlias,
    HistoryHold,
    SecondaryIndex,
    ChangeEvent,
    CommandDedupe,
    RestoreMember,
    StagedObject,
    GcCandidate,
    GcBarrier,
    PublishOperation,
    BuildCommitOperation,
    RestoreOperation,
    CommitRetireOperation,
    GcOperation,
)
