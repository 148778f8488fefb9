"""The block cache (byte-bounded LRU, BLAKE3 re-verified on every hit, persistent) and the
verified block read path in front of the store."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import threading

import pytest

from nokvfs.errors import (
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    PreconditionFailed,
    StoreError,
)
from nokvfs.objects.blocks import (
    DEFAULT_BLOCK_SIZE,
    Block,
    BlockReader,
    BlockWriter,
    split_blocks,
)
from nokvfs.objects.cache import INDEX_NAME, BlockCache
from nokvfs.objects.keys import artifact_block_key, sha256_uri_of
from nokvfs.objects.local import LocalStore
from nokvfs.schema.ids import new_id16

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


@pytest.fixture
def cache(cache_dir):
    c = BlockCache(cache_dir, max_bytes=10_000)
    yield c
    c.close()


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "objects")


def _block(n: int, size: int = 1000) -> tuple[str, bytes]:
    data = hashlib.sha256(b"%d" % n).digest() * (size // 32) + b"\0" * (size % 32)
    return sha256_uri_of(data), data


def _entry_path(cache_dir, uri):
    hex_digest = uri.split(":", 1)[1]
    return os.path.join(cache_dir, hex_digest[:2], hex_digest)


def _key(index=0):
    return artifact_block_key(new_id16(), new_id16(), new_id16(), index)


# --- the cache on its own ---------------------------------------------------------------------


def test_put_then_get_hits_and_an_unknown_digest_misses(cache, cache_dir):
    uri, data = _block(1)
    assert cache.put(uri, data)
    assert cache.get(uri) == data
    assert cache.get(_block(2)[0]) is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.bytes, stats.entries) == (1, 1, 1000, 1)
    assert os.path.isfile(_entry_path(cache_dir, uri))


def test_bytes_that_do_not_match_the_digest_are_never_cached(cache):
    uri, data = _block(1)
    with pytest.raises(IntegrityError):
        cache.put(uri, data + b"x")
    assert cache.get(uri) is None
    assert cache.stats().entries == 0
    with pytest.raises(InvalidInput):
        cache.put("md5:abc", data)


def test_lru_eviction_keeps_the_total_within_the_byte_bound(cache, cache_dir):
    blocks = [_block(i, 3000) for i in range(4)]
    for uri, data in blocks[:3]:
        cache.put(uri, data)
    assert cache.get(blocks[0][0]) == blocks[0][1]  # block 0 is now the most recently used
    cache.put(*blocks[3])  # 12000 > 10000: the least recently used (block 1) goes
    stats = cache.stats()
    assert (stats.bytes, stats.entries, stats.evictions) == (9000, 3, 1)
    assert cache.get(blocks[1][0]) is None
    assert not os.path.exists(_entry_path(cache_dir, blocks[1][0]))
    for i in (0, 2, 3):
        assert cache.get(blocks[i][0]) == blocks[i][1]


def test_eviction_is_by_bytes_not_by_count(cache):
    big_uri, big = _block(100, 9000)
    small = [_block(i, 500) for i in range(4)]
    for uri, data in small:
        cache.put(uri, data)
    cache.put(big_uri, big)  # 2000 + 9000 > 10000: the two oldest small ones must go, no more
    stats = cache.stats()
    assert (stats.bytes, stats.entries, stats.evictions) == (10_000, 3, 2)
    assert [cache.get(uri) is not None for uri, _ in small] == [False, False, True, True]
    assert cache.get(big_uri) == big


def test_a_block_larger_than_the_cache_is_not_cached(cache):
    uri, data = _block(1, 20_000)
    assert cache.put(uri, data) is False
    assert cache.get(uri) is None and cache.stats().bytes == 0


def test_a_corrupted_cache_file_is_a_miss_and_is_dropped(cache, cache_dir):
    uri, data = _block(1)
    cache.put(uri, data)
    path = _entry_path(cache_dir, uri)
    with open(path, "r+b") as f:  # flip one bit, keep the size
        f.seek(500)
        byte = f.read(1)
        f.seek(500)
        f.write(bytes([byte[0] ^ 1]))
    assert cache.get(uri) is None
    stats = cache.stats()
    assert (stats.corrupt_drops, stats.entries, stats.bytes, stats.hits) == (1, 0, 0, 0)
    assert not os.path.exists(path)
    assert cache.put(uri, data) and cache.get(uri) == data  # a fresh copy is welcome again


def test_a_truncated_or_vanished_cache_file_is_a_miss(cache, cache_dir):
    (uri1, data1), (uri2, data2) = _block(1), _block(2)
    cache.put(uri1, data1)
    cache.put(uri2, data2)
    with open(_entry_path(cache_dir, uri1), "r+b") as f:
        f.truncate(10)
    os.unlink(_entry_path(cache_dir, uri2))
    assert cache.get(uri1) is None and cache.get(uri2) is None
    assert cache.stats().entries == 0


def test_cache_persists_across_instances_with_its_lru_order(cache_dir):
    blocks = [_block(i, 3000) for i in range(3)]
    first = BlockCache(cache_dir, max_bytes=10_000)
    for uri, data in blocks:
        first.put(uri, data)
    first.get(blocks[0][0])  # order, oldest first: 1, 2, 0
    first.close()
    assert os.path.isfile(cache_dir / INDEX_NAME)
    second = BlockCache(cache_dir, max_bytes=10_000)
    assert second.stats().entries == 3
    second.put(*_block(9, 3000))  # evicts block 1, the oldest before the restart
    assert second.get(blocks[1][0]) is None
    assert second.get(blocks[0][0]) == blocks[0][1] and second.get(blocks[2][0]) == blocks[2][1]
    second.close()


def test_cache_persisted_entry_corrupted_while_closed_is_caught_on_the_hit(cache_dir):
    uri, data = _block(1)
    with BlockCache(cache_dir, max_bytes=10_000) as c:
        c.put(uri, data)
    with open(_entry_path(cache_dir, uri), "r+b") as f:
        f.write(b"\xff" * 8)
    with BlockCache(cache_dir, max_bytes=10_000) as c:
        assert c.get(uri) is None
        assert c.stats().corrupt_drops == 1


def test_cache_rebuilds_after_a_crash_by_rehashing_with_sha256(cache_dir):
    good, bad = _block(1), _block(2)
    code = f"""
