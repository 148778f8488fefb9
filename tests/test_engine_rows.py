"""The row envelope (nokvfs.engine.rows) and the checks of LMDB's own file (nokvfs.engine.meta)."""

from __future__ import annotations

import os
import struct
import zlib

import lmdb
import pytest
import xxhash

from nokvfs.engine import compression, rows
from nokvfs.engine.command import Put, ValueEquals
from nokvfs.engine.meta import CommitWitness, check_meta_pages
from nokvfs.engine.shard import Shard
from nokvfs.errors import RowCorrupt, ShardCorrupt
from nokvfs.schema.ids import new_id16

KEY = b"\x01" * 16 + b"k"
VALUE = bytes.fromhex("02000000000000000107")


def test_golden_bytes_of_a_sealed_row():
    # u8 envelope version 1 | u64 xxh3-64 (seed 0) of u8 len(tree) | tree | u32 len(key) | key | value | value
    stored = rows.seal("path_current", KEY, VALUE)
    assert stored.hex() == "01" + "58fa0b724e4fac6c" + VALUE.hex()
    expected = xxhash.xxh3_64_digest(b"\x0cpath_current" + struct.pack(">I", len(KEY)) + KEY + VALUE)
    assert stored[1:9] == expected
    assert rows.unseal("path_current", KEY, stored) == VALUE
    assert rows.unseal("path_current", KEY, rows.seal("path_current", KEY, b"")) == b""
    assert rows.unseal("path_current", KEY, None) is None


@pytest.mark.parametrize(
    "stored, why",
    [
        (bytes([3]) + rows.seal("path_current", KEY, VALUE)[1:], "unknown row envelope version 3"),
        # Version 2 is the deflated envelope: a plain value under it does not inflate.
        (bytes([2]) + rows.seal("path_current", KEY, VALUE)[1:], "deflated value that does not inflate"),
        (bytes([0]) + rows.seal("path_current", KEY, VALUE)[1:], "unknown row envelope version 0"),
        (rows.seal("path_current", KEY, VALUE)[:8], "shorter than the row envelope"),
        (b"", "shorter than the row envelope"),
        (rows.seal("path_current", KEY, VALUE)[:-1], "checksum"),
        (rows.seal("path_current", KEY, VALUE) + b"\x00", "checksum"),
        (rows.seal("path_current", b"\x01" * 16 + b"j", VALUE), "checksum"),  # moved from another key
        (rows.seal("artifact_revision", KEY, VALUE), "checksum"),  # moved from another tree
    ],
    ids=[
        "version-3",
        "version-2-not-deflated",
        "version-0",
        "truncated",
        "empty",
        "short-value",
        "long-value",
        "other-key",
        "other-tree",
    ],
)
def test_an_unknown_version_a_changed_length_or_a_moved_row_is_row_corrupt(stored, why):
    with pytest.raises(RowCorrupt, match=why) as caught:
        rows.unseal("path_current", KEY, stored)
    assert (caught.value.tree, caught.value.key) == ("path_current", KEY)


# An Operation row as a publish leaves it: long enough, and repetitive enough, to be deflated.
OPERATION_KEY = b"\x01" * 16 + b"\x01" + b"\x02" * 16
OPERATION_VALUE = b"\x02" + (b"sha256:" + b"ab" * 32) * 3 + b"application/octet-stream" + bytes(40)


def test_golden_bytes_of_a_deflated_row():
    # u8 envelope version 2 | u64 xxh3-64 of u8 len(tree) | tree | u32 len(key) | key | body, the
    # body being u32 len(value) | u8 len(raw tail) (0 for an Operation) | the value deflated with
    # compression.DICTIONARY_1 (level 6, an 8 KiB window, memory level 4, fixed Huffman codes for
    # Operation rows)
    stored = rows.seal("operation", OPERATION_KEY, OPERATION_VALUE)
    body = struct.pack(">IB", len(OPERATION_VALUE), 0) + compression.deflate_row(OPERATION_VALUE, fixed=True)
    expected = xxhash.xxh3_64_digest(b"\x09operation" + struct.pack(">I", len(OPERATION_KEY)) + OPERATION_KEY + body)
    assert stored == b"\x02" + expected + body
    assert stored.hex() == GOLDEN_DEFLATED_ROW
    # RFC 1950 header 0x5828: deflate with a 2^13-byte window, FDICT set; DICTIONARY_1's Adler-32 next.
    assert body[5:7] == b"\x58\x28" and body[7:11] == zlib.adler32(compression.DICTIONARY_1).to_bytes(4, "big")
    assert len(stored) < len(rows.seal("path_current", OPERATION_KEY, OPERATION_VALUE))
    assert rows.unseal("operation", OPERATION_KEY, stored) == OPERATION_VALUE


