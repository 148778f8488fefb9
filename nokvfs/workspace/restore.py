"""Restore: a new workbench whose tree is a source snapshot's or commit's, same root and shard.

    Preparing -> Copying -> SourceSealed -> Ready -> Complete
    Preparing | Copying | SourceSealed | Ready -> Aborting -> Cleaning -> Cleaned | Quarantined

Restore is destination-creating: it never rolls a visible workspace back in place. Nothing of the
destination is visible before the final command (its WorkspaceCurrent is Staging until then, and
Staging rows are absent from every read), but every staged path's strong reference protects its
object throughout.

1. `prepare` (one command): Operation(Restore) in Preparing; the destination
   WorkspaceCurrent(Staging, owning operation = this restore) with a fresh incarnation and its
   WorkspaceIncarnationClaim; and the source retention -- for a snapshot, a CAS on the exact
   Active SnapshotRef whose lease deadline is later than the persisted lease clock,
   incrementing its consumer_count/consumer_epoch, plus HistoryHold(Restore, operation) at the
   snapshot's read version (so snapshot.retire and the reaper fail with ForkRetentionActive
   while the restore runs); for a commit, CommitConsumer(commit, Lease, operation) against the
   exact Sealed commit row.
2. metadata/restore_manifest.json is staged (RestoreStaging, nokvfs.workspace.staging: a
   PublishOperation and its ledger, uploaded and finalized through the publish pipeline); one
   command of this module creates its ArtifactRevision (Available), manifest rows, the destination's Path
   RevisionRef and its PathCurrent (exactly the sealed entry, under the Staging incarnation,
   so path and reference never disagree), moves the publish operation Finalizing -> Published
   (its result is the sealed path entry) and the restore Preparing -> Copying.
3. Copying: bounded batches (COPY_BATCH per command). Each writes, per source entry in canonical
   path order, the destination PathCurrent under the new incarnation, its Path RevisionRef and
   index rows, and RestoreMember(sequence) with its row digest; the operation row carries the
   source cursor (the last ordered path key bytes), the next member sequence and the running
   member count/digest. A source's own metadata/restore_manifest.json is a member (its seal
   counts it) but gets no destination row: that path holds this restore's manifest. The batch
   that meets end-of-source records source_eof and seals the count/digest: Copying ->
   SourceSealed.
4. Verification rereads the RestoreMember index in sequence order beside a rescan of the source
   -- the commit's CommitMember rows, or PathCurrent rows at the held read version (MVCC) --
   checks every row (path, revision, generation, row digest, the destination entry and its
   reference) and that the count/digest equal the sealed ones and, for a commit, the Commit's own
   member seal; then SourceSealed -> Ready.
5. One command predicates the exact Ready operation, the Staging marker and the sealed restore
   manifest entry, CASes Ready -> Complete, changes the workspace Staging -> Visible (revision
   + 1), emits one WorkspaceRestored event and releases the snapshot consumer and hold, or the
   commit lease.

Cleanup first CASes the observed nonterminal phase to Aborting (final publication CASes the same
row, so a Ready-state abort and Complete have exactly one winner), then Cleaning, then removes
every staged destination path, its reference and index rows in bounded batches driven by the
RestoreMember rows (cleanup cursor: u64 next member sequence), never by a path or object
listing; aborts a staged restore-manifest publish; and finally, in one command, removes a bound
restore manifest's path and reference, retires the Staging marker (Staging -> Retired) and releases the source hold and
snapshot consumer, or the commit lease, exactly once. Quarantined (a staged manifest object
whose delete was ambiguous) keeps the source retained and the marker Staging until reconciled:
`reconcile` (run by gc) settles the attempts once the store answers, then Quarantined ->
Cleaning and the cleanup's terminal command releases both.

Decisions (the lead's and this module's, recorded here):

* identity_digest and operation_id follow the seed exactly ("nokv.restore.operation.v2\\0"); the
  Operation row keeps the complete identity digest, and the same short id with another identity
  digest is OperationCollision. initialization_digest is the seed's
  "nokv.restore.initialization.v3\\0" formula over the one reserved projection (put
  metadata/restore_manifest.json) and the encoded PathEntry sealed into the operation.
* The restore manifest is canonical JSON of {"schema": "nokv.workbench.restore_manifest.v1",
  "operation_id", "source_workbench_id", "source_workspace_incarnation_id", "source_kind"
  ("snapshot" | "commit"), "source" (the snapshot id, or the commit id in hex),
  "destination_workbench_id", "destination_workspace_incarnation_id"}. Its revision id is
  SHA-256("nokv.restore.manifest-revision.v1\\0" | root | operation)[:16] and its sealed entry
  is generation 1 with created/modified version = the Preparing command's version, so the
  descriptor (and the initialization digest) is a function of the request and that version.
  Staging attempt n uses publish operation SHA-256("nokv.restore.manifest-publish.v1\\0" |
  operation | u32 n)[:16]; a Quarantined attempt aborts the restore (its keys cannot be
  reused).
* Aliases are point-resolved to numeric ids before `prepare`; RestoreRequest (the internal DTO)
  refuses an alias. A remint after resolution does not redirect the restore.
* The destination copies every source entry as it was: a snapshot's PathEntry verbatim, a
  commit member's PathEntry projection (commit.entry_of, versions = the commit's). The member
  digest is the commit member chain (commit.member_chain over the CommitMember projection of
  each entry), so a commit source's sealed count/digest must equal the Commit's own; the row
  digest is SHA-256("nokv.restore.member.v1\\0" | u32 len(path) | path | encoded CommitMember).
* A restore's destination is found again through its marker (owning operation), so an exact
  retry of the same source and destination resumes or returns the terminal result; after a
  cleaned attempt (marker Retired) a retry starts a new attempt with a new incarnation.
* RestoreOperation.source_read_version: the snapshot's read version; for a commit, the commit's
  created_version (its members are immutable while the lease holds it Sealed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
from dataclasses import dataclass
from itertools import islice, zip_longest

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, iter_prefix, scan_prefix
from nokvfs.errors import (
    AlreadyExists,
    IntegrityError,
    InvalidInput,
    NokvError,
    NotFound,
    PredicateFailed,
    RequestMismatch,
)
from nokvfs.schema import canonical_json, keys
from nokvfs.schema.enums import (
    ChangeEventKind,
    CommitConsumerKind,
    CommitState,
    HistoryHoldState,
    OperationKind,
    ReferenceKind,
    RestorePhase,
    RestoreSourceKind,
    SnapshotState,
    WorkspaceState,
)
from nokvfs.schema.ids import check_commit_id, check_id16, check_snapshot_id, derived_id16, new_id16, uuid7_from
from nokvfs.schema.names import check_workbench_id
from nokvfs.schema.paths import join, normalize_path, unordered_path
from nokvfs.schema.records import (
    ZERO_DIGEST,
    CommitMember,
    HistoryHold,
    OperationRef,
    PathEntry,
    RestoreMember,
    RestoreOperation,
    SnapshotRef,
    WorkspaceCurrent,
    WorkspaceIncarnationClaim,
)
from nokvfs.workspace import body as bodies
from nokvfs.workspace import commit as commits
from nokvfs.workspace import publish, snapshot, staging
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.consumers import Consumers, read_commit
from nokvfs.workspace.operations import Done, Rows, crash_point, drive_each, drive_to_terminal, driving
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest

_log = logging.getLogger(__name__)

RESTORE_MANIFEST = publish.RESTORE_MANIFEST
RESTORE_MANIFEST_PATH = join(RESTORE_MANIFEST)
RESTORE_MANIFEST_SCHEMA = "nokv.workbench.restore_manifest.v1"
RESULT_SCHEMA = "nokv.restore.result.v1"
RESTORE_PRODUCER = "nokvfs.restore"
COPY_BATCH = 200
EOF = commits.EOF

TERMINAL = (RestorePhase.Complete, RestorePhase.Cleaned, RestorePhase.Quarantined)
LIVE = (RestorePhase.Preparing, RestorePhase.Copying, RestorePhase.SourceSealed, RestorePhase.Ready)
ROWS = Rows(
    OperationKind.Restore, "restore", TERMINAL, subject=lambda op_id, op: f"restore to {op.destination_workbench_id}"
)
_KIND_NAMES = {RestoreSourceKind.Snapshot: "snapshot", RestoreSourceKind.Commit: "commit"}

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class OperationCollision(IntegrityError):
    """Another restore identity owns this 16-byte operation id (a truncated-digest collision)."""


class RestoreAborted(PredicateFailed):
    """The restore was aborted and cleaned (or quarantined); its destination never became visible."""


# --- identities -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestoreRequest:
    """The internal restore DTO: concrete source selectors only (a SnapshotId or a CommitId)."""

    source_workbench_id: str
    source_incarnation: bytes
    source_kind: RestoreSourceKind
    source_selector: bytes  # u64 big-endian SnapshotId (8 bytes) or CommitId (32 bytes)
    destination_workbench_id: str
    destination_incarnation: bytes

    def __post_init__(self):
        check_workbench_id(self.source_workbench_id)
        check_workbench_id(self.destination_workbench_id)
        check_id16(self.source_incarnation, "source incarnation")
        check_id16(self.destination_incarnation, "destination incarnation")
        if not isinstance(self.source_selector, (bytes, bytearray)):
            raise InvalidInput(
                f"a restore source is a concrete id, not {self.source_selector!r} (resolve aliases first)"
            )
        width = {RestoreSourceKind.Snapshot: 8, RestoreSourceKind.Commit: 32}[RestoreSourceKind(self.source_kind)]
        if len(self.source_selector) != width:
            raise InvalidInput(f"a {_KIND_NAMES[self.source_kind]} source selector is {width} bytes")
        if self.source_workbench_id == self.destination_workbench_id:
            raise InvalidInput("restore creates a new workbench: the destination must differ from the source")

    @property
    def snapshot_id(self) -> int | None:
        return int.from_bytes(self.source_selector, "big") if self.source_kind == RestoreSourceKind.Snapshot else None

    @property
    def commit_id(self) -> bytes | None:
        return bytes(self.source_selector) if self.source_kind == RestoreSourceKind.Commit else None

    @classmethod
    def from_op(cls, op: RestoreOperation) -> "RestoreRequest":
        return cls(
            op.source_workbench_id,
            op.source_workspace_incarnation_id,
            op.source_kind,
            bytes(op.source_selector),
            op.destination_workbench_id,
            op.destination_workspace_incarnation_id,
        )


def identity_digest(root_id: bytes, request: RestoreRequest) -> bytes:
    source = request.source_workbench_id.encode("ascii")
    destination = request.destination_workbench_id.encode("ascii")
    return hashlib.sha256(
        b"nokv.restore.operation.v2\0"
        + root_id
        + _U32.pack(len(source))
        + source
        + request.source_incarnation
        + bytes([int(request.source_kind)])
        + bytes(request.source_selector)
        + _U32.pack(len(destination))
        + destination
        + request.destination_incarnation
    ).digest()


def initialization_digest(identity: bytes, encoded_entry: bytes) -> bytes:
    path = RESTORE_MANIFEST_PATH.encode("utf-8")
    return hashlib.sha256(
        b"nokv.restore.initialization.v3\0"
        + identity
        + _U32.pack(1)
        + b"\x01"
        + _U32.pack(len(path))
        + path
        + _U32.pack(len(encoded_entry))
        + encoded_entry
    ).digest()


def manifest_revision_id(root_id: bytes, op_id: bytes, destination_incarnation: bytes) -> bytes:
    """A deterministic UUIDv7 for the restore manifest's revision: the destination incarnation's
    timestamp (frozen in the operation, so every retry derives the same id) and hash bits, so the
    revision's creation time reads truthfully like every other revision's."""
    digest = hashlib.sha256(b"nokv.restore.manifest-revision.v2\0" + root_id + op_id).digest()
    return uuid7_from(destination_incarnation[:6], digest)


def manifest_publish_id(op_id: bytes, attempt: int) -> bytes:
    return hashlib.sha256(b"nokv.restore.manifest-publish.v1\0" + op_id + _U32.pack(attempt)).digest()[:16]


def _request_id(op_id: bytes, step: bytes) -> bytes:
    # UUIDv8-shaped: a derived request id carries no time the replay retention could judge.
    return derived_id16(hashlib.sha256(b"nokv.restore.request.v1\0" + op_id + step).digest())


def manifest_bytes(op_id: bytes, request: RestoreRequest) -> bytes:
    source = request.snapshot_id if request.source_kind == RestoreSourceKind.Snapshot else request.commit_id.hex()
    return canonical_json.dumps(
        {
            "schema": RESTORE_MANIFEST_SCHEMA,
            "operation_id": op_id.hex(),
            "source_workbench_id": request.source_workbench_id,
            "source_workspace_incarnation_id": request.source_incarnation.hex(),
            "source_kind": _KIND_NAMES[request.source_kind],
            "source": source,
            "destination_workbench_id": request.destination_workbench_id,
            "destination_workspace_incarnation_id": request.destination_incarnation.hex(),
        }
    )


def manifest_entry(root, op_id: bytes, request: RestoreRequest, version: int) -> tuple[PathEntry, bodies.Body]:
    """The sealed PathEntry of metadata/restore_manifest.json and the body it describes."""
    body = bodies.from_bytes(manifest_bytes(op_id, request), root.block_size)
    revision_id = manifest_revision_id(root.root_id, op_id, request.destination_incarnation)
    rows = staging.planned_manifest(root, revision_id, body)
    entry = PathEntry(
        generation=1,
        artifact_revision_id=revision_id,
        logical_size=body.size,
        body_digest_uri=body.digest_uri,
        manifest_digest_uri="sha256:" + publish.manifest_digest(rows).hex(),
        dependency_count=0,
        dependency_depth=0,
        content_type=commits.MANIFEST_CONTENT_TYPE,
        producer=RESTORE_PRODUCER,
        manifest_id=revision_id,
        created_version=version,
        modified_version=version,
        typed_index_projection=(),
    )
    return entry, body


def row_digest(components: tuple[str, ...], member: CommitMember) -> bytes:
    path = join(components).encode("utf-8")
    return hashlib.sha256(b"nokv.restore.member.v1\0" + _U32.pack(len(path)) + path + member.encode()).digest()


@dataclass(frozen=True)
class RestoreResult:
    operation_id: bytes
    destination_workbench_id: str
    destination_incarnation: bytes
    source_kind: RestoreSourceKind
    source_selector: bytes
    member_count: int
    commit_version: int

    def to_bytes(self) -> bytes:
        return canonical_json.dumps(
            {
                "schema": RESULT_SCHEMA,
                "operation_id": self.operation_id.hex(),
                "destination_workbench_id": self.destination_workbench_id,
                "destination_workspace_incarnation_id": self.destination_incarnation.hex(),
                "source_kind": _KIND_NAMES[self.source_kind],
                "source_selector": self.source_selector.hex(),
                "member_count": self.member_count,
                "commit_version": self.commit_version,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "RestoreResult":
        obj = canonical_json.loads(data)
        if obj.get("schema") != RESULT_SCHEMA:
            raise IntegrityError("a restore result of an unknown schema")
        kind = {v: k for k, v in _KIND_NAMES.items()}[obj["source_kind"]]
        return cls(
            bytes.fromhex(obj["operation_id"]),
            obj["destination_workbench_id"],
            bytes.fromhex(obj["destination_workspace_incarnation_id"]),
            kind,
            bytes.fromhex(obj["source_selector"]),
            obj["member_count"],
            obj["commit_version"],
        )


# --- rows -------------------------------------------------------------------------------------


def operation(root, op_id: bytes) -> RestoreOperation:
    return ROWS.get(root, op_id)


def attempts_of(op_id: bytes) -> staging.Attempts:
    """The staged restore-manifest attempts of a restore: every one stages the same revision."""
    return staging.Attempts(
        lambda n: manifest_publish_id(op_id, n), f"restore {op_id.hex()}", "restore manifest", same_keys=True
    )


def _snapshot_ref_key(root, op: RestoreOperation) -> bytes:
    return keys.SnapshotRefKey(root.root_id, op.source_workspace_incarnation_id, op.source_snapshot_id).encode()


def _release_source(view, root, op_id: bytes, op: RestoreOperation):
    """(predicates, mutations) releasing the source retention exactly once."""
    if op.source_kind == RestoreSourceKind.Snapshot:
        ref_key = _snapshot_ref_key(root, op)
        raw_ref = view.get("snapshot_ref", ref_key)
        raw_hold = view.get("history_hold", ROWS.hold_key(root, op_id))
        if raw_ref is None or raw_hold is None:
            raise IntegrityError(f"restore {op_id.hex()} lost its snapshot retention")
        ref = SnapshotRef.decode(raw_ref)
        if ref.consumer_count == 0:
            raise IntegrityError(f"snapshot {op.source_snapshot_id} has no consumer to release")
        released = dataclasses.replace(
            ref, consumer_count=ref.consumer_count - 1, consumer_epoch=ref.consumer_epoch + 1
        )
        return (
            [
                ValueEquals("snapshot_ref", ref_key, raw_ref),
                ValueEquals("history_hold", ROWS.hold_key(root, op_id), raw_hold),
            ],
            [Put("snapshot_ref", ref_key, released), Delete("history_hold", ROWS.hold_key(root, op_id))],
        )
    consumers = Consumers(view, root.root_id)
    consumers.remove(op.source_commit_id, CommitConsumerKind.Lease, keys.lease_consumer_owner(op_id))
    return consumers.rows()


# --- step 1 -----------------------------------------------------------------------------------


def _check_existing(root, op_id: bytes, identity: bytes, request: RestoreRequest) -> bool:
    """Whether the operation exists (an exact retry); typed errors for a collision/mismatch."""
    with root.read() as view:
        raw = view.get("operation", ROWS.key(root, op_id))
    if raw is None:
        return False
    op = RestoreOperation.decode(raw)
    if op.identity_digest != identity:
        raise OperationCollision(f"restore operation id {op_id.hex()} belongs to another identity")
    entry, _ = manifest_entry(root, op_id, request, op.created_version)
    if (
        initialization_digest(identity, entry.encode()) != op.initialization_digest
        or entry.encode() != op.restore_manifest_entry
    ):
        raise RequestMismatch(f"restore {op_id.hex()}: the same identity with another initialization")
    return True


def prepare(root, request: RestoreRequest) -> bytes:
    """Step 1 (or the lookup of the exact same restore): returns the operation id."""
    if not isinstance(request, RestoreRequest):
        raise InvalidInput("prepare takes a RestoreRequest with concrete source ids")
    identity = identity_digest(root.root_id, request)
    op_id = identity[:16]
    if _check_existing(root, op_id, identity, request):
        return op_id
    clock = snapshot.observe_clock(root) if request.source_kind == RestoreSourceKind.Snapshot else 0
    marker_key = wb.current_key(root.root_id, request.destination_workbench_id)
    claim_key = keys.WorkspaceIncarnationClaimKey(root.root_id, request.destination_incarnation).encode()
    op_key = ROWS.key(root, op_id)

    def build(view):
        if view.get("operation", op_key) is not None:
            raise PredicateFailed(f"restore {op_id.hex()} was prepared concurrently")
        raw_marker, marker = wb.read_current(view, root.root_id, request.destination_workbench_id)
        if marker is not None and marker.state != WorkspaceState.Retired:
            raise AlreadyExists(f"workbench {request.destination_workbench_id!r} exists or is being created")
        raw_source, source = wb.visible(view, root.root_id, request.source_workbench_id)
        if source.incarnation_id != request.source_incarnation:
            raise NotFound(f"workbench {request.source_workbench_id!r} is another incarnation now")
        version = view.version + 1
        entry, _ = manifest_entry(root, op_id, request, version)
        predicates = [
            Absent("operation", op_key),
            Absent("workspace_current", marker_key)
            if raw_marker is None
            else ValueEquals("workspace_current", marker_key, raw_marker),
            Absent("workspace_incarnation_claim", claim_key),
        ]
        mutations = []
        if request.source_kind == RestoreSourceKind.Snapshot:
            ref_key = keys.SnapshotRefKey(root.root_id, source.incarnation_id, request.snapshot_id).encode()
            raw_ref = view.get("snapshot_ref", ref_key)
            if raw_ref is None:
                raise NotFound(f"no snapshot {request.snapshot_id} in {request.source_workbench_id}")
            ref = SnapshotRef.decode(raw_ref)
            if ref.state != SnapshotState.Active:
                raise PredicateFailed(f"snapshot {request.snapshot_id} is {ref.state.name}")
            if ref.lease_deadline <= clock:
                raise PredicateFailed(f"snapshot {request.snapshot_id}'s lease has expired")
            attached = dataclasses.replace(
                ref, consumer_count=ref.consumer_count + 1, consumer_epoch=ref.consumer_epoch + 1
            )
            hold_key = ROWS.hold_key(root, op_id)
            predicates += [ValueEquals("snapshot_ref", ref_key, raw_ref), Absent("history_hold", hold_key)]
            mutations += [
                Put("snapshot_ref", ref_key, attached),
                Put(
                    "history_hold",
                    hold_key,
                    HistoryHold(ref.read_version, request.snapshot_id, HistoryHoldState.Active, version),
                ),
            ]
            read_version = ref.read_version
        else:
            consumers = Consumers(view, root.root_id)
            commit = consumers.commit(request.commit_id)
            if commit.source_workspace_incarnation_id != source.incarnation_id:
                raise NotFound(f"commit {request.commit_id.hex()} is not a commit of {request.source_workbench_id}")
            consumers.add(request.commit_id, CommitConsumerKind.Lease, keys.lease_consumer_owner(op_id))
            consumer_predicates, consumer_mutations = consumers.rows()
            predicates += consumer_predicates
            mutations += consumer_mutations
            read_version = commit.created_version
        op = RestoreOperation(
            identity_digest=identity,
            initialization_digest=initialization_digest(identity, entry.encode()),
            source_workbench_id=request.source_workbench_id,
            source_workspace_incarnation_id=request.source_incarnation,
            source_kind=request.source_kind,
            source_selector=bytes(request.source_selector),
            source_read_version=read_version,
            destination_workbench_id=request.destination_workbench_id,
            destination_workspace_incarnation_id=request.destination_incarnation,
            restore_manifest_entry=entry.encode(),
            phase=RestorePhase.Preparing,
            source_cursor=b"",
            member_sequence=0,
            source_eof=False,
            member_count=0,
            member_digest=ZERO_DIGEST,
            cleanup_cursor=b"",
            result=None,
            terminal_error=None,
            created_version=version,
        )
        staging = WorkspaceCurrent(
            workspace_incarnation_id=request.destination_incarnation,
            workspace_revision=0,
            state=WorkspaceState.Staging,
            owning_operation=OperationRef(OperationKind.Restore, op_id),
            created_version=version,
            modified_version=version,
        )
        mutations += [
            Put("operation", op_key, op),
            Put("workspace_current", marker_key, staging),
            Put(
                "workspace_incarnation_claim",
                claim_key,
                WorkspaceIncarnationClaim(workbench_id=request.destination_workbench_id),
            ),
        ]
        return Built(predicates=predicates, mutations=mutations, result=op_id)

    root.apply(build, digest=intent_digest("restore.prepare", identity), request_id=_request_id(op_id, b"prepare"))
    return op_id


# --- step 2: the staged restore manifest ------------------------------------------------------


def _bind_manifest(root, op_id: bytes, publish_id: bytes) -> None:
    def check(view):
        _, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, RestorePhase.Preparing)

    def rows(view, staged, refs):
        raw_op, op = ROWS.read(view, root, op_id)
        entry, revision = PathEntry.decode(op.restore_manifest_entry), staged.revision
        found = (
            staged.op.artifact_revision_id,
            revision.logical_size,
            revision.body_digest_uri,
            revision.manifest_digest_uri,
        )
        if found != (entry.artifact_revision_id, entry.logical_size, entry.body_digest_uri, entry.manifest_digest_uri):
            raise IntegrityError(f"staged publish {publish_id.hex()} is not the sealed restore manifest")
        refs.add(
            ReferenceKind.Path,
            publish.path_owner(op.destination_workspace_incarnation_id, RESTORE_MANIFEST),
            entry.artifact_revision_id,
        )
        path_key = keys.path_current_key(root.root_id, op.destination_workspace_incarnation_id, RESTORE_MANIFEST)
        predicates = [ValueEquals("operation", ROWS.key(root, op_id), raw_op), Absent("path_current", path_key)]
        mutations = [
            Put("path_current", path_key, op.restore_manifest_entry),  # under Staging: invisible
            Put("operation", ROWS.key(root, op_id), dataclasses.replace(op, phase=RestorePhase.Copying)),
        ]
        return predicates, mutations, op.restore_manifest_entry

    staging.bind(root, publish_id, intent_digest("restore.stage", op_id, publish_id), check, rows)


def _stage_manifest(root, op_id: bytes) -> None:
    op = operation(root, op_id)
    ROWS.require(op_id, op, RestorePhase.Preparing)
    entry, body = manifest_entry(root, op_id, RestoreRequest.from_op(op), op.created_version)

    def publication(publish_id):
        return publish.Publication(
            workbench_id=op.destination_workbench_id,
            components=RESTORE_MANIFEST,
            body=body,
            logical_size=body.size,
            body_digest_uri=body.digest_uri,
            expected_generation=0,
            content_type=entry.content_type,
            producer=RESTORE_PRODUCER,
            event_kind=ChangeEventKind.WorkspaceRestored,
            revision_id=entry.artifact_revision_id,
            operation_id=publish_id,
            request_id=new_id16(),
        )

    staging.stage_next(
        root,
        attempts_of(op_id),
        publication,
        op.destination_workspace_incarnation_id,
        lambda publish_id: _bind_manifest(root, op_id, publish_id),
    )


# --- step 3: copying --------------------------------------------------------------------------


def source_entries(view, root, op: RestoreOperation, start_after: bytes | None):
    """(ordered path bytes, components, destination PathEntry, CommitMember projection) of the
    source after `start_after`, in canonical path order."""
    if op.source_kind == RestoreSourceKind.Snapshot:
        frozen = view.at(op.source_read_version)
        prefix = keys.path_current_prefix(root.root_id, op.source_workspace_incarnation_id)
        tree = "path_current"
    else:
        raw, commit = read_commit(view, root.root_id, op.source_commit_id)
        if commit is None or commit.state != CommitState.Sealed:
            raise IntegrityError(f"the source commit {op.source_commit_id.hex()} is not Sealed under its lease")
        frozen = view
        prefix = keys.commit_member_prefix(root.root_id, op.source_commit_id)
        tree = "commit_member"
    marker = None if start_after is None else prefix + start_after
    while True:
        page = scan_prefix(frozen, tree, prefix, start_after=marker)
        for key, value in page.items:
            suffix = key[len(prefix) :]
            components = unordered_path(suffix)
            if tree == "path_current":
                entry = PathEntry.decode(value)
                yield suffix, components, entry, commits.member_from_entry(entry)
            else:
                member = CommitMember.decode(value)
                yield suffix, components, commits.entry_of(member, commit.created_version), member
        if page.next_marker is None:
            return
        marker = page.next_marker


def _member_key(root, op_id: bytes, sequence: int) -> bytes:
    return keys.RestoreMemberKey(root.root_id, op_id, sequence).encode()


def _copy_batch(root, op_id: bytes, batch: int) -> None:
    def build(view):
        raw_op, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, RestorePhase.Copying)
        items = list(islice(source_entries(view, root, op, op.source_cursor or None), batch + 1))
        take, more = items[:batch], len(items) > batch
        inc = op.destination_workspace_incarnation_id
        refs = References(view, root.root_id)
        predicates, mutations = [], []
        sequence, count, digest = op.member_sequence, op.member_count, op.member_digest
        for _, components, entry, member in take:
            member_key = _member_key(root, op_id, sequence)
            predicates.append(Absent("restore_member", member_key))
            if components != RESTORE_MANIFEST:
                # A source's own restore manifest is a member (the source seal counts it) but the
                # destination's path already holds this restore's sealed manifest.
                path_key = keys.path_current_key(root.root_id, inc, components)
                predicates.append(Absent("path_current", path_key))
                mutations.append(Put("path_current", path_key, entry))
                refs.add(ReferenceKind.Path, publish.path_owner(inc, components), entry.artifact_revision_id)
                mutations += publish.index_mutations(root.root_id, inc, components, None, entry)
            mutations.append(
                Put(
                    "restore_member",
                    member_key,
                    RestoreMember(
                        join(components), entry.artifact_revision_id, entry.generation, row_digest(components, member)
                    ),
                )
            )
            sequence += 1
            count += 1
            digest = commits.member_chain(digest, components, member)
        updated = dataclasses.replace(
            op,
            source_cursor=take[-1][0] if take else op.source_cursor,
            member_sequence=sequence,
            member_count=count,
            member_digest=digest,
        )
        if not more:
            updated = dataclasses.replace(updated, source_eof=True, phase=RestorePhase.SourceSealed)
        ref_predicates, ref_mutations = refs.rows()
        predicates += ref_predicates + [ValueEquals("operation", ROWS.key(root, op_id), raw_op)]
        mutations += ref_mutations + [Put("operation", ROWS.key(root, op_id), updated)]
        return Built(predicates=predicates, mutations=mutations)

    ROWS.apply(root, "restore.copy", op_id, build)


# --- step 4: verification ---------------------------------------------------------------------


def _restore_members(view, root, op_id: bytes):
    for key, value in iter_prefix(view, "restore_member", keys.restore_member_prefix(root.root_id, op_id)):
        yield keys.RestoreMemberKey.decode(key).member_sequence, RestoreMember.decode(value)


def verify_members(view, root, op_id: bytes, op: RestoreOperation, *, staged: bool = True) -> None:
    """The ordered member index against a rescan of the source; IntegrityError on any difference.
    With `staged`, also the staged destination rows (before Complete; afterwards the destination
    is an ordinary workbench that may have changed)."""
    count, digest = 0, ZERO_DIGEST
    inc = op.destination_workspace_incarnation_id
    for index, (row, source) in enumerate(
        zip_longest(_restore_members(view, root, op_id), source_entries(view, root, op, None))
    ):
        if row is None or source is None:
            raise IntegrityError(f"restore {op_id.hex()}: the member index and the source differ in length at {index}")
        sequence, member_row = row
        _, components, entry, member = source
        if (
            sequence != index
            or member_row.path != join(components)
            or member_row.artifact_revision_id != entry.artifact_revision_id
            or member_row.path_generation != entry.generation
            or member_row.row_digest != row_digest(components, member)
        ):
            raise IntegrityError(f"restore {op_id.hex()}: member {index} ({member_row.path}) does not match the source")
        if staged and components != RESTORE_MANIFEST:
            raw = view.get("path_current", keys.path_current_key(root.root_id, inc, components))
            if raw is None or PathEntry.decode(raw).artifact_revision_id != entry.artifact_revision_id:
                raise IntegrityError(
                    f"restore {op_id.hex()}: the staged destination {member_row.path} is missing or differs"
                )
            if (
                view.get(
                    "revision_ref",
                    keys.RevisionRefKey.path(root.root_id, inc, components, entry.artifact_revision_id).encode(),
                )
                is None
            ):
                raise IntegrityError(
                    f"restore {op_id.hex()}: the staged destination {member_row.path} has no reference"
                )
        count += 1
        digest = commits.member_chain(digest, components, member)
    if (count, digest) != (op.member_count, op.member_digest) or count != op.member_sequence:
        raise IntegrityError(f"restore {op_id.hex()}: the members do not match the sealed count/digest")
    if staged:
        sealed = PathEntry.decode(op.restore_manifest_entry)
        if (
            view.get("path_current", keys.path_current_key(root.root_id, inc, RESTORE_MANIFEST))
            != op.restore_manifest_entry
            or view.get(
                "revision_ref",
                keys.RevisionRefKey.path(root.root_id, inc, RESTORE_MANIFEST, sealed.artifact_revision_id).encode(),
            )
            is None
        ):
            raise IntegrityError(f"restore {op_id.hex()}: the staged restore manifest is missing or differs")
    if op.source_kind == RestoreSourceKind.Commit:
        _, commit = read_commit(view, root.root_id, op.source_commit_id)
        if (commit.member_count, commit.member_digest) != (count, digest):
            raise IntegrityError(f"restore {op_id.hex()}: the members do not match the source commit's seal")


def _verify(root, op_id: bytes) -> None:
    with root.read() as view:
        _, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, RestorePhase.SourceSealed)
        if not op.source_eof:
            raise IntegrityError(f"restore {op_id.hex()} is SourceSealed without end-of-source")
        verify_members(view, root, op_id, op)

    def build(view):
        raw, current = ROWS.read(view, root, op_id)
        if current != op:
            raise PredicateFailed(f"restore {op_id.hex()} changed while it was being verified")
        return Built(
            predicates=[ValueEquals("operation", ROWS.key(root, op_id), raw)],
            mutations=[Put("operation", ROWS.key(root, op_id), dataclasses.replace(current, phase=RestorePhase.Ready))],
        )

    ROWS.apply(root, "restore.ready", op_id, build)


# --- step 5: the final command ----------------------------------------------------------------


def _complete(root, op_id: bytes) -> None:
    def build(view):
        raw_op, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, RestorePhase.Ready)
        inc = op.destination_workspace_incarnation_id
        marker_key = wb.current_key(root.root_id, op.destination_workbench_id)
        raw_marker, marker = wb.read_current(view, root.root_id, op.destination_workbench_id)
        if (
            marker is None
            or marker.state != WorkspaceState.Staging
            or marker.workspace_incarnation_id != inc
            or marker.owning_operation != OperationRef(OperationKind.Restore, op_id)
        ):
            raise IntegrityError(f"restore {op_id.hex()}: the destination marker is not its Staging row")
        version = view.version + 1
        path_key = keys.path_current_key(root.root_id, inc, RESTORE_MANIFEST)
        if view.get("path_current", path_key) != op.restore_manifest_entry:
            raise IntegrityError(f"restore {op_id.hex()}: the staged restore manifest is not the sealed entry")
        predicates, mutations = _release_source(view, root, op_id, op)
        result = RestoreResult(
            op_id, op.destination_workbench_id, inc, op.source_kind, bytes(op.source_selector), op.member_count, version
        ).to_bytes()
        visible = dataclasses.replace(
            marker,
            state=WorkspaceState.Visible,
            workspace_revision=marker.workspace_revision + 1,
            modified_version=version,
        )
        predicates += [
            ValueEquals("operation", ROWS.key(root, op_id), raw_op),
            ValueEquals("workspace_current", marker_key, raw_marker),
            ValueEquals("path_current", path_key, op.restore_manifest_entry),
        ]
        mutations += [
            Put("workspace_current", marker_key, visible),
            Put(
                "operation", ROWS.key(root, op_id), dataclasses.replace(op, phase=RestorePhase.Complete, result=result)
            ),
        ]
        event = wb.event(
            (op.destination_workbench_id, inc),
            ChangeEventKind.WorkspaceRestored,
            None,
            bytes(op.source_selector),
            op_id,
        )
        return Built(predicates=predicates, mutations=mutations, events=[event], result=result)

    crash_point("restore-before-complete-command")
    root.apply(build, digest=intent_digest("restore.complete", op_id), request_id=_request_id(op_id, b"complete"))
    crash_point("restore-after-complete-command")


# --- driving ----------------------------------------------------------------------------------


def advance(root, op_id: bytes, *, batch: int = COPY_BATCH) -> RestorePhase:
    """Run the next durable step of a live restore; returns the phase after it."""
    op = operation(root, op_id)
    if op.phase == RestorePhase.Preparing:
        _stage_manifest(root, op_id)
    elif op.phase == RestorePhase.Copying:
        _copy_batch(root, op_id, batch)
    elif op.phase == RestorePhase.SourceSealed:
        _verify(root, op_id)
    elif op.phase == RestorePhase.Ready:
        _complete(root, op_id)
    else:
        raise PredicateFailed(f"restore {op_id.hex()} is {op.phase.name}: no step is due")
    return operation(root, op_id).phase


def resolve_source(view, root, workbench: wb.Workbench, source) -> tuple[RestoreSourceKind, bytes]:
    """A facade source selector made concrete, aliases and prefixes point-resolved:
    ("snapshot", id or alias) or ("commit", 32-byte id or a unique lowercase hex prefix)."""
    kind, selector = source
    if kind == "snapshot":
        snapshot_id, _, _, _ = snapshot._resolve(view, root, workbench, selector)
        return RestoreSourceKind.Snapshot, check_snapshot_id(snapshot_id).to_bytes(8, "big")
    if kind == "commit":
        if isinstance(selector, (bytes, bytearray)):
            return RestoreSourceKind.Commit, check_commit_id(bytes(selector))
        return RestoreSourceKind.Commit, commits.resolve_in(view, root, workbench, selector)
    raise InvalidInput(f"a restore source is ('snapshot', id or alias) or ('commit', id), not {kind!r}")


def _find_existing(root, request_kind, selector, source: wb.Workbench, destination_workbench_id: str) -> bytes | None:
    """The operation of an earlier restore of this exact source into this destination that is
    live or complete, through the destination marker; AlreadyExists for any other owner."""
    with root.read() as view:
        _, marker = wb.read_current(view, root.root_id, destination_workbench_id)
        if marker is None or marker.state == WorkspaceState.Retired:
            return None
        owner = marker.owning_operation
        if owner is not None and owner.operation_kind == OperationKind.Restore:
            raw = view.get("operation", ROWS.key(root, owner.operation_id))
            if raw is not None:
                op = RestoreOperation.decode(raw)
                if (
                    op.source_workbench_id,
                    op.source_workspace_incarnation_id,
                    op.source_kind,
                    bytes(op.source_selector),
                ) == (
                    source.workbench_id,
                    source.incarnation_id,
                    request_kind,
                    selector,
                ):
                    return owner.operation_id
    what = "exists" if marker.state == WorkspaceState.Visible else "is being created"
    raise AlreadyExists(f"workbench {destination_workbench_id!r} {what}")


def restore(
    root, source_workbench: str, source, destination_workbench: str, *, batch: int = COPY_BATCH
) -> RestoreResult:
    """Create `destination_workbench` from ("snapshot", id_or_alias) or ("commit", commit) of
    `source_workbench`. An exact retry resumes or returns the terminal result."""
    check_workbench_id(destination_workbench)
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, source_workbench)
        kind, selector = resolve_source(view, root, workbench, source)
    existing = _find_existing(root, kind, selector, workbench, destination_workbench)
    if existing is not None:
        return resume(root, existing, batch=batch)
    request = RestoreRequest(
        source_workbench, workbench.incarnation_id, kind, selector, destination_workbench, new_id16()
    )
    op_id = prepare(root, request)
    return resume(root, op_id, batch=batch)


def resume(root, op_id: bytes, *, batch: int = COPY_BATCH, abort_on_failure: bool = True) -> RestoreResult:
    """Drive a restore to its terminal phase: Complete returns the result, a cleaned restore
    raises RestoreAborted, a typed failure aborts and cleans it and is re-raised."""
    with driving(root, op_id, "restore"):
        return _drive(root, op_id, batch=batch, abort_on_failure=abort_on_failure)


def _drive(root, op_id: bytes, *, batch: int = COPY_BATCH, abort_on_failure: bool = True) -> RestoreResult:
    """`resume` for a caller that holds the operation's lock."""

    def result(op):
        if op.phase != RestorePhase.Complete:
            raise RestoreAborted(f"restore {op_id.hex()} was aborted ({op.phase.name}): {op.terminal_error}")
        found = RestoreResult.from_bytes(op.result)
        if found.operation_id != op_id:
            raise IntegrityError(f"restore {op_id.hex()}: the stored result names another operation")
        return found

    return drive_to_terminal(
        root,
        ROWS,
        op_id,
        result=result,
        cleaning=(RestorePhase.Aborting, RestorePhase.Cleaning),
        clean=lambda op_id: _clean(root, op_id, batch),
        advance=lambda op_id: advance(root, op_id, batch=batch),
        abort=lambda op_id, reason: abort(root, op_id, reason=reason, batch=batch),
        abort_on_failure=abort_on_failure,
    )