import os, sys
sys.path.insert(0, {REPO!r})
from nokvfs.objects.cache import BlockCache
c = BlockCache({str(cache_dir)!r}, max_bytes=10_000, index_every=1000)
c.put({good[0]!r}, {good[1]!r})
c.put({bad[0]!r}, {bad[1]!r})
os._exit(0)  # no close: the index never learns about these entries
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with open(_entry_path(cache_dir, bad[0]), "r+b") as f:
        f.write(b"rotten")
    with open(os.path.join(cache_dir, good[0].split(":")[1][:2], ".tmp-leftover"), "wb") as f:
        f.write(b"half a put")
    with BlockCache(cache_dir, max_bytes=10_000) as c:
        assert c.stats().entries == 1
        assert c.get(good[0]) == good[1]
        assert c.get(bad[0]) is None
    assert not os.path.exists(_entry_path(cache_dir, bad[0]))
    assert not os.path.exists(os.path.join(cache_dir, good[0].split(":")[1][:2], ".tmp-leftover"))


def test_a_smaller_bound_on_reopen_evicts_down_to_it(cache_dir):
    with BlockCache(cache_dir, max_bytes=10_000) as c:
        for i in range(3):
            c.put(*_block(i, 3000))
    with BlockCache(cache_dir, max_bytes=4000) as c:
        assert c.stats().entries == 1 and c.stats().bytes == 3000


def test_one_cache_directory_has_one_owner(cache, cache_dir):
    with pytest.raises(StoreError, match="in use"):
        BlockCache(cache_dir, max_bytes=10_000)


