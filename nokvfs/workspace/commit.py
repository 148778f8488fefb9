"""BuildCommit: the commit closure of a workbench, its exact replay, abort/cleanup and recovery;
commit retirement; lookup (head, log, hex-prefix resolution) and as-of reads of a commit's tree.

    Building -> Sealing -> Complete
    Building -> Aborting -> Cleaning -> Cleaned | Quarantined
    Sealing  -> Aborting      (only with fenced proof that no Commit, head or dedupe row exists)

The steps (seed "Commit Closure"), each one MetadataCommand or a bounded series of them:

1. `begin` creates Operation(BuildCommit) with the complete exact request frozen in it -- the
   source incarnation and read version (the version the command was built at), the tree
   revision, the expected head, `replace`, the run-manifest publication condition (the frozen
   generation of metadata/run_manifest.json, None when absent), the first owner-observed
   committed_at_unix_seconds, producer, lineage and the ordered parents -- and
   HistoryHold(BuildCommit, operation) at the read version.
2. The canonical run manifest is uploaded through the publish pipeline (a PublishOperation and
   its StagedObject ledger for path metadata/run_manifest.json, created by `begin_staged` -- a
   mirror of publish._begin that takes the incarnation instead of reading a Visible marker, so
   restore can stage into a Staging destination -- then publish._upload and
   publish._finalize); one command of this module (not publish._publish) then creates its
   ArtifactRevision (Available), manifest rows and a Commit RevisionRef, moves the
   PublishOperation Finalizing -> Published and records the RunManifestBinding in the build
   operation, without writing PathCurrent (CommitStaging). That command uses the publish
   operation's request id, so publish.abort's Finalizing takeover proof (no dedupe row for it)
   is exact.
3-4. The frozen workspace is scanned at the read version in canonical path order with
   metadata/run_manifest.json replaced or inserted as one virtual member backed by the staged
   revision; CommitMember rows are written in bounded batches (MEMBER_BATCH per command) with the
   last path's ordered key bytes as the cursor and the running member count/digest in the
   operation row, so a killed process resumes from the cursor.
5. One Commit RevisionRef per unique revision, in bounded batches over the CommitMember rows
   (revision cursor); the staged run-manifest ref already exists and is counted exactly once.
6. CommitConsumer(parent, ChildCommit, commit_id) for every parent, against its exact Sealed
   commit row (parent cursor: the u32 index of the next parent).
7. The member, revision and parent count/digest pairs are recomputed from the rows
   (CommitMember scan, RevisionRef(Commit, commit_id) scan, CommitConsumer point reads).
8. Building -> Sealing, CAS on the exact operation row.
9. One command: PathCurrent(metadata/run_manifest.json) -> the staged revision (its Path
   RevisionRef added, the replaced revision's released), WorkspaceCurrent revision + 1, the
   Sealed Commit (consumer_count counting the new head), WorkbenchCommitHead (head_generation
   + 1), CommitConsumer(new, WorkbenchHead, incarnation) added and the old head's removed,
   Sealing -> Complete with the result, ChangeEvent CommitPublished, HistoryHold released.
   Its request id is derived from the operation id, so its dedupe row is the fenced proof the
   Sealing takeover checks.

Decisions (the lead's, recorded here):

* CommitId = SHA-256("nokv.commit.identity.v1\\0" | root_id | source incarnation | u64
  read_version | u64 committed_at_unix_seconds | request_id (16) | u32 parent count |
  parents...). It is known at step 1.
* The run manifest is canonical JSON of {"schema": "nokv.workbench.run_manifest.v1",
  "workbench_id", "commit_id" (64 hex), "parents" (hex, in order), "producer", "lineage",
  "source_read_version", "workspace_revision", "committed_at_unix_seconds"}. The projection input
  `canonical_manifest` is the same object without committed_at_unix_seconds;
  content_digest_uri = "sha256:" + hex(SHA-256(canonical_manifest)) and manifest_digest_uri is
  the same URI (the Agent has no other manifest identity for it before the owner time exists).
  workbench_path is "metadata/run_manifest.json". projection_input_digest is the seed's formula
  with len64be = u64 big-endian length prefixes; initialization_digest uses
  "nokv.build-commit.initialization.v5\\0" over the projection-input digest, source incarnation,
  read version, expected head (u8 presence | id) and head generation, both explicit digests,
  tree revision, replace, run-manifest condition (u8 presence | u64), committed_at, producer,
  lineage and the ordered parents (variable fields u64-length-prefixed, lists u64-counted).
* member_digest is a chain: d0 = 32 zero bytes, d_i = SHA-256("nokv.commit.member.v1\\0" |
  d_{i-1} | u32 len(path) | path UTF-8 | encoded CommitMember); revision_digest =
  SHA-256("nokv.commit.revisions.v1\\0" | unique revision ids sorted bytewise); parent_digest =
  SHA-256("nokv.commit.parents.v1\\0" | parents in request order); tree_digest_uri =
  "sha256:" + hex(member_digest). Duplicate parents are refused at request time.
* The operation id is SHA-256("nokv.build-commit.operation.v1\\0" | root | request id)[:16], so
  operation lookup by request id precedes every live workspace, head and run-manifest read, and
  an exact retry returns the original terminal result even after later commits moved head and
  path. Terminal replay rebuilds the canonical envelope from the operation and checks it against
  the binding and the staged publish operation's durable result, never against PathCurrent.
* Default parents: the workbench's current head, if any. Default expected head: the head seen at
  step 1. `replace=False` refuses to freeze while metadata/run_manifest.json exists.
* The staged publish operation of attempt n has id SHA-256("nokv.build-commit.run-manifest.v1\\0"
  | operation id | u32 n)[:16]: an attempt whose uploader died in Uploading is aborted and
  cleaned, and the next attempt stages a fresh revision.
* Cursors: b"" is "from the start", EOF = b"\\xff" (no ordered path key starts with 0xff).
  The cleanup cursor names the cleanup stage reached (b"members", b"revisions", b"parents");
  each stage deletes what it finds from the start of its prefix, so it resumes by itself.
* Result: canonical JSON (CommitResult.to_bytes), stored in the operation and the dedupe row.
* A typed failure of any step (a lost head or run-manifest race, a parent no longer Sealed, a
  seal that does not verify, a failed upload) aborts and cleans the build and re-raises; a later
  exact retry then raises CommitAborted. `recover` resumes a dead owner's build forward.
* `resolve` matches commits whose source incarnation is the workbench's current one; any
  non-empty lowercase hex prefix is accepted, and AmbiguousReference lists every match.

Retirement (`retire`): one command predicates Sealed, consumer_count == 0 and the expected
consumer_epoch, changes Sealed -> Retiring and creates CommitRetireOperation (Claiming; id
SHA-256("nokv.commit.retire.v1\\0" | root | commit)[:16]). The seals are rechecked from the rows
(Claiming -> Releasing, or Quarantined on a mismatch), then bounded batches release the Commit
RevisionRefs (cursor: the last revision id), the outbound ChildCommit consumers (cursor: next
parent index) and finally the CommitMember rows (cursor: last ordered path); a resume rechecks
the seals while the members still exist. One last command checks the released counts against
the seals and publishes Retired. Tag movement or deletion never retires a commit.

Recovery (`recover`, for a process that opens a root for writing) resumes every BuildCommit and
CommitRetire operation whose owning process is gone (publish.OperationLock on its id).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import time
from dataclasses import dataclass
from itertools import islice

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, list_children, scan_prefix
from nokvfs.errors import (
    AlreadyExists,
    GenerationConflict,
    IntegrityError,
    InvalidInput,
    NokvError,
    NotADirectory,
    NotFound,
    PredicateFailed,
    RequestMismatch,
)
from nokvfs.objects.keys import artifact_block_key
from nokvfs.schema import canonical_json, keys
from nokvfs.schema.enums import (
    BuildCommitPhase,
    ChangeEventKind,
    CommitConsumerKind,
    CommitRetirePhase,
    CommitState,
    HistoryHoldKind,
    HistoryHoldState,
    OperationKind,
    PublishPhase,
    ReferenceKind,
    RevisionState,
    StagedCleanupState,
    StagedProviderState,
)
from nokvfs.schema.ids import check_commit_id, new_id16
from nokvfs.schema.names import check_workbench_id
from nokvfs.schema.paths import join, ordered_path, subtree_prefix, unordered_path
from nokvfs.schema.records import (
    ZERO_DIGEST,
    ArtifactManifest,
    ArtifactRevision,
    BuildCommitOperation,
    Commit,
    CommitMember,
    CommitRetireOperation,
    HistoryHold,
    PathEntry,
    PublishOperation,
    RunManifestBinding,
    StagedObject,
    WorkbenchCommitHead,
    WorkspaceCurrent,
)
from nokvfs.workspace import operations
from nokvfs.workspace import body as bodies
from nokvfs.workspace import attributes, listing, publish
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.consumers import Consumers, consumer_key, read_commit
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest

_log = logging.getLogger(__name__)

RUN_MANIFEST = publish.RUN_MANIFEST
RUN_MANIFEST_PATH = join(RUN_MANIFEST)
RUN_MANIFEST_SCHEMA = "nokv.workbench.run_manifest.v1"
RESULT_SCHEMA = "nokv.build_commit.result.v1"
MANIFEST_CONTENT_TYPE = "application/json"
MEMBER_BATCH = 200
EOF = b"\xff"
MAX_STAGE_ATTEMPTS = 64

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CURRENT = object()  # "the head seen at step 1"

BUILD_TERMINAL = (BuildCommitPhase.Complete, BuildCommitPhase.Cleaned, BuildCommitPhase.Quarantined)
RETIRE_TERMINAL = (CommitRetirePhase.Complete, CommitRetirePhase.Quarantined)


class AmbiguousReference(InvalidInput):
    """A commit hex prefix names more than one commit; `matches` lists them (full hex)."""

    def __init__(self, message: str, matches: list[str]):
        super().__init__(message)
        self.matches = matches


class CommitAborted(PredicateFailed):
    """The build operation of this request was aborted and cleaned; it published nothing."""


class CommitInUse(PredicateFailed):
    """The commit still has consumers (a head, tag, lease or child): it cannot be retired."""


# --- digests and identities -------------------------------------------------------------------


def _len64(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _derived_id(domain: bytes, *parts: bytes) -> bytes:
    return hashlib.sha256(domain + b"".join(parts)).digest()[:16]


def operation_id(root_id: bytes, request_id: bytes) -> bytes:
    return _derived_id(b"nokv.build-commit.operation.v1\0", root_id, request_id)


def retire_operation_id(root_id: bytes, commit_id: bytes) -> bytes:
    return _derived_id(b"nokv.commit.retire.v1\0", root_id, commit_id)


def staged_publish_id(operation: bytes, attempt: int) -> bytes:
    return _derived_id(b"nokv.build-commit.run-manifest.v1\0", operation, _U32.pack(attempt))


def _publish_request_id(operation: bytes) -> bytes:
    return _derived_id(b"nokv.build-commit.publish-request.v1\0", operation)


def commit_identity(root_id: bytes, incarnation: bytes, read_version: int, committed_at: int, request_id: bytes, parents) -> bytes:
    h = hashlib.sha256(b"nokv.commit.identity.v1\0")
    h.update(root_id + incarnation + _U64.pack(read_version) + _U64.pack(committed_at) + request_id)
    h.update(_U32.pack(len(parents)))
    for parent in parents:
        h.update(parent)
    return h.digest()


def member_chain(previous: bytes, components: tuple[str, ...], member: CommitMember) -> bytes:
    path = join(components).encode("utf-8")
    return hashlib.sha256(b"nokv.commit.member.v1\0" + previous + _U32.pack(len(path)) + path + member.encode()).digest()


def revision_digest(revision_ids) -> bytes:
    return hashlib.sha256(b"nokv.commit.revisions.v1\0" + b"".join(sorted(set(revision_ids)))).digest()


def parent_digest(parents) -> bytes:
    return hashlib.sha256(b"nokv.commit.parents.v1\0" + b"".join(parents)).digest()


def projection_input_digest(workbench_id: str, workbench_path: str, content_digest_uri: str, canonical_manifest: bytes, manifest_digest_uri: str, identity: bytes) -> bytes:
    h = hashlib.sha256(b"nokv.workbench.run_manifest.projection_input.v1\0")
    for part in (workbench_id.encode(), workbench_path.encode(), content_digest_uri.encode(), canonical_manifest, manifest_digest_uri.encode()):
        h.update(_len64(part))
    h.update(check_commit_id(identity))
    return h.digest()


def sha256_uri(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FrozenRequest:
    """The exact request as step 1 freezes it; every digest of the commit derives from it."""

    workbench_id: str
    incarnation: bytes
    read_version: int
    tree_revision: int
    expected_head: bytes | None
    expected_head_generation: int
    replace: bool
    run_manifest_expected_generation: int | None
    committed_at: int
    producer: str
    lineage: str
    parents: tuple
    request_id: bytes

    @classmethod
    def from_op(cls, op: BuildCommitOperation) -> "FrozenRequest":
        return cls(
            op.workbench_id,
            op.source_workspace_incarnation_id,
            op.read_version,
            op.tree_revision,
            op.expected_head,
            op.expected_head_generation,
            op.replace,
            op.run_manifest_expected_generation,
            op.committed_at_unix_seconds,
            op.producer,
            op.lineage,
            tuple(op.parents),
            op.request_id,
        )

    def commit_id(self, root_id: bytes) -> bytes:
        return commit_identity(root_id, self.incarnation, self.read_version, self.committed_at, self.request_id, self.parents)

    def manifest_object(self, commit_id: bytes) -> dict:
        return {
            "schema": RUN_MANIFEST_SCHEMA,
            "workbench_id": self.workbench_id,
            "commit_id": commit_id.hex(),
            "parents": [p.hex() for p in self.parents],
            "producer": self.producer,
            "lineage": self.lineage,
            "source_read_version": self.read_version,
            "workspace_revision": self.tree_revision,
            "committed_at_unix_seconds": self.committed_at,
        }

    def run_manifest_bytes(self, commit_id: bytes) -> bytes:
        return canonical_json.dumps(self.manifest_object(commit_id))

    def canonical_manifest(self, commit_id: bytes) -> bytes:
        obj = self.manifest_object(commit_id)
        del obj["committed_at_unix_seconds"]
        return canonical_json.dumps(obj)

    def content_digest_uri(self, commit_id: bytes) -> str:
        return sha256_uri(self.canonical_manifest(commit_id))

    def projection_input_digest(self, commit_id: bytes) -> bytes:
        uri = self.content_digest_uri(commit_id)
        return projection_input_digest(self.workbench_id, RUN_MANIFEST_PATH, uri, self.canonical_manifest(commit_id), uri, commit_id)

    def initialization_digest(self, commit_id: bytes) -> bytes:
        uri = self.content_digest_uri(commit_id)
        h = hashlib.sha256(b"nokv.build-commit.initialization.v5\0")
        h.update(self.projection_input_digest(commit_id))
        h.update(self.incarnation + _U64.pack(self.read_version))
        h.update(b"\x00" if self.expected_head is None else b"\x01" + self.expected_head)
        h.update(_U64.pack(self.expected_head_generation))
        h.update(_len64(uri.encode()) + _len64(uri.encode()))
        h.update(_U64.pack(self.tree_revision))
        h.update(b"\x01" if self.replace else b"\x00")
        cond = self.run_manifest_expected_generation
        h.update(b"\x00" if cond is None else b"\x01" + _U64.pack(cond))
        h.update(_U64.pack(self.committed_at))
        h.update(_len64(self.producer.encode()) + _len64(self.lineage.encode()))
        h.update(_U64.pack(len(self.parents)))
        for parent in self.parents:
            h.update(parent)
        return h.digest()


@dataclass(frozen=True)
class CommitRequest:
    """What a caller asks for. None / _CURRENT fields are filled in by step 1."""

    workbench_id: str
    request_id: bytes
    parents: tuple | None = None
    producer: str = ""
    lineage: str = ""
    replace: bool = True
    expected_head: object = _CURRENT  # a commit id, None for "no head yet", or _CURRENT
    committed_at: int | None = None


@dataclass(frozen=True)
class CommitResult:
    commit_id: bytes
    operation_id: bytes
    workbench_id: str
    head_generation: int
    run_manifest_generation: int
    tree_digest_uri: str
    member_count: int
    unique_revision_count: int
    parents: tuple
    committed_at_unix_seconds: int
    commit_version: int

    @property
    def hex(self) -> str:
        return self.commit_id.hex()

    def to_bytes(self) -> bytes:
        return canonical_json.dumps(
            {
                "schema": RESULT_SCHEMA,
                "commit_id": self.commit_id.hex(),
                "operation_id": self.operation_id.hex(),
                "workbench_id": self.workbench_id,
                "head_generation": self.head_generation,
                "run_manifest_generation": self.run_manifest_generation,
                "tree_digest_uri": self.tree_digest_uri,
                "member_count": self.member_count,
                "unique_revision_count": self.unique_revision_count,
                "parents": [p.hex() for p in self.parents],
                "committed_at_unix_seconds": self.committed_at_unix_seconds,
                "commit_version": self.commit_version,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "CommitResult":
        obj = canonical_json.loads(data)
        if obj.get("schema") != RESULT_SCHEMA:
            raise IntegrityError("a build-commit result of an unknown schema")
        return cls(
            bytes.fromhex(obj["commit_id"]),
            bytes.fromhex(obj["operation_id"]),
            obj["workbench_id"],
            obj["head_generation"],
            obj["run_manifest_generation"],
            obj["tree_digest_uri"],
            obj["member_count"],
            obj["unique_revision_count"],
            tuple(bytes.fromhex(p) for p in obj["parents"]),
            obj["committed_at_unix_seconds"],
            obj["commit_version"],
        )


# --- members and path entries -----------------------------------------------------------------


def member_from_entry(entry: PathEntry) -> CommitMember:
    return CommitMember(
        artifact_revision_id=entry.artifact_revision_id,
        path_generation=entry.generation,
        body_digest_uri=entry.body_digest_uri,
        manifest_digest_uri=entry.manifest_digest_uri,
        logical_size=entry.logical_size,
        dependency_count=entry.dependency_count,
        dependency_depth=entry.dependency_depth,
        content_type=entry.content_type,
        producer=entry.producer,
        manifest_id=entry.manifest_id,
        typed_projection=tuple(entry.typed_index_projection),
    )


def entry_of(member: CommitMember, version: int) -> PathEntry:
    """A PathEntry serving a commit member to listing/reading code (versions: the commit's)."""
    return PathEntry(
        generation=member.path_generation,
        artifact_revision_id=member.artifact_revision_id,
        logical_size=member.logical_size,
        body_digest_uri=member.body_digest_uri,
        manifest_digest_uri=member.manifest_digest_uri,
        dependency_count=member.dependency_count,
        dependency_depth=member.dependency_depth,
        content_type=member.content_type,
        producer=member.producer,
        manifest_id=member.manifest_id,
        created_version=version,
        modified_version=version,
        typed_index_projection=tuple(member.typed_projection),
    )


def _virtual_member(op: BuildCommitOperation) -> CommitMember:
    binding = op.run_manifest
    return CommitMember(
        artifact_revision_id=binding.artifact_revision_id,
        path_generation=(op.run_manifest_expected_generation or 0) + 1,
        body_digest_uri=binding.body_digest_uri,
        manifest_digest_uri=binding.manifest_digest_uri,
        logical_size=binding.logical_size,
        dependency_count=0,
        dependency_depth=0,
        content_type=binding.content_type,
        producer=op.producer,
        manifest_id=binding.artifact_revision_id,
        typed_projection=(),
    )


def frozen_members(frozen, root, op: BuildCommitOperation, start_after: bytes | None):
    """(ordered path bytes, components, CommitMember) of the frozen tree after `start_after`, in
    canonical order, metadata/run_manifest.json replaced or inserted as the virtual member."""
    prefix = keys.path_current_prefix(root.root_id, op.source_workspace_incarnation_id)
    virtual_key = ordered_path(RUN_MANIFEST)
    virtual = _virtual_member(op)
    emitted = start_after is not None and start_after >= virtual_key
    marker = None if start_after is None else prefix + start_after
    while True:
        page = scan_prefix(frozen, "path_current", prefix, start_after=marker)
        for key, value in page.items:
            suffix = key[len(prefix):]
            if not emitted and suffix >= virtual_key:
                emitted = True
                yield virtual_key, RUN_MANIFEST, virtual
                if suffix == virtual_key:
                    continue
            yield suffix, unordered_path(suffix), member_from_entry(PathEntry.decode(value))
        if page.next_marker is None:
            break
        marker = page.next_marker
    if not emitted:
        yield virtual_key, RUN_MANIFEST, virtual


def _member_rows(view, root, commit_id: bytes):
    """Every (ordered suffix, components, CommitMember) of a commit, in path order."""
    prefix = keys.commit_member_prefix(root.root_id, commit_id)
    marker = None
    while True:
        page = scan_prefix(view, "commit_member", prefix, start_after=marker)
        for key, value in page.items:
            suffix = key[len(prefix):]
            yield suffix, unordered_path(suffix), CommitMember.decode(value)
        if page.next_marker is None:
            return
        marker = page.next_marker


def _commit_ref_ids(view, root, commit_id: bytes) -> list[bytes]:
    prefix = keys.revision_ref_prefix(root.root_id, ReferenceKind.Commit, keys.commit_reference_owner(commit_id))
    out, marker = [], None
    while True:
        page = scan_prefix(view, "revision_ref", prefix, start_after=marker)
        out += [k[len(prefix):] for k, _ in page.items]
        if page.next_marker is None:
            return out
        marker = page.next_marker


@dataclass(frozen=True)
class Seals:
    member_count: int
    member_digest: bytes
    unique_revision_count: int
    revision_digest: bytes
    parents: tuple
    parent_count: int
    parent_digest: bytes


def verify_closure(view, root, commit_id: bytes, seals: Seals) -> None:
    """Recompute the member, revision and parent count/digest pairs from their exact rows and
    compare them with `seals`; IntegrityError names the first pair that differs."""
    count, digest, revisions = 0, ZERO_DIGEST, set()
    for _, components, member in _member_rows(view, root, commit_id):
        count += 1
        digest = member_chain(digest, components, member)
        revisions.add(member.artifact_revision_id)
    if (count, digest) != (seals.member_count, seals.member_digest):
        raise IntegrityError(f"commit {commit_id.hex()}: the CommitMember rows do not match the member seal ({count} rows, sealed {seals.member_count})")
    refs = _commit_ref_ids(view, root, commit_id)
    if set(refs) != revisions or len(refs) != seals.unique_revision_count or revision_digest(refs) != seals.revision_digest:
        raise IntegrityError(f"commit {commit_id.hex()}: the Commit RevisionRefs do not match the revision seal ({len(refs)} refs, {len(revisions)} member revisions, sealed {seals.unique_revision_count})")
    parents = tuple(seals.parents)
    if len(set(parents)) != len(parents) or len(parents) != seals.parent_count or parent_digest(parents) != seals.parent_digest:
        raise IntegrityError(f"commit {commit_id.hex()}: the parents do not match the parent seal")
    for parent in parents:
        if view.get("commit_consumer", consumer_key(root.root_id, parent, CommitConsumerKind.ChildCommit, commit_id)) is None:
            raise IntegrityError(f"commit {commit_id.hex()}: parent {parent.hex()} has no ChildCommit consumer row")


def _op_seals(op: BuildCommitOperation) -> Seals:
    return Seals(op.member_count, op.member_digest, op.unique_revision_count, op.revision_digest, tuple(op.parents), op.parent_count, op.parent_digest)


def commit_seals(commit: Commit) -> Seals:
    return Seals(commit.member_count, commit.member_digest, commit.unique_revision_count, commit.revision_digest, tuple(commit.parents), commit.parent_count, commit.parent_digest)


# --- the staged manifest (shared with restore) ------------------------------------------------


def begin_staged(root, pub: publish.Publication, incarnation: bytes) -> None:
    """The publish pipeline's step 1 for a typed manifest: the PublishOperation (Uploading) and
    its exact StagedObject ledger, in one command.

    Mirrors publish._begin, except that the incarnation is given rather than read from a
    Visible marker: a restore stages its manifest into a Staging destination.
    """
    op_key = keys.OperationKey(root.root_id, OperationKind.Publish, pub.operation_id).encode()

    def build(view):
        operation = PublishOperation(
            workbench_id=pub.workbench_id,
            workspace_incarnation_id=incarnation,
            path=join(pub.components),
            artifact_revision_id=pub.revision_id,
            expected_generation=pub.expected_generation,
            base_revision_id=None,
            phase=PublishPhase.Uploading,
            object_count=len(pub.body.blocks),
            reused_count=0,
            logical_size=pub.logical_size,
            body_digest_uri=pub.body_digest_uri,
            content_type=pub.content_type,
            producer=pub.producer,
            index_fields=(),
            event_kind=pub.event_kind,
            request_id=pub.request_id,
            created_version=view.version + 1,
            result=None,
            terminal_error=None,
            cleanup_cursor=b"",
        )
        mutations = [Put("operation", op_key, operation)]
        for block in pub.body.blocks:
            mutations.append(
                Put(
                    "staged_object",
                    keys.StagedObjectKey(root.root_id, pub.operation_id, block.index).encode(),
                    StagedObject(
                        artifact_revision_id=pub.revision_id,
                        object_key=artifact_block_key(root.logical_shard_id, root.root_id, pub.revision_id, block.index),
                        upload_id=None,
                        expected_length=block.length,
                        expected_digest_uri="sha256:" + block.sha256.hex(),
                        provider_state=StagedProviderState.Planned,
                        cleanup_state=StagedCleanupState.Owned,
                    ),
                )
            )
        return Built(predicates=[Absent("operation", op_key)], mutations=mutations)

    root.apply(build, digest=intent_digest("publish.begin", pub.operation_id))


def planned_manifest(root, revision_id: bytes, body: bodies.Body) -> list[ArtifactManifest]:
    """The manifest rows a staged body will have, known before its upload."""
    return [
        ArtifactManifest(
            physical_owner_revision_id=revision_id,
            physical_object_index=block.index,
            object_key=artifact_block_key(root.logical_shard_id, root.root_id, revision_id, block.index),
            logical_offset=block.offset,
            object_offset=0,
            length=block.length,
            digest_uri="sha256:" + block.sha256.hex(),
            append_segment=None,
        )
        for block in body.blocks
    ]


def staged_revision(view, root, publish_id: bytes, op: PublishOperation, version: int):
    """(manifest rows, rows still to write, the Available ArtifactRevision, ledger keys) of a
    Finalizing staged publish: publish._publish's revision construction for a body with no
    reused blocks. publish._finalize may already have written the manifest rows; they must then
    be exactly the ledger's (otherwise PredicateFailed), and are not written again."""
    if op.reused_count:
        raise PredicateFailed(f"staged {op.path}: a typed manifest reuses no blocks")
    ledger = publish._ledger(view, root, publish_id)
    rows = publish._manifest_rows(view, root, op, ledger)
    written = publish.read_manifest(view, root, op.artifact_revision_id)
    if written and written != rows:
        raise PredicateFailed(f"staged {op.path}: the manifest rows written at finalize are incomplete")
    revision = ArtifactRevision(
        logical_size=op.logical_size,
        body_digest_uri=op.body_digest_uri,
        manifest_digest_uri="sha256:" + publish.manifest_digest(rows).hex(),
        block_count=len(rows),
        dependency_count=0,
        dependency_depth=0,
        dependency_digest=hashlib.sha256(b"").digest(),
        content_type=op.content_type,
        state=RevisionState.Available,
        reference_epoch=0,
        strong_reference_count=0,
        last_zero_ref_version=0,
        created_version=version,
    )
    return rows, ([] if written else rows), revision, [key for key, _ in ledger]


def staged_publish_rows(root, publish_id: bytes, raw_op: bytes, op: PublishOperation, to_write, ledger_keys, result: bytes):
    """(predicates, mutations) that publish a staged revision's manifest (the rows `to_write`)
    and move its publish operation Finalizing -> Published with `result`, deleting the ledger."""
    op_key = keys.OperationKey(root.root_id, OperationKind.Publish, publish_id).encode()
    mutations = [
        Put("artifact_manifest", keys.ArtifactManifestKey(root.root_id, op.artifact_revision_id, index).encode(), row)
        for index, row in enumerate(to_write)
    ]
    mutations.append(Put("operation", op_key, dataclasses.replace(op, phase=PublishPhase.Published, result=result)))
    mutations += [Delete("staged_object", key) for key in ledger_keys]
    return [ValueEquals("operation", op_key, raw_op)], mutations


def stage(root, pub: publish.Publication, incarnation: bytes, bind) -> None:
    """Upload a typed manifest through the publish pipeline and let `bind()` (one command of the
    owning state machine, using pub.request_id) publish it as staged. On a typed failure the
    publish operation is aborted and cleaned and the error re-raised."""
    lock = publish.OperationLock(root.run_dir, pub.operation_id)
    if not lock.try_acquire():
        raise PredicateFailed(f"publish {pub.operation_id.hex()} is driven by a live process")
    try:
        begin_staged(root, pub, incarnation)
        publish.crash_point("staged-after-begin")
        try:
            publish._upload(root, pub)
            publish._finalize(root, pub.operation_id)
            publish.crash_point("staged-after-finalize")
            bind()
        except NokvError as exc:
            try:
                publish.abort(root, pub.operation_id, reason=f"{type(exc).__name__}: {exc}")
            except NokvError as cleanup:
                _log.error("staged %s: cleanup after %r failed: %s", pub.operation_id.hex(), exc, cleanup)
            raise
    finally:
        lock.release(remove=True)


def settle_attempt(root, publish_id: bytes, op: PublishOperation, bind) -> str:
    """Settle a staged publish a previous driver left behind: "bound" when `bind()` finished a
    Finalizing one whose objects are all present, else the phase it was aborted to."""
    lock = publish.OperationLock(root.run_dir, publish_id)
    if not lock.try_acquire():
        raise PredicateFailed(f"publish {publish_id.hex()} is driven by a live process")
    try:
        if op.phase == PublishPhase.Finalizing:
            with root.read() as view:
                ledger = publish._ledger(view, root, publish_id)
            if all(publish._present(root, row) for _, row in ledger):
                bind()
                return "bound"
            reason = "a staged object is missing"
        else:
            reason = "the staging process was lost"
        return publish.abort(root, publish_id, reason=reason).name
    finally:
        lock.release(remove=True)


def read_publish(root, publish_id: bytes) -> PublishOperation | None:
    with root.read() as view:
        raw = view.get("operation", keys.OperationKey(root.root_id, OperationKind.Publish, publish_id).encode())
    return None if raw is None else PublishOperation.decode(raw)


def attempts(root, attempt_id, limit: int = MAX_STAGE_ATTEMPTS):
    """[(publish id, PublishOperation)] of every staged attempt made so far, in order."""
    out = []
    for attempt in range(limit):
        publish_id = attempt_id(attempt)
        op = read_publish(root, publish_id)
        if op is None:
            break
        out.append((publish_id, op))
    return out


# --- operation rows ---------------------------------------------------------------------------


def _op_key(root, op_id: bytes) -> bytes:
    return keys.OperationKey(root.root_id, OperationKind.BuildCommit, op_id).encode()


def _hold_key(root, op_id: bytes) -> bytes:
    return keys.HistoryHoldKey(root.root_id, HistoryHoldKind.BuildCommit, op_id).encode()


def _head_key(root, incarnation: bytes) -> bytes:
    return keys.WorkbenchCommitHeadKey(root.root_id, incarnation).encode()


def _read_op(view, root, op_id: bytes) -> tuple[bytes, BuildCommitOperation]:
    raw = view.get("operation", _op_key(root, op_id))
    if raw is None:
        raise NotFound(f"no build-commit operation {op_id.hex()}")
    return raw, BuildCommitOperation.decode(raw)


def operation(root, op_id: bytes) -> BuildCommitOperation:
    with root.read() as view:
        return _read_op(view, root, op_id)[1]


def _apply(root, label: str, op_id: bytes, build, *, request_id: bytes | None = None):
    request = request_id or new_id16()
    return root.apply(build, digest=intent_digest(label, op_id, request), request_id=request)


def _cas(root, op_id: bytes, label: str, mutate, *, expect=None, predicates=()):
    """One command: read the operation, check `expect(op)` (raise to refuse), Put mutate(op)."""

    def build(view):
        raw, op = _read_op(view, root, op_id)
        if expect is not None:
            expect(op)
        return Built(predicates=[ValueEquals("operation", _op_key(root, op_id), raw), *predicates], mutations=[Put("operation", _op_key(root, op_id), mutate(op))])

    return _apply(root, label, op_id, build)


def _require(op, phase: BuildCommitPhase):
    if op.phase != phase:
        raise PredicateFailed(f"build-commit {op.commit_id.hex()[:12]} is {op.phase.name}, not {phase.name}")


# --- step 1 -----------------------------------------------------------------------------------


def _authenticate(op: BuildCommitOperation, request: CommitRequest) -> None:
    """An exact retry names the same request; anything else reusing the id is a mismatch."""
    differences = []
    if op.workbench_id != request.workbench_id:
        differences.append("workbench")
    if (op.producer, op.lineage, op.replace) != (request.producer, request.lineage, request.replace):
        differences.append("producer/lineage/replace")
    if request.parents is not None and tuple(op.parents) != tuple(request.parents):
        differences.append("parents")
    if request.expected_head is not _CURRENT and op.expected_head != request.expected_head:
        differences.append("expected head")
    if request.committed_at is not None and op.committed_at_unix_seconds != request.committed_at:
        differences.append("committed_at")
    if differences:
        raise RequestMismatch(f"request id {op.request_id.hex()} was used for another commit ({', '.join(differences)} differ)")


def _check_parents(parents) -> tuple:
    parents = tuple(check_commit_id(p) for p in parents)
    if len(set(parents)) != len(parents):
        raise InvalidInput("a commit names each parent once")
    return parents


def begin(root, request: CommitRequest) -> bytes:
    """Step 1 (or the lookup of an existing operation): returns the operation id."""
    check_workbench_id(request.workbench_id)
    explicit_parents = None if request.parents is None else _check_parents(request.parents)
    op_id = operation_id(root.root_id, request.request_id)
    op_key = _op_key(root, op_id)
    with root.read() as view:
        raw = view.get("operation", op_key)
    if raw is not None:
        _authenticate(BuildCommitOperation.decode(raw), request)
        return op_id
    committed_at = int(time.time()) if request.committed_at is None else request.committed_at

    def build(view):
        if view.get("operation", op_key) is not None:
            raise _Begun()
        raw_wb, workbench = wb.visible(view, root.root_id, request.workbench_id)
        inc = workbench.incarnation_id
        raw_head = view.get("workbench_commit_head", _head_key(root, inc))
        head = None if raw_head is None else WorkbenchCommitHead.decode(raw_head)
        head_id = None if head is None else head.commit_id
        if request.expected_head is not _CURRENT and request.expected_head != head_id:
            raise GenerationConflict(f"{request.workbench_id}: the head is {head_id.hex() if head_id else 'absent'}, not the expected one")
        parents = explicit_parents if explicit_parents is not None else (() if head is None else (head.commit_id,))
        for parent in parents:
            _, parent_commit = read_commit(view, root.root_id, parent)
            if parent_commit is None:
                raise NotFound(f"parent commit {parent.hex()} does not exist")
            if parent_commit.state != CommitState.Sealed:
                raise PredicateFailed(f"parent commit {parent.hex()} is {parent_commit.state.name}")
        rm_key = keys.path_current_key(root.root_id, inc, RUN_MANIFEST)
        raw_rm = view.get("path_current", rm_key)
        if raw_rm is not None and not request.replace:
            raise AlreadyExists(f"{request.workbench_id}:{RUN_MANIFEST_PATH} exists and replace is false")
        frozen = FrozenRequest(
            workbench_id=request.workbench_id,
            incarnation=inc,
            read_version=view.version,
            tree_revision=workbench.revision,
            expected_head=head_id,
            expected_head_generation=0 if head is None else head.head_generation,
            replace=request.replace,
            run_manifest_expected_generation=None if raw_rm is None else PathEntry.decode(raw_rm).generation,
            committed_at=committed_at,
            producer=request.producer,
            lineage=request.lineage,
            parents=parents,
            request_id=request.request_id,
        )
        commit_id = frozen.commit_id(root.root_id)
        uri = frozen.content_digest_uri(commit_id)
        version = view.version + 1
        op = BuildCommitOperation(
            initialization_digest=frozen.initialization_digest(commit_id),
            projection_input_digest=frozen.projection_input_digest(commit_id),
            commit_id=commit_id,
            workbench_id=request.workbench_id,
            source_workspace_incarnation_id=inc,
            read_version=frozen.read_version,
            tree_revision=frozen.tree_revision,
            expected_head=frozen.expected_head,
            expected_head_generation=frozen.expected_head_generation,
            content_digest_uri=uri,
            manifest_digest_uri=uri,
            replace=frozen.replace,
            run_manifest_expected_generation=frozen.run_manifest_expected_generation,
            committed_at_unix_seconds=committed_at,
            producer=request.producer,
            lineage=request.lineage,
            parents=parents,
            request_id=request.request_id,
            phase=BuildCommitPhase.Building,
            run_manifest=None,
            member_cursor=b"",
            member_count=0,
            member_digest=ZERO_DIGEST,
            revision_cursor=b"",
            unique_revision_count=0,
            revision_digest=ZERO_DIGEST,
            parent_cursor=b"",
            parent_count=0,
            parent_digest=ZERO_DIGEST,
            cleanup_cursor=b"",
            result=None,
            terminal_error=None,
            created_version=version,
        )
        hold_key = _hold_key(root, op_id)
        return Built(
            predicates=[
                Absent("operation", op_key),
                Absent("history_hold", hold_key),
                ValueEquals("workspace_current", wb.current_key(root.root_id, request.workbench_id), raw_wb),
                Absent("workbench_commit_head", _head_key(root, inc)) if raw_head is None else ValueEquals("workbench_commit_head", _head_key(root, inc), raw_head),
            ],
            mutations=[
                Put("operation", op_key, op),
                Put("history_hold", hold_key, HistoryHold(frozen.read_version, None, HistoryHoldState.Active, version)),
            ],
            result=op_id,
        )

    digest = intent_digest(
        "commit.begin",
        request.request_id,
        request.workbench_id,
        b"".join(explicit_parents) if explicit_parents is not None else None,
        request.producer,
        request.lineage,
        int(request.replace),
        b"current" if request.expected_head is _CURRENT else request.expected_head,
    )
    try:
        root.apply(build, digest=digest, request_id=request.request_id)
    except _Begun:
        pass
    with root.read() as view:
        _authenticate(_read_op(view, root, op_id)[1], request)
    return op_id


class _Begun(Exception):
    """The operation appeared between the lookup and the build: it is a retry after all."""


# --- step 2 -----------------------------------------------------------------------------------


def _bind_run_manifest(root, op_id: bytes, publish_id: bytes) -> None:
    pub_op = read_publish(root, publish_id)
    if pub_op is None:
        raise NotFound(f"no staged publish {publish_id.hex()}")

    def build(view):
        raw_op, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Building)
        if op.run_manifest is not None:
            raise PredicateFailed(f"build-commit {op_id.hex()} already bound its run manifest")
        raw_pub, pub = publish.read_operation(view, root, publish_id)
        if pub.phase != PublishPhase.Finalizing:
            raise PredicateFailed(f"staged publish {publish_id.hex()} is {pub.phase.name}, not Finalizing")
        expected = FrozenRequest.from_op(op).run_manifest_bytes(op.commit_id)
        if pub.body_digest_uri != sha256_uri(expected) or pub.logical_size != len(expected):
            raise IntegrityError(f"staged publish {publish_id.hex()} does not hold this commit's run manifest")
        version = view.version + 1
        _, to_write, revision, ledger_keys = staged_revision(view, root, publish_id, pub, version)
        rev = pub.artifact_revision_id
        refs = References(view, root.root_id)
        refs.create(rev, revision)
        refs.add(ReferenceKind.Commit, op.commit_id, rev)
        staged_entry = PathEntry(
            generation=(op.run_manifest_expected_generation or 0) + 1,
            artifact_revision_id=rev,
            logical_size=pub.logical_size,
            body_digest_uri=pub.body_digest_uri,
            manifest_digest_uri=revision.manifest_digest_uri,
            dependency_count=0,
            dependency_depth=0,
            content_type=pub.content_type,
            producer=op.producer,
            manifest_id=rev,
            created_version=version,
            modified_version=version,
            typed_index_projection=(),
        )
        binding = RunManifestBinding(
            workspace_incarnation_id=op.source_workspace_incarnation_id,
            artifact_revision_id=rev,
            logical_size=pub.logical_size,
            body_digest_uri=pub.body_digest_uri,
            manifest_digest_uri=revision.manifest_digest_uri,
            content_type=pub.content_type,
            publish_operation_id=publish_id,
        )
        predicates, mutations = refs.rows()
        pub_predicates, pub_mutations = staged_publish_rows(root, publish_id, raw_pub, pub, to_write, ledger_keys, staged_entry.encode())
        predicates += pub_predicates + [ValueEquals("operation", _op_key(root, op_id), raw_op)]
        mutations += pub_mutations
        mutations.append(Put("operation", _op_key(root, op_id), dataclasses.replace(op, run_manifest=binding, unique_revision_count=1)))
        return Built(predicates=predicates, mutations=mutations)

    root.apply(build, digest=intent_digest("commit.stage", op_id, publish_id), request_id=pub_op.request_id)


