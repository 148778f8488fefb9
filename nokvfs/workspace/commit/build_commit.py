"""BuildCommit: the commit closure of a workbench, its exact replay, abort/cleanup and recovery.

    Building -> Sealing -> Complete
    Building -> Aborting -> Cleaning -> Cleaned | Quarantined
    Sealing  -> Aborting      (only with fenced proof that no Commit, head or dedupe row exists)
    Quarantined -> Cleaning   (reconciliation, once its staged attempts are settled: `reconcile`)

The steps (seed "Commit Closure"), each one MetadataCommand or a bounded series of them:

1. `begin` creates Operation(BuildCommit) with the complete exact request frozen in it -- the
   source incarnation and read version (the version the command was built at), the tree
   revision, the expected head, `replace`, the run-manifest publication condition (the frozen
   generation of metadata/run_manifest.json, None when absent), the first owner-observed
   committed_at_unix_seconds, producer, lineage and the ordered parents -- and
   HistoryHold(BuildCommit, operation) at the read version.
2. The canonical run manifest is staged (nokvfs.workspace.staging: a PublishOperation and its
   StagedObject ledger for metadata/run_manifest.json, uploaded and finalized through the
   publish pipeline); one command of this module then creates its ArtifactRevision (Available),
   manifest rows and a Commit RevisionRef, moves the PublishOperation Finalizing -> Published
   and records the RunManifestBinding in the build operation, without writing PathCurrent
   (CommitStaging).
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

Decisions (the lead's, recorded here; identities and digests in commit.identity):

* The operation id is derived from the request id, so operation lookup by request id precedes
  every live workspace, head and run-manifest read, and an exact retry returns the original
  terminal result even after later commits moved head and path. Terminal replay rebuilds the
  canonical envelope from the operation and checks it against the binding and the staged
  publish operation's durable result, never against PathCurrent.
* Default parents: the workbench's current head, if any. Default expected head: the head seen at
  step 1. `replace=False` refuses to freeze while metadata/run_manifest.json exists. Duplicate
  parents are refused at request time.
* Staging attempt n publishes operation commit.identity.staged_publish_id(operation, n) with a
  fresh revision id: an attempt whose uploader died in Uploading is aborted and cleaned, and the
  next attempt stages a fresh revision.
* The cleanup cursor names the cleanup stage reached (b"members", b"revisions", b"parents");
  each stage deletes what it finds from the start of its prefix, so it resumes by itself.
* Result: canonical JSON (CommitResult.to_bytes), stored in the operation and the dedupe row.
* A typed failure of any step (a lost head or run-manifest race, a parent no longer Sealed, a
  seal that does not verify, a failed upload) aborts and cleans the build and re-raises; a later
  exact retry then raises CommitAborted. `recover` resumes a dead owner's build forward.

Crash points (operations.crash_point): commit-after-<step> for step in stage, members,
revisions, parents, seal, publish; staged-after-begin and staged-after-finalize inside the
staging step; commit-before/after-publish-command; commit-after-cleaning and
commit-after-clean-<members|revisions|parents> in cleanup.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import time
from dataclasses import dataclass
from itertools import islice

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, scan_prefix
from nokvfs.errors import (
    AlreadyExists,
    GenerationConflict,
    IntegrityError,
    InvalidInput,
    NokvError,
    NotFound,
    PredicateFailed,
    RequestMismatch,
)
from nokvfs.schema import canonical_json, keys
from nokvfs.schema.enums import (
    BuildCommitPhase,
    ChangeEventKind,
    CommitConsumerKind,
    CommitState,
    HistoryHoldState,
    OperationKind,
    PublishPhase,
    ReferenceKind,
)
from nokvfs.schema.ids import check_commit_id, new_id16
from nokvfs.schema.names import check_workbench_id
from nokvfs.schema.records import (
    ZERO_DIGEST,
    BuildCommitOperation,
    Commit,
    CommitMember,
    HistoryHold,
    PathEntry,
    RunManifestBinding,
    WorkbenchCommitHead,
)
from nokvfs.workspace import body as bodies
from nokvfs.workspace import publish, staging
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.commit.closure import EOF, commit_ref_ids, frozen_members, member_chain, op_seals, verify_closure
from nokvfs.workspace.commit.identity import (
    RUN_MANIFEST,
    RUN_MANIFEST_PATH,
    FrozenRequest,
    operation_id,
    parent_digest,
    publish_request_id,
    revision_digest,
    sha256_uri,
    staged_publish_id,
)
from nokvfs.workspace.commit.lookup import head_key
from nokvfs.workspace.consumers import Consumers, read_commit
from nokvfs.workspace.operations import Done, Rows, crash_point, drive_each, drive_to_terminal, driving
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest

_log = logging.getLogger(__name__)

RESULT_SCHEMA = "nokv.build_commit.result.v1"
MANIFEST_CONTENT_TYPE = "application/json"
MEMBER_BATCH = 200
_CURRENT = object()  # "the head seen at step 1"
_U32 = struct.Struct(">I")

BUILD_TERMINAL = (BuildCommitPhase.Complete, BuildCommitPhase.Cleaned, BuildCommitPhase.Quarantined)
ROWS = Rows(
    OperationKind.BuildCommit,
    "build-commit",
    BUILD_TERMINAL,
    subject=lambda op_id, op: f"build-commit {op.commit_id.hex()[:12]}",
)


class CommitAborted(PredicateFailed):
    """The build operation of this request was aborted and cleaned; it published nothing."""


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


def operation(root, op_id: bytes) -> BuildCommitOperation:
    return ROWS.get(root, op_id)


def attempts_of(op_id: bytes) -> staging.Attempts:
    """The staged run-manifest attempts of a build (each stages a fresh revision)."""
    return staging.Attempts(
        lambda n: staged_publish_id(op_id, n), f"build-commit {op_id.hex()}", "run manifest", same_keys=False
    )


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
        raise RequestMismatch(
            f"request id {op.request_id.hex()} was used for another commit ({', '.join(differences)} differ)"
        )


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
    op_key = ROWS.key(root, op_id)
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
        raw_head = view.get("workbench_commit_head", head_key(root, inc))
        head = None if raw_head is None else WorkbenchCommitHead.decode(raw_head)
        head_id = None if head is None else head.commit_id
        if request.expected_head is not _CURRENT and request.expected_head != head_id:
            raise GenerationConflict(
                f"{request.workbench_id}: the head is {head_id.hex() if head_id else 'absent'}, not the expected one"
            )
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
        hold_key = ROWS.hold_key(root, op_id)
        return Built(
            predicates=[
                Absent("operation", op_key),
                Absent("history_hold", hold_key),
                ValueEquals("workspace_current", wb.current_key(root.root_id, request.workbench_id), raw_wb),
                Absent("workbench_commit_head", head_key(root, inc))
                if raw_head is None
                else ValueEquals("workbench_commit_head", head_key(root, inc), raw_head),
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
        _authenticate(ROWS.read(view, root, op_id)[1], request)
    return op_id


class _Begun(Exception):
    """The operation appeared between the lookup and the build: it is a retry after all."""


# --- step 2 -----------------------------------------------------------------------------------


def _bind_run_manifest(root, op_id: bytes, publish_id: bytes) -> None:
    def check(view):
        _, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, BuildCommitPhase.Building)
        if op.run_manifest is not None:
            raise PredicateFailed(f"build-commit {op_id.hex()} already bound its run manifest")

    def rows(view, staged, refs):
        raw_op, op = ROWS.read(view, root, op_id)
        pub, revision = staged.op, staged.revision
        expected = FrozenRequest.from_op(op).run_manifest_bytes(op.commit_id)
        if pub.body_digest_uri != sha256_uri(expected) or pub.logical_size != len(expected):
            raise IntegrityError(f"staged publish {publish_id.hex()} does not hold this commit's run manifest")
        version = view.version + 1
        rev = pub.artifact_revision_id
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
        bound = dataclasses.replace(op, run_manifest=binding, unique_revision_count=1)
        predicates = [ValueEquals("operation", ROWS.key(root, op_id), raw_op)]
        return predicates, [Put("operation", ROWS.key(root, op_id), bound)], staged_entry.encode()

    staging.bind(root, publish_id, intent_digest("commit.stage", op_id, publish_id), check, rows)


def _stage_run_manifest(root, op_id: bytes) -> None:
    op = operation(root, op_id)
    ROWS.require(op_id, op, BuildCommitPhase.Building)

    def publication(publish_id):
        body = bodies.from_bytes(FrozenRequest.from_op(op).run_manifest_bytes(op.commit_id), root.block_size)
        return publish.Publication(
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

    staging.stage_next(
        root,
        attempts_of(op_id),
        publication,
        op.source_workspace_incarnation_id,
        lambda publish_id: _bind_run_manifest(root, op_id, publish_id),
    )


# --- steps 3-6 --------------------------------------------------------------------------------


def _member_batch(root, op_id: bytes, batch: int) -> None:
    def change(view, op):
        ROWS.require(op_id, op, BuildCommitPhase.Building)
        if op.run_manifest is None or op.member_cursor == EOF:
            raise PredicateFailed("no member batch is due")
        frozen = view.at(op.read_version)
        items = list(islice(frozen_members(frozen, root, op, op.member_cursor or None), batch + 1))
        take, more = items[:batch], len(items) > batch
        count, digest = op.member_count, op.member_digest
        predicates, mutations = [], []
        for _, components, member in take:
            key = keys.CommitMemberKey(root.root_id, op.commit_id, components).encode()
            predicates.append(Absent("commit_member", key))
            mutations.append(Put("commit_member", key, member))
            count += 1
            digest = member_chain(digest, components, member)
        cursor = take[-1][0] if more else EOF
        return (
            predicates,
            mutations,
            dataclasses.replace(op, member_cursor=cursor, member_count=count, member_digest=digest),
        )

    ROWS.step(root, op_id, "commit.members", change)


def _revision_batch(root, op_id: bytes, batch: int) -> None:
    def change(view, op):
        ROWS.require(op_id, op, BuildCommitPhase.Building)
        if op.member_cursor != EOF or op.revision_cursor == EOF:
            raise PredicateFailed("no revision batch is due")
        prefix = keys.commit_member_prefix(root.root_id, op.commit_id)
        marker = None if not op.revision_cursor else prefix + op.revision_cursor
        page = scan_prefix(view, "commit_member", prefix, start_after=marker, limit=min(batch, MAX_ITEMS_PER_CALL))
        refs = References(view, root.root_id)
        added = set()
        for _, value in page.items:
            rev = CommitMember.decode(value).artifact_revision_id
            if (
                rev in added
                or view.get("revision_ref", keys.RevisionRefKey.commit(root.root_id, op.commit_id, rev).encode())
                is not None
            ):
                continue
            refs.add(ReferenceKind.Commit, op.commit_id, rev)
            added.add(rev)
        eof = page.next_marker is None
        updated = dataclasses.replace(
            op,
            revision_cursor=EOF if eof else page.items[-1][0][len(prefix) :],
            unique_revision_count=op.unique_revision_count + len(added),
        )
        if eof:
            updated = dataclasses.replace(
                updated, revision_digest=revision_digest(set(commit_ref_ids(view, root, op.commit_id)) | added)
            )
        return *refs.rows(), updated

    ROWS.step(root, op_id, "commit.revisions", change)


def _parent_batch(root, op_id: bytes, batch: int) -> None:
    def change(view, op):
        ROWS.require(op_id, op, BuildCommitPhase.Building)
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
        return *consumers.rows(), updated

    ROWS.step(root, op_id, "commit.parents", change)


# --- steps 7-8 --------------------------------------------------------------------------------


def _seal(root, op_id: bytes) -> None:
    with root.read() as view:
        raw, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, BuildCommitPhase.Building)
        if op.member_cursor != EOF or op.revision_cursor != EOF or op.parent_cursor != EOF:
            raise PredicateFailed(f"build-commit {op_id.hex()} has not built its closure yet")
        verify_closure(view, root, op.commit_id, op_seals(op))

    def seal(view, current):
        if current != op:
            raise PredicateFailed(f"build-commit {op_id.hex()} changed while it was being verified")
        return [], [], dataclasses.replace(current, phase=BuildCommitPhase.Sealing)

    ROWS.step(root, op_id, "commit.seal", seal)


def advance(root, op_id: bytes, *, batch: int = MEMBER_BATCH) -> BuildCommitPhase:
    """Run the next durable step of a Building or Sealing operation; returns the phase after it."""
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
    crash_point(f"commit-after-{step}")
    return operation(root, op_id).phase


# --- step 9 -----------------------------------------------------------------------------------


def _publish(root, op_id: bytes) -> None:
    op_key = ROWS.key(root, op_id)

    def build(view):
        raw_op, op = ROWS.read(view, root, op_id)
        ROWS.require(op_id, op, BuildCommitPhase.Sealing)
        raw_wb, workbench = wb.visible(view, root.root_id, op.workbench_id)
        inc = workbench.incarnation_id
        if inc != op.source_workspace_incarnation_id:
            raise NotFound(f"workbench {op.workbench_id!r} is another incarnation now")
        head_row = head_key(root, inc)
        raw_head = view.get("workbench_commit_head", head_row)
        head = None if raw_head is None else WorkbenchCommitHead.decode(raw_head)
        if (None if head is None else head.commit_id) != op.expected_head or (
            0 if head is None else head.head_generation
        ) != op.expected_head_generation:
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
        hold_key = ROWS.hold_key(root, op_id)
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
            Absent("workbench_commit_head", head_row)
            if raw_head is None
            else ValueEquals("workbench_commit_head", head_row, raw_head),
            Absent("path_current", rm_key) if old_raw is None else ValueEquals("path_current", rm_key, old_raw),
            ValueEquals("history_hold", hold_key, raw_hold),
        ]
        mutations += [
            Put("path_current", rm_key, entry),
            wb_mutation,
            Put("workbench_commit_head", head_row, new_head),
            Put("operation", op_key, dataclasses.replace(op, phase=BuildCommitPhase.Complete, result=result)),
            Delete("history_hold", hold_key),
        ]
        mutations += publish.index_mutations(root.root_id, inc, RUN_MANIFEST, old, entry)
        event = wb.event(
            workbench,
            ChangeEventKind.CommitPublished,
            RUN_MANIFEST_PATH,
            None if head is None else head.commit_id,
            op.commit_id,
        )
        return Built(predicates=predicates, mutations=mutations, events=[event], result=result)

    crash_point("commit-before-publish-command")
    root.apply(build, digest=intent_digest("commit.publish", op_id), request_id=publish_request_id(op_id))
    crash_point("commit-after-publish-command")


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
    if (
        frozen.projection_input_digest(commit_id) != op.projection_input_digest
        or frozen.initialization_digest(commit_id) != op.initialization_digest
    ):
        problems.append("request digests")
    if op.content_digest_uri != frozen.content_digest_uri(commit_id) or op.manifest_digest_uri != op.content_digest_uri:
        problems.append("manifest digests")
    if binding is None or binding.body_digest_uri != sha256_uri(data) or binding.logical_size != len(data):
        problems.append("run-manifest binding")
    else:
        pub = staging.read_publish(root, binding.publish_operation_id)
        staged = None if pub is None or pub.result is None else PathEntry.decode(pub.result)
        if (
            pub is None
            or pub.phase != PublishPhase.Published
            or staged is None
            or (staged.artifact_revision_id, staged.body_digest_uri, staged.logical_size, staged.manifest_digest_uri)
            != (
                binding.artifact_revision_id,
                binding.body_digest_uri,
                binding.logical_size,
                binding.manifest_digest_uri,
            )
        ):
            problems.append("staged publish result")
    result = CommitResult.from_bytes(op.result)
    if result.commit_id != op.commit_id or result.operation_id != op_id:
        problems.append("stored result")
    if problems:
        raise IntegrityError(
            f"build-commit {op_id.hex()}: the terminal envelope does not verify ({', '.join(problems)})"
        )
    return result


# --- driving, abort and cleanup ---------------------------------------------------------------


def build(
    root,
    workbench_id: str,
    *,
    parents=None,
    producer: str = "",
    lineage: str = "",
    replace: bool = True,
    expected_head=_CURRENT,
    request_id: bytes | None = None,
    committed_at: int | None = None,
    batch: int = MEMBER_BATCH,
) -> CommitResult:
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
    with driving(root, op_id, "build-commit"):
        return _drive(root, op_id, batch=batch, abort_on_failure=abort_on_failure)


def _drive(root, op_id: bytes, *, batch: int = MEMBER_BATCH, abort_on_failure: bool = True) -> CommitResult:
    """`resume` for a caller that holds the operation's lock."""

    def result(op):
        if op.phase != BuildCommitPhase.Complete:
            raise CommitAborted(f"build-commit {op_id.hex()} was aborted ({op.phase.name}): {op.terminal_error}")
        return _terminal_result(root, op_id, op)

    return drive_to_terminal(
        root,
        ROWS,
        op_id,
        result=result,
        cleaning=(BuildCommitPhase.Aborting, BuildCommitPhase.Cleaning),
        clean=lambda op_id: _clean(root, op_id, batch),
        advance=lambda op_id: advance(root, op_id, batch=batch),
        abort=lambda op_id, reason: abort(root, op_id, reason=reason, batch=batch),
        abort_on_failure=abort_on_failure,
    )


