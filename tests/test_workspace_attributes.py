"""Attributes, links and directory markers in the workspace: stored by the publish that creates a
revision or by one metadata-only command, and carried by snapshots, commits, tags and restore
(README "Durable format": the reserved `nokvfs:posix` field, `inode/symlink`, `.nokvfs-directory`)."""

from __future__ import annotations

import os

import pytest

from nokvfs.errors import (
    GenerationConflict,
    IndexValueInvalid,
    InvalidInput,
    IsADirectory,
    NotADirectory,
    NotFound,
    ReservedPath,
)
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.schema.records import IndexField, PathEntry
from nokvfs.workspace import (
    append,
    asof,
    changes,
    commit,
    index,
    listing,
    namespace,
    restore,
    snapshot,
    tag,
)
from nokvfs.workspace import attributes as attrs
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.attributes import Attributes
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    WB,
    all_rows,
    bench_fixture,
    data_dir_fixture,
    entry,
    get_bytes,
    publish_ops,
    root_fixture,
    root_holder_fixture,
)

SCRIPT = Attributes(
    mode=0o755,
    uid=None,
    gid=None,
    mtime_ns=1_600_000_000_500_000_000,
    atime_ns=1_600_000_001_000_000_000,
    ctime_ns=1_700_000_000_000_000_000,
)
OLD = -86_400_000_000_000  # a day before 1970


