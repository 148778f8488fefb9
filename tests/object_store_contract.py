"""The behaviour every ObjectStore backend must show, written once.

A backend's test module defines two fixtures and star-imports this module:

    store        a fresh, empty store
    other_store  a second, independent instance over the same storage as `store`

Multipart tests use 5 MiB parts (S3's minimum for all parts but the last). The `store` fixture of
a backend that uploads large files in parts must use a multipart threshold below 11 MiB so
`test_put_file_large_body_*` exercises it.
"""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from nokvfs.errors import InvalidInput, ObjectMissing, PreconditionFailed
from nokvfs.objects.store import MIN_PART_SIZE, ObjectInfo, StoreStats

PART = MIN_PART_SIZE


def _race(functions):
    """Run the callables at the same instant; return [(result or None, exception or None)]."""
    barrier = threading.Barrier(len(functions))
    outcomes = [None] * len(functions)

    def run(i, fn):
        barrier.wait()
        try:
            outcomes[i] = (fn(), None)
        except Exception as exc:  # collected and asserted by the caller
            outcomes[i] = (None, exc)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(functions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


# --- put / get / head / delete / list ---------------------------------------------------------


def test_put_then_get_returns_the_bytes_and_head_the_etag(store):
    etag = store.put("nokv/a/obj", b"hello world", metadata={"content-type": "text/plain"})
    assert store.get("nokv/a/obj") == b"hello world"
    info = store.head("nokv/a/obj")
    assert info == ObjectInfo(key="nokv/a/obj", size=11, etag=etag, metadata={"content-type": "text/plain"})
    assert etag and '"' not in etag


def test_ranged_get_returns_exactly_the_range_clipped_at_the_end(store):
    data = bytes(range(256)) * 4
    store.put("r", data)
    assert store.get("r", 0, 10) == data[:10]
    assert store.get("r", 100) == data[100:]
    assert store.get("r", 1000, 100) == data[1000:]
    assert store.get("r", 5, 0) == b""
    assert store.get("r", len(data)) == b""
    assert store.get("r", len(data), 7) == b""
    with pytest.raises(InvalidInput):
        store.get("r", len(data) + 1)
    with pytest.raises(InvalidInput):
        store.get("r", -1)
    with pytest.raises(InvalidInput):
        store.get("r", 0, -1)


def test_empty_object_round_trips(store):
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.get("empty", 0, 10) == b""
    assert store.head("empty").size == 0


def test_absent_object_is_missing_for_get_and_none_for_head(store):
    with pytest.raises(ObjectMissing):
        store.get("nope/never")
    with pytest.raises(ObjectMissing):
        store.get("nope/never", 3, 4)
    with pytest.raises(ObjectMissing):
        store.get("nope/never", 0, 0)
    assert store.head("nope/never") is None


def test_delete_removes_and_is_idempotent(store):
    store.put("d/x", b"1")
    store.delete("d/x")
    assert store.head("d/x") is None
    with pytest.raises(ObjectMissing):
        store.get("d/x")
    store.delete("d/x")
    store.delete("d/never")


def test_delete_many_removes_every_key_and_answers_each(store, other_store):
    keys = ["m/a/1", "m/a/2", "m/b/c/3", "m/keep"]
    for key in keys:
        store.put(key, key.encode())
    asked = ["m/a/1", "m/never", "m/b/c/3", "m/a/2", "m/a/1"]  # an absent key, a repeated one
    assert store.delete_many(asked) == [None] * len(asked)
    for key in ["m/a/1", "m/a/2", "m/b/c/3"]:
        assert store.head(key) is None and other_store.head(key) is None
    assert [i.key for i in store.list("m/")] == ["m/keep"]
    assert store.get("m/keep") == b"m/keep"
    assert store.delete_many([]) == []


def test_delete_many_refuses_a_bad_key_alone(store):
    store.put("n/1", b"1")
    store.put("n/2", b"2")
    results = store.delete_many(["n/1", "../escape", "n/2"])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], InvalidInput)
    assert list(store.list("n/")) == []


def test_delete_many_of_many_objects_in_many_directories(store):
    keys = [f"w/{n % 7}/{n}" for n in range(60)]
    store.put_many([(key, b"x") for key in keys])
    assert store.delete_many(keys[:45]) == [None] * 45
    assert sorted(i.key for i in store.list("w/")) == sorted(keys[45:])
    assert store.delete_many(keys) == [None] * 60
    assert list(store.list("")) == []


