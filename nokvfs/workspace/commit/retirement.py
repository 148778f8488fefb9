"""CommitRetire: retiring a commit nothing consumes.

    Claiming -> Releasing -> Complete
    Claiming | Releasing -> Quarantined     (the rows no longer match the commit's seals)

One command predicates Sealed, consumer_count == 0 and the expected consumer_epoch, changes
Sealed -> Retiring and creates the CommitRetireOperation (Claiming). The seals are rechecked from
the rows (Claiming -> Releasing, or Quarantined on a mismatch), then bounded batches release the
Commit RevisionRefs (cursor: the last revision id), the outbound ChildCommit consumers (cursor:
next parent index) and finally the CommitMember rows (cursor: last ordered path); a resume
rechecks the seals while the members still exist. One last command checks the released counts
against the seals and publishes Retired. Tag movement or deletion never retires a commit.

A Quarantined retirement is evidence that metadata changed under a Retiring commit, not doubt
about the store: nothing reconciles it automatically; fsck reports it.

Crash point (operations.crash_point): commit-after-retire-batch.
"""

from __future__ import annotations

import dataclasses
import struct

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, scan_prefix
from nokvfs.errors import IntegrityError, NotFound, PredicateFailed
from nokvfs.schema import canonical_json, keys
from nokvfs.schema.enums import CommitConsumerKind, CommitRetirePhase, CommitState, OperationKind, ReferenceKind
from nokvfs.schema.ids import check_commit_id
from nokvfs.schema.records import ZERO_DIGEST, Commit, CommitRetireOperation
from nokvfs.workspace.commit.closure import EOF, commit_ref_ids, commit_seals, member_rows, verify_closure
from nokvfs.workspace.commit.identity import member_chain, parent_digest, retire_operation_id, revision_digest
from nokvfs.workspace.consumers import Consumers, read_commit
from nokvfs.workspace.operations import Rows, crash_point, drive_each, driving
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built

RETIRE_TERMINAL = (CommitRetirePhase.Complete, CommitRetirePhase.Quarantined)
ROWS = Rows(
    OperationKind.CommitRetire,
    "commit-retire",
    RETIRE_TERMINAL,
    subject=lambda op_id, op: f"commit retirement {op_id.hex()}",
)
BATCH = 200

_U32 = struct.Struct(">I")


class CommitInUse(PredicateFailed):
    """The commit still has consumers (a head, tag, lease or child): it cannot be retired."""


def retire_operation(root, op_id: bytes) -> CommitRetireOperation:
    return ROWS.get(root, op_id)


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
            raise CommitInUse(
                f"commit {commit_id.hex()} has {commit.consumer_count} consumer(s) (head, tag, lease or child)"
            )
        if commit.consumer_epoch != expected_epoch:
            raise PredicateFailed(
                f"commit {commit_id.hex()} is at consumer epoch {commit.consumer_epoch}, expected {expected_epoch}"
            )
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
            predicates=[ValueEquals("commit", key, raw), Absent("operation", ROWS.key(root, op_id))],
            mutations=[
                Put("commit", key, dataclasses.replace(commit, state=CommitState.Retiring)),
                Put("operation", ROWS.key(root, op_id), op),
            ],
        )

    ROWS.apply(root, "commit.retire-claim", op_id, build)
    return op_id


def retire(root, commit_id: bytes, *, expected_epoch: int | None = None, batch: int = BATCH) -> CommitRetireOperation:
    """Retire a commit nothing consumes: claim it, then release its members, unique revision
    refs and parent consumers in bounded batches, then publish Retired."""
    op_id = retire_operation_id(root.root_id, check_commit_id(commit_id))
    with root.read() as view:
        exists = view.get("operation", ROWS.key(root, op_id)) is not None
    if not exists:
        claim_retirement(root, commit_id, expected_epoch=expected_epoch)
    with driving(root, op_id, "commit retirement"):
        return _drive(root, op_id, batch=batch)


def _retire_cas(root, op_id: bytes, label: str, collect):
    """One retirement command: collect(view, op, commit) -> (predicates, mutations, new op); the
    commit row follows the operation (its retirement cursor, Retired at the end)."""

    def change(view, op):
        raw_commit, commit = read_commit(view, root.root_id, op.commit_id)
        predicates, mutations, updated = collect(view, op, commit)
        commit_key = keys.CommitKey(root.root_id, op.commit_id).encode()
        new_commit = dataclasses.replace(commit, retirement_cursor=_retirement_cursor(updated))
        if updated.phase == CommitRetirePhase.Complete:
            new_commit = dataclasses.replace(new_commit, state=CommitState.Retired)
        return (
            predicates + [ValueEquals("commit", commit_key, raw_commit)],
            mutations + [Put("commit", commit_key, new_commit)],
            updated,
        )

    ROWS.step(root, op_id, label, change)


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
    def change(view, op):
        return [], [], dataclasses.replace(op, phase=CommitRetirePhase.Quarantined, terminal_error=evidence[:1024])

    ROWS.step(root, op_id, "commit.retire-quarantine", change)


