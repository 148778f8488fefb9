"""BuildCommit, commit consumers, retirement and lookup (seed "Commit Closure"):

    Building -> Sealing -> Complete
    Building -> Aborting -> Cleaning -> Cleaned | Quarantined
    Sealing  -> Aborting   (only with fenced proof that no Commit/head/dedupe exists)

A commit freezes the workbench at a read version, stages its canonical run manifest without a
PathCurrent, seals member/revision/parent closures recomputed from their rows, and publishes
head, path, commit and consumers in one command. A process killed after any command resumes or
cleans; an exact retry returns the original result after later commits; retirement releases
exactly the unique revision set in bounded batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct

import pytest

from nokvfs.errors import (
    AlreadyExists,
    GenerationConflict,
    IntegrityError,
    NotFound,
    PredicateFailed,
    RequestMismatch,
    ReservedPath,
)
from nokvfs.schema import canonical_json, keys
from nokvfs.schema.enums import (
    BuildCommitPhase,
    ChangeEventKind,
    CommitConsumerKind,
    CommitRetirePhase,
    CommitState,
    HistoryHoldKind,
    OperationKind,
    PublishPhase,
    ReferenceKind,
    RevisionState,
)
from nokvfs.schema.records import (
    Commit,
    CommitConsumer,
    CommitMember,
    WorkbenchCommitHead,
)
from nokvfs.workspace import (
    asof,
    changes,
    commit,
    fsck,
    gc,
    listing,
    namespace,
    publish,
    reading,
    tag,
)
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.commit import build_commit
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    BLOCK,
    KILLED,
    WB,
    RootHolder,
    all_rows,
    bench_fixture,
    body,
    data_dir_fixture,
    entry,
    get_bytes,
    publish_ops,
    refs_owned_by,
    revision,
    root_fixture,
    run_crash_child,
)
from tests.workspace_helpers import Killed, files_of, killed_after, put_all

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
FILES = {
    "input/data.csv": body(2 * BLOCK + 3, "data"),
    "outputs/model.bin": body(BLOCK + 1, "model"),
    "outputs/model.bin.sum": b"checksum",
    "logs/run.log": b"started\nfinished\n",
    "scripts/train.py": b"print('train')\n",
}


# --- helpers ------------------------------------------------------------------------------------


def populate(root, files=FILES):
    put_all(root, WB, files)


def live_files(root, workbench_id=WB) -> dict[str, bytes]:
    return files_of(root, workbench_id)


def commit_files(root, commit_id) -> dict[str, bytes]:
    with root.read() as view:
        tree = asof.at_commit(view, root, commit_id)
        return {path: reading.read(root, e, view=view) for path, e in tree.files()}


def commit_row(root, commit_id) -> Commit | None:
    with root.read() as view:
        raw = view.get("commit", keys.CommitKey(root.root_id, commit_id).encode())
    return None if raw is None else Commit.decode(raw)


def head_row(root, workbench_id=WB) -> WorkbenchCommitHead | None:
    return commit.head(root, workbench_id)


def consumers_of(root, commit_id) -> dict[tuple, CommitConsumer]:
    return {
        (k.consumer_kind, k.consumer_owner_id): CommitConsumer.decode(v)
        for k, v in (
            (keys.CommitConsumerKey.decode(k), v)
            for k, v in all_rows(root, "commit_consumer", keys.commit_consumer_prefix(root.root_id, commit_id))
        )
    }


def build_hold(root, op_id):
    with root.read() as view:
        return view.get("history_hold", keys.HistoryHoldKey(root.root_id, HistoryHoldKind.BuildCommit, op_id).encode())


def incarnation(root, workbench_id=WB) -> bytes:
    return wb.get(root, workbench_id).incarnation_id


def staged_attempts(root, op_id):
    return build_commit.attempts_of(op_id).made(root)


def recompute_seals(root, commit_id, parents):
    """The seed's closure digests, recomputed here from the rows (independently of the module)."""
    digest, count, revisions = bytes(32), 0, set()
    for key, value in all_rows(root, "commit_member", keys.commit_member_prefix(root.root_id, commit_id)):
        path = "/".join(keys.CommitMemberKey.decode(key).path).encode()
        digest = hashlib.sha256(b"nokv.commit.member.v1\0" + digest + U32.pack(len(path)) + path + value).digest()
        count += 1
        revisions.add(CommitMember.decode(value).artifact_revision_id)
    refs = [k.artifact_revision_id for k in refs_owned_by(root, ReferenceKind.Commit, commit_id)]
    assert set(refs) == revisions and len(refs) == len(revisions)
    revision_digest = hashlib.sha256(b"nokv.commit.revisions.v1\0" + b"".join(sorted(refs))).digest()
    parent_digest = hashlib.sha256(b"nokv.commit.parents.v1\0" + b"".join(parents)).digest()
    return count, digest, len(refs), revision_digest, parent_digest


