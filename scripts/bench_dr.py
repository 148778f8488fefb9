#!/usr/bin/env python3
"""Benchmark disaster recovery and read scale-out through the bucket (issue 15), on loopback S3.

    python3 scripts/bench_dr.py [--paths 100000] [--publishes 1000] [--rate 20]
                                [--replicate-interval 1] [--follow-interval 1]
                                [--tree-files 2000] [--big-mib 64] [--no-mounts] [--keep]

Everything runs against a moto S3 server this script starts on 127.0.0.1 (artifact bytes and the
replication prefix alike), in a temporary work directory removed at the end. Figures:

  restore      `restore_data_dir` of a data directory with --paths paths (one checkpoint), and of
               the same paths shipped as increments (replayed), against the reference of
               downloading the same pack bytes with a plain GET in the same run
  lag          an owner mount (--replicate) and a follower mount (--follow): --publishes files
               written and closed on the owner at --rate per second; for each, the time from the
               return of close(2) to the name being listed by the follower's mount (median, p99),
               against the polling floor (half of each interval, the expected wait of two pollers)
  sync         publish latency through the facade with and without `Replicator.wait_shipped`,
               and close(2) latency on a replicating mount without and with `--sync`
               (what a `--sync` close adds; the mount does not call it yet)
  cold reads   both mounts remounted with empty block caches and (as root) dropped page caches:
               `ls -lR` of --tree-files files and a sequential read of a --big-mib file on the
               follower against the owner's mount

With --no-mounts (or without FUSE) the lag is measured without kernels: owner publishes through
the facade, a Replicator loop ships, a Follower loop replays, and visibility is a point read of
the follower's shard. The script asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nokvfs.engine.shard import Shard  # noqa: E402
from nokvfs.replicate import Replicator  # noqa: E402
from nokvfs.replicate.follower import Follower  # noqa: E402
from nokvfs.replicate.remote import open_remote  # noqa: E402
from nokvfs.replicate.restore import restore_data_dir  # noqa: E402
from nokvfs.workspace import datadir, namespace, workbench  # noqa: E402
from scripts.bench_mount import drop_caches  # noqa: E402

MiB = 1024 * 1024


def start_moto():
    """A moto S3 server on 127.0.0.1 with dummy credentials; returns (server, endpoint)."""
    from tests.s3_fixtures import start_loopback_moto

    return start_loopback_moto(serialised=False)


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"nokv-bench-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    client.close()
    return name


def owner_dir(path: str, bucket: str, endpoint: str) -> str:
    datadir.init(path, store=f"s3://{bucket}/objects", endpoint_url=endpoint)
    with datadir.open_root(path) as root:
        workbench.create(root, "wb")
    return path


def push_all(data_dir: str, url: str, endpoint: str) -> None:
    with Shard.open(os.path.join(data_dir, "shard"), verify=False) as shard:
        replicator = Replicator.from_url(shard, url, endpoint_url=endpoint, data_dir=data_dir, auto_checkpoint=False)
        while replicator.push_once().lag:
            pass
        replicator.bucket.store.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# --- restore ------------------------------------------------------------------------------------


def bench_restore(work: str, endpoint: str, paths: int) -> None:
    from tests.mount_fixtures import populate_many

    bucket = new_bucket(endpoint)
    print(f"restore of a data directory with {paths:,} paths")
    for kind in ("checkpoint", "increments"):
        url = f"s3://{bucket}/{kind}"
        owner = owner_dir(os.path.join(work, f"restore-owner-{kind}"), bucket, endpoint)
        if kind == "increments":
            push_all(owner, url, endpoint)  # the first push is a checkpoint of the empty workbench
        with datadir.open_root(owner) as root:
            populate_many(root, "wb", "outputs/many", paths)
        push_all(owner, url, endpoint)
        remote = open_remote(url, endpoint_url=endpoint)
        manifest, _ = remote.read()
        packs = [manifest.checkpoint] + list(manifest.increments)
        start = time.perf_counter()
        size = sum(len(remote.store.get(remote.key(p.key))) for p in packs)
        download = time.perf_counter() - start
        remote.store.close()
        target = os.path.join(work, f"restored-{kind}")
        start = time.perf_counter()
        result = restore_data_dir(url, target, endpoint_url=endpoint)
        seconds = time.perf_counter() - start
        print(
            f"  from {kind:<10} {seconds:7.2f} s  ({len(manifest.increments)} increments, {size / MiB:.1f} MiB of "
            "packs, "
            f"LSN {result.shard.applied_lsn}); plain GET of the same packs {download:.2f} s: {seconds / download:.1f}x",
            flush=True,
        )
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(owner, ignore_errors=True)


# --- the lag without kernels ------------------------------------------------------------------


def bench_lag_facade(work: str, endpoint: str, args) -> None:
    from nokvfs.workspace import replica

    bucket = new_bucket(endpoint)
    url = f"s3://{bucket}/lag"
    owner = owner_dir(os.path.join(work, "lag-owner"), bucket, endpoint)
    push_all(owner, url, endpoint)
    cache = os.path.join(work, "lag-follower")
    restore_data_dir(url, cache, endpoint_url=endpoint)
    seen: dict[str, float] = {}
    with datadir.open_root(owner) as root, datadir.open_root(cache, recover=False) as froot:
        replicator = Replicator.from_url(root.shard, url, endpoint_url=endpoint)
        follower = Follower.attach(cache, froot.shard)
        assert isinstance(froot.shard, replica.ReplicaShard)
        replicator.start(args.replicate_interval)
        follower.start(args.follow_interval)
        stop = threading.Event()
        names = [f"outputs/lag/f{n:05d}" for n in range(args.publishes)]

        def watch():
            from nokvfs.workspace import listing

            pending = set(names)
            while pending and not stop.is_set():
                with froot.read() as view:
                    for name in list(pending):
                        try:
                            listing.stat(view, froot, "wb", name)
                        except Exception:  # noqa: BLE001 - not there yet
                            continue
                        seen[name] = time.monotonic()
                        pending.discard(name)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        closed = publish_at_rate(names, args.rate, lambda name: namespace.put(root, "wb", name, b"x"))
        watcher.join(120)
        stop.set()
        follower.stop()
        replicator.stop()
        replicator.bucket.store.close()
    report_lag("facade publish -> follower shard", closed, seen, args)


def bench_sync(work: str, endpoint: str, count: int) -> None:
    """What a `--sync` close would cost: a publish through the facade, then (or not) Replicator.
    wait_shipped of its LSN with the replication loop running at the mount's default interval."""
    bucket = new_bucket(endpoint)
    url = f"s3://{bucket}/sync"
    owner = owner_dir(os.path.join(work, "sync-owner"), bucket, endpoint)
    push_all(owner, url, endpoint)
    with datadir.open_root(owner) as root:
        replicator = Replicator.from_url(root.shard, url, endpoint_url=endpoint)
        replicator.start(5.0)
        try:
            figures = {}
            for mode in ("without", "with"):
                times = []
                for n in range(count):
                    start = time.perf_counter()
                    namespace.put(root, "wb", f"outputs/sync-{mode}/f{n:04d}", b"x" * 4096)
                    if mode == "with":
                        replicator.wait_shipped(root.shard.recovery_tail.applied_lsn, timeout=60)
                    times.append(time.perf_counter() - start)
                figures[mode] = (statistics.median(times), percentile(times, 0.99))
        finally:
            replicator.stop()
            replicator.bucket.store.close()
    (m0, p0), (m1, p1) = figures["without"], figures["with"]
    print(
        f"publish latency through the facade (the --sync primitive), {count} x 4 KiB: without wait_shipped median "
        f"{m0 * 1000:.0f} ms, p99 {p0 * 1000:.0f} ms; with it median {m1 * 1000:.0f} ms, p99 {p1 * 1000:.0f} ms "
        f"({m1 / m0:.1f}x)",
        flush=True,
    )


