"""fsck: recompute what the metadata claims and check the object store against it.

Every finding has a stable code. Metadata is namespace truth; an object-store listing is used
only to report objects nothing owns (ORPHAN_OBJECT), and `repair` deletes such an object only
after the proofs GC uses: its revision has no ArtifactRevision row (or is Deleted) and no
publish operation's ledger owns its key.

Checks:
  ROW_CORRUPT                     a row whose stored bytes fail their envelope check (every row
                                  of every tree is read); the other metadata checks stop there
  STATE_DIGEST / OUTBOX_CHAIN     the engine's own verification (state digests, outbox chain)
  INTEGRITY_ALARM                 the shard is recorded as corrupt, so it refuses writes, yet
                                  every row and digest verifies now (damage found is reported
                                  by its own code and keeps the alarm); `repair` lifts it
  UNDECODABLE_ROW                 a row of a family that does not decode under its record
  REF_COUNT                       strong_reference_count differs from the RevisionRef rows
  REF_DANGLING                    a RevisionRef names a revision that does not exist
  PATH_REF_MISSING / PATH_REF_ORPHAN   PathCurrent and Path references disagree
  PATH_REVISION                   a path names a missing or not-Available revision, or its
                                  sealed fields differ from the revision's
  DEPENDENCY_COUNT                dependency_count differs from the RevisionDependency refs
  MANIFEST_COVERAGE               manifest rows do not tile the body, or block_count differs
  GC_CANDIDATE_MISSING            a zero-reference Available revision has no candidate
  QUARANTINED                     a revision whose collection met an ambiguous or failed delete:
                                  its objects are in doubt (not BLOCK_MISSING); or a Quarantined
                                  publish, commit build, restore or commit retirement, with the
                                  objects and bytes its ledger (or its staged attempts) still
                                  owns and what else it retains; `nokvfs gc` reconciles all but
                                  a retirement once the store answers
  HOLD                            an Active snapshot without its HistoryHold, or the reverse
  HISTORY_FLOOR                   a HistoryHold reads below the shard's history floor (its
                                  History may have been pruned)
  RESTORE_MEMBER                  a restore's RestoreMember rows are not the contiguous sequence
                                  its operation counted, or (while its source can still be read:
                                  a held snapshot version, a Sealed commit) do not match a rescan
                                  of the source and the sealed count/digest
  COMMIT_SEAL                     a Sealed commit's member, revision or parent rows do not match
                                  its count/digest seals
  CONSUMER_COUNT                  a commit's consumer_count differs from its CommitConsumer rows
  BLOCK_MISSING / BLOCK_CORRUPT   a manifest object is absent, the wrong size or the wrong SHA-256
  ORPHAN_OBJECT                   a stored object no manifest and no ledger owns
  WIDE_MODE                       a directory or file of the data directory that others may
                                  access (a group or other mode bit; nokvfs creates them 0700 and
                                  0600): one finding per area (the directory itself, shard,
                                  objects, cache, spool, run, ...); `repair` clears those bits

Progress: `check(progress=...)` calls `progress(stage, done, total, done_bytes, total_bytes)` as
it goes: "metadata" (checks done of those to do), "blocks" (objects and bytes read of those the
manifests name), "store listing" (objects listed).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from nokvfs import filemodes
from nokvfs.engine.scan import iter_prefix
from nokvfs.errors import (
    FormatError,
    InvalidInput,
    NokvError,
    ObjectMissing,
    OutboxCorrupt,
    RowCorrupt,
    ShardCorrupt,
    StoreError,
)
from nokvfs.objects.keys import parse_artifact_block_key
from nokvfs.schema import keys
from nokvfs.schema.enums import (
    BuildCommitPhase,
    CommitRetirePhase,
    GcClaimState,
    HistoryHoldKind,
    OperationKind,
    PublishPhase,
    ReferenceKind,
    RestorePhase,
    RestoreSourceKind,
    RevisionState,
    SnapshotState,
)
from nokvfs.schema.records import (
    ArtifactRevision,
    GcCandidate,
    HistoryHold,
    PathEntry,
    PublishOperation,
    SnapshotRef,
    StagedObject,
)
from nokvfs.workspace import publish, replica


@dataclass(frozen=True)
class Finding:
    code: str
    subject: str
    detail: str


@dataclass
class FsckReport:
    findings: list = field(default_factory=list)
    checked: Counter = field(default_factory=Counter)
    repaired: list = field(default_factory=list)

    def add(self, code: str, subject: str, detail: str) -> None:
        self.findings.append(Finding(code, subject, detail))

    @property
    def ok(self) -> bool:
        return not self.findings


def _decoded(report: FsckReport, subject: str, decode, *args):
    """decode(*args), or None after an UNDECODABLE_ROW finding about `subject`."""
    try:
        return decode(*args)
    except FormatError as exc:
        report.add("UNDECODABLE_ROW", subject, str(exc))
        return None


def check(root, *, verify_blocks: bool = True, repair: bool = False, progress=None) -> FsckReport:
    report = FsckReport()
    step = progress or (lambda *figures: None)
    metadata_checks = 10
    step("metadata", 0, metadata_checks, None, None)
    _engine(root, report, repair=repair)
    _modes(root, report, repair=repair)
    step("metadata", 1, metadata_checks, None, None)
    try:
        with root.read(fenced=False) as view:
            revisions = _revisions(view, root, report)
            step("metadata", 2, metadata_checks, None, None)
            refs = _references(view, root, report, revisions)
            step("metadata", 3, metadata_checks, None, None)
            _paths(view, root, report, revisions, refs)
            step("metadata", 4, metadata_checks, None, None)
            manifests = _manifests(view, root, report, revisions)
            step("metadata", 5, metadata_checks, None, None)
            _holds(view, root, report)
            step("metadata", 6, metadata_checks, None, None)
            _commits(view, root, report)
            step("metadata", 7, metadata_checks, None, None)
            _restores(view, root, report)
            step("metadata", 8, metadata_checks, None, None)
            _quarantined_operations(view, root, report)
            step("metadata", 9, metadata_checks, None, None)
            ledger_keys = _ledger_keys(view, root)
            step("metadata", 10, metadata_checks, None, None)
    except ShardCorrupt as exc:
        # Nothing built on damaged rows can be trusted: report it and stop the metadata checks.
        if not any(f.code == "ROW_CORRUPT" for f in report.findings):
            report.add("ROW_CORRUPT", "shard", str(exc))
        return report
    if verify_blocks:
        in_doubt = {r for r, revision in revisions.items() if revision.state == RevisionState.Quarantined}
        _blocks(root, report, {r: rows for r, rows in manifests.items() if r not in in_doubt}, step)
    if not replica.is_read_only(root):  # a replica lags its owner: newer blocks are not orphans
        _orphans(root, report, revisions, manifests, ledger_keys, repair=repair, step=step)
    return report


def _engine(root, report: FsckReport, *, repair: bool) -> None:
    """The engine's full verification: every row's envelope, the outbox chain against the
    System tail, every tree's state digest; and the integrity alarm."""
    problems = root.shard.verify_state(full=True)
    for problem in problems:
        if isinstance(problem, RowCorrupt):
            report.add("ROW_CORRUPT", f"{problem.tree} {problem.key.hex()}", str(problem))
        elif isinstance(problem, OutboxCorrupt) or "outbox" in str(problem).lower():
            report.add("OUTBOX_CHAIN", "shard", str(problem))
        else:
            report.add("STATE_DIGEST", "shard", str(problem))
    report.checked["shard"] += 1
    finding = root.shard.integrity_finding
    if finding is None or problems:
        return
    if repair:
        root.shard.clear_integrity_alarm()
        report.repaired.append("integrity alarm")
        return
    report.add("INTEGRITY_ALARM", "shard", f"writes are refused: {finding.get('detail')}")