def assert_sealed_commit(root, result, files, *, parents=()):
    """The complete terminal state of a successful build."""
    op_id = result.operation_id
    op = commit.operation(root, op_id)
    assert op.phase == BuildCommitPhase.Complete
    sealed = commit_row(root, result.commit_id)
    assert sealed.state == CommitState.Sealed and tuple(sealed.parents) == tuple(parents)
    count, digest, unique, revision_digest, parent_digest = recompute_seals(root, result.commit_id, tuple(parents))
    assert (sealed.member_count, sealed.member_digest) == (count, digest)
    assert (sealed.unique_revision_count, sealed.revision_digest) == (unique, revision_digest)
    assert (sealed.parent_count, sealed.parent_digest) == (len(parents), parent_digest)
    assert sealed.tree_digest_uri == "sha256:" + digest.hex() == result.tree_digest_uri
    assert head_row(root).commit_id == result.commit_id
    manifest = get_bytes(root, commit.RUN_MANIFEST_PATH)
    assert canonical_json.loads(manifest)["commit_id"] == result.hex
    assert entry(root, commit.RUN_MANIFEST_PATH).artifact_revision_id == op.run_manifest.artifact_revision_id
    got = commit_files(root, result.commit_id)
    assert got == {**files, commit.RUN_MANIFEST_PATH: manifest}
    assert build_hold(root, op_id) is None
    phases = [pub.phase for _, pub in staged_attempts(root, op_id)]
    assert phases.count(PublishPhase.Published) == 1 and set(phases) <= {PublishPhase.Published, PublishPhase.Cleaned}
    assert not [p for p in publish_ops(root).values() if p.phase not in publish.TERMINAL]
    assert fsck.check(root).findings == []


# --- the closure --------------------------------------------------------------------------------


def test_a_commit_freezes_the_tree_seals_it_and_moves_the_head_in_one_final_command(bench):
    root = bench
    populate(root)
    revision_before = wb.get(root, WB).revision
    result = commit.build(root, WB, producer="agent-7", lineage="run-42", batch=2)
    assert_sealed_commit(root, result, FILES)
    assert (result.head_generation, result.run_manifest_generation, result.member_count) == (1, 1, len(FILES) + 1)
    assert result.unique_revision_count == len(FILES) + 1
    sealed = commit_row(root, result.commit_id)
    assert (sealed.consumer_count, sealed.consumer_epoch) == (1, 1)  # the head
    assert list(consumers_of(root, result.commit_id)) == [(CommitConsumerKind.WorkbenchHead, incarnation(root))]
    assert wb.get(root, WB).revision == revision_before + 1
    assert sealed.created_version == result.commit_version
    # Exactly one event, in the final command.
    feed = changes.read_changes(root, workbench_id=WB, after_commit_version=result.commit_version - 1).changes
    assert [(c.kind, c.path, c.after) for c in feed] == [
        (ChangeEventKind.CommitPublished, commit.RUN_MANIFEST_PATH, result.commit_id)
    ]


def test_the_run_manifest_and_identities_follow_the_contract(bench):
    root = bench
    populate(root)
    request_id = os.urandom(16)
    result = commit.build(root, WB, producer="p", lineage="l", request_id=request_id, committed_at=1_700_000_000)
    op = commit.operation(root, result.operation_id)
    assert (
        result.operation_id
        == hashlib.sha256(b"nokv.build-commit.operation.v1\0" + root.root_id + request_id).digest()[:16]
    )
    inc = incarnation(root)
    expected_id = hashlib.sha256(
        b"nokv.commit.identity.v1\0"
        + root.root_id
        + inc
        + U64.pack(op.read_version)
        + U64.pack(1_700_000_000)
        + request_id
        + U32.pack(0)
    ).digest()
    assert result.commit_id == expected_id
    manifest = canonical_json.loads(get_bytes(root, commit.RUN_MANIFEST_PATH))
    assert manifest == {
        "schema": "nokv.workbench.run_manifest.v1",
        "workbench_id": WB,
        "commit_id": expected_id.hex(),
        "parents": [],
        "producer": "p",
        "lineage": "l",
        "source_read_version": op.read_version,
        "workspace_revision": op.tree_revision,
        "committed_at_unix_seconds": 1_700_000_000,
    }
    canonical = canonical_json.dumps({k: v for k, v in manifest.items() if k != "committed_at_unix_seconds"})
    uri = "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert op.content_digest_uri == op.manifest_digest_uri == uri

    def l64(b):
        return U64.pack(len(b)) + b

    projection = hashlib.sha256(
        b"nokv.workbench.run_manifest.projection_input.v1\0"
        + l64(WB.encode())
        + l64(b"metadata/run_manifest.json")
        + l64(uri.encode())
        + l64(canonical)
        + l64(uri.encode())
        + expected_id
    ).digest()
    assert op.projection_input_digest == projection == commit_row(root, result.commit_id).projection_input_digest
    assert op.initialization_digest == commit.FrozenRequest.from_op(op).initialization_digest(expected_id)


