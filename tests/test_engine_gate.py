"""The schema gate: an empty store is initialised exactly; anything else opens only if it matches."""

from __future__ import annotations

import lmdb
import pytest

from nokvfs.engine import outbox
from nokvfs.engine import rows as envelope
from nokvfs.engine.command import Put
from nokvfs.engine.records import SYS_SCHEMA, SYS_TREES, SchemaMarker, TreeRegistry
from nokvfs.engine.shard import Shard
from nokvfs.errors import IntegrityError, NotFound, OutboxCorrupt, SchemaMismatch
from nokvfs.schema.ids import new_id16
from nokvfs.schema.keys import FAMILIES, TREE_NAMES


def raw_env(path):
    return lmdb.open(path, max_dbs=64, subdir=True)


def test_empty_store_is_initialised_with_the_exact_marker_and_registry(tmp_path):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()
    env = raw_env(path)
    with env.begin() as txn:
        names = {k.decode() for k in txn.cursor().iternext(values=False)}
        system = env.open_db(b"system", txn=txn, create=False)
        stored_marker = txn.get(SYS_SCHEMA, db=system)
        marker = SchemaMarker.decode(envelope.unseal("system", SYS_SCHEMA, stored_marker))
        registry = TreeRegistry.decode(envelope.unseal("system", SYS_TREES, txn.get(SYS_TREES, db=system)))
    env.close()
    assert names == set(TREE_NAMES) and len(names) == 26
    assert (marker.value_format_version, marker.schema_id, marker.format_version) == (2, "nokv_workspace", 8)
    # The marker's bytes: value version 1, u32 value_format_version, u32-length schema id, u32 format version.
    assert marker.encode().hex() == "01" + "00000002" + "0000000e" + b"nokv_workspace".hex() + "00000008"
    # Stored in the row envelope: version 1, xxh3-64("\x06system" | u32 len | "schema" | value), value.
    assert stored_marker == bytes.fromhex("01" + "0f209fcc2885df85") + marker.encode()
    assert [(t.name, t.tag) for t in registry.trees][: len(FAMILIES)] == [(f.name, f.tag) for f in FAMILIES]
    Shard.open(path).close()


def test_missing_store_and_empty_store_do_not_open(tmp_path):
    with pytest.raises(NotFound):
        Shard.open(str(tmp_path / "nothing"))
    path = str(tmp_path / "empty")
    raw_env(path).close()
    with pytest.raises(SchemaMismatch, match="empty store"):
        Shard.open(path)


def test_create_refuses_a_non_empty_store(tmp_path):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()
    with pytest.raises(SchemaMismatch, match="already holds"):
        Shard.create(path, new_id16())


def _rewrite_system(path, key, transform, *, sealed=True):
    """Replace a System row's value by transform(old value). Sealed (the default): through the
    row envelope, as a program writing other contents would; else the stored bytes themselves."""
    env = raw_env(path)
    with env.begin(write=True) as txn:
        system = env.open_db(b"system", txn=txn, create=False)
        old = txn.get(key, db=system)
        new = transform(envelope.unseal("system", key, old) if sealed else old)
        if new is None:
            txn.delete(key, db=system)
        else:
            txn.put(key, envelope.seal("system", key, new) if sealed else new, db=system)
    env.close()


@pytest.mark.parametrize(
    "transform, message",
    [
        (lambda old: None, "marker is missing"),
        (lambda old: old[:5], "marker is malformed"),
        (lambda old: bytes([9]) + old[1:], "marker is malformed.*version 9"),
        (lambda old: SchemaMarker(1, "nokv_workspace", 7).encode(), "format_version 7 != 8"),
        (lambda old: SchemaMarker(3, "nokv_workspace", 8).encode(), "value_format_version 3 != 2"),
        (lambda old: SchemaMarker(2, "nokv_workspacf", 8).encode(), "schema_id"),
    ],
    ids=["missing", "truncated", "unknown-version", "old-format", "value-format", "schema-id"],
)
def test_a_bad_marker_refuses_to_open_naming_the_difference(tmp_path, transform, message):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()
    _rewrite_system(path, SYS_SCHEMA, transform)
    with pytest.raises(SchemaMismatch, match=message):
        Shard.open(path)