def _modes(root, report: FsckReport, *, repair: bool) -> None:
    """The data directory is private: nothing in it may be open to group or others."""
    for wide in filemodes.audit(root.data_dir):
        report.add("WIDE_MODE", wide.area, wide.describe(root.data_dir))
        if repair:
            report.repaired += [os.path.relpath(path, root.data_dir) for path in filemodes.narrow(wide)]
    report.checked["data directory"] += 1


def _revisions(view, root, report) -> dict:
    revisions = {}
    for key, value in iter_prefix(view, "artifact_revision", root.root_id):
        revision_id = key[16:]
        revision = _decoded(report, f"artifact_revision {revision_id.hex()}", ArtifactRevision.decode, value)
        if revision is not None:
            revisions[revision_id] = revision
    report.checked["revisions"] = len(revisions)
    return revisions


def _references(view, root, report, revisions) -> dict:
    """RevisionRef rows grouped: (kind, owner) lists per revision id."""
    refs = defaultdict(list)
    for key, _ in iter_prefix(view, "revision_ref", root.root_id):
        decoded = _decoded(report, f"revision_ref {key.hex()}", keys.RevisionRefKey.decode, key)
        if decoded is None:
            continue
        refs[decoded.artifact_revision_id].append((decoded.reference_kind, decoded.reference_owner_id))
    report.checked["references"] = sum(len(v) for v in refs.values())
    for revision_id, owners in refs.items():
        if revision_id not in revisions:
            report.add(
                "REF_DANGLING", revision_id.hex(), f"{len(owners)} reference(s) to a revision that does not exist"
            )
    for revision_id, revision in revisions.items():
        count = len(refs.get(revision_id, ()))
        if count != revision.strong_reference_count:
            report.add(
                "REF_COUNT",
                revision_id.hex(),
                f"strong_reference_count {revision.strong_reference_count}, {count} RevisionRef rows",
            )
        dependencies = sum(
            1
            for owners in refs.values()
            for kind, owner in owners
            if kind == ReferenceKind.RevisionDependency and owner == revision_id
        )
        if (
            revision.state in (RevisionState.Available, RevisionState.Deleting)
            and dependencies != revision.dependency_count
        ):
            report.add(
                "DEPENDENCY_COUNT",
                revision_id.hex(),
                f"dependency_count {revision.dependency_count}, {dependencies} dependency references",
            )
        if revision.state == RevisionState.Quarantined:
            candidate = view.get(
                "gc_candidate", keys.GcCandidateKey(root.root_id, revision_id, revision.reference_epoch).encode()
            )
            evidence = None if candidate is None else GcCandidate.decode(candidate).quarantine_evidence
            size = sum(
                row.length
                for row in publish.read_manifest(view, root, revision_id)
                if row.physical_owner_revision_id == revision_id
            )
            report.add(
                "QUARANTINED",
                revision_id.hex(),
                f"its delete was not confirmed ({evidence or 'no evidence recorded'}); {size} bytes in doubt; the next "
                "gc reconciles it once the store answers",
            )
        if revision.state == RevisionState.Available and revision.strong_reference_count == 0:
            candidate = view.get(
                "gc_candidate", keys.GcCandidateKey(root.root_id, revision_id, revision.reference_epoch).encode()
            )
            if candidate is None or GcCandidate.decode(candidate).claim_state != GcClaimState.Candidate:
                report.add(
                    "GC_CANDIDATE_MISSING",
                    revision_id.hex(),
                    f"zero references at epoch {revision.reference_epoch} and no candidate",
                )
    return refs


