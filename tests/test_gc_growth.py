"""GC leaves nothing of a freed revision once its audit window has passed: not its
ArtifactRevision, manifest, GcCandidate or GcOperation rows, nor any History row naming it."""

from __future__ import annotations

from nokvfs.engine import history, rows
from nokvfs.engine.scan import iter_prefix
from nokvfs.schema import keys
from nokvfs.schema.enums import OperationKind, RevisionState
from nokvfs.schema.records import ArtifactRevision
from nokvfs.workspace import datadir, gc, listing, namespace, reading, retention, workbench
from nokvfs.workspace.retention import RetentionSettings


def open_with(tmp_path, **retention):
    datadir.init(str(tmp_path / "data"), block_size=4096, retention=RetentionSettings(**retention))
    root = datadir.open_root(str(tmp_path / "data"))
    workbench.create(root, "w")
    return root


def raw_trees(root) -> dict:
    """Every (key, value) of every tree, the values as stored rows hold them: out of their
    envelope (a deflated Operation, manifest or revision row inflated) and, for History, the
    previous value itself (deflated History values inflated), so an id inside is found."""
    shard = root.shard
    trees = {}
    with shard._env.begin() as txn:
        for name, db in shard._dbs.items():
            items = [(key, rows.unseal(name, key, stored)) for key, stored in txn.cursor(db).iternext()]
            if name == "history":
                items = [(key, history.decode_value(value) or b"") for key, value in items]
            trees[name] = items
    return trees


def rows_naming(root, revision_ids) -> list:
    found = []
    for name, items in raw_trees(root).items():
        for key, value in items:
            for revision_id in revision_ids:
                if revision_id in key or revision_id in value:
                    found.append((name, key.hex()))
    return found


def test_nothing_of_a_freed_revision_stays_once_its_audit_window_passed(tmp_path):
    root = open_with(tmp_path, versions=0, request_seconds=0)
    try:
        for n in range(40):
            namespace.put(root, "w", f"outputs/f{n % 4}", b"body %d " % n * 300)
        namespace.remove(root, "w", "outputs/f3")
        report = gc.collect(root)
        retention.run(root)  # `nokvfs gc` runs both: the change events naming them go too
        gc.prune_history(root)
        freed = [bytes.fromhex(h) for h in report.freed]
        assert len(freed) == 37 and report.records_pruned == 37
        # Outbox payloads (the recovery log) are compressed or truncated; the trees are searched.
        leftover = [(tree, key) for tree, key in rows_naming(root, freed) if tree != "recovery_outbox"]
        assert sorted({t for t, _ in leftover}) == [] and leftover == []
        with root.read() as view:
            for n in range(3):  # what lives is whole
                entry = listing.stat(view, root, "w", f"outputs/f{n}").entry
                assert reading.read(root, entry) == b"body %d " % (36 + n) * 300
        assert gc.collect(root).records_pruned == 0
    finally:
        root.close()


def test_finished_collections_stay_within_the_audit_window(tmp_path):
    root = open_with(tmp_path, versions=1000)
    try:
        entry = namespace.put(root, "w", "outputs/f", b"x" * 5000)
        namespace.remove(root, "w", "outputs/f")
        report = gc.collect(root)
        assert report.freed_revisions == 1 and report.records_pruned == 0
        with root.read() as view:
            raw = view.get(
                "artifact_revision", keys.ArtifactRevisionKey(root.root_id, entry.artifact_revision_id).encode()
            )
        assert ArtifactRevision.decode(raw).state == RevisionState.Deleted
        datadir.set_retention(root.data_dir, versions=0)
        assert gc.collect(root).records_pruned == 1
        gc_trees = {"artifact_revision", "artifact_manifest", "gc_candidate", "operation"}
        left = {tree for tree, _ in rows_naming(root, [entry.artifact_revision_id])}
        assert left & gc_trees == {"operation"}  # the publish's terminal row: its replay window is not over
        with root.read() as view:
            assert list(iter_prefix(view, "operation", keys.operation_prefix(root.root_id, OperationKind.Gc))) == []
    finally:
        root.close()