def test_concurrent_use_keeps_the_bound_and_never_returns_wrong_bytes(cache_dir):
    blocks = [_block(i, 700) for i in range(40)]
    errors = []
    with BlockCache(cache_dir, max_bytes=10_000) as c:

        def worker(offset):
            try:
                for round_ in range(30):
                    uri, data = blocks[(offset + round_ * 7) % len(blocks)]
                    c.put(uri, data)
                    got = c.get(uri)
                    assert got is None or got == data
                    assert c.stats().bytes <= 10_000
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        stats = c.stats()
        assert stats.bytes <= 10_000
        assert stats.bytes == sum(os.path.getsize(_entry_path(cache_dir, uri)) for uri, _ in blocks if uri in c)


# --- the verified read path -------------------------------------------------------------------


def test_read_block_verifies_then_caches_and_serves_later_reads_from_the_cache(store, cache):
    uri, data = _block(1)
    key = _key()
    store.put(key, data)
    reader = BlockReader(store, cache)
    assert reader.read_block(key, uri, len(data)) == data
    assert uri in cache
    store.delete(key)  # the next read must not need the store
    assert reader.read_block(key, uri, len(data)) == data
    assert cache.stats().hits == 1


def test_a_store_object_with_the_wrong_sha256_is_an_integrity_error_naming_the_key(store, cache):
    uri, data = _block(1)
    key = _key()
    store.put(key, data[:-1] + b"\x01")  # same length, different bytes
    reader = BlockReader(store, cache)
    with pytest.raises(IntegrityError, match=key):
        reader.read_block(key, uri, len(data))
    assert uri not in cache


@pytest.mark.parametrize("stored_length", [999, 1001])
def test_a_store_object_of_the_wrong_length_is_an_integrity_error(store, stored_length):
    uri, data = _block(1)
    key = _key()
    store.put(key, (data * 2)[:stored_length])
    with pytest.raises(IntegrityError, match=key):
        BlockReader(store).read_block(key, uri, len(data))


def test_a_missing_block_object_is_object_missing(store, cache):
    uri, data = _block(1)
    with pytest.raises(ObjectMissing):
        BlockReader(store, cache).read_block(_key(), uri, len(data))


def test_a_corrupt_cache_entry_falls_back_to_the_store_and_never_returns_corrupt_bytes(store, cache, cache_dir):
    uri, data = _block(1)
    key = _key()
    store.put(key, data)
    reader = BlockReader(store, cache)
    reader.read_block(key, uri, len(data))
    with open(_entry_path(cache_dir, uri), "r+b") as f:
        f.write(b"garbage!")
    assert reader.read_block(key, uri, len(data)) == data
    assert cache.stats().corrupt_drops == 1
    assert cache.get(uri) == data  # re-cached from the verified store copy


def test_a_manifest_length_that_contradicts_a_cached_digest_is_an_integrity_error(store, cache):
    uri, data = _block(1)
    cache.put(uri, data)
    with pytest.raises(IntegrityError):
        BlockReader(store, cache).read_block(_key(), uri, len(data) + 1)


def test_read_range_slices_the_verified_block(store, cache):
    uri, data = _block(1)
    key = _key()
    store.put(key, data)
    reader = BlockReader(store, cache)
    assert reader.read_range(key, uri, len(data), 10, 20) == data[10:30]
    assert reader.read_range(key, uri, len(data), 990, 100) == data[990:]
    assert reader.read_range(key, uri, len(data), len(data), 5) == b""
    assert reader.read_range(key, uri, len(data), 3, 0) == b""
    with pytest.raises(InvalidInput):
        reader.read_range(key, uri, len(data), len(data) + 1, 1)
    store.put(key, b"x" * len(data))  # a corrupt store copy is caught on a range read too
    with pytest.raises(IntegrityError):
        BlockReader(store).read_range(key, uri, len(data), 0, 1)


# --- cutting and writing blocks ---------------------------------------------------------------


class _Trickle(io.RawIOBase):
    """A file object that hands out at most 7 bytes per read."""

    def __init__(self, data):
        self._data = io.BytesIO(data)

    def readable(self):
        return True

    def read(self, n=-1):
        return self._data.read(min(7, n if n >= 0 else 7))