def test_writes_after_the_freeze_are_not_in_the_commit(bench):
    root = bench
    populate(root)
    op_id = commit.begin(root, commit.CommitRequest(WB, os.urandom(16)))
    namespace.put(root, WB, "outputs/late.bin", b"late")
    namespace.remove(root, WB, "logs/run.log")
    namespace.put(root, WB, "scripts/train.py", b"changed after the freeze")
    result = commit.resume(root, op_id, batch=2)
    manifest = get_bytes(root, commit.RUN_MANIFEST_PATH)
    assert commit_files(root, result.commit_id) == {**FILES, commit.RUN_MANIFEST_PATH: manifest}
    assert "outputs/late.bin" in live_files(root)


def test_nothing_is_visible_before_the_final_command(bench):
    root = bench
    populate(root)
    op_id = commit.begin(root, commit.CommitRequest(WB, os.urandom(16)))
    op = commit.operation(root, op_id)
    version = root.shard.commit_version
    while commit.operation(root, op_id).phase != BuildCommitPhase.Sealing:
        commit.advance(root, op_id, batch=2)
        assert head_row(root) is None
        assert entry(root, commit.RUN_MANIFEST_PATH) is None  # CommitStaging: no PathCurrent
        assert commit_row(root, op.commit_id) is None
        assert build_hold(root, op_id) is not None
        assert changes.read_changes(root, workbench_id=WB, after_commit_version=version).changes == ()
        assert fsck.check(root).findings == []  # staged revisions are consistently referenced
    binding = commit.operation(root, op_id).run_manifest
    staged = revision(root, binding.artifact_revision_id)
    assert staged.state == RevisionState.Available and staged.strong_reference_count == 1
    assert binding.artifact_revision_id in {
        r.artifact_revision_id for r in refs_owned_by(root, ReferenceKind.Commit, op.commit_id)
    }
    commit.advance(root, op_id)
    assert head_row(root).commit_id == op.commit_id


def test_the_second_commit_names_the_first_as_parent_and_consumers_follow(bench):
    root = bench
    populate(root)
    first = commit.build(root, WB)
    namespace.put(root, WB, "outputs/model.bin", b"v2")
    second = commit.build(root, WB)
    assert second.parents == (first.commit_id,) and second.head_generation == 2
    assert second.run_manifest_generation == 2
    inc = incarnation(root)
    assert set(consumers_of(root, first.commit_id)) == {(CommitConsumerKind.ChildCommit, second.commit_id)}
    assert set(consumers_of(root, second.commit_id)) == {(CommitConsumerKind.WorkbenchHead, inc)}
    one = commit_row(root, first.commit_id)
    # head added (1), child added (2), head removed (3)
    assert (one.consumer_count, one.consumer_epoch, one.last_zero_consumer_version) == (1, 3, 0)
    assert_sealed_commit(root, second, {**FILES, "outputs/model.bin": b"v2"}, parents=(first.commit_id,))
    # The replaced run manifest revision is still held by the first commit.
    first_manifest = commit.operation(root, first.operation_id).run_manifest.artifact_revision_id
    assert revision(root, first_manifest).strong_reference_count == 1
    assert commit_files(root, first.commit_id)["outputs/model.bin"] == FILES["outputs/model.bin"]


def test_exact_replay_after_a_later_commit_returns_the_original_result(bench):
    root = bench
    populate(root)
    request_id = os.urandom(16)
    original = commit.build(root, WB, producer="p", request_id=request_id)
    later = commit.build(root, WB)
    version = root.shard.commit_version
    again = commit.build(root, WB, producer="p", request_id=request_id)
    assert again == original
    assert root.shard.commit_version == version  # replay wrote nothing
    assert head_row(root).commit_id == later.commit_id


