"""fsck: a healthy store has no findings; each injected kind of damage has its finding code."""

from __future__ import annotations

import dataclasses

import pytest

from nokvfs.engine import rows as envelope
from nokvfs.engine.command import Delete, Put
from nokvfs.errors import ShardCorrupt
from nokvfs.schema import keys
from nokvfs.schema.enums import HistoryHoldKind, ReferenceKind, RevisionState
from nokvfs.schema.records import (
    ArtifactManifest,
    ArtifactRevision,
    PathEntry,
    RevisionRef,
)
from nokvfs.workspace import (
    append,
    datadir,
    fsck,
    gc,
    namespace,
    publish,
    snapshot,
    workbench,
)
from nokvfs.workspace.root import Built, intent_digest
from tests.conftest import stored_rows
from tests.workspace_helpers import opened_root


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("w",), block_size=4096) as r:
        namespace.put(r, "w", "outputs/a", b"a" * 10_000)
        append.append(r, "w", "outputs/a", b"b" * 100)
        namespace.put(r, "w", "outputs/gone", b"g" * 100)
        namespace.remove(r, "w", "outputs/gone")
        snapshot.mint(r, "w", alias="s")
        yield r


def codes(report):
    return sorted({f.code for f in report.findings})


def inject(root, mutations):
    root.apply(lambda view: Built(mutations=list(mutations)), digest=intent_digest("test.damage", str(mutations)))


def entry_of(root, path="outputs/a"):
    with root.read() as view:
        _, wbk = workbench.visible(view, root.root_id, "w")
        key = keys.path_current_key(root.root_id, wbk.incarnation_id, tuple(path.split("/")))
        return wbk, key, PathEntry.decode(view.get("path_current", key))


def revision_row(root, revision_id):
    key = keys.ArtifactRevisionKey(root.root_id, revision_id).encode()
    with root.read() as view:
        return key, ArtifactRevision.decode(view.get("artifact_revision", key))


def test_a_healthy_store_has_no_findings(root):
    gc.collect(root)
    report = fsck.check(root)
    assert report.ok, report.findings
    assert report.checked["objects"] >= 3 and report.checked["paths"] == 1


@pytest.mark.damages_store("injects the damage fsck must find")
def test_ref_count(root):
    _, _, entry = entry_of(root)
    key, revision = revision_row(root, entry.artifact_revision_id)
    inject(root, [Put("artifact_revision", key, dataclasses.replace(revision, strong_reference_count=5))])
    assert "REF_COUNT" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_ref_dangling_and_path_ref_orphan(root):
    wbk, _, _ = entry_of(root)
    owner = publish.path_owner(wbk.incarnation_id, ("outputs", "ghost"))
    ghost = b"\x77" * 16
    inject(
        root,
        [
            Put(
                "revision_ref",
                keys.RevisionRefKey(root.root_id, ReferenceKind.Path, owner, ghost).encode(),
                RevisionRef(1, 1),
            )
        ],
    )
    assert {"REF_DANGLING", "PATH_REF_ORPHAN"} <= set(codes(fsck.check(root)))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_path_ref_missing(root):
    wbk, _, entry = entry_of(root)
    owner = publish.path_owner(wbk.incarnation_id, ("outputs", "a"))
    inject(
        root,
        [
            Delete(
                "revision_ref",
                keys.RevisionRefKey(root.root_id, ReferenceKind.Path, owner, entry.artifact_revision_id).encode(),
            )
        ],
    )
    assert {"PATH_REF_MISSING", "REF_COUNT"} <= set(codes(fsck.check(root)))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_path_revision(root):
    _, _, entry = entry_of(root)
    key, revision = revision_row(root, entry.artifact_revision_id)
    inject(root, [Put("artifact_revision", key, dataclasses.replace(revision, state=RevisionState.Quarantined))])
    assert "PATH_REVISION" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_dependency_count(root):
    _, _, entry = entry_of(root)
    key, revision = revision_row(root, entry.artifact_revision_id)
    inject(root, [Put("artifact_revision", key, dataclasses.replace(revision, dependency_count=3))])
    assert "DEPENDENCY_COUNT" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_manifest_coverage(root):
    _, _, entry = entry_of(root)
    key = keys.ArtifactManifestKey(root.root_id, entry.artifact_revision_id, 0).encode()
    with root.read() as view:
        row = ArtifactManifest.decode(view.get("artifact_manifest", key))
    inject(root, [Put("artifact_manifest", key, dataclasses.replace(row, logical_offset=7))])
    assert "MANIFEST_COVERAGE" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_gc_candidate_missing(root):
    with root.read() as view:
        candidates = [k for k, _ in view._txn.cursor(view._dbs["gc_candidate"])]
    inject(root, [Delete("gc_candidate", k) for k in candidates])
    assert "GC_CANDIDATE_MISSING" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_hold(root):
    snap = snapshot.get(root, "w", "s")
    inject(
        root,
        [
            Delete(
                "history_hold",
                keys.HistoryHoldKey(
                    root.root_id, HistoryHoldKind.Snapshot, snap.snapshot_id.to_bytes(8, "big")
                ).encode(),
            )
        ],
    )
    assert "HOLD" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_block_missing_and_block_corrupt(root):
    _, _, entry = entry_of(root)
    with root.read() as view:
        rows = publish.read_manifest(view, root, entry.artifact_revision_id)
    root.store.delete(rows[0].object_key)
    data = bytearray(root.store.get(rows[1].object_key))
    data[0] ^= 1
    root.store.put(rows[1].object_key, bytes(data))
    report = fsck.check(root)
    assert {"BLOCK_MISSING", "BLOCK_CORRUPT"} <= set(codes(report))
    # Without block verification only metadata is checked, and the metadata is intact.
    assert fsck.check(root, verify_blocks=False).ok


