"""A publishing process killed by SIGKILL at every stage boundary.

The path is always at its old revision or its new one, never a partial body, both before and
after recovery; the next `datadir.open_root` (which runs publish.recover) resumes Finalizing to
Published, or takes Uploading through Aborting and Cleaning to Cleaned with every staged object
deleted from the store. Two processes replacing one generation have exactly one winner.
"""

from __future__ import annotations

import os

import pytest

from nokvfs.schema.enums import PublishPhase, ReferenceKind
from nokvfs.workspace import namespace, operations, publish
from nokvfs.workspace import workbench as wb
from tests.workspace_fixtures import (
    BLOCK,
    KILLED,
    SPAWN,
    WB,
    RootHolder,
    block_keys,
    body,
    crash_append_worker,
    crash_worker,
    data_dir_fixture,  # noqa: F401 - fixtures
    entry,
    get_bytes,
    ledger,
    local_object_path,
    manifest,
    present_keys,
    publish_ops,
    refs_to,
    replacer_worker,
    revision,
    run_crash_child,
)

PATH = "outputs/model.bin"
OLD = body(2 * BLOCK + 11, "old")
NEW = body(3 * BLOCK - 5, "new")  # three blocks: after-upload-0..2

UPLOADING = ["after-begin", "after-upload-0", "after-upload-1", "after-upload-2"]
FINALIZING = ["after-finalize", "before-publish-command"]
PUBLISHED = ["after-publish-command"]


def _prepare(data_dir, *, existing: bool):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    old = namespace.put(holder.root, WB, PATH, OLD) if existing else None
    before = set(publish_ops(holder.root))
    holder.close()
    return old, before


def _the_new_op(root, before):
    (op_id,) = set(publish_ops(root)) - before
    return op_id, publish_ops(root)[op_id]


def _bytes_are_old_or_new(root, old_entry):
    data = get_bytes(root, PATH)
    if old_entry is None:
        assert data in (None, NEW)
    else:
        assert data in (OLD, NEW)
    return data


@pytest.mark.parametrize("existing", [True, False], ids=["replace", "create"])
@pytest.mark.parametrize("crash_at", UPLOADING + FINALIZING + PUBLISHED)
def test_sigkill_at_each_stage_then_recovery(data_dir, crash_at, existing):
    old, before = _prepare(data_dir, existing=existing)
    assert run_crash_child(crash_worker, data_dir, PATH, NEW, None, crash_at) == KILLED

    # What the crash left, before anyone recovers it.
    holder = RootHolder(data_dir, recover=False)
    root = holder.root
    op_id, op = _the_new_op(root, before)
    keys_ = block_keys(root, op.artifact_revision_id, 3)
    data = _bytes_are_old_or_new(root, old)
    if crash_at in UPLOADING:
        assert op.phase == PublishPhase.Uploading
        uploaded = 0 if crash_at == "after-begin" else int(crash_at.rsplit("-", 1)[1]) + 1
        # Blocks go up to four at a time (publish.upload): the crash point after block i comes
        # once blocks 0..i are stored, and later ones may be stored too.
        present = present_keys(root.store, keys_)
        assert present[:uploaded] == keys_[:uploaded] and set(present) <= set(keys_)
        assert data == (OLD if existing else None)
        assert len(ledger(root, op_id)) == 3
    elif crash_at in FINALIZING:
        assert op.phase == PublishPhase.Finalizing
        assert present_keys(root.store, keys_) == keys_
        assert data == (OLD if existing else None)
    else:
        assert op.phase == PublishPhase.Published
        assert data == NEW
    holder.close()

    # The next open recovers.
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        op = publish_ops(root)[op_id]
        assert ledger(root, op_id) == []
        with root.read() as view:
            assert publish.pending(view, root) == []
        if crash_at in UPLOADING:
            assert op.phase == PublishPhase.Cleaned
            assert present_keys(root.store, keys_) == []
            assert revision(root, op.artifact_revision_id) is None
            assert get_bytes(root, PATH) == (OLD if existing else None)
            if existing:
                rev = revision(root, old.artifact_revision_id)
                assert (rev.strong_reference_count, rev.reference_epoch) == (1, 1)
        else:
            assert op.phase == PublishPhase.Published
            assert get_bytes(root, PATH) == NEW
            found = entry(root, PATH)
            assert found.artifact_revision_id == op.artifact_revision_id
            assert found.generation == (2 if existing else 1)
            assert present_keys(root.store, keys_) == keys_
            rev = revision(root, op.artifact_revision_id)
            assert (rev.strong_reference_count, rev.reference_epoch) == (1, 1) and len(
                refs_to(root, op.artifact_revision_id)
            ) == 1
            if existing:
                assert revision(root, old.artifact_revision_id).strong_reference_count == 0
        # Recovery is idempotent: a second open finds nothing to do.
        root = holder.reopen()
        assert publish.recover(root) == []
        assert publish_ops(root)[op_id].phase == op.phase
    finally:
        holder.close()