def abort(root, op_id: bytes, *, reason: str, batch: int = MEMBER_BATCH) -> BuildCommitPhase:
    """Take a build to Aborting (Building, or Sealing with fenced proof that step 9 did not
    happen), then clean it. Returns the terminal phase (Complete if publication won)."""
    op = operation(root, op_id)
    if op.phase in BUILD_TERMINAL:
        return op.phase
    if op.phase in (BuildCommitPhase.Building, BuildCommitPhase.Sealing):

        def take_over(view, current):
            if current.phase not in (BuildCommitPhase.Building, BuildCommitPhase.Sealing):
                raise PredicateFailed(f"build-commit {op_id.hex()} moved to {current.phase.name}")
            predicates = []
            if current.phase == BuildCommitPhase.Sealing:
                # Fenced proof that step 9 did not happen: no Commit, no dedupe row of its
                # request (the head names only a Commit that exists).
                commit_key = keys.CommitKey(root.root_id, current.commit_id).encode()
                dedupe_key = keys.CommandDedupeKey(root.root_id, publish_request_id(op_id)).encode()
                if view.get("commit", commit_key) is not None or view.get("command_dedupe", dedupe_key) is not None:
                    raise PredicateFailed(f"build-commit {op_id.hex()} was published")
                predicates += [Absent("commit", commit_key), Absent("command_dedupe", dedupe_key)]
            return (
                predicates,
                [],
                dataclasses.replace(current, phase=BuildCommitPhase.Aborting, terminal_error=reason[:1024]),
            )

        try:
            ROWS.step(root, op_id, "commit.abort", take_over)
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

    def change(view, op):
        ROWS.require(op_id, op, BuildCommitPhase.Cleaning)
        found = collect(view, op)
        if found is None:
            raise Done()
        return *found, dataclasses.replace(op, cleanup_cursor=stage)

    return ROWS.batch(root, op_id, "commit.clean", change)


