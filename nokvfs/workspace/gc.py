"""Garbage collection of artifact revisions nothing references any more.

A GcCandidate (written when a revision's strong-reference count reached zero, keyed by the new
reference epoch) is claimed only when every condition holds: the count is zero, the key's epoch
is the revision's current reference epoch, the history floor (the oldest read version any
HistoryHold keeps, or the current version when none) is newer than last_zero_ref_version, the
revision is Available (no publish or append can still add a reference: every reference addition
requires Available), and the caller is the fenced owner (every command carries the owner epoch).

    claim:   Available -> Deleting, candidate Candidate -> Claimed, GcOperation Deleting
    delete:  every object the revision physically owns, each confirmed absent by the store's
             own answer (ObjectStore.delete_many: the local store answers once the removal is
             fsynced, S3 per key in its DeleteObjects answer)
    finish:  Deleting -> Deleted, candidate Complete, manifest rows pruned, and only then the
             revision's RevisionDependency references released (which may make bases candidates)
    an ambiguous or failed delete: revision, candidate and operation Quarantined with evidence;
    nothing may reference or delete it until reconciled.
    reconcile (every run): once `head` answers for every object the revision owns (present or
             absent), one command makes the explicit transition Quarantined -> Deleting (revision,
             candidate Claimed, operation), and the delete is driven again: what is present is
             deleted, every object confirmed absent, then Deleted as above. A probe that fails
             changes nothing.

Each run also reconciles the other Quarantined state machines -- publishes, commit builds,
restores -- by the same rule (probe, then an explicit transition, then the cleanup again); see
README "Reconciliation" and each machine's `reconcile`.

Claims and finishes are batched: one command claims up to `batch_revisions` revisions (each
exactly as alone; one that stopped being collectable is left out), once that command is durable
their objects are deleted in one `delete_many`, and one command finishes those whose objects
were all confirmed absent (one that was not is quarantined alone, and `GcReport.failures` names
its object and the store's typed error). The order per revision is the seed's whatever the batch:
no object is deleted before its claim is committed, no row goes before its objects are gone, and
a collector killed anywhere in between leaves Deleting operations the next run resumes (crash
points for the tests, NOKVFS_CRASH_AT: "gc-claimed" after the claim command, "gc-deleted" after
the deletes). A batch is bounded so both commands stay within the engine's limits (revisions,
manifest rows, released dependencies); a mount's maintenance passes small batches so that a
request waiting for the writer waits for little. The configured history retention holds GC
like a HistoryHold: those versions stay readable.

The operation id is derived from (root, revision, epoch), so a killed collector's operation is
found and resumed by the next run.

After the revisions, History: `prune_history` advances the shard's history floor to the oldest
read version any HistoryHold keeps (the engine clamps to it inside its transaction, so a hold
created meanwhile is never undercut), or to `keep_versions` before the current version when that
is older (the configured diagnostic floor), and prunes the History rows below it in bounded
batches (Shard.prune_history; WorkspaceCurrent history keeps what the change feed's visibility
needs). In-flight commit builds and restores are covered: each holds a HistoryHold from its
first command. Reads below the floor are then refused with HistoryNotRetained.

Progress: `collect(progress=...)` calls `progress(stage, done, total, done_bytes, total_bytes)`
after each batch of revisions (stage "collect": revisions and bytes freed so far, total the
revisions this pass found collectable on top of those) and after each History batch (stage
"prune History": rows pruned so far).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
from dataclasses import dataclass, field

from nokvfs.engine import collector
from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import iter_prefix, scan_prefix
from nokvfs.errors import AmbiguousResult, InvalidInput, NokvError, PredicateFailed, StoreError
from nokvfs.schema import keys
from nokvfs.schema.codec import replace
from nokvfs.schema.enums import GcClaimState, GcPhase, OperationKind, ReferenceKind, RevisionState
from nokvfs.schema.records import (
    ArtifactManifest,
    ArtifactRevision,
    GcBarrier,
    GcCandidate,
    GcOperation,
    HistoryHold,
)
from nokvfs.workspace import publish
from nokvfs.workspace.operations import OperationLocks, Rows, crash_point, drive_each
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest

log = logging.getLogger(__name__)

ROWS = Rows(OperationKind.Gc, "gc", (GcPhase.Deleted, GcPhase.Quarantined))


@dataclass
class GcReport:
    # candidates, collectable, stale_candidates and held describe the last pass (what was left);
    # the freed_* counts and freed are totals over every pass.
    candidates: int = 0
    collectable: int = 0
    freed_revisions: int = 0
    freed_bytes: int = 0
    deleted_objects: int = 0
    quarantined: int = 0
    reconciled: int = 0  # Quarantined collections taken up again once the store answered
    operations_reconciled: int = 0  # Quarantined publishes, commit builds, restores now Cleaned
    operations_quarantined: int = 0  # ... still Quarantined after this run (the store did not answer)
    stale_candidates: int = 0
    held: int = 0
    freed: list = field(default_factory=list)  # revision ids (hex)
    failures: list = field(default_factory=list)  # GcFailure of each collection quarantined
    history_floor: int = 0
    history_pruned: int = 0  # History rows removed (with dry_run: that would be)
    temp_files_removed: int = 0  # temporary files of writers that are gone, swept from the store
    records_pruned: int = 0  # finished collections whose rows went (prune_finished)


@dataclass(frozen=True)
class GcFailure:
    """Why a collection was quarantined: the first of its objects the store did not confirm
    absent, and the store's typed answer (AmbiguousResult when the delete may have landed)."""

    revision: str  # hex
    object_key: str
    error: StoreError