@pytest.mark.parametrize(
    "crash_at, phase", [("after-abort", PublishPhase.Aborting), ("after-cleaning", PublishPhase.Cleaning)]
)
def test_sigkill_during_cleanup_is_finished_by_recovery(data_dir, crash_at, phase):
    old, before = _prepare(data_dir, existing=True)
    # Expecting generation 5 of a generation-1 path: the final command loses and cleanup starts.
    assert run_crash_child(crash_worker, data_dir, PATH, NEW, 5, crash_at) == KILLED
    holder = RootHolder(data_dir, recover=False)
    op_id, op = _the_new_op(holder.root, before)
    keys_ = block_keys(holder.root, op.artifact_revision_id, 3)
    assert op.phase == phase
    assert present_keys(holder.root.store, keys_) == keys_  # nothing deleted yet
    assert get_bytes(holder.root, PATH) == OLD
    root = holder.reopen(recover=True)
    try:
        assert publish_ops(root)[op_id].phase == PublishPhase.Cleaned
        assert present_keys(root.store, keys_) == []
        assert ledger(root, op_id) == []
        assert get_bytes(root, PATH) == OLD
    finally:
        holder.close()


def test_finalizing_with_a_missing_object_is_taken_over_and_cleaned(data_dir):
    old, before = _prepare(data_dir, existing=True)
    assert run_crash_child(crash_worker, data_dir, PATH, NEW, None, "after-finalize") == KILLED
    holder = RootHolder(data_dir, recover=False)
    op_id, op = _the_new_op(holder.root, before)
    keys_ = block_keys(holder.root, op.artifact_revision_id, 3)
    holder.close()
    os.unlink(local_object_path(data_dir, keys_[1]))  # the store lost one uploaded object
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        op = publish_ops(root)[op_id]
        assert op.phase == PublishPhase.Cleaned
        assert "missing" in op.terminal_error
        assert present_keys(root.store, keys_) == []
        assert get_bytes(root, PATH) == OLD
    finally:
        holder.close()


def test_finalizing_whose_generation_moved_on_is_cleaned_not_published(data_dir):
    old, before = _prepare(data_dir, existing=True)
    assert run_crash_child(crash_worker, data_dir, PATH, NEW, 1, "after-finalize") == KILLED
    holder = RootHolder(data_dir, recover=False)
    op_id, op = _the_new_op(holder.root, before)
    newer = body(100, "meanwhile")
    namespace.put(holder.root, WB, PATH, newer, expected_generation=1)  # wins generation 1 -> 2
    root = holder.reopen(recover=True)
    try:
        op = publish_ops(root)[op_id]
        assert op.phase == PublishPhase.Cleaned
        assert present_keys(root.store, block_keys(root, op.artifact_revision_id, 3)) == []
        assert get_bytes(root, PATH) == newer
        assert entry(root, PATH).generation == 2
    finally:
        holder.close()