GOLDEN_DEFLATED_ROW = "02a46fd99218be31bf0000011600582875233b996382ba2931893238b88c219463090100ca7858f7"


def test_golden_bytes_of_a_deflated_artifact_revision_with_its_raw_tail():
    # An ArtifactRevision's last 33 bytes (state, reference epoch, count, last-zero version,
    # created version) stay raw after the stream: rewriting them in place keeps the row's size.
    value = OPERATION_VALUE[:-33] + bytes(range(33))
    stored = rows.seal("artifact_revision", OPERATION_KEY, value)
    body = struct.pack(">IB", len(value), 33) + compression.deflate_row(value[:-33]) + bytes(range(33))
    assert stored == b"\x02" + rows.checksum("artifact_revision", OPERATION_KEY, body) + body
    assert stored[:14].hex() == "028a0808f5a26c11e1" + "00000116" + "21"
    assert rows.unseal("artifact_revision", OPERATION_KEY, stored) == value
    changed = value[:-33] + bytes(33)
    assert len(rows.seal("artifact_revision", OPERATION_KEY, changed)) == len(stored)
    assert (
        rows.unseal("artifact_revision", OPERATION_KEY, rows.seal("artifact_revision", OPERATION_KEY, changed))
        == changed
    )


def test_a_rewrite_of_the_raw_tail_reuses_the_replaced_rows_stream_with_the_same_bytes(monkeypatch):
    value = OPERATION_VALUE[:-33] + bytes(range(33))
    stored = rows.seal("artifact_revision", OPERATION_KEY, value)
    changed = value[:-33] + bytes(33)
    fresh = rows.seal("artifact_revision", OPERATION_KEY, changed)
    deflated = []
    monkeypatch.setattr(compression, "deflate_row", lambda *a, **k: deflated.append(a) or None)
    reused = rows.seal("artifact_revision", OPERATION_KEY, changed, previous=(value, stored))
    assert reused == fresh and deflated == []  # the same bytes, nothing deflated
    assert rows.unseal("artifact_revision", OPERATION_KEY, reused) == changed
    # A head that differs, a length that differs, or a raw previous row: deflated afresh.
    for new, previous in (
        (b"\x00" + changed[1:], (value, stored)),
        (changed[:-33] + b"\x00" + bytes(33), (value, stored)),
        (changed, (value, rows.seal("path_current", OPERATION_KEY, value))),
    ):
        deflated.clear()
        rows.seal("artifact_revision", OPERATION_KEY, new, previous=previous)
        assert len(deflated) == 1


def test_a_deflated_row_written_or_read_before_is_not_inflated_again_and_is_still_verified(monkeypatch):
    value = OPERATION_VALUE[:-33] + bytes(range(33))
    stored = rows.seal("artifact_revision", OPERATION_KEY, value)  # remembered as it is written
    inflated = []
    real_inflate = compression.inflate
    monkeypatch.setattr(compression, "inflate", lambda *a, **k: inflated.append(a) or real_inflate(*a, **k))
    assert rows.unseal("artifact_revision", OPERATION_KEY, stored) == value and inflated == []
    # Its checksum is still verified first: the same body under another key is corrupt.
    with pytest.raises(RowCorrupt):
        rows.unseal("artifact_revision", OPERATION_KEY + b"x", stored)
    rows._INFLATED.clear()
    assert rows.unseal("artifact_revision", OPERATION_KEY, stored) == value and len(inflated) == 1
    assert rows.unseal("artifact_revision", OPERATION_KEY, stored) == value and len(inflated) == 1
    for number in range(rows._INFLATED_ROWS + 10):  # bounded
        rows.seal("artifact_revision", OPERATION_KEY, value[:-33] + number.to_bytes(33, "big"))
    assert len(rows._INFLATED) == rows._INFLATED_ROWS