def test_orphan_object_is_repaired_only_with_gc_proofs(root):
    prefix = f"nokv/artifacts/{root.logical_shard_id.hex()}/{root.root_id.hex()}/"
    orphan = prefix + ("cd" * 16) + "/blocks/" + "0" * 16
    root.store.put(orphan, b"nobody owns me")
    report = fsck.check(root)
    assert codes(report) == ["ORPHAN_OBJECT"] and not report.repaired
    repaired = fsck.check(root, repair=True)
    assert repaired.repaired == [orphan] and root.store.head(orphan) is None
    assert fsck.check(root).ok


@pytest.mark.damages_store("injects the damage fsck must find")
def test_state_digest(root):
    # A byte changed under the engine (not through a command), by a writer that sealed the
    # changed value in a valid row envelope: only the state digest can tell.
    _, key, _ = entry_of(root)
    env, db = root.shard._env, root.shard._dbs["path_current"]
    with env.begin(write=True) as txn:
        value = bytearray(envelope.unseal("path_current", key, txn.get(key, db=db)))
        value[5] ^= 0x10
        txn.put(key, envelope.seal("path_current", key, bytes(value)), db=db)
    assert "STATE_DIGEST" in codes(fsck.check(root))


@pytest.mark.damages_store("injects the damage fsck must find")
def test_row_corrupt_and_the_integrity_alarm(root):
    # A byte changed in a row's stored bytes: the row fails its envelope check, fsck names it,
    # and the shard refuses writes until `fsck --repair` finds everything intact again.
    _, key, _ = entry_of(root)
    env, db = root.shard._env, root.shard._dbs["path_current"]
    with env.begin(write=True) as txn:
        original = txn.get(key, db=db)
        damaged = bytearray(original)
        damaged[12] ^= 0x10
        txn.put(key, bytes(damaged), db=db)
    report = fsck.check(root)
    assert codes(report) == ["ROW_CORRUPT"]
    assert report.findings[0].subject == f"path_current {key.hex()}"
    with pytest.raises(ShardCorrupt):
        namespace.put(root, "w", "outputs/new", b"x")  # its lookup meets the damaged neighbour
    with pytest.raises(ShardCorrupt, match="writes are refused"):
        workbench.create(root, "elsewhere")  # touches no damaged row, and is refused all the same
    repaired = fsck.check(root, repair=True)
    assert codes(repaired) == ["ROW_CORRUPT"] and not repaired.repaired  # still damaged: kept
    with env.begin(write=True) as txn:
        txn.put(key, original, db=db)
    assert codes(fsck.check(root)) == ["INTEGRITY_ALARM"]
    repaired = fsck.check(root, repair=True)
    assert repaired.ok and repaired.repaired == ["integrity alarm"]
    namespace.put(root, "w", "outputs/new", b"x")
    assert fsck.check(root).ok


