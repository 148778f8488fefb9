#!/usr/bin/env python3
"""A long mixed workload on one mount: is the daemon's memory bounded, does its pace hold?

    python3 scripts/bench_soak.py [--minutes 20] [--sample 30] [--keep]

Mounts a fresh data directory (local shard and store) and runs, round after round until the time
is up, what a working session does with ordinary tools: 40 small files written with the shell
(`echo > f`, half of them rewrites), a 16 MiB file rewritten and read back with `cat`, lines
appended to a log, `tar x` of a 300-file archive into a new directory and `rm -rf` of the one
before, renames, `ls -lR` of the workbench, random reads of earlier files. Every `--sample`
seconds it asks `nokvfs status --json` for the daemon's resident memory and counters and prints
a row. The summary gives the resident memory after the first round (the reference), its peak and
its last value as ratios to it, and rounds per minute of the first and the last sample interval.
At the end the mount is unmounted and `nokvfs fsck` runs on the data directory.

Figures print; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def nokvfs(*argv, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", *argv], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    if check and done.returncode != 0:
        raise SystemExit(f"nokvfs {' '.join(argv)} failed ({done.returncode}): {done.stderr}")
    return done


def sh(command: str, cwd: str) -> None:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"`{command[:80]}` failed in {cwd}: {done.stderr[:500]}")


def archive_of(files: int, rng: random.Random) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for index in range(files):
            body = rng.randbytes(rng.choice([0, 100, 2000, 9000, 40_000]))
            info = tarfile.TarInfo(f"t/d{index % 10}/f{index:04d}.dat")
            info.size, info.mode, info.mtime = len(body), 0o644, 1_700_000_000 + index
            tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def one_round(number: int, outputs: str, logs: str, archive: str, rng: random.Random, big: list[bytes]) -> None:
    for index in range(40):
        name = f"small-{(number * 20 + index) % 400:03d}.txt"  # half of them rewrite earlier files
        sh(f"echo round {number} file {index} > {name}", outputs)
    body = big[number % len(big)]
    with open(os.path.join(outputs, "big.bin"), "wb") as f:
        f.write(body)
    done = subprocess.run(["cat", os.path.join(outputs, "big.bin")], capture_output=True, timeout=300)
    if done.stdout != body:
        raise SystemExit(f"round {number}: big.bin read back wrong")
    sh(f"for i in $(seq 1 20); do echo 'round {number} line '$i >> session.log; done", logs)
    tree = os.path.join(outputs, f"tree-{number}")
    os.mkdir(tree)
    sh(f"tar -xf {archive}", tree)
    previous = os.path.join(outputs, f"tree-{number - 1}")
    if os.path.isdir(previous):
        shutil.rmtree(previous)
    os.rename(
        os.path.join(outputs, f"small-{number % 400:03d}.txt"), os.path.join(outputs, f"renamed-{number % 50}.txt")
    )
    subprocess.run(["ls", "-lR", os.path.dirname(outputs)], capture_output=True, timeout=300, check=True)
    for name in rng.sample(sorted(n for n in os.listdir(outputs) if n.startswith("small-")), 10):
        with open(os.path.join(outputs, name), "rb") as f:
            f.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between status samples")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()

    base = tempfile.mkdtemp(prefix="nokvfs-soak-")
    data, mnt = os.path.join(base, "data"), os.path.join(base, "mnt")
    os.mkdir(mnt)
    nokvfs("--data-dir", data, "init")
    nokvfs("--data-dir", data, "workbench", "create", "wb")
    nokvfs("mount", data, mnt)
    rng = random.Random(5)
    archive = os.path.join(base, "tree.tar")
    with open(archive, "wb") as f:
        f.write(archive_of(300, rng))
    big = [rng.randbytes(16 << 20), rng.randbytes(16 << 20)]
    outputs, logs = os.path.join(mnt, "wb", "outputs"), os.path.join(mnt, "wb", "logs")
    samples = []
    try:
        started = time.monotonic()
        deadline = started + args.minutes * 60
        rounds = 0
        next_sample = started
        print(
            f"{'minute':>7} {'rounds':>7} {'RSS MiB':>8} {'heap MiB':>9} {'mapped MiB':>11} {'publications':>13} "
            f"{'failed':>7} {'reads':>9} {'mem blocks MiB':>15} {'kept':>5}"
        )
        while True:
            now = time.monotonic()
            if now >= next_sample or now >= deadline:
                status = json.loads(nokvfs("status", mnt, "--json").stdout)
                sample = (
                    now - started,
                    rounds,
                    status["rss_bytes"],
                    status["publications"]["count"],
                    status["publications"]["failed"],
                    status["reads"]["count"],
                    status["memory_blocks"]["bytes"],
                    status["spools"]["kept"],
                    status["rss_anon_bytes"],
                    status["rss_file_bytes"],
                )
                samples.append(sample)
                print(
                    f"{sample[0] / 60:7.1f} {sample[1]:7d} {sample[2] / 2**20:8.1f} {sample[8] / 2**20:9.1f} "
                    f"{sample[9] / 2**20:11.1f} "
                    f"{sample[3]:13d} {sample[4]:7d} {sample[5]:9d} {sample[6] / 2**20:15.1f} {sample[7]:5d}",
                    flush=True,
                )
                next_sample = now + args.sample
                if now >= deadline:
                    break
            one_round(rounds, outputs, logs, archive, rng, big)
            rounds += 1
    finally:
        nokvfs("umount", mnt, check=False)
    checked = nokvfs("--data-dir", data, "fsck", check=False)
    first = next((s for s in samples if s[1] >= 1), samples[-1])
    peak = max(s[2] for s in samples)
    last = samples[-1]
    print()
    print(f"rounds: {last[1]} in {last[0] / 60:.1f} min; publications {last[3]} ({last[4]} failed); reads {last[5]}")
    print(
        f"daemon RSS: after the first round {first[2] / 2**20:.1f} MiB (reference), peak {peak / 2**20:.1f} MiB "
        f"({peak / first[2]:.2f}x), at the end {last[2] / 2**20:.1f} MiB ({last[2] / first[2]:.2f}x)"
    )
    heap_first, heap_peak, heap_last = first[8], max(s[8] for s in samples), last[8]
    print(
        f"daemon heap (RssAnon): after the first round {heap_first / 2**20:.1f} MiB, peak {heap_peak / 2**20:.1f} MiB "
        f"({heap_peak / heap_first:.2f}x), at the end {heap_last / 2**20:.1f} MiB ({heap_last / heap_first:.2f}x); "
        f"mapped files (RssFile, the shard's map) at the end {last[9] / 2**20:.1f} MiB"
    )
    if len(samples) >= 3:
        pace = [(b[1] - a[1]) / max(1e-9, (b[0] - a[0]) / 60) for a, b in zip(samples, samples[1:])]
        print(
            f"pace: {pace[0]:.1f} rounds/min in the first interval, {pace[-1]:.1f} in the last "
            f"({pace[-1] / pace[0]:.2f}x)"
        )
    print(
        f"fsck after the run: exit {checked.returncode} "
        f"{checked.stdout.strip().splitlines()[-1] if checked.stdout.strip() else ''}"
    )
    if args.keep:
        print(f"kept {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