def operation_id(root_id: bytes, revision_id: bytes, epoch: int) -> bytes:
    return hashlib.sha256(b"nokv.gc.operation.v1\0" + root_id + revision_id + epoch.to_bytes(8, "big")).digest()[:16]


def history_floor(view, root, *, quiescent: int | None = None) -> int:
    """The oldest read version any HistoryHold of the root keeps; with none, `quiescent`
    (default: the view's version, which the barrier command has just advanced) less the root's
    configured history retention, whose versions stay readable."""
    floor = (view.version if quiescent is None else quiescent) - getattr(root, "history_retention", 0)
    prefix = root.root_id  # HistoryHold keys are root | kind | hold id
    marker = None
    while True:
        page = scan_prefix(view, "history_hold", prefix, start_after=marker)
        for _, value in page.items:
            floor = min(floor, HistoryHold.decode(value).read_version)
        if page.next_marker is None:
            return floor
        marker = page.next_marker


def _revision_key(root, revision_id: bytes) -> bytes:
    return keys.ArtifactRevisionKey(root.root_id, revision_id).encode()


def _own_objects(view, root, revision_id: bytes):
    return [
        row for row in publish.read_manifest(view, root, revision_id) if row.physical_owner_revision_id == revision_id
    ]


def _advance_barrier(root) -> None:
    """One command that moves the commit clock past every recorded zero (a quiescent floor)."""
    key = keys.GcBarrierKey(root.root_id).encode()

    def build(view):
        raw = view.get("gc_barrier", key)
        generation = 0 if raw is None else GcBarrier.decode(raw).generation
        return Built(
            predicates=[Absent("gc_barrier", key) if raw is None else ValueEquals("gc_barrier", key, raw)],
            mutations=[Put("gc_barrier", key, GcBarrier(generation + 1))],
        )

    from nokvfs.schema.ids import new_id16

    root.apply(build, digest=intent_digest("gc.barrier", new_id16()))


MAX_PASSES = 16  # releasing a child can make its bases collectable; depth is at most 8


def collect(
    root,
    *,
    dry_run: bool = False,
    progress=None,
    keep_versions: int | None = None,
    history_batch: int | None = None,
    batch_revisions: int | None = None,
) -> GcReport:
    """Free every collectable revision's objects, pass after pass until nothing more frees, then
    prune History below the floor (keeping `keep_versions` versions, default the root's
    configured history retention), and sweep the object store's temporary files that writers
    which are gone left behind.

    With dry_run, nothing is changed and the report lists what the first pass would free (bases
    that only become collectable once their children are gone are not counted) and how many
    History rows would go. `batch_revisions` (default GC_BATCH) bounds the revisions one claim
    and one finish command cover.
    """
    batch_revisions = GC_BATCH if batch_revisions is None else batch_revisions
    if isinstance(batch_revisions, bool) or not isinstance(batch_revisions, int) or batch_revisions < 1:
        raise InvalidInput(f"batch_revisions must be a positive integer, got {batch_revisions!r}")
    # The builders allocate as much as the commands, and it dies as soon as each batch ends.
    with collector.deferred():
        return _collect(root, dry_run, progress, keep_versions, history_batch, batch_revisions)


def _collect(root, dry_run, progress, keep_versions, history_batch, batch_revisions) -> GcReport:
    report = GcReport()
    if not dry_run:
        _resume(root, report)
        _reconcile(root, report)
        _reconcile_operations(root, report)
    for _ in range(1 if dry_run else MAX_PASSES):
        freed = report.freed_revisions
        released = _pass(root, report, dry_run=dry_run, progress=progress, batch_revisions=batch_revisions)
        # What makes another pass free more: a freed revision's released dependencies, or the
        # floor, which this pass's own commands moved past candidates it held (the configured
        # retention counts back from the current version). Without either, another pass would
        # find what this one left, re-reading every candidate to say so.
        if dry_run or report.freed_revisions == freed or not (released or report.held):
            break
    if not dry_run:
        report.records_pruned = prune_finished(root, audit_versions=_audit_versions(root))
    keep = root.history_retention if keep_versions is None else keep_versions
    batch_done = None if progress is None else (lambda pruned: progress("prune History", pruned, None, None, None))
    report.history_floor, report.history_pruned = prune_history(
        root, keep_versions=keep, dry_run=dry_run, progress=batch_done, max_rows=history_batch
    )
    if not dry_run:
        try:
            report.temp_files_removed = root.store.remove_stale_temp_files(everywhere=True)
        except StoreError as exc:  # housekeeping: the next gc sweeps what this one could not
            log.warning("temporary files not swept: %s", exc)
    return report