def test_every_flipped_byte_of_the_marker_refuses_to_open(tmp_path):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()
    original = SchemaMarker(2, "nokv_workspace", 8).encode()
    for offset in range(len(original)):
        flipped = bytearray(original)
        flipped[offset] ^= 0x01
        _rewrite_system(path, SYS_SCHEMA, lambda old, f=bytes(flipped): f)
        with pytest.raises(SchemaMismatch):
            Shard.open(path)
    _rewrite_system(path, SYS_SCHEMA, lambda old: original)
    Shard.open(path).close()


def test_an_extra_tree_refuses_to_open(tmp_path):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()
    env = raw_env(path)
    env.open_db(b"inode_current", create=True)
    env.close()
    with pytest.raises(SchemaMismatch, match=r"extra \['inode_current'\]"):
        Shard.open(path)


def test_a_missing_tree_refuses_to_open(tmp_path):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()
    env = raw_env(path)
    with env.begin(write=True) as txn:
        db = env.open_db(b"gc_barrier", txn=txn, create=False)
        txn.drop(db, delete=True)
    env.close()
    with pytest.raises(SchemaMismatch, match=r"missing \['gc_barrier'\]"):
        Shard.open(path)


def test_a_tampered_registry_record_refuses_to_open(tmp_path):
    path = str(tmp_path / "s")
    Shard.create(path, new_id16()).close()

    def swap_tags(old):
        registry = TreeRegistry.decode(old)
        trees = list(registry.trees)
        trees[0], trees[1] = type(trees[0])(trees[0].name, trees[1].tag), type(trees[1])(trees[1].name, trees[0].tag)
        return TreeRegistry(tuple(trees)).encode()

    _rewrite_system(path, SYS_TREES, swap_tags)
    with pytest.raises(SchemaMismatch, match="tree registry record differs"):
        Shard.open(path)


def test_a_flipped_byte_in_a_record_refuses_to_open(shard_env):
    # A row rewritten outside the engine with a valid envelope (another program's write): only
    # the state digest can tell, so full verification (open --verify, fsck) refuses it.
    key = b"\x11" * 16 + b"path"
    shard_env.apply(mutations=[Put("path_current", key, b"\x02" + b"value-bytes")])
    shard_env.shard.close()
    env = raw_env(shard_env.path)
    with env.begin(write=True) as txn:
        db = env.open_db(b"path_current", txn=txn, create=False)
        value = bytearray(envelope.unseal("path_current", key, txn.get(key, db=db)))
        value[3] ^= 0x40
        txn.put(key, envelope.seal("path_current", key, bytes(value)), db=db)
    env.close()
    with pytest.raises(IntegrityError, match="path_current does not match its state digest"):
        Shard.open(shard_env.path, verify=True)
    # Without full verification the state digest is not recomputed; that mode is explicit.
    Shard.open(shard_env.path, verify=False).close()
    shard_env.shard = Shard.open(shard_env.path, verify=False)


def test_a_history_floor_beyond_the_commit_clock_refuses_to_open(shard_env):
    from nokvfs.engine.records import SYS_HISTORY_FLOOR, HistoryFloor

    clock = shard_env.shard.commit_version
    shard_env.shard.close()
    _rewrite_system(shard_env.path, SYS_HISTORY_FLOOR, lambda raw: HistoryFloor(clock + 1).encode())
    with pytest.raises(IntegrityError, match=f"history floor {clock + 1} is beyond the commit clock {clock}"):
        Shard.open(shard_env.path, verify=False)
    _rewrite_system(shard_env.path, SYS_HISTORY_FLOOR, lambda raw: HistoryFloor(clock).encode())
    shard_env.shard = Shard.open(shard_env.path, verify=False)


def _outbox_rows(path):
    env = raw_env(path)
    with env.begin() as txn:
        db = env.open_db(b"recovery_outbox", txn=txn, create=False)
        rows = [(k, envelope.unseal("recovery_outbox", k, v)) for k, v in txn.cursor(db)]
    env.close()
    return rows


def _rewrite_outbox(path, key, value):
    env = raw_env(path)
    with env.begin(write=True) as txn:
        db = env.open_db(b"recovery_outbox", txn=txn, create=False)
        if value is None:
            txn.delete(key, db=db)
        else:
            txn.put(key, envelope.seal("recovery_outbox", key, value), db=db)
    env.close()


