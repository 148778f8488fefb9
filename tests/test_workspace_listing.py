"""Stat and listing: the five sections always exist, directories are implicit, a page is fenced
by its read version (a continuation after any other commit is ReadVersionStale), a cursor belongs
to exactly one listing, and pages are bounded however many children there are.
"""

from __future__ import annotations

import pytest

from nokvfs.errors import InvalidInput, NotFound, ReadVersionStale
from nokvfs.schema.paths import normalize_path
from nokvfs.workspace import listing, namespace
from nokvfs.workspace import workbench as wb
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    WB,
    bench_fixture,
    body,
    data_dir_fixture,
    root_fixture,
    stat,
)

SECTIONS = ["input", "logs", "metadata", "outputs", "scripts"]


def _names(page):
    return [(c.name, c.kind) for c in page.children]


def _all(root, path="", *, limit, recursive=False):
    """Every child through continuation pages of `limit`, all at one read version."""
    fn = listing.list_recursive if recursive else listing.list_dir
    out, cursor, pages = [], None, 0
    with root.read() as view:
        while True:
            page = fn(view, root, WB, path, cursor=cursor, limit=limit)
            assert len(page.children) <= limit
            assert page.read_version == view.version
            out += page.children
            pages += 1
            cursor = page.cursor
            if cursor is None:
                return out, pages


def test_sections_are_always_present_even_when_empty(bench):
    root = bench
    with root.read() as view:
        page = listing.list_dir(view, root, WB)
    assert _names(page) == [(s, listing.DIRECTORY) for s in SECTIONS]
    assert page.cursor is None
    for section in SECTIONS:
        info = stat(root, section)
        assert info.kind == listing.DIRECTORY
        assert info.generation == wb.get(root, WB).revision
        with root.read() as view:
            assert listing.list_dir(view, root, WB, section).children == ()
            assert listing.list_recursive(view, root, WB, section).children == ()
    assert stat(root, "").kind == listing.DIRECTORY


def test_sections_page_with_small_limits(bench):
    children, pages = _all(bench, limit=2)
    assert [c.name for c in children] == SECTIONS
    assert pages == 3


def test_implicit_directories_and_files(bench):
    root = bench
    namespace.put(root, WB, "outputs/run1/metrics.json", b"{}")
    namespace.put(root, WB, "outputs/run1/ckpt/step-1", body(10, "c"))
    namespace.put(root, WB, "outputs/readme", b"r")
    revision = wb.get(root, WB).revision
    with root.read() as view:
        assert _names(listing.list_dir(view, root, WB, "outputs")) == [("readme", "file"), ("run1", "dir")]
        assert _names(listing.list_dir(view, root, WB, "outputs/run1")) == [("ckpt", "dir"), ("metrics.json", "file")]
    info = stat(root, "outputs/run1/ckpt")
    assert info.kind == listing.DIRECTORY and info.entry is None
    assert info.generation == revision  # a synthesized directory shows the workspace revision
    file_info = stat(root, "outputs/readme")
    assert file_info.kind == listing.FILE and file_info.size == 1 and file_info.generation == 1
    with pytest.raises(NotFound):
        stat(root, "outputs/run")  # a prefix of a name is not a directory
    with pytest.raises(NotFound):
        stat(root, "outputs/readme/x")
    with pytest.raises(NotFound):
        stat(root, "elsewhere")
    with root.read() as view:
        # Seed: "When the requested prefix can itself be a published file, the metadata listing
        # also performs one exact-prefix point read after descendant EOF; the Workbench
        # direct-child adapter does not expose the requested path as its own child."
        for lister in (listing.list_dir, listing.list_recursive):
            page = lister(view, root, WB, "outputs/readme")
            assert page.children == () and page.cursor is None
            assert (page.exact.name, page.exact.kind, page.exact.entry.logical_size) == ("readme", listing.FILE, 1)
            assert lister(view, root, WB, "outputs").exact is None  # a directory has no exact item
            with pytest.raises(NotFound):
                lister(view, root, WB, "outputs/nothing")
            with pytest.raises(NotFound):
                lister(view, root, WB, "outputs/readme/below")
    # Removing the last file under a directory removes the directory.
    namespace.remove(root, WB, "outputs/run1/ckpt/step-1")
    with pytest.raises(NotFound):
        stat(root, "outputs/run1/ckpt")
    assert stat(root, "outputs").kind == listing.DIRECTORY


def test_children_are_in_byte_order_of_their_names(bench):
    root = bench
    names = ["b", "a-b", "a", "ab", "a.b", "B", "Z", "é", "a b", "a\x01"]
    for name in names:
        if name == "a":
            namespace.put(root, WB, "logs/a/inner", b"x")  # "a" is a directory
        else:
            namespace.put(root, WB, f"logs/{name}", b"x")
    children, _ = _all(root, "logs", limit=3)
    assert [c.name for c in children] == sorted(names, key=lambda n: n.encode())