def _stage_run_manifest(root, op_id: bytes) -> None:
    op = operation(root, op_id)
    _require(op, BuildCommitPhase.Building)
    made = attempts(root, lambda n: staged_publish_id(op_id, n))
    for publish_id, pub in made:
        if pub.phase in (PublishPhase.Cleaned, PublishPhase.Quarantined):
            continue
        if pub.phase == PublishPhase.Published:
            raise IntegrityError(f"staged run manifest {publish_id.hex()} was published outside its commit")
        outcome = settle_attempt(root, publish_id, pub, lambda: _bind_run_manifest(root, op_id, publish_id))
        if outcome == "bound":
            return
    if len(made) >= MAX_STAGE_ATTEMPTS:
        raise PredicateFailed(f"build-commit {op_id.hex()}: {MAX_STAGE_ATTEMPTS} staging attempts failed")
    publish_id = staged_publish_id(op_id, len(made))
    data = FrozenRequest.from_op(op).run_manifest_bytes(op.commit_id)
    body = bodies.from_bytes(data, root.block_size)
    pub = publish.Publication(
        workbench_id=op.workbench_id,
        components=RUN_MANIFEST,
        body=body,
        logical_size=body.size,
        body_digest_uri=body.digest_uri,
        expected_generation=op.run_manifest_expected_generation or 0,
        content_type=MANIFEST_CONTENT_TYPE,
        producer=op.producer,
        event_kind=ChangeEventKind.CommitPublished,
        revision_id=new_id16(),
        operation_id=publish_id,
        request_id=new_id16(),
    )
    stage(root, pub, op.source_workspace_incarnation_id, lambda: _bind_run_manifest(root, op_id, publish_id))


