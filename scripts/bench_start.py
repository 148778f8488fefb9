#!/usr/bin/env python3
"""How long a `nokvfs` command and a mount take to start and to stop: prints figures, asserts
nothing about time.

    python3 scripts/bench_start.py [--runs 5] [--workdir DIR]

Figures, each the median of --runs, beside the reference measured in the same run (a bare
`python3 -c pass`, the floor any Python command pays):

    command   `nokvfs --help` (every import a command needs), wall and CPU
    import    the modules of a data directory and the daemon (python -X importtime's sum)
    mount     `nokvfs mount DATA MNT --foreground` started until the mount point answers
    unmount   `fusermount3 -u` until the daemon has exited (and the same for a mount with
              `--metrics PORT`, whose listener stops too)
    cpu       the daemon's CPU time over one mount and unmount

Whether the bytecode is cached is printed too: without it (an editable install run under
PYTHONDONTWRITEBYTECODE, before scripts/setup.sh compiled it), every start compiles nokvfs again.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timed(argv) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _import_ms() -> float:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import nokvfs.workspace.datadir, nokvfs.fs.daemon"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    total = 0
    for line in done.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[0].strip().isdigit():
            total += int(fields[0])
    return total / 1000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _mount_cycle(work: str, index: int, *options: str) -> tuple[float, float, float]:
    """(seconds until mounted, seconds to unmount and exit, the daemon's CPU seconds)."""
    data, mnt = os.path.join(work, f"data{index}"), os.path.join(work, f"mnt{index}")
    os.makedirs(mnt)
    cli = [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", data]
    subprocess.run([*cli, "init"], check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    subprocess.run([*cli, "workbench", "create", "wb"], check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nokvfs.cli.main", "mount", data, mnt, "--foreground", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        while not os.path.ismount(mnt):
            if daemon.poll() is not None:
                raise SystemExit(f"the daemon exited with {daemon.returncode} before mounting")
            if time.perf_counter() - start > 60:
                raise SystemExit("the daemon did not mount within 60 s")
            time.sleep(0.005)
        mounted = time.perf_counter() - start
        os.listdir(os.path.join(mnt, "wb"))
        start = time.perf_counter()
        subprocess.run(["fusermount3", "-u", mnt], check=True)
        daemon.wait(timeout=60)
        unmounted = time.perf_counter() - start
    finally:
        if daemon.poll() is None:
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
            daemon.kill()
            daemon.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # fusermount3 is a child too, but a few milliseconds of it.
    return mounted, unmounted, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    cached = os.path.exists(os.path.join(REPO, "nokvfs", "schema", "__pycache__"))
    print(
        f"bytecode cached: {'yes' if cached else 'no'}; PYTHONDONTWRITEBYTECODE="
        f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    bare = [_timed([sys.executable, "-c", "pass"]) for _ in range(args.runs)]
    command = [_timed([sys.executable, "-m", "nokvfs.cli.main", "--help"]) for _ in range(args.runs)]
    imports = [_import_ms() for _ in range(args.runs)]
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="nokvfs-bench-start-") as work:
        cycles = [_mount_cycle(work, index) for index in range(args.runs)]
        metrics = [_mount_cycle(work, args.runs + index, "--metrics", str(_free_port())) for index in range(args.runs)]

    def median(values) -> float:
        return statistics.median(values)

    bare_wall, bare_cpu = median(w for w, _ in bare), median(c for _, c in bare)
    print(f"python3 -c pass      {bare_wall * 1000:7.0f} ms wall {bare_cpu * 1000:6.0f} ms CPU   (the reference)")
    wall, cpu = median(w for w, _ in command), median(c for _, c in command)
    print(
        f"nokvfs --help        {wall * 1000:7.0f} ms wall {cpu * 1000:6.0f} ms CPU   "
        f"{wall / bare_wall:.1f}x the reference's wall"
    )
    print(f"imports              {median(imports):7.0f} ms (datadir + daemon, python -X importtime)")
    print(f"mount until ready    {median(m for m, _, _ in cycles) * 1000:7.0f} ms")
    print(f"unmount until exit   {median(u for _, u, _ in cycles) * 1000:7.0f} ms")
    print(f"  with --metrics     {median(u for _, u, _ in metrics) * 1000:7.0f} ms")
    print(f"daemon CPU per cycle {median(c for _, _, c in cycles) * 1000:7.0f} ms")


if __name__ == "__main__":
    main()