def _deflated_32k(data: bytes) -> bytes:
    deflater = zlib.compressobj(6, zdict=compression.DICTIONARY_1)
    return deflater.compress(data) + deflater.flush()


def test_only_the_deflated_trees_and_only_when_smaller():
    assert "path_current" not in rows.DEFLATED_TREES
    assert rows.seal("path_current", OPERATION_KEY, OPERATION_VALUE)[0] == 1
    short = b"\x02" + bytes(40)  # too short to be worth deflating
    assert (
        rows.seal("operation", OPERATION_KEY, short)
        == b"\x01" + rows.checksum("operation", OPERATION_KEY, short) + short
    )
    assert rows.seal("operation", OPERATION_KEY, b"")[0] == 1
    noise = os.urandom(400)  # does not deflate smaller
    assert rows.seal("operation", OPERATION_KEY, noise)[0] == 1
    assert rows.unseal("operation", OPERATION_KEY, rows.seal("operation", OPERATION_KEY, noise)) == noise


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda s: s[:9] + struct.pack(">I", len(OPERATION_VALUE) + 1) + s[13:], "checksum"),
        (lambda s: s[:9] + s[9:11], "checksum"),
    ],
    ids=["length", "truncated"],
)
def test_a_damaged_deflated_row_is_row_corrupt(change, why):
    stored = rows.seal("operation", OPERATION_KEY, OPERATION_VALUE)
    with pytest.raises(RowCorrupt, match=why):
        rows.unseal("operation", OPERATION_KEY, change(stored))


def test_a_deflated_row_whose_stream_or_length_lies_is_row_corrupt_even_with_a_valid_checksum():
    # Only a writer that computes the checksum can make these: the inflation still refuses them.
    def sealed(body: bytes) -> bytes:
        return b"\x02" + rows.checksum("operation", OPERATION_KEY, body) + body

    stream = compression.deflate_row(OPERATION_VALUE)
    length = len(OPERATION_VALUE)
    for body, why in [
        (struct.pack(">IB", length - 1, 0) + stream, "does not inflate"),
        (struct.pack(">IB", length + 1, 0) + stream, "does not inflate"),
        (struct.pack(">IB", length, 0) + stream[:-3], "does not inflate"),
        (struct.pack(">IB", length, 0) + stream + b"\x00", "does not inflate"),
        # A 32 KiB-window stream (what compression.deflate wrote before its 8 KiB-window deflater
        # of short values): rows are inflated with an 8 KiB window.
        (struct.pack(">IB", length, 0) + _deflated_32k(OPERATION_VALUE), "does not inflate"),
        (struct.pack(">IB", length, 1) + stream, "does not inflate"),  # the stream's last byte taken as the tail
        (struct.pack(">IB", 2, 3) + b"abc", "raw tail is longer"),
        (struct.pack(">IB", length, 200) + stream[:10], "raw tail is longer"),
        (b"\x00\x00\x00\x01", "shorter than its length"),
    ]:
        with pytest.raises(RowCorrupt, match=why):
            rows.unseal("operation", OPERATION_KEY, sealed(body))


@pytest.mark.parametrize(
    "tree, key, value, envelope",
    [("path_current", KEY, VALUE, 1), ("operation", OPERATION_KEY, OPERATION_VALUE, 2)],
    ids=["plain", "deflated"],
)
def test_every_single_bit_flip_of_a_sealed_row_is_caught(tree, key, value, envelope):
    stored = rows.seal(tree, key, value)
    assert stored[0] == envelope
    for offset in range(len(stored)):
        for bit in range(8):
            damaged = bytearray(stored)
            damaged[offset] ^= 1 << bit
            with pytest.raises(RowCorrupt):
                rows.unseal(tree, key, bytes(damaged))


def _meta_shard(tmp_path):
    path = str(tmp_path / "s")
    shard = Shard.create(path, new_id16())
    shard.close()
    return path


