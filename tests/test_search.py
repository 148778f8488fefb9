"""Typed index fields written with publication, and equality/range search with frozen cursors."""

from __future__ import annotations

import datetime

import pytest

from nokvfs.errors import IndexValueInvalid, InvalidInput, ReadVersionStale
from nokvfs.schema import index_codec
from nokvfs.workspace import index, namespace
from tests.workspace_helpers import opened_root


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("w", "other")) as r:
        yield r


def put(root, path, wb="w", **values):
    return namespace.put(root, wb, path, b"x", index_fields=index.fields(values))


def paths(page):
    return [h.path for h in page.hits]


def test_index_fields_are_stored_in_the_path_entry_and_found_by_equality(root):
    entry = put(root, "outputs/a", run=7, label="train", score=0.5)
    assert {k: v.value for k, v in index.decoded(entry).items()} == {"run": 7, "label": "train", "score": 0.5}
    put(root, "outputs/b", run=8, label="eval")
    put(root, "outputs/c", run=7, label="eval")
    assert paths(index.search(root, "w", "run", equals=7)) == ["outputs/a", "outputs/c"]
    assert paths(index.search(root, "w", "label", equals="eval")) == ["outputs/b", "outputs/c"]
    assert paths(index.search(root, "w", "label", equals="nothing")) == []


def test_ranges_follow_value_order_not_byte_order_of_text(root):
    for n in (-5, 0, 3, 10, 200, 2**40):
        put(root, f"outputs/n{n}", n=n)
    assert paths(index.search(root, "w", "n", lower=0, upper=200)) == ["outputs/n0", "outputs/n3", "outputs/n10"]
    assert paths(index.search(root, "w", "n", lower=3, include_lower=False)) == [
        "outputs/n10",
        "outputs/n200",
        f"outputs/n{2**40}",
    ]
    assert paths(index.search(root, "w", "n", upper=0, include_upper=True)) == ["outputs/n-5", "outputs/n0"]


def test_timestamps_and_floats_are_typed(root):
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    put(root, "logs/early", at=t0, loss=0.25)
    put(root, "logs/late", at=t0 + datetime.timedelta(days=1), loss=-1.5)
    assert paths(index.search(root, "w", "at", lower=t0 + datetime.timedelta(hours=1))) == ["logs/late"]
    assert paths(index.search(root, "w", "loss", upper=0.0)) == ["logs/late"]
    with pytest.raises(IndexValueInvalid):
        index.fields({"loss": float("nan")})
    with pytest.raises(IndexValueInvalid):
        index.fields({"loss": float("inf")})


def test_replacing_or_removing_a_file_moves_its_index_rows(root):
    put(root, "outputs/a", stage="raw")
    put(root, "outputs/a", stage="clean")
    assert paths(index.search(root, "w", "stage", equals="raw")) == []
    assert paths(index.search(root, "w", "stage", equals="clean")) == ["outputs/a"]
    namespace.rename(root, "w", "outputs/a", "outputs/b")
    assert paths(index.search(root, "w", "stage", equals="clean")) == ["outputs/b"]
    namespace.remove(root, "w", "outputs/b")
    assert paths(index.search(root, "w", "stage", equals="clean")) == []


def test_search_is_scoped_to_the_workbench(root):
    put(root, "outputs/mine", k=1)
    put(root, "outputs/theirs", wb="other", k=1)
    assert paths(index.search(root, "w", "k", equals=1)) == ["outputs/mine"]
    assert paths(index.search(root, "other", "k", equals=1)) == ["outputs/theirs"]


def test_cursors_are_frozen_to_the_query_and_the_read_version(root):
    for i in range(7):
        put(root, f"outputs/f{i}", k=i)
    seen, cursor = [], None
    while True:
        page = index.search(root, "w", "k", lower=0, cursor=cursor, limit=3)
        seen += paths(page)
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == [f"outputs/f{i}" for i in range(7)]
    page = index.search(root, "w", "k", lower=0, limit=2)
    with pytest.raises(InvalidInput, match="another search"):
        index.search(root, "w", "k", lower=1, cursor=page.cursor)
    put(root, "outputs/late", k=99)
    with pytest.raises(ReadVersionStale):
        index.search(root, "w", "k", lower=0, cursor=page.cursor)


def test_explicit_index_values_and_bad_field_names(root):
    put(root, "outputs/u", big=index_codec.uint(2**63 + 5))
    assert paths(index.search(root, "w", "big", equals=index_codec.uint(2**63 + 5))) == ["outputs/u"]
    for bad in ("", "a\x00b", "x" * 256, "tab\there"):
        with pytest.raises(IndexValueInvalid):
            index.fields({bad: 1})
    with pytest.raises(IndexValueInvalid):
        index.search(root, "w", "", equals=1)
    with pytest.raises(InvalidInput):
        index.search(root, "w", "k", equals=1, lower=0)