def test_recursive_listing_is_in_canonical_path_order(bench):
    root = bench
    paths = [
        "outputs/a/b",
        "outputs/a-b",
        "outputs/a/c/d",
        "outputs/ab",
        "outputs/a.x",
        "logs/z",
        "input/q/r/s",
        "outputs/b",
    ]
    for path in paths:
        namespace.put(root, WB, path, path.encode())
    canonical = sorted(paths, key=lambda p: [c.encode() for c in normalize_path(p)])
    for limit in (1, 2, 3, 1000):
        everything, _ = _all(root, limit=limit, recursive=True)
        assert [c.name for c in everything] == canonical
        assert all(c.kind == listing.FILE and c.entry.logical_size == len(c.name) for c in everything)
        below, _ = _all(root, "outputs/a", limit=limit, recursive=True)
        assert [c.name for c in below] == ["b", "c/d"]


def test_a_thousand_children_page_in_bounded_engine_calls(bench):
    root = bench
    names = [f"f{i:04d}" for i in range(1000)]
    for name in names:
        namespace.put(root, WB, f"logs/{name}", b"")
    namespace.put(root, WB, "logs/zdir/inner", b"")
    expected = names + ["zdir"]
    with root.read() as view:
        whole = listing.list_dir(view, root, WB, "logs", limit=5000)
    assert [c.name for c in whole.children] == expected and whole.cursor is None
    for limit in (1, 7, 255, 256, 1000):
        children, pages = _all(root, "logs", limit=limit)
        assert [c.name for c in children] == expected
        assert pages >= -(-1001 // limit)
    everything, _ = _all(root, limit=300, recursive=True)
    assert [c.name for c in everything] == [f"logs/{n}" for n in names] + ["logs/zdir/inner"]


def test_a_continuation_after_any_other_commit_is_read_version_stale(bench):
    root = bench
    for i in range(5):
        namespace.put(root, WB, f"outputs/f{i}", b"")
    wb.create(root, "other")
    with root.read() as view:
        page = listing.list_dir(view, root, WB, "outputs", limit=2)
        rpage = listing.list_recursive(view, root, WB, limit=2)
    assert page.cursor and rpage.cursor
    with root.read() as view:  # same version: fine
        assert len(listing.list_dir(view, root, WB, "outputs", cursor=page.cursor, limit=2).children) == 2
    namespace.put(root, "other", "logs/x", b"")  # an unrelated commit in another workbench
    with root.read() as view:
        with pytest.raises(ReadVersionStale) as info:
            listing.list_dir(view, root, WB, "outputs", cursor=page.cursor, limit=2)
        assert info.value.expected == page.read_version and info.value.current == view.version
        with pytest.raises(ReadVersionStale):
            listing.list_recursive(view, root, WB, cursor=rpage.cursor, limit=2)
        # Without a cursor the whole collection restarts at the new version.
        assert len(listing.list_dir(view, root, WB, "outputs").children) == 5


def test_a_cursor_from_another_listing_is_invalid_input(bench):
    root = bench
    wb.create(root, "other")
    for i in range(4):
        namespace.put(root, WB, f"outputs/f{i}", b"")
        namespace.put(root, WB, f"logs/f{i}", b"")
        namespace.put(root, "other", f"outputs/f{i}", b"")
    with root.read() as view:
        cursor = listing.list_dir(view, root, WB, "outputs", limit=1).cursor
        rcursor = listing.list_recursive(view, root, WB, "outputs", limit=1).cursor
        with pytest.raises(InvalidInput):
            listing.list_dir(view, root, WB, "logs", cursor=cursor)  # another directory
        with pytest.raises(InvalidInput):
            listing.list_dir(view, root, "other", "outputs", cursor=cursor)  # another workbench
        with pytest.raises(InvalidInput):
            listing.list_recursive(view, root, WB, "outputs", cursor=cursor)  # another kind
        with pytest.raises(InvalidInput):
            listing.list_dir(view, root, WB, "outputs", cursor=rcursor)
        with pytest.raises(InvalidInput):
            listing.list_dir(view, root, WB, "outputs", cursor=cursor, selector="snapshot:1")
        for garbage in ("", "!!!", "AAAA", cursor[:10]):
            with pytest.raises(InvalidInput):
                listing.list_dir(view, root, WB, "outputs", cursor=garbage)


def test_limits_must_be_positive(bench):
    with bench.read() as view:
        with pytest.raises(InvalidInput):
            listing.list_dir(view, bench, WB, "", limit=0)
        with pytest.raises(InvalidInput):
            listing.list_recursive(view, bench, WB, "", limit=0)


def test_listing_a_missing_or_staging_workbench_is_not_found(root):
    with root.read() as view:
        with pytest.raises(NotFound):
            listing.list_dir(view, root, "nobody")
        with pytest.raises(NotFound):
            listing.list_recursive(view, root, "nobody")
        with pytest.raises(NotFound):
            listing.stat(view, root, "nobody", "")


def test_a_listing_at_one_read_version_ignores_later_commits(bench):
    root = bench
    for i in range(6):
        namespace.put(root, WB, f"outputs/f{i}", b"")
    with root.read() as view:
        first = listing.list_dir(view, root, WB, "outputs", limit=3)
        namespace.put(root, WB, "outputs/f9", b"")  # commits while the view is open
        rest = listing.list_dir(view, root, WB, "outputs", cursor=first.cursor, limit=10)
    assert [c.name for c in first.children + rest.children] == [f"f{i}" for i in range(6)]