@pytest.mark.parametrize(
    "offset, value, why",
    [
        (16, 0xDEADBEEF, "magic"),  # mm_magic (u32)
        (20, 2, "data version"),  # mm_version
        (24, 0x1000, "fixed map address"),
        (32, 1 << 50, "map size"),
        (40, 8192, "page size"),  # FREE_DBI md_pad: the page size
        (92, 0x08, "main tree flags"),  # MAIN_DBI md_flags (u16)
        (128, 99, "main tree root page"),
        (136, 999, "last page"),
    ],
)
def test_a_damaged_meta_field_is_shard_corrupt_naming_it(tmp_path, offset, value, why):
    path = _meta_shard(tmp_path)
    page = 4096  # meta page 1 holds the newest commit of a fresh shard
    fmt = "<H" if offset == 92 else ("<I" if offset in (16, 20, 40) else "<Q")
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.seek(page + offset)
        f.write(struct.pack(fmt, value))
    with pytest.raises(ShardCorrupt, match=why):
        check_meta_pages(path)
    with pytest.raises(ShardCorrupt, match=why):
        Shard.open(path)


def test_transaction_ids_of_the_meta_pages_must_be_consecutive_with_their_parity(tmp_path):
    path = _meta_shard(tmp_path)
    assert check_meta_pages(path) >= 1
    mdb = os.path.join(path, "data.mdb")
    with open(mdb, "rb") as f:
        raw = f.read(8192)
    ids = [struct.unpack_from("<Q", raw, p * 4096 + 144)[0] for p in (0, 1)]
    for page, txnid, why in ((0, ids[0] + 1, "parity"), (0, ids[0] + 4, "not consecutive")):
        with open(mdb, "r+b") as f:
            f.seek(page * 4096 + 144)
            f.write(struct.pack("<Q", txnid))
        with pytest.raises(ShardCorrupt, match=why):
            check_meta_pages(path)
        with open(mdb, "r+b") as f:
            f.seek(page * 4096 + 144)
            f.write(struct.pack("<Q", ids[page]))
    check_meta_pages(path)


def test_the_commit_witness_golden_bytes_and_what_it_ignores(tmp_path):
    witness = CommitWitness(str(tmp_path))
    assert witness.read() is None
    witness.record(0x0102)
    witness.close()
    with open(witness.path, "rb") as f:
        raw = f.read()
    body = b"NKW1" + (0x0102).to_bytes(8, "big")
    assert raw == body + xxhash.xxh3_64_digest(body)
    assert witness.read() == 0x0102
    witness.check(0x0102)
    with pytest.raises(ShardCorrupt, match="older state"):
        witness.check(0x0101)
    with open(witness.path, "r+b") as f:
        f.seek(11)
        f.write(b"\xff")  # a damaged witness is ignored, never a false alarm
    assert witness.read() is None
    witness.check(0)