def test_a_request_id_reused_for_another_commit_is_a_mismatch(bench):
    root = bench
    populate(root)
    commit.build(root, WB)
    request_id = os.urandom(16)
    commit.build(root, WB, producer="p", request_id=request_id)  # parents: the head
    with pytest.raises(RequestMismatch):
        commit.build(root, WB, producer="other", request_id=request_id)
    with pytest.raises(RequestMismatch):
        commit.build(root, WB, producer="p", parents=[], request_id=request_id)
    with pytest.raises(RequestMismatch):
        commit.build(root, "other-bench", producer="p", request_id=request_id)


def test_the_run_manifest_accepts_no_generic_writes_and_replace_false_refuses_it(bench):
    root = bench
    populate(root)
    with pytest.raises(ReservedPath):
        namespace.put(root, WB, commit.RUN_MANIFEST_PATH, b"{}")
    commit.build(root, WB, replace=False)
    with pytest.raises(ReservedPath):
        namespace.remove(root, WB, commit.RUN_MANIFEST_PATH)
    with pytest.raises(AlreadyExists):
        commit.build(root, WB, replace=False)
    assert len(commit.log(root, WB)) == 1


def test_an_explicit_expected_head_that_moved_is_a_conflict(bench):
    root = bench
    populate(root)
    first = commit.build(root, WB)
    with pytest.raises(GenerationConflict):
        commit.build(root, WB, expected_head=None)
    second = commit.build(root, WB, expected_head=first.commit_id)
    assert second.parents == (first.commit_id,)


# --- crashes ------------------------------------------------------------------------------------


def _fresh(tmp_path, name):
    from nokvfs.workspace import datadir

    path = str(tmp_path / name)
    datadir.init(path, block_size=BLOCK)
    holder = RootHolder(path)
    wb.create(holder.root, WB)
    populate(holder.root)
    return holder


def _every_kill_point(tmp_path, then):
    """Run a build killed after its k-th command, for every k, and hand the wreck to `then`."""
    k = 0
    while True:
        k += 1
        holder = _fresh(tmp_path, f"k{k}")
        root = holder.root
        parent = commit.build(root, WB)  # so the build under test has a parent consumer
        request = commit.CommitRequest(WB, os.urandom(16), producer="crash")
        try:
            with killed_after(root, k):
                commit.build(root, WB, producer="crash", request_id=request.request_id, batch=2)
        except Killed:
            then(root, request, parent)
            holder.close()
            continue
        holder.close()
        return k  # the build finished before its k-th command: every point was covered


def test_a_build_killed_after_any_command_resumes_to_the_same_commit(tmp_path):
    def then(root, request, parent):
        op_id = commit.operation_id(root.root_id, request.request_id)
        with root.read() as view:
            started = (
                view.get("operation", keys.OperationKey(root.root_id, OperationKind.BuildCommit, op_id).encode())
                is not None
            )
        if not started:
            assert head_row(root).commit_id == parent.commit_id
            return
        already = commit.operation(root, op_id).phase == BuildCommitPhase.Complete
        assert dict(commit.recover(root)) == ({} if already else {op_id.hex(): "complete"})
        result = commit.build(root, WB, producer="crash", request_id=request.request_id)  # exact retry
        assert_sealed_commit(root, result, FILES, parents=(parent.commit_id,))
        assert set(consumers_of(root, parent.commit_id)) == {(CommitConsumerKind.ChildCommit, result.commit_id)}

    assert _every_kill_point(tmp_path, then) > 10


def test_a_build_killed_after_any_command_can_be_aborted_and_leaves_nothing(tmp_path):
    def then(root, request, parent):
        op_id = commit.operation_id(root.root_id, request.request_id)
        with root.read() as view:
            if (
                view.get("operation", keys.OperationKey(root.root_id, OperationKind.BuildCommit, op_id).encode())
                is None
            ):
                return
        op = commit.operation(root, op_id)
        phase = commit.abort(root, op_id, reason="test")
        if phase == BuildCommitPhase.Complete:
            assert op.phase in (BuildCommitPhase.Sealing, BuildCommitPhase.Complete)
            assert head_row(root).commit_id == op.commit_id
            return
        assert phase == BuildCommitPhase.Cleaned
        assert all_rows(root, "commit_member", keys.commit_member_prefix(root.root_id, op.commit_id)) == []
        assert refs_owned_by(root, ReferenceKind.Commit, op.commit_id) == []
        assert set(consumers_of(root, parent.commit_id)) == {(CommitConsumerKind.WorkbenchHead, incarnation(root))}
        assert build_hold(root, op_id) is None and commit_row(root, op.commit_id) is None
        assert head_row(root).commit_id == parent.commit_id
        for _, pub in staged_attempts(root, op_id):
            assert pub.phase in (PublishPhase.Cleaned, PublishPhase.Published)
            if pub.phase == PublishPhase.Published:  # staged, then released: only GC holds it now
                assert revision(root, pub.artifact_revision_id).strong_reference_count == 0
        assert not [p for p in publish_ops(root).values() if p.phase not in publish.TERMINAL]
        assert fsck.check(root).findings == []
        with pytest.raises(commit.CommitAborted):
            commit.build(root, WB, producer="crash", request_id=request.request_id)

    _every_kill_point(tmp_path, then)


