"""GC under many interleavings: never a referenced or held object deleted; everything else freed.

A seeded random workload of puts, appends, renames, removes, snapshot mints/retires, commits and
restores runs while a collector thread calls gc.collect in a loop. A model of what every live
workbench, snapshot and commit must show is checked byte for byte after every phase; at the end
fsck must find nothing, and the store must hold exactly the objects of Available revisions.
"""

from __future__ import annotations

import random
import threading

import pytest

from nokvfs.errors import GenerationConflict, NotFound
from nokvfs.schema.enums import RevisionState
from nokvfs.schema.records import ArtifactRevision
from nokvfs.workspace import (
    append,
    asof,
    changes,
    commit,
    datadir,
    fsck,
    gc,
    listing,
    namespace,
    publish,
    reading,
    restore,
    snapshot,
    workbench,
)
from tests.conftest import stored_rows

pytest_plugins = ["tests.s3_fixtures"]

PATHS = [f"{section}/{name}" for section in ("outputs", "logs") for name in ("a", "b", "c", "d/e", "d/f")]


def tree_of(root, view, workbench_id):
    return {
        c.name: read_from_store(root, view, c.entry) for c in listing.list_recursive(view, root, workbench_id).children
    }


def read_from_store(root, view, entry):
    """The body, after checking every object its manifest names is present in the store itself."""
    for row in publish.read_manifest(view, root, entry.manifest_id):
        assert root.store.head(row.object_key) is not None, f"{row.object_key} was deleted while referenced"
    return reading.read(root, entry, view=view)


class Model:
    def __init__(self, root, rng):
        self.root, self.rng = root, rng
        self.live = {"w": {}}
        self.snapshots = []  # (workbench, snapshot id, expected tree)
        self.commits = []  # (commit id, expected tree without the run manifest)
        self.forks = 0

    def step(self):
        rng, root = self.rng, self.root
        wbk = rng.choice(sorted(self.live))
        files = self.live[wbk]
        op = rng.choices(
            ["put", "append", "rename", "remove", "mint", "retire", "commit", "fork"], [6, 3, 2, 2, 1, 1, 1, 1]
        )[0]
        path = rng.choice(PATHS)
        mutable = sorted(p for p in files if not p.startswith("metadata/"))  # manifests are typed
        if op == "put":
            data = rng.randbytes(rng.choice([0, 10, 3000, 9000]))
            try:
                namespace.put(root, wbk, path, data)
                files[path] = data
            except Exception as exc:  # a path under a file, or a file over a directory
                assert type(exc).__name__ == "InvalidInput", exc
        elif op == "append" and mutable:
            path = rng.choice(mutable)
            data = rng.randbytes(rng.choice([1, 700, 5000]))
            append.append(root, wbk, path, data)
            files[path] += data
        elif op == "rename" and mutable:
            source = rng.choice(mutable)
            try:
                namespace.rename(root, wbk, source, path)
                files[path] = files.pop(source)
            except Exception as exc:
                assert type(exc).__name__ in ("InvalidInput", "GenerationConflict"), exc
        elif op == "remove" and mutable:
            path = rng.choice(mutable)
            namespace.remove(root, wbk, path)
            del files[path]
        elif op == "mint":
            snap = snapshot.mint(root, wbk)
            self.snapshots.append((wbk, snap.snapshot_id, dict(files)))
        elif op == "retire" and self.snapshots:
            wbk_s, snapshot_id, _ = self.snapshots.pop(rng.randrange(len(self.snapshots)))
            snapshot.retire(root, wbk_s, snapshot_id)
        elif op == "commit" and wbk == "w":
            result = commit.build(root, "w")
            self.commits.append((result.commit_id, dict(files)))
            files["metadata/run_manifest.json"] = None  # present, content not modelled
        elif op == "fork" and (self.snapshots or self.commits) and self.forks < 3:
            self.forks += 1
            destination = f"fork{self.forks}"
            if self.snapshots and (not self.commits or rng.random() < 0.5):
                wbk_s, snapshot_id, expected = rng.choice(self.snapshots)
                restore.restore(root, wbk_s, ("snapshot", snapshot_id), destination)
            else:
                commit_id, expected = rng.choice(self.commits)
                restore.restore(root, "w", ("commit", commit_id), destination)
                expected = dict(expected, **{"metadata/run_manifest.json": None})
            self.live[destination] = {k: v for k, v in expected.items()}
            self.live[destination]["metadata/restore_manifest.json"] = None

    def check(self):
        root = self.root
        with root.read() as view:
            for wbk, files in self.live.items():
                got = tree_of(root, view, wbk)
                assert set(got) == set(files), wbk
                for path, data in files.items():
                    if data is not None:
                        assert got[path] == data, (wbk, path)
            for wbk, snapshot_id, expected in self.snapshots:
                at = snapshot.view_at(view, root, snapshot.get(root, wbk, snapshot_id))
                got = tree_of(root, at, wbk)
                assert {k: v for k, v in got.items() if k in expected and expected[k] is not None} == {
                    k: v for k, v in expected.items() if v is not None
                }
            for commit_id, expected in self.commits:
                tree = asof.at_commit(view, root, commit_id)
                got = {path: read_from_store(root, view, entry) for path, entry in tree.files()}
                for path, data in expected.items():
                    if data is not None:
                        assert got[path] == data, (commit_id.hex(), path)


