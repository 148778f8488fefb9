"""The local-directory object store: the shared contract, plus what only a directory can show
(crash atomicity, a real full filesystem, the on-disk layout), and the physical key scheme."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from nokvfs.errors import (
    IdInvalid,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    PreconditionFailed,
    StoreError,
    StoreFull,
)
from nokvfs.objects.keys import (
    artifact_block_key,
    artifact_revision_prefix,
    parse_artifact_block_key,
    parse_sha256_uri,
    sha256_uri,
    sha256_uri_of,
)
from nokvfs.objects.local import LocalStore
from nokvfs.objects.store import open_store

pytest.register_assert_rewrite("tests.object_store_contract")
from tests.object_store_contract import *  # noqa: E402, F403 - the shared behaviour tests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def store(tmp_path):
    with LocalStore(tmp_path / "store") as s:
        yield s


@pytest.fixture
def other_store(store):
    with LocalStore(store.root) as s:
        yield s


def _files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def _temp_files(root):
    return [f for f in _files_under(root) if os.path.basename(f).startswith(".nokv-tmp-")]


# --- layout -----------------------------------------------------------------------------------


def test_object_is_a_file_at_its_key_path_with_the_body_first(store):
    body = b"block bytes" * 100
    store.put("nokv/artifacts/x/blocks/0000000000000000", body)
    path = os.path.join(store.root, "nokv", "artifacts", "x", "blocks", "0000000000000000")
    with open(path, "rb") as f:
        assert f.read(len(body)) == body
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/x/blocks/0000000000000000"]


def test_object_file_bytes_are_the_documented_trailer_with_an_xxh3_etag(store):
    """Golden bytes: body | json | u32_be(len(json)) | b"NOKVOBJ1", the etag "xxh3-" + hex XXH3-128."""
    etag = store.put("golden/object", b"hello", metadata={"k": "v"})
    assert etag == "xxh3-b5e9c1ad071b3e7fc779cfaa5e523818"
    trailer = b'{"etag":"xxh3-b5e9c1ad071b3e7fc779cfaa5e523818","metadata":{"k":"v"},"size":5,"v":1}'
    with open(os.path.join(store.root, "golden", "object"), "rb") as f:
        assert f.read() == b"hello" + trailer + len(trailer).to_bytes(4, "big") + b"NOKVOBJ1"
    assert store.head("golden/object").etag == etag
    assert store.stage_put(b"hello").commit("golden/staged") == etag


def test_an_object_written_with_its_sha256_has_it_in_the_trailer_golden_bytes(store):
    """Golden bytes: "sha256" (64 lowercase hex) sits between "metadata" and "size" (sorted keys);
    every write call keeps it, and a reopened store vouches for it."""
    import hashlib

    digest = hashlib.sha256(b"hello").digest()
    etag = store.put("golden/vouched", b"hello", content_sha256=digest)
    assert etag == "xxh3-b5e9c1ad071b3e7fc779cfaa5e523818"
    trailer = (
        b'{"etag":"xxh3-b5e9c1ad071b3e7fc779cfaa5e523818","metadata":{},'
        b'"sha256":"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824","size":5,"v":1}'
    )
    with open(os.path.join(store.root, "golden", "vouched"), "rb") as f:
        assert f.read() == b"hello" + trailer + len(trailer).to_bytes(4, "big") + b"NOKVOBJ1"
    store.stage_put(b"hello", content_sha256=digest).commit("golden/staged")
    store.stage_put([b"he", b"llo"], key_hint="golden/pieces", content_sha256=digest).commit("golden/pieces")
    assert store.put_many([("golden/many", b"hello"), ("golden/plain", b"hello")], content_sha256s=[digest, None]) == [
        etag,
        etag,
    ]
    reopened = LocalStore(store.root)
    for key in ("golden/vouched", "golden/staged", "golden/pieces", "golden/many"):
        assert reopened.get_vouched(key, 6) == (b"hello", digest), key
        assert reopened.head(key).etag == etag and reopened.get(key) == b"hello"
    # Written without one, or read short of its end: nothing is vouched for.
    assert reopened.get_vouched("golden/plain", 6) == (b"hello", None)
    assert store.put("golden/plain2", b"hello") == etag and reopened.get_vouched("golden/plain2", 5) == (b"hello", None)
    assert reopened.get_vouched("golden/vouched", 4) == (b"hell", None)
    with pytest.raises(InvalidInput, match="content_sha256"):
        store.put("golden/bad", b"hello", content_sha256=digest.hex())
    with pytest.raises(InvalidInput, match="content_sha256"):
        store.stage_put(b"hello", content_sha256=digest[:31])
    assert isinstance(store.put_many([("golden/bad", b"hello")], content_sha256s=[b"short"])[0], InvalidInput)
    assert store.head("golden/bad") is None
    with pytest.raises(ObjectMissing):
        store.get_vouched("golden/absent", 5)


def _rewrite_trailer(path, change):
    """Rewrite the JSON trailer of the object file at `path` with `change(fields)` applied."""
    import json

    with open(path, "rb") as f:
        raw = f.read()
    length = int.from_bytes(raw[-12:-8], "big")
    body, fields = raw[: -12 - length], json.loads(raw[-12 - length : -12])
    change(fields)
    trailer = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(body + trailer + len(trailer).to_bytes(4, "big") + b"NOKVOBJ1")


def test_a_vouched_sha256_is_given_only_for_bytes_unchanged_since_they_were_written(store):
    """The store vouches after checking the body's XXH3-128 against its etag: a changed body is
    given back with nothing vouched for (the reader then hashes it and finds the damage)."""
    import hashlib

    body = os.urandom(100_000)
    digest = hashlib.sha256(body).digest()
    store.put("v/obj", body, content_sha256=digest)
    path = os.path.join(store.root, "v", "obj")
    assert store.get_vouched("v/obj", len(body) + 1) == (body, digest)
    with open(path, "r+b") as f:
        f.seek(5000)
        f.write(bytes([body[5000] ^ 1]))
    data, vouched = store.get_vouched("v/obj", len(body) + 1)
    assert vouched is None and data != body and len(data) == len(body)


def test_a_trailer_sha256_that_is_not_64_lowercase_hex_is_an_integrity_error_and_unknown_keys_are_ignored(store):
    import hashlib

    digest = hashlib.sha256(b"hello").digest()
    path = os.path.join(store.root, "t", "obj")
    for bad in (digest.hex().upper(), digest.hex()[:63], 7, None, ["x"], digest.hex() + "00"):
        store.delete("t/obj")
        store.put("t/obj", b"hello", content_sha256=digest)
        _rewrite_trailer(path, lambda fields, bad=bad: fields.update(sha256=bad))
        with pytest.raises(IntegrityError, match="malformed trailer"):
            store.get_vouched("t/obj", 5)
        with pytest.raises(IntegrityError, match="malformed trailer"):
            store.head("t/obj")
    # A key this version does not know is ignored (a later version may add one).
    store.delete("t/obj")
    store.put("t/obj", b"hello", content_sha256=digest)
    _rewrite_trailer(path, lambda fields: fields.update(zz_later="anything"))
    assert store.get_vouched("t/obj", 5) == (b"hello", digest) and store.get("t/obj") == b"hello"


def test_a_block_of_zeros_is_stored_as_a_hole_with_the_same_bytes_and_etag(store):
    """A sparse file's zero blocks take no disk space in the store (the object file has a hole
    where the zeros go), and everything read or compared is what writing them out would give."""
    import xxhash

    zeros = bytes(4 << 20)
    etag = store.put("sparse/zeros", zeros, metadata={"k": "v"})
    assert etag == "xxh3-" + xxhash.xxh3_128(zeros).hexdigest()
    path = os.path.join(store.root, "sparse", "zeros")
    trailer = ('{"etag":"%s","metadata":{"k":"v"},"size":%d,"v":1}' % (etag, len(zeros))).encode()
    with open(path, "rb") as f:
        assert f.read() == zeros + trailer + len(trailer).to_bytes(4, "big") + b"NOKVOBJ1"
    assert os.stat(path).st_blocks * 512 < 1 << 20  # a hole, not 4 MiB of written zeros
    assert store.get("sparse/zeros") == zeros and store.get("sparse/zeros", 1000, 10) == bytes(10)
    assert store.head("sparse/zeros").etag == etag and store.head("sparse/zeros").size == len(zeros)
    # Bytes that are not all zeros are written out, wherever the non-zero byte is.
    for at in (0, len(zeros) // 2, len(zeros) - 1):
        body = bytearray(zeros)
        body[at] = 7
        store.put(f"sparse/one-{at}", bytes(body))
        assert store.get(f"sparse/one-{at}") == bytes(body)
    staged = store.stage_put(zeros)
    assert staged.commit("sparse/staged") == etag and store.get("sparse/staged") == zeros
    assert os.stat(os.path.join(store.root, "sparse", "staged")).st_blocks * 512 < 1 << 20


def _write_legacy_object(store, key, body):
    """An object file as the store wrote it before 2026-12-04: the etag the hex MD5 of the body."""
    import hashlib

    etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
    trailer = ('{"etag":"%s","metadata":{},"size":%d,"v":1}' % (etag, len(body))).encode()
    path = os.path.join(store.root, *key.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(body + trailer + len(trailer).to_bytes(4, "big") + b"NOKVOBJ1")
    return etag


def test_an_object_with_an_md5_etag_reads_and_is_replaced_under_if_match(store):
    etag = _write_legacy_object(store, "old/object", b"written by an older nokvfs")
    assert store.get("old/object") == b"written by an older nokvfs"
    assert store.head("old/object").etag == etag
    with pytest.raises(PreconditionFailed):
        store.put("old/object", b"new", if_match="xxh3-" + "0" * 32)
    new = store.put("old/object", b"new", if_match=etag)
    assert new.startswith("xxh3-") and store.get("old/object") == b"new"


def test_a_part_uploaded_with_an_md5_etag_completes_and_a_wrong_one_is_refused(store):
    import hashlib

    upload_id = store.create_multipart("mp/legacy")
    assert store.upload_part("mp/legacy", upload_id, 1, b"part one").startswith("xxh3-")
    legacy = hashlib.md5(b"part one", usedforsecurity=False).hexdigest()  # as an older version returned it
    with pytest.raises(InvalidInput):
        store.complete_multipart("mp/legacy", upload_id, [(1, hashlib.md5(b"other").hexdigest())])
    store.complete_multipart("mp/legacy", upload_id, [(1, legacy)])
    assert store.get("mp/legacy") == b"part one"


def test_delete_prunes_directories_it_left_empty(store):
    store.put("a/b/c/d", b"1")
    store.put("a/x", b"2")
    store.delete("a/b/c/d")
    assert not os.path.exists(os.path.join(store.root, "a", "b"))
    assert os.path.isdir(os.path.join(store.root, "a"))
    store.delete("a/x")
    assert not os.path.exists(os.path.join(store.root, "a"))
    assert os.path.isdir(store.root)


def test_delete_many_prunes_what_it_left_empty_and_fsyncs_each_directory_once(store, monkeypatch):
    keys = [f"a/r{n}/blocks/{b}" for n in range(20) for b in range(3)]
    store.put_many([(key, b"x") for key in keys] + [("a/keep", b"k"), ("z/1", b"1")])
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert store.delete_many(keys + ["z/1"]) == [None] * (len(keys) + 1)
    # Every r* directory went; the deletes are durable with one fsync of `a` and one of the root.
    assert sorted(synced) == sorted([os.path.join(store.root, "a"), store.root])
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "a/keep"]


def test_delete_many_answers_an_object_the_filesystem_will_not_delete_alone(store):
    from tests.workspace_helpers import undeletable

    keys = ["u/1", "u/2", "u/3"]
    store.put_many([(key, key.encode()) for key in keys])
    with undeletable(os.path.join(store.root, "u", "2")):
        results = store.delete_many(keys)
        assert results[0] is None and results[2] is None
        assert type(results[1]) is StoreError and "Operation not permitted" in str(results[1])
        assert store.get("u/2") == b"u/2"
    assert store.head("u/1") is None and store.head("u/3") is None
    assert store.delete_many(["u/2"]) == [None]
    assert not os.path.exists(os.path.join(store.root, "u"))


def test_key_that_would_nest_under_an_object_is_a_store_error(store):
    store.put("n/leaf", b"1")
    with pytest.raises(StoreError):
        store.put("n/leaf/child", b"2")
    store.put("m/dir/child", b"3")
    with pytest.raises(StoreError):
        store.put("m/dir", b"4")
    assert store.head("m/dir") is None
    with pytest.raises(ObjectMissing):
        store.get("m/dir")
    store.delete("m/dir")  # a directory is not an object: nothing to delete
    assert store.get("m/dir/child") == b"3"
    assert _temp_files(store.root) == []


def test_corrupt_object_file_is_an_integrity_error_naming_the_path(store):
    store.put("c/obj", b"x" * 100)
    path = os.path.join(store.root, "c", "obj")
    with open(path, "r+b") as f:
        f.truncate(50)
    with pytest.raises(IntegrityError, match="c/obj"):
        store.get("c/obj")
    with pytest.raises(IntegrityError):
        store.head("c/obj")
    with open(path, "wb") as f:
        f.write(b"not an object file at all")
    with pytest.raises(IntegrityError):
        store.get("c/obj")


def test_list_never_shows_temp_or_internal_files(store):
    store.put("l/a", b"1")
    upload_id = store.create_multipart("l/b")
    store.upload_part("l/b", upload_id, 1, b"x")
    with open(os.path.join(store.root, "l", ".nokv-tmp-deadbeef"), "wb") as f:
        f.write(b"partial")
    assert [i.key for i in store.list("")] == ["l/a"]


# --- crash atomicity --------------------------------------------------------------------------


def test_temp_file_never_renamed_leaves_no_object_at_the_key(store):
    store = LocalStore(store.root, unnamed_temps=False)  # a filesystem without O_TMPFILE: named temps
    fd, tmp, _, _ = store._write_temp([b"half of a block"], {})  # the write, never committed
    assert os.path.exists(tmp)
    with pytest.raises(ObjectMissing):
        store.get("t/obj")
    assert store.head("t/obj") is None
    assert list(store.list("")) == []
    assert store.remove_stale_temp_files(grace_seconds=0) == 0  # its writer still holds it
    os.close(fd)  # the writer is gone
    assert store.remove_stale_temp_files(grace_seconds=0) == 1
    assert _temp_files(store.root) == []


def test_unnamed_temp_file_never_linked_leaves_nothing(store):
    fd, tmp, _, _ = store._write_temp([b"half of a block"], {})  # O_TMPFILE: no name at all
    assert tmp is None and _temp_files(store.root) == []
    with pytest.raises(ObjectMissing):
        store.get("t/obj")
    assert list(store.list("")) == []
    os.close(fd)  # the writer is gone: the inode goes with its last descriptor
    assert store.remove_stale_temp_files(grace_seconds=0) == 0
    assert _temp_files(store.root) == [] and list(store.list("")) == []


def test_put_many_stores_each_object_and_reports_each_refusal(store):
    store.put("m/taken", b"first")
    results = store.put_many([("m/a", b"alpha"), ("m/taken", b"second"), ("m/b/c", b"gamma")], if_none_match=True)
    assert isinstance(results[0], str) and isinstance(results[2], str)
    assert isinstance(results[1], PreconditionFailed)
    assert store.get("m/a") == b"alpha" and store.get("m/taken") == b"first" and store.get("m/b/c") == b"gamma"
    assert _temp_files(store.root) == []


def _crash_during_put(root, key, data, *, unnamed=False):
    """Run a put in a child process that dies the instant before the temp file is published
    (named temps unless `unnamed`: those are the ones a crash can leave behind)."""
    code = f"""
