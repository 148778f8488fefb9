"""GC prunes History below the floor: what every hold reads stays exact, the change feed is the
same before and after, and only the holds and the configured retention keep history."""

from __future__ import annotations

import os

import pytest

from nokvfs.errors import HistoryNotRetained, InvalidInput
from nokvfs.schema.enums import ChangeEventKind, WorkspaceState
from nokvfs.workspace import (
    asof,
    changes,
    commit,
    datadir,
    gc,
    listing,
    namespace,
    reading,
    restore,
    snapshot,
    workbench,
)
from nokvfs.workspace.root import Built, intent_digest
from tests.workspace_helpers import opened_root

WB = "w"


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=(WB,), block_size=4096) as r:
        yield r


def files(root, view, workbench_id=WB) -> dict[str, bytes]:
    return {
        c.name: reading.read(root, c.entry, view=view)
        for c in listing.list_recursive(view, root, workbench_id).children
    }


def snapshot_files(root, selector) -> dict[str, bytes]:
    with root.read() as view:
        return files(root, snapshot.view_at(view, root, snapshot.get(root, WB, selector)))


def feed(root, workbench_id=None) -> list:
    out, cursor = [], None
    while True:
        page = changes.read_changes(root, workbench_id=workbench_id, cursor=cursor, limit=7)
        out += page.changes
        cursor = page.cursor
        if not page.more:
            return out


def history_rows(root) -> int:
    with root.shard._env.begin() as txn:
        return txn.stat(root.shard._dbs["history"])["entries"]


def churn(root, n: int, tag: str = "") -> None:
    for i in range(n):
        namespace.put(root, WB, f"outputs/f{i % 3}", f"{tag}{i}".encode() * 100)
    namespace.remove(root, WB, "outputs/f0")


def test_gc_prunes_history_and_every_snapshot_still_reads_exactly(root):
    churn(root, 6, "a")
    first = snapshot.mint(root, WB, alias="first")
    expected_first = snapshot_files(root, "first")
    churn(root, 6, "b")
    second = snapshot.mint(root, WB, alias="second")
    expected_second = snapshot_files(root, "second")
    churn(root, 6, "c")
    report = gc.collect(root)
    assert report.history_floor == first.read_version and report.history_pruned > 0
    churn(root, 3, "d")
    before = history_rows(root)
    floor, pruned = gc.prune_history(root)
    assert floor == first.read_version and history_rows(root) == before - pruned > 0
    assert snapshot_files(root, "first") == expected_first
    assert snapshot_files(root, "second") == expected_second
    with root.read() as view, pytest.raises(HistoryNotRetained):
        view.at(first.read_version - 1)
    # Retiring the older snapshot lets the floor move up to the newer one, and no further.
    snapshot.retire(root, WB, "first")
    report = gc.collect(root)
    assert report.history_floor == second.read_version and report.history_pruned > 0
    assert snapshot_files(root, "second") == expected_second
    snapshot.retire(root, WB, "second")
    assert gc.collect(root).history_floor == root.shard.commit_version


def test_the_change_feed_is_the_same_before_and_after_pruning(root):
    churn(root, 5)
    snap = snapshot.mint(root, WB, alias="s")
    restore.restore(root, WB, ("snapshot", "s"), "copy")  # Staging -> Visible
    with root.read() as view:
        _, source = workbench.visible(view, root.root_id, WB)
        kind, selector = restore.resolve_source(view, root, source, ("snapshot", "s"))
    aborted = restore.prepare(
        root, restore.RestoreRequest(WB, source.incarnation_id, kind, selector, "gone", os.urandom(16))
    )
    restore.advance(root, aborted)  # staged paths exist, the workbench is Staging
    restore.abort(root, aborted, reason="test")  # Staging -> Retired: its events never show
    # An event of an incarnation while it is Staging must never show, even once that same
    # incarnation is Visible: the feed judges each event at its own version. (No code path emits
    # one today; it is injected so the rule -- and the History it needs -- is exercised.)
    staged = restore.prepare(
        root, restore.RestoreRequest(WB, source.incarnation_id, kind, selector, "late", os.urandom(16))
    )
    restore.advance(root, staged)
    with root.read() as view:
        _, marker = workbench.read_current(view, root.root_id, "late")
    assert marker.state == WorkspaceState.Staging
    leak = workbench.event(("late", marker.workspace_incarnation_id), ChangeEventKind.PathPut, "outputs/leak")
    root.apply(lambda view: Built(events=[leak]), digest=intent_digest("test.leak"))
    restore.resume(root, staged)
    snapshot.retire(root, WB, snap.snapshot_id)
    commit.build(root, WB)
    namespace.put(root, "copy", "logs/l", b"copy")
    churn(root, 4)
    whole, scoped = feed(root), {name: feed(root, name) for name in (WB, "copy", "gone", "late")}
    assert {c.workbench_id for c in whole} == {WB, "copy", "late"} and scoped["gone"] == []
    assert [c.kind for c in scoped["late"]] == [ChangeEventKind.WorkspaceRestored]
    report = gc.collect(root)
    assert report.history_floor == root.shard.commit_version and report.history_pruned > 0
    assert feed(root) == whole
    assert {name: feed(root, name) for name in (WB, "copy", "gone", "late")} == scoped


