#!/usr/bin/env python3
"""What a spool's place costs a write-back close: the journal's fdatasync after the file's spool
and sidecar were created on the data directory's disk, against the same with them in a memory
directory (tmpfs), interleaved in one run. Prints medians and their ratio; asserts nothing.

    python3 scripts/bench_spool_flush.py [--files 300] [--rounds 4] [--size 4096]
                                         [--disk-dir DIR] [--memory-dir /dev/shm]

Per file, as a write-back mount does it (nokvfs.fs.spools, nokvfs.fs.writeback): create the
spool (O_EXCL, flock) and its JSON sidecar, write the file's bytes, read them back, then append
one acceptance record holding them to the journal (always on disk) and fdatasync it. On ext4 the
fdatasync commits the file creations still in the running transaction too, so where the spool
lives is what this measures.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import tempfile
import time


def one_round(spools: str, journal_dir: str, files: int, size: int) -> float:
    """The median seconds of one close (spool in `spools`, journal in `journal_dir`)."""
    body = os.urandom(size)
    sidecar = json.dumps({"format": 1, "state": "live", "path": "outputs/x" * 8}).encode()
    journal = os.open(os.path.join(journal_dir, "journal"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for i in range(files):
            started = time.perf_counter()
            path = os.path.join(spools, f"f{i}.spool")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            side = os.open(path + ".json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.write(side, sidecar)
            os.close(side)
            os.pwrite(fd, body, 0)
            data = os.pread(fd, size, 0)
            os.write(journal, b"NKWB" + len(data).to_bytes(4, "big") + data)
            os.fdatasync(journal)
            times.append(time.perf_counter() - started)
            os.close(fd)
    finally:
        os.close(journal)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--disk-dir", default="/var/tmp", help="a directory on the disk a data directory lives on")
    parser.add_argument("--memory-dir", default="/dev/shm", help="a directory on tmpfs")
    args = parser.parse_args()
    disk = tempfile.mkdtemp(prefix="bench-spool-", dir=args.disk_dir)
    memory = tempfile.mkdtemp(prefix="bench-spool-", dir=args.memory_dir)
    results = {"disk": [], "memory": []}
    try:
        for r in range(args.rounds):
            for where, directory in (("disk", disk), ("memory", memory)):
                spools = os.path.join(directory, f"spools{r}")
                journal_dir = os.path.join(disk, f"journal-{where}{r}")
                os.makedirs(spools)
                os.makedirs(journal_dir)
                results[where].append(one_round(spools, journal_dir, args.files, args.size))
            print(
                f"round {r + 1}: spool on disk {results['disk'][-1] * 1e6:,.0f} us per close, "
                f"in memory {results['memory'][-1] * 1e6:,.0f} us (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)
    on_disk, in_memory = statistics.median(results["disk"]), statistics.median(results["memory"])
    print(
        f"median of rounds: spool on disk {on_disk * 1e6:,.0f} us, in memory {in_memory * 1e6:,.0f} us: "
        f"{on_disk / in_memory:.2f}x faster in memory"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