def _paths(view, root, report, revisions, refs) -> None:
    path_owners = {
        owner: revision_id
        for revision_id, owners in refs.items()
        for kind, owner in owners
        if kind == ReferenceKind.Path
    }
    seen_owners = set()
    count = 0
    for key, value in iter_prefix(view, "path_current", root.root_id):
        count += 1
        pair = _decoded(
            report,
            f"path_current {key.hex()}",
            lambda key=key, value=value: (keys.PathCurrentKey.decode(key), PathEntry.decode(value)),
        )
        if pair is None:
            continue
        decoded, entry = pair
        subject = f"{decoded.workspace_incarnation_id.hex()}:{'/'.join(decoded.path)}"
        owner = publish.path_owner(decoded.workspace_incarnation_id, decoded.path)
        seen_owners.add(owner)
        if path_owners.get(owner) != entry.artifact_revision_id:
            report.add("PATH_REF_MISSING", subject, f"no Path reference to revision {entry.artifact_revision_id.hex()}")
        revision = revisions.get(entry.artifact_revision_id)
        if revision is None or revision.state != RevisionState.Available:
            state = "missing" if revision is None else revision.state.name
            report.add("PATH_REVISION", subject, f"revision {entry.artifact_revision_id.hex()} is {state}")
        elif (revision.logical_size, revision.body_digest_uri, revision.manifest_digest_uri) != (
            entry.logical_size,
            entry.body_digest_uri,
            entry.manifest_digest_uri,
        ):
            report.add("PATH_REVISION", subject, "sealed size/digests differ from the revision's")
    report.checked["paths"] = count
    for owner, revision_id in path_owners.items():
        if owner not in seen_owners:
            report.add("PATH_REF_ORPHAN", revision_id.hex(), f"Path reference {owner.hex()} without a PathCurrent row")