def test_split_blocks_cuts_full_blocks_whatever_the_reads_deliver():
    body = os.urandom(2500)
    blocks = list(split_blocks(_Trickle(body), 1000))
    assert [(b.index, len(b.data)) for b in blocks] == [(0, 1000), (1, 1000), (2, 500)]
    assert b"".join(b.data for b in blocks) == body
    assert all(b.sha256 == hashlib.sha256(b.data).digest() for b in blocks)
    index, data, digest = blocks[0]  # a block unpacks as (index, bytes, sha256 digest)
    assert blocks[0].digest_uri == sha256_uri_of(data)
    assert list(split_blocks(io.BytesIO(b""), 1000)) == []
    assert [len(b.data) for b in split_blocks(io.BytesIO(b"x" * 2000), 1000)] == [1000, 1000]
    assert DEFAULT_BLOCK_SIZE == 4 * 1024 * 1024
    with pytest.raises(InvalidInput):
        list(split_blocks(io.BytesIO(b"x"), 0))


def test_block_writer_creates_each_key_once_and_warms_the_cache(store, cache):
    writer = BlockWriter(store, cache)
    [block] = list(split_blocks(io.BytesIO(b"payload" * 100), 4096))
    key = _key(block.index)
    writer.write_block(key, block)
    assert store.get(key) == block.data and block.digest_uri in cache
    with pytest.raises(PreconditionFailed):
        writer.write_block(key, Block(0, b"other", hashlib.sha256(b"other").digest()))
    assert BlockReader(store).read_block(key, block.digest_uri, len(block.data)) == block.data


# --- filling in the background (a mount's readers) ---------------------------------------------


def _digest(uri: str) -> bytes:
    return bytes.fromhex(uri.split(":", 1)[1])


def test_put_later_is_written_by_close_at_the_latest_and_survives_reopen(cache_dir):
    cache = BlockCache(cache_dir, max_bytes=10_000)
    blocks = [_block(n) for n in range(3)]
    for uri, data in blocks:
        cache.put_later(_digest(uri), data)
    cache.close()
    reopened = BlockCache(cache_dir, max_bytes=10_000)
    try:
        for uri, data in blocks:
            assert reopened.get(uri) == data
    finally:
        reopened.close()


def test_put_later_drops_blocks_beyond_the_waiting_bound(cache_dir):
    cache = BlockCache(cache_dir, max_bytes=10_000)
    try:
        cache.pending_bytes_max = 1500
        release = threading.Event()
        original = cache.put_checked

        def slow_put(digest, data):  # the filler thread is busy until released
            release.wait(10)
            return original(digest, data)

        cache.put_checked = slow_put
        (first_uri, first), (second_uri, second), (third_uri, third) = (_block(n) for n in range(3))
        cache.put_later(_digest(first_uri), first)
        cache.put_later(_digest(first_uri), first)  # already waiting: not queued twice
        cache.put_later(_digest(second_uri), second)  # 2000 bytes would wait: not cached
        release.set()
    finally:
        cache.close()
    reopened = BlockCache(cache_dir, max_bytes=10_000)
    try:
        assert reopened.get(first_uri) == first
        assert reopened.get(second_uri) is None
        assert reopened.stats().entries == 1
    finally:
        reopened.close()


def test_a_reader_filling_in_the_background_returns_verified_bytes_and_caches_only_them(cache_dir, store):
    cache = BlockCache(cache_dir, max_bytes=10_000)
    reader = BlockReader(store, cache)
    reader.fill_in_background = True
    uri, data = _block(7)
    wrong_uri = _block(8)[0]
    key = _key()
    store.put(key, data)
    try:
        assert reader.read_block(key, uri, len(data)) == data
        with pytest.raises(IntegrityError):
            reader.read_block(key, wrong_uri, len(data))
    finally:
        cache.close()
    assert os.path.isfile(_entry_path(cache_dir, uri))
    assert not os.path.exists(_entry_path(cache_dir, wrong_uri))