def object_files(data_dir: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(os.path.join(data_dir, "objects")):
        out += [os.path.join(dirpath, n) for n in names]
    return sorted(out)


def names(root, path: str, workbench_id: str = WB) -> list[str]:
    with root.read() as view:
        return [c.name for c in listing.list_dir(view, root, workbench_id, path).children]


def recursive(root, path: str = "", workbench_id: str = WB, **kw) -> list[str]:
    with root.read() as view:
        return [c.name for c in listing.list_recursive(view, root, workbench_id, path, **kw).children]


def feed(root) -> list:
    return list(changes.read_changes(root, workbench_id=WB, limit=1000).changes)


# --- files ------------------------------------------------------------------------------------


def test_put_stores_attributes_in_the_same_command_and_they_survive_a_reopen(root_holder):
    root = root_holder.root
    wb.create(root, WB)
    before = len(feed(root))
    made = namespace.put(root, WB, "scripts/run.sh", b"#!/bin/sh\necho hi\n", attributes=SCRIPT)
    assert attrs.of(made) == SCRIPT == attrs.of(entry(root, "scripts/run.sh"))
    assert [c.kind for c in feed(root)[before:]] == [ChangeEventKind.PathPut]  # one publication
    plain = namespace.put(root, WB, "scripts/plain", b"x")
    assert attrs.of(plain) is None and attrs.shown(plain).mode == 0o644
    root = root_holder.reopen()
    assert attrs.of(entry(root, "scripts/run.sh")) == SCRIPT
    assert get_bytes(root, "scripts/run.sh") == b"#!/bin/sh\necho hi\n"


def test_set_attributes_is_metadata_only(bench, data_dir):
    root = bench
    made = namespace.put(
        root, WB, "outputs/data.csv", b"a,b\n1,2\n", index_fields=index.fields({"rows": 1}), attributes=SCRIPT
    )
    objects, operations = object_files(data_dir), publish_ops(root)
    revisions = all_rows(root, "artifact_revision")
    index_rows = all_rows(root, "secondary_index")
    with root.read() as view:
        _, before_wb = wb.visible(view, root.root_id, WB)
    events = len(feed(root))

    changed = namespace.set_attributes(
        root, WB, "outputs/data.csv", mode=0o600, mtime_ns=OLD, expected_revision_id=made.artifact_revision_id
    )

    # Nothing uploaded, no revision, no publish operation; generation, body and size kept.
    assert object_files(data_dir) == objects and publish_ops(root) == operations
    assert all_rows(root, "artifact_revision") == revisions
    assert all_rows(root, "secondary_index") == index_rows
    assert (changed.generation, changed.artifact_revision_id, changed.logical_size, changed.body_digest_uri) == (
        made.generation,
        made.artifact_revision_id,
        made.logical_size,
        made.body_digest_uri,
    )
    assert changed.created_version == made.created_version and changed.modified_version > made.modified_version
    stored = attrs.of(entry(root, "outputs/data.csv"))
    assert (stored.mode, stored.mtime_ns, stored.atime_ns) == (0o600, OLD, SCRIPT.atime_ns)
    assert stored.ctime_ns > SCRIPT.ctime_ns
    assert list(index.decoded(changed)) == ["rows"]  # the reserved field is not a user field
    assert get_bytes(root, "outputs/data.csv") == b"a,b\n1,2\n"
    with root.read() as view:
        _, after_wb = wb.visible(view, root.root_id, WB)
    assert after_wb.revision == before_wb.revision + 1
    (event,) = feed(root)[events:]
    assert (event.kind, event.path, event.before, event.after) == (
        ChangeEventKind.PathAttributesChanged,
        "outputs/data.csv",
        made.artifact_revision_id,
        made.artifact_revision_id,
    )


def test_set_attributes_without_stored_ones_starts_from_what_was_shown(bench):
    made = namespace.put(bench, WB, "outputs/a", b"a")
    shown = attrs.shown(made)
    changed = namespace.set_attributes(bench, WB, "outputs/a", uid=1234)
    stored = attrs.of(changed)
    assert (stored.mode, stored.uid, stored.gid, stored.mtime_ns) == (0o644, 1234, None, shown.mtime_ns)


def test_set_attributes_refusals_change_nothing(bench):
    made = namespace.put(bench, WB, "outputs/d/f", b"f")
    with pytest.raises(GenerationConflict):
        namespace.set_attributes(bench, WB, "outputs/d/f", mode=0o700, expected_revision_id=b"\x07" * 16)
    with pytest.raises(NotFound):
        namespace.set_attributes(bench, WB, "outputs/missing", mode=0o700)
    with pytest.raises(IsADirectory):
        namespace.set_attributes(bench, WB, "outputs/d", mode=0o700)
    for bad in (dict(mode=0o10000), dict(uid=-1), dict(mtime_ns=1 << 64)):
        with pytest.raises(InvalidInput):
            namespace.set_attributes(bench, WB, "outputs/d/f", **bad)
    assert entry(bench, "outputs/d/f") == made


def test_a_reserved_field_name_from_a_user_is_refused_and_search_never_sees_it(bench):
    field = attrs.posix_field(SCRIPT)
    with pytest.raises(IndexValueInvalid):
        namespace.put(bench, WB, "outputs/x", b"x", index_fields=(field,))
    with pytest.raises(IndexValueInvalid):
        namespace.put(bench, WB, "outputs/x", b"x", index_fields=(IndexField("nokvfs:other", field.encoded_value),))
    assert entry(bench, "outputs/x") is None
    namespace.put(bench, WB, "outputs/x", b"x", index_fields=index.fields({"kind": "csv"}), attributes=SCRIPT)
    namespace.set_attributes(bench, WB, "outputs/x", mode=0o640)
    ids = [keys.SecondaryIndexKey.decode(k).index_id for k, _ in all_rows(bench, "secondary_index")]
    assert ids == ["kind"]  # the reserved field has no SecondaryIndex row
    with pytest.raises(IndexValueInvalid):
        index.search(bench, WB, attrs.POSIX_FIELD, equals=field.encoded_value)
    assert [h.path for h in index.search(bench, WB, "kind", equals="csv").hits] == ["outputs/x"]


def test_reserved_content_types_are_not_generic_puts(bench):
    for content_type in (attrs.SYMLINK_CONTENT_TYPE, attrs.DIRECTORY_CONTENT_TYPE):
        with pytest.raises(InvalidInput):
            namespace.put(bench, WB, "outputs/x", b"target", content_type=content_type)
    assert entry(bench, "outputs/x") is None


def test_append_keeps_mode_and_moves_mtime(bench):
    namespace.put(bench, WB, "logs/run.log", b"one\n", attributes=SCRIPT.replace(mode=0o640))
    appended = append.append(bench, WB, "logs/run.log", b"two\n")
    stored = attrs.of(appended)
    assert stored.mode == 0o640 and stored.mtime_ns > SCRIPT.mtime_ns and stored.ctime_ns == stored.mtime_ns
    assert get_bytes(bench, "logs/run.log") == b"one\ntwo\n"


def test_rename_carries_the_attributes(bench):
    namespace.put(bench, WB, "outputs/a", b"a", attributes=SCRIPT)
    moved = namespace.rename(bench, WB, "outputs/a", "outputs/b")
    assert attrs.of(moved) == SCRIPT == attrs.of(entry(bench, "outputs/b"))


# --- links ------------------------------------------------------------------------------------


def test_a_symlink_is_stored_listed_and_read(bench):
    link = namespace.symlink(bench, WB, "outputs/venv/bin/python", "/usr/bin/python3")
    assert attrs.is_symlink(link) and link.logical_size == len("/usr/bin/python3")
    assert attrs.of(link).mode == attrs.LINK_MODE
    assert namespace.read_link(bench, link) == "/usr/bin/python3"
    assert names(bench, "outputs/venv/bin") == ["python"]
    with bench.read() as view:
        (child,) = listing.list_dir(view, bench, WB, "outputs/venv/bin").children
    assert attrs.is_symlink(child.entry) and namespace.read_link(bench, child.entry) == "/usr/bin/python3"
    with pytest.raises(GenerationConflict):
        namespace.symlink(bench, WB, "outputs/venv/bin/python", "python3", expected_generation=0)
    again = namespace.symlink(bench, WB, "outputs/venv/bin/python", "python3", attributes=SCRIPT.replace(mode=0o777))
    assert namespace.read_link(bench, again) == "python3" and attrs.of(again).mtime_ns == SCRIPT.mtime_ns
    with pytest.raises(InvalidInput):
        namespace.read_link(bench, namespace.put(bench, WB, "outputs/plain", b"x"))


@pytest.mark.parametrize("target", ["", "x" * 4096, "a\x00b"])
def test_bad_link_targets_are_refused(bench, target):
    with pytest.raises(InvalidInput):
        namespace.symlink(bench, WB, "outputs/l", target)
    assert entry(bench, "outputs/l") is None


def test_a_link_is_not_appended_to(bench):
    namespace.symlink(bench, WB, "outputs/l", "target")
    with pytest.raises(InvalidInput):
        append.append(bench, WB, "outputs/l", b"more")
    assert namespace.read_link(bench, entry(bench, "outputs/l")) == "target"


def test_a_link_can_be_chowned_and_touched_metadata_only(bench):
    link = namespace.symlink(bench, WB, "outputs/l", "t")
    changed = namespace.set_attributes(bench, WB, "outputs/l", uid=5, gid=6, mtime_ns=OLD)
    assert changed.artifact_revision_id == link.artifact_revision_id
    assert (attrs.of(changed).uid, attrs.of(changed).gid, attrs.of(changed).mode) == (5, 6, 0o777)


# --- directory markers ------------------------------------------------------------------------


def test_directory_attributes_live_on_a_hidden_marker(bench):
    namespace.put(bench, WB, "outputs/d/f", b"f")
    namespace.put(bench, WB, "outputs/d/sub/g", b"g")
    with bench.read() as view:
        _, bench_wb = wb.visible(view, bench.root_id, WB)
        assert namespace.directory_attributes(view, bench, bench_wb.incarnation_id, ("outputs", "d")) is None
    marker = namespace.set_directory_attributes(bench, WB, "outputs/d", mode=0o750, mtime_ns=OLD)
    assert marker.content_type == attrs.DIRECTORY_CONTENT_TYPE and marker.logical_size == 0
    with bench.read() as view:
        got = namespace.directory_attributes(view, bench, bench_wb.incarnation_id, ("outputs", "d"))
    assert (got.mode, got.mtime_ns, got.uid) == (0o750, OLD, None)

    # Hidden from every listing; only the internal recursive listing asks for it.
    assert names(bench, "outputs/d") == ["f", "sub"]
    assert recursive(bench, "outputs") == ["d/f", "d/sub/g"]
    assert recursive(bench) == ["outputs/d/f", "outputs/d/sub/g"]
    assert recursive(bench, "outputs", with_markers=True) == ["d/.nokvfs-directory", "d/f", "d/sub/g"]

    # The second change is metadata-only on the marker.
    again = namespace.set_directory_attributes(bench, WB, "outputs/d", uid=7)
    assert again.artifact_revision_id == marker.artifact_revision_id and again.generation == marker.generation
    assert (attrs.of(again).mode, attrs.of(again).uid, attrs.of(again).mtime_ns) == (0o750, 7, OLD)


def test_a_directory_with_only_its_marker_is_an_empty_directory(bench):
    made = namespace.set_directory_attributes(bench, WB, "outputs/empty", mode=0o700)
    assert attrs.of(made).mode == 0o700 and attrs.of(made).mtime_ns > 0  # times default to now
    with bench.read() as view:
        assert listing.stat(view, bench, WB, "outputs/empty").kind == listing.DIRECTORY
        _, bench_wb = wb.visible(view, bench.root_id, WB)
        assert not listing.has_children(view, bench, bench_wb.incarnation_id, ("outputs", "empty"))
        assert listing.has_children(view, bench, bench_wb.incarnation_id, ("outputs", "empty"), ignore_marker=False)
    assert names(bench, "outputs") == ["empty"] and names(bench, "outputs/empty") == []
    assert recursive(bench, "outputs") == []
    namespace.put(bench, WB, "outputs/empty/zzz", b"z")
    with bench.read() as view:
        assert listing.has_children(view, bench, bench_wb.incarnation_id, ("outputs", "empty"))
    namespace.remove(bench, WB, "outputs/empty/zzz")
    assert (
        namespace.remove_directory_attributes(bench, WB, "outputs/empty").content_type == attrs.DIRECTORY_CONTENT_TYPE
    )
    assert namespace.remove_directory_attributes(bench, WB, "outputs/empty") is None  # idempotent
    with bench.read() as view, pytest.raises(NotFound):
        listing.stat(view, bench, WB, "outputs/empty")


def test_a_section_may_hold_a_marker_the_workbench_may_not(bench):
    namespace.set_directory_attributes(bench, WB, "outputs", mode=0o700)
    assert names(bench, "outputs") == []
    with pytest.raises(InvalidInput):
        namespace.set_directory_attributes(bench, WB, "", mode=0o700)
    with pytest.raises(InvalidInput):
        namespace.set_directory_attributes(bench, WB, "elsewhere/d", mode=0o700)


def test_the_marker_name_is_reserved_everywhere_else(bench):
    namespace.put(bench, WB, "outputs/file", b"f")
    namespace.set_directory_attributes(bench, WB, "outputs/d", mode=0o700)
    marker = "outputs/d/.nokvfs-directory"
    with pytest.raises(ReservedPath):
        namespace.put(bench, WB, marker, b"")
    with pytest.raises(ReservedPath):
        namespace.put(bench, WB, "outputs/.nokvfs-directory/x", b"")
    with pytest.raises(ReservedPath):
        namespace.remove(bench, WB, marker)
    with pytest.raises(ReservedPath):
        namespace.rename(bench, WB, marker, "outputs/m")
    with pytest.raises(ReservedPath):
        namespace.rename(bench, WB, "outputs/file", "outputs/.nokvfs-directory")
    with pytest.raises(ReservedPath):
        append.append(bench, WB, marker, b"x")
    with pytest.raises(ReservedPath):
        namespace.set_attributes(bench, WB, marker, mode=0o777)
    with pytest.raises(ReservedPath):
        namespace.symlink(bench, WB, marker, "x")
    with pytest.raises(NotADirectory):
        namespace.set_directory_attributes(bench, WB, "outputs/file", mode=0o700)
    with pytest.raises(InvalidInput):  # a file cannot appear where the directory is
        namespace.put(bench, WB, "outputs/d", b"x")
    assert entry(bench, marker).content_type == attrs.DIRECTORY_CONTENT_TYPE


# --- history: snapshots, commits, tags, restore ------------------------------------------------


def _populate(root) -> dict:
    namespace.put(root, WB, "scripts/run.sh", b"#!/bin/sh\n", attributes=SCRIPT)
    namespace.put(root, WB, "outputs/data", b"data", attributes=SCRIPT.replace(mode=0o600, uid=1000, gid=1000))
    namespace.symlink(root, WB, "outputs/latest", "data", attributes=SCRIPT.replace(mode=0o777, mtime_ns=OLD))
    namespace.set_directory_attributes(root, WB, "outputs/keep", mode=0o1777, mtime_ns=OLD)
    return _state(root, WB)


def _state(root, workbench_id: str, view=None, tree=None) -> dict:
    """path -> (kind, Attributes, link target) of everything, directory markers included."""
    out = {}
    if tree is not None:
        rows = [(p, e) for p, e in tree.files(with_markers=True)]
    else:
        with root.read() as live:
            v = view or live
            rows, cursor = [], None
            while True:
                page = listing.list_recursive(v, root, workbench_id, cursor=cursor, with_markers=True)
                rows += [(c.name, c.entry) for c in page.children]
                cursor = page.cursor
                if cursor is None:
                    break
    for path, e in rows:
        if path.startswith("metadata/"):
            continue
        target = namespace.read_link(root, e, view=view) if attrs.is_symlink(e) else None
        out[path] = (e.content_type, attrs.shown(e), target)
    return out


def _change_everything(root) -> None:
    namespace.set_attributes(root, WB, "scripts/run.sh", mode=0o644)
    namespace.set_attributes(root, WB, "outputs/data", uid=0, mtime_ns=0)
    namespace.symlink(root, WB, "outputs/latest", "elsewhere")
    namespace.set_directory_attributes(root, WB, "outputs/keep", mode=0o755)


def test_snapshots_commits_tags_and_restore_carry_attributes_links_and_markers(bench):
    root = bench
    expected = _populate(root)
    assert set(expected) == {"scripts/run.sh", "outputs/data", "outputs/latest", "outputs/keep/.nokvfs-directory"}
    snap = snapshot.mint(root, WB, alias="before")
    made = commit.build(root, WB)
    tag.set(root, WB, "v1", made.commit_id)
    _change_everything(root)
    assert _state(root, WB) != expected

    with root.read() as view:
        at = snapshot.view_at(view, root, snapshot.get(root, WB, "before"))
        assert _state(root, WB, view=at) == expected
        assert [c.name for c in listing.list_dir(at, root, WB, "outputs").children] == ["data", "keep", "latest"]
        assert [c.name for c in listing.list_dir(at, root, WB, "outputs/keep").children] == []
        tree = asof.at_commit(view, root, made.commit_id)
        assert _state(root, WB, view=view, tree=tree) == expected
        children, _ = tree.children_page(("outputs", "keep"))
        assert children == [] and tree.stat(("outputs", "keep")).kind == listing.DIRECTORY
        assert [p for p, _ in tree.files("outputs")] == ["data", "latest"]
        tagged = asof.at_commit(view, root, tag.resolve(root, WB, "v1").commit_id)
        assert _state(root, WB, view=view, tree=tagged) == expected

    restore.restore(root, WB, ("commit", made.commit_id), "from-commit")
    assert _state(root, "from-commit") == expected
    restore.restore(root, WB, ("snapshot", snap.snapshot_id), "from-snapshot")
    assert _state(root, "from-snapshot") == expected
    assert names(root, "outputs/keep", "from-snapshot") == []
    with root.read() as view:
        _, copy = wb.visible(view, root.root_id, "from-commit")
        got = namespace.directory_attributes(view, root, copy.incarnation_id, ("outputs", "keep"))
    assert got.mode == 0o1777 and got.mtime_ns == OLD


def test_a_commit_of_a_chmod_only_change_is_a_new_tree(bench):
    namespace.put(bench, WB, "scripts/run.sh", b"#!/bin/sh\n", attributes=SCRIPT)
    first = commit.build(bench, WB)
    namespace.set_attributes(bench, WB, "scripts/run.sh", mode=0o644)
    second = commit.build(bench, WB)
    assert first.tree_digest_uri != second.tree_digest_uri
    with bench.read() as view:
        old = asof.at_commit(view, bench, first.commit_id).entry(("scripts", "run.sh"))
        new = asof.at_commit(view, bench, second.commit_id).entry(("scripts", "run.sh"))
    assert old.artifact_revision_id == new.artifact_revision_id
    assert (attrs.of(old).mode, attrs.of(new).mode) == (0o755, 0o644)


def test_reading_entries_that_predate_attributes(bench):
    """A PathEntry written before attributes existed has no reserved field: shown() gives the
    defaults it always showed, and a metadata-only change adds the field."""
    made = namespace.put(bench, WB, "outputs/old", b"x")
    assert made.typed_index_projection == () and attrs.of(made) is None
    decoded = PathEntry.decode(made.encode())
    assert attrs.shown(decoded).mtime_ns == attrs.revision_time_ns(decoded)


def test_gc_frees_removed_links_and_markers_and_keeps_a_chmodded_file(bench):
    from nokvfs.schema.enums import RevisionState
    from nokvfs.workspace import gc
    from tests.workspace_fixtures import revision

    kept = namespace.put(bench, WB, "outputs/kept", b"kept", attributes=SCRIPT)
    link = namespace.symlink(bench, WB, "outputs/link", "kept")
    marker = namespace.set_directory_attributes(bench, WB, "outputs/d", mode=0o700)
    namespace.set_attributes(bench, WB, "outputs/kept", mode=0o600)  # no new revision to free
    assert gc.collect(bench).freed_revisions == 0
    namespace.remove(bench, WB, "outputs/link")
    namespace.remove_directory_attributes(bench, WB, "outputs/d")
    report = gc.collect(bench)
    assert sorted(report.freed) == sorted([link.artifact_revision_id.hex(), marker.artifact_revision_id.hex()])
    assert report.freed_bytes == len("kept")  # the link's body; a marker has none
    assert revision(bench, kept.artifact_revision_id).state == RevisionState.Available
    assert get_bytes(bench, "outputs/kept") == b"kept" and attrs.of(entry(bench, "outputs/kept")).mode == 0o600


def test_a_page_of_only_the_marker_is_skipped_not_returned_empty(bench):
    """A reader that stops at an empty page (the mount's readdir) must still see what follows the
    marker: pages of one child at a time walk past it."""
    for name in ("-a", "zz"):  # '-' sorts before '.nokvfs-directory', 'z' after it
        namespace.put(bench, WB, f"outputs/d/{name}", b"x")
    namespace.set_directory_attributes(bench, WB, "outputs/d", mode=0o700)
    made = commit.build(bench, WB)
    with bench.read() as view:
        _, bench_wb = wb.visible(view, bench.root_id, WB)
        tree = asof.at_commit(view, bench, made.commit_id)
        for page_of in (
            lambda anchor: listing.children_page(view, bench, bench_wb, ("outputs", "d"), start_after=anchor, limit=1),
            lambda anchor: tree.children_page(("outputs", "d"), start_after=anchor, limit=1),
        ):
            seen, anchor = [], None
            while True:
                children, anchor = page_of(anchor)
                assert children or anchor is None
                seen += [c.name for c in children]
                if anchor is None:
                    break
            assert seen == ["-a", "zz"]