def _manifests(view, root, report, revisions) -> dict:
    """revision id -> manifest rows, for Available/Deleting revisions; coverage checked."""
    out = {}
    for revision_id, revision in revisions.items():
        if revision.state not in (RevisionState.Available, RevisionState.Deleting, RevisionState.Quarantined):
            continue
        rows = _decoded(
            report, f"artifact_manifest {revision_id.hex()}", publish.read_manifest, view, root, revision_id
        )
        if rows is None:
            continue
        offset = 0
        for row in rows:
            if row.logical_offset != offset:
                report.add(
                    "MANIFEST_COVERAGE", revision_id.hex(), f"row at offset {row.logical_offset}, expected {offset}"
                )
                break
            offset += row.length
        else:
            if offset != revision.logical_size:
                report.add(
                    "MANIFEST_COVERAGE", revision_id.hex(), f"rows cover {offset} bytes of {revision.logical_size}"
                )
        if len(rows) != revision.block_count:
            report.add("MANIFEST_COVERAGE", revision_id.hex(), f"{len(rows)} rows, block_count {revision.block_count}")
        out[revision_id] = rows
    report.checked["manifest rows"] = sum(len(r) for r in out.values())
    return out


def _holds(view, root, report) -> None:
    holds = set()
    for key, value in iter_prefix(view, "history_hold", root.root_id):
        decoded = keys.HistoryHoldKey.decode(key)
        if decoded.hold_kind == HistoryHoldKind.Snapshot:
            holds.add(int.from_bytes(decoded.hold_id, "big"))
        read_version = HistoryHold.decode(value).read_version
        if read_version < view.floor:
            report.add(
                "HISTORY_FLOOR",
                f"{decoded.hold_kind.name} hold {decoded.hold_id.hex()}",
                f"reads at version {read_version}, below the history floor {view.floor}",
            )
    active = set()
    for key, value in iter_prefix(view, "snapshot_ref", root.root_id):
        decoded = keys.SnapshotRefKey.decode(key)
        if SnapshotRef.decode(value).state == SnapshotState.Active:
            active.add(decoded.snapshot_id)
    for snapshot_id in active - holds:
        report.add("HOLD", f"snapshot {snapshot_id}", "Active snapshot without its HistoryHold")
    for snapshot_id in holds - active:
        report.add("HOLD", f"snapshot {snapshot_id}", "HistoryHold without an Active snapshot")
    report.checked["snapshots"] = len(active)


def _commits(view, root, report) -> None:
    from nokvfs.schema.enums import CommitState
    from nokvfs.schema.records import Commit
    from nokvfs.workspace import commit as commits

    consumers = Counter()
    for key, _ in iter_prefix(view, "commit_consumer", root.root_id):
        consumers[keys.CommitConsumerKey.decode(key).commit_id] += 1
    count = 0
    for key, value in iter_prefix(view, "commit", root.root_id):
        commit_id = keys.CommitKey.decode(key).commit_id
        record = _decoded(report, f"commit {commit_id.hex()}", Commit.decode, value)
        if record is None:
            continue
        count += 1
        if record.consumer_count != consumers.get(commit_id, 0):
            report.add(
                "CONSUMER_COUNT",
                commit_id.hex(),
                f"consumer_count {record.consumer_count}, {consumers.get(commit_id, 0)} CommitConsumer rows",
            )
        if record.state == CommitState.Sealed:
            try:
                commits.verify_closure(view, root, commit_id, commits.commit_seals(record))
            except NokvError as exc:
                report.add("COMMIT_SEAL", commit_id.hex(), str(exc))
    report.checked["commits"] = count