@pytest.mark.parametrize("crash_at, published", [("after-upload-0", False), ("after-finalize", True)])
def test_sigkill_during_append(data_dir, crash_at, published):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    base = namespace.put(holder.root, WB, PATH, OLD)
    before = set(publish_ops(holder.root))
    holder.close()
    delta = body(BLOCK + 3, "delta")
    assert run_crash_child(crash_append_worker, data_dir, PATH, delta, crash_at) == KILLED
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        op_id, op = _the_new_op(root, before)
        base_rev = revision(root, base.artifact_revision_id)
        if published:
            assert op.phase == PublishPhase.Published
            assert get_bytes(root, PATH) == OLD + delta
            assert entry(root, PATH).dependency_count == 1
            assert (base_rev.strong_reference_count, base_rev.reference_epoch) == (1, 3)
            ((ref_key, _),) = refs_to(root, base.artifact_revision_id)
            assert ref_key.reference_kind == ReferenceKind.RevisionDependency
            assert manifest(root, op.artifact_revision_id)[:3] == manifest(root, base.artifact_revision_id)
        else:
            assert op.phase == PublishPhase.Cleaned
            assert get_bytes(root, PATH) == OLD
            assert (base_rev.strong_reference_count, base_rev.reference_epoch) == (1, 1)
            assert present_keys(root.store, block_keys(root, op.artifact_revision_id, 2)) == []
            # The base's objects are the base's: cleanup of the append never touches them.
            assert len(present_keys(root.store, block_keys(root, base.artifact_revision_id, 3))) == 3
    finally:
        holder.close()


def test_recovery_leaves_an_operation_whose_owner_is_alive(data_dir):
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        wb.create(root, WB)
        from nokvfs.workspace import body as bodies

        b = bodies.from_bytes(NEW, BLOCK)
        pub = publish.Publication(WB, tuple(PATH.split("/")), b, b.size, b.digest_uri)
        lock = operations.OperationLock(root.run_dir, pub.operation_id)
        assert lock.try_acquire()
        publish.begin(root, pub)
        publish.upload(root, pub)
        assert publish.recover(root) == []  # the lock says a live process drives it
        assert publish_ops(root)[pub.operation_id].phase == PublishPhase.Uploading
        lock.release(remove=True)
        assert publish.recover(root) == [(pub.operation_id.hex(), "cleaned")]
        assert present_keys(root.store, block_keys(root, pub.revision_id, 3)) == []
    finally:
        holder.close()


# --- two processes --------------------------------------------------------------------------------


def test_two_processes_replacing_one_generation_have_exactly_one_winner(data_dir):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    namespace.put(holder.root, WB, PATH, OLD)
    before = set(publish_ops(holder.root))
    holder.close()
    for round_ in range(3):
        barrier, results = SPAWN.Barrier(2), SPAWN.Queue()
        datas = [body(6 * BLOCK, f"{round_}-p{i}") for i in range(2)]
        procs = [
            SPAWN.Process(target=replacer_worker, args=(data_dir, PATH, datas[i], round_ + 1, barrier, results))
            for i in range(2)
        ]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        kinds = sorted(o[0] for o in outcomes)
        assert kinds == ["conflict", "won"], outcomes
        winner = next(o for o in outcomes if o[0] == "won")
        holder = RootHolder(data_dir)
        try:
            root = holder.root
            assert entry(root, PATH).artifact_revision_id == winner[1]
            assert entry(root, PATH).generation == round_ + 2
            assert get_bytes(root, PATH) in datas
            ops = {i: o for i, o in publish_ops(root).items() if i not in before}
            # The loser's operation is cleaned; a loser that starts once the winner has
            # published conflicts at its precheck and has none (a busy machine does that).
            assert sorted(o.phase.name for o in ops.values()) in (["Cleaned", "Published"], ["Published"])
            for lost in [o for o in ops.values() if o.phase == PublishPhase.Cleaned]:
                assert "GenerationConflict" in lost.terminal_error
                assert revision(root, lost.artifact_revision_id) is None
                assert present_keys(root.store, block_keys(root, lost.artifact_revision_id, 6)) == []
            before |= set(ops)
        finally:
            holder.close()


