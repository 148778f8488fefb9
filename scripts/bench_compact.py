#!/usr/bin/env python3
"""Benchmark compaction of an open shard (what a mount's maintenance runs) against `nokvfs compact`
of the same shard closed: prints figures, asserts nothing about time.

    python3 scripts/bench_compact.py [--publishes 4000] [--paths 200] [--size 2000] [--keep]

Builds a data directory whose shard once held much more than it holds (--publishes rewrites of
--size-byte files over --paths paths, then retention and GC), copies it, and then:

  reference   `compact.compact` of the copy, closed (nothing else runs)
  live        `Shard.compact_live` of the original while one thread publishes a file every
              20 ms and another stats paths in a loop, both timing every call

It prints each compaction's time and sizes, and the publish and stat latencies (median, 99th
percentile, max) before and during the live compaction, as ratios to the before figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nokvfs.engine import compact
from nokvfs.workspace import datadir, gc, listing, namespace, retention, workbench
from nokvfs.workspace.retention import RetentionSettings


def build(data_dir: str, args) -> None:
    datadir.init(data_dir, retention=RetentionSettings(versions=0, request_seconds=0, outbox_records=10))
    root = datadir.open_root(data_dir)
    try:
        workbench.create(root, "w")
        body = b"x" * args.size
        for n in range(args.publishes):
            namespace.put(root, "w", f"outputs/f{n % args.paths}", b"%d " % n + body)
        retention.run(root)
        gc.collect(root)
    finally:
        root.close()


def summary(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1 if len(ordered) > 1 else 0], ordered[-1]


class Load:
    """A publisher and a stat loop on the open root, each timing every call."""

    def __init__(self, root, paths: int):
        self.root = root
        self.paths = paths
        self.stop = threading.Event()
        self.publishes: list[float] = []
        self.stats: list[float] = []
        self.threads = [threading.Thread(target=self._publish), threading.Thread(target=self._stat)]

    def _publish(self):
        n = 0
        while not self.stop.is_set():
            start = time.perf_counter()
            namespace.put(self.root, "w", f"outputs/load{n % 20}", b"load %d" % n)
            self.publishes.append(time.perf_counter() - start)
            n += 1
            time.sleep(0.02)

    def _stat(self):
        n = 0
        while not self.stop.is_set():
            start = time.perf_counter()
            with self.root.read() as view:
                listing.stat(view, self.root, "w", f"outputs/f{n % self.paths}")
            self.stats.append(time.perf_counter() - start)
            n += 1

    def run(self, seconds: float | None = None, during=None):
        self.publishes, self.stats = [], []
        self.stop.clear()
        for t in self.threads:
            t.start()
        result = None
        if during is not None:
            result = during()
        else:
            time.sleep(seconds)
        self.stop.set()
        for t in self.threads:
            t.join()
        self.threads = [threading.Thread(target=self._publish), threading.Thread(target=self._stat)]
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishes", type=int, default=4000)
    parser.add_argument("--paths", type=int, default=200)
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="nokvfs-compact-")
    try:
        data_dir = os.path.join(work, "data")
        started = time.perf_counter()
        build(data_dir, args)
        print(f"built in {time.perf_counter() - started:.1f} s: {args.publishes} publishes over {args.paths} paths")
        reference_dir = os.path.join(work, "reference")
        shutil.copytree(data_dir, reference_dir)

        started = time.perf_counter()
        offline = compact.compact(os.path.join(reference_dir, "shard"))
        offline_s = time.perf_counter() - started
        print(
            f"reference  closed compaction: {offline.before_bytes / 1e6:.1f} MB -> {offline.after_bytes / 1e6:.1f} MB "
            f"in {offline_s * 1000:.0f} ms"
        )

        root = datadir.open_root(data_dir)
        try:
            used, size = root.shard.space()
            load = Load(root, args.paths)
            load.run(seconds=3.0)
            before = (summary(load.publishes), summary(load.stats))
            timing = {}

            def live():
                start = time.perf_counter()
                report = root.shard.compact_live()
                timing["s"] = time.perf_counter() - start
                time.sleep(0.5)  # the load goes on on the swapped file
                return report

            report = load.run(during=live)
            during = (summary(load.publishes), summary(load.stats))
        finally:
            root.close()
        if report is None:
            print("live       not compacted (every attempt stale)")
            return 1
        print(
            f"live       open compaction:   {report.before_bytes / 1e6:.1f} MB ({used / 1e6:.1f} MB in use) -> "
            f"{report.after_bytes / 1e6:.1f} MB in {timing['s'] * 1000:.0f} ms "
            f"({timing['s'] / offline_s:.2f}x the closed compaction)"
        )
        for name, b, d in (("publish", before[0], during[0]), ("stat", before[1], during[1])):
            print(
                f"{name:<8} latency before: median {b[0] * 1000:.2f} ms, p99 {b[1] * 1000:.2f}, max {b[2] * 1000:.2f}; "
                f"during: median {d[0] * 1000:.2f} ms ({d[0] / b[0]:.2f}x), p99 {d[1] * 1000:.2f} "
                f"({d[1] / b[1]:.2f}x), max {d[2] * 1000:.2f} ({d[2] / b[2]:.2f}x)"
            )
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