def test_put_many_tells_each_item_stored_and_not_one_refused(store):
    """`on_stored(index)` hears of every stored item exactly once (a caller waiting on a long
    batch sees it progress), and never of one refused."""
    import threading

    store.put("pm/taken", b"first")
    items = [(f"pm/{n}", bytes([n]) * 100) for n in range(5)] + [("pm/taken", b"second")]
    heard, lock = [], threading.Lock()

    def on_stored(index):
        with lock:
            heard.append(index)

    results = store.put_many(items, if_none_match=True, on_stored=on_stored)
    assert sorted(heard) == [0, 1, 2, 3, 4]
    assert isinstance(results[5], Exception) and all(isinstance(r, str) for r in results[:5])
    assert store.get("pm/3") == bytes([3]) * 100 and store.get("pm/taken") == b"first"


def test_unconditional_put_replaces_and_changes_the_etag(store):
    first = store.put("k", b"one")
    second = store.put("k", b"two")
    assert first != second
    assert store.get("k") == b"two"
    assert store.head("k").etag == second


def test_list_yields_prefix_matches_in_key_order_without_metadata(store):
    keys = ["p/a-c", "p/a/b", "p/a/a/z", "p/b", "p/ab", "q/x", "pz"]
    for key in keys:
        store.put(key, key.encode(), metadata={"m": "v"})
    listed = list(store.list("p/"))
    assert [i.key for i in listed] == sorted(k for k in keys if k.startswith("p/"))
    assert all(i.metadata == {} for i in listed)
    assert {i.key: i.size for i in listed}["p/a/b"] == 5
    assert {i.key: i.etag for i in listed}["p/b"] == store.head("p/b").etag
    assert [i.key for i in store.list("p/a")] == ["p/a-c", "p/a/a/z", "p/a/b", "p/ab"]
    assert [i.key for i in store.list("p/a/")] == ["p/a/a/z", "p/a/b"]
    assert [i.key for i in store.list("")] == sorted(keys)
    assert list(store.list("none/")) == []


def test_list_after_delete_no_longer_shows_the_key(store):
    store.put("l/1", b"1")
    store.put("l/2", b"2")
    store.delete("l/1")
    assert [i.key for i in store.list("l/")] == ["l/2"]


# --- conditional writes -----------------------------------------------------------------------


def test_if_none_match_creates_once_then_fails_and_keeps_the_first(store):
    etag = store.put("c/once", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("c/once", b"second", if_none_match=True)
    assert store.get("c/once") == b"first"
    assert store.head("c/once").etag == etag


def test_if_none_match_race_has_exactly_one_winner(store, other_store):
    contenders = [store, other_store] * 4
    outcomes = _race(
        [lambda s=s, i=i: s.put("race/key", b"v%d" % i, if_none_match=True) for i, s in enumerate(contenders)]
    )
    winners = [i for i, (etag, exc) in enumerate(outcomes) if exc is None]
    losers = [exc for _, exc in outcomes if exc is not None]
    assert len(winners) == 1
    assert all(isinstance(exc, PreconditionFailed) for exc in losers), losers
    assert store.get("race/key") == b"v%d" % winners[0]


def test_if_match_replaces_only_the_expected_version(store):
    first = store.put("m/obj", b"one")
    second = store.put("m/obj", b"two", if_match=first)
    assert store.get("m/obj") == b"two"
    with pytest.raises(PreconditionFailed):
        store.put("m/obj", b"three", if_match=first)
    assert store.get("m/obj") == b"two"
    assert store.head("m/obj").etag == second


def test_if_match_on_an_absent_key_fails(store):
    with pytest.raises(PreconditionFailed):
        store.put("m/absent", b"x", if_match="0123456789abcdef0123456789abcdef")
    assert store.head("m/absent") is None


def test_if_match_race_has_exactly_one_winner(store, other_store):
    base = store.put("m/race", b"base")
    contenders = [store, other_store] * 3
    outcomes = _race([lambda s=s, i=i: s.put("m/race", b"w%d" % i, if_match=base) for i, s in enumerate(contenders)])
    winners = [i for i, (_, exc) in enumerate(outcomes) if exc is None]
    assert len(winners) == 1
    assert all(isinstance(exc, PreconditionFailed) for _, exc in outcomes if exc is not None)
    assert store.get("m/race") == b"w%d" % winners[0]


def test_both_conditions_at_once_are_refused(store):
    with pytest.raises(InvalidInput):
        store.put("m/both", b"x", if_none_match=True, if_match="abc")


# --- argument checks --------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "/abs/key",
    "a//b",
    "a/../b",
    "..",
    ".",
    "a/./b",
    "trailing/",
    "back\\slash",
    "nul\x00byte",
    "new\nline",
    "a/.nokv-tmp-1234",
    ".nokv-multipart/x",
    "x" * 1025,
    None,
    b"bytes-key",
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_bad_keys_are_rejected_by_every_operation(store, key):
    for call in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.head(key),
        lambda: store.delete(key),
        lambda: store.create_multipart(key),
    ):
        with pytest.raises(InvalidInput):
            call()


