"""MVCC reads at retained versions and the bounded delimiter/prefix scans."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.engine.command import Delete, Put
from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, list_children, scan_prefix
from nokvfs.errors import HistoryNotRetained, ReadVersionStale
from nokvfs.schema.ids import new_id16
from nokvfs.schema.paths import (
    ordered_path,
    subtree_prefix,
    unordered_path,
)

ROOT = b"\x0a" * 32  # root | incarnation


def pkey(path: str) -> bytes:
    return ROOT + ordered_path(tuple(path.split("/")))


def put(env, *paths, value=None):
    return env.apply(mutations=[Put("path_current", pkey(p), value or b"\x02" + p.encode()) for p in paths])


def children(view, prefix_path=None, limit=MAX_ITEMS_PER_CALL):
    prefix = ROOT + (subtree_prefix(tuple(prefix_path.split("/"))) if prefix_path else b"")
    out, marker = [], None
    while True:
        page = list_children(view, "path_current", prefix, start_after=marker, limit=limit)
        for item in page.items:
            name = item.child.translate(bytes(range(255, 256)) + bytes(range(0, 255)))  # undo ordered()
            out.append((name.decode(), "dir" if item.is_prefix else "file"))
        if page.next_marker is None:
            return out
        marker = page.next_marker


def test_point_reads_at_every_retained_version(shard_env):
    versions = {}
    for _i, value in enumerate([b"\x02a", b"\x02b", None, b"\x02c"]):
        mutation = Put("path_current", pkey("k"), value) if value else Delete("path_current", pkey("k"))
        versions[shard_env.apply(mutations=[mutation]).commit_version] = value
    first = min(versions)
    with shard_env.shard.read(first - 1) as view:
        assert view.get("path_current", pkey("k")) is None
    for version, value in versions.items():
        with shard_env.shard.read(version) as view:
            assert view.get("path_current", pkey("k")) == value
    with pytest.raises(ReadVersionStale):
        with shard_env.shard.read(max(versions) + 1):
            pass


def test_reads_below_the_history_floor_are_refused(shard_env):
    put(shard_env, "a")
    env = shard_env.shard._env
    from nokvfs.engine import rows
    from nokvfs.engine.records import SYS_HISTORY_FLOOR, HistoryFloor

    with env.begin(write=True) as txn:
        floor = HistoryFloor(shard_env.shard.commit_version).encode()
        txn.put(SYS_HISTORY_FLOOR, rows.seal("system", SYS_HISTORY_FLOOR, floor), db=shard_env.shard._dbs["system"])
    with pytest.raises(HistoryNotRetained):
        with shard_env.shard.read(1):
            pass


def test_direct_children_roll_subtrees_up_and_exact_rows_win(shard_env):
    put(shard_env, "a/x", "a/y/z", "b", "ab", "a\x01", "c/d/e/f")
    put(shard_env, "a")  # an exact row beside a subtree wins
    with shard_env.shard.read() as view:
        assert children(view) == [("a", "file"), ("a\x01", "file"), ("ab", "file"), ("b", "file"), ("c", "dir")]
        assert children(view, "a") == [("x", "file"), ("y", "dir")]
        assert children(view, "c/d") == [("e", "dir")]
        assert children(view, "b") == []  # 'b' is a file: no children, and 'ab' never matches


def test_listing_pages_resume_after_the_exclusive_marker(shard_env):
    names = [f"f{i:04d}" for i in range(600)]
    for start in range(0, 600, 200):
        put(shard_env, *[f"dir/{n}" for n in names[start : start + 200]])
    with shard_env.shard.read() as view:
        pages = []
        marker = None
        while True:
            page = list_children(view, "path_current", ROOT + subtree_prefix(("dir",)), start_after=marker)
            pages.append(len(page.items))
            assert page.read_version == view.version
            if page.next_marker is None:
                break
            marker = page.next_marker
        assert pages[0] == MAX_ITEMS_PER_CALL and sum(pages) == 600
        assert [n for n, _ in children(view, "dir", limit=7)] == names
    with pytest.raises(ValueError):
        list_children(view, "path_current", ROOT, limit=256)


def test_listing_costs_its_children_not_its_descendants(shard_env):
    for child in range(10):
        put(shard_env, *[f"top/c{child}/deep/{i}" for i in range(300)])
    with shard_env.shard.read() as view:
        page = list_children(view, "path_current", ROOT + subtree_prefix(("top",)))
    assert len(page.items) == 10 and all(item.is_prefix for item in page.items)
    # Two seeks per child, each of two cursor operations (the landing row and the row before
    # it, both verified): a constant per child, whatever the 300 descendants of each.
    assert page.cursor_ops <= 4 * 10 + 2


def test_recursive_prefix_scan_is_bounded_and_ordered(shard_env):
    paths = [f"r/{i % 7}/{i}" for i in range(400)]
    for start in range(0, 400, 100):
        put(shard_env, *paths[start : start + 100])
    with shard_env.shard.read() as view:
        seen, marker = [], None
        while True:
            page = scan_prefix(view, "path_current", ROOT + subtree_prefix(("r",)), start_after=marker)
            assert len(page.items) <= MAX_ITEMS_PER_CALL
            seen += [k for k, _ in page.items]
            if page.next_marker is None:
                break
            marker = page.next_marker
    assert seen == sorted(pkey(p) for p in paths)
    assert ["/".join(unordered_path(k[len(ROOT) :])) for k in seen] == sorted(paths, key=lambda p: pkey(p))


def test_listing_at_an_old_version_sees_exactly_what_was_there(shard_env):
    put(shard_env, "d/a", "d/b/c", "d/e")
    old = shard_env.shard.commit_version
    shard_env.apply(mutations=[Delete("path_current", pkey("d/a")), Delete("path_current", pkey("d/b/c"))])
    put(shard_env, "d/f", "d/aa/z", "d/e", value=b"\x02new")
    with shard_env.shard.read(old) as view:
        assert children(view, "d") == [("a", "file"), ("b", "dir"), ("e", "file")]
        assert view.get("path_current", pkey("d/e")) == b"\x02d/e"
    with shard_env.shard.read() as view:
        assert children(view, "d") == [("aa", "dir"), ("e", "file"), ("f", "file")]


component = st.text(alphabet=st.sampled_from("ab\x01é/"), min_size=1, max_size=3).filter(
    lambda c: "/" not in c and c not in (".", "..")
)
path_strategy = st.lists(component, min_size=1, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.booleans(), path_strategy), min_size=1, max_size=25), seed=st.integers(0, 9))
def test_mvcc_reads_and_scans_equal_a_replayed_model(shard_env, ops, seed):
    """At every version, point reads, prefix scans and listings equal a dict model of that version."""
    base = shard_env.shard.commit_version
    prefix = shard_env.root_id + new_id16()  # a fresh namespace per example
    model, states = {}, {}
    rng = random.Random(seed)
    for is_put, comps in ops:
        key = prefix + ordered_path(comps)
        if is_put:
            value = b"\x02" + rng.randbytes(4)
            model[key] = value
            mutation = Put("path_current", key, value)
        else:
            model.pop(key, None)
            mutation = Delete("path_current", key)
        version = shard_env.apply(mutations=[mutation]).commit_version
        states[version] = dict(model)
    for version, expected in states.items():
        with shard_env.shard.read(version) as view:
            got = []
            marker = None
            while True:
                page = scan_prefix(view, "path_current", prefix, start_after=marker, limit=3)
                got += page.items
                if page.next_marker is None:
                    break
                marker = page.next_marker
            assert dict(got) == expected and [k for k, _ in got] == sorted(expected)
            top = {k[len(prefix) :].split(b"\x00")[0].rstrip(b"\x01") for k in expected}
            listed = list_children(view, "path_current", prefix)
            assert {i.child for i in listed.items} == top
    with shard_env.shard.read(base) as view:
        assert scan_prefix(view, "path_current", prefix).items == ()


def _seek_each(view, tree: str, prefix: bytes, start_after: bytes | None, limit: int):
    """What a prefix page holds, by one `seek` per row (the model `walk` must equal)."""
    items, position = [], prefix if start_after is None else start_after + b"\x00"
    while len(items) < limit:
        found = view.seek(tree, position, within=prefix)
        if found is None:
            return items, None
        items.append(found)
        position = found[0] + b"\x00"
    return items, items[-1][0]


@pytest.mark.parametrize("limit", [1, 2, 3, 7, MAX_ITEMS_PER_CALL])
def test_prefix_pages_at_the_current_version_equal_one_seek_per_row(shard_env, limit):
    put(shard_env, *[f"a/{i}" for i in range(9)], *[f"b/{i}" for i in range(4)], "c", "a0")
    with shard_env.shard.read() as view:
        for prefix_path in ("a", "b", "c", "zz"):
            prefix = ROOT + subtree_prefix((prefix_path,))
            marker, pages = None, 0
            while True:
                page = scan_prefix(view, "path_current", prefix, start_after=marker, limit=limit)
                assert (list(page.items), page.next_marker) == _seek_each(view, "path_current", prefix, marker, limit)
                pages += 1
                if page.next_marker is None:
                    break
                marker = page.next_marker
        first = scan_prefix(view, "path_current", ROOT, limit=limit)  # lands on the tree's first row
        assert (list(first.items), first.next_marker) == _seek_each(view, "path_current", ROOT, None, limit)


@pytest.mark.parametrize("damaged", ["a/3", "a/0", "b/0"])
def test_a_prefix_scan_refuses_a_damaged_row_in_or_beside_its_range(shard_env, damaged):
    from nokvfs.errors import RowCorrupt

    put(shard_env, *[f"a/{i}" for i in range(5)], *[f"b/{i}" for i in range(2)])
    key = pkey(damaged)
    db = shard_env.shard._family_dbs["path_current"]
    with shard_env.shard._env.begin(write=True) as txn:
        stored = txn.get(key, db=db)
        txn.put(key, stored[:-1] + bytes([stored[-1] ^ 1]), db=db)  # one bit of the value flipped
    with shard_env.shard.read() as view:
        with pytest.raises(RowCorrupt):
            # a/3 inside the range, a/0 its first row, b/0 the row just past it
            scan_prefix(view, "path_current", ROOT + subtree_prefix(("a",)))