def test_deflated_rows_and_plain_rows_of_the_same_tree_read_after_reopen(shard_env):
    # A store written before the deflated envelope holds plain rows in the deflated trees: they
    # still read, beside the deflated rows written since, after a reopen, and full verification
    # (state digests over the values themselves) passes.
    deflated_key, plain_key = b"\x11" * 16 + b"new", b"\x11" * 16 + b"old"
    shard_env.apply(mutations=[Put("operation", deflated_key, OPERATION_VALUE)])
    shard_env.apply(mutations=[Put("operation", plain_key, OPERATION_VALUE + b"!")])
    shard_env.shard.close()
    env = lmdb.open(shard_env.path, max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        db = env.open_db(b"operation", txn=txn, create=False)
        assert txn.get(deflated_key, db=db)[0] == 2
        # As the nokvfs before the deflated envelope stored it.
        value = OPERATION_VALUE + b"!"
        txn.put(plain_key, b"\x01" + rows.checksum("operation", plain_key, value) + value, db=db)
    env.close()
    shard_env.shard = Shard.open(shard_env.path, verify=True)
    with shard_env.shard.read() as view:
        assert view.get("operation", deflated_key) == OPERATION_VALUE
        assert view.get("operation", plain_key) == OPERATION_VALUE + b"!"
    # A predicate compares the value, whichever envelope holds it.
    shard_env.apply(
        predicates=[ValueEquals("operation", plain_key, OPERATION_VALUE + b"!")],
        mutations=[Put("operation", plain_key, OPERATION_VALUE + b"?")],
    )
    with shard_env.shard.read() as view:
        assert view.get("operation", plain_key) == OPERATION_VALUE + b"?"


@pytest.mark.damages_store("a system row and a root fence damaged in place")
@pytest.mark.parametrize("target", ["clock", "fence"])
def test_a_system_row_or_fence_damaged_after_it_was_read_and_cached_is_still_shard_corrupt(shard_env, target):
    """The shard keeps the last decoded form of its system rows and root fences keyed by their
    stored bytes (a read view opens faster); bytes that differ from those are verified afresh,
    so damage after a read is refused by the next one, never served from the cache."""
    from nokvfs.engine import fences
    from nokvfs.engine.fences import ReadFence
    from nokvfs.engine.records import SYS_CLOCK

    shard = shard_env.shard
    fence = ReadFence(shard_env.root_id, shard_env.placement_generation, None)
    shard_env.apply(mutations=[Put("operation", b"k" * 40, OPERATION_VALUE)])
    with shard.read(fence=fence) as view:  # reads (and caches) both rows
        version = view.version
    tree, key = ("system", SYS_CLOCK) if target == "clock" else ("root_fence", fences.fence_key(shard_env.root_id))
    db = shard._dbs[tree]
    with shard._env.inner.begin(write=True) as txn:  # the damage, from outside the engine
        stored = bytearray(txn.get(key, db=db))
        stored[-1] ^= 0x01
        txn.put(key, bytes(stored), db=db)
    with pytest.raises(ShardCorrupt, match=f"tree {tree}"):
        with shard.read(fence=fence):
            pass
    with shard._env.inner.begin(write=True) as txn:  # repaired: the same bytes read as before
        stored[-1] ^= 0x01
        txn.put(key, bytes(stored), db=db)
    with shard.read(fence=fence) as view:
        assert view.version == version


def test_what_the_shard_remembers_of_the_system_rows_it_wrote_is_what_they_decode_to(shard_env):
    """Each system row a command writes is remembered with its stored bytes, so the next command
    does not decode it again: the remembered record must equal, field for field and type for
    type, what decoding those bytes gives (and a reopened shard reads)."""
    import dataclasses

    from nokvfs.engine.records import RecoveryTail, StateDigest

    shard = shard_env.shard
    for i in range(5):
        shard_env.apply(mutations=[Put("operation", b"k%d" % i * 20, OPERATION_VALUE)])
    shard.observe_lease_clock(shard.lease_clock_ms + 1000)
    shard.advance_owner_epoch(shard.owner_epoch + 1)
    shard_env.apply(mutations=[Put("operation", b"last" * 10, OPERATION_VALUE)])
    shard.prune_history(owner_epoch=shard.owner_epoch, floor_version=shard.commit_version)

    def fields(value):
        return [(f.name, type(getattr(value, f.name)), getattr(value, f.name)) for f in dataclasses.fields(value)]

    remembered = {key: value for (tree, key), value in shard._decoded.items() if tree == "system"}
    assert {b"commit_clock", b"recovery_tail", b"state_digest", b"lease_clock", b"owner", b"history_floor"} <= set(
        remembered
    )
    with shard._env.begin() as txn:
        for key, (stored, value) in remembered.items():
            assert txn.get(key, db=shard._dbs["system"]) == stored, key
            fresh = type(value).decode(rows.unseal("system", key, stored))
            assert fresh == value and fields(fresh) == fields(value), key
            if isinstance(value, StateDigest):
                assert [fields(t) for t in fresh.trees] == [fields(t) for t in value.trees]
    assert isinstance(remembered[b"recovery_tail"][1], RecoveryTail)
    shard.close()
    shard_env.shard = Shard.open(shard_env.path, verify=True)  # the digest a full verification recomputes
    assert shard_env.shard.verify_state() == []
