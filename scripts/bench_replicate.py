#!/usr/bin/env python3
"""Benchmark shard replication: push throughput, checkpoint build and swap, restore.

    python3 scripts/bench_replicate.py [--commands N] [--batch B] [--url URL] [--endpoint-url URL]

Without --url the bucket is a local-directory object store in a temporary directory (no network).
With --url s3://bucket/prefix and --endpoint-url, any S3-compatible endpoint is used.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nokvfs.engine.command import MetadataCommand, Put
from nokvfs.engine.placement import PlacementStore, install_root_fence
from nokvfs.engine.shard import Shard
from nokvfs.objects.store import open_store
from nokvfs.replicate import Replicator, restore
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.ids import new_id16


def build_source(path: str, control: str):
    shard = Shard.create(path, new_id16())
    placements = PlacementStore(control)
    root_id = new_id16()
    placements.create(root_id, shard.logical_shard_id)
    placement = placements.transition(root_id, RootPlacementLifecycle.Active, expected_generation=1)
    placements.close()
    install_root_fence(shard, root_id, placement)
    return shard, root_id, placement.placement_generation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=250, help="commands between pushes")
    parser.add_argument("--rows", type=int, default=4, help="mutations per command")
    parser.add_argument("--url")
    parser.add_argument("--endpoint-url")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nokvfs-bench-replicate-") as work:
        url = args.url or "file://" + os.path.join(work, "bucket")
        store = open_store(url, endpoint_url=args.endpoint_url, **({} if args.url else {"create": True}))
        shard, root_id, generation = build_source(os.path.join(work, "shard"), os.path.join(work, "control"))
        replicator = Replicator(shard, store, auto_checkpoint=False)
        replicator.push_once()
        applied = pushed = 0
        push_seconds = 0.0
        start = time.perf_counter()
        while applied < args.commands:
            for _ in range(min(args.batch, args.commands - applied)):
                shard.apply(
                    MetadataCommand(
                        root_id=root_id,
                        logical_shard_id=shard.logical_shard_id,
                        placement_generation=generation,
                        owner_epoch=shard.owner_epoch,
                        request_id=new_id16(),
                        read_version=shard.commit_version,
                        mutations=tuple(
                            Put("path_current", b"\x01" * 16 + os.urandom(8), b"\x02" + os.urandom(100))
                            for _ in range(args.rows)
                        ),
                    )
                )
                applied += 1
            t = time.perf_counter()
            while (result := replicator.push_once()).kind != "none":
                pushed += result.records
            push_seconds += time.perf_counter() - t
        apply_seconds = time.perf_counter() - start - push_seconds
        t = time.perf_counter()
        replayed = restore(store, os.path.join(work, "replayed"))
        replay_seconds = time.perf_counter() - t
        t = time.perf_counter()
        checkpoint = replicator.checkpoint_once()
        checkpoint_seconds = time.perf_counter() - t
        t = time.perf_counter()
        result = restore(store, os.path.join(work, "restored"))
        restore_seconds = time.perf_counter() - t
        status = replicator.status()
        shard.close()
        print(f"commands applied:   {applied} in {apply_seconds:.2f}s")
        print(
            f"records pushed:     {pushed} in {push_seconds:.2f}s ({pushed / max(push_seconds, 1e-9):.0f} records/s),"
            f" {status['generation']} generations"
        )
        print(
            f"checkpoint:         through LSN {checkpoint.through_lsn}, {checkpoint.compacted} increments, "
            f"{checkpoint_seconds:.2f}s"
        )
        print(
            f"restore (replay):   {replayed.increments} increments to LSN {replayed.applied_lsn} in "
            f"{replay_seconds:.2f}s"
        )
        print(f"restore (checkpoint): LSN {result.applied_lsn} in {restore_seconds:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
