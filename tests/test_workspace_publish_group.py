"""Group commit of publications (publish.run_group): several publications, each step one write
transaction for all; a conflicted one is aborted and cleaned alone while the others publish; a
SIGKILL at any point of a group leaves each publication where `recover` resumes or cleans it."""

from __future__ import annotations

import os

import pytest

from nokvfs.errors import GenerationConflict
from nokvfs.schema.enums import PublishPhase
from nokvfs.schema.paths import normalize_path
from nokvfs.workspace import body as bodies
from nokvfs.workspace import datadir, namespace, publish
from nokvfs.workspace import workbench as wb
from tests.workspace_fixtures import (
    BLOCK,
    KILLED,
    WB,
    RootHolder,
    block_keys,
    body,
    data_dir_fixture,  # noqa: F401 - fixtures
    entry,
    get_bytes,
    ledger,
    present_keys,
    publish_ops,
    run_crash_child,
)

PATHS = [f"outputs/g/{n}.bin" for n in range(4)]


def _pubs(root, data: dict, expected: dict | None = None):
    expected = expected or {}
    return [
        namespace.publication(
            WB,
            normalize_path(path),
            bodies.from_bytes(payload, root.block_size),
            expected_generation=expected.get(path, 0),
        )
        for path, payload in data.items()
    ]


def test_a_group_publishes_each_file_with_its_own_versions_and_events(data_dir):
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        wb.create(root, WB)
        old = namespace.put(root, WB, PATHS[0], b"old")
        before = root.shard.commit_version
        data = {p: body(2 * BLOCK + i, p) for i, p in enumerate(PATHS)}
        pubs = _pubs(root, data, {PATHS[0]: old.generation})
        results = publish.run_group(root, pubs)
        assert [r.generation for r in results] == [2, 1, 1, 1]
        for path, payload in data.items():
            assert get_bytes(root, path) == payload
        # Three commands per publication (begin, finalize, final), each with its own version.
        assert root.shard.commit_version == before + 3 * len(PATHS)
        ops = publish_ops(root)
        assert all(ops[p.operation_id].phase == PublishPhase.Published for p in pubs)
        assert all(ledger(root, p.operation_id) == [] for p in pubs)
    finally:
        holder.close()


def test_a_conflict_in_one_publication_aborts_it_alone(data_dir):
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        wb.create(root, WB)
        first = {PATHS[0]: body(BLOCK + 1, "a"), PATHS[1]: body(BLOCK + 2, "b")}
        pubs = _pubs(root, first)
        # The same path again, also expecting absence: it passes the precheck (the path is
        # absent when the group starts), uploads, and loses at its final command to the first.
        pubs.insert(1, _pubs(root, {PATHS[0]: body(BLOCK + 3, "loser")})[0])
        loser = pubs[1]
        results = publish.run_group(root, pubs)
        assert isinstance(results[1], GenerationConflict)
        assert results[0].generation == 1 and results[2].generation == 1
        assert get_bytes(root, PATHS[0]) == first[PATHS[0]] and get_bytes(root, PATHS[1]) == first[PATHS[1]]
        op = publish_ops(root)[loser.operation_id]
        assert op.phase == PublishPhase.Cleaned
        assert present_keys(root.store, block_keys(root, loser.revision_id, 2)) == []
    finally:
        holder.close()


def test_a_large_file_leaves_the_group_and_streams_its_blocks(data_dir, monkeypatch):
    """A group stores all its blocks with one put_many, so it holds them in memory at once:
    only files up to GROUP_FILE_MAX join one, and a group holds at most GROUP_BYTES_MAX. A
    larger file is published alone in its place (its blocks streamed a few at a time), and the
    order and every file's bytes are kept."""
    monkeypatch.setattr(publish, "GROUP_FILE_MAX", 4 * BLOCK)
    monkeypatch.setattr(publish, "GROUP_BYTES_MAX", 7 * BLOCK)
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        wb.create(root, WB)
        sizes = [BLOCK, 4 * BLOCK + 1, 3 * BLOCK, 3 * BLOCK, 2 * BLOCK]  # small, large, then 7 + 2 blocks
        paths = [f"outputs/g/{n}.bin" for n in range(len(sizes))]
        data = {p: body(size, p) for p, size in zip(paths, sizes)}
        held = []
        put_many = root.store.put_many

        def counting(items, **kwargs):
            held.append(sum(len(payload) for _, payload in items))
            return put_many(items, **kwargs)

        monkeypatch.setattr(root.store, "put_many", counting)
        alone = []
        run = publish.run

        def running(root_, pub):
            alone.append(pub.body.size)
            return run(root_, pub)

        monkeypatch.setattr(publish, "run", running)
        results = publish.run_group(root, _pubs(root, data))
        assert [r.generation for r in results] == [1] * len(sizes)
        assert alone == [4 * BLOCK + 1]
        assert max(held) <= 7 * BLOCK
        for path, payload in data.items():
            assert get_bytes(root, path) == payload
    finally:
        holder.close()


def test_a_group_reports_each_block_stored_as_its_publications_progress(data_dir):
    """Each block a group stores is progress of its own publication as the store reports it
    stored (put_many's on_stored; on S3 as each PUT ends), before the group's final steps, so a
    syscall waiting on a long group upload does not take it for a stalled one."""
    holder = RootHolder(data_dir)
    try:
        root = holder.root
        wb.create(root, WB)
        data = {p: body(3 * BLOCK + i, p) for i, p in enumerate(PATHS)}
        pubs = _pubs(root, data)
        reports = {p.operation_id: [] for p in pubs}
        for pub in pubs:
            pub.progress = lambda done, total, seen=reports[pub.operation_id]: seen.append((done, total))
        publish.run_group(root, pubs)
        for pub, payload in zip(pubs, data.values()):
            seen = reports[pub.operation_id]
            stored = [done for done, _ in seen[: len(pub.body.blocks)]]
            assert stored == sorted(stored) and stored[-1] == len(payload)  # as each block was stored
            assert len(seen) == 2 * len(pub.body.blocks)  # then once more per block, in order
    finally:
        holder.close()


def group_crash_worker(data_dir: str, data: dict, crash_at: str) -> None:
    root = datadir.open_root(data_dir)
    os.environ[publish.CRASH_ENV] = crash_at
    try:
        publish.run_group(root, _pubs(root, data))
    except Exception:
        os._exit(3)
    os._exit(0)


@pytest.mark.parametrize(
    "crash_at, published",
    [
        ("after-begin", False),
        ("after-upload-1", False),
        ("after-finalize", True),
        ("before-publish-command", True),
        ("after-publish-command", True),
    ],
)
def test_sigkill_during_a_group_then_recovery(data_dir, crash_at, published):
    holder = RootHolder(data_dir)
    wb.create(holder.root, WB)
    holder.close()
    data = {p: body(2 * BLOCK + i, p) for i, p in enumerate(PATHS[:3])}
    assert run_crash_child(group_crash_worker, data_dir, data, crash_at) == KILLED
    holder = RootHolder(data_dir)  # recovers
    try:
        root = holder.root
        ops = list(publish_ops(root).items())
        assert len(ops) == 3
        for op_id, op in ops:
            assert op.phase == (PublishPhase.Published if published else PublishPhase.Cleaned)
            assert ledger(root, op_id) == []
            keys_ = block_keys(root, op.artifact_revision_id, op.object_count)
            assert present_keys(root.store, keys_) == (keys_ if published else [])
        for path, payload in data.items():
            assert get_bytes(root, path) == (payload if published else None)
            if published:
                assert entry(root, path).generation == 1
    finally:
        holder.close()
