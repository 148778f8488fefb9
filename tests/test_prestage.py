"""Blocks staged in the store while a file is written (nokvfs.workspace.prestage), through the
mount's Operations without a kernel: what a publication links is exactly the file's bytes, and
every staged block is given back whatever happens to the file or its publication."""

from __future__ import annotations

import errno
import os
import time

import pytest

from nokvfs.fs import spools
from nokvfs.workspace import datadir, listing, namespace, prestage, reading, workbench
from tests.test_fs_core import Kernel

BLOCK = 4096


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    # The bound is process-wide: a test that fails with blocks staged must not shrink the next one's.
    monkeypatch.setattr(prestage, "_held", 0)
    monkeypatch.setattr(prestage, "COUNTS", {"staged": 0, "linked": 0})
    data = str(tmp_path / "data")
    datadir.init(data, block_size=BLOCK)
    root = datadir.open_root(data, verify=False)
    workbench.create(root, "wb")
    k = Kernel(root)
    k.root = root
    try:
        yield k
    finally:
        root.close()


@pytest.fixture
def released(monkeypatch):
    """The StagedBlocks each publication handed back, publication by publication."""
    seen = []
    original = prestage.release

    def release(blocks):
        seen.append(dict(blocks))
        original(blocks)

    monkeypatch.setattr(prestage, "release", release)
    return seen


def write_in_order(kernel, fh, data: bytes, piece: int = 1000) -> None:
    for offset in range(0, len(data), piece):
        kernel.write(fh, data[offset : offset + piece], offset)


def staged(count: int) -> None:
    """Wait until `count` blocks are staged. Staging is a background job that a publication
    cancels when it has not started yet (the block is then uploaded at close instead), so a test
    that asserts which blocks were linked waits for them first: on a busy machine a close can
    come before the pool has started the job."""
    deadline = time.monotonic() + 30
    while prestage.COUNTS["staged"] < count:
        assert time.monotonic() < deadline, f"{prestage.COUNTS['staged']} of {count} blocks staged"
        time.sleep(0.005)


def stored(kernel, path: str) -> bytes:
    """The published bytes, read from the store (verified), not through the mount."""
    root = kernel.root
    with root.read() as view:
        return reading.read(root, listing.stat(view, root, "wb", path).entry)


def temps_left(kernel) -> list:
    """Named temps in the store's temp directory (unnamed ones vanish with their descriptor)."""
    store = kernel.root.store
    while getattr(store, "inner", None) is not None:
        store = store.inner
    return os.listdir(os.path.join(store.root, ".nokv-tmp"))


def test_blocks_written_in_order_are_staged_and_linked_at_close(kernel, released):
    data = os.urandom(10 * BLOCK + 123)
    fh = kernel.create("/wb/outputs/big.bin")
    write_in_order(kernel, fh, data)
    staged(10)
    kernel.close(fh)
    assert kernel.cat("/wb/outputs/big.bin") == data
    assert stored(kernel, "outputs/big.bin") == data
    [blocks] = released
    assert sorted(blocks) == list(range(10))  # every complete block, not the partial last one
    assert all(block.linked for block in blocks.values())
    prestage.wait_idle()
    assert prestage._held == 0
    assert temps_left(kernel) == []
    # Each block staged ahead kept the digest it was hashed with: the store vouches for it.
    root = kernel.root
    with root.read() as view:
        revision = listing.stat(view, root, "wb", "outputs/big.bin").entry.artifact_revision_id
    for row in root.manifests.get(root, revision)[1]:
        data, vouched = root.store.get_vouched(row.object_key, row.length + 1)
        assert len(data) == row.length and "sha256:" + vouched.hex() == row.digest_uri


def test_a_block_changed_after_it_was_staged_is_uploaded_from_the_file(kernel, released, monkeypatch):
    """The digest check alone guards the bytes: with the spool's own bookkeeping switched off, a
    staged block 0 that the file no longer holds must not be linked."""
    monkeypatch.setattr(spools.Spool, "_forget_staged", lambda self: None)
    monkeypatch.setattr(prestage.Prestager, "forget", lambda self: None)
    data = bytearray(os.urandom(6 * BLOCK))
    fh = kernel.create("/wb/outputs/rewritten.bin")
    write_in_order(kernel, fh, bytes(data))
    kernel.write(fh, b"CHANGED", 100)  # behind the staged blocks
    data[100:107] = b"CHANGED"
    staged(6)
    kernel.close(fh)
    assert stored(kernel, "outputs/rewritten.bin") == bytes(data)
    [blocks] = released
    assert not blocks[0].linked  # staged before the change: refused by its digest
    assert all(blocks[i].linked for i in range(1, 6))
    prestage.wait_idle()
    assert prestage._held == 0


def test_truncate_and_o_trunc_after_staging(kernel, released):
    data = os.urandom(8 * BLOCK)
    fh = kernel.create("/wb/outputs/t.bin")
    write_in_order(kernel, fh, data)
    kernel.setattr("/wb/outputs/t.bin", fh=fh, size=2 * BLOCK + 10)
    kernel.close(fh)
    assert stored(kernel, "outputs/t.bin") == data[: 2 * BLOCK + 10]
    fh = kernel.open("/wb/outputs/t.bin", os.O_WRONLY | os.O_TRUNC)
    again = os.urandom(3 * BLOCK)
    write_in_order(kernel, fh, again)
    kernel.close(fh)
    assert stored(kernel, "outputs/t.bin") == again
    prestage.wait_idle()
    assert prestage._held == 0
    assert temps_left(kernel) == []