@pytest.mark.parametrize("target", ["header-digest", "chunk-byte", "missing-chunk", "orphan-chunk", "gap"])
def test_a_broken_outbox_refuses_to_open_saying_where(format_2_records, shard_env, target):
    for i in range(3):
        shard_env.apply(mutations=[Put("path_current", bytes([i]) * 16, b"\x02v")])
    shard_env.shard.close()
    rows = dict(_outbox_rows(shard_env.path))
    headers = sorted(k for k in rows if len(k) == 9)  # 0x00 | lsn
    chunks = sorted(k for k in rows if len(k) == 13)  # 0x00 | lsn | index (0x01 before header format 2)
    if target == "header-digest":
        key = headers[1]
        value = bytearray(rows[key])
        value[-1] ^= 0x01
        _rewrite_outbox(shard_env.path, key, bytes(value))
        expected = "record 2: chain digest does not verify"
    elif target == "chunk-byte":
        key = chunks[1]
        value = bytearray(rows[key])
        value[-1] ^= 0x01
        _rewrite_outbox(shard_env.path, key, bytes(value))
        expected = "record 2: payload SHA-256"
    elif target == "missing-chunk":
        _rewrite_outbox(shard_env.path, chunks[2], None)
        expected = "record 3 is missing chunk 0"
    elif target == "orphan-chunk":
        _rewrite_outbox(shard_env.path, b"\x01" + (99).to_bytes(8, "big") + (0).to_bytes(4, "big"), rows[chunks[0]])
        expected = "orphan outbox chunk"
    else:
        _rewrite_outbox(shard_env.path, headers[1], None)
        expected = "LSN gap: expected 2, found 3"
    with pytest.raises(OutboxCorrupt, match=expected):
        Shard.open(shard_env.path)
    shard_env.shard = Shard.create(shard_env.path + "-fresh", new_id16())  # fixture closes it


def test_a_truncated_outbox_tail_refuses_to_open(shard_env):
    for i in range(2):
        shard_env.apply(mutations=[Put("path_current", bytes([i]) * 16, b"\x02v")])
    shard_env.shard.close()
    rows = dict(_outbox_rows(shard_env.path))
    last = max(k for k in rows if len(k) == 9)
    lsn = int.from_bytes(last[1:], "big")
    _rewrite_outbox(shard_env.path, last, None)
    _rewrite_outbox(shard_env.path, outbox.chunk_key(lsn, 0), None)
    with pytest.raises(IntegrityError, match="outbox ends at LSN"):
        Shard.open(shard_env.path)
    shard_env.shard = Shard.create(shard_env.path + "-fresh", new_id16())


def test_state_digests_updated_row_by_row_are_the_sums_modulo_2_256():
    """_Digests reuses one hasher and reduces the sums once, in `record`: the digest a command
    stores is still each row's hash added or taken away modulo 2**256, whatever the order."""
    import random

    from nokvfs.engine.records import StateDigest, TreeDigest
    from nokvfs.engine.shard import _DIGEST_MOD, _digested_trees, _Digests, _row_hash

    rnd = random.Random(7)
    start = StateDigest(tuple(TreeDigest(name, 5, rnd.randbytes(32)) for name in _digested_trees()))
    digests = _Digests(start)
    expected = {t.name: [t.row_count, int.from_bytes(t.digest, "big")] for t in start.trees}
    for _ in range(2000):
        tree, key = rnd.choice(_digested_trees()), rnd.randbytes(rnd.randint(0, 40))
        old = None if rnd.random() < 0.3 else rnd.randbytes(rnd.randint(0, 300))
        new = None if rnd.random() < 0.3 else rnd.randbytes(rnd.randint(0, 300))
        digests.change(tree, key, old, new)
        entry = expected[tree]
        if old is not None:
            entry[0], entry[1] = entry[0] - 1, (entry[1] - _row_hash(key, old)) % _DIGEST_MOD
        if new is not None:
            entry[0], entry[1] = entry[0] + 1, (entry[1] + _row_hash(key, new)) % _DIGEST_MOD
        if rnd.random() < 0.01:  # a record taken midway changes nothing
            digests.record()
    assert digests.record() == StateDigest(
        tuple(TreeDigest(name, count, digest.to_bytes(32, "big")) for name, (count, digest) in expected.items())
    )