@pytest.mark.parametrize("prefix", ["/abs", "a//", "../x", "a/../", ".nokv-multipart/"], ids=repr)
def test_bad_list_prefixes_are_rejected(store, prefix):
    with pytest.raises(InvalidInput):
        list(store.list(prefix))


@pytest.mark.parametrize(
    "metadata",
    [{"Upper": "x"}, {"k": "caf\u00e9"}, {"k": " padded"}, {"": "x"}, {"k": 1}, {"k": "x" * 3000}, ["k"]],
    ids=repr,
)
def test_metadata_both_backends_cannot_store_exactly_is_rejected(store, metadata):
    with pytest.raises(InvalidInput):
        store.put("meta/bad", b"x", metadata=metadata)
    assert store.head("meta/bad") is None


# --- multipart --------------------------------------------------------------------------------


def test_multipart_upload_id_comes_before_parts_and_completes_the_object(store):
    upload_id = store.create_multipart("mp/obj", metadata={"kind": "block"})
    assert isinstance(upload_id, str) and upload_id
    assert store.head("mp/obj") is None  # nothing is visible before completion
    one, two = os.urandom(PART), b"tail bytes"
    etag2 = store.upload_part("mp/obj", upload_id, 2, two)  # parts may arrive in any order
    etag1 = store.upload_part("mp/obj", upload_id, 1, one)
    assert store.head("mp/obj") is None
    etag = store.complete_multipart("mp/obj", upload_id, [(1, etag1), (2, etag2)])
    assert store.get("mp/obj") == one + two
    assert store.get("mp/obj", PART - 3, 6) == one[-3:] + two[:3]
    info = store.head("mp/obj")
    assert (info.size, info.etag, info.metadata) == (PART + len(two), etag, {"kind": "block"})


def test_multipart_part_reupload_replaces_the_part(store):
    upload_id = store.create_multipart("mp/re")
    store.upload_part("mp/re", upload_id, 1, b"a" * PART)
    etag1 = store.upload_part("mp/re", upload_id, 1, b"b" * PART)
    etag2 = store.upload_part("mp/re", upload_id, 2, b"end")
    store.complete_multipart("mp/re", upload_id, [(1, etag1), (2, etag2)])
    assert store.get("mp/re") == b"b" * PART + b"end"


def test_multipart_abort_discards_the_upload_and_is_idempotent(store):
    upload_id = store.create_multipart("mp/aborted")
    store.upload_part("mp/aborted", upload_id, 1, b"x" * 100)
    store.abort_multipart("mp/aborted", upload_id)
    assert store.head("mp/aborted") is None
    store.abort_multipart("mp/aborted", upload_id)
    assert list(store.list("mp/")) == []


def test_multipart_uploads_names_the_unfinished_uploads_to_exactly_one_key(store):
    first = store.create_multipart("mp/key")
    second = store.create_multipart("mp/key")
    store.create_multipart("mp/key2")  # a key it prefixes: not this key's
    store.create_multipart("mp/other")
    assert sorted(store.multipart_uploads("mp/key")) == sorted([first, second])
    store.abort_multipart("mp/key", first)
    assert store.multipart_uploads("mp/key") == [second]
    etag = store.upload_part("mp/key", second, 1, b"x")
    store.complete_multipart("mp/key", second, [(1, etag)])
    assert store.multipart_uploads("mp/key") == [] and store.get("mp/key") == b"x"
    assert store.multipart_uploads("mp/absent") == []


