#!/usr/bin/env python3
"""Where a local-store write's unnamed temp should live: one shared temp directory, or the key's
own directory (what nokvfs.objects.local does). Prints figures, asserts nothing about time.

    python3 scripts/bench_store_temps.py [--objects 5000] [--rounds 5] [--dir /var/tmp]

Each round writes --objects objects the way the local store does -- make the revision's
`<rev>/blocks` directory, open an O_TMPFILE, write 100 bytes, link it at `<rev>/blocks/0` -- and
then deletes the oldest objects as GC does, keeping the last --objects. Two stores run the same
loop interleaved, object by object, so a busy machine weighs on both alike: one opens its temps
in a shared `tmp/` directory (the reference, the layout before this change), the other in the
revision's own directory. It prints, per round, the mean O_TMPFILE open time of each and their
ratio. ext4 allocates a file's inode in its directory's block group, so a shared temp directory
puts every object inode in one group, the group the deletes keep freeing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time


class Layout:
    def __init__(self, base: str, shared: bool):
        self.root = tempfile.mkdtemp(prefix="shared-" if shared else "keydir-", dir=base)
        self.tmp = os.path.join(self.root, "tmp")
        os.mkdir(self.tmp)
        self.shared = shared
        self.live: list[str] = []
        self.serial = 0
        self.open_seconds = 0.0

    def write_one(self, proc_fd: int) -> None:
        revision = os.path.join(self.root, f"r{self.serial:08d}")
        self.serial += 1
        blocks = os.path.join(revision, "blocks")
        os.mkdir(revision)
        os.mkdir(blocks)
        started = time.perf_counter()
        fd = os.open(self.tmp if self.shared else blocks, os.O_TMPFILE | os.O_WRONLY, 0o600)
        self.open_seconds += time.perf_counter() - started
        try:
            os.write(fd, b"x" * 100)
            os.link(str(fd), os.path.join(blocks, "0"), src_dir_fd=proc_fd, follow_symlinks=True)
        finally:
            os.close(fd)
        self.live.append(revision)

    def collect(self, keep: int) -> None:
        while len(self.live) > keep:
            revision = self.live.pop(0)
            os.unlink(os.path.join(revision, "blocks", "0"))
            os.rmdir(os.path.join(revision, "blocks"))
            os.rmdir(revision)

    def take_mean_us(self, count: int) -> float:
        mean = self.open_seconds / count * 1e6
        self.open_seconds = 0.0
        return mean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/var/tmp", help="a directory on the filesystem to measure")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="nokvfs-bench-temps-", dir=args.dir)
    proc_fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        shared, keydir = Layout(base, shared=True), Layout(base, shared=False)
        print(f"{args.objects:,} objects per round in {base}; load average {os.getloadavg()[0]:.2f}")
        for round_number in range(1, args.rounds + 1):
            for _ in range(args.objects):
                shared.write_one(proc_fd)
                keydir.write_one(proc_fd)
            reference, candidate = shared.take_mean_us(args.objects), keydir.take_mean_us(args.objects)
            print(
                f"round {round_number}: O_TMPFILE open {reference:7.1f} us in the shared temp directory, "
                f"{candidate:7.1f} us in the key's directory ({reference / candidate:.1f}x faster)",
                flush=True,
            )
            shared.collect(args.objects)
            keydir.collect(args.objects)
    finally:
        os.close(proc_fd)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