# Finished collections one command removes the rows of (each up to 3 rows plus any manifest
# rows left): one bounded write transaction.
PRUNE_BATCH = 128


def _audit_versions(root) -> int:
    """The audit window of finished collections: the data directory's retention versions."""
    from nokvfs.workspace.datadir import retention_settings

    try:
        return retention_settings(root.data_dir).versions
    except NokvError as exc:
        log.warning("retention settings unreadable (%s): finished collections are kept", exc)
        return 1 << 62


def prune_finished(root, *, audit_versions: int) -> int:
    """Remove the rows of finished collections -- the GcOperation, the Deleted ArtifactRevision,
    the Complete GcCandidate, any manifest row left -- once their claim is `audit_versions`
    versions old (the seed: "its manifest/candidate rows may be pruned according to audit
    retention"; the window is nokvfs's, README "Retention"). Their History then goes with the
    next History pruning. Quarantined collections are never pruned. Returns how many went."""
    from nokvfs.schema.ids import new_id16

    class Nothing(Exception):
        pass

    prefix = keys.operation_prefix(root.root_id, OperationKind.Gc)
    marker = None  # operation keys are visited once, in order, over the batches

    def build(view):
        floor = view.version - audit_versions
        predicates, mutations, last, count = [], [], None, 0
        for key, value in iter_prefix(view, "operation", prefix, start_after=marker):
            last = key
            operation = GcOperation.decode(value)
            if operation.phase != GcPhase.Deleted or operation.created_version > floor:
                continue
            predicates.append(ValueEquals("operation", key, value))
            mutations.append(Delete("operation", key))
            revision_key = _revision_key(root, operation.artifact_revision_id)
            raw = view.get("artifact_revision", revision_key)
            if raw is not None and ArtifactRevision.decode(raw).state == RevisionState.Deleted:
                predicates.append(ValueEquals("artifact_revision", revision_key, raw))
                mutations.append(Delete("artifact_revision", revision_key))
            candidate_key = keys.GcCandidateKey(
                root.root_id, operation.artifact_revision_id, operation.reference_epoch
            ).encode()
            raw = view.get("gc_candidate", candidate_key)
            if raw is not None and GcCandidate.decode(raw).claim_state == GcClaimState.Complete:
                predicates.append(ValueEquals("gc_candidate", candidate_key, raw))
                mutations.append(Delete("gc_candidate", candidate_key))
            manifests = keys.artifact_manifest_prefix(root.root_id, operation.artifact_revision_id)
            mutations += [Delete("artifact_manifest", k) for k, _ in iter_prefix(view, "artifact_manifest", manifests)]
            count += 1
            if count == PRUNE_BATCH:
                break
        if not count:
            raise Nothing
        return Built(predicates=predicates, mutations=mutations, value=(count, last))

    pruned = 0
    while True:
        try:
            _, built = root.apply(build, digest=intent_digest("gc.prune-finished", new_id16()))
        except Nothing:
            return pruned
        count, marker = built.value
        pruned += count


def prune_history(
    root, *, keep_versions: int = 0, dry_run: bool = False, progress=None, max_rows: int | None = None
) -> tuple[int, int]:
    """(history floor, History rows pruned): advance the floor as far as the holds and
    `keep_versions` allow and prune below it, batch after batch (each one atomic; `progress`
    is called with the rows pruned so far after each)."""
    if keep_versions < 0:
        raise InvalidInput("keep_versions must not be negative")
    target = max(0, root.shard.commit_version - keep_versions)
    if dry_run:
        return root.shard.prunable_history(target)
    pruned, start = 0, b""
    while True:
        limits = {} if max_rows is None else {"max_rows": max_rows, "max_visits": max_rows * 8}
        outcome = root.shard.prune_history(
            owner_epoch=root.owner_epoch, floor_version=target, start_key=start, **limits
        )
        pruned += outcome.pruned_rows
        if progress is not None:
            progress(pruned)
        if outcome.next_key is None:
            return outcome.floor_version, pruned
        start = outcome.next_key