def test_multipart_small_non_last_part_is_refused(store):
    upload_id = store.create_multipart("mp/small")
    etag1 = store.upload_part("mp/small", upload_id, 1, b"x" * 1024)
    etag2 = store.upload_part("mp/small", upload_id, 2, b"y")
    with pytest.raises(InvalidInput):
        store.complete_multipart("mp/small", upload_id, [(1, etag1), (2, etag2)])
    assert store.head("mp/small") is None
    store.abort_multipart("mp/small", upload_id)


def test_multipart_wrong_part_etag_is_refused(store):
    upload_id = store.create_multipart("mp/etag")
    store.upload_part("mp/etag", upload_id, 1, b"x" * 10)
    with pytest.raises(InvalidInput):
        store.complete_multipart("mp/etag", upload_id, [(1, hashlib.md5(b"other").hexdigest())])
    assert store.head("mp/etag") is None
    store.abort_multipart("mp/etag", upload_id)


def test_multipart_parts_out_of_order_in_complete_are_refused(store):
    upload_id = store.create_multipart("mp/order")
    e1 = store.upload_part("mp/order", upload_id, 1, b"x" * PART)
    e2 = store.upload_part("mp/order", upload_id, 2, b"y")
    with pytest.raises(InvalidInput):
        store.complete_multipart("mp/order", upload_id, [(2, e2), (1, e1)])
    with pytest.raises(InvalidInput):
        store.complete_multipart("mp/order", upload_id, [])
    with pytest.raises(InvalidInput):
        store.upload_part("mp/order", upload_id, 0, b"x")
    with pytest.raises(InvalidInput):
        store.upload_part("mp/order", upload_id, 10_001, b"x")
    store.abort_multipart("mp/order", upload_id)


def test_multipart_complete_if_none_match_loses_to_an_existing_object(store):
    store.put("mp/taken", b"already here")
    upload_id = store.create_multipart("mp/taken")
    etag = store.upload_part("mp/taken", upload_id, 1, b"new")
    with pytest.raises(PreconditionFailed):
        store.complete_multipart("mp/taken", upload_id, [(1, etag)], if_none_match=True)
    assert store.get("mp/taken") == b"already here"
    store.abort_multipart("mp/taken", upload_id)


# --- put_file ---------------------------------------------------------------------------------


def test_put_file_small_body_round_trips(store, tmp_path):
    path = tmp_path / "small"
    path.write_bytes(b"file body" * 100)
    etag = store.put_file("f/small", path, metadata={"a": "b"})
    assert store.get("f/small") == b"file body" * 100
    assert store.head("f/small").etag == etag
    assert store.head("f/small").metadata == {"a": "b"}


def test_put_file_large_body_records_the_upload_before_any_part(store, tmp_path):
    body = os.urandom(2 * PART + 12345)
    path = tmp_path / "large"
    path.write_bytes(body)
    recorded = []

    def ledger(upload_id):
        assert store.head("f/large") is None
        recorded.append(upload_id)

    etag = store.put_file("f/large", path, if_none_match=True, on_multipart=ledger)
    assert len(recorded) <= 1  # a backend that never needs parts never calls it
    assert store.get("f/large") == body
    assert store.head("f/large").etag == etag
    with pytest.raises(PreconditionFailed):
        store.put_file("f/large", path, if_none_match=True)


def test_put_file_small_body_if_none_match_loses_to_an_existing_object(store, tmp_path):
    path = tmp_path / "small"
    path.write_bytes(b"new")
    store.put("f/exists", b"old")
    with pytest.raises(PreconditionFailed):
        store.put_file("f/exists", path, if_none_match=True)
    assert store.get("f/exists") == b"old"


def test_statfs_returns_store_stats(store):
    stats = store.statfs()
    assert isinstance(stats, StoreStats)
    for figure in (stats.total_bytes, stats.free_bytes, stats.used_bytes):
        assert figure is None or (isinstance(figure, int) and figure >= 0)


__all__ = [name for name in list(globals()) if name.startswith("test_")]