# --- steps 3-6 --------------------------------------------------------------------------------


def _member_batch(root, op_id: bytes, batch: int) -> None:
    def build(view):
        raw_op, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Building)
        if op.run_manifest is None or op.member_cursor == EOF:
            raise PredicateFailed("no member batch is due")
        frozen = view.at(op.read_version)
        items = list(islice(frozen_members(frozen, root, op, op.member_cursor or None), batch + 1))
        take, more = items[:batch], len(items) > batch
        count, digest = op.member_count, op.member_digest
        predicates, mutations = [ValueEquals("operation", _op_key(root, op_id), raw_op)], []
        for _, components, member in take:
            key = keys.CommitMemberKey(root.root_id, op.commit_id, components).encode()
            predicates.append(Absent("commit_member", key))
            mutations.append(Put("commit_member", key, member))
            count += 1
            digest = member_chain(digest, components, member)
        cursor = take[-1][0] if more else EOF
        mutations.append(Put("operation", _op_key(root, op_id), dataclasses.replace(op, member_cursor=cursor, member_count=count, member_digest=digest)))
        return Built(predicates=predicates, mutations=mutations)

    _apply(root, "commit.members", op_id, build)


def _revision_batch(root, op_id: bytes, batch: int) -> None:
    def build(view):
        raw_op, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Building)
        if op.member_cursor != EOF or op.revision_cursor == EOF:
            raise PredicateFailed("no revision batch is due")
        prefix = keys.commit_member_prefix(root.root_id, op.commit_id)
        marker = None if not op.revision_cursor else prefix + op.revision_cursor
        page = scan_prefix(view, "commit_member", prefix, start_after=marker, limit=min(batch, MAX_ITEMS_PER_CALL))
        refs = References(view, root.root_id)
        added = set()
        for _, value in page.items:
            rev = CommitMember.decode(value).artifact_revision_id
            if rev in added or view.get("revision_ref", keys.RevisionRefKey.commit(root.root_id, op.commit_id, rev).encode()) is not None:
                continue
            refs.add(ReferenceKind.Commit, op.commit_id, rev)
            added.add(rev)
        eof = page.next_marker is None
        updated = dataclasses.replace(
            op,
            revision_cursor=EOF if eof else page.items[-1][0][len(prefix):],
            unique_revision_count=op.unique_revision_count + len(added),
        )
        if eof:
            updated = dataclasses.replace(updated, revision_digest=revision_digest(set(_commit_ref_ids(view, root, op.commit_id)) | added))
        predicates, mutations = refs.rows()
        predicates.append(ValueEquals("operation", _op_key(root, op_id), raw_op))
        mutations.append(Put("operation", _op_key(root, op_id), updated))
        return Built(predicates=predicates, mutations=mutations)

    _apply(root, "commit.revisions", op_id, build)