def test_an_in_flight_restore_and_commit_build_keep_their_read_versions(root):
    churn(root, 4, "x")
    snap = snapshot.mint(root, WB, alias="s")
    expected = snapshot_files(root, "s")
    with root.read() as view:
        _, source = workbench.visible(view, root.root_id, WB)
        kind, selector = restore.resolve_source(view, root, source, ("snapshot", "s"))
    restoring = restore.prepare(
        root, restore.RestoreRequest(WB, source.incarnation_id, kind, selector, "dest", os.urandom(16))
    )
    churn(root, 3, "y")
    building = commit.begin(root, commit.CommitRequest(WB, os.urandom(16)))
    build_version = commit.operation(root, building).read_version
    with root.read() as view:
        frozen = files(root, view)
    churn(root, 6, "z")
    with pytest.raises(snapshot.ForkRetentionActive):
        snapshot.retire(root, WB, "s")  # the restore consumes it
    snapshot.renew(root, WB, "s")
    assert gc.collect(root).history_floor == snap.read_version
    result = restore.resume(root, restoring, batch=2)
    with root.read() as view:
        restored = files(root, view, "dest")
    assert {p: b for p, b in restored.items() if p != "metadata/restore_manifest.json"} == expected
    snapshot.retire(root, WB, "s")
    report = gc.collect(root)
    assert report.history_floor == build_version and report.history_pruned > 0  # the build's hold
    built = commit.resume(root, building, batch=2)
    with root.read() as view:
        tree = asof.at_commit(view, root, built.commit_id)
        committed = {path: reading.read(root, e, view=view) for path, e in tree.files()}
    assert {p: b for p, b in committed.items() if p != commit.RUN_MANIFEST_PATH} == frozen
    assert result.operation_id == restoring
    assert gc.collect(root).history_floor == root.shard.commit_version


def test_the_configured_retention_is_the_diagnostic_floor(tmp_path):
    datadir.init(str(tmp_path / "data"), history_retention=5)
    with datadir.open_root(str(tmp_path / "data")) as root:
        workbench.create(root, WB)
        churn(root, 10)
        report = gc.collect(root)
        assert report.history_floor == root.shard.commit_version - 5
        with root.read(root.shard.commit_version - 5) as view:
            assert set(files(root, view)) == {"outputs/f1", "outputs/f2"}
        assert gc.collect(root, keep_versions=0).history_floor == root.shard.commit_version


def test_a_negative_keep_is_refused(root):
    with pytest.raises(InvalidInput):
        gc.prune_history(root, keep_versions=-1)


def test_a_dry_run_counts_the_rows_and_prunes_nothing(root):
    for i in range(8):
        namespace.put(root, WB, f"outputs/new{i}", b"n")  # nothing to collect: GC adds no commands
    rows, floor = history_rows(root), root.shard.history_floor
    report = gc.collect(root, dry_run=True)
    assert report.history_pruned > 0 and report.history_floor == root.shard.commit_version
    assert history_rows(root) == rows and root.shard.history_floor == floor
    assert gc.collect(root).history_pruned == report.history_pruned