def _restores(view, root, report) -> None:
    from nokvfs.schema.enums import CommitState, RestorePhase, RestoreSourceKind
    from nokvfs.schema.records import RestoreOperation
    from nokvfs.workspace import restore as restores
    from nokvfs.workspace.consumers import read_commit

    counted = (RestorePhase.Copying, RestorePhase.SourceSealed, RestorePhase.Ready, RestorePhase.Complete)
    count = 0
    for key, value in iter_prefix(view, "operation", keys.operation_prefix(root.root_id, OperationKind.Restore)):
        op_id = keys.OperationKey.decode(key).operation_id
        op = _decoded(report, f"restore operation {op_id.hex()}", RestoreOperation.decode, value)
        if op is None or op.phase not in counted:
            continue  # Preparing has none yet; cleanup removes them
        count += 1
        sequences = [sequence for sequence, _ in restores._restore_members(view, root, op_id)]
        if sequences != list(range(op.member_sequence)) or (
            op.phase != RestorePhase.Copying and len(sequences) != op.member_count
        ):
            report.add(
                "RESTORE_MEMBER",
                op_id.hex(),
                f"{len(sequences)} member rows, the operation counted {op.member_sequence} ({op.phase.name})",
            )
            continue
        if op.phase == RestorePhase.Copying:
            continue
        if op.source_kind == RestoreSourceKind.Snapshot and op.source_read_version < view.floor:
            continue  # a completed restore's released snapshot version: pruned, nothing to rescan
        if op.source_kind == RestoreSourceKind.Commit:
            _, source = read_commit(view, root.root_id, op.source_commit_id)
            if source is None or source.state != CommitState.Sealed:
                continue  # retired after the restore completed
        try:
            restores.verify_members(view, root, op_id, op, staged=op.phase != RestorePhase.Complete)
        except NokvError as exc:
            report.add("RESTORE_MEMBER", op_id.hex(), str(exc))
    report.checked["restores"] = count


def _quarantined_operations(view, root, report) -> None:
    """Every Quarantined publish, commit build, restore and retirement, and what it holds."""
    from nokvfs.workspace import restore as restores
    from nokvfs.workspace import staging
    from nokvfs.workspace.commit import build_commit, retirement

    def attempts_held(attempts) -> str:
        objects = size = 0
        for publish_id, pub in attempts.made(root):
            if pub.phase == PublishPhase.Quarantined:
                n, b = staging.quarantined_bytes(view, root, publish_id)
                objects, size = objects + n, size + b
        return f"{objects} object(s), {size} bytes in doubt in its staged manifest attempts"

    def quarantined(rows, phase):
        for key, value in iter_prefix(view, "operation", keys.operation_prefix(root.root_id, rows.kind)):
            try:
                op = rows.record.decode(value)
            except FormatError:
                continue  # UNDECODABLE_ROW is reported where the family is checked
            if op.phase == phase:
                yield keys.OperationKey.decode(key).operation_id, op

    count = 0
    for op_id, op in quarantined(publish.ROWS, PublishPhase.Quarantined):
        count += 1
        objects, size = staging.quarantined_bytes(view, root, op_id)
        report.add(
            "QUARANTINED",
            f"publish {op_id.hex()} ({op.path})",
            f"{objects} object(s), {size} bytes its ledger owns are in doubt ({op.terminal_error}); the next gc "
            "reconciles them once the store answers",
        )
    for op_id, _op in quarantined(build_commit.ROWS, BuildCommitPhase.Quarantined):
        count += 1
        report.add(
            "QUARANTINED",
            f"build-commit {op_id.hex()}",
            f"{attempts_held(build_commit.attempts_of(op_id))}; the next gc reconciles it once the store answers",
        )
    for op_id, op in quarantined(restores.ROWS, RestorePhase.Quarantined):
        count += 1
        source = (
            f"snapshot {op.source_snapshot_id}"
            if op.source_kind == RestoreSourceKind.Snapshot
            else f"commit {op.source_commit_id.hex()}"
        )
        report.add(
            "QUARANTINED",
            f"restore {op_id.hex()} ({op.source_workbench_id} -> {op.destination_workbench_id})",
            f"{attempts_held(restores.attempts_of(op_id))}; it retains {source} of {op.source_workbench_id} (read "
            f"version {op.source_read_version}) "
            f"and the name {op.destination_workbench_id!r}; the next gc reconciles it once the store answers",
        )
    for op_id, op in quarantined(retirement.ROWS, CommitRetirePhase.Quarantined):
        count += 1
        report.add(
            "QUARANTINED",
            f"commit retirement {op_id.hex()}",
            f"commit {op.commit_id.hex()} stays Retiring: {op.terminal_error} (metadata evidence, not reconciled "
            "automatically)",
        )
    report.checked["quarantined operations"] = count