@pytest.mark.damages_store("injects the damage fsck must find")
def test_commit_seal_and_consumer_count(root):
    from nokvfs.schema.records import Commit, CommitMember
    from nokvfs.workspace import commit

    result = commit.build(root, "w")
    assert fsck.check(root).ok
    with root.read() as view:
        member_key, member_raw = stored_rows(view._txn, root.shard, "commit_member")[0]
        commit_key = keys.CommitKey(root.root_id, result.commit_id).encode()
        record = Commit.decode(view.get("commit", commit_key))
    member = CommitMember.decode(member_raw)
    inject(root, [Put("commit_member", member_key, dataclasses.replace(member, logical_size=member.logical_size + 1))])
    assert "COMMIT_SEAL" in codes(fsck.check(root))
    inject(
        root,
        [
            Put("commit_member", member_key, member),
            Put("commit", commit_key, dataclasses.replace(record, consumer_count=9)),
        ],
    )
    assert codes(fsck.check(root)) == ["CONSUMER_COUNT"]


@pytest.mark.damages_store("injects the damage fsck must find")
def test_history_floor(root):
    from nokvfs.schema.enums import HistoryHoldState
    from nokvfs.schema.records import HistoryHold

    snapshot.retire(root, "w", "s")
    floor, _ = gc.prune_history(root)
    assert floor == root.shard.commit_version and fsck.check(root).ok
    key = keys.HistoryHoldKey(root.root_id, HistoryHoldKind.BuildCommit, b"\x07" * 16).encode()
    inject(root, [Put("history_hold", key, HistoryHold(floor - 1, None, HistoryHoldState.Active, floor))])
    assert codes(fsck.check(root)) == ["HISTORY_FLOOR"]


@pytest.mark.damages_store("injects the damage fsck must find")
@pytest.mark.parametrize("source", ["snapshot", "commit"])
@pytest.mark.parametrize("damage", ["missing", "digest"])
def test_restore_member(root, source, damage):
    from nokvfs.schema.records import RestoreMember
    from nokvfs.workspace import commit, restore

    selector = ("snapshot", "s") if source == "snapshot" else ("commit", commit.build(root, "w").commit_id)
    result = restore.restore(root, "w", selector, "copy", batch=1)
    namespace.put(root, "copy", "outputs/a", b"changed after the restore")  # the destination moves on freely
    gc.collect(root)  # prunes up to the snapshot's hold: its version is still readable
    report = fsck.check(root)
    assert report.ok and report.checked["restores"] == 1
    prefix = keys.restore_member_prefix(root.root_id, result.operation_id)
    with root.read() as view:
        member_key, raw = view.seek("restore_member", prefix, within=prefix)
    if damage == "missing":
        inject(root, [Delete("restore_member", member_key)])
    else:
        member = RestoreMember.decode(raw)
        inject(root, [Put("restore_member", member_key, dataclasses.replace(member, row_digest=b"\x00" * 32))])
    assert codes(fsck.check(root)) == ["RESTORE_MEMBER"]


def test_a_completed_restore_whose_source_is_gone_is_checked_by_count_only(root):
    from nokvfs.workspace import restore

    restore.restore(root, "w", ("snapshot", "s"), "copy")
    snapshot.retire(root, "w", "s")
    assert gc.collect(root).history_floor == root.shard.commit_version  # the source version is pruned
    report = fsck.check(root)
    assert report.ok and report.checked["restores"] == 1


@pytest.mark.damages_store("checks that the after-workload fsck sees damage")
def test_the_after_workload_check_finds_every_data_dir_and_its_damage(root, tmp_path):
    from tests.conftest import data_dirs_under, fsck_data_dir

    datadir.init(str(tmp_path / "nested" / "second"))
    found = sorted(data_dirs_under(str(tmp_path)))
    assert found == [str(tmp_path / "data"), str(tmp_path / "nested" / "second")]
    _, key, entry = entry_of(root)
    inject(root, [Put("path_current", key, dataclasses.replace(entry, logical_size=entry.logical_size + 1))])
    root.close()
    assert "PATH_REVISION" in codes(fsck_data_dir(found[0]))
    assert fsck_data_dir(found[1]).ok