SMALL = body(BLOCK - 100, "small")  # one block: staged by a helper thread while the begin commits


def _objects_and_temps(data_dir: str) -> tuple[list[str], list[str]]:
    """Every object file and every temp file the local store holds (walked, for the test only)."""
    objects, temps = [], []
    top = os.path.join(data_dir, "objects")
    for directory, _, names in os.walk(top):
        for name in names:
            path = os.path.relpath(os.path.join(directory, name), top)
            if path.startswith(".nokv-tmp"):
                temps.append(path)
            elif not name.startswith(".nokv-"):
                objects.append(path)
    return sorted(objects), temps


@pytest.mark.parametrize(
    ("crash_at", "link_lost"),
    [("after-stage", False), ("after-begin", False), ("after-upload-0", False), ("after-finalize", False)]
    + [("after-finalize", True)],
    ids=["after-stage", "after-begin", "after-upload-0", "after-finalize", "after-finalize-link-lost"],
)
def test_sigkill_around_a_staged_one_block_object(data_dir, crash_at, link_lost):
    """A one-block file's object is written and fsync'd under no key while the begin commits its
    ledger, and linked only after; its directory fsyncs run beside the (unflushed) finalize.
    Killed with the bytes staged (the begin committed or not), with the object linked, or
    Finalizing: no object is left that no ledger owns, no temp file is left, and after recovery
    the path holds the whole new body or nothing, fsck finds nothing, and gc finds nothing to
    delete. `link-lost`: the object's link did not reach the disk though Finalizing did (what a
    power loss may leave, the directory fsyncs running beside the finalize): recovery aborts."""
    from nokvfs.workspace import fsck, gc

    _, before = _prepare(data_dir, existing=False)
    objects_before, _ = _objects_and_temps(data_dir)
    assert run_crash_child(crash_worker, data_dir, "outputs/small.bin", SMALL, None, crash_at) == KILLED

    holder = RootHolder(data_dir, recover=False)
    root = holder.root
    new_ops = set(publish_ops(root)) - before
    objects, temps = _objects_and_temps(data_dir)
    assert temps == []  # an unnamed temp dies with its process
    if crash_at in ("after-stage", "after-begin"):
        # Staged bytes have no key yet: nothing in the store is new, whether the ledger committed.
        assert objects == objects_before
        assert len(new_ops) <= 1 if crash_at == "after-stage" else len(new_ops) == 1
    else:
        (op_id,) = new_ops
        op = publish_ops(root)[op_id]
        # The object is linked only under the key its durable ledger owns.
        (key,) = block_keys(root, op.artifact_revision_id, 1)
        assert present_keys(root.store, [key]) == [key]
        assert [o for o in objects if o not in objects_before] == [key]
        assert len(ledger(root, op_id)) == 1
        if link_lost:
            os.unlink(local_object_path(data_dir, key))
    holder.close()

    holder = RootHolder(data_dir)
    try:
        root = holder.root
        with root.read() as view:
            assert publish.pending(view, root) == []
        data = get_bytes(root, "outputs/small.bin")
        if crash_at == "after-finalize" and not link_lost:
            assert data == SMALL
        else:
            assert data is None
            for op_id in set(publish_ops(root)) - before:
                assert publish_ops(root)[op_id].phase == PublishPhase.Cleaned
                assert ledger(root, op_id) == []
            assert _objects_and_temps(data_dir) == (objects_before, [])
        assert fsck.check(root).findings == []
        assert gc.collect(root).deleted_objects == 0
    finally:
        holder.close()
