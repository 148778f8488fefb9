"""Reading bodies through their manifests: ranges across blocks, and what a damaged store does.

A block whose bytes do not match the manifest's SHA-256 is IntegrityError and no bytes are
returned; an absent block is ObjectMissing; a corrupt cache entry is never served.
"""

from __future__ import annotations

import os

import pytest

from nokvfs.errors import IntegrityError, InvalidInput, ObjectMissing
from nokvfs.workspace import namespace, reading
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    BLOCK,
    WB,
    bench_fixture,
    block_keys,
    body,
    data_dir_fixture,
    entry,
    flip_byte,
    get_bytes,
    local_object_path,
    root_fixture,
    root_holder_fixture,
)

DATA = body(4 * BLOCK + 123, "read")


@pytest.fixture
def published(bench):
    found = namespace.put(bench, WB, "outputs/blob", DATA)
    return bench, found


@pytest.mark.parametrize(
    "offset, size",
    [
        (0, None),
        (0, 1),
        (1, BLOCK),
        (BLOCK - 1, 2),
        (BLOCK, BLOCK),
        (3 * BLOCK + 7, 10**9),
        (len(DATA) - 1, 5),
        (len(DATA), 10),
        (len(DATA) + 50, 10),
        (17, 0),
    ],
)
def test_ranges(published, offset, size):
    root, found = published
    expected = DATA[offset:] if size is None else DATA[offset : offset + size]
    assert reading.read(root, found, offset, size) == expected


def test_negative_ranges_are_invalid(published):
    root, found = published
    with pytest.raises(InvalidInput):
        reading.read(root, found, -1, 4)
    with pytest.raises(InvalidInput):
        reading.read(root, found, 0, -4)


@pytest.mark.block_cache
@pytest.mark.damages_store("corrupts a block")
def test_a_corrupt_block_is_integrity_error_and_returns_no_bytes(data_dir, published):
    root, found = published
    key = block_keys(root, found.artifact_revision_id, 5)[2]
    flip_byte(local_object_path(data_dir, key), 100)
    with pytest.raises(IntegrityError):
        reading.read(root, found)
    with pytest.raises(IntegrityError):
        reading.read(root, found, 2 * BLOCK + 100, 1)  # only the damaged byte's block
    with pytest.raises(IntegrityError):
        b"".join(reading.iter_body(root, found))
    # Ranges that do not touch the damaged block still read (each block is verified alone).
    assert reading.read(root, found, 0, 2 * BLOCK) == DATA[: 2 * BLOCK]
    assert reading.read(root, found, 3 * BLOCK, None) == DATA[3 * BLOCK :]
    # The damaged bytes never entered the cache.
    assert root.blocks.cache.get(root.manifests.get(root, found.artifact_revision_id)[1][2].digest_uri) is None


@pytest.mark.damages_store("truncates and extends blocks")
def test_a_truncated_or_overlong_block_is_integrity_error(data_dir, published):
    root, found = published
    keys_ = block_keys(root, found.artifact_revision_id, 5)
    root.store.put(keys_[1], DATA[BLOCK : 2 * BLOCK - 1])  # one byte short
    root.store.put(keys_[3], DATA[3 * BLOCK : 4 * BLOCK] + b"!")  # one byte long
    with pytest.raises(IntegrityError):
        reading.read(root, found, BLOCK, 1)
    with pytest.raises(IntegrityError):
        reading.read(root, found, 3 * BLOCK, 1)


@pytest.mark.damages_store("deletes a block")
def test_a_missing_block_is_object_missing(data_dir, published):
    root, found = published
    key = block_keys(root, found.artifact_revision_id, 5)[4]
    os.unlink(local_object_path(data_dir, key))
    with pytest.raises(ObjectMissing):
        reading.read(root, found)
    assert reading.read(root, found, 0, BLOCK) == DATA[:BLOCK]


def _manifest_rows(root, found):
    return root.manifests.get(root, found.artifact_revision_id)[1]