def _parent_batch(root, op_id: bytes, batch: int) -> None:
    def build(view):
        raw_op, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Building)
        if op.revision_cursor != EOF or op.parent_cursor == EOF:
            raise PredicateFailed("no parent batch is due")
        start = 0 if not op.parent_cursor else _U32.unpack(op.parent_cursor)[0]
        chosen = tuple(op.parents[start : start + batch])
        consumers = Consumers(view, root.root_id)
        for parent in chosen:
            consumers.add(parent, CommitConsumerKind.ChildCommit, op.commit_id)
        end = start + len(chosen)
        eof = end >= len(op.parents)
        updated = dataclasses.replace(
            op,
            parent_cursor=EOF if eof else _U32.pack(end),
            parent_count=op.parent_count + len(chosen),
            parent_digest=parent_digest(op.parents) if eof else op.parent_digest,
        )
        predicates, mutations = consumers.rows()
        predicates.append(ValueEquals("operation", _op_key(root, op_id), raw_op))
        mutations.append(Put("operation", _op_key(root, op_id), updated))
        return Built(predicates=predicates, mutations=mutations)

    _apply(root, "commit.parents", op_id, build)


# --- steps 7-8 --------------------------------------------------------------------------------


def _seal(root, op_id: bytes) -> None:
    with root.read() as view:
        raw, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Building)
        if op.member_cursor != EOF or op.revision_cursor != EOF or op.parent_cursor != EOF:
            raise PredicateFailed(f"build-commit {op_id.hex()} has not built its closure yet")
        verify_closure(view, root, op.commit_id, _op_seals(op))

    def expect(current):
        if current != op:
            raise PredicateFailed(f"build-commit {op_id.hex()} changed while it was being verified")

    _cas(root, op_id, "commit.seal", lambda o: dataclasses.replace(o, phase=BuildCommitPhase.Sealing), expect=expect)