@pytest.mark.damages_store("injects the damage fsck must find")
@pytest.mark.parametrize(
    "tree", ["artifact_revision", "revision_ref", "path_current", "artifact_manifest", "commit", "operation"]
)
def test_undecodable_row(root, tree):
    from nokvfs.schema.enums import OperationKind

    wbk, path_key, entry = entry_of(root)
    garbage = b"\x09not a record"
    row = {
        "artifact_revision": (keys.ArtifactRevisionKey(root.root_id, b"\x05" * 16).encode(), garbage),
        "revision_ref": (root.root_id + b"\x07truncated", RevisionRef(1, 1).encode()),
        "path_current": (keys.path_current_key(root.root_id, wbk.incarnation_id, ("outputs", "junk")), garbage),
        "artifact_manifest": (keys.ArtifactManifestKey(root.root_id, entry.artifact_revision_id, 0).encode(), garbage),
        "commit": (keys.CommitKey(root.root_id, b"\x06" * 32).encode(), garbage),
        "operation": (keys.OperationKey(root.root_id, OperationKind.Restore, b"\x08" * 16).encode(), garbage),
    }[tree]
    inject(root, [Put(tree, *row)])
    report = fsck.check(root)
    assert "UNDECODABLE_ROW" in codes(report)
    assert any(tree.split("_")[0] in f.subject for f in report.findings if f.code == "UNDECODABLE_ROW")


@pytest.mark.damages_store("injects the damage fsck must find")
def test_outbox_chain(root):
    # A byte of a logical outbox record changed under the engine: its payload no longer matches
    # the SHA-256 its header (and the chain) recorded.
    # (Sealed in a valid row envelope, so the chain itself is what must catch it.)
    env, db = root.shard._env, root.shard._dbs["recovery_outbox"]
    with env.begin(write=True) as txn:
        # The first record (0x00 | lsn: one InlineOutboxRecord row, its stored payload last).
        key, raw = next((k, v) for k, v in txn.cursor(db) if len(k) == 9)
        value = bytearray(envelope.unseal("recovery_outbox", key, raw))
        value[-1] ^= 0x01
        txn.put(key, envelope.seal("recovery_outbox", key, bytes(value)), db=db)
    report = fsck.check(root)
    assert codes(report) == ["OUTBOX_CHAIN"]
    assert "SHA-256" in report.findings[0].detail


def test_wide_mode_is_reported_per_area_and_repair_narrows_it(root):
    import os
    import stat

    top = root.data_dir
    os.chmod(top, 0o755)
    os.chmod(os.path.join(top, "shard", "data.mdb"), 0o644)
    os.chmod(os.path.join(top, "nokvfs.json"), 0o604)
    blocks = [
        os.path.join(d, f)
        for d, _, files in os.walk(os.path.join(top, "objects"))
        for f in files
        if d.endswith("blocks")
    ]
    for path in blocks:
        os.chmod(path, 0o640)
    os.chmod(os.path.dirname(blocks[0]), 0o711)
    os.symlink("/etc/passwd", os.path.join(top, "run", "link"))  # not followed, not changed
    report = fsck.check(root, verify_blocks=False)
    wide = {f.subject: f.detail for f in report.findings if f.code == "WIDE_MODE"}
    assert codes(report) == ["WIDE_MODE"]
    assert set(wide) == {".", "shard", "nokvfs.json", "objects"}
    assert (
        wide["objects"].startswith("1 directory wider than 0700 (e.g. ")
        and f"{len(blocks)} files wider than 0600" in wide["objects"]
    )
    assert wide["shard"] == "1 file wider than 0600 (e.g. shard/data.mdb: 0644)"
    assert wide["."] == "1 directory wider than 0700 (e.g. .: 0755)"
    before = os.stat("/etc/passwd").st_mode
    report = fsck.check(root, verify_blocks=False, repair=True)
    assert len(report.repaired) == len(blocks) + 4
    assert os.stat("/etc/passwd").st_mode == before
    assert stat.S_IMODE(os.stat(blocks[0]).st_mode) == 0o600 and stat.S_IMODE(os.stat(top).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(top, "nokvfs.json")).st_mode) == 0o600
    os.unlink(os.path.join(top, "run", "link"))
    assert fsck.check(root).ok