def _needs_barrier(root) -> bool:
    """Whether a candidate's zero is at the current version: only then must the clock move on
    for the quiescent floor to pass it. (An idle collector therefore writes nothing.)"""
    with root.read() as view:
        for _, value in iter_prefix(view, "gc_candidate", root.root_id):
            candidate = GcCandidate.decode(value)
            if candidate.claim_state == GcClaimState.Candidate and candidate.last_zero_ref_version >= view.version:
                return True
    return False


def _pass(root, report: GcReport, *, dry_run: bool, progress, batch_revisions: int) -> bool:
    """One scan of the candidates and the collection of those collectable. Whether any of them
    depends on other revisions (whose references its finish releases)."""
    report.candidates = report.collectable = report.stale_candidates = report.held = 0
    if not dry_run and _needs_barrier(root):
        _advance_barrier(root)
    with root.read() as view:
        # A dry run does not advance the barrier: judge it as the barrier would leave it.
        floor = history_floor(view, root, quiescent=view.version + 1 if dry_run else None)
        prefix = root.root_id
        work = []
        marker = None
        while True:
            page = scan_prefix(view, "gc_candidate", prefix, start_after=marker)
            for key, value in page.items:
                decoded = keys.GcCandidateKey.decode(key)
                candidate = GcCandidate.decode(value)
                if candidate.claim_state != GcClaimState.Candidate:
                    continue
                report.candidates += 1
                revision_key = _revision_key(root, decoded.artifact_revision_id)
                raw_revision = view.get("artifact_revision", revision_key)
                revision = None if raw_revision is None else ArtifactRevision.decode(raw_revision)
                if (
                    revision is None
                    or revision.reference_epoch != decoded.reference_epoch
                    or revision.strong_reference_count != 0
                    or revision.state != RevisionState.Available
                ):
                    report.stale_candidates += 1
                    continue
                if not floor > candidate.last_zero_ref_version:
                    report.held += 1
                    continue
                report.collectable += 1
                # The bytes only a dry run reports; a batch is bounded by the revision's manifest
                # rows (block_count), which its own objects never exceed.
                size = sum(r.length for r in _own_objects(view, root, decoded.artifact_revision_id)) if dry_run else 0
                work.append(
                    _Work(
                        decoded.artifact_revision_id,
                        decoded.reference_epoch,
                        size,
                        revision.block_count,
                        revision.dependency_count,
                        _Seen(
                            operation_id(root.root_id, decoded.artifact_revision_id, decoded.reference_epoch),
                            key,
                            value,
                            candidate,
                            revision_key,
                            raw_revision,
                            revision,
                        ),
                    )
                )
            if page.next_marker is None:
                break
            marker = page.next_marker
    freed_before = report.freed_revisions
    if dry_run:
        for item in work:
            report.freed.append(item.revision_id.hex())
            report.freed_bytes += item.size
        return False
    # One batch's objects are deleted (on the deleter thread: the store mostly waits on I/O)
    # while this thread finishes the batch before and claims the next; each batch's order is
    # the seed's all the same -- claim committed, then its deletes, then its finish.
    in_flight = []  # at most two: (claimed collections, their locks, the future of their deletes)
    claimed_total = 0
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gc-delete") as deleter:
        try:
            for batch in _batches(work, batch_revisions):
                locks = OperationLocks(root.run_dir)
                # Another collector drives those whose lock it holds.
                items = [item for item in batch if locks.try_acquire(item.op_id)]
                try:
                    claimed = _claim_many(root, items) if items else []
                    if claimed:
                        crash_point("gc-claimed")
                except BaseException:
                    locks.release()
                    raise
                claimed_total += len(claimed)
                in_flight.append((claimed, locks, deleter.submit(_delete_objects, root, claimed)))
                if len(in_flight) == 2:
                    _finish_deleted(root, in_flight.pop(0), report, progress, freed_before + len(work))
            while in_flight:
                _finish_deleted(root, in_flight.pop(0), report, progress, freed_before + len(work))
        finally:
            for _, locks, deleting in in_flight:  # only when something failed: nothing more is finished
                concurrent.futures.wait([deleting])
                locks.release()
    # What is left, as the next pass would find it: the claimed candidates are candidates no more.
    report.candidates -= claimed_total
    report.collectable -= claimed_total
    return any(item.dependencies for item in work)


def _finish_deleted(root, in_flight, report: GcReport, progress, total: int) -> None:
    """Once a batch's deletes are done: quarantine or finish each of its collections, let their
    locks go, and say how far the pass is."""
    collections, locks, deleting = in_flight
    try:
        failures = deleting.result()
        crash_point("gc-deleted")
        _settle(root, collections, failures, report)
    finally:
        locks.release()
    if progress is not None:
        progress("collect", report.freed_revisions, total, report.freed_bytes, None)