def advance(root, op_id: bytes, *, batch: int = MEMBER_BATCH) -> BuildCommitPhase:
    """Run the next durable step of a Building or Sealing operation; returns the phase after it.

    Crash points (NOKVFS_CRASH_AT, see publish.crash_point): commit-after-<step> for step in
    stage, members, revisions, parents, seal, publish; staged-after-begin and
    staged-after-finalize inside the staging step; commit-before/after-publish-command.
    """
    op = operation(root, op_id)
    if op.phase == BuildCommitPhase.Sealing:
        step, run = "publish", lambda: _publish(root, op_id)
    elif op.phase != BuildCommitPhase.Building:
        raise PredicateFailed(f"build-commit {op_id.hex()} is {op.phase.name}: no step is due")
    elif op.run_manifest is None:
        step, run = "stage", lambda: _stage_run_manifest(root, op_id)
    elif op.member_cursor != EOF:
        step, run = "members", lambda: _member_batch(root, op_id, batch)
    elif op.revision_cursor != EOF:
        step, run = "revisions", lambda: _revision_batch(root, op_id, batch)
    elif op.parent_cursor != EOF:
        step, run = "parents", lambda: _parent_batch(root, op_id, batch)
    else:
        step, run = "seal", lambda: _seal(root, op_id)
    run()
    publish.crash_point(f"commit-after-{step}")
    return operation(root, op_id).phase


# --- step 9 -----------------------------------------------------------------------------------


def _publish(root, op_id: bytes) -> None:
    op_key = _op_key(root, op_id)

    def build(view):
        raw_op, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Sealing)
        raw_wb, workbench = wb.visible(view, root.root_id, op.workbench_id)
        inc = workbench.incarnation_id
        if inc != op.source_workspace_incarnation_id:
            raise NotFound(f"workbench {op.workbench_id!r} is another incarnation now")
        head_key = _head_key(root, inc)
        raw_head = view.get("workbench_commit_head", head_key)
        head = None if raw_head is None else WorkbenchCommitHead.decode(raw_head)
        if (None if head is None else head.commit_id) != op.expected_head or (0 if head is None else head.head_generation) != op.expected_head_generation:
            raise GenerationConflict(f"{op.workbench_id}: the head moved since the commit was frozen")
        rm_key = keys.path_current_key(root.root_id, inc, RUN_MANIFEST)
        old_raw = view.get("path_current", rm_key)
        old = None if old_raw is None else PathEntry.decode(old_raw)
        if (None if old is None else old.generation) != op.run_manifest_expected_generation:
            raise GenerationConflict(f"{op.workbench_id}:{RUN_MANIFEST_PATH} changed since the commit was frozen")
        version = view.version + 1
        binding = op.run_manifest
        refs = References(view, root.root_id)
        owner = publish.path_owner(inc, RUN_MANIFEST)
        refs.add(ReferenceKind.Path, owner, binding.artifact_revision_id)
        if old is not None:
            refs.remove(ReferenceKind.Path, owner, old.artifact_revision_id)
        entry = PathEntry(
            generation=1 if old is None else old.generation + 1,
            artifact_revision_id=binding.artifact_revision_id,
            logical_size=binding.logical_size,
            body_digest_uri=binding.body_digest_uri,
            manifest_digest_uri=binding.manifest_digest_uri,
            dependency_count=0,
            dependency_depth=0,
            content_type=binding.content_type,
            producer=op.producer,
            manifest_id=binding.artifact_revision_id,
            created_version=version if old is None else old.created_version,
            modified_version=version,
            typed_index_projection=(),
        )
        commit = Commit(
            source_workspace_incarnation_id=inc,
            source_workbench_id=op.workbench_id,
            projection_input_digest=op.projection_input_digest,
            committed_at_unix_seconds=op.committed_at_unix_seconds,
            build_operation_id=op_id,
            tree_manifest_revision=op.tree_revision,
            run_manifest_revision_id=binding.artifact_revision_id,
            tree_digest_uri="sha256:" + op.member_digest.hex(),
            member_count=op.member_count,
            member_digest=op.member_digest,
            unique_revision_count=op.unique_revision_count,
            revision_digest=op.revision_digest,
            parents=tuple(op.parents),
            parent_count=op.parent_count,
            parent_digest=op.parent_digest,
            producer=op.producer,
            lineage=op.lineage,
            consumer_count=0,
            consumer_epoch=0,
            last_zero_consumer_version=0,
            state=CommitState.Sealed,
            retirement_cursor=b"",
            created_version=version,
        )
        consumers = Consumers(view, root.root_id)
        consumers.create(op.commit_id, commit)
        head_owner = keys.workbench_head_consumer_owner(inc)
        consumers.add(op.commit_id, CommitConsumerKind.WorkbenchHead, head_owner)
        if head is not None:
            consumers.remove(head.commit_id, CommitConsumerKind.WorkbenchHead, head_owner)
        new_head = WorkbenchCommitHead(op.commit_id, (0 if head is None else head.head_generation) + 1)
        result = CommitResult(
            commit_id=op.commit_id,
            operation_id=op_id,
            workbench_id=op.workbench_id,
            head_generation=new_head.head_generation,
            run_manifest_generation=entry.generation,
            tree_digest_uri=commit.tree_digest_uri,
            member_count=op.member_count,
            unique_revision_count=op.unique_revision_count,
            parents=tuple(op.parents),
            committed_at_unix_seconds=op.committed_at_unix_seconds,
            commit_version=version,
        ).to_bytes()
        hold_key = _hold_key(root, op_id)
        raw_hold = view.get("history_hold", hold_key)
        if raw_hold is None:
            raise IntegrityError(f"build-commit {op_id.hex()} lost its HistoryHold")
        predicates, mutations = refs.rows()
        consumer_predicates, consumer_mutations = consumers.rows()
        predicates += consumer_predicates
        mutations += consumer_mutations
        wb_predicate, wb_mutation = wb.advance_revision(root.root_id, op.workbench_id, raw_wb, version)
        predicates += [
            ValueEquals("operation", op_key, raw_op),
            wb_predicate,
            Absent("workbench_commit_head", head_key) if raw_head is None else ValueEquals("workbench_commit_head", head_key, raw_head),
            Absent("path_current", rm_key) if old_raw is None else ValueEquals("path_current", rm_key, old_raw),
            ValueEquals("history_hold", hold_key, raw_hold),
        ]
        mutations += [
            Put("path_current", rm_key, entry),
            wb_mutation,
            Put("workbench_commit_head", head_key, new_head),
            Put("operation", op_key, dataclasses.replace(op, phase=BuildCommitPhase.Complete, result=result)),
            Delete("history_hold", hold_key),
        ]
        mutations += publish.index_mutations(root.root_id, inc, RUN_MANIFEST, old, entry)
        event = wb.event(workbench, ChangeEventKind.CommitPublished, RUN_MANIFEST_PATH, None if head is None else head.commit_id, op.commit_id)
        return Built(predicates=predicates, mutations=mutations, events=[event], result=result)

    publish.crash_point("commit-before-publish-command")
    root.apply(build, digest=intent_digest("commit.publish", op_id), request_id=_publish_request_id(op_id))
    publish.crash_point("commit-after-publish-command")