# --- abort and cleanup ------------------------------------------------------------------------


def abort(root, op_id: bytes, *, reason: str, batch: int = COPY_BATCH) -> RestorePhase:
    """CAS the observed nonterminal phase to Aborting, then clean. Returns the terminal phase
    (Complete when final publication won the race)."""
    op = operation(root, op_id)
    if op.phase in TERMINAL:
        return op.phase
    if op.phase in LIVE:
        observed = op.phase

        def take_over(view, current):
            if current.phase != observed:
                raise PredicateFailed(f"restore {op_id.hex()} moved from {observed.name} to {current.phase.name}")
            return [], [], dataclasses.replace(current, phase=RestorePhase.Aborting, terminal_error=reason[:1024])

        try:
            ROWS.step(root, op_id, "restore.abort", take_over)
        except PredicateFailed:
            current = operation(root, op_id)
            if current.phase == RestorePhase.Complete:
                return current.phase
            if current.phase not in (RestorePhase.Aborting, RestorePhase.Cleaning):
                raise
    return _clean(root, op_id, batch)


def _set_phase(root, op_id: bytes, expected: RestorePhase, new: RestorePhase, *, extra=None) -> None:
    ROWS.set_phase(root, op_id, expected, new, label=f"restore.{new.name.lower()}", extra=extra)


