#!/usr/bin/env python3
"""Ordinary tools on the mount, timed against pyfuse3's passthrough in the same run: prints
figures, asserts nothing about time.

    python3 scripts/bench_tools.py [--runs 1] [--modes durable,write-back] [--workdir DIR] [--keep]

Where a user's own tools spend their time (not our API's): per target, in order,

    cp -a     a copy of this repository's nokvfs/ source tree (about 100 files) into the target
    git       git init, add -A and commit of that copy (git saves through temporary names,
              renamed over the final ones)
    venv      `python3 -m venv` with pip (about 1,500 files and 700 renames: pip installs
              through temporary names, and fsyncs INSTALLER and RECORD)
    sqlite    1,000 single-row transactions in a sqlite3 database (journal_mode=DELETE: each
              commit writes, fsyncs and unlinks a rollback journal)
    publish   write-back targets only: fsync(2) of a file written last, which waits until
              everything accepted before it is published

on the same targets as scripts/bench_mount.py (a local directory for scale, the passthrough as
the reference, nokvfs durable at close and `--write-back`), the targets interleaved phase by
phase. Each figure is seconds (the least of --runs) and its ratio to the passthrough (above 1:
faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import bench_mount  # noqa: E402 - the targets, the passthrough and the harness are that script's

SOURCE = os.path.join(REPO, "nokvfs")
GIT = [
    "git",
    "-c",
    "user.name=bench",
    "-c",
    "user.email=bench@localhost",
    "-c",
    "gc.auto=0",
    "-c",
    "init.defaultBranch=main",
]


def run(argv: list[str], cwd: str | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")


def cp_a(place: str) -> None:
    run(["cp", "-a", SOURCE, os.path.join(place, "tree")])


def git(place: str) -> None:
    tree = os.path.join(place, "tree")
    run([*GIT, "init", "-q"], cwd=tree)
    run([*GIT, "add", "-A"], cwd=tree)
    run([*GIT, "commit", "-q", "-m", "bench"], cwd=tree)


def venv(place: str) -> None:
    run([sys.executable, "-m", "venv", os.path.join(place, "venv")])


def sqlite(place: str) -> None:
    db = sqlite3.connect(os.path.join(place, "bench.db"), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        for k in range(1000):
            db.execute("BEGIN")
            db.execute("INSERT INTO t VALUES (?, ?)", (k, os.urandom(100)))
            db.execute("COMMIT")
        if db.execute("SELECT count(*) FROM t").fetchone()[0] != 1000:
            raise SystemExit(f"sqlite in {place} lost rows")
    finally:
        db.close()


def publish(place: str) -> None:
    fd = os.open(os.path.join(place, "last"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"last\n")
        os.fsync(fd)
    finally:
        os.close(fd)


PHASES = [("cp -a", cp_a), ("git", git), ("venv", venv), ("sqlite", sqlite), ("publish", publish)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per target (each in a fresh directory); least kept")
    parser.add_argument("--modes", default="durable,write-back", help="nokvfs modes: durable, write-back")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"durable", "write-back"}:
        parser.error("--modes: durable and/or write-back")
    for tool in ("git", "cp"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (scripts/setup.sh installs what the tests need)")

    work = args.workdir or tempfile.mkdtemp(
        prefix="nokvfs-tools-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None
    )
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NOTIFY_SOCKET", None)
    log = open(os.path.join(work, "daemons.log"), "ab")
    targets: list[bench_mount.Target] = []
    try:
        print(f"work directory {work}; {bench_mount._load()}", flush=True)
        from nokvfs.workspace import datadir, workbench

        local, pt_source, pt_mount = (os.path.join(work, n) for n in ("local", "pt-source", "pt-mount"))
        for path in (local, pt_source, pt_mount):
            os.makedirs(path)
        targets.append(bench_mount.Target("local", local))
        passthrough = [sys.executable, bench_mount.__file__, "--serve-passthrough", pt_source, pt_mount]
        targets.append(
            bench_mount.Target("passthrough", pt_mount, argv=passthrough, mountpoint=pt_mount, env=env, log=log)
        )
        for mode in modes:
            name = "nokvfs" + ("-wb" if mode == "write-back" else "")
            data, mnt = os.path.join(work, name + "-data"), os.path.join(work, name + "-mnt")
            os.makedirs(mnt)
            datadir.init(data)
            root = datadir.open_root(data, verify=False)
            try:
                workbench.create(root, "bench")
            finally:
                root.close()
            targets.append(bench_mount.nokvfs_target(name, data, mnt, mode, env, log))
        for target in targets:
            target.start()

        best: dict[tuple[str, str], float] = {}
        for number in range(args.runs):
            places = {t.name: os.path.join(t.base, f"run{number}") for t in targets}
            for place in places.values():
                os.makedirs(place)
            for phase, action in PHASES:
                for target in targets:
                    if phase == "publish" and not target.publishes_later:
                        continue
                    started = time.perf_counter()
                    action(places[target.name])
                    seconds = time.perf_counter() - started
                    key = (phase, target.name)
                    best[key] = min(seconds, best.get(key, seconds))
        for phase, _ in PHASES:
            reference = best.get((phase, "passthrough"))
            figures = []
            for target in targets:
                seconds = best.get((phase, target.name))
                if seconds is None:
                    continue
                ratio = f" ({reference / seconds:.2f}x)" if reference else ""
                figures.append(f"{target.name} {seconds:.2f} s{ratio}")
            print(f"{phase:8} " + "; ".join(figures), flush=True)
        rss = ", ".join(f"{t.name} {t.rss() / 1024:.0f} MiB" for t in targets if t.nokvfs)
        print(f"daemon RSS at the end: {rss}; {bench_mount._load()}", flush=True)
    finally:
        for target in targets:
            target.stop()
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