def _ledger_keys(view, root) -> set:
    """Object keys owned by the ledger of any publish that is not Cleaned."""
    owned = set()
    prefix = keys.operation_prefix(root.root_id, OperationKind.Publish)
    for key, value in iter_prefix(view, "operation", prefix):
        operation_id = keys.OperationKey.decode(key).operation_id
        if PublishOperation.decode(value).phase == PublishPhase.Cleaned:
            continue
        for _, row in iter_prefix(view, "staged_object", keys.staged_object_prefix(root.root_id, operation_id)):
            owned.add(StagedObject.decode(row).object_key)
    return owned


def _blocks(root, report, manifests, step) -> None:
    sizes = {row.object_key: row.object_offset + row.length for rows in manifests.values() for row in rows}
    total_bytes = sum(sizes.values())
    seen = set()
    read_bytes = 0
    for revision_id, rows in manifests.items():
        for row in rows:
            if row.object_key in seen:
                continue
            step("blocks", len(seen), len(sizes), read_bytes, total_bytes)
            seen.add(row.object_key)
            try:
                data = root.store.get(row.object_key)
            except ObjectMissing:
                report.add("BLOCK_MISSING", row.object_key, f"object of revision {revision_id.hex()} is absent")
                continue
            except StoreError as exc:
                report.add("BLOCK_MISSING", row.object_key, f"cannot read: {exc}")
                continue
            read_bytes += len(data)
            expected = row.object_offset + row.length
            if len(data) < expected or "sha256:" + hashlib.sha256(data).hexdigest() != row.digest_uri:
                report.add("BLOCK_CORRUPT", row.object_key, f"{len(data)} bytes do not match {row.digest_uri}")
    step("blocks", len(seen), len(sizes), read_bytes, total_bytes)
    report.checked["objects"] = len(seen)


def _orphans(root, report, revisions, manifests, ledger_keys, *, repair: bool, step) -> None:
    referenced = {row.object_key for rows in manifests.values() for row in rows}
    prefix = f"nokv/artifacts/{root.logical_shard_id.hex()}/{root.root_id.hex()}/"
    for listed, info in enumerate(root.store.list(prefix), 1):
        step("store listing", listed, None, None, None)
        if info.key in referenced or info.key in ledger_keys:
            continue
        try:
            _, _, revision_id, _ = parse_artifact_block_key(info.key)
        except InvalidInput:
            report.add("ORPHAN_OBJECT", info.key, "not an artifact block key")
            continue
        revision = revisions.get(revision_id)
        report.add("ORPHAN_OBJECT", info.key, f"{info.size} bytes owned by no manifest or ledger")
        if repair and (revision is None or revision.state == RevisionState.Deleted):
            try:
                root.store.delete(info.key)
                report.repaired.append(info.key)
            except StoreError as exc:
                report.add("ORPHAN_OBJECT", info.key, f"repair failed: {exc}")
