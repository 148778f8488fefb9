#!/usr/bin/env python3
"""Benchmark bounded growth (issue 14): does a shard stay small and open fast as commands pile up?

    python3 scripts/bench_growth.py [--steps 10] [--engine-commands 1000000] [--publishes 100000]
                                    [--paths 1000] [--retain-versions 10000] [--no-maintenance]
                                    [--gc-revisions 10000] [--gc-store local|s3] [--keep]

Two workloads in a temporary directory, both on a bounded working set, each in --steps steps:

  engine   --engine-commands commands straight through `Shard.apply` (a put of a 100-byte value
           over 1,000 keys, one ChangeEvent, a fresh UUIDv7 request id each), the retention pass,
           History pruning and the compaction when free pages dominate after each step (what
           the mount's maintenance does)
  facade   --publishes `namespace.put` of 100-byte files over --paths paths, then the
           maintenance pass a mount runs (retention, GC, History pruning, compaction) after each step
  gc       --gc-revisions revisions freed by `gc.collect` (rewrites of 100 paths) in batches of
           gc.GC_BATCH, against the reference of the same collection one revision per claim and
           finish command (batch_revisions=1), in the same run: one data directory is built and
           copied for both, so they free the same revisions; CPU seconds are printed beside the
           wall time (the machine may be shared)

A workload runs only when its count is not 0: `--engine-commands 0 --publishes 0` runs gc alone.
`--gc-store s3` runs the gc workload on a loopback moto server instead of the local store (each
run then publishes its own revisions).

After each step it prints: commands applied so far, commands (publishes)/s of the step, reopen
time (`Shard.open` / `datadir.open_root`, cold), the shard's used bytes (LMDB pages in use) and
file size, bytes added per command before maintenance, and rows per tree; before maintenance,
per tree, the rows, key+value bytes and LMDB page bytes each command (publish) added. At the end: the last
step's rate and reopen time as ratios against the first step's (the reference, measured in the
same run), and the used size against a fresh shard holding the same live rows (a compacting
copy, `Shard.copy_to`). The script asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nokvfs.engine.command import MetadataCommand, Put
from nokvfs.engine.placement import PlacementStore, install_root_fence
from nokvfs.engine.shard import Shard
from nokvfs.schema.enums import RetainedFamily, RootPlacementLifecycle
from nokvfs.schema.ids import new_id16


def used_bytes(shard) -> int:
    info = shard._env.info()
    return (info["last_pgno"] + 1) * shard._env.stat()["psize"]


def file_bytes(path: str) -> int:
    return os.path.getsize(os.path.join(path, "data.mdb"))


def rows_per_tree(shard) -> dict:
    with shard._env.begin() as txn:
        return {name: txn.stat(db)["entries"] for name, db in sorted(shard._dbs.items()) if txn.stat(db)["entries"]}


def tree_usage(shard) -> dict:
    """Per tree: (rows, bytes of keys and values, bytes of the LMDB pages it holds)."""
    psize = shard._env.stat()["psize"]
    usage = {}
    with shard._env.begin() as txn:
        for name, db in sorted(shard._dbs.items()):
            stat = txn.stat(db)
            stored = sum(len(key) + len(value) for key, value in txn.cursor(db))
            pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            usage[name] = (stat["entries"], stored, pages * psize)
    return usage


def show_growth(before: dict, after: dict, count: int) -> str:
    """Per tree, what `count` commands (publishes) added: rows, stored bytes and page bytes each."""
    parts = []
    for name, (entries, stored, pages) in after.items():
        old = before.get(name, (0, 0, 0))
        if (entries, stored, pages) != old:
            parts.append(
                f"{name} {(entries - old[0]) / count:.2f} rows {(stored - old[1]) / count:,.0f} B "
                f"({(pages - old[2]) / count:,.0f} B pages)"
            )
    total_stored = sum(a[1] for a in after.values()) - sum(b[1] for b in before.values())
    total_pages = sum(a[2] for a in after.values()) - sum(b[2] for b in before.values())
    parts.append(f"all trees {total_stored / count:,.0f} B ({total_pages / count:,.0f} B pages)")
    return "; ".join(parts)


def show_rows(rows: dict) -> str:
    return " ".join(f"{name}={count:,}" for name, count in rows.items())


def timed_open(path: str):
    start = time.perf_counter()
    shard = Shard.open(path)
    return shard, time.perf_counter() - start


# --- engine ---------------------------------------------------------------------------------------


def engine_shard(work: str):
    path = os.path.join(work, "engine", "shard")
    shard = Shard.create(path, new_id16())
    placements = PlacementStore(os.path.join(work, "engine", "control"))
    root_id = new_id16()
    placements.create(root_id, shard.logical_shard_id)
    placement = placements.transition(root_id, RootPlacementLifecycle.Active, expected_generation=1)
    placements.close()
    install_root_fence(shard, root_id, placement)
    return path, shard, root_id, placement.placement_generation


def engine_retention(shard, retain_versions: int) -> None:
    shard.observe_lease_clock(time.time_ns() // 1_000_000)
    floor = max(0, shard.commit_version - retain_versions)
    for family in (RetainedFamily.ChangeEvent, RetainedFamily.CommandDedupe):
        start = b""
        while True:
            outcome = shard.prune_retained(
                owner_epoch=shard.owner_epoch,
                family=family,
                floor_version=floor,
                horizon_ms=shard.lease_clock_ms - 1000,
                start_key=start,
            )
            if outcome.next_key is None:
                break
            start = outcome.next_key
    through = max(0, shard.recovery_tail.applied_lsn - retain_versions)  # each truncation appends a record
    while shard.truncate_outbox(owner_epoch=shard.owner_epoch, through_lsn=through).removed_records:
        pass
    start = b""
    while True:
        outcome = shard.prune_history(
            owner_epoch=shard.owner_epoch, floor_version=shard.commit_version, start_key=start
        )
        if outcome.next_key is None:
            break
        start = outcome.next_key
    compact_like_a_mount(shard)


def compact_like_a_mount(shard) -> None:
    """What the end of a mount's maintenance pass does (nokvfs.fs.maintenance): compact the
    shard when free pages dominate it, with the default thresholds."""
    from nokvfs.fs.maintenance import compact_when_mostly_free

    _, report, _, _ = compact_when_mostly_free(shard)
    if report is not None:
        print(f"  compacted: {report.before_bytes / 1e6:.1f} MB -> {report.after_bytes / 1e6:.1f} MB", flush=True)


def run_engine(work: str, args) -> list:
    path, shard, root_id, generation = engine_shard(work)
    per_step = args.engine_commands // args.steps
    value = b"\x02" + b"v" * 99
    results = []
    done = 0
    for step in range(args.steps):
        before, trees_before = used_bytes(shard), tree_usage(shard)
        start = time.perf_counter()
        for n in range(per_step):
            key = b"\x01" * 16 + ((done + n) % 1000).to_bytes(4, "big")
            shard.apply(
                MetadataCommand(
                    root_id=root_id,
                    logical_shard_id=shard.logical_shard_id,
                    placement_generation=generation,
                    owner_epoch=shard.owner_epoch,
                    request_id=new_id16(),
                    read_version=shard.commit_version,
                    predicates=(),
                    mutations=(Put("path_current", key, value),),
                    events=(b"\x02event",),
                    result=b"",
                )
            )
        elapsed = time.perf_counter() - start
        done += per_step
        grown = used_bytes(shard) - before
        print(f"engine step {step + 1} per command: {show_growth(trees_before, tree_usage(shard), per_step)}")
        if not args.no_maintenance:
            engine_retention(shard, args.retain_versions)
        shard.close()
        shard, reopen = timed_open(path)
        results.append(
            dict(
                done=done,
                rate=per_step / elapsed,
                reopen=reopen,
                used=used_bytes(shard),
                file=file_bytes(path),
                per_command=grown / per_step,
                rows=rows_per_tree(shard),
            )
        )
        print(
            f"engine step {step + 1}: {done:,} commands, {per_step / elapsed:,.0f}/s, reopen {reopen * 1000:.1f} ms, "
            f"used {used_bytes(shard) / 1e6:.1f} MB (file {file_bytes(path) / 1e6:.1f} MB), "
            f"{grown / per_step:,.0f} B/command before retention; {show_rows(rows_per_tree(shard))}",
            flush=True,
        )
    results.append(dict(fresh=fresh_copy(shard, work, "engine-copy")))
    shard.close()
    return results


def fresh_copy(shard, work: str, name: str) -> int:
    target = os.path.join(work, name)
    os.makedirs(target)
    shard.copy_to(target)
    copied = Shard.open(target)
    try:
        return used_bytes(copied)
    finally:
        copied.close()


# --- facade ---------------------------------------------------------------------------------------


def run_facade(work: str, args) -> list:
    from nokvfs.workspace import datadir, namespace, workbench
    from nokvfs.workspace.retention import RetentionSettings

    data_dir = os.path.join(work, "data")
    datadir.init(
        data_dir,
        retention=RetentionSettings(
            versions=args.retain_versions, request_seconds=1, outbox_records=args.retain_versions
        ),
    )
    root = datadir.open_root(data_dir)
    workbench.create(root, "wb")
    per_step = args.publishes // args.steps
    shard_path = os.path.join(data_dir, "shard")
    results = []
    done = 0
    for step in range(args.steps):
        before, trees_before = used_bytes(root.shard), tree_usage(root.shard)
        start = time.perf_counter()
        for n in range(per_step):
            namespace.put(
                root, "wb", f"outputs/d{(done + n) % args.paths // 100}/f{(done + n) % args.paths}", b"x" * 100
            )
        elapsed = time.perf_counter() - start
        done += per_step
        grown = used_bytes(root.shard) - before
        print(f"facade step {step + 1} per publish: {show_growth(trees_before, tree_usage(root.shard), per_step)}")
        maintenance = 0.0
        if not args.no_maintenance:
            from nokvfs.fs.maintenance import Maintenance

            time.sleep(1.0)  # the request window (1 s) passes for this step's requests
            started = time.perf_counter()
            Maintenance(root, interval=0, pause=0).run_pass()
            maintenance = time.perf_counter() - started
        root.close()
        start = time.perf_counter()
        root = datadir.open_root(data_dir)
        reopen = time.perf_counter() - start
        rows = rows_per_tree(root.shard)
        results.append(
            dict(
                done=done,
                rate=per_step / elapsed,
                reopen=reopen,
                used=used_bytes(root.shard),
                file=file_bytes(shard_path),
                per_command=grown / per_step,
                rows=rows,
            )
        )
        print(
            f"facade step {step + 1}: {done:,} publishes, {per_step / elapsed:,.0f}/s, reopen {reopen * 1000:.1f} ms, "
            f"used {used_bytes(root.shard) / 1e6:.1f} MB (file {file_bytes(shard_path) / 1e6:.1f} MB), "
            f"{grown / per_step:,.0f} B/publish before maintenance, maintenance {maintenance:.2f} s; {show_rows(rows)}",
            flush=True,
        )
    results.append(dict(fresh=fresh_copy(root.shard, work, "facade-copy")))
    root.close()
    return results


def _gc_data(data_dir: str, revisions: int, **store) -> None:
    """A data directory holding `revisions` revisions nothing references (rewrites of 100 paths)."""
    from nokvfs.workspace import datadir, namespace, workbench

    datadir.init(data_dir, **store)
    root = datadir.open_root(data_dir)
    try:
        workbench.create(root, "wb")
        for n in range(revisions + 100):
            namespace.put(root, "wb", f"outputs/f{n % 100}", b"x" * 100)
    finally:
        root.close()


def run_gc(work: str, args) -> None:
    import pathlib

    from nokvfs.workspace import datadir, gc

    server = None
    if args.gc_store == "s3":
        import boto3

        from tests.s3_fixtures import start_loopback_moto

        server, endpoint = start_loopback_moto(serialised=False)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="nokvfs-bench-gc")
    else:
        source = os.path.join(work, "gc-source")
        _gc_data(source, args.gc_revisions)
        assert datadir.read_config(source)["store"] == pathlib.Path(source, "objects").as_uri(), "not the default store"
    print(f"gc ({args.gc_store} store): load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rates = {}
    try:
        for batch in (1, gc.GC_BATCH):
            data_dir = os.path.join(work, f"gc-{batch}")
            if server is not None:  # each run its own objects under its own prefix
                _gc_data(data_dir, args.gc_revisions, store=f"s3://nokvfs-bench-gc/gc-{batch}", endpoint_url=endpoint)
            else:  # a copy of the same revisions, with its own objects
                shutil.copytree(source, data_dir)
                config = datadir.read_config(data_dir)
                config["store"] = pathlib.Path(data_dir, "objects").as_uri()
                datadir._write_config(data_dir, config)
            root = datadir.open_root(data_dir)
            try:
                start, cpu = time.perf_counter(), time.process_time()
                report = gc.collect(root, batch_revisions=batch)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            finally:
                root.close()
            assert report.freed_revisions >= args.gc_revisions and not report.quarantined, report
            rates[batch] = report.freed_revisions / elapsed
            print(
                f"gc batch {batch}: freed {report.freed_revisions:,} revisions in {elapsed:.2f} s = "
                f"{rates[batch]:,.0f}/s ({cpu:.2f} CPU s = {report.freed_revisions / cpu:,.0f}/CPU s)",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
    print(f"gc: {rates[gc.GC_BATCH]:,.0f} revisions/s = {rates[gc.GC_BATCH] / rates[1]:.2f}x one revision per command")


def summary(name: str, results: list) -> None:
    steps, fresh = results[:-1], results[-1]["fresh"]
    first, last = steps[0], steps[-1]
    print(
        f"{name}: last/first step rate {last['rate'] / first['rate']:.2f}x ({last['rate']:,.0f}/s vs "
        f"{first['rate']:,.0f}/s); "
        f"reopen last {last['reopen'] * 1000:.1f} ms = {last['reopen'] / first['reopen']:.2f}x the first; "
        f"used {last['used'] / 1e6:.1f} MB = {last['used'] / fresh:.2f}x a fresh copy of the same rows "
        f"({fresh / 1e6:.1f} MB); "
        f"first step {first['per_command']:,.0f} B per command before maintenance"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--engine-commands", type=int, default=1_000_000)
    parser.add_argument("--publishes", type=int, default=100_000)
    parser.add_argument("--paths", type=int, default=1000)
    parser.add_argument("--gc-revisions", type=int, default=10_000)
    parser.add_argument(
        "--gc-store", choices=("local", "s3"), default="local", help="s3: a loopback moto server (tests.s3_fixtures)"
    )
    parser.add_argument("--retain-versions", type=int, default=10_000)
    parser.add_argument(
        "--no-maintenance", action="store_true", help="never run retention/GC (the growth before this issue)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="nokvfs-growth-")
    started = time.perf_counter()
    try:
        engine = run_engine(work, args) if args.engine_commands else None
        facade = run_facade(work, args) if args.publishes else None
        if args.gc_revisions:
            run_gc(work, args)
        if engine:
            summary("engine", engine)
        if facade:
            summary("facade", facade)
        print(f"total {time.perf_counter() - started:.0f} s")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
