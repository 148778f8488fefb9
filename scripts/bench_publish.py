#!/usr/bin/env python3
"""Publish benchmark for the Workbench facade: prints figures, asserts nothing about time.

    python3 scripts/bench_publish.py [--dir DIR] [--small N] [--big-mib M] [--s3-small N]
                                     [--s3-big-mib M] [--no-s3]

Figures:
  * small-file publishes/s: N puts of 4 KiB each (begin, upload, finalize and the final
    command: three fsynced LMDB commands and one object write per publish), on the local
    directory store and on a loopback moto S3 server this script starts itself;
  * MB/s of one big put (hash, ledger, upload of every 4 MiB block, publish) and of the get of it
    back (every block fetched and SHA-256 verified, twice: on S3 "cold" from the store, which
    also fills the block cache, then "warm" from the cache; a local store has no cache, so both
    read the store), local with --big-mib (default 256 MiB) and S3 with
    --s3-big-mib (default 64 MiB: moto holds objects in memory and is slow, so the S3 size is
    smaller and said so in the output);
  * peak RSS of this process (resource.getrusage), after each phase.

Everything lives under a temporary directory (or --dir), removed at the end; the moto server
listens on 127.0.0.1 only and is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nokvfs.workspace import body as bodies
from nokvfs.workspace import datadir, namespace, reading
from nokvfs.workspace import workbench as wb

MiB = 1024 * 1024
SMALL = 4096
WB = "bench"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def make_big_file(path: str, size: int) -> None:
    """`size` pseudo-random bytes (distinct blocks, so nothing is shared through the cache)."""
    chunk = os.urandom(MiB)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(i.to_bytes(8, "big") + chunk[8:])
        f.write(os.urandom(size % MiB))


def bench_small(root, count: int, label: str) -> None:
    payloads = [os.urandom(SMALL) for _ in range(count)]
    start = time.perf_counter()
    for i, data in enumerate(payloads):
        namespace.put(root, WB, f"outputs/small/{i:06d}", data)
    elapsed = time.perf_counter() - start
    print(
        f"{label:<8} small-file publishes (4 KiB): {count} in {elapsed:.2f} s = {count / elapsed:,.1f} publishes/s "
        f"({elapsed / count * 1000:.2f} ms each)"
    )


def bench_big(root, work: str, size: int, label: str) -> None:
    source = os.path.join(work, "big-" + label.replace("/", "-") + ".bin")
    make_big_file(source, size)
    body = bodies.from_file(source, root.block_size)  # the file is read in place, not copied
    start = time.perf_counter()
    entry = namespace.put(root, WB, "outputs/big.bin", body)
    put_s = time.perf_counter() - start
    os.unlink(source)
    mb = size / 1e6
    print(f"{label:<8} put of {size // MiB} MiB: {put_s:.2f} s = {mb / put_s:,.1f} MB/s ({len(body.blocks)} blocks)")
    for temperature in ("cold", "warm"):
        got = 0
        start = time.perf_counter()
        for chunk in reading.iter_body(root, entry):
            got += len(chunk)
        get_s = time.perf_counter() - start
        assert got == size
        print(f"{label:<8} get of {size // MiB} MiB ({temperature}): {get_s:.2f} s = {mb / get_s:,.1f} MB/s")
    print(f"{label:<8} peak RSS so far: {peak_rss_mib():,.0f} MiB")


def run_local(work: str, args) -> None:
    path = os.path.join(work, "local")
    datadir.init(path)
    root = datadir.open_root(path)
    try:
        wb.create(root, WB)
        bench_small(root, args.small, "local")
        bench_big(root, work, args.big_mib * MiB, "local")
    finally:
        root.close()


def start_moto():
    """A moto S3 server on 127.0.0.1 with dummy credentials; returns (server, endpoint)."""
    from tests.s3_fixtures import start_loopback_moto

    return start_loopback_moto(serialised=False)


def run_s3(work: str, args) -> None:
    import boto3

    server, endpoint = start_moto()
    try:
        bucket = f"nokv-bench-{uuid.uuid4().hex[:16]}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        client.close()
        path = os.path.join(work, "s3")
        datadir.init(path, store=f"s3://{bucket}/bench", endpoint_url=endpoint)
        root = datadir.open_root(path)
        try:
            wb.create(root, WB)
            bench_small(root, args.s3_small, "s3/moto")
            print(
                f"s3/moto  (big bodies use {args.s3_big_mib} MiB, not {args.big_mib} MiB: the loopback moto server "
                "holds objects in memory and is the bottleneck)"
            )
            bench_big(root, work, args.s3_big_mib * MiB, "s3/moto")
        finally:
            root.close()
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="work directory (default: a fresh temporary one)")
    parser.add_argument("--small", type=int, default=500, help="number of 4 KiB publishes on the local store")
    parser.add_argument("--big-mib", type=int, default=256, help="size of the big local put/get")
    parser.add_argument("--s3-small", type=int, default=200, help="number of 4 KiB publishes on S3")
    parser.add_argument("--s3-big-mib", type=int, default=64, help="size of the big S3 put/get")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 figures")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="nokvfs-bench-publish-", dir=args.dir)
    print(f"python {sys.version.split()[0]}, work dir {work}, block size {datadir.DEFAULT_BLOCK_SIZE // MiB} MiB")
    try:
        run_local(work, args)
        if not args.no_s3:
            run_s3(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"peak RSS: {peak_rss_mib():,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
