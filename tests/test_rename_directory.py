"""namespace.rename_directory: a directory's whole subtree moves in one command (rename(2) of a
directory in the mount), every path with its revision, attributes and references, one
PathRenamed event each; what cannot be moved that way is refused before anything is written."""

from __future__ import annotations

import pytest

from nokvfs.errors import AlreadyExists, CommandTooLarge, InvalidInput, NotADirectory, NotFound
from nokvfs.workspace import attributes, changes, fsck, listing, namespace
from tests.workspace_helpers import files_of, opened_root, put_all

FILES = {
    "outputs/run/a.txt": b"alpha",
    "outputs/run/sub/b.bin": b"\x00" * 5000,
    "outputs/run/sub/deeper/c": b"c",
    "outputs/other.txt": b"stays",
}


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("w",), block_size=4096) as r:
        put_all(r, "w", FILES)
        namespace.symlink(r, "w", "outputs/run/link", "a.txt")
        namespace.set_directory_attributes(r, "w", "outputs/run/sub", mode=0o750)
        yield r


def revision(root, path):
    with root.read() as view:
        return listing.stat(view, root, "w", path).entry.artifact_revision_id


def test_the_whole_subtree_moves_in_one_command_with_its_revisions_and_attributes(root):
    with root.read() as view:
        before_version = view.version
    revisions = {path: revision(root, path) for path in FILES}
    moved = namespace.rename_directory(root, "w", "outputs/run", "outputs/renamed/run2")
    assert len(moved) == 5  # three files, the link and the marker of sub/ (and nothing else)
    files = files_of(root, "w")
    assert files == {
        "outputs/renamed/run2/a.txt": b"alpha",
        "outputs/renamed/run2/sub/b.bin": b"\x00" * 5000,
        "outputs/renamed/run2/sub/deeper/c": b"c",
        "outputs/renamed/run2/link": b"a.txt",
        "outputs/other.txt": b"stays",
    }
    with root.read() as view:
        assert view.version == before_version + 1  # one command
        incarnation = listing.stat(view, root, "w", "outputs").workbench.incarnation_id
        marker = namespace.directory_attributes(view, root, incarnation, ("outputs", "renamed", "run2", "sub"))
    # The same revisions, at their new paths: nothing was copied or uploaded.
    assert revision(root, "outputs/renamed/run2/sub/b.bin") == revisions["outputs/run/sub/b.bin"]
    assert revision(root, "outputs/renamed/run2/a.txt") == revisions["outputs/run/a.txt"]
    page = changes.read_changes(root, after_commit_version=before_version, limit=100)
    renamed = sorted((c.path, c.before.decode()) for c in page.changes if c.kind.name == "PathRenamed")
    assert [c.commit_version for c in page.changes] == [before_version + 1] * 5
    assert ("outputs/renamed/run2/a.txt", "outputs/run/a.txt") in renamed
    assert (
        f"outputs/renamed/run2/sub/{attributes.DIRECTORY_MARKER}",
        f"outputs/run/sub/{attributes.DIRECTORY_MARKER}",
    ) in renamed
    assert marker is not None and marker.mode & 0o777 == 0o750
    report = fsck.check(root)
    assert report.ok, report.findings  # references, indexes and digests agree after the move


def test_an_empty_target_directory_is_replaced_and_its_marker_with_it(root):
    namespace.set_directory_attributes(root, "w", "outputs/empty", mode=0o700)  # a directory that is only its marker
    assert len(namespace.rename_directory(root, "w", "outputs/run/sub", "outputs/empty")) == 3
    files = files_of(root, "w")
    assert files["outputs/empty/b.bin"] == b"\x00" * 5000 and "outputs/run/sub/b.bin" not in files
    assert fsck.check(root).ok


def test_what_cannot_move_is_refused_and_nothing_is_written(root):
    with root.read() as view:
        version = view.version
    with pytest.raises(AlreadyExists):
        namespace.rename_directory(root, "w", "outputs/run/sub", "outputs/run")  # not empty (a.txt, link)
    with pytest.raises(InvalidInput):
        namespace.rename_directory(root, "w", "outputs/run", "outputs/run/sub/inner")  # into itself
    with pytest.raises(NotADirectory):
        namespace.rename_directory(root, "w", "outputs/run", "outputs/other.txt/x")  # below a file
    with pytest.raises(NotADirectory):
        namespace.rename_directory(root, "w", "outputs/other.txt", "outputs/elsewhere")  # a file is renamed by rename
    with pytest.raises(NotFound):
        namespace.rename_directory(root, "w", "outputs/nothing", "outputs/elsewhere")
    with pytest.raises(CommandTooLarge):
        namespace.rename_directory(root, "w", "outputs/run", "outputs/big", limit=4)
    with root.read() as view:
        assert view.version == version
    assert files_of(root, "w")["outputs/run/a.txt"] == b"alpha"


def test_one_thousand_paths_move_in_one_command(root):
    put_all(root, "w", {f"outputs/many/d{i % 10}/f{i:04d}": f"{i}".encode() for i in range(995)})
    moved = namespace.rename_directory(root, "w", "outputs/many", "outputs/moved")
    assert len(moved) == 995 and moved[0][0][:2] == ("outputs", "many") and moved[0][1][:2] == ("outputs", "moved")
    files = files_of(root, "w")
    assert files["outputs/moved/d3/f0993"] == b"993" and not any(p.startswith("outputs/many/") for p in files)
    assert fsck.check(root).ok
