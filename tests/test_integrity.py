"""Every row verified when it is read: a changed byte in any live row, or in LMDB's meta pages,
is refused with an integrity error by every read path -- never served as other bytes.

Issue 13, item 1: "Corruption of any row is detected before its contents are used, by every
command, the mount and replication alike: a typed IntegrityError (exit 5, EIO in the mount),
never wrong bytes, and writes refused on a shard known to be corrupt."

Each matrix test flips the bytes of one live row in data.mdb in turn -- the LMDB node header,
the key and the stored value -- and after each flip runs every read path over a fresh open of
the data directory: stat, get and ls through the facade, a point read and a prefix scan of the
row's tree, an MVCC read at an older version (History), the recovery outbox as replication
ships it, and, for the PathCurrent row, the CLI's `get` and `ls`. Each path must either refuse
with an IntegrityError or give exactly what it gave before the flip.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections import Counter
from dataclasses import dataclass

import lmdb
import pytest

from nokvfs.cli.main import main as cli_main
from nokvfs.engine import history, outbox, rows
from nokvfs.engine.alarm import ALARM_NAME
from nokvfs.engine.meta import WITNESS_NAME
from nokvfs.engine.scan import iter_prefix
from nokvfs.engine.shard import Shard
from nokvfs.errors import IntegrityError, SchemaMismatch, ShardCorrupt
from nokvfs.schema import keys
from nokvfs.workspace import datadir, listing, namespace, reading, workbench
from tests.mount_fixtures import mounted, needs_fuse

BODIES = {f"outputs/f{i}": bytes([65 + i]) * (40 + 7 * i) for i in range(8)}
NEW_F3 = b"the second revision of f3"


@dataclass
class Pristine:
    data_dir: str
    before_replace: int  # a version at which f3 still had its first revision
    outbox_last: int
    keys: dict  # target name -> (tree, key)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    data_dir = str(tmp_path_factory.mktemp("pristine") / "data")
    datadir.init(data_dir, block_size=4096)
    root = datadir.open_root(data_dir)
    try:
        workbench.create(root, "w")
        for path, body in BODIES.items():
            namespace.put(root, "w", path, body)
        before_replace = root.shard.commit_version
        namespace.put(root, "w", "outputs/f3", NEW_F3)
        namespace.put(root, "w", "outputs/gone", b"removed below")
        namespace.remove(root, "w", "outputs/gone")  # the last command: its outbox record is a target
        with root.read() as view:
            _, wbk = workbench.visible(view, root.root_id, "w")
            path_key = keys.path_current_key(root.root_id, wbk.incarnation_id, ("outputs", "f3"))
            entry = listing.stat(view, root, "w", "outputs/f3").entry
            revision_key = keys.ArtifactRevisionKey(root.root_id, entry.artifact_revision_id).encode()
        # The History row of f3's replacement: the one that kept a previous value.
        tag = keys.FAMILY_BY_NAME["path_current"].tag
        prefix = bytes([tag]) + len(path_key).to_bytes(4, "big") + path_key
        with root.shard._env.begin() as txn:
            (history_key,) = [
                k
                for k, v in txn.cursor(root.shard._dbs["history"])
                if k.startswith(prefix) and history.decode_value(rows.unseal("history", k, v)) is not None
            ]
        lsn = root.shard.recovery_tail.applied_lsn
    finally:
        root.close()
    return Pristine(
        data_dir,
        before_replace,
        lsn,
        {
            "PathCurrent": ("path_current", path_key),
            "ArtifactRevision": ("artifact_revision", revision_key),
            "History": ("history", history_key),
            # One row from outbox record format 3 on (InlineOutboxRecord): header and payload.
            "outbox record": ("recovery_outbox", outbox.header_key(lsn)),
            "System": ("system", b"commit_clock"),
        },
    )


def _row_span(shard_dir: str, tree: str, key: bytes) -> tuple[int, int]:
    """[start, end) in data.mdb of the live LMDB leaf node of `key`: its 8-byte node header
    (data size, flags, key size), the key and the stored value. Stale copies of the same bytes
    (pages a later commit replaced) are told apart by flipping a byte and reading LMDB back."""
    env = lmdb.open(shard_dir, max_dbs=64, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            stored = txn.get(key, db=env.open_db(tree.encode(), txn=txn, create=False))
    finally:
        env.close()
    path = os.path.join(shard_dir, "data.mdb")
    with open(path, "rb") as f:
        blob = f.read()
    needle = key + stored
    position = blob.find(needle)
    while position >= 0:
        last = position + len(needle) - 1
        _flip(path, last, 0x01)
        env = lmdb.open(shard_dir, max_dbs=64, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                live = txn.get(key, db=env.open_db(tree.encode(), txn=txn, create=False)) != stored
        finally:
            env.close()
            _flip(path, last, 0x01)
        if live:
            start = position - 8
            size = struct.unpack_from("<HH", blob, start)
            assert size[0] | size[1] << 16 == len(stored)
            return start, position + len(needle)
        position = blob.find(needle, position + 1)
    raise AssertionError(f"no live copy of the {tree} row in {path}")


def _flip(path: str, offset: int, pattern: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ pattern]))


def _read_paths(data_dir: str, pristine: Pristine, cli=None) -> dict:
    """What every read path returns now: a comparable value, or "refused" (IntegrityError)."""
    out = {}

    def attempt(name, fn):
        try:
            out[name] = fn()
        except IntegrityError:
            out[name] = "refused"

    try:
        root = datadir.open_root(data_dir, recover=False)
    except IntegrityError:
        return {"open": "refused"}
    try:

        def stat():
            with root.read() as view:
                e = listing.stat(view, root, "w", "outputs/f3").entry
                return (e.generation, e.artifact_revision_id, e.logical_size, e.body_digest_uri)

        def get():
            with root.read() as view:
                return reading.read(root, listing.stat(view, root, "w", "outputs/f3").entry, view=view)

        def ls():
            with root.read() as view:
                page = listing.list_dir(view, root, "w", "outputs")
                return [(c.name, c.kind, c.entry.logical_size if c.entry else None) for c in page.children]

        def as_of_before_replace():
            with root.read(pristine.before_replace) as view:
                entry = listing.stat(view, root, "w", "outputs/f3").entry
                return reading.read(root, entry, view=view)

        def point_and_scan():
            found = {}
            with root.read() as view:
                for target, (tree, key) in pristine.keys.items():
                    if tree in ("history", "recovery_outbox", "system"):
                        continue
                    found[target] = view.get(tree, key)
                    found[target + " scan"] = list(iter_prefix(view, tree, root.root_id))
            return found

        def replication():
            digest, entries = root.shard.outbox_after(0)
            return digest, [(e.lsn, e.header.chain_digest, e.payload) for e in entries]

        for name, fn in (
            ("stat", stat),
            ("get", get),
            ("ls", ls),
            ("as-of", as_of_before_replace),
            ("point+scan", point_and_scan),
            ("replication", replication),
        ):
            attempt(name, fn)
    finally:
        root.close()
    if cli is not None:
        for name, argv in (("cli get", ["get", "w:outputs/f3"]), ("cli ls", ["ls", "-l", "w:outputs"])):
            code, stdout = cli(argv)
            out[name] = "refused" if code == 5 else (code, stdout)
    return out


@pytest.fixture
def damaged(tmp_path, pristine, capsysbinary):
    """A copy of the pristine data directory to damage, and the CLI over it."""
    data_dir = str(tmp_path / "data")
    shutil.copytree(pristine.data_dir, data_dir)

    def cli(argv):
        capsysbinary.readouterr()
        code = cli_main(["--data-dir", data_dir, *argv])
        return code, capsysbinary.readouterr().out

    return data_dir, cli


def _matrix(data_dir: str, pristine: Pristine, spans, patterns, cli=None) -> Counter:
    """Flip each byte of each span with each pattern, one at a time; tally every read path's
    outcome. Nothing may differ from the undamaged answers but a refusal."""
    shard_dir = os.path.join(data_dir, "shard")
    mdb = os.path.join(shard_dir, "data.mdb")
    expected = _read_paths(data_dir, pristine, cli)
    assert "refused" not in expected.values(), expected
    tally = Counter()
    for start, end in spans:
        for offset in range(start, end):
            for pattern in patterns:
                _flip(mdb, offset, pattern)
                try:
                    seen = _read_paths(data_dir, pristine, cli)
                finally:
                    _flip(mdb, offset, pattern)
                    if os.path.exists(os.path.join(shard_dir, ALARM_NAME)):
                        os.unlink(os.path.join(shard_dir, ALARM_NAME))
                tally["flips"] += 1
                for path, value in seen.items():
                    if value == "refused":
                        tally["refused"] += 1
                    elif value == expected[path]:
                        tally["served the original"] += 1
                    else:
                        tally["served wrong"] += 1
                        raise AssertionError(
                            f"byte {offset} ^ {pattern:#x}: {path} served {value!r}, not {expected[path]!r}"
                        )
    assert _read_paths(data_dir, pristine, cli) == expected  # restored: everything as before
    return tally


@pytest.mark.long
@pytest.mark.parametrize("target", ["PathCurrent", "ArtifactRevision", "History", "outbox record", "System"])
def test_every_flipped_byte_of_a_live_row_is_refused_or_harmless(pristine, damaged, target):
    """Seed: the shard validates before any mutation, and nokvfs reads a row only through its
    envelope (u8 version | xxh3-64 over tree, key and value | value): "corruption of any row is
    detected before its contents are used ... never wrong bytes" (issue 13)."""
    data_dir, cli = damaged
    tree, key = pristine.keys[target]
    span = _row_span(os.path.join(data_dir, "shard"), tree, key)
    # Every bit of each byte at once, and its lowest bit alone (the outbox record, the largest
    # row, only the former, to bound the test's time).
    patterns = (0xFF,) if target == "outbox record" else (0xFF, 0x01)
    tally = _matrix(data_dir, pristine, [span], patterns, cli if target == "PathCurrent" else None)
    print(f"{target}: {span[1] - span[0]} bytes, {dict(tally)}")
    assert tally["flips"] == len(patterns) * (span[1] - span[0]) and tally["served wrong"] == 0
    assert tally["refused"] > 0