def test_a_refused_publication_gives_back_every_staged_block(kernel, released):
    fh = kernel.create("/wb/outputs/c.bin")
    write_in_order(kernel, fh, b"v1")
    kernel.close(fh)
    fh = kernel.open("/wb/outputs/c.bin", os.O_WRONLY | os.O_TRUNC)
    mine = os.urandom(5 * BLOCK)
    write_in_order(kernel, fh, mine)
    namespace.put(kernel.root, "wb", "outputs/c.bin", b"theirs")  # another process wins
    assert kernel.errno_of("flush", fh) == errno.EBUSY
    kernel.call("release", fh)
    assert stored(kernel, "outputs/c.bin") == b"theirs"
    assert released and not any(block.linked for block in released[-1].values())
    prestage.wait_idle()
    assert prestage._held == 0
    assert temps_left(kernel) == []


def test_no_more_than_the_bound_is_staged(kernel, released, monkeypatch):
    monkeypatch.setattr(prestage, "MAX_STAGED", 3)
    data = os.urandom(9 * BLOCK)
    fh = kernel.create("/wb/outputs/bounded.bin")
    write_in_order(kernel, fh, data)
    kernel.close(fh)
    assert stored(kernel, "outputs/bounded.bin") == data
    [blocks] = released
    assert 0 < len(blocks) <= 3
    prestage.wait_idle()
    assert prestage._held == 0


def test_a_store_that_cannot_stage_gets_no_prestager():
    class NoStaging:
        pass

    assert prestage.Prestager.for_store(NoStaging(), BLOCK) is None


def test_a_file_of_exactly_one_block_is_staged_once(kernel, released):
    """A one-block body is otherwise staged while its begin commits: not a second time when it
    was already staged while written."""
    data = os.urandom(BLOCK)
    fh = kernel.create("/wb/outputs/one.bin")
    write_in_order(kernel, fh, data)
    staged(1)
    kernel.close(fh)
    assert stored(kernel, "outputs/one.bin") == data
    [blocks] = released
    assert list(blocks) == [0] and blocks[0].linked
    prestage.wait_idle()
    assert prestage._held == 0


def test_the_bytes_in_waiting_are_bounded(kernel, released, monkeypatch):
    monkeypatch.setattr(prestage, "MAX_QUEUED_BYTES", 2 * BLOCK)
    data = os.urandom(12 * BLOCK)
    fh = kernel.create("/wb/outputs/queued.bin")
    write_in_order(kernel, fh, data, piece=BLOCK)
    kernel.close(fh)
    assert stored(kernel, "outputs/queued.bin") == data
    prestage.wait_idle()
    assert prestage._held == 0 and prestage._queued == 0


def test_many_small_writes_and_a_mutable_buffer(kernel, released):
    """A block of many small writes is staged from them (joined); a block that a mutable buffer
    wrote into is not staged (its bytes could change after the write returned) and is uploaded
    from the spool; both publish exactly the file."""
    data = os.urandom(4 * BLOCK)
    fh = kernel.create("/wb/outputs/small.bin")
    write_in_order(kernel, fh, data[: 2 * BLOCK], piece=100)
    buffer = bytearray(data[2 * BLOCK : 3 * BLOCK])
    kernel.write(fh, buffer, 2 * BLOCK)
    buffer[:] = b"\0" * BLOCK  # the caller reuses its buffer
    write_in_order_from = data[3 * BLOCK :]
    kernel.write(fh, write_in_order_from, 3 * BLOCK)
    staged(3)
    kernel.close(fh)
    assert stored(kernel, "outputs/small.bin") == data
    [blocks] = released
    assert sorted(blocks) == [0, 1, 3] and all(block.linked for block in blocks.values())
    prestage.wait_idle()
    assert prestage._held == 0 and prestage._queued == 0


def test_blocks_still_being_hashed_when_an_unlinked_file_is_closed_are_not_kept(kernel, released, monkeypatch):
    """Blocks hashed in the background after the spool was dropped (an unlinked file's last
    close) must not be staged and then held forever: the close waits for them first."""
    from nokvfs.workspace import body

    monkeypatch.setattr(body, "HASH_IN_BACKGROUND_MIN", 1)  # every piece hashed in a pool thread
    original = prestage.Prestager.block_hashed

    def slow(self, index, digest, pieces):
        time.sleep(0.05)  # the hashing thread is behind the writer
        original(self, index, digest, pieces)

    monkeypatch.setattr(prestage.Prestager, "block_hashed", slow)
    fh = kernel.create("/wb/outputs/gone.bin")
    write_in_order(kernel, fh, os.urandom(6 * BLOCK), piece=BLOCK)
    parent, name = kernel.split("/wb/outputs/gone.bin")
    kernel.call("unlink", parent, name, kernel.ctx)
    kernel.call("release", fh)
    time.sleep(0.4)  # any hashing still running has ended by now
    prestage.wait_idle()
    assert prestage._held == 0 and prestage._queued == 0
    assert temps_left(kernel) == []