# Revisions one claim command and one finish command cover by default (`nokvfs gc`; the mount's
# maintenance passes fewer), and what else bounds a batch so both commands stay well inside the
# engine's limits (MAX_PREDICATES 4,096, MAX_MUTATIONS 16,384): the finish deletes every
# manifest row of its revisions, and requires 3 rows per revision plus one per base revision
# whose dependency reference it releases (at most 64 per revision).
GC_BATCH = 256
GC_BATCH_MANIFEST_ROWS = 4096
GC_BATCH_PREDICATES = 3072


@dataclass(frozen=True)
class _Seen:
    """The candidate and revision rows as the scan read them (raw and decoded): a claim that
    reads the same bytes again need not decode them again."""

    op_id: bytes
    candidate_key: bytes
    raw_candidate: bytes
    candidate: GcCandidate
    revision_key: bytes
    raw_revision: bytes
    revision: ArtifactRevision


@dataclass(frozen=True)
class _Work:
    """A revision the scan found collectable."""

    revision_id: bytes
    epoch: int
    size: int  # its own objects' bytes (dry runs only)
    manifest_rows: int
    dependencies: int
    seen: _Seen

    @property
    def op_id(self) -> bytes:
        return self.seen.op_id


def _batches(work, revisions: int):
    batch, rows, predicates = [], 0, 0
    for item in work:
        more = 3 + item.dependencies
        if batch and (
            len(batch) == revisions
            or rows + item.manifest_rows > GC_BATCH_MANIFEST_ROWS
            or predicates + more > GC_BATCH_PREDICATES
        ):
            yield batch
            batch, rows, predicates = [], 0, 0
        batch.append(item)
        rows += item.manifest_rows
        predicates += more
    if batch:
        yield batch


@dataclass
class _Collection:
    """One claimed revision on its way to Deleted: its rows as the claim left them (raw, the
    finish's predicates: the finish reads none of them again) and what the finish removes."""

    op_id: bytes
    op_key: bytes
    operation: GcOperation
    raw_operation: bytes
    revision: ArtifactRevision
    raw_revision: bytes
    revision_key: bytes
    candidate_key: bytes
    candidate: GcCandidate | None  # None: the candidate row is gone
    raw_candidate: bytes | None
    manifest_keys: list  # every ArtifactManifest row of the revision (the finish prunes them)
    own: list  # the ArtifactManifest rows whose object the revision physically owns


def _manifest(view, root, revision_id: bytes) -> tuple[list, list]:
    """(every manifest key of the revision, the rows whose object it owns)."""
    keys_, own = [], []
    for key, value in iter_prefix(view, "artifact_manifest", keys.artifact_manifest_prefix(root.root_id, revision_id)):
        keys_.append(key)
        row = ArtifactManifest.decode(value)
        if row.physical_owner_revision_id == revision_id:
            own.append(row)
    return keys_, own


def _collection(view, root, op_id: bytes) -> _Collection:
    """A Deleting collection as the view has it (a killed collector's, a reconciled one)."""
    raw_operation, operation = ROWS.read(view, root, op_id)
    if operation.phase != GcPhase.Deleting:
        raise PredicateFailed(f"gc operation {op_id.hex()} is {operation.phase.name}")
    revision_id = operation.artifact_revision_id
    raw_revision = view.get("artifact_revision", _revision_key(root, revision_id))
    candidate_key = keys.GcCandidateKey(root.root_id, revision_id, operation.reference_epoch).encode()
    raw_candidate = view.get("gc_candidate", candidate_key)
    manifest_keys, own = _manifest(view, root, revision_id)
    return _Collection(
        op_id,
        ROWS.key(root, op_id),
        operation,
        raw_operation,
        ArtifactRevision.decode(raw_revision),
        raw_revision,
        _revision_key(root, revision_id),
        candidate_key,
        None if raw_candidate is None else GcCandidate.decode(raw_candidate),
        raw_candidate,
        manifest_keys,
        own,
    )