def _clean_members(root, op_id: bytes, batch: int) -> bool:
    """One cleanup batch driven by the RestoreMember rows; False once the cursor is at EOF."""
    limit = min(batch, MAX_ITEMS_PER_CALL)

    def change(view, op):
        ROWS.require(op_id, op, RestorePhase.Cleaning)
        if op.cleanup_cursor == EOF:
            raise Done()
        start = 0 if not op.cleanup_cursor else _U64.unpack(op.cleanup_cursor)[0]
        prefix = keys.restore_member_prefix(root.root_id, op_id)
        marker = None if start == 0 else _member_key(root, op_id, start - 1)
        page = scan_prefix(view, "restore_member", prefix, start_after=marker, limit=limit)
        inc = op.destination_workspace_incarnation_id
        refs = References(view, root.root_id)
        predicates, mutations = [], []
        following = start
        for key, value in page.items:
            member = RestoreMember.decode(value)
            following = keys.RestoreMemberKey.decode(key).member_sequence + 1
            components = normalize_path(member.path)
            path_key = keys.path_current_key(root.root_id, inc, components)
            raw_entry = view.get("path_current", path_key)
            if raw_entry is not None:
                entry = PathEntry.decode(raw_entry)
                if entry.artifact_revision_id == member.artifact_revision_id:
                    predicates.append(ValueEquals("path_current", path_key, raw_entry))
                    mutations.append(Delete("path_current", path_key))
                    mutations += publish.index_mutations(root.root_id, inc, components, entry, None)
            ref_key = keys.RevisionRefKey.path(root.root_id, inc, components, member.artifact_revision_id).encode()
            if view.get("revision_ref", ref_key) is not None:
                refs.remove(ReferenceKind.Path, publish.path_owner(inc, components), member.artifact_revision_id)
        cursor = EOF if page.next_marker is None else _U64.pack(following)
        ref_predicates, ref_mutations = refs.rows()
        return predicates + ref_predicates, mutations + ref_mutations, dataclasses.replace(op, cleanup_cursor=cursor)

    return ROWS.batch(root, op_id, "restore.clean", change)


