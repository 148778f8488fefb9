"""Shared fixtures: a fresh shard with one placed, fenced root."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import signal
import time

import pytest

from nokvfs.engine.command import MetadataCommand
from nokvfs.engine.placement import PlacementStore, install_root_fence
from nokvfs.engine.shard import Shard
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.ids import new_id16


@dataclasses.dataclass
class ShardEnv:
    shard: Shard
    path: str
    root_id: bytes
    placement_generation: int

    def command(self, *, mutations=(), predicates=(), events=(), result=b"", request_id=None, read_version=None, **kw):
        fields = dict(
            root_id=self.root_id,
            logical_shard_id=self.shard.logical_shard_id,
            placement_generation=self.placement_generation,
            owner_epoch=self.shard.owner_epoch,
            request_id=request_id or new_id16(),
            read_version=self.shard.commit_version if read_version is None else read_version,
            predicates=tuple(predicates),
            mutations=tuple(mutations),
            events=tuple(events),
            result=result,
        )
        fields.update(kw)
        return MetadataCommand(**fields)

    def apply(self, **kw):
        return self.shard.apply(self.command(**kw))

    def stored(self, txn, tree: str, key: bytes):
        """The value the engine stored at `key` of `tree`, read raw and taken out of its row envelope."""
        return stored_value(txn, self.shard, tree, key)

    def reopen(self, **options) -> Shard:
        self.shard.close()
        self.shard = Shard.open(self.path, **options)
        return self.shard


def stored_value(txn, shard: Shard, tree: str, key: bytes):
    from nokvfs.engine import rows

    return rows.unseal(tree, key, txn.get(key, db=shard._dbs[tree]))


def stored_rows(txn, shard: Shard, tree: str):
    """Every (key, value) of a tree, read raw and taken out of their row envelopes."""
    from nokvfs.engine import rows

    return [(k, rows.unseal(tree, k, v)) for k, v in txn.cursor(shard._dbs[tree])]


def make_shard_env(tmp_path) -> ShardEnv:
    path = str(tmp_path / "shard")
    shard = Shard.create(path, new_id16())
    placements = PlacementStore(str(tmp_path / "control"))
    root_id = new_id16()
    placements.create(root_id, shard.logical_shard_id)
    placement = placements.transition(root_id, RootPlacementLifecycle.Active, expected_generation=1)
    placements.close()
    install_root_fence(shard, root_id, placement)
    return ShardEnv(shard, path, root_id, placement.placement_generation)


def sigkill_once_ready(target, args, *, delay: float = 0.0, timeout: float = 60.0) -> None:
    """Run target(*args, ready) in a spawned child; once it sets `ready`, let it run `delay`
    seconds more and SIGKILL it. The child is always reaped, whatever happens."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=target, args=(*args, ready))
    proc.start()
    try:
        assert ready.wait(timeout), f"{target.__name__} never got ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


@pytest.fixture
def format_2_records(monkeypatch):
    """Outbox records written as before format 3 (a StoredOutboxHeader and its chunk rows, never
    one InlineOutboxRecord): request it before shard_env so the shard's first records are too."""
    from nokvfs.engine import outbox

    monkeypatch.setattr(outbox, "INLINE_BYTES", -1)


@pytest.fixture
def shard_env(tmp_path):
    env = make_shard_env(tmp_path)
    yield env
    env.shard.close()


# --- fsck after every workload ------------------------------------------------------------------
# As s3ql's tests do: whatever a test did to a data directory, the metadata must still check out.
# After each test (its own fixtures torn down first: mounts unmounted, roots closed), every nokvfs
# data directory under its tmp_path is opened the way the next process would open it (recovery of
# dead owners' operations included) and fsck'd with every block read. A test that damages a store
# on purpose says so with @pytest.mark.damages_store("why").


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "damages_store(reason): the test leaves its data directory damaged on purpose (no fsck after it)"
    )
    config.addinivalue_line(
        "markers", "block_cache: the test's local data directory has a block cache (one asked for at init)"
    )
    config.addinivalue_line(
        "markers", "long: one of the suite's longest tests (20 s or more on a two-CPU machine): run first"
    )


def pytest_collection_modifyitems(config, items):
    """The longest tests first, shared out among the workers (stable otherwise). pytest-xdist's
    worksteal hands each of N workers a contiguous part of this order (the first len // N items to
    the first, and so on) and lets an idle worker take from the end of another's; a long test
    left near the end ran alone while the others had finished, so the suite took as long as its
    last long test. Each worker's part now starts with every N-th of them."""
    long = [item for item in items if item.get_closest_marker("long") is not None]
    short = [item for item in items if item.get_closest_marker("long") is None]
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ordered, remaining, taken = [], len(items), 0
    for worker in range(workers):
        size = remaining // (workers - worker)  # what the scheduler sends this worker
        remaining -= size
        part = long[worker::workers]
        fill = max(0, size - len(part))
        ordered += part + short[taken : taken + fill]
        taken += fill
    ordered += short[taken:]
    items[:] = ordered


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.call_failed = report.failed


def data_dirs_under(top: str):
    """Every nokvfs data directory below `top` (not descending into one, nor into a mount)."""
    for dirpath, dirnames, filenames in os.walk(top):
        if "nokvfs.json" in filenames:
            dirnames[:] = []
            yield dirpath
            continue
        dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]


def fsck_data_dir(data_dir: str):
    from nokvfs.workspace import datadir, fsck

    root = datadir.open_root(data_dir)
    try:
        return fsck.check(root)
    finally:
        root.close()


@pytest.fixture(autouse=True)
def memory_spools_removed(tmp_path):
    """The memory spool directories of the test's data directories go with the test (a daemon
    removes its own when empty; kernel-less tests and killed daemons leave theirs)."""
    yield
    from nokvfs.fs import spools

    for data_dir in data_dirs_under(str(tmp_path)):
        path = spools.memory_spool_path(data_dir)
        if path is not None:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        spools._memory_dirs.pop(data_dir, None)


@pytest.fixture(autouse=True)
def fsck_after_workload(request, tmp_path):
    yield
    if request.node.get_closest_marker("damages_store") or getattr(request.node, "call_failed", True):
        return
    for data_dir in data_dirs_under(str(tmp_path)):
        report = fsck_data_dir(data_dir)
        assert report.ok, f"fsck of {data_dir} after the test: " + "; ".join(
            f"{f.code} {f.subject}: {f.detail}" for f in report.findings
        )
