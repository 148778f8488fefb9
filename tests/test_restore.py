"""Restore (seed "Restore Closure"): a new workbench from a snapshot or a commit.

    Preparing -> Copying -> SourceSealed -> Ready -> Complete
    Preparing | Copying | SourceSealed | Ready -> Aborting -> Cleaning -> Cleaned | Quarantined

The destination's every file equals the source as of that point byte for byte; nothing of it
is visible before the final command; a snapshot source is retained by a consumer (retire loses
with ForkRetentionActive) and a commit source by a Lease consumer; a process killed after any
command resumes or is cleaned by the RestoreMember rows; publication and a Ready-state abort
have exactly one winner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct

import pytest

from nokvfs.engine.command import Put
from nokvfs.errors import (
    AlreadyExists,
    IntegrityError,
    InvalidInput,
    NotFound,
    PredicateFailed,
)
from nokvfs.schema import canonical_json, keys
from nokvfs.schema.enums import (
    ChangeEventKind,
    CommitConsumerKind,
    HistoryHoldKind,
    OperationKind,
    ReferenceKind,
    RestorePhase,
    RestoreSourceKind,
    WorkspaceState,
)
from nokvfs.schema.records import RestoreMember, SnapshotRef
from nokvfs.workspace import (
    asof,
    changes,
    commit,
    fsck,
    listing,
    namespace,
    publish,
    reading,
    restore,
    snapshot,
)
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.root import Built, intent_digest
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    BLOCK,
    KILLED,
    WB,
    RootHolder,
    all_rows,
    bench_fixture,
    body,
    data_dir_fixture,
    publish_ops,
    revision,
    root_fixture,
    run_crash_child,
    workspace_row,
)
from tests.workspace_helpers import Killed, files_of, killed_after, put_all

DEST = "restored"
U32 = struct.Struct(">I")
FILES = {
    "input/a.csv": body(2 * BLOCK + 5, "a"),
    "input/deep/er/b.bin": body(BLOCK, "b"),
    "logs/l.txt": b"log line\n",
    "outputs/x": b"x",
    "outputs/y": body(3 * BLOCK, "y"),
    "scripts/s.py": b"print(1)\n",
    "outputs/z/1": b"one",
}


def populate(root, files=FILES):
    put_all(root, WB, files)


def tree(root, workbench_id) -> dict[str, bytes]:
    return files_of(root, workbench_id)


def without_restore_manifest(files: dict) -> dict:
    return {p: d for p, d in files.items() if p != restore.RESTORE_MANIFEST_PATH}


def snapshot_ref(root, snap) -> SnapshotRef:
    with root.read() as view:
        return SnapshotRef.decode(
            view.get(
                "snapshot_ref",
                keys.SnapshotRefKey(root.root_id, snap.workbench.incarnation_id, snap.snapshot_id).encode(),
            )
        )


def restore_hold(root, op_id):
    with root.read() as view:
        return view.get("history_hold", keys.HistoryHoldKey(root.root_id, HistoryHoldKind.Restore, op_id).encode())


def staged_rows(root, incarnation) -> list:
    return all_rows(root, "path_current", keys.path_current_prefix(root.root_id, incarnation))


def path_refs_of(root, incarnation) -> list:
    prefix = root.root_id + bytes([ReferenceKind.Path]) + incarnation
    return all_rows(root, "revision_ref", prefix)


def lease_consumers(root, commit_id):
    prefix = keys.commit_consumer_prefix(root.root_id, commit_id, CommitConsumerKind.Lease)
    return all_rows(root, "commit_consumer", prefix)


def request_for(root, source, destination=DEST) -> restore.RestoreRequest:
    with root.read() as view:
        _, source_wb = wb.visible(view, root.root_id, WB)
        kind, selector = restore.resolve_source(view, root, source_wb, source)
    return restore.RestoreRequest(WB, source_wb.incarnation_id, kind, selector, destination, os.urandom(16))


def assert_restored(root, result, expected: dict):
    got = tree(root, DEST)
    assert without_restore_manifest(got) == expected
    manifest = canonical_json.loads(got[restore.RESTORE_MANIFEST_PATH])
    assert manifest["operation_id"] == result.operation_id.hex()
    op = restore.operation(root, result.operation_id)
    assert op.phase == RestorePhase.Complete and op.member_count == result.member_count
    marker = workspace_row(root, DEST)
    assert marker.state == WorkspaceState.Visible and marker.workspace_incarnation_id == result.destination_incarnation
    # every destination path holds exactly one Path reference, to the revision it names
    rows = staged_rows(root, result.destination_incarnation)
    refs = path_refs_of(root, result.destination_incarnation)
    assert len(refs) == len(rows)
    assert restore_hold(root, result.operation_id) is None
    assert not [p for p in publish_ops(root).values() if p.phase not in publish.TERMINAL]
    assert fsck.check(root).findings == []


# --- the two sources ----------------------------------------------------------------------------


def test_a_restore_from_a_snapshot_copies_every_file_as_of_the_snapshot_byte_for_byte(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB, alias="before")
    expected = tree(root, WB)
    namespace.put(root, WB, "outputs/x", b"changed later")
    namespace.remove(root, WB, "logs/l.txt")
    namespace.put(root, WB, "outputs/new", b"new")
    result = restore.restore(root, WB, ("snapshot", "before"), DEST, batch=2)
    assert result.source_kind == RestoreSourceKind.Snapshot and result.source_selector == snap.snapshot_id.to_bytes(
        8, "big"
    )
    assert_restored(root, result, expected)
    assert result.member_count == len(FILES)
    ref = snapshot_ref(root, snap)
    assert (ref.consumer_count, ref.consumer_epoch) == (0, 2)  # attached, then released
    assert snapshot.retire(root, WB, "before") == snap.snapshot_id
    assert without_restore_manifest(tree(root, DEST)) == expected  # the copy owns its references


def test_a_restore_from_a_commit_copies_the_commit_tree_byte_for_byte(bench):
    root = bench
    populate(root)
    made = commit.build(root, WB)
    with root.read() as view:
        expected = {p: reading.read(root, e, view=view) for p, e in asof.at_commit(view, root, made.commit_id).files()}
    namespace.put(root, WB, "outputs/x", b"after the commit")
    result = restore.restore(root, WB, ("commit", made.hex[:10]), DEST, batch=3)
    assert_restored(root, result, expected)
    assert commit.RUN_MANIFEST_PATH in expected and result.member_count == len(FILES) + 1
    assert lease_consumers(root, made.commit_id) == []
    sealed = commit.get(root, made.commit_id).commit
    assert sealed.consumer_count == 1 and sealed.consumer_epoch == 3  # head, lease added, lease removed


def test_a_restored_copy_shares_revisions_and_keeps_them_when_the_source_lets_go(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB)
    result = restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)
    with root.read() as view:
        source_rev = listing.stat(view, root, WB, "outputs/y").entry.artifact_revision_id
        dest_rev = listing.stat(view, root, DEST, "outputs/y").entry.artifact_revision_id
    assert source_rev == dest_rev and revision(root, source_rev).strong_reference_count == 2
    namespace.remove(root, WB, "outputs/y")
    snapshot.retire(root, WB, snap.snapshot_id)
    from nokvfs.workspace import gc

    gc.collect(root)
    assert tree(root, DEST)["outputs/y"] == FILES["outputs/y"]
    assert result.destination_workbench_id == DEST


def test_restoring_a_restored_workbench_replaces_its_restore_manifest(bench):
    root = bench
    populate(root)
    first = restore.restore(root, WB, ("snapshot", snapshot.mint(root, WB).snapshot_id), DEST)
    namespace.put(root, DEST, "outputs/x", b"edited in the copy")
    source = tree(root, DEST)
    snap = snapshot.mint(root, DEST)
    second = restore.restore(root, DEST, ("snapshot", snap.snapshot_id), "again", batch=3)
    got = tree(root, "again")
    assert without_restore_manifest(got) == without_restore_manifest(source)
    assert canonical_json.loads(got[restore.RESTORE_MANIFEST_PATH])["operation_id"] == second.operation_id.hex()
    assert canonical_json.loads(source[restore.RESTORE_MANIFEST_PATH])["operation_id"] == first.operation_id.hex()
    assert second.member_count == len(FILES) + 1  # the source's own manifest is a sealed member
    inc = second.destination_incarnation
    assert len(path_refs_of(root, inc)) == len(staged_rows(root, inc)) == len(FILES) + 1


# --- visibility, identity, manifest -------------------------------------------------------------


def test_nothing_of_the_destination_is_visible_before_the_final_command(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB)
    request = request_for(root, ("snapshot", snap.snapshot_id))
    version = root.shard.commit_version
    op_id = restore.prepare(root, request)
    phases = []
    while restore.operation(root, op_id).phase != RestorePhase.Ready:
        phases.append(restore.advance(root, op_id, batch=2))
        with pytest.raises(NotFound):
            wb.get(root, DEST)
        with root.read() as view:
            assert DEST not in [w.workbench_id for w in wb.list_visible(view, root.root_id)]
            with pytest.raises(NotFound):
                listing.stat(view, root, DEST, "outputs/x")
        assert [
            c for c in changes.read_changes(root, after_commit_version=version).changes if c.workbench_id == DEST
        ] == []
        assert fsck.check(root).findings == []  # staged paths and references agree at every step
    assert (
        phases[0] == RestorePhase.Copying and phases[-1] == RestorePhase.Ready and RestorePhase.SourceSealed in phases
    )
    staged = staged_rows(root, request.destination_incarnation)
    assert len(staged) == len(FILES) + 1  # every file and the restore manifest, staged
    assert len(path_refs_of(root, request.destination_incarnation)) == len(FILES) + 1
    restore.advance(root, op_id)
    feed = [c for c in changes.read_changes(root, after_commit_version=version).changes if c.workbench_id == DEST]
    assert [(c.kind, c.after) for c in feed] == [(ChangeEventKind.WorkspaceRestored, op_id)]
    assert wb.get(root, DEST).state == WorkspaceState.Visible


def test_identity_and_initialization_digests_follow_the_contract(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB)
    request = request_for(root, ("snapshot", snap.snapshot_id))
    op_id = restore.prepare(root, request)
    identity = hashlib.sha256(
        b"nokv.restore.operation.v2\0"
        + root.root_id
        + U32.pack(len(WB))
        + WB.encode()
        + request.source_incarnation
        + b"\x01"
        + snap.snapshot_id.to_bytes(8, "big")
        + U32.pack(len(DEST))
        + DEST.encode()
        + request.destination_incarnation
    ).digest()
    assert op_id == identity[:16]
    op = restore.operation(root, op_id)
    assert op.identity_digest == identity
    path = b"metadata/restore_manifest.json"
    init = hashlib.sha256(
        b"nokv.restore.initialization.v3\0"
        + identity
        + U32.pack(1)
        + b"\x01"
        + U32.pack(len(path))
        + path
        + U32.pack(len(op.restore_manifest_entry))
        + op.restore_manifest_entry
    ).digest()
    assert op.initialization_digest == init
    result = restore.resume(root, op_id)
    with root.read() as view:
        raw = view.get(
            "path_current",
            keys.path_current_key(root.root_id, result.destination_incarnation, restore.RESTORE_MANIFEST),
        )
    assert raw == op.restore_manifest_entry  # the put entry is exactly the sealed descriptor
    manifest = canonical_json.loads(tree(root, DEST)[restore.RESTORE_MANIFEST_PATH])
    assert manifest == {
        "schema": "nokv.workbench.restore_manifest.v1",
        "operation_id": op_id.hex(),
        "source_workbench_id": WB,
        "source_workspace_incarnation_id": request.source_incarnation.hex(),
        "source_kind": "snapshot",
        "source": snap.snapshot_id,
        "destination_workbench_id": DEST,
        "destination_workspace_incarnation_id": request.destination_incarnation.hex(),
    }


def test_the_internal_request_refuses_aliases_and_a_collision_or_mismatch_is_typed(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB, alias="s")
    inc = wb.get(root, WB).incarnation_id
    with pytest.raises(InvalidInput):
        restore.RestoreRequest(WB, inc, RestoreSourceKind.Snapshot, "s", DEST, os.urandom(16))
    with pytest.raises(InvalidInput):
        restore.RestoreRequest(WB, inc, RestoreSourceKind.Snapshot, b"\x00" * 32, DEST, os.urandom(16))
    request = request_for(root, ("snapshot", "s"))
    assert request.snapshot_id == snap.snapshot_id
    op_id = restore.prepare(root, request)
    assert restore.prepare(root, request) == op_id  # the exact same identity resumes
    key = keys.OperationKey(root.root_id, OperationKind.Restore, op_id).encode()

    def overwrite(op):
        def build(view):
            return Built(mutations=[Put("operation", key, op)])

        root.apply(build, digest=intent_digest("test.overwrite", os.urandom(16)))

    original = restore.operation(root, op_id)
    overwrite(dataclasses.replace(original, initialization_digest=bytes(32)))
    with pytest.raises(restore.RequestMismatch):
        restore.prepare(root, request)
    overwrite(dataclasses.replace(original, identity_digest=op_id + bytes(16)))
    with pytest.raises(restore.OperationCollision):
        restore.prepare(root, request)
    overwrite(original)
    assert restore.resume(root, op_id).operation_id == op_id


# --- source retention and races -----------------------------------------------------------------


def test_retire_loses_to_fork_attach(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB, alias="s")
    op_id = restore.prepare(root, request_for(root, ("snapshot", "s")))
    ref = snapshot_ref(root, snap)
    assert (ref.consumer_count, ref.consumer_epoch) == (1, 1)
    assert restore_hold(root, op_id) is not None
    with pytest.raises(snapshot.ForkRetentionActive):
        snapshot.retire(root, WB, "s")
    assert snapshot.reap(root, now_ms=ref.lease_deadline + 10**7, skew_grace_ms=0) == []
    restore.resume(root, op_id)
    assert snapshot.retire(root, WB, "s") == snap.snapshot_id


def test_fork_attach_loses_to_retire(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB, alias="s")
    request = request_for(root, ("snapshot", "s"))
    snapshot.retire(root, WB, "s")
    with pytest.raises(PredicateFailed):
        restore.prepare(root, request)
    assert workspace_row(root, DEST) is None
    assert snapshot_ref(root, snap).consumer_count == 0


def test_a_snapshot_past_its_lease_cannot_be_restored(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB, lease_seconds=1)
    root.shard.observe_lease_clock(snap.ref.lease_deadline + 1)
    with pytest.raises(PredicateFailed, match="expired"):
        restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)
    assert workspace_row(root, DEST) is None


def test_a_remint_after_alias_resolution_does_not_redirect_the_restore(bench, monkeypatch):
    root = bench
    populate(root)
    first = snapshot.mint(root, WB, alias="name")
    expected = tree(root, WB)
    namespace.put(root, WB, "outputs/x", b"newer")
    real = restore.resolve_source

    def resolve_then_remint(*args):
        resolved = real(*args)
        snapshot.mint(root, WB, alias="name")  # the name moves after resolution
        return resolved

    monkeypatch.setattr(restore, "resolve_source", resolve_then_remint)
    result = restore.restore(root, WB, ("snapshot", "name"), DEST)
    monkeypatch.undo()
    assert int.from_bytes(result.source_selector, "big") == first.snapshot_id
    assert without_restore_manifest(tree(root, DEST)) == expected
    assert snapshot.get(root, WB, "name").snapshot_id != first.snapshot_id


def test_a_commit_lease_blocks_commit_retirement_while_the_restore_runs(bench):
    root = bench
    populate(root)
    made = commit.build(root, WB)
    commit.build(root, WB, parents=[])  # the head lets go of `made`
    op_id = restore.prepare(root, request_for(root, ("commit", made.commit_id)))
    assert len(lease_consumers(root, made.commit_id)) == 1
    with pytest.raises(commit.CommitInUse):
        commit.retire(root, made.commit_id)
    restore.resume(root, op_id)
    commit.retire(root, made.commit_id)
    assert tree(root, DEST)["outputs/x"] == b"x"  # the copy keeps its own references


def test_final_publication_wins_over_a_later_ready_abort(bench):
    root = bench
    populate(root)
    op_id = restore.prepare(root, request_for(root, ("commit", commit.build(root, WB).commit_id)))
    while restore.operation(root, op_id).phase != RestorePhase.Ready:
        restore.advance(root, op_id)
    restore.advance(root, op_id)
    assert restore.abort(root, op_id, reason="too late") == RestorePhase.Complete
    assert wb.get(root, DEST).state == WorkspaceState.Visible


def test_a_ready_abort_wins_over_a_later_final_publication(bench, monkeypatch):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB)
    op_id = restore.prepare(root, request_for(root, ("snapshot", snap.snapshot_id)))
    while restore.operation(root, op_id).phase != RestorePhase.Ready:
        restore.advance(root, op_id)
    real = restore._complete

    def abort_first(root_, op_id_):
        restore.abort(root, op_id, reason="cleanup won")
        real(root_, op_id_)

    monkeypatch.setattr(restore, "_complete", abort_first)
    with pytest.raises(PredicateFailed):
        restore._complete(root, op_id)
    monkeypatch.undo()
    assert restore.operation(root, op_id).phase == RestorePhase.Cleaned
    assert workspace_row(root, DEST).state == WorkspaceState.Retired
    with pytest.raises(restore.RestoreAborted):
        restore.resume(root, op_id)


# --- crashes and cleanup ------------------------------------------------------------------------


def _fresh(tmp_path, name):
    from nokvfs.workspace import datadir

    path = str(tmp_path / name)
    datadir.init(path, block_size=BLOCK)
    holder = RootHolder(path)
    wb.create(holder.root, WB)
    populate(holder.root)
    return holder


def _every_kill_point(tmp_path, source_kind, then):
    k = 0
    while True:
        k += 1
        holder = _fresh(tmp_path, f"{source_kind}{k}")
        root = holder.root
        if source_kind == "snapshot":
            source = ("snapshot", snapshot.mint(root, WB).snapshot_id)
        else:
            source = ("commit", commit.build(root, WB).commit_id)
        expected = tree(root, WB) if source_kind == "snapshot" else None
        namespace.put(root, WB, "outputs/x", b"moved on")
        try:
            with killed_after(root, k):
                restore.restore(root, WB, source, DEST, batch=2)
        except Killed:
            then(root, source, expected)
            holder.close()
            continue
        holder.close()
        return k


def _op_of_destination(root):
    marker = workspace_row(root, DEST)
    return None if marker is None else marker.owning_operation.operation_id


@pytest.mark.parametrize("source_kind", ["snapshot", "commit"])
def test_a_restore_killed_after_any_command_resumes_to_the_same_destination(tmp_path, source_kind):
    def then(root, source, expected):
        op_id = _op_of_destination(root)
        assert op_id is not None  # the first command prepares
        if restore.operation(root, op_id).phase != RestorePhase.Complete:
            with pytest.raises(NotFound):
                wb.get(root, DEST)
        restore.recover(root)
        result = restore.restore(root, WB, source, DEST)  # an exact retry: the terminal result
        assert result.operation_id == op_id
        if expected is None:
            with root.read() as view:
                expected = {
                    p: reading.read(root, e, view=view) for p, e in asof.at_commit(view, root, source[1]).files()
                }
        assert_restored(root, result, expected)

    assert _every_kill_point(tmp_path, source_kind, then) > 6


@pytest.mark.parametrize("source_kind", ["snapshot", "commit"])
def test_a_restore_killed_after_any_command_is_cleaned_by_its_members(tmp_path, source_kind):
    def then(root, source, expected):
        op_id = _op_of_destination(root)
        op = restore.operation(root, op_id)
        phase = restore.abort(root, op_id, reason="test")
        if op.phase == RestorePhase.Complete:
            assert phase == RestorePhase.Complete
            return
        assert phase == RestorePhase.Cleaned
        inc = op.destination_workspace_incarnation_id
        assert staged_rows(root, inc) == [] and path_refs_of(root, inc) == []
        assert workspace_row(root, DEST).state == WorkspaceState.Retired
        assert restore_hold(root, op_id) is None
        if source_kind == "commit":
            assert lease_consumers(root, source[1]) == []
        else:
            with root.read() as view:
                ref = SnapshotRef.decode(
                    view.get(
                        "snapshot_ref",
                        keys.SnapshotRefKey(root.root_id, op.source_workspace_incarnation_id, source[1]).encode(),
                    )
                )
            assert ref.consumer_count == 0
        for pub in publish_ops(root).values():
            assert pub.phase in publish.TERMINAL
        staged = revision(root, restore.manifest_revision_id(root.root_id, op_id, inc))
        assert staged is None or staged.strong_reference_count == 0
        assert fsck.check(root).findings == []
        # The name can be reclaimed: a new attempt gets a new incarnation.
        again = restore.restore(root, WB, source, DEST)
        assert again.operation_id != op_id and again.destination_incarnation != inc
        assert wb.get(root, DEST).incarnation_id == again.destination_incarnation

    _every_kill_point(tmp_path, source_kind, then)


def test_an_exact_retry_returns_the_terminal_result_and_another_source_is_refused(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB)
    result = restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)
    version = root.shard.commit_version
    assert restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST) == result
    assert root.shard.commit_version == version
    with pytest.raises(AlreadyExists):
        restore.restore(root, WB, ("snapshot", snapshot.mint(root, WB).snapshot_id), DEST)
    with pytest.raises(AlreadyExists):
        wb.create(root, DEST)


def test_verification_refuses_a_member_index_that_does_not_match_the_source(bench):
    root = bench
    populate(root)
    snap = snapshot.mint(root, WB)
    op_id = restore.prepare(root, request_for(root, ("snapshot", snap.snapshot_id)))
    while restore.operation(root, op_id).phase != RestorePhase.SourceSealed:
        restore.advance(root, op_id)
    key = keys.RestoreMemberKey(root.root_id, op_id, 2).encode()
    with root.read() as view:
        member = RestoreMember.decode(view.get("restore_member", key))

    def tamper(view):
        return Built(mutations=[Put("restore_member", key, dataclasses.replace(member, row_digest=bytes(32)))])

    root.apply(tamper, digest=intent_digest("test.tamper", os.urandom(16)))
    with pytest.raises(IntegrityError):
        restore.resume(root, op_id)
    op = restore.operation(root, op_id)
    assert op.phase == RestorePhase.Cleaned
    assert staged_rows(root, op.destination_workspace_incarnation_id) == []


def _restore_worker(data_dir: str, crash_at: str, snapshot_id: int) -> None:
    from nokvfs.workspace import datadir

    root = datadir.open_root(data_dir)
    os.environ[publish.CRASH_ENV] = crash_at
    try:
        restore.restore(root, WB, ("snapshot", snapshot_id), DEST, batch=1)
    except Exception:
        os._exit(3)
    os._exit(0)


@pytest.mark.parametrize(
    "crash_at", ["staged-after-begin", "restore-before-complete-command", "restore-after-complete-command"]
)
def test_sigkill_then_recovery_finishes_the_restore(data_dir, crash_at):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    populate(holder.root)
    snap = snapshot.mint(holder.root, WB)
    expected = tree(holder.root, WB)
    holder.close()
    assert run_crash_child(_restore_worker, data_dir, crash_at, snap.snapshot_id) == KILLED
    holder = RootHolder(data_dir, recover=False)  # look before any recovery runs
    try:
        root = holder.root
        if crash_at != "restore-after-complete-command":
            with pytest.raises(NotFound):
                wb.get(root, DEST)
        root = holder.reopen(recover=True)  # open_root finishes the dead restore
        wb.get(root, DEST)
        result = restore.restore(root, WB, ("snapshot", snap.snapshot_id), DEST)
        assert_restored(root, result, expected)
    finally:
        holder.close()