def _clean(root, op_id: bytes, batch: int = COPY_BATCH) -> RestorePhase:
    cleaning = RestorePhase.Cleaning
    if not ROWS.start_cleaning(
        root,
        op_id,
        aborting=RestorePhase.Aborting,
        cleaning=cleaning,
        label="restore.cleaning",
        crash="restore-after-cleaning",
    ):
        return operation(root, op_id).phase
    quarantined = staging.abort_attempts(root, attempts_of(op_id), "its restore was aborted")
    while _clean_members(root, op_id, batch):
        crash_point("restore-after-clean-batch")
    final = RestorePhase.Quarantined if quarantined else RestorePhase.Cleaned

    def finish(view, op):
        inc = op.destination_workspace_incarnation_id
        entry = PathEntry.decode(op.restore_manifest_entry)
        refs = References(view, root.root_id)
        owner = publish.path_owner(inc, RESTORE_MANIFEST)
        if (
            view.get(
                "revision_ref",
                keys.RevisionRefKey(root.root_id, ReferenceKind.Path, owner, entry.artifact_revision_id).encode(),
            )
            is not None
        ):
            refs.remove(ReferenceKind.Path, owner, entry.artifact_revision_id)  # the bound staged manifest
        predicates, mutations = refs.rows()
        path_key = keys.path_current_key(root.root_id, inc, RESTORE_MANIFEST)
        if view.get("path_current", path_key) == op.restore_manifest_entry:
            predicates.append(ValueEquals("path_current", path_key, op.restore_manifest_entry))
            mutations.append(Delete("path_current", path_key))
        if final == RestorePhase.Cleaned:
            marker_key = wb.current_key(root.root_id, op.destination_workbench_id)
            raw_marker, marker = wb.read_current(view, root.root_id, op.destination_workbench_id)
            if (
                marker is not None
                and marker.owning_operation == OperationRef(OperationKind.Restore, op_id)
                and marker.state == WorkspaceState.Staging
            ):
                predicates.append(ValueEquals("workspace_current", marker_key, raw_marker))
                mutations.append(
                    Put(
                        "workspace_current",
                        marker_key,
                        dataclasses.replace(marker, state=WorkspaceState.Retired, modified_version=view.version + 1),
                    )
                )
            source_predicates, source_mutations = _release_source(view, root, op_id, op)
            predicates += source_predicates
            mutations += source_mutations
        return predicates, mutations

    _set_phase(root, op_id, RestorePhase.Cleaning, final, extra=finish)
    return final