def _clean(root, op_id: bytes, batch: int = MEMBER_BATCH) -> BuildCommitPhase:
    cleaning = BuildCommitPhase.Cleaning
    if not ROWS.start_cleaning(
        root,
        op_id,
        aborting=BuildCommitPhase.Aborting,
        cleaning=cleaning,
        label="commit.cleaning",
        crash="commit-after-cleaning",
    ):
        return operation(root, op_id).phase
    # The staged run manifest: a publish attempt that is not terminal is aborted (the bind
    # needs Building, so none can publish any more); a bound one's Commit ref goes below.
    quarantined = staging.abort_attempts(root, attempts_of(op_id), "its commit was aborted")
    limit = min(batch, MAX_ITEMS_PER_CALL)

    def members(view, op):
        page = scan_prefix(view, "commit_member", keys.commit_member_prefix(root.root_id, op.commit_id), limit=limit)
        return None if not page.items else ([], [Delete("commit_member", k) for k, _ in page.items])

    def revisions(view, op):
        prefix = keys.revision_ref_prefix(root.root_id, ReferenceKind.Commit, keys.commit_reference_owner(op.commit_id))
        ids = [k[len(prefix) :] for k, _ in scan_prefix(view, "revision_ref", prefix, limit=limit).items]
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
            crash_point(f"commit-after-clean-{stage.decode()}")
    final = BuildCommitPhase.Quarantined if quarantined else BuildCommitPhase.Cleaned
    hold_key = ROWS.hold_key(root, op_id)

    def release_hold(view, op):
        return [], ([Delete("history_hold", hold_key)] if view.get("history_hold", hold_key) is not None else [])

    ROWS.set_phase(root, op_id, BuildCommitPhase.Cleaning, final, label="commit.cleaned", extra=release_hold)
    return final