def _claim_rows(view, root, revision_id: bytes, epoch: int, floor: int, seen: _Seen | None = None):
    """(predicates, mutations, the _Collection it starts) claiming one revision, or
    PredicateFailed when it is not collectable. `seen`: the rows as a scan read them."""
    if seen is None:
        op_id = operation_id(root.root_id, revision_id, epoch)
        candidate_key = keys.GcCandidateKey(root.root_id, revision_id, epoch).encode()
        revision_key = _revision_key(root, revision_id)
    else:
        op_id, candidate_key, revision_key = seen.op_id, seen.candidate_key, seen.revision_key
    op_key = ROWS.key(root, op_id)
    raw_candidate = view.get("gc_candidate", candidate_key)
    raw_revision = view.get("artifact_revision", revision_key)
    if raw_candidate is None or raw_revision is None:
        raise PredicateFailed("the candidate or its revision is gone")
    if seen is not None and raw_candidate == seen.raw_candidate:
        candidate = seen.candidate
    else:
        candidate = GcCandidate.decode(raw_candidate)
    if seen is not None and raw_revision == seen.raw_revision:
        revision = seen.revision
    else:
        revision = ArtifactRevision.decode(raw_revision)
    if (
        candidate.claim_state != GcClaimState.Candidate
        or revision.state != RevisionState.Available
        or revision.strong_reference_count != 0
        or revision.reference_epoch != epoch
    ):
        raise PredicateFailed(f"revision {revision_id.hex()} is no longer collectable")
    if not floor > candidate.last_zero_ref_version:
        raise PredicateFailed(f"revision {revision_id.hex()} is still visible to a history hold")
    manifest_keys, own = _manifest(view, root, revision_id)
    operation = GcOperation(
        artifact_revision_id=revision_id,
        reference_epoch=epoch,
        phase=GcPhase.Deleting,
        object_count=len(own),
        object_cursor=b"",
        deleted_object_count=0,
        dependency_cursor=b"",
        result=None,
        terminal_error=None,
        created_version=view.version + 1,
    )
    deleting = replace(revision, state=RevisionState.Deleting)
    claimed = replace(candidate, claim_state=GcClaimState.Claimed)
    collection = _Collection(
        op_id,
        op_key,
        operation,
        operation.encode(),
        deleting,
        deleting.encode(),
        revision_key,
        candidate_key,
        claimed,
        claimed.encode(),
        manifest_keys,
        own,
    )
    return (
        [
            ValueEquals("gc_candidate", candidate_key, raw_candidate),
            ValueEquals("artifact_revision", revision_key, raw_revision),
            Absent("operation", op_key),
        ],
        [
            Put("artifact_revision", revision_key, collection.raw_revision),
            Put("gc_candidate", candidate_key, collection.raw_candidate),
            Put("operation", op_key, collection.raw_operation),
        ],
        collection,
    )


def _claim(root, revision_id: bytes, epoch: int) -> None:
    op_id = operation_id(root.root_id, revision_id, epoch)

    def build(view):
        predicates, mutations, _ = _claim_rows(view, root, revision_id, epoch, history_floor(view, root))
        return Built(predicates=predicates, mutations=mutations)

    root.apply(build, digest=intent_digest("gc.claim", op_id))


class _NothingClaimed(Exception):
    pass


def _claim_many(root, items) -> list:
    """One command claiming every revision of `items` (_Work) that is still collectable (each
    claim exactly as `_claim`'s); the _Collection of each claimed. No command when none is
    collectable any more."""

    def build(view):
        floor = history_floor(view, root)
        predicates, mutations, claimed = [], [], []
        for item in items:
            try:
                more_predicates, more_mutations, collection = _claim_rows(
                    view, root, item.revision_id, item.epoch, floor, item.seen
                )
            except PredicateFailed:
                continue  # a reference came back, or another collector claimed it
            predicates += more_predicates
            mutations += more_mutations
            claimed.append(collection)
        if not claimed:
            raise _NothingClaimed
        return Built(predicates=predicates, mutations=mutations, value=claimed)

    ids = [item.op_id for item in items]
    try:
        _, built = root.apply(build, digest=intent_digest("gc.claim-batch", *ids))
    except _NothingClaimed:
        return []
    return built.value


def _resume(root, report: GcReport) -> None:
    """Drive every GC operation a killed collector left in Deleting (every page, not just one)."""
    drive_each(root, ROWS, lambda op_id, _: _drive(root, op_id, report), phases={GcPhase.Deleting})


def _reconcile(root, report: GcReport) -> None:
    def reconcile(op_id, operation):
        with root.read() as view:
            own = _own_objects(view, root, operation.artifact_revision_id)
        try:
            for row in own:
                root.store.head(row.object_key)  # present or absent: either is an answer
        except StoreError as exc:
            log.info("gc of %s stays quarantined: %s", operation.artifact_revision_id.hex(), exc)
            return "quarantined"
        try:
            _requeue(root, op_id, operation)
        except PredicateFailed:
            return "taken up elsewhere"
        report.reconciled += 1
        _drive(root, op_id, report)
        return "reconciled"

    drive_each(root, ROWS, reconcile, phases={GcPhase.Quarantined})


