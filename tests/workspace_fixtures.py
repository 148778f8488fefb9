"""Fixtures and helpers for the Workbench facade tests: real data directories (local directory
store, or S3 on the loopback moto server), readers of the durable rows the facade wrote, and the
child-process workers the crash and two-process tests run.

Import the fixtures a module needs by their ``*_fixture`` names (pytest registers them under
the short name: ``data_dir``, ``root``, ``root_holder``, ``bench``); S3 modules also use
``pytest_plugins = ["tests.s3_fixtures"]``. Nothing here mocks the object store: every byte goes to a real store.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal

import pytest

from nokvfs.engine.scan import scan_prefix
from nokvfs.errors import StoreError
from nokvfs.objects.keys import artifact_block_key
from nokvfs.schema import keys
from nokvfs.schema.enums import OperationKind, ReferenceKind
from nokvfs.schema.records import (
    ArtifactManifest,
    ArtifactRevision,
    GcCandidate,
    PathEntry,
    PublishOperation,
    RevisionRef,
    StagedObject,
    WorkspaceCurrent,
)
from nokvfs.workspace import datadir, listing, publish, reading
from nokvfs.workspace import workbench as wb

BLOCK = 4096  # small blocks, so a few KiB make a multi-block body
WB = "bench-1"
SPAWN = multiprocessing.get_context("spawn")


# --- data directories ---------------------------------------------------------------------------


@pytest.fixture(name="data_dir")
def data_dir_fixture(tmp_path, request):
    """A fresh local data directory (local directory store, 4 KiB blocks); under
    @pytest.mark.block_cache with a block cache, which a local store has only when asked for."""
    path = str(tmp_path / "data")
    cached = request.node.get_closest_marker("block_cache") is not None
    datadir.init(path, block_size=BLOCK, **({"cache_bytes": 64 * 1024 * 1024} if cached else {}))
    return path


@pytest.fixture(name="root")
def root_fixture(data_dir):
    """The data directory's root, open; closed afterwards (whatever the test left open)."""
    holder = RootHolder(data_dir)
    yield holder.root
    holder.close()


@pytest.fixture(name="root_holder")
def root_holder_fixture(data_dir):
    """A RootHolder: for tests that close and reopen the root (recovery runs on every open)."""
    holder = RootHolder(data_dir)
    yield holder
    holder.close()


@pytest.fixture(name="bench")
def bench_fixture(root):
    """A root with one Visible workbench WB."""
    wb.create(root, WB)
    return root


class RootHolder:
    """One open Root of a data dir at a time: an LMDB environment must not be opened twice in
    one process, so a reopen always closes first."""

    def __init__(self, data_dir: str, **options):
        self.data_dir = data_dir
        self.options = options
        self.root = datadir.open_root(data_dir, **options)

    def reopen(self, **options):
        self.close()
        self.root = datadir.open_root(self.data_dir, **{**self.options, **options})
        return self.root

    def close(self):
        if self.root is not None:
            self.root.close()
            self.root = None


def open_root_alongside(data_dir: str, **options):
    """open_root for a process that runs while another process has the same data dir open.

    The block cache admits one owner per directory; if it still refuses a second concurrent
    owner ("in use by another cache instance"), this process reads without a cache (reads are
    verified against the manifest's SHA-256 either way). Recovery runs as in open_root.
    """
    try:
        return datadir.open_root(data_dir, **options)
    except StoreError as exc:
        if "in use" not in str(exc):
            raise
    from nokvfs.engine.placement import PlacementStore
    from nokvfs.engine.shard import Shard
    from nokvfs.objects.blocks import BlockReader
    from nokvfs.objects.store import open_store
    from nokvfs.schema.ids import id16_from_hex
    from nokvfs.workspace.root import Root

    config = datadir.read_config(data_dir)
    shard = Shard.open(os.path.join(data_dir, "shard"), verify=False)
    placements = PlacementStore(os.path.join(data_dir, "control"))
    try:
        root_id = id16_from_hex(config["root_id"], "root id")
        placement = placements.get(root_id)
    finally:
        placements.close()
    store = open_store(config["store"], endpoint_url=config.get("endpoint_url"), region=config.get("region"))
    root = Root(
        shard,
        root_id,
        placement.placement_generation,
        store,
        BlockReader(store, None),
        block_size=int(config["block_size"]),
        data_dir=data_dir,
    )
    if options.get("recover", True):
        publish.recover(root)
    return root


# --- reading what the facade wrote --------------------------------------------------------------


def stat(root, path: str, workbench_id: str = WB) -> listing.Stat:
    with root.read() as view:
        return listing.stat(view, root, workbench_id, path)


def entry(root, path: str, workbench_id: str = WB) -> PathEntry | None:
    """The PathEntry at `path`, or None if there is no file there."""
    with root.read() as view:
        _, bench = wb.visible(view, root.root_id, workbench_id)
        raw = view.get(
            "path_current", keys.path_current_key(root.root_id, bench.incarnation_id, tuple(path.split("/")))
        )
    return None if raw is None else PathEntry.decode(raw)


def get_bytes(root, path: str, workbench_id: str = WB) -> bytes | None:
    """The whole body at `path` read back through the manifest, or None if absent."""
    found = entry(root, path, workbench_id)
    if found is None:
        return None
    data = reading.read(root, found)
    assert len(data) == found.logical_size
    assert "sha256:" + hashlib.sha256(data).hexdigest() == found.body_digest_uri
    return data