def pending(view, root) -> list[tuple[bytes, BuildCommitOperation]]:
    return ROWS.pending(view, root)


def recover(root) -> list[tuple[str, str]]:
    """Resume every build whose owning process is gone: (op hex, "complete" or the phase it
    ended in)."""

    def drive(op_id, _):
        try:
            _drive(root, op_id)
            return "complete"
        except NokvError as exc:
            _log.info("recovery of build-commit %s: %s", op_id.hex(), exc)
            return operation(root, op_id).phase.name.lower()

    return drive_each(root, ROWS, drive)


def reconcile(root, op_id: bytes, op: BuildCommitOperation) -> str:
    """Reconcile a terminal build (README, "Reconciliation"); the caller holds its lock.

    Its staged run-manifest attempts that are Quarantined are reconciled. A Quarantined build
    (its members, references, parent consumers and hold were released by its cleanup; only the
    attempts were in doubt) then takes the explicit transition Quarantined -> Cleaning and its
    cleanup ends Cleaned. Returns the build's phase afterwards (lower case).
    """
    if not staging.reconcile(root, attempts_of(op_id)) or op.phase != BuildCommitPhase.Quarantined:
        return operation(root, op_id).phase.name.lower()
    ROWS.set_phase(root, op_id, BuildCommitPhase.Quarantined, BuildCommitPhase.Cleaning, label="commit.reconcile")
    crash_point("commit-after-reconcile")
    return _clean(root, op_id).name.lower()