def _reconcile_operations(root, report: GcReport) -> None:
    """README "Reconciliation": every Quarantined publish, commit build and restore whose owner
    is gone is taken up again once the store answers for the objects it holds. A staged
    manifest attempt is reconciled only through its owner, and only once the owner is terminal;
    when any attempt is in doubt, every terminal owner is visited for its attempts."""
    from nokvfs.schema.enums import BuildCommitPhase, PublishPhase, RestorePhase
    from nokvfs.schema.paths import normalize_path
    from nokvfs.workspace import restore
    from nokvfs.workspace.commit import build_commit

    def counted(reconcile, quarantined):
        def drive(op_id, operation):
            outcome = reconcile(op_id, operation)
            if operation.phase == quarantined:
                if outcome == "cleaned":
                    report.operations_reconciled += 1
                elif outcome == "quarantined":
                    report.operations_quarantined += 1
            return outcome

        return drive

    def staged(operation) -> bool:
        return normalize_path(operation.path) in publish.RESERVED_MANIFESTS

    # One scan of the publish operations (most of the operation tree) serves both questions.
    with root.read() as view:
        quarantined_publishes = publish.ROWS.matching(view, root, phases={PublishPhase.Quarantined})
    attempts_in_doubt = any(staged(op) for _, op in quarantined_publishes)
    drive_each(
        root,
        publish.ROWS,
        counted(lambda op_id, _: publish.reconcile(root, op_id).name.lower(), PublishPhase.Quarantined),
        found=[(op_id, op) for op_id, op in quarantined_publishes if not staged(op)],
    )
    for rows, machine, quarantined in (
        (build_commit.ROWS, build_commit, BuildCommitPhase.Quarantined),
        (restore.ROWS, restore, RestorePhase.Quarantined),
    ):
        wanted = (
            (lambda op, rows=rows: op.phase in rows.terminal)
            if attempts_in_doubt
            else (lambda op, q=quarantined: op.phase == q)
        )
        drive_each(
            root,
            rows,
            counted(lambda op_id, op, machine=machine: machine.reconcile(root, op_id, op), quarantined),
            wanted=wanted,
        )


def _requeue(root, op_id: bytes, operation: GcOperation) -> None:
    """The explicit reconciliation transition: Quarantined -> Deleting, candidate Claimed."""
    revision_id = operation.artifact_revision_id

    def change(view, current):
        raw_revision = view.get("artifact_revision", _revision_key(root, revision_id))
        revision = ArtifactRevision.decode(raw_revision)
        if current.phase != GcPhase.Quarantined or revision.state != RevisionState.Quarantined:
            raise PredicateFailed(f"gc of {revision_id.hex()} is no longer quarantined")
        predicates = [ValueEquals("artifact_revision", _revision_key(root, revision_id), raw_revision)]
        mutations = [
            Put(
                "artifact_revision",
                _revision_key(root, revision_id),
                replace(revision, state=RevisionState.Deleting),
            )
        ]
        predicates, mutations = _with_candidate(
            view, root, current, predicates, mutations, claim_state=GcClaimState.Claimed
        )
        return predicates, mutations, replace(current, phase=GcPhase.Deleting)

    ROWS.step(root, op_id, "gc.reconcile", change, digest=intent_digest("gc.reconcile", op_id))


def _with_candidate(view, root, operation: GcOperation, predicates, mutations, *, predicate: bool = True, **changes):
    """The operation's GcCandidate row, if it still exists, updated with `changes`."""
    key = keys.GcCandidateKey(root.root_id, operation.artifact_revision_id, operation.reference_epoch).encode()
    raw = view.get("gc_candidate", key)
    if raw is None:
        return predicates, mutations
    if predicate:
        predicates = predicates + [ValueEquals("gc_candidate", key, raw)]
    return predicates, mutations + [Put("gc_candidate", key, replace(GcCandidate.decode(raw), **changes))]


def _delete_objects(root, collections: list) -> dict:
    """Delete the objects every collection owns, all in one `delete_many`; op id -> (key, error,
    evidence) for each collection one of whose objects is not confirmed absent (a key the store
    answers None for is: see ObjectStore.delete_many)."""
    asked = [(c.op_id, row.object_key) for c in collections for row in c.own]
    try:
        answers = root.store.delete_many([key for _, key in asked]) if asked else []
    except StoreError as exc:  # the store refused the whole call: no key is confirmed
        answers = [exc] * len(asked)
    failures: dict = {}
    for (op_id, key), answer in zip(asked, answers, strict=True):
        if answer is None or op_id in failures:
            continue
        if not isinstance(answer, StoreError):
            raise answer  # not a store's answer (a malformed key): a bug to see, not to quarantine
        if isinstance(answer, AmbiguousResult):
            failures[op_id] = (key, answer, f"ambiguous delete of {key}: {answer}")
        else:
            failures[op_id] = (key, answer, f"delete of {key} failed: {answer}")
    return failures


def _drive(root, op_id: bytes, report: GcReport) -> None:
    """Delete the objects of one Deleting collection (a killed collector's, a reconciled one),
    then finish it, or quarantine it."""
    with root.read() as view:
        collection = _collection(view, root, op_id)
    _delete_and_finish(root, [collection], report)


def _delete_and_finish(root, collections: list, report: GcReport) -> None:
    """For collections whose claim is durable: delete every object they own (one batch),
    quarantine each one an object of which was not confirmed absent, and finish the others in
    one command."""
    if not collections:
        return
    failures = _delete_objects(root, collections)
    crash_point("gc-deleted")
    _settle(root, collections, failures, report)