def _build_worker(data_dir: str, crash_at: str, request_id: bytes) -> None:
    from nokvfs.workspace import datadir

    root = datadir.open_root(data_dir)
    os.environ[publish.CRASH_ENV] = crash_at
    try:
        commit.build(root, WB, request_id=request_id, batch=1)
    except Exception:
        os._exit(3)
    os._exit(0)


@pytest.mark.parametrize(
    "crash_at",
    [
        "staged-after-begin",
        "commit-after-stage",
        "commit-after-members",
        "commit-after-seal",
        "commit-before-publish-command",
        "commit-after-publish-command",
    ],
)
def test_sigkill_at_a_stage_boundary_then_recovery_completes_the_commit(data_dir, crash_at):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    populate(holder.root)
    holder.close()
    request_id = os.urandom(16)
    assert run_crash_child(_build_worker, data_dir, crash_at, request_id) == KILLED
    holder = RootHolder(data_dir, recover=False)  # look before any recovery runs
    try:
        root = holder.root
        op_id = commit.operation_id(root.root_id, request_id)
        if crash_at != "commit-after-publish-command":
            assert head_row(root) is None and entry(root, commit.RUN_MANIFEST_PATH) is None
        root = holder.reopen(recover=True)  # open_root resumes the dead build
        assert head_row(root) is not None
        result = commit.build(root, WB, request_id=request_id)
        assert result.operation_id == op_id
        assert_sealed_commit(root, result, FILES)
    finally:
        holder.close()


def test_generic_recovery_never_publishes_a_staged_run_manifest(data_dir):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    populate(holder.root)
    holder.close()
    request_id = os.urandom(16)
    assert run_crash_child(_build_worker, data_dir, "staged-after-finalize", request_id) == KILLED
    holder = RootHolder(data_dir, recover=False)
    try:
        root = holder.root
        assert entry(root, commit.RUN_MANIFEST_PATH) is None
        # Generic publish recovery leaves the staged manifest to the commit machine.
        from nokvfs.workspace import publish

        publish.recover(root)
        assert entry(root, commit.RUN_MANIFEST_PATH) is None
        commit.recover(root)
        assert_sealed_commit(root, commit.build(root, WB, request_id=request_id), FILES)
    finally:
        holder.close()


# --- races --------------------------------------------------------------------------------------


def _built_to_sealing_point(root):
    op_id = commit.begin(root, commit.CommitRequest(WB, os.urandom(16)))
    while True:
        op = commit.operation(root, op_id)
        if op.run_manifest is not None and EOF_all(op):
            return op_id
        commit.advance(root, op_id)


def EOF_all(op):
    return op.member_cursor == op.revision_cursor == op.parent_cursor == commit.EOF


def test_seal_loses_to_an_abort_that_won_the_phase_cas(bench, monkeypatch):
    root = bench
    populate(root)
    op_id = _built_to_sealing_point(root)
    real = build_commit.verify_closure

    def verify_then_abort(*args):
        real(*args)
        commit.abort(root, op_id, reason="cleanup won")  # between verification and the seal CAS

    monkeypatch.setattr(build_commit, "verify_closure", verify_then_abort)
    with pytest.raises(PredicateFailed):
        build_commit._seal(root, op_id)
    monkeypatch.undo()
    op = commit.operation(root, op_id)
    assert op.phase == BuildCommitPhase.Cleaned and commit_row(root, op.commit_id) is None
    with pytest.raises(commit.CommitAborted):
        commit.resume(root, op_id)


def test_abort_loses_to_a_publication_that_won_the_phase_cas(bench):
    root = bench
    populate(root)
    op_id = _built_to_sealing_point(root)
    commit.advance(root, op_id)  # seal
    commit.advance(root, op_id)  # publish
    assert commit.abort(root, op_id, reason="too late") == BuildCommitPhase.Complete
    op = commit.operation(root, op_id)
    assert commit_row(root, op.commit_id).state == CommitState.Sealed
    assert len(refs_owned_by(root, ReferenceKind.Commit, op.commit_id)) == op.unique_revision_count