def _terminal_result(root, op_id: bytes, op: BuildCommitOperation) -> CommitResult:
    """The original result, after reconstructing and verifying the canonical envelope against
    the operation's binding and the staged publish operation's durable result."""
    frozen = FrozenRequest.from_op(op)
    commit_id = frozen.commit_id(root.root_id)
    data = frozen.run_manifest_bytes(commit_id)
    binding = op.run_manifest
    problems = []
    if commit_id != op.commit_id:
        problems.append("commit id")
    if frozen.projection_input_digest(commit_id) != op.projection_input_digest or frozen.initialization_digest(commit_id) != op.initialization_digest:
        problems.append("request digests")
    if op.content_digest_uri != frozen.content_digest_uri(commit_id) or op.manifest_digest_uri != op.content_digest_uri:
        problems.append("manifest digests")
    if binding is None or binding.body_digest_uri != sha256_uri(data) or binding.logical_size != len(data):
        problems.append("run-manifest binding")
    else:
        pub = read_publish(root, binding.publish_operation_id)
        staged = None if pub is None or pub.result is None else PathEntry.decode(pub.result)
        if (
            pub is None
            or pub.phase != PublishPhase.Published
            or staged is None
            or (staged.artifact_revision_id, staged.body_digest_uri, staged.logical_size, staged.manifest_digest_uri)
            != (binding.artifact_revision_id, binding.body_digest_uri, binding.logical_size, binding.manifest_digest_uri)
        ):
            problems.append("staged publish result")
    result = CommitResult.from_bytes(op.result)
    if result.commit_id != op.commit_id or result.operation_id != op_id:
        problems.append("stored result")
    if problems:
        raise IntegrityError(f"build-commit {op_id.hex()}: the terminal envelope does not verify ({', '.join(problems)})")
    return result


# --- driving, abort and cleanup ---------------------------------------------------------------


def build(root, workbench_id: str, *, parents=None, producer: str = "", lineage: str = "", replace: bool = True, expected_head=_CURRENT, request_id: bytes | None = None, committed_at: int | None = None, batch: int = MEMBER_BATCH) -> CommitResult:
    """Commit the workbench's current tree (steps 1-9), or return the original result of an
    exact retry of `request_id`. A lost race or failure aborts and cleans the build and raises."""
    request = CommitRequest(
        workbench_id=workbench_id,
        request_id=request_id or new_id16(),
        parents=None if parents is None else tuple(parents),
        producer=producer,
        lineage=lineage,
        replace=replace,
        expected_head=expected_head,
        committed_at=committed_at,
    )
    op_id = begin(root, request)
    return resume(root, op_id, batch=batch)


def resume(root, op_id: bytes, *, batch: int = MEMBER_BATCH, abort_on_failure: bool = True) -> CommitResult:
    """Drive an operation to its terminal phase. Complete returns the result; a cleaned build
    raises CommitAborted; a typed failure aborts and cleans the build and is re-raised."""
    lock = publish.OperationLock(root.run_dir, op_id)
    if not lock.try_acquire():
        raise PredicateFailed(f"build-commit {op_id.hex()} is driven by a live process")
    try:
        while True:
            op = operation(root, op_id)
            if op.phase == BuildCommitPhase.Complete:
                return _terminal_result(root, op_id, op)
            if op.phase in (BuildCommitPhase.Cleaned, BuildCommitPhase.Quarantined):
                raise CommitAborted(f"build-commit {op_id.hex()} was aborted ({op.phase.name}): {op.terminal_error}")
            if op.phase in (BuildCommitPhase.Aborting, BuildCommitPhase.Cleaning):
                _clean(root, op_id, batch)
                continue
            try:
                advance(root, op_id, batch=batch)
            except NokvError as exc:
                if operation(root, op_id) != op:
                    continue  # somebody else moved it on (an abort, a concurrent driver): re-read
                if not abort_on_failure:
                    raise
                try:
                    abort(root, op_id, reason=f"{type(exc).__name__}: {exc}", batch=batch)
                except NokvError as cleanup:
                    _log.error("build-commit %s: cleanup after %r failed: %s", op_id.hex(), exc, cleanup)
                raise
    finally:
        lock.release(remove=True)


def abort(root, op_id: bytes, *, reason: str, batch: int = MEMBER_BATCH) -> BuildCommitPhase:
    """Take a build to Aborting (Building, or Sealing with fenced proof that step 9 did not
    happen), then clean it. Returns the terminal phase (Complete if publication won)."""
    op = operation(root, op_id)
    if op.phase in BUILD_TERMINAL:
        return op.phase
    if op.phase in (BuildCommitPhase.Building, BuildCommitPhase.Sealing):

        def take_over(view):
            raw, current = _read_op(view, root, op_id)
            if current.phase not in (BuildCommitPhase.Building, BuildCommitPhase.Sealing):
                raise PredicateFailed(f"build-commit {op_id.hex()} moved to {current.phase.name}")
            predicates = [ValueEquals("operation", _op_key(root, op_id), raw)]
            if current.phase == BuildCommitPhase.Sealing:
                # Fenced proof that step 9 did not happen: no Commit, no dedupe row of its
                # request (the head names only a Commit that exists).
                commit_key = keys.CommitKey(root.root_id, current.commit_id).encode()
                dedupe_key = keys.CommandDedupeKey(root.root_id, _publish_request_id(op_id)).encode()
                if view.get("commit", commit_key) is not None or view.get("command_dedupe", dedupe_key) is not None:
                    raise PredicateFailed(f"build-commit {op_id.hex()} was published")
                predicates += [Absent("commit", commit_key), Absent("command_dedupe", dedupe_key)]
            aborting = dataclasses.replace(current, phase=BuildCommitPhase.Aborting, terminal_error=reason[:1024])
            return Built(predicates=predicates, mutations=[Put("operation", _op_key(root, op_id), aborting)])

        try:
            _apply(root, "commit.abort", op_id, take_over)
        except PredicateFailed:
            current = operation(root, op_id)
            if current.phase == BuildCommitPhase.Complete:
                return current.phase
            if current.phase not in (BuildCommitPhase.Aborting, BuildCommitPhase.Cleaning):
                raise
    return _clean(root, op_id, batch)


def _clean_batch(root, op_id: bytes, stage: bytes, collect) -> bool:
    """One cleanup command: `collect(view, op)` returns (predicates, mutations) of at most one
    batch, or None when the stage has nothing left. Returns whether anything was removed."""
    done = []

    def build(view):
        raw, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Cleaning)
        found = collect(view, op)
        if found is None:
            raise _Nothing()
        predicates, mutations = found
        predicates.append(ValueEquals("operation", _op_key(root, op_id), raw))
        mutations.append(Put("operation", _op_key(root, op_id), dataclasses.replace(op, cleanup_cursor=stage)))
        done.append(True)
        return Built(predicates=predicates, mutations=mutations)

    try:
        _apply(root, "commit.clean", op_id, build)
    except _Nothing:
        return False
    return bool(done)


class _Nothing(Exception):
    """A cleanup stage found nothing left to remove."""


def _clean(root, op_id: bytes, batch: int = MEMBER_BATCH) -> BuildCommitPhase:
    op = operation(root, op_id)
    if op.phase in BUILD_TERMINAL:
        return op.phase
    if op.phase == BuildCommitPhase.Aborting:
        _cas(root, op_id, "commit.cleaning", lambda o: dataclasses.replace(o, phase=BuildCommitPhase.Cleaning), expect=lambda o: _require(o, BuildCommitPhase.Aborting))
        publish.crash_point("commit-after-cleaning")
    _require(operation(root, op_id), BuildCommitPhase.Cleaning)
    # The staged run manifest: a publish attempt that is not terminal is aborted (the bind
    # needs Building, so none can publish any more); a bound one's Commit ref goes below.
    quarantined = False
    for publish_id, pub in attempts(root, lambda n: staged_publish_id(op_id, n)):
        phase = pub.phase
        if phase not in publish.TERMINAL:
            phase = publish.abort(root, publish_id, reason="its commit was aborted")
        quarantined |= phase == PublishPhase.Quarantined
    limit = min(batch, MAX_ITEMS_PER_CALL)

    def members(view, op):
        page = scan_prefix(view, "commit_member", keys.commit_member_prefix(root.root_id, op.commit_id), limit=limit)
        return None if not page.items else ([], [Delete("commit_member", k) for k, _ in page.items])

    def revisions(view, op):
        prefix = keys.revision_ref_prefix(root.root_id, ReferenceKind.Commit, keys.commit_reference_owner(op.commit_id))
        ids = [k[len(prefix):] for k, _ in scan_prefix(view, "revision_ref", prefix, limit=limit).items]
        if not ids:
            return None
        refs = References(view, root.root_id)
        for rev in ids:
            refs.remove(ReferenceKind.Commit, op.commit_id, rev)
        return refs.rows()

    def parents(view, op):
        consumers = Consumers(view, root.root_id)
        found = 0
        for parent in op.parents:
            if found < limit and consumers.exists(parent, CommitConsumerKind.ChildCommit, op.commit_id):
                consumers.remove(parent, CommitConsumerKind.ChildCommit, op.commit_id)
                found += 1
        return None if not found else consumers.rows()

    for stage, collect in ((b"members", members), (b"revisions", revisions), (b"parents", parents)):
        while _clean_batch(root, op_id, stage, collect):
            publish.crash_point(f"commit-after-clean-{stage.decode()}")
    final = BuildCommitPhase.Quarantined if quarantined else BuildCommitPhase.Cleaned
    hold_key = _hold_key(root, op_id)

    def finish(view):
        raw, op = _read_op(view, root, op_id)
        _require(op, BuildCommitPhase.Cleaning)
        mutations = [Put("operation", _op_key(root, op_id), dataclasses.replace(op, phase=final))]
        if view.get("history_hold", hold_key) is not None:
            mutations.append(Delete("history_hold", hold_key))
        return Built(predicates=[ValueEquals("operation", _op_key(root, op_id), raw)], mutations=mutations)

    _apply(root, "commit.cleaned", op_id, finish)
    return final