def test_every_flipped_byte_of_the_meta_pages_is_refused_or_harmless(pristine, damaged):
    """LMDB's two meta pages name the B-tree roots and carry no checksum: nokvfs checks them
    before LMDB opens the file (layout, magic, version, page size, map size, last page, roots,
    transaction ids). Every byte of the used part of each meta page is flipped on its own; the
    rest of each page, which LMDB never reads, is flipped all at once."""
    data_dir, _ = damaged
    used = 16 + 136  # page header + MDB_meta (LMDB 0.9)
    page = 4096
    tally = _matrix(data_dir, pristine, [(0, used), (page, page + used)], (0xFF, 0x01, 0x02, 0x80))
    mdb = os.path.join(data_dir, "shard", "data.mdb")
    expected = _read_paths(data_dir, pristine)
    for start in (used, page + used):
        for offset in range(start, start - used + page):
            _flip(mdb, offset, 0xFF)
        assert _read_paths(data_dir, pristine) == expected
        for offset in range(start, start - used + page):
            _flip(mdb, offset, 0xFF)
    print(f"meta pages: {2 * used} bytes, {dict(tally)}")
    assert tally["served wrong"] == 0 and tally["refused"] > 0


def test_a_rolled_back_meta_page_is_refused_by_the_commit_witness(pristine, damaged):
    """A damaged transaction id that keeps LMDB's own rules (N becoming N - 2, so the pair stays
    consecutive) makes LMDB open the previous commit's state: consistent, but stale. The commit
    witness, written after every commit, refuses it."""
    data_dir, _ = damaged
    mdb = os.path.join(data_dir, "shard", "data.mdb")
    with open(mdb, "r+b") as f:
        raw = bytearray(f.read(8192))
        ids = [struct.unpack_from("<Q", raw, p * 4096 + 144)[0] for p in (0, 1)]
        newest = ids.index(max(ids))
        struct.pack_into("<Q", raw, newest * 4096 + 144, max(ids) - 2)
        f.seek(0)
        f.write(raw)
    with pytest.raises(ShardCorrupt, match="older state"):
        datadir.open_root(data_dir, recover=False)
    assert cli_main(["--data-dir", data_dir, "ls", "w:outputs"]) == 5
    with open(mdb, "r+b") as f:
        struct.pack_into("<Q", raw, newest * 4096 + 144, max(ids))
        f.seek(0)
        f.write(raw)
    os.unlink(os.path.join(data_dir, "shard", ALARM_NAME))
    datadir.open_root(data_dir, recover=False).close()