def test_a_sealing_build_is_taken_over_only_while_no_commit_exists(bench):
    root = bench
    populate(root)
    op_id = _built_to_sealing_point(root)
    commit.advance(root, op_id)
    assert commit.operation(root, op_id).phase == BuildCommitPhase.Sealing
    assert commit.abort(root, op_id, reason="owner lost") == BuildCommitPhase.Cleaned
    assert head_row(root) is None and entry(root, commit.RUN_MANIFEST_PATH) is None


def test_of_two_concurrent_commits_exactly_one_moves_the_head(bench):
    root = bench
    populate(root)
    first = commit.begin(root, commit.CommitRequest(WB, os.urandom(16)))
    second = commit.begin(root, commit.CommitRequest(WB, os.urandom(16)))
    winner = commit.resume(root, first)
    with pytest.raises(GenerationConflict):
        commit.resume(root, second)
    loser = commit.operation(root, second)
    assert loser.phase == BuildCommitPhase.Cleaned and commit_row(root, loser.commit_id) is None
    assert head_row(root).commit_id == winner.commit_id and head_row(root).head_generation == 1
    assert refs_owned_by(root, ReferenceKind.Commit, loser.commit_id) == []
    assert canonical_json.loads(get_bytes(root, commit.RUN_MANIFEST_PATH))["commit_id"] == winner.hex


def test_a_parent_retired_before_the_child_attaches_aborts_the_child(bench):
    root = bench
    populate(root)
    orphan = commit.build(root, WB)
    commit.build(root, WB, parents=[])  # the head moves: `orphan` has no consumer left
    child = commit.begin(root, commit.CommitRequest(WB, os.urandom(16), parents=(orphan.commit_id,)))
    commit.retire(root, orphan.commit_id)
    with pytest.raises(PredicateFailed):
        commit.resume(root, child)
    assert commit.operation(root, child).phase == BuildCommitPhase.Cleaned


# --- retirement ---------------------------------------------------------------------------------


def test_retirement_needs_zero_consumers_and_loses_to_a_tag_attach(bench, monkeypatch):
    root = bench
    populate(root)
    first = commit.build(root, WB)
    with pytest.raises(commit.CommitInUse):
        commit.retire(root, first.commit_id)  # the head consumes it
    commit.build(root, WB, parents=[])
    epoch = commit_row(root, first.commit_id).consumer_epoch
    tag.set(root, WB, "keep", first.commit_id)  # attaches between observation and the CAS
    with pytest.raises(PredicateFailed):
        commit.retire(root, first.commit_id, expected_epoch=epoch)
    assert commit_row(root, first.commit_id).state == CommitState.Sealed
    tag.delete(root, WB, "keep")
    commit.retire(root, first.commit_id)
    assert commit_row(root, first.commit_id).state == CommitState.Retired


def test_a_consumer_cannot_attach_once_retirement_claimed_the_commit(bench):
    root = bench
    populate(root)
    first = commit.build(root, WB)
    commit.build(root, WB, parents=[])
    commit.claim_retirement(root, first.commit_id)
    assert commit_row(root, first.commit_id).state == CommitState.Retiring
    with pytest.raises(PredicateFailed):
        tag.set(root, WB, "late", first.commit_id)
    with pytest.raises(PredicateFailed):
        commit.build(root, WB, parents=[first.commit_id])
    assert commit.retire(root, first.commit_id).phase == CommitRetirePhase.Complete