def pending(view, root) -> list[tuple[bytes, BuildCommitOperation]]:
    return operations.pending(view, root, OperationKind.BuildCommit, BUILD_TERMINAL)


def recover(root) -> list[tuple[str, str]]:
    """Resume every build and retirement whose owning process is gone: (op hex, outcome)."""
    with root.read() as view:
        builds = pending(view, root)
        retirements = _pending_retirements(view, root)
    outcomes = []
    for op_id, _ in builds:
        lock = publish.OperationLock(root.run_dir, op_id)
        if not lock.try_acquire():
            continue  # a live process still drives it
        lock.release(remove=False)
        try:
            resume(root, op_id)
            outcomes.append((op_id.hex(), "complete"))
        except NokvError as exc:
            outcomes.append((op_id.hex(), operation(root, op_id).phase.name.lower()))
            _log.info("recovery of build-commit %s: %s", op_id.hex(), exc)
    for op_id, retire_op in retirements:
        lock = publish.OperationLock(root.run_dir, op_id)
        if not lock.try_acquire():
            continue
        lock.release(remove=False)
        try:
            _drive_retire(root, op_id)
            outcomes.append((op_id.hex(), "retired"))
        except NokvError as exc:
            _log.error("recovery of commit retirement %s failed: %s", op_id.hex(), exc)
            outcomes.append((op_id.hex(), f"failed: {exc}"))
    return outcomes


# --- retirement -------------------------------------------------------------------------------


def _retire_key(root, op_id: bytes) -> bytes:
    return keys.OperationKey(root.root_id, OperationKind.CommitRetire, op_id).encode()


def _read_retire(view, root, op_id: bytes) -> tuple[bytes, CommitRetireOperation]:
    raw = view.get("operation", _retire_key(root, op_id))
    if raw is None:
        raise NotFound(f"no commit-retire operation {op_id.hex()}")
    return raw, CommitRetireOperation.decode(raw)


def retire_operation(root, op_id: bytes) -> CommitRetireOperation:
    with root.read() as view:
        return _read_retire(view, root, op_id)[1]


def claim_retirement(root, commit_id: bytes, *, expected_epoch: int | None = None) -> bytes:
    """The retirement CAS: Sealed, no consumers, the expected consumer epoch -> Retiring, with
    its CommitRetireOperation (Claiming). Returns the operation id."""
    check_commit_id(commit_id)
    op_id = retire_operation_id(root.root_id, commit_id)
    if expected_epoch is None:
        with root.read() as view:
            _, commit = read_commit(view, root.root_id, commit_id)
        if commit is None:
            raise NotFound(f"commit {commit_id.hex()} does not exist")
        expected_epoch = commit.consumer_epoch

    def build(view):
        raw, commit = read_commit(view, root.root_id, commit_id)
        if commit is None:
            raise NotFound(f"commit {commit_id.hex()} does not exist")
        if commit.state != CommitState.Sealed:
            raise PredicateFailed(f"commit {commit_id.hex()} is {commit.state.name}")
        if commit.consumer_count != 0:
            raise CommitInUse(f"commit {commit_id.hex()} has {commit.consumer_count} consumer(s) (head, tag, lease or child)")
        if commit.consumer_epoch != expected_epoch:
            raise PredicateFailed(f"commit {commit_id.hex()} is at consumer epoch {commit.consumer_epoch}, expected {expected_epoch}")
        key = keys.CommitKey(root.root_id, commit_id).encode()
        op = CommitRetireOperation(
            commit_id=commit_id,
            consumer_epoch=expected_epoch,
            phase=CommitRetirePhase.Claiming,
            member_cursor=b"",
            revision_cursor=b"",
            parent_cursor=b"",
            released_member_count=0,
            released_revision_count=0,
            released_parent_count=0,
            result=None,
            terminal_error=None,
            created_version=view.version + 1,
        )
        return Built(
            predicates=[ValueEquals("commit", key, raw), Absent("operation", _retire_key(root, op_id))],
            mutations=[Put("commit", key, dataclasses.replace(commit, state=CommitState.Retiring)), Put("operation", _retire_key(root, op_id), op)],
        )

    _apply(root, "commit.retire-claim", op_id, build)
    return op_id


def retire(root, commit_id: bytes, *, expected_epoch: int | None = None, batch: int = MEMBER_BATCH) -> CommitRetireOperation:
    """Retire a commit nothing consumes: claim it, then release its members, unique revision
    refs and parent consumers in bounded batches, then publish Retired."""
    op_id = retire_operation_id(root.root_id, check_commit_id(commit_id))
    with root.read() as view:
        exists = view.get("operation", _retire_key(root, op_id)) is not None
    if not exists:
        claim_retirement(root, commit_id, expected_epoch=expected_epoch)
    return _drive_retire(root, op_id, batch=batch)


def _retire_cas(root, op_id: bytes, label: str, collect):
    """One retirement command: collect(view, op, commit) -> (predicates, mutations, new op)."""

    def build(view):
        raw, op = _read_retire(view, root, op_id)
        raw_commit, commit = read_commit(view, root.root_id, op.commit_id)
        predicates, mutations, updated = collect(view, op, commit)
        commit_key = keys.CommitKey(root.root_id, op.commit_id).encode()
        new_commit = dataclasses.replace(commit, retirement_cursor=_retirement_cursor(updated))
        if updated.phase == CommitRetirePhase.Complete:
            new_commit = dataclasses.replace(new_commit, state=CommitState.Retired)
        predicates += [ValueEquals("operation", _retire_key(root, op_id), raw), ValueEquals("commit", commit_key, raw_commit)]
        mutations += [Put("operation", _retire_key(root, op_id), updated), Put("commit", commit_key, new_commit)]
        return Built(predicates=predicates, mutations=mutations)

    _apply(root, label, op_id, build)


def _retirement_cursor(op: CommitRetireOperation) -> bytes:
    """Commit.retirement_cursor: the stage reached and its cursor (EOF once Retired)."""
    if op.phase == CommitRetirePhase.Complete:
        return EOF
    if op.phase != CommitRetirePhase.Releasing:
        return b""
    if op.revision_cursor != EOF:
        return b"revisions:" + op.revision_cursor
    if op.parent_cursor != EOF:
        return b"parents:" + op.parent_cursor
    return b"members:" + op.member_cursor


def _retire_quarantine(root, op_id: bytes, evidence: str) -> None:
    def build(view):
        raw, op = _read_retire(view, root, op_id)
        return Built(
            predicates=[ValueEquals("operation", _retire_key(root, op_id), raw)],
            mutations=[Put("operation", _retire_key(root, op_id), dataclasses.replace(op, phase=CommitRetirePhase.Quarantined, terminal_error=evidence[:1024]))],
        )

    _apply(root, "commit.retire-quarantine", op_id, build)


def _drive_retire(root, op_id: bytes, *, batch: int = MEMBER_BATCH) -> CommitRetireOperation:
    limit = min(batch, MAX_ITEMS_PER_CALL)
    lock = publish.OperationLock(root.run_dir, op_id)
    if not lock.try_acquire():
        raise PredicateFailed(f"commit retirement {op_id.hex()} is driven by a live process")
    try:
        rechecked = False
        while True:
            op = retire_operation(root, op_id)
            if op.phase == CommitRetirePhase.Complete:
                return op
            if op.phase == CommitRetirePhase.Quarantined:
                raise IntegrityError(f"commit retirement {op_id.hex()} is quarantined: {op.terminal_error}")
            if not rechecked and op.member_cursor == b"":
                # Recheck the seals from the rows while the members still exist.
                with root.read() as view:
                    _, commit = read_commit(view, root.root_id, op.commit_id)
                    try:
                        _recheck_retiring(view, root, commit, op)
                    except IntegrityError as exc:
                        _retire_quarantine(root, op_id, str(exc))
                        raise
                rechecked = True
            if op.phase == CommitRetirePhase.Claiming:
                _retire_cas(root, op_id, "commit.retire-release", lambda v, o, c: ([], [], dataclasses.replace(o, phase=CommitRetirePhase.Releasing)))
                continue
            if op.revision_cursor != EOF:
                _retire_cas(root, op_id, "commit.retire-revisions", lambda v, o, c: _release_revisions(v, root, o, limit))
            elif op.parent_cursor != EOF:
                _retire_cas(root, op_id, "commit.retire-parents", lambda v, o, c: _release_parents(v, root, o, c, limit))
            elif op.member_cursor != EOF:
                _retire_cas(root, op_id, "commit.retire-members", lambda v, o, c: _release_members(v, root, o, limit))
            else:
                try:
                    _retire_cas(root, op_id, "commit.retired", lambda v, o, c: _finish_retire(o, c))
                except IntegrityError as exc:
                    _retire_quarantine(root, op_id, str(exc))
                    raise
            publish.crash_point("commit-after-retire-batch")
    finally:
        lock.release(remove=True)


def _recheck_retiring(view, root, commit: Commit, op: CommitRetireOperation) -> None:
    if commit is None or commit.state != CommitState.Retiring:
        raise IntegrityError(f"commit {op.commit_id.hex()} is not Retiring under its retirement")
    if op.revision_cursor == b"" and op.parent_cursor == b"":
        verify_closure(view, root, op.commit_id, commit_seals(commit))
        return
    # Part of the set is released: the members still seal the revision set, and what remains
    # is exactly the part after the cursors.
    count, digest, revisions = 0, ZERO_DIGEST, set()
    for _, components, member in _member_rows(view, root, op.commit_id):
        count += 1
        digest = member_chain(digest, components, member)
        revisions.add(member.artifact_revision_id)
    if (count, digest) != (commit.member_count, commit.member_digest) or revision_digest(revisions) != commit.revision_digest:
        raise IntegrityError(f"commit {op.commit_id.hex()}: the members no longer match the seals")
    remaining = _commit_ref_ids(view, root, op.commit_id)
    cursor = b"" if op.revision_cursor == EOF else op.revision_cursor
    expected = sorted(r for r in revisions if op.revision_cursor != EOF and r > cursor)
    if remaining != expected or op.released_revision_count + len(remaining) != commit.unique_revision_count:
        raise IntegrityError(f"commit {op.commit_id.hex()}: the remaining Commit refs do not follow the revision cursor")
    if parent_digest(commit.parents) != commit.parent_digest:
        raise IntegrityError(f"commit {op.commit_id.hex()}: the parents no longer match the parent seal")