def whole_feed(root):
    out, cursor = [], None
    while True:
        page = changes.read_changes(root, cursor=cursor, limit=1000)
        out += page.changes
        cursor = page.cursor
        if not page.more:
            return out


def stored_objects(root):
    return {info.key for info in root.store.list("nokv/artifacts/")}


def available_objects(root):
    out = set()
    with root.read() as view:
        for key, value in stored_rows(view._txn, root.shard, "artifact_revision"):
            if ArtifactRevision.decode(value).state == RevisionState.Available:
                revision_id = key[16:]
                out |= {
                    r.object_key
                    for r in publish.read_manifest(view, root, revision_id)
                    if r.physical_owner_revision_id == revision_id
                }
    return out


def run_workload(root, seed: int, steps: int):
    rng = random.Random(seed)
    # Read through the store, not the block cache: a deleted object must be seen as deleted.
    if root.blocks.cache is not None:
        root.blocks.cache.close()
        root.blocks.cache = None
    model = Model(root, rng)
    workbench.create(root, "w")
    stop = threading.Event()
    failures = []

    def collector():
        while not stop.wait(0.005):  # a collector runs now and then, not in a hot loop
            try:
                gc.collect(root)
            except (GenerationConflict, NotFound):
                pass
            except Exception as exc:
                failures.append(exc)
                return

    thread = threading.Thread(target=collector)
    thread.start()
    try:
        for i in range(steps):
            model.step()
            if i % 10 == 9:
                model.check()
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    model.check()
    assert root.shard.history_floor > 0, "the collector pruned History while the workload ran"
    # Retire every snapshot; everything else stays; then collect to a fixpoint, which prunes
    # History up to the current version: the change feed reads the same afterwards.
    for wbk, snapshot_id, _ in model.snapshots:
        snapshot.retire(root, wbk, snapshot_id)
    model.snapshots.clear()
    feed = whole_feed(root)
    report = gc.collect(root)
    assert report.history_floor == root.shard.history_floor == root.shard.commit_version
    assert whole_feed(root) == feed
    model.check()
    report = fsck.check(root)
    assert report.ok, report.findings
    assert stored_objects(root) == available_objects(root)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gc_never_frees_what_is_referenced_and_frees_what_is_not(tmp_path, seed):
    datadir.init(str(tmp_path / "data"), block_size=4096)
    root = datadir.open_root(str(tmp_path / "data"))
    try:
        run_workload(root, seed, steps=120)
    finally:
        root.close()


def test_gc_on_s3_frees_exactly_the_unreferenced_objects(tmp_path, s3_endpoint, s3_bucket):
    datadir.init(str(tmp_path / "data"), store=f"s3://{s3_bucket}/gc", endpoint_url=s3_endpoint, block_size=4096)
    root = datadir.open_root(str(tmp_path / "data"))
    try:
        run_workload(root, 7, steps=50)
    finally:
        root.close()