def test_retirement_releases_exactly_the_unique_revisions_in_batches_then_gc_frees_them(bench):
    root = bench
    populate(root)
    namespace.put(root, WB, "outputs/copy.bin", FILES["outputs/model.bin"])
    namespace.rename(root, WB, "outputs/copy.bin", "outputs/same-revision.bin")
    first = commit.build(root, WB)
    first_op = commit.operation(root, first.operation_id)
    only_commit = {}
    for path in ("input/data.csv", "logs/run.log"):  # replaced: only the commit holds the old ones
        only_commit[path] = entry(root, path).artifact_revision_id
        namespace.put(root, WB, path, b"new " + path.encode())
    second = commit.build(root, WB, parents=[])  # releases `first` from the head
    held_by_second = {r.artifact_revision_id for r in refs_owned_by(root, ReferenceKind.Commit, second.commit_id)}
    unique = {r.artifact_revision_id for r in refs_owned_by(root, ReferenceKind.Commit, first.commit_id)}
    assert len(unique) == first.unique_revision_count
    counts = {rev: revision(root, rev).strong_reference_count for rev in unique}
    done = commit.retire(root, first.commit_id, batch=2)
    assert (done.released_member_count, done.released_revision_count, done.released_parent_count) == (
        first.member_count,
        first.unique_revision_count,
        0,
    )
    assert refs_owned_by(root, ReferenceKind.Commit, first.commit_id) == []
    assert all_rows(root, "commit_member", keys.commit_member_prefix(root.root_id, first.commit_id)) == []
    for rev in unique:
        assert revision(root, rev).strong_reference_count == counts[rev] - 1
    retired = commit_row(root, first.commit_id)
    assert retired.state == CommitState.Retired and retired.retirement_cursor == commit.EOF
    report = gc.collect(root)
    freed = {bytes.fromhex(h) for h in report.freed}
    assert freed == set(only_commit.values()) | {first_op.run_manifest.artifact_revision_id}
    assert live_files(root)["outputs/same-revision.bin"] == FILES["outputs/model.bin"]
    assert set(commit_files(root, second.commit_id)) >= set(FILES)
    assert held_by_second.isdisjoint(freed)


def test_a_retirement_killed_after_any_command_resumes_from_its_cursor(tmp_path):
    k = 0
    while True:
        k += 1
        holder = _fresh(tmp_path, f"r{k}")
        root = holder.root
        first = commit.build(root, WB)
        second = commit.build(root, WB)  # first is second's parent: retire second's parent link
        commit.build(root, WB, parents=[])
        unique = {
            r.artifact_revision_id: revision(root, r.artifact_revision_id).strong_reference_count
            for r in refs_owned_by(root, ReferenceKind.Commit, second.commit_id)
        }
        try:
            with killed_after(root, k):
                commit.retire(root, second.commit_id, batch=2)
        except Killed:
            commit.recover(root)
            done = commit.retire(root, second.commit_id)
            assert done.phase == CommitRetirePhase.Complete
            assert done.released_revision_count == len(unique) and done.released_parent_count == 1
            for rev, count in unique.items():
                assert revision(root, rev).strong_reference_count == count - 1
            assert consumers_of(root, first.commit_id) == {}
            assert commit_row(root, first.commit_id).last_zero_consumer_version > 0
            holder.close()
            continue
        holder.close()
        break
    assert k > 5


# --- lookup -------------------------------------------------------------------------------------


def test_a_unique_prefix_resolves_and_an_ambiguous_one_lists_every_match(bench):
    root = bench
    namespace.put(root, WB, "outputs/a", b"a")
    made = [commit.build(root, WB, parents=[]).commit_id for _ in range(17)]  # 17 ids, 16 first digits
    by_digit = {}
    for commit_id in made:
        by_digit.setdefault(commit_id.hex()[0], []).append(commit_id.hex())
    digit, shared = next((d, ids) for d, ids in by_digit.items() if len(ids) > 1)
    with pytest.raises(commit.AmbiguousReference) as err:
        commit.resolve(root, WB, digit)
    assert sorted(err.value.matches) == sorted(shared)
    for hexid in shared:
        assert hexid in str(err.value)
    assert commit.resolve(root, WB, shared[0][:20]) == bytes.fromhex(shared[0])
    assert commit.resolve(root, WB, shared[0]) == bytes.fromhex(shared[0])
    missing = next(c for c in "0123456789abcdef" if c not in by_digit) if len(by_digit) < 16 else None
    if missing:
        with pytest.raises(NotFound):
            commit.resolve(root, WB, missing)


def test_the_log_is_the_head_and_its_first_parents(bench):
    root = bench
    namespace.put(root, WB, "outputs/a", b"a")
    a = commit.build(root, WB)
    b = commit.build(root, WB)
    c = commit.build(root, WB, parents=[b.commit_id, a.commit_id])
    assert [info.commit_id for info in commit.log(root, WB)] == [c.commit_id, b.commit_id, a.commit_id]
    assert commit.log(root, WB, limit=2)[1].parents == (a.commit_id,)