def _release_revisions(view, root, op: CommitRetireOperation, limit: int):
    prefix = keys.revision_ref_prefix(root.root_id, ReferenceKind.Commit, keys.commit_reference_owner(op.commit_id))
    marker = None if not op.revision_cursor else prefix + op.revision_cursor
    page = scan_prefix(view, "revision_ref", prefix, start_after=marker, limit=limit)
    refs = References(view, root.root_id)
    for key, _ in page.items:
        refs.remove(ReferenceKind.Commit, op.commit_id, key[len(prefix):])
    predicates, mutations = refs.rows()
    cursor = EOF if page.next_marker is None else page.items[-1][0][len(prefix):]
    return predicates, mutations, dataclasses.replace(op, revision_cursor=cursor, released_revision_count=op.released_revision_count + len(page.items))


def _release_parents(view, root, op: CommitRetireOperation, commit: Commit, limit: int):
    start = 0 if not op.parent_cursor else _U32.unpack(op.parent_cursor)[0]
    chosen = commit.parents[start : start + limit]
    consumers = Consumers(view, root.root_id)
    for parent in chosen:
        consumers.remove(parent, CommitConsumerKind.ChildCommit, op.commit_id)
    predicates, mutations = consumers.rows()
    end = start + len(chosen)
    cursor = EOF if end >= len(commit.parents) else _U32.pack(end)
    return predicates, mutations, dataclasses.replace(op, parent_cursor=cursor, released_parent_count=op.released_parent_count + len(chosen))


def _release_members(view, root, op: CommitRetireOperation, limit: int):
    prefix = keys.commit_member_prefix(root.root_id, op.commit_id)
    marker = None if not op.member_cursor else prefix + op.member_cursor
    page = scan_prefix(view, "commit_member", prefix, start_after=marker, limit=limit)
    mutations = [Delete("commit_member", k) for k, _ in page.items]
    cursor = EOF if page.next_marker is None else page.items[-1][0][len(prefix):]
    return [], mutations, dataclasses.replace(op, member_cursor=cursor, released_member_count=op.released_member_count + len(page.items))


def _finish_retire(op: CommitRetireOperation, commit: Commit):
    released = (op.released_member_count, op.released_revision_count, op.released_parent_count)
    sealed = (commit.member_count, commit.unique_revision_count, commit.parent_count)
    if released != sealed:
        raise IntegrityError(f"commit {op.commit_id.hex()}: released {released}, sealed {sealed}")
    result = canonical_json.dumps({"commit_id": op.commit_id.hex(), "released_members": released[0], "released_revisions": released[1], "released_parents": released[2]})
    return [], [], dataclasses.replace(op, phase=CommitRetirePhase.Complete, result=result)


def _pending_retirements(view, root):
    return operations.pending(view, root, OperationKind.CommitRetire, RETIRE_TERMINAL)


# --- lookup -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitInfo:
    commit_id: bytes
    commit: Commit

    @property
    def hex(self) -> str:
        return self.commit_id.hex()

    @property
    def state(self) -> CommitState:
        return self.commit.state

    @property
    def parents(self) -> tuple:
        return tuple(self.commit.parents)


def get(root, commit_id: bytes) -> CommitInfo:
    with root.read() as view:
        _, commit = read_commit(view, root.root_id, check_commit_id(commit_id))
    if commit is None:
        raise NotFound(f"commit {commit_id.hex()} does not exist")
    return CommitInfo(commit_id, commit)


def head(root, workbench_id: str) -> WorkbenchCommitHead | None:
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        raw = view.get("workbench_commit_head", _head_key(root, workbench.incarnation_id))
    return None if raw is None else WorkbenchCommitHead.decode(raw)


def log(root, workbench_id: str, *, limit: int = 1000) -> list[CommitInfo]:
    """The head and its first-parent ancestors, newest first (at most `limit`)."""
    out = []
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        raw = view.get("workbench_commit_head", _head_key(root, workbench.incarnation_id))
        current = None if raw is None else WorkbenchCommitHead.decode(raw).commit_id
        while current is not None and len(out) < limit:
            _, commit = read_commit(view, root.root_id, current)
            if commit is None:
                break
            out.append(CommitInfo(current, commit))
            current = commit.parents[0] if commit.parents else None
    return out


def resolve(root, workbench_id: str, prefix: str) -> bytes:
    """The one commit of the workbench whose lowercase hex id starts with `prefix`.

    AmbiguousReference lists every match; NotFound when none matches.
    """
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        return resolve_in(view, root, workbench, prefix)


def resolve_in(view, root, workbench: wb.Workbench, prefix: str) -> bytes:
    """`resolve` within one read view, for a workbench already read from it."""
    if not isinstance(prefix, str) or not prefix or len(prefix) > 64 or any(c not in "0123456789abcdef" for c in prefix):
        raise InvalidInput(f"a commit reference is 1..64 lowercase hex characters, not {prefix!r}")
    matches = []
    key_prefix = root.root_id + bytes.fromhex(prefix[: len(prefix) // 2 * 2])
    marker = None
    while True:
        page = scan_prefix(view, "commit", key_prefix, start_after=marker)
        for key, value in page.items:
            commit_id = keys.CommitKey.decode(key).commit_id
            if commit_id.hex().startswith(prefix) and Commit.decode(value).source_workspace_incarnation_id == workbench.incarnation_id:
                matches.append(commit_id)
        if page.next_marker is None:
            break
        marker = page.next_marker
    if not matches:
        raise NotFound(f"no commit {prefix} in {workbench.workbench_id}")
    if len(matches) > 1:
        hexes = [m.hex() for m in matches]
        raise AmbiguousReference(f"commit prefix {prefix} is ambiguous in {workbench.workbench_id}: " + ", ".join(hexes), hexes)
    return matches[0]


# --- as-of reads of a commit's tree -----------------------------------------------------------


class CommitTree:
    """A Sealed commit's tree served like a workbench at a version: stat, direct children and a
    recursive listing over its CommitMember rows (bounded delimiter scans, never a scan per
    descendant). Entries are PathEntry projections (`entry_of`) of the members."""

    def __init__(self, view, root, commit_id: bytes, commit: Commit, workbench: wb.Workbench):
        self.view = view
        self.root = root
        self.commit_id = commit_id
        self.commit = commit
        self.workbench = workbench
        self._prefix = keys.commit_member_prefix(root.root_id, commit_id)

    def entry(self, components: tuple[str, ...]) -> PathEntry | None:
        raw = self.view.get("commit_member", keys.CommitMemberKey(self.root.root_id, self.commit_id, components).encode())
        return None if raw is None else entry_of(CommitMember.decode(raw), self.commit.created_version)

    def stat(self, components: tuple[str, ...]) -> listing.Stat:
        def directory(path):
            return listing.Stat(path, listing.DIRECTORY, None, self.commit.tree_manifest_revision, self.view.version, self.workbench)

        if not components:
            return directory("")
        path = join(components)
        if components[0] not in wb.SECTIONS:
            raise NotFound(f"{self.workbench.workbench_id}@{self.commit_id.hex()[:12]}:{path} does not exist")
        if len(components) == 1:
            return directory(path)
        found = self.entry(components)
        if found is not None:
            return listing.Stat(path, listing.FILE, found, found.generation, self.view.version, self.workbench)
        sub = self._prefix + subtree_prefix(components)
        if self.view.seek("commit_member", sub, within=sub) is not None:
            return directory(path)
        raise NotFound(f"{self.workbench.workbench_id}@{self.commit_id.hex()[:12]}:{path} does not exist")

    def children_page(self, components: tuple[str, ...], *, start_after: bytes | None = None, limit: int = MAX_ITEMS_PER_CALL):
        """([listing.Child], next anchor or None), like listing.children_page."""
        if not components:
            names = sorted(s.encode() for s in wb.SECTIONS)
            start = 0 if start_after is None else next((i for i, n in enumerate(names) if n > start_after), len(names))
            chosen = names[start : start + limit]
            anchor = chosen[-1] if start + limit < len(names) and chosen else None
            return [listing.Child(n.decode(), listing.DIRECTORY, None) for n in chosen], anchor
        info = self.stat(components)
        if info.kind != listing.DIRECTORY:
            raise NotADirectory(f"{info.path} is a file")
        out, anchor = [], start_after
        while not out:  # never an empty page with an anchor (a page of only the marker)
            page = list_children(self.view, "commit_member", self._prefix + subtree_prefix(components), start_after=anchor, limit=limit)
            for item in page.items:
                name = unordered_path(item.child + b"\x01")[0]
                if not item.is_prefix and name == attributes.DIRECTORY_MARKER:
                    continue  # a directory's attributes, not a child
                if item.is_prefix:
                    out.append(listing.Child(name, listing.DIRECTORY, None))
                else:
                    out.append(listing.Child(name, listing.FILE, entry_of(CommitMember.decode(item.value), self.commit.created_version)))
            anchor = page.next_marker
            if anchor is None:
                break
        return out, anchor

    def files(self, path: str = "", *, with_markers: bool = False):
        """Every file below `path` as (path below it, PathEntry), in canonical order (directory
        markers only `with_markers`, as listing.list_recursive)."""
        components = listing.split(path)
        prefix = self._prefix + subtree_prefix(components)
        marker = None
        while True:
            page = scan_prefix(self.view, "commit_member", prefix, start_after=marker)
            for key, value in page.items:
                full = unordered_path(key[len(self._prefix):])
                if not with_markers and full[-1] == attributes.DIRECTORY_MARKER:
                    continue
                yield join(full[len(components):]), entry_of(CommitMember.decode(value), self.commit.created_version)
            if page.next_marker is None:
                return
            marker = page.next_marker


def tree_view(view, root, commit_id: bytes) -> CommitTree:
    """The tree of a Sealed commit (NotFound for Retiring/Retired: their members are released)."""
    _, commit = read_commit(view, root.root_id, check_commit_id(commit_id))
    if commit is None or commit.state != CommitState.Sealed:
        raise NotFound(f"commit {commit_id.hex()} is not a Sealed commit")
    raw = view.get("workspace_current", wb.current_key(root.root_id, commit.source_workbench_id))
    if raw is None:
        raise NotFound(f"the workbench of commit {commit_id.hex()} is gone")
    workbench = wb.Workbench.from_record(commit.source_workbench_id, WorkspaceCurrent.decode(raw))
    return CommitTree(view, root, commit_id, commit, workbench)


def members(view, root, commit_id: bytes, *, start_after: bytes | None = None, limit: int = MAX_ITEMS_PER_CALL):
    """One bounded page of a commit's members: ([(path text, CommitMember)], next marker)."""
    prefix = keys.commit_member_prefix(root.root_id, check_commit_id(commit_id))
    page = scan_prefix(view, "commit_member", prefix, start_after=start_after, limit=limit)
    return [(join(unordered_path(k[len(prefix):])), CommitMember.decode(v)) for k, v in page.items], page.next_marker