def revision(root, revision_id: bytes) -> ArtifactRevision | None:
    with root.read() as view:
        raw = view.get("artifact_revision", keys.ArtifactRevisionKey(root.root_id, revision_id).encode())
    return None if raw is None else ArtifactRevision.decode(raw)


def all_rows(root, tree: str, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
    """Every (key, value) of `tree` under `prefix`, through bounded scans."""
    out, marker = [], None
    with root.read() as view:
        while True:
            page = scan_prefix(view, tree, prefix, start_after=marker)
            out += page.items
            if page.next_marker is None:
                return out
            marker = page.next_marker


def refs_to(root, revision_id: bytes) -> list[tuple[keys.RevisionRefKey, RevisionRef]]:
    """Every RevisionRef row (any kind, any owner) that references `revision_id`."""
    out = []
    for key, value in all_rows(root, "revision_ref", root.root_id):
        decoded = keys.RevisionRefKey.decode(key)
        if decoded.artifact_revision_id == revision_id:
            out.append((decoded, RevisionRef.decode(value)))
    return out


def refs_owned_by(root, kind: ReferenceKind, owner: bytes) -> list[keys.RevisionRefKey]:
    prefix = keys.revision_ref_prefix(root.root_id, kind, owner)
    return [keys.RevisionRefKey.decode(k) for k, _ in all_rows(root, "revision_ref", prefix)]


def gc_candidates(root, revision_id: bytes) -> dict[int, GcCandidate]:
    """reference_epoch -> GcCandidate of one revision."""
    prefix = root.root_id + revision_id
    return {
        keys.GcCandidateKey.decode(k).reference_epoch: GcCandidate.decode(v)
        for k, v in all_rows(root, "gc_candidate", prefix)
    }


def manifest(root, revision_id: bytes) -> list[ArtifactManifest]:
    with root.read() as view:
        return publish.read_manifest(view, root, revision_id)


def publish_ops(root) -> dict[bytes, PublishOperation]:
    prefix = keys.operation_prefix(root.root_id, OperationKind.Publish)
    return {
        keys.OperationKey.decode(k).operation_id: PublishOperation.decode(v)
        for k, v in all_rows(root, "operation", prefix)
    }


def ledger(root, operation_id: bytes) -> list[StagedObject]:
    return [
        StagedObject.decode(v)
        for _, v in all_rows(root, "staged_object", keys.staged_object_prefix(root.root_id, operation_id))
    ]


def workspace_row(root, workbench_id: str) -> WorkspaceCurrent | None:
    with root.read() as view:
        return wb.read_current(view, root.root_id, workbench_id)[1]


def block_keys(root, revision_id: bytes, count: int) -> list[str]:
    return [artifact_block_key(root.logical_shard_id, root.root_id, revision_id, i) for i in range(count)]


def present_keys(store, keys_: list[str]) -> list[str]:
    """The keys `store.head` finds (each checked individually; the store is never listed)."""
    return [k for k in keys_ if store.head(k) is not None]


def local_object_path(data_dir: str, key: str) -> str:
    return os.path.join(data_dir, "objects", *key.split("/"))


def flip_byte(path: str, offset: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def body(size: int, seed: str) -> bytes:
    """Deterministic, distinct bytes (distinct seeds never share a block digest)."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


# --- child-process workers (spawned: importable at module level) --------------------------------


def crash_worker(
    data_dir: str, path: str, data: bytes, expected_generation, crash_at: str, store_options: dict | None = None
) -> None:
    """Open the root and publish `data` with NOKVFS_CRASH_AT=crash_at; expected to die by SIGKILL.

    `store_options` are set as attributes of the opened store (e.g. a low multipart_threshold).
    Exits 0 if the publish finished and 3 if it raised (neither should happen when the crash
    point is reached). The up-front precheck is skipped, as if a concurrent writer won between
    it and the final command, so a stale expected generation reaches the final command's CAS.
    """
    publish._precheck = lambda root, pub: None
    root = datadir.open_root(data_dir)
    for name, value in (store_options or {}).items():
        setattr(root.store, name, value)
    os.environ[publish.CRASH_ENV] = crash_at
    from nokvfs.workspace import namespace

    try:
        namespace.put(root, WB, path, data, expected_generation=expected_generation)
    except Exception:
        os._exit(3)
    os._exit(0)


def crash_append_worker(data_dir: str, path: str, data: bytes, crash_at: str) -> None:
    root = datadir.open_root(data_dir)
    os.environ[publish.CRASH_ENV] = crash_at
    from nokvfs.workspace import append

    try:
        append.append(root, WB, path, data)
    except Exception:
        os._exit(3)
    os._exit(0)


def run_crash_child(target, *args, timeout: float = 120) -> int:
    """Run `target(*args)` in a spawned child; return its exit code (-SIGKILL for a crash)."""
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError(f"child {target.__name__}{args[1:2]} hung")
    return proc.exitcode


def replacer_worker(data_dir: str, path: str, data: bytes, expected_generation: int, barrier, results) -> None:
    """One of two processes replacing `path` at `expected_generation`; reports through `results`."""
    from nokvfs.errors import GenerationConflict
    from nokvfs.workspace import namespace

    root = open_root_alongside(data_dir)
    try:
        barrier.wait(60)
        try:
            found = namespace.put(root, WB, path, data, expected_generation=expected_generation)
            results.put(("won", found.artifact_revision_id, os.getpid()))
        except GenerationConflict as exc:
            results.put(("conflict", str(exc), os.getpid()))
        except Exception as exc:  # reported, so the test shows what went wrong
            results.put(("error", f"{type(exc).__name__}: {exc}", os.getpid()))
    finally:
        root.close()


KILLED = -signal.SIGKILL