def _drive(root, op_id: bytes, *, batch: int = BATCH) -> CommitRetireOperation:
    """Drive a retirement to Complete (the caller holds its lock); IntegrityError once it is
    Quarantined."""
    limit = min(batch, MAX_ITEMS_PER_CALL)
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
            _retire_cas(
                root,
                op_id,
                "commit.retire-release",
                lambda v, o, c: ([], [], dataclasses.replace(o, phase=CommitRetirePhase.Releasing)),
            )
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
        crash_point("commit-after-retire-batch")


def _recheck_retiring(view, root, commit: Commit, op: CommitRetireOperation) -> None:
    if commit is None or commit.state != CommitState.Retiring:
        raise IntegrityError(f"commit {op.commit_id.hex()} is not Retiring under its retirement")
    if op.revision_cursor == b"" and op.parent_cursor == b"":
        verify_closure(view, root, op.commit_id, commit_seals(commit))
        return
    # Part of the set is released: the members still seal the revision set, and what remains
    # is exactly the part after the cursors.
    count, digest, revisions = 0, ZERO_DIGEST, set()
    for _, components, member in member_rows(view, root, op.commit_id):
        count += 1
        digest = member_chain(digest, components, member)
        revisions.add(member.artifact_revision_id)
    if (count, digest) != (commit.member_count, commit.member_digest) or revision_digest(
        revisions
    ) != commit.revision_digest:
        raise IntegrityError(f"commit {op.commit_id.hex()}: the members no longer match the seals")
    remaining = commit_ref_ids(view, root, op.commit_id)
    cursor = b"" if op.revision_cursor == EOF else op.revision_cursor
    expected = sorted(r for r in revisions if op.revision_cursor != EOF and r > cursor)
    if remaining != expected or op.released_revision_count + len(remaining) != commit.unique_revision_count:
        raise IntegrityError(
            f"commit {op.commit_id.hex()}: the remaining Commit refs do not follow the revision cursor"
        )
    if parent_digest(commit.parents) != commit.parent_digest:
        raise IntegrityError(f"commit {op.commit_id.hex()}: the parents no longer match the parent seal")


def _release_revisions(view, root, op: CommitRetireOperation, limit: int):
    prefix = keys.revision_ref_prefix(root.root_id, ReferenceKind.Commit, keys.commit_reference_owner(op.commit_id))
    marker = None if not op.revision_cursor else prefix + op.revision_cursor
    page = scan_prefix(view, "revision_ref", prefix, start_after=marker, limit=limit)
    refs = References(view, root.root_id)
    for key, _ in page.items:
        refs.remove(ReferenceKind.Commit, op.commit_id, key[len(prefix) :])
    predicates, mutations = refs.rows()
    cursor = EOF if page.next_marker is None else page.items[-1][0][len(prefix) :]
    return (
        predicates,
        mutations,
        dataclasses.replace(
            op, revision_cursor=cursor, released_revision_count=op.released_revision_count + len(page.items)
        ),
    )


def _release_parents(view, root, op: CommitRetireOperation, commit: Commit, limit: int):
    start = 0 if not op.parent_cursor else _U32.unpack(op.parent_cursor)[0]
    chosen = commit.parents[start : start + limit]
    consumers = Consumers(view, root.root_id)
    for parent in chosen:
        consumers.remove(parent, CommitConsumerKind.ChildCommit, op.commit_id)
    predicates, mutations = consumers.rows()
    end = start + len(chosen)
    cursor = EOF if end >= len(commit.parents) else _U32.pack(end)
    return (
        predicates,
        mutations,
        dataclasses.replace(op, parent_cursor=cursor, released_parent_count=op.released_parent_count + len(chosen)),
    )


def _release_members(view, root, op: CommitRetireOperation, limit: int):
    prefix = keys.commit_member_prefix(root.root_id, op.commit_id)
    marker = None if not op.member_cursor else prefix + op.member_cursor
    page = scan_prefix(view, "commit_member", prefix, start_after=marker, limit=limit)
    mutations = [Delete("commit_member", k) for k, _ in page.items]
    cursor = EOF if page.next_marker is None else page.items[-1][0][len(prefix) :]
    return (
        [],
        mutations,
        dataclasses.replace(op, member_cursor=cursor, released_member_count=op.released_member_count + len(page.items)),
    )


def _finish_retire(op: CommitRetireOperation, commit: Commit):
    released = (op.released_member_count, op.released_revision_count, op.released_parent_count)
    sealed = (commit.member_count, commit.unique_revision_count, commit.parent_count)
    if released != sealed:
        raise IntegrityError(f"commit {op.commit_id.hex()}: released {released}, sealed {sealed}")
    result = canonical_json.dumps(
        {
            "commit_id": op.commit_id.hex(),
            "released_members": released[0],
            "released_revisions": released[1],
            "released_parents": released[2],
        }
    )
    return [], [], dataclasses.replace(op, phase=CommitRetirePhase.Complete, result=result)


def recover(root) -> list[tuple[str, str]]:
    """Resume every retirement whose owning process is gone: (op hex, outcome)."""

    def drive(op_id, _):
        _drive(root, op_id)
        return "retired"

    return drive_each(root, ROWS, drive)