def _settle(root, collections: list, failures: dict, report: GcReport) -> None:
    """After the deletes (`failures` as _delete_objects returns them): quarantine each collection
    an object of which was not confirmed absent, and finish the others in one command."""
    finished = []
    for collection in collections:
        if collection.op_id not in failures:
            finished.append(collection)
            continue
        key, error, evidence = failures[collection.op_id]
        revision = collection.operation.artifact_revision_id.hex()
        log.warning("gc of %s quarantined: %s", revision, evidence)
        _quarantine(root, collection.op_id, collection.operation, evidence)
        report.quarantined += 1
        report.failures.append(GcFailure(revision, key, error))
    if not finished:
        return
    _finish_many(root, finished)
    for collection in finished:
        report.freed_revisions += 1
        report.deleted_objects += len(collection.own)
        report.freed_bytes += sum(r.length for r in collection.own)
        report.freed.append(collection.operation.artifact_revision_id.hex())


def _finish_many(root, collections: list) -> None:
    """One command: each revision Deleting -> Deleted, its candidate Complete, its manifest rows
    pruned, and only then its RevisionDependency references released (which may make bases
    candidates), its operation Deleted. Each collection's rows are required exactly as its
    claim (or the read that resumed it) left them."""

    def build(view):
        refs = References(view, root.root_id)
        predicates, mutations = [], []
        for c in collections:
            revision_id = c.operation.artifact_revision_id
            # The child's own objects are gone: now, and only now, release its dependency set
            # (sealed with its count: a revision that depends on nothing has none to look for).
            if c.revision.dependency_count:
                dependency_prefix = keys.revision_ref_prefix(
                    root.root_id, ReferenceKind.RevisionDependency, keys.dependency_reference_owner(revision_id)
                )
                for key, _ in scan_prefix(view, "revision_ref", dependency_prefix, limit=255).items:
                    refs.remove(
                        ReferenceKind.RevisionDependency,
                        revision_id,
                        keys.RevisionRefKey.decode(key).artifact_revision_id,
                    )
            op_key, revision_key = c.op_key, c.revision_key
            predicates += [
                ValueEquals("operation", op_key, c.raw_operation),
                ValueEquals("artifact_revision", revision_key, c.raw_revision),
            ]
            mutations.append(Put("artifact_revision", revision_key, replace(c.revision, state=RevisionState.Deleted)))
            if c.candidate is not None:
                predicates.append(ValueEquals("gc_candidate", c.candidate_key, c.raw_candidate))
                mutations.append(
                    Put(
                        "gc_candidate",
                        c.candidate_key,
                        replace(c.candidate, claim_state=GcClaimState.Complete),
                    )
                )
            mutations += [Delete("artifact_manifest", k) for k in c.manifest_keys]
            mutations.append(
                Put(
                    "operation",
                    op_key,
                    replace(c.operation, phase=GcPhase.Deleted, deleted_object_count=len(c.own)),
                )
            )
        ref_predicates, ref_mutations = refs.rows()
        return Built(predicates=ref_predicates + predicates, mutations=ref_mutations + mutations)

    root.apply(build, digest=intent_digest("gc.finish", *[c.op_id for c in collections]))
    for c in collections:
        root.manifests.forget(c.operation.artifact_revision_id)


def _quarantine(root, op_id: bytes, operation: GcOperation, evidence: str) -> None:
    revision_id = operation.artifact_revision_id
    revision_key = _revision_key(root, revision_id)

    def change(view, current):
        raw_revision = view.get("artifact_revision", revision_key)
        predicates = [ValueEquals("artifact_revision", revision_key, raw_revision)]
        mutations = [
            Put(
                "artifact_revision",
                revision_key,
                replace(ArtifactRevision.decode(raw_revision), state=RevisionState.Quarantined),
            )
        ]
        candidate = _candidate(view, root, current)
        if candidate is not None:
            predicates, mutations = _with_candidate(
                view,
                root,
                current,
                predicates,
                mutations,
                predicate=False,
                claim_state=GcClaimState.Quarantined,
                retry_count=candidate.retry_count + 1,
                quarantine_evidence=evidence[:1024],
            )
        return (
            predicates,
            mutations,
            replace(current, phase=GcPhase.Quarantined, terminal_error=evidence[:1024]),
        )

    try:
        ROWS.step(root, op_id, "gc.quarantine", change, digest=intent_digest("gc.quarantine", op_id))
    except NokvError as exc:
        log.error("gc of %s could not even be quarantined: %s", revision_id.hex(), exc)


def _candidate(view, root, operation: GcOperation) -> GcCandidate | None:
    raw = view.get(
        "gc_candidate",
        keys.GcCandidateKey(root.root_id, operation.artifact_revision_id, operation.reference_epoch).encode(),
    )
    return None if raw is None else GcCandidate.decode(raw)