def publish_at_rate(names, rate: float, publish) -> dict[str, float]:
    closed = {}
    start = time.monotonic()
    for n, name in enumerate(names):
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        publish(name)
        closed[name] = time.monotonic()
    return closed


def report_lag(what: str, closed: dict, seen: dict, args) -> None:
    lags = [seen[name] - closed[name] for name in closed if name in seen]
    missing = len(closed) - len(lags)
    floor = args.replicate_interval / 2 + args.follow_interval / 2
    median, p99 = statistics.median(lags), percentile(lags, 0.99)
    print(
        f"lag, {what}: {len(lags)} publishes at {args.rate:g}/s, intervals {args.replicate_interval:g} s + "
        f"{args.follow_interval:g} s: "
        f"median {median * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms"
        f" ({median / floor:.2f}x / {p99 / floor:.2f}x the polling floor of {floor * 1000:.0f} ms)"
        + (f"; {missing} never seen" if missing else ""),
        flush=True,
    )


# --- with mounts ----------------------------------------------------------------------------------


def daemon(data_dir: str, mountpoint: str, log: str, *extra) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NOTIFY_SOCKET", None)
    os.makedirs(mountpoint, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nokvfs.cli.main", "mount", data_dir, mountpoint, "--foreground", *extra],
            stdout=out,
            stderr=out,
            env=env,
            cwd=REPO,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            try:
                os.statvfs(mountpoint)
                return proc
            except OSError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise SystemExit(f"{mountpoint} did not mount (log: {log})")


def unmount(proc: subprocess.Popen, mountpoint: str) -> None:
    for argv in (
        ["fusermount3", "-u", mountpoint],
        ["fusermount3", "-u", "-z", mountpoint],
        ["umount", "-l", mountpoint],
    ):
        if not os.path.ismount(mountpoint):
            break
        subprocess.run(argv, capture_output=True)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench_mounts(work: str, endpoint: str, args) -> None:
    bucket = new_bucket(endpoint)
    url = f"s3://{bucket}/mounted"
    owner = owner_dir(os.path.join(work, "m-owner"), bucket, endpoint)
    cache = os.path.join(work, "m-follower")
    a_mnt, b_mnt = os.path.join(work, "a"), os.path.join(work, "b")
    owner_args = (
        "--replicate",
        url,
        "--replicate-endpoint-url",
        endpoint,
        "--replicate-interval",
        str(args.replicate_interval),
    )
    follow_args = ("--follow", url, "--follow-endpoint-url", endpoint, "--follow-interval", str(args.follow_interval))
    mounts = []
    try:
        a = daemon(owner, a_mnt, os.path.join(work, "a.log"), *owner_args)
        mounts.append((a, a_mnt))
        deadline = time.monotonic() + 60
        while "published the data directory record" not in open(os.path.join(work, "a.log")).read():
            if time.monotonic() > deadline:
                raise SystemExit("the owner never published")
            time.sleep(0.05)
        b = daemon(cache, b_mnt, os.path.join(work, "b.log"), *follow_args)
        mounts.append((b, b_mnt))

        # The lag: close(2) on the owner -> the name listed by the follower's mount.
        os.makedirs(os.path.join(a_mnt, "wb", "outputs", "lag"), exist_ok=True)
        names = [f"f{n:05d}" for n in range(args.publishes)]
        seen: dict[str, float] = {}
        done = threading.Event()

        def watch():
            directory = os.path.join(b_mnt, "wb", "outputs", "lag")
            while len(seen) < len(names) and not done.is_set():
                try:
                    listed = os.listdir(directory)
                except FileNotFoundError:
                    listed = []
                now = time.monotonic()
                for name in listed:
                    seen.setdefault(name, now)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        def close_on_owner(name):
            with open(os.path.join(a_mnt, "wb", "outputs", "lag", name), "wb") as f:
                f.write(b"x")

        closed = publish_at_rate(names, args.rate, close_on_owner)
        watcher.join(120)
        done.set()
        report_lag("close(2) on the owner's mount -> listed in the follower's mount", closed, seen, args)

        # Cold reads: a tree and a big file, on both mounts, remounted with empty caches.
        for n in range(args.tree_files):
            path = os.path.join(a_mnt, "wb", "outputs", "tree", f"d{n % 20:02d}", f"file{n:05d}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(os.urandom(1024))
        chunk = os.urandom(MiB)
        with open(os.path.join(a_mnt, "wb", "outputs", "big.bin"), "wb") as f:
            for _ in range(args.big_mib):
                f.write(chunk)
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(b_mnt, "wb", "outputs", "big.bin")):
            if time.monotonic() > deadline:
                raise SystemExit("the follower never saw big.bin")
            time.sleep(0.1)
        for proc, mountpoint in reversed(mounts):
            unmount(proc, mountpoint)
        mounts.clear()
        for data_dir in (owner, cache):
            shutil.rmtree(os.path.join(data_dir, "cache"), ignore_errors=True)
        a = daemon(owner, a_mnt, os.path.join(work, "a.log"))
        mounts.append((a, a_mnt))
        b = daemon(cache, b_mnt, os.path.join(work, "b.log"), "--follow-interval", str(args.follow_interval))
        mounts.append((b, b_mnt))
        results = {}
        for label, mountpoint in (("owner", a_mnt), ("follower", b_mnt)):
            dropped = drop_caches()
            start = time.perf_counter()
            subprocess.run(
                ["ls", "-lR", os.path.join(mountpoint, "wb", "outputs", "tree")], stdout=subprocess.DEVNULL, check=True
            )
            listing = time.perf_counter() - start
            dropped = drop_caches() and dropped
            start = time.perf_counter()
            with open(os.path.join(mountpoint, "wb", "outputs", "big.bin"), "rb") as f:
                while f.read(MiB):
                    pass
            reading = time.perf_counter() - start
            results[label] = (listing, reading)
        (ol, orr), (fl, fr) = results["owner"], results["follower"]
        print(
            f"cold ls -lR of {args.tree_files} files: owner {ol:.2f} s, follower {fl:.2f} s ({fl / ol:.2f}x the "
            "owner's)\n"
            f"cold read of {args.big_mib} MiB: owner {args.big_mib / orr:.0f} MB/s, follower {args.big_mib / fr:.0f} "
            "MB/s "
            f"({orr / fr * 100:.0f}% of the owner's)" + ("" if dropped else " (not root: page cache not dropped)"),
            flush=True,
        )
    finally:
        for proc, mountpoint in reversed(mounts):
            unmount(proc, mountpoint)


def bench_close_sync(work: str, endpoint: str, count: int) -> None:
    """close(2) latency of a 4 KiB file written through a mount replicating to the bucket, without
    and with `--sync` (close returns once the bucket holds the write)."""
    figures = {}
    for mode, extra in (("without", ()), ("with", ("--sync",))):
        bucket = new_bucket(endpoint)
        url = f"s3://{bucket}/close-{mode}"
        owner = owner_dir(os.path.join(work, f"close-{mode}"), bucket, endpoint)
        mnt = os.path.join(work, f"close-{mode}-mnt")
        args = ("--replicate", url, "--replicate-endpoint-url", endpoint, "--replicate-interval", "5", *extra)
        proc = daemon(owner, mnt, os.path.join(work, f"close-{mode}.log"), *args)
        try:
            times = []
            body = b"x" * 4096
            for n in range(count):
                fd = os.open(
                    os.path.join(mnt, "wb", "outputs", f"c{n:04d}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
                )
                os.write(fd, body)
                start = time.perf_counter()
                os.close(fd)
                times.append(time.perf_counter() - start)
            figures[mode] = (statistics.median(times), percentile(times, 0.99))
        finally:
            unmount(proc, mnt)
    (m0, p0), (m1, p1) = figures["without"], figures["with"]
    print(
        f"close(2) of a 4 KiB file on a mount replicating to loopback S3, {count} files: without --sync median "
        f"{m0 * 1000:.1f} ms, p99 {p0 * 1000:.1f} ms; with --sync median {m1 * 1000:.1f} ms, p99 {p1 * 1000:.1f} ms "
        f"({m1 / m0:.1f}x)",
        flush=True,
    )


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and (shutil.which("fusermount3") is not None or os.geteuid() == 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", type=int, default=100_000)
    parser.add_argument("--publishes", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0, help="owner publishes per second during the lag run")
    parser.add_argument("--replicate-interval", type=float, default=1.0)
    parser.add_argument("--follow-interval", type=float, default=1.0)
    parser.add_argument("--tree-files", type=int, default=2000)
    parser.add_argument("--big-mib", type=int, default=64)
    parser.add_argument("--no-mounts", action="store_true", help="measure the lag without kernels; skip the cold reads")
    parser.add_argument("--skip-restore", action="store_true")
    parser.add_argument("--sync-publishes", type=int, default=200, help="publishes timed with and without wait_shipped")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="nokvfs-bench-dr-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    server, endpoint = start_moto()
    try:
        if not args.skip_restore:
            bench_restore(work, endpoint, args.paths)
        bench_sync(work, endpoint, args.sync_publishes)
        if args.no_mounts or not fuse_available():
            bench_lag_facade(work, endpoint, args)
        else:
            bench_close_sync(work, endpoint, args.sync_publishes)
            bench_mounts(work, endpoint, args)
        return 0
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
