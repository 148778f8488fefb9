"""ReadChanges: positions, cursors bound to scope, visibility at each event's version."""

from __future__ import annotations

import pytest

from nokvfs.errors import InvalidInput, ReadVersionStale
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.workspace import changes, namespace, workbench
from tests.workspace_helpers import opened_root


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path) as r:
        yield r


def positions(page):
    return [(c.commit_version, c.event_sequence) for c in page.changes]


def test_root_feed_pages_resume_strictly_after_the_cursor(root):
    workbench.create(root, "a")
    workbench.create(root, "b")
    for i in range(6):
        namespace.put(root, "ab"[i % 2], f"outputs/f{i}", b"x")
    everything = changes.read_changes(root, limit=1000)
    assert [c.kind for c in everything.changes][:2] == [ChangeEventKind.WorkspaceCreated] * 2
    assert len(everything.changes) == 8 and not everything.more
    seen, cursor = [], None
    while True:
        page = changes.read_changes(root, cursor=cursor, limit=3)
        seen += positions(page)
        cursor = page.cursor
        if not page.more:
            break
    assert seen == positions(everything) and seen == sorted(seen)
    # A cursor at the end resumes later against a newer root version.
    namespace.put(root, "a", "outputs/late", b"y")
    late = changes.read_changes(root, cursor=cursor)
    assert [c.path for c in late.changes] == ["outputs/late"]


def test_workspace_scope_filters_and_its_cursor_is_bound_to_the_scope(root):
    workbench.create(root, "a")
    workbench.create(root, "b")
    namespace.put(root, "a", "outputs/1", b"x")
    namespace.put(root, "b", "outputs/2", b"x")
    namespace.remove(root, "a", "outputs/1")
    page = changes.read_changes(root, workbench_id="a")
    assert [(c.kind, c.path) for c in page.changes] == [
        (ChangeEventKind.WorkspaceCreated, None),
        (ChangeEventKind.PathPut, "outputs/1"),
        (ChangeEventKind.PathRemoved, "outputs/1"),
    ]
    with pytest.raises(InvalidInput, match="another root or scope"):
        changes.read_changes(root, workbench_id="b", cursor=page.cursor)
    with pytest.raises(InvalidInput, match="another root or scope"):
        changes.read_changes(root, cursor=page.cursor)


def test_after_commit_version_excludes_that_whole_commit_and_fails_closed_past_the_root(root):
    workbench.create(root, "a")
    first = namespace.put(root, "a", "outputs/1", b"x")
    namespace.put(root, "a", "outputs/2", b"x")
    page = changes.read_changes(root, after_commit_version=first.modified_version)
    assert [c.path for c in page.changes] == ["outputs/2"]
    with pytest.raises(ReadVersionStale):
        changes.read_changes(root, after_commit_version=root.shard.commit_version + 1)
    with pytest.raises(InvalidInput):
        changes.read_changes(root, cursor="not-a-cursor")


def test_staging_incarnations_never_leak_into_the_feed(root):
    # Stage a workbench by hand (the first half of a create) and give it an event: it must not show.
    from nokvfs.engine.command import Put
    from nokvfs.schema import keys
    from nokvfs.schema.enums import WorkspaceState
    from nokvfs.schema.ids import new_id16
    from nokvfs.schema.records import WorkspaceCurrent
    from nokvfs.workspace.root import Built, intent_digest

    incarnation = new_id16()

    def build(view):
        marker = WorkspaceCurrent(incarnation, 0, WorkspaceState.Staging, None, view.version + 1, view.version + 1)
        return Built(
            mutations=[Put("workspace_current", keys.WorkspaceCurrentKey(root.root_id, "staged").encode(), marker)],
            events=[workbench.event(("staged", incarnation), ChangeEventKind.PathPut, "outputs/x")],
        )

    root.apply(build, digest=intent_digest("test.stage"))
    workbench.create(root, "visible")
    kinds = [(c.workbench_id, c.kind) for c in changes.read_changes(root).changes]
    assert kinds == [("visible", ChangeEventKind.WorkspaceCreated)]
