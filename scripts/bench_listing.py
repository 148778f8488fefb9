#!/usr/bin/env python3
"""What a mount's lookup and listing of a big directory cost in the daemon, without a kernel:
prints figures, asserts nothing about time.

    python3 scripts/bench_listing.py [--entries 2000] [--runs 10] [--workdir DIR] [--keep]

One directory of --entries files (made through the facade), then, each the best of three rounds
of --runs, in CPU time of this process:

    engine     its children read page by page through the facade (workspace.listing.children_page,
               one read transaction): the reference, what the bytes and their decoding cost
    cold       a mount's lookup of the directory (the scan for its time and link count) and its
               whole listing, as `ls` asks for them, with a commit before each (nothing kept is
               current)
    warm       the same with nothing committed between listings

The two mount figures are printed as ratios to the reference (above 1: slower than the engine's
read). The mount is nokvfs.fs.filesystem.FileSystem, the daemon's core, driven directly: what
pyfuse3 and the kernel add per request is not in these figures (scripts/bench_mount.py has them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PER_CALL = 25  # entries the kernel takes per readdir call, about what a 4 KiB buffer holds


def _best(rounds, runs, once) -> float:
    """The smallest mean CPU seconds of once() over `rounds` rounds of `runs` calls."""
    best = None
    for _ in range(rounds):
        spent = 0.0
        for _ in range(runs):
            spent += once()
        best = spent / runs if best is None else min(best, spent / runs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    from nokvfs.fs.filesystem import FileSystem
    from nokvfs.fs.freshness import Invalidator
    from nokvfs.fs.prefetch import BlockFetcher
    from nokvfs.fs.threads import Workers
    from nokvfs.fs.views import LiveView
    from nokvfs.workspace import datadir, listing, namespace, workbench

    work = args.workdir or tempfile.mkdtemp(prefix="nokvfs-bench-listing-")
    data = os.path.join(work, "data")
    try:
        datadir.init(data)
        root = datadir.open_root(data)
        workbench.create(root, "wb")
        started = time.perf_counter()
        for n in range(args.entries):
            namespace.put(root, "wb", f"outputs/big/f{n:06d}", b"x" * 100)
        print(f"{args.entries:,} files made in {time.perf_counter() - started:.1f} s", flush=True)
        workers = Workers()
        invalidator = Invalidator()
        invalidator.enabled = False  # no kernel to tell
        fs = FileSystem(root, LiveView(root), workers, invalidator, BlockFetcher(root, workers))

        def engine() -> float:
            start = time.process_time()
            with root.read() as view:
                _, wb = workbench.visible(view, root.root_id, "wb")
                anchor, seen = None, 0
                while True:
                    children, anchor = listing.children_page(
                        view, root, wb, ("outputs", "big"), start_after=anchor, limit=255
                    )
                    seen += len(children)
                    if anchor is None:
                        break
            assert seen == args.entries, seen
            return time.process_time() - start

        commits = [0]

        def mount(commit: bool) -> float:
            if commit:
                commits[0] += 1
                namespace.put(root, "wb", "outputs/other", str(commits[0]).encode())
            start = time.process_time()
            wb = fs.lookup(1, b"wb").st_ino
            outputs = fs.lookup(wb, b"outputs").st_ino
            big = fs.lookup(outputs, b"big").st_ino
            fh = fs.opendir(big)
            offset, listed = 0, 0
            while True:
                taken = []

                def reply(name, attr, next_id, taken=taken):
                    if len(taken) == PER_CALL:
                        return False
                    taken.append(next_id)
                    return True

                fs.readdir(fh, offset, reply)
                if not taken:
                    break
                listed += len(taken)
                offset = taken[-1]
            fs.releasedir(fh)
            fs.forget([(big, 1), (outputs, 1), (wb, 1)])  # as the kernel does once it drops them
            assert listed == args.entries + 2, listed  # and "." and ".."
            return time.process_time() - start

        reference = _best(3, args.runs, engine)
        cold = _best(3, args.runs, lambda: mount(True))
        warm = _best(3, args.runs, lambda: mount(False))
        per = 1e6 / args.entries
        for label, spent in (
            ("engine pages (reference)", reference),
            ("mount, after a commit", cold),
            ("mount, nothing committed", warm),
        ):
            ratio = "" if spent is reference else f" = {spent / reference:.2f}x"
            print(f"{label + ':':26s}{spent * 1e3:7.1f} ms CPU ({spent * per:.1f} us an entry){ratio}")
        root.close()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