def test_a_commit_tree_serves_its_members_as_path_entries_after_the_live_tree_moved(bench):
    root = bench
    populate(root)
    result = commit.build(root, WB)
    namespace.remove(root, WB, "outputs/model.bin")
    namespace.put(root, WB, "outputs/new", b"new")
    with root.read() as view:
        tree = asof.at_commit(view, root, result.commit_id)
        found = tree.stat(("outputs", "model.bin"))
        assert found.kind == listing.FILE and reading.read(root, found.entry, view=view) == FILES["outputs/model.bin"]
        assert found.entry.created_version == commit_row(root, result.commit_id).created_version
        assert tree.stat(("outputs",)).kind == listing.DIRECTORY
        assert tree.stat(()).kind == listing.DIRECTORY
        names, _ = tree.children_page(("outputs",))
        assert [(c.name, c.kind) for c in names] == [("model.bin", listing.FILE), ("model.bin.sum", listing.FILE)]
        sections, _ = tree.children_page(())
        assert sorted(c.name for c in sections) == sorted(wb.SECTIONS)
        with pytest.raises(NotFound):
            tree.stat(("outputs", "new"))
        page, marker = commit.members(view, root, result.commit_id, limit=2)
        assert [p for p, _ in page] == ["input/data.csv", "logs/run.log"] and marker is not None


# --- seals --------------------------------------------------------------------------------------


def _tamper(root, *mutations):
    from nokvfs.workspace.root import Built, intent_digest

    root.apply(lambda view: Built(mutations=list(mutations)), digest=intent_digest("test.tamper", os.urandom(16)))


@pytest.mark.parametrize("broken", ["member", "revision-ref", "parent-consumer"])
@pytest.mark.damages_store("injects closure rows that break counts")
def test_a_closure_row_that_does_not_match_its_seal_refuses_the_seal(bench, broken):
    from nokvfs.engine.command import Delete, Put

    root = bench
    populate(root)
    parent = commit.build(root, WB)
    op_id = _built_to_sealing_point(root)
    op = commit.operation(root, op_id)
    if broken == "member":
        key = keys.CommitMemberKey(root.root_id, op.commit_id, ("logs", "run.log")).encode()
        with root.read() as view:
            member = CommitMember.decode(view.get("commit_member", key))
        _tamper(root, Put("commit_member", key, dataclasses.replace(member, logical_size=member.logical_size + 1)))
    elif broken == "revision-ref":
        ref = refs_owned_by(root, ReferenceKind.Commit, op.commit_id)[0]
        _tamper(root, Delete("revision_ref", ref.encode()))
    else:
        _tamper(
            root,
            Delete(
                "commit_consumer",
                keys.CommitConsumerKey(
                    root.root_id, parent.commit_id, CommitConsumerKind.ChildCommit, op.commit_id
                ).encode(),
            ),
        )
    with pytest.raises(IntegrityError):
        build_commit._seal(root, op_id)
    assert commit.operation(root, op_id).phase == BuildCommitPhase.Building
    with pytest.raises(IntegrityError):
        commit.resume(root, op_id)  # a failed seal aborts and cleans the build
    assert commit.operation(root, op_id).phase == BuildCommitPhase.Cleaned
    assert head_row(root).commit_id == parent.commit_id


@pytest.mark.damages_store("tampers a member row: the retirement stays Quarantined")
def test_a_retirement_whose_rows_no_longer_match_the_seals_is_quarantined(bench):
    from nokvfs.engine.command import Put

    root = bench
    populate(root)
    first = commit.build(root, WB)
    commit.build(root, WB, parents=[])
    key = keys.CommitMemberKey(root.root_id, first.commit_id, ("outputs", "model.bin")).encode()
    with root.read() as view:
        member = CommitMember.decode(view.get("commit_member", key))
    _tamper(root, Put("commit_member", key, dataclasses.replace(member, producer="forged")))
    refs_before = len(refs_owned_by(root, ReferenceKind.Commit, first.commit_id))
    with pytest.raises(IntegrityError):
        commit.retire(root, first.commit_id)
    op = commit.retire_operation(root, commit.retire_operation_id(root.root_id, first.commit_id))
    assert op.phase == CommitRetirePhase.Quarantined and "member seal" in op.terminal_error
    assert commit_row(root, first.commit_id).state == CommitState.Retiring  # nothing released
    assert len(refs_owned_by(root, ReferenceKind.Commit, first.commit_id)) == refs_before
    # fsck reports the quarantined operation; gc does not touch it (metadata evidence).
    found = [f for f in fsck.check(root, verify_blocks=False).findings if f.code == "QUARANTINED"]
    assert [f.subject for f in found] == [
        f"commit retirement {commit.retire_operation_id(root.root_id, first.commit_id).hex()}"
    ]
    gc.collect(root)
    assert (
        commit.retire_operation(root, commit.retire_operation_id(root.root_id, first.commit_id)).phase
        == CommitRetirePhase.Quarantined
    )
