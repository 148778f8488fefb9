#!/usr/bin/env python3
"""Engine benchmark: prints figures, asserts nothing about time.

    python3 scripts/bench_engine.py [--dir DIR] [--reads N] [--commands N] [--descendants N]

Figures: PathCurrent point reads/s (each row verified through its envelope), against the same
reads taken raw from LMDB in the same run (the reference: no envelope check); single-path put
commands/s (each one LMDB write transaction with fsync, History, ChangeEvent, CommandDedupe and
outbox rows); the cost of one direct-child listing page of a directory with 10 children holding
N descendants between them (cursor operations: a constant per child, never per descendant);
reopen as every command does (gate, System rows, outbox chain; rows verified as read) against
reopen with full verification (every row and state digest, what fsck and `--verify` do); and
History pruning below the floor (rows/s, in the default bounded batches, each one write
transaction with its outbox record) with the reopens after it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nokvfs.engine.command import MetadataCommand, Put
from nokvfs.engine.placement import PlacementStore, install_root_fence
from nokvfs.engine.rows import ENVELOPE_BYTES
from nokvfs.engine.scan import list_children
from nokvfs.engine.shard import Shard
from nokvfs.schema import keys
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import PathEntry


def entry(generation: int) -> PathEntry:
    return PathEntry(
        generation=generation,
        artifact_revision_id=new_id16(),
        logical_size=4096,
        body_digest_uri="sha256:" + "ab" * 32,
        manifest_digest_uri="sha256:" + "cd" * 32,
        dependency_count=0,
        dependency_depth=0,
        content_type="application/octet-stream",
        producer="bench",
        manifest_id=new_id16(),
        created_version=1,
        modified_version=1,
        typed_index_projection=(),
    )


def history_rows(shard) -> int:
    with shard._env.begin() as txn:
        return txn.stat(shard._dbs["history"])["entries"]


def reopen(work: str, size: int, what: str = "") -> None:
    """Reopen the shard as every command does, then with full verification."""
    start = time.perf_counter()
    Shard.open(os.path.join(work, "shard")).close()
    default = time.perf_counter() - start
    start = time.perf_counter()
    Shard.open(os.path.join(work, "shard"), verify=True).close()
    full = time.perf_counter() - start
    label = f"reopen {what}".strip() + ":"
    print(
        f"{label:<21}{default:9.3f} s      (default: gate, System rows, outbox chain; {size / 1e6:.0f} MB shard); "
        f"with full verification (every row, state digests) {full:.3f} s = {full / default:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to build the shard (default: a temporary directory)")
    parser.add_argument("--reads", type=int, default=200_000)
    parser.add_argument("--commands", type=int, default=2_000)
    parser.add_argument("--descendants", type=int, default=100_000)
    args = parser.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="nokvfs-bench-")
    try:
        shard = Shard.create(os.path.join(work, "shard"), new_id16())
        placements = PlacementStore(os.path.join(work, "control"))
        root_id, incarnation = new_id16(), new_id16()
        placements.create(root_id, shard.logical_shard_id)
        placement = placements.transition(root_id, RootPlacementLifecycle.Active, expected_generation=1)
        install_root_fence(shard, root_id, placement)

        def command(mutations):
            return MetadataCommand(
                root_id=root_id,
                logical_shard_id=shard.logical_shard_id,
                placement_generation=placement.placement_generation,
                owner_epoch=shard.owner_epoch,
                request_id=new_id16(),
                read_version=shard.commit_version,
                mutations=tuple(mutations),
            )

        # 1. single-path put commands/s
        start = time.perf_counter()
        for i in range(args.commands):
            key = keys.path_current_key(root_id, incarnation, ("outputs", f"file-{i:06d}"))
            shard.apply(command([Put("path_current", key, entry(1))]))
        elapsed = time.perf_counter() - start
        print(
            f"put commands:        {args.commands / elapsed:10.0f} commands/s  ({args.commands} single-path commands, "
            "fsync on)"
        )

        # 2. point reads/s of PathCurrent, verified, against raw LMDB gets in the same run
        read_keys = [
            keys.path_current_key(root_id, incarnation, ("outputs", f"file-{i:06d}")) for i in range(args.commands)
        ]
        with shard.read() as view:
            start = time.perf_counter()
            for i in range(args.reads):
                raw = view.get("path_current", read_keys[i % len(read_keys)])
                PathEntry.decode(raw)
            elapsed = time.perf_counter() - start
        db = shard._dbs["path_current"]
        with shard._env.begin(buffers=False) as txn:
            start = time.perf_counter()
            for i in range(args.reads):
                PathEntry.decode(txn.get(read_keys[i % len(read_keys)], db=db)[ENVELOPE_BYTES:])
            reference = time.perf_counter() - start
        print(
            f"point reads:         {args.reads / elapsed:10.0f} reads/s     (PathCurrent get, envelope verified, "
            f"+ PathEntry decode; {elapsed / reference:.2f}x the time of raw LMDB gets: {args.reads / reference:.0f}/s)"
        )

        # 3. one listing page over N descendants under 10 children
        per_child = args.descendants // 10
        batch = 4_000
        value = entry(1).encode()
        for child in range(10):
            for start_i in range(0, per_child, batch):
                mutations = [
                    Put(
                        "path_current",
                        keys.path_current_key(root_id, incarnation, ("big", f"child-{child}", f"d{j // 100}", f"f{j}")),
                        value,
                    )
                    for j in range(start_i, min(per_child, start_i + batch))
                ]
                shard.apply(command(mutations))
        prefix = keys.path_subtree_prefix(root_id, incarnation, ("big",))
        with shard.read() as view:
            start = time.perf_counter()
            page = list_children(view, "path_current", prefix)
            elapsed = time.perf_counter() - start
        print(
            f"listing page:        {len(page.items)} children over {per_child * 10} descendants in "
            f"{elapsed * 1e3:.2f} ms, {page.cursor_ops} cursor operations"
        )
        size = sum(os.path.getsize(os.path.join(work, "shard", f)) for f in os.listdir(os.path.join(work, "shard")))
        shard.close()
        reopen(work, size)

        # 5. prune every History row below the current version, in bounded batches
        shard = Shard.open(os.path.join(work, "shard"), verify=False)
        before = history_rows(shard)
        start = time.perf_counter()
        pruned, batches, next_key = 0, 0, b""
        while True:
            outcome = shard.prune_history(
                owner_epoch=shard.owner_epoch, floor_version=shard.commit_version, start_key=next_key
            )
            pruned, batches = pruned + outcome.pruned_rows, batches + 1
            if outcome.next_key is None:
                break
            next_key = outcome.next_key
        elapsed = time.perf_counter() - start
        print(
            f"history prune:       {pruned / elapsed:10.0f} rows/s      ({before} -> {history_rows(shard)} History "
            f"rows in {batches} batches, {elapsed:.2f} s)"
        )
        shard.close()
        reopen(work, size, what="after prune")
        placements.close()
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
