"""A random file exerciser with a model, in the manner of fsx (xfstests' ltp/fsx.c).

    python3 -m tests.exerciser FILE [--ops N] [--seed S] [--max-size BYTES]

One file is driven by a seeded random sequence of writes (at random offsets, growing it or not),
reads (compared with the model), truncates (down and up), appends through an O_APPEND
descriptor, fsyncs, closes and reopens, reads through a second descriptor, mmap reads, and
atomic replacements (a copy written beside it and renamed over it). After every operation the
size the file system reports is compared with the model, and every read with the model's bytes;
the first difference stops the run with the operation log. Exit 0 and one line of counts when
everything matched.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import sys


class Miscompare(AssertionError):
    pass


class Exerciser:
    def __init__(self, path: str, seed: int, max_size: int):
        self.path = path
        self.rng = random.Random(seed)
        self.max_size = max_size
        self.model = bytearray()
        self.log: list[str] = []
        self.counts: dict[str, int] = {}
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    # --- helpers --------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.log.append(text)
        if len(self.log) > 40:
            del self.log[0]

    def fail(self, what: str) -> None:
        raise Miscompare(f"{what}\nlast operations:\n  " + "\n  ".join(self.log))

    def data(self, size: int) -> bytes:
        # Recognisable bytes: each op writes its own pattern, so a stale byte shows whose it was.
        tag = len(self.log) % 251 + 1
        return bytes((tag + i) % 256 for i in range(size))

    def check_size(self) -> None:
        size = os.fstat(self.fd).st_size
        if size != len(self.model):
            self.fail(f"size is {size}, the model says {len(self.model)}")

    def check_range(self, got: bytes, offset: int, size: int, how: str) -> None:
        want = bytes(self.model[offset : offset + size])
        if got != want:
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
            self.fail(f"{how} of {size} at {offset}: {len(got)} bytes, first difference at {offset + first}")

    # --- operations -----------------------------------------------------------------------------

    def op_write(self) -> None:
        offset = self.rng.randrange(0, max(1, min(self.max_size, len(self.model) + 65536)))
        size = self.rng.choice([1, 7, 512, 4096, 4097, 65536, 200_000])
        size = max(1, min(size, self.max_size - offset))
        data = self.data(size)
        self.note(f"write {size} at {offset}")
        os.pwrite(self.fd, data, offset)
        if offset > len(self.model):
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset : offset + size] = data

    def op_read(self) -> None:
        if not self.model:
            return
        offset = self.rng.randrange(0, len(self.model))
        size = self.rng.choice([1, 100, 4096, 65536, 1 << 20])
        self.note(f"read {size} at {offset}")
        self.check_range(os.pread(self.fd, size, offset), offset, size, "read")

    def op_truncate(self) -> None:
        size = self.rng.randrange(0, self.max_size)
        self.note(f"truncate to {size}")
        os.ftruncate(self.fd, size)
        if size < len(self.model):
            del self.model[size:]
        else:
            self.model.extend(bytes(size - len(self.model)))

    def op_append(self) -> None:
        size = self.rng.choice([1, 100, 4096, 70_000])
        if len(self.model) + size > self.max_size:
            return
        data = self.data(size)
        self.note(f"append {size} through O_APPEND")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.model.extend(data)

    def op_fsync(self) -> None:
        self.note("fsync")
        os.fsync(self.fd)

    def op_reopen(self) -> None:
        self.note("close and reopen")
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR)

    def op_second_descriptor(self) -> None:
        if not self.model:
            return
        offset = self.rng.randrange(0, len(self.model))
        self.note(f"read through a second descriptor at {offset}")
        with open(self.path, "rb") as other:
            other.seek(offset)
            self.check_range(other.read(65536), offset, 65536, "second-descriptor read")

    def op_mmap_read(self) -> None:
        if not self.model:
            return
        self.note("mmap read of the whole file")
        with mmap.mmap(self.fd, len(self.model), prot=mmap.PROT_READ) as mapped:
            self.check_range(mapped[:], 0, len(self.model), "mmap read")

    def op_replace(self) -> None:
        self.note("write a copy beside it and rename it over")
        temporary = self.path + ".replacing"
        with open(temporary, "wb") as f:
            f.write(self.model)
        os.rename(temporary, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR)

    OPERATIONS = (
        ("write", 30),
        ("read", 30),
        ("truncate", 6),
        ("append", 8),
        ("fsync", 4),
        ("reopen", 8),
        ("second_descriptor", 6),
        ("mmap_read", 4),
        ("replace", 2),
    )

    def run(self, count: int) -> dict:
        names = [name for name, _ in self.OPERATIONS]
        weights = [weight for _, weight in self.OPERATIONS]
        for _ in range(count):
            name = self.rng.choices(names, weights)[0]
            getattr(self, "op_" + name)()
            self.counts[name] = self.counts.get(name, 0) + 1
            self.check_size()
        os.close(self.fd)
        with open(self.path, "rb") as f:
            whole = f.read()
        if whole != bytes(self.model):
            self.fail(f"the closed file differs from the model ({len(whole)} vs {len(self.model)} bytes)")
        return self.counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-size", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    try:
        counts = Exerciser(args.path, args.seed, args.max_size).run(args.ops)
    except Miscompare as exc:
        print(f"MISCOMPARE: {exc}", file=sys.stderr)
        return 1
    print(f"{args.ops} operations, 0 miscompares: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