def pending(view, root) -> list[tuple[bytes, RestoreOperation]]:
    return ROWS.pending(view, root)


def recover(root) -> list[tuple[str, str]]:
    """Resume every restore whose owning process is gone: (op hex, terminal phase name)."""

    def drive(op_id, _):
        try:
            _drive(root, op_id)
        except NokvError as exc:
            _log.info("recovery of restore %s: %s", op_id.hex(), exc)
        return operation(root, op_id).phase.name.lower()

    return drive_each(root, ROWS, drive)


def reconcile(root, op_id: bytes, op: RestoreOperation) -> str:
    """Reconcile a terminal restore (README, "Reconciliation"); the caller holds its lock.

    Its staged restore-manifest attempts that are Quarantined are reconciled. A Quarantined
    restore (its staged paths, references and bound manifest were removed by its cleanup; it
    still retains the source and the Staging destination name) then takes the explicit
    transition Quarantined -> Cleaning, and its cleanup's terminal command retires the marker
    and releases the source exactly once: Cleaned. Returns the phase afterwards (lower case).
    """
    if not staging.reconcile(root, attempts_of(op_id)) or op.phase != RestorePhase.Quarantined:
        return operation(root, op_id).phase.name.lower()
    _set_phase(root, op_id, RestorePhase.Quarantined, RestorePhase.Cleaning)
    crash_point("restore-after-reconcile")
    return _clean(root, op_id).name.lower()