def test_every_way_a_publication_writes_a_block_locally_keeps_its_sha256_for_reads(bench):
    """One block (staged while `begin` commits), several blocks (put one by one), a group
    (put_many): the local store vouches for each block's manifest digest when it is read back."""
    from nokvfs.objects.keys import parse_sha256_uri
    from nokvfs.schema.paths import normalize_path
    from nokvfs.workspace import body as bodies
    from nokvfs.workspace import publish

    found = [namespace.put(bench, WB, "outputs/one", b"one block"), namespace.put(bench, WB, "outputs/many", DATA)]
    group = {f"outputs/g{n}": body(2 * BLOCK + 1 + n, f"g{n}") for n in range(3)}
    found += publish.run_group(
        bench,
        [
            namespace.publication(WB, normalize_path(path), bodies.from_bytes(payload, BLOCK), expected_generation=0)
            for path, payload in group.items()
        ],
    )
    rows = [row for entry_ in found for row in _manifest_rows(bench, entry_)]
    assert len(rows) == 1 + 5 + 3 * 3
    for row in rows:
        data, vouched = bench.store.get_vouched(row.object_key, row.length + 1)
        assert len(data) == row.length and vouched == parse_sha256_uri(row.digest_uri), row.object_key


@pytest.mark.damages_store("flips a byte of a block")
def test_a_vouched_block_is_not_hashed_again_and_a_damaged_one_is_still_refused(data_dir, published, monkeypatch):
    from nokvfs.objects import blocks

    root, found = published
    hashed = []
    real = blocks.zeros.sha256_of
    monkeypatch.setattr(blocks.zeros, "sha256_of", lambda data: hashed.append(len(data)) or real(data))
    assert reading.read(root, found) == DATA
    assert hashed == []
    flip_byte(local_object_path(data_dir, block_keys(root, found.artifact_revision_id, 5)[2]), 100)
    with pytest.raises(IntegrityError, match="SHA-256"):
        reading.read(root, found, 2 * BLOCK, 1)
    assert hashed == [BLOCK]  # the store vouched for nothing: the reader hashed and found it


@pytest.mark.damages_store("puts one valid block object in another's place")
def test_a_block_replaced_by_another_valid_object_is_refused(data_dir, published):
    """Each object file is whole and consistent (its etag matches its body), but the one at block
    2's key is block 0: the digest it carries is not the manifest's, so the reader hashes it and
    refuses it."""
    import shutil

    root, found = published
    keys_ = block_keys(root, found.artifact_revision_id, 5)
    shutil.copyfile(local_object_path(data_dir, keys_[0]), local_object_path(data_dir, keys_[2]))
    with pytest.raises(IntegrityError, match="SHA-256"):
        reading.read(root, found, 2 * BLOCK, 1)
    assert reading.read(root, found, 0, BLOCK) == DATA[:BLOCK]


def test_a_local_store_is_read_directly_without_a_block_cache(data_dir, published):
    """A cache of a local store would be a second copy of its blocks on the same machine,
    written at every first read: a local data directory has none unless init was asked for one."""
    root, found = published
    assert root.blocks.cache is None
    assert reading.read(root, found) == DATA
    assert not os.path.exists(os.path.join(data_dir, "cache"))


@pytest.mark.block_cache
def test_a_corrupt_cache_entry_is_dropped_and_refetched(data_dir, published):
    root, found = published
    assert reading.read(root, found) == DATA  # fills the cache
    rows = root.manifests.get(root, found.artifact_revision_id)[1]
    digest_hex = rows[0].digest_uri.split(":", 1)[1]
    cached = os.path.join(data_dir, "cache", digest_hex[:2], digest_hex)
    assert os.path.exists(cached)
    flip_byte(cached, 0)
    assert reading.read(root, found, 0, BLOCK) == DATA[:BLOCK]
    assert root.blocks.cache.stats().corrupt_drops == 1


@pytest.mark.block_cache
@pytest.mark.damages_store("deletes blocks the cache still serves")
def test_a_cached_block_survives_reopen(data_dir, root_holder):
    from nokvfs.workspace import workbench as wb

    root = root_holder.root
    wb.create(root, WB)
    namespace.put(root, WB, "outputs/c", DATA)
    assert get_bytes(root, "outputs/c") == DATA
    root = root_holder.reopen()  # the cache directory is released by close and reopened
    found = entry(root, "outputs/c")
    for key in block_keys(root, found.artifact_revision_id, 5):
        os.unlink(local_object_path(data_dir, key))
    assert reading.read(root, found) == DATA  # every block verified from the cache