def test_a_damaged_shard_refuses_writes_in_every_process(pristine, damaged):
    """Issue 13: "writes refused on a shard known to be corrupt" -- once one process has met the
    damage (here a CLI `get`, exit 5), another process's write is refused too, even one that
    touches no damaged row, until `fsck --repair` finds everything intact again."""
    data_dir, cli = damaged
    tree, key = pristine.keys["PathCurrent"]
    mdb = os.path.join(data_dir, "shard", "data.mdb")
    start, end = _row_span(os.path.join(data_dir, "shard"), tree, key)
    _flip(mdb, end - 1, 0x04)
    assert cli(["get", "w:outputs/f3"])[0] == 5
    assert os.path.exists(os.path.join(data_dir, "shard", ALARM_NAME))
    assert cli(["workbench", "create", "other"])[0] == 5
    assert cli(["get", "w:outputs/f1"]) == (0, BODIES["outputs/f1"])  # intact rows are still served
    assert cli(["fsck", "--repair"])[0] == 5  # still damaged: the alarm stays
    _flip(mdb, end - 1, 0x04)
    assert cli(["fsck", "--repair"])[0] == 0
    assert cli(["workbench", "create", "other"])[0] == 0


@pytest.mark.damages_store("leaves a store of the older value format")
def test_a_store_without_row_envelopes_is_refused_naming_why(pristine, damaged):
    """value_format_version 2 seals every row; a store of value format 1 (bare values, written
    before the envelope) is refused with a SchemaMismatch that says so, not read as damage."""
    from nokvfs.engine.records import SYS_SCHEMA, SchemaMarker

    data_dir, cli = damaged
    shard_dir = os.path.join(data_dir, "shard")
    env = lmdb.open(shard_dir, max_dbs=64)
    with env.begin(write=True) as txn:
        for name in keys.TREE_NAMES:
            db = env.open_db(name.encode(), txn=txn, create=False)
            for key, stored in list(txn.cursor(db)):
                value = rows.unseal(name, key, stored)
                if name == "system" and key == SYS_SCHEMA:
                    old = SchemaMarker.decode(value)
                    value = SchemaMarker(1, old.schema_id, old.format_version).encode()
                txn.put(key, value, db=db)
    env.close()
    with pytest.raises(SchemaMismatch, match="older nokvfs.*value_format_version 1"):
        Shard.open(shard_dir)
    assert cli(["ls", "w:"])[0] == 5
    assert not os.path.exists(os.path.join(shard_dir, ALARM_NAME))  # not damage: no alarm