import os, sys
sys.path.insert(0, {REPO!r})
from nokvfs.objects.local import LocalStore
store = LocalStore({str(root)!r}, unnamed_temps={unnamed!r})
real_replace = os.replace
def crash_on_publish(src, dst, *args, **kwargs):
    if os.path.basename(src).startswith(".nokv-tmp-"):
        os._exit(17)
    return real_replace(src, dst, *args, **kwargs)
os.replace = crash_on_publish
os.link = lambda *args, **kwargs: os._exit(17)
store.put({key!r}, {data!r})
"""
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode


def test_crash_before_rename_leaves_no_partial_new_object(store):
    assert _crash_during_put(store.root, "crash/new", b"z" * 100_000) == 17
    assert len(_temp_files(store.root)) == 1  # the child really wrote, then died
    with pytest.raises(ObjectMissing):
        store.get("crash/new")
    assert list(store.list("")) == []


def test_crash_before_rename_keeps_the_old_object_whole(store):
    store.put("crash/old", b"old version")
    assert _crash_during_put(store.root, "crash/old", b"new version" * 1000) == 17
    assert store.get("crash/old") == b"old version"
    assert [i.key for i in store.list("")] == ["crash/old"]


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replace"])
def test_crash_before_linking_an_unnamed_temp_leaves_nothing_and_the_old_object_whole(store, existing):
    if existing:
        store.put("crash/obj", b"old version")
    assert _crash_during_put(store.root, "crash/obj", b"new version" * 1000, unnamed=True) == 17
    assert _temp_files(store.root) == []  # the unnamed temp died with its writer
    assert [i.key for i in store.list("")] == (["crash/obj"] if existing else [])
    if existing:
        assert store.get("crash/obj") == b"old version"


# --- disk failures ----------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 1 MiB tmpfs (needs root); unmounted afterwards whatever happens."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def test_full_disk_is_store_full_and_leaves_nothing_behind(tiny_fs, tmp_path):
    store = LocalStore(tiny_fs / "store")
    store.put("keep/small", b"precious")
    with pytest.raises(StoreFull):
        store.put("big/obj", os.urandom(2 * 1024 * 1024))
    big = tmp_path / "big"
    big.write_bytes(os.urandom(2 * 1024 * 1024))
    with pytest.raises(StoreFull):
        store.put_file("big/file", big)
    upload_id = store.create_multipart("big/mp")
    with pytest.raises(StoreFull):
        store.upload_part("big/mp", upload_id, 1, os.urandom(2 * 1024 * 1024))
    store.abort_multipart("big/mp", upload_id)
    assert _temp_files(store.root) == []
    assert [i.key for i in store.list("")] == ["keep/small"]
    assert store.get("keep/small") == b"precious"
    store.put("after/full", b"fits again")  # the failed writes released their space
    assert store.get("after/full") == b"fits again"
    stats = store.statfs()
    assert stats.total_bytes == 1024 * 1024 and 0 <= stats.free_bytes <= stats.total_bytes


def test_io_error_is_store_error_naming_the_path(store, monkeypatch):
    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StoreError, match="Input/output error") as caught:
        store.put("eio/obj", b"x")
    assert not isinstance(caught.value, StoreFull)
    assert store.root in str(caught.value)
    monkeypatch.undo()
    assert _temp_files(store.root) == []
    assert store.head("eio/obj") is None


def test_read_io_error_is_store_error(store, monkeypatch):
    store.put("eio/read", b"abc")

    def failing_pread(fd, n, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pread", failing_pread)
    with pytest.raises(StoreError, match="eio/read"):
        store.get("eio/read")


# --- opening ----------------------------------------------------------------------------------


def test_reopening_a_store_sees_its_objects(store):
    store.put("persist/x", b"kept")
    assert LocalStore(store.root, create=False).get("persist/x") == b"kept"


def test_a_foreign_non_empty_directory_is_never_made_a_store(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="non-empty"):
        LocalStore(tmp_path / "home")
    with pytest.raises(StoreError):
        LocalStore(tmp_path / "missing", create=False)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ".nokv-store").write_text("{}")
    with pytest.raises(StoreError, match="marker"):
        LocalStore(tmp_path / "bad")


def test_open_store_accepts_file_urls_and_bare_paths(tmp_path, monkeypatch):
    assert isinstance(open_store(f"file://{tmp_path}/a"), LocalStore)
    assert open_store(f"file://{tmp_path}/a").root == str(tmp_path / "a")
    assert open_store(str(tmp_path / "b")).root == str(tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    assert open_store("relative/c").root == str(tmp_path / "relative" / "c")
    for bad in ("file://otherhost/x", "file:relative", "ftp://x/y", "", "s3://"):
        with pytest.raises(InvalidInput):
            open_store(bad)
    with pytest.raises(InvalidInput):
        open_store(str(tmp_path / "d"), endpoint_url="http://127.0.0.1:1")


# --- multipart specifics ----------------------------------------------------------------------


def test_complete_and_abort_exclude_each_other(store):
    upload_id = store.create_multipart("mpx/a")
    etag = store.upload_part("mpx/a", upload_id, 1, b"x")
    store.abort_multipart("mpx/a", upload_id)
    with pytest.raises(ObjectMissing):
        store.upload_part("mpx/a", upload_id, 2, b"y")
    with pytest.raises(ObjectMissing):
        store.complete_multipart("mpx/a", upload_id, [(1, etag)])
    assert store.head("mpx/a") is None

    upload_id = store.create_multipart("mpx/b")
    etag = store.upload_part("mpx/b", upload_id, 1, b"y")
    store.complete_multipart("mpx/b", upload_id, [(1, etag)])
    with pytest.raises(ObjectMissing):  # completion consumed the upload
        store.complete_multipart("mpx/b", upload_id, [(1, etag)])
    store.abort_multipart("mpx/b", upload_id)  # and abort after it changes nothing
    assert store.get("mpx/b") == b"y"
    assert os.listdir(os.path.join(store.root, ".nokv-multipart")) == []


def test_multipart_unknown_upload_is_missing(store):
    # (moto answers an unknown upload id with HTTP 500 instead of NoSuchUpload, so this part of
    # the contract is proven on the local store only.)
    with pytest.raises(ObjectMissing):
        store.upload_part("mp/unknown", "0123456789abcdef0123456789abcdef", 1, b"x")


def test_upload_ids_are_checked_against_their_key_and_form(store):
    upload_id = store.create_multipart("mpy/a")
    with pytest.raises(ObjectMissing):
        store.upload_part("mpy/other", upload_id, 1, b"x")
    for bad in ("../../etc", "", "ABC", upload_id.upper()):
        with pytest.raises(ObjectMissing):
            store.upload_part("mpy/a", bad, 1, b"x")
    store.abort_multipart("mpy/a", upload_id)


def test_put_file_never_uses_multipart_locally(store, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * 1024 * 1024))
    called = []
    store.put_file("pf/x", path, on_multipart=called.append)
    assert called == []
    assert store.get("pf/x") == path.read_bytes()


# --- physical keys and digest URIs ------------------------------------------------------------

SHARD = bytes.fromhex("0190f3a2b4c57d8e9f00112233445566")
ROOT = bytes.fromhex("0190f3a2b4c57d8e9f00112233445577")
REV = bytes.fromhex("0190f3a2b4c57d8e9f00112233445588")


def test_artifact_block_key_is_exactly_the_documented_form():
    key = artifact_block_key(SHARD, ROOT, REV, 0x2A)
    assert key == (
        "nokv/artifacts/0190f3a2b4c57d8e9f00112233445566/0190f3a2b4c57d8e9f00112233445577/"
        "0190f3a2b4c57d8e9f00112233445588/blocks/000000000000002a"
    )
    assert key.startswith(artifact_revision_prefix(SHARD, ROOT, REV))
    assert parse_artifact_block_key(key) == (SHARD, ROOT, REV, 0x2A)
    assert parse_artifact_block_key(artifact_block_key(SHARD, ROOT, REV, 2**64 - 1))[3] == 2**64 - 1


@pytest.mark.parametrize(
    "args",
    [
        (SHARD[:15], ROOT, REV, 0),
        (SHARD, ROOT + b"\0", REV, 0),
        (SHARD, ROOT, "rev", 0),
        (SHARD, ROOT, REV, -1),
        (SHARD, ROOT, REV, 2**64),
    ],
)
def test_artifact_block_key_checks_widths(args):
    with pytest.raises(IdInvalid):
        artifact_block_key(*args)


@pytest.mark.parametrize(
    "key",
    [
        artifact_block_key(SHARD, ROOT, REV, 1).upper(),
        artifact_block_key(SHARD, ROOT, REV, 1) + "/",
        artifact_block_key(SHARD, ROOT, REV, 1)[:-1],
        artifact_block_key(SHARD, ROOT, REV, 1).replace("/blocks/", "/block/"),
        "x" + artifact_block_key(SHARD, ROOT, REV, 1),
        "nokv/artifacts/a/b/c/blocks/0",
        None,
    ],
)
def test_parse_artifact_block_key_refuses_anything_else(key):
    with pytest.raises(InvalidInput):
        parse_artifact_block_key(key)


def test_sha256_uri_round_trips_and_refuses_malformed_uris():
    digest = bytes(range(32))
    uri = sha256_uri(digest)
    assert uri == "sha256:" + digest.hex()
    assert parse_sha256_uri(uri) == digest
    assert sha256_uri_of(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    for bad in (
        "sha256:" + digest.hex().upper(),
        "sha256:" + digest.hex()[:-1],
        "SHA256:" + digest.hex(),
        "blake3:" + digest.hex(),
        digest.hex(),
        None,
    ):
        with pytest.raises(InvalidInput):
            parse_sha256_uri(bad)
    with pytest.raises(InvalidInput):
        sha256_uri(digest[:31])


# --- temporary files of writers that are gone ----------------------------------------------------


def _age(path, seconds):
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_a_dead_writers_temp_is_swept_at_open_and_a_live_ones_is_kept(store):
    """Issue 13: temporary files older than any live writer are swept at open and by gc."""
    store = LocalStore(store.root, unnamed_temps=False)  # named temps: the ones a crash leaves
    assert _crash_during_put(store.root, "crash/new", b"z" * 100_000) == 17
    [dead] = [os.path.join(store.root, f) for f in _temp_files(store.root)]
    live_fd, live, _, _ = store._write_temp([b"a write still in progress"], {})
    try:
        young_fd, young, _, _ = store._write_temp([b"just created"], {})
        os.close(young_fd)  # its writer is gone too, but a moment ago: within the grace
        for path in (dead, live):
            _age(path, 2 * 3600)
        LocalStore(store.root).close()  # another process opening the store
        assert not os.path.exists(dead)
        assert os.path.exists(live) and os.path.exists(young)
    finally:
        os.close(live_fd)  # now that writer is gone too
    assert store.remove_stale_temp_files() == 1 and not os.path.exists(live)
    assert os.path.exists(young)  # unlocked, but younger than the grace
    _age(young, 120)
    assert store.remove_stale_temp_files() == 1
    assert _temp_files(store.root) == []


def test_temps_an_older_version_left_beside_their_keys_go_after_a_day_with_everywhere(store):
    store.put("k/obj", b"1")
    old, recent = (os.path.join(store.root, "k", f".nokv-tmp-{n}") for n in ("0ld", "recent"))
    for path in (old, recent):
        with open(path, "wb") as f:
            f.write(b"partial")
    _age(old, 2 * 86400)
    _age(recent, 3600)
    assert store.remove_stale_temp_files() == 0  # open only looks in the temp directory
    assert store.remove_stale_temp_files(everywhere=True) == 1
    assert not os.path.exists(old) and os.path.exists(recent)
    assert store.get("k/obj") == b"1"


# --- temps born in their key's directory --------------------------------------------------------


def _dirs_under(root):
    return sorted(
        os.path.relpath(os.path.join(d, name), root)
        for d, dirs, _ in os.walk(root)
        for name in dirs
        if not name.startswith(".nokv-")
    )


def test_a_staged_put_makes_its_key_directory_and_lands_even_if_a_delete_pruned_it(store):
    staged = store.stage_put(b"block", key_hint="r/rev1/blocks/0")
    assert _dirs_under(store.root) == ["r", "r/rev1", "r/rev1/blocks"]  # the temp lives there, unnamed
    # Deleting a key that is absent prunes its empty directory, the temp's home included.
    assert store.delete_many(["r/rev1/blocks/9"]) == [None]
    assert _dirs_under(store.root) == []
    staged.commit("r/rev1/blocks/0")  # the link makes the directories again
    assert store.get("r/rev1/blocks/0") == b"block"
    assert _temp_files(store.root) == []


def test_a_write_that_fails_or_is_discarded_leaves_no_key_directory(store, monkeypatch):
    store.put("keep/obj", b"1")
    store.stage_put(b"never committed", key_hint="gone/rev/blocks/0").discard()
    real_write = os.write

    def failing_write(fd, data):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(StoreError):
        store.put("broken/rev/blocks/0", b"lost")
    [result] = store.put_many([("many/rev/blocks/0", b"lost")])
    assert isinstance(result, StoreError)
    monkeypatch.setattr(os, "write", real_write)
    with pytest.raises(PreconditionFailed):
        store.put("refused/rev/blocks/0", b"no", if_match="0" * 32)  # nothing there to match
    assert _dirs_under(store.root) == ["keep"]


def test_empty_key_directories_a_crash_left_go_after_a_day_with_everywhere(store):
    store.put("k/rev0/blocks/0", b"1")
    for name in ("old", "recent"):
        os.makedirs(os.path.join(store.root, "k", name, "blocks"))
    for path in ("k/old/blocks", "k/old", "k/recent/blocks", "k/recent"):
        _age(os.path.join(store.root, path), 2 * 86400 if "old" in path else 3600)
    assert store.remove_stale_temp_files() == 0
    assert _dirs_under(store.root) == [
        "k",
        "k/old",
        "k/old/blocks",
        "k/recent",
        "k/recent/blocks",
        "k/rev0",
        "k/rev0/blocks",
    ]
    store.remove_stale_temp_files(everywhere=True)
    assert _dirs_under(store.root) == ["k", "k/recent", "k/recent/blocks", "k/rev0", "k/rev0/blocks"]
    assert store.get("k/rev0/blocks/0") == b"1"


def test_the_whole_tree_walk_runs_at_most_once_an_hour_per_open_store(store, monkeypatch):
    """A mount's maintenance collects every few minutes; the walk finds only day-old leftovers."""
    old = os.path.join(store.root, "k", ".nokv-tmp-0ld")
    os.makedirs(os.path.dirname(old))
    walks = []
    real_walk = os.walk
    monkeypatch.setattr(os, "walk", lambda *a, **k: walks.append(a) or real_walk(*a, **k))
    for _ in range(3):
        store.remove_stale_temp_files(everywhere=True)
    assert len(walks) == 1
    with open(old, "wb") as f:
        f.write(b"partial")
    _age(old, 2 * 86400)
    monkeypatch.setattr(store, "_walked_at", time.monotonic() - 3601)
    assert store.remove_stale_temp_files(everywhere=True) == 1
    assert len(walks) == 2 and not os.path.exists(old)