@pytest.mark.damages_store("leaves a row rewritten outside the engine")
def test_open_is_cheap_and_verify_is_explicit(pristine, damaged):
    """The full state-digest recomputation is fsck's (and `--verify`'s), not every open's: a row
    rewritten with a valid envelope but other contents opens by default and is found by the
    explicit verification (CLI `--verify`, exit 5)."""
    data_dir, cli = damaged
    tree, key = pristine.keys["ArtifactRevision"]
    env = lmdb.open(os.path.join(data_dir, "shard"), max_dbs=64)
    with env.begin(write=True) as txn:
        db = env.open_db(tree.encode(), txn=txn, create=False)
        value = bytearray(rows.unseal(tree, key, txn.get(key, db=db)))
        value[-1] ^= 0x01
        txn.put(key, rows.seal(tree, key, bytes(value)), db=db)
    env.close()
    assert cli(["ls", "w:outputs"])[0] == 0
    assert cli(["--verify", "ls", "w:outputs"])[0] == 5
    assert os.path.exists(os.path.join(data_dir, "shard", WITNESS_NAME))


@needs_fuse
@pytest.mark.damages_store("damages a PathCurrent row under a live mount")
def test_a_damaged_row_reads_as_eio_in_the_mount_and_the_daemon_goes_on(tmp_path):
    """Issue 13: "a typed IntegrityError (exit 5, EIO in the mount), never wrong bytes"."""
    import errno

    with mounted(str(tmp_path)) as m:
        # Rows on both sides of the damaged one: a lookup that lands right next to a damaged row
        # is refused too (it cannot tell whether the damaged row is the one it looks for).
        m.facade(
            "for i in range(5):\n"
            "    namespace.put(root, 'wb', f'outputs/a{i}', b'a'); namespace.put(root, 'wb', f'outputs/z{i}', b'z')\n"
            "namespace.put(root, 'wb', 'outputs/damaged.bin', b'd' * 300); namespace.put(root, 'wb', 'input/fine.bin', "
            "b'f' * 300)"
        )
        root = datadir.open_root(m.data_dir, recover=False)
        try:
            with root.read() as view:
                _, wbk = workbench.visible(view, root.root_id, "wb")
            key = keys.path_current_key(root.root_id, wbk.incarnation_id, ("outputs", "damaged.bin"))
        finally:
            if root.blocks.cache is not None:
                root.blocks.cache.close()
            root.close()
        shard_dir = os.path.join(m.data_dir, "shard")
        _, end = _row_span(shard_dir, "path_current", key)
        _flip(os.path.join(shard_dir, "data.mdb"), end - 3, 0x20)
        for call in (os.stat, lambda p: open(p, "rb").read()):
            with pytest.raises(OSError) as caught:
                call(m.path("wb", "outputs", "damaged.bin"))
            assert caught.value.errno == errno.EIO
        with open(m.path("wb", "input", "fine.bin"), "rb") as f:
            assert f.read() == b"f" * 300
        assert "RowCorrupt" in m.log() or "ShardCorrupt" in m.log()
