"""Several processes reading and writing through one mount at once; every byte verified."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import textwrap

from tests.mount_fixtures import env, mount, needs_fuse  # noqa: F401

pytestmark = needs_fuse

WORKERS = 6
FILES = 25

# Each worker writes its own files (content is a function of worker and index, so anyone can check
# it), reads back its own and the others' files as they appear, and rewrites a few in place.
WORKER = textwrap.dedent(
    """
    import os, random, sys
    base, me, workers, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

    def content(worker, index, round_=0):
        rng = random.Random(worker * 100003 + index * 7 + round_)
        return rng.randbytes(rng.choice([0, 1, 1000, 70000, 300000, 5 * 1024 * 1024 + 3]))

    rng = random.Random(me)
    os.makedirs(os.path.join(base, f"w{me}"), exist_ok=True)
    checked = 0
    for index in range(files):
        path = os.path.join(base, f"w{me}", f"f{index}")
        with open(path, "wb") as f:
            f.write(content(me, index))
        with open(path, "rb") as f:
            assert f.read() == content(me, index), ("own", me, index)
        other = rng.randrange(workers)
        probe = os.path.join(base, f"w{other}", f"f{rng.randrange(files)}")
        try:
            with open(probe, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        name = probe.split(os.sep)
        w, i = int(name[-2][1:]), int(name[-1][1:])
        # A file is its first or its rewritten content. While it is being rewritten through this
        # mount, a reader sees what a local filesystem would show: at each page, the bytes of one
        # version or the other (a reader that opened before O_TRUNC can cross into the new bytes).
        versions = (content(w, i), content(w, i, 1))
        for at in range(0, len(data), 4096):
            page = data[at : at + 4096]
            assert any(v[at : at + len(page)] == page for v in versions), ("other", w, i, at, len(data))
        checked += 1
    for index in range(0, files, 5):
        path = os.path.join(base, f"w{me}", f"f{index}")
        with open(path, "wb") as f:
            f.write(content(me, index, 1))
    print(checked)
    """
)


def expected(worker: int, index: int, round_: int = 0) -> bytes:
    rng = random.Random(worker * 100003 + index * 7 + round_)
    return rng.randbytes(rng.choice([0, 1, 1000, 70000, 300000, 5 * 1024 * 1024 + 3]))


def test_many_processes_read_and_write_at_once(mount):
    base = mount.path("wb", "outputs")
    big = random.Random(99).randbytes(13 * 1024 * 1024)
    with open(mount.path("wb", "input", "shared.bin"), "wb") as f:
        f.write(big)
    digest = hashlib.sha256(big).hexdigest()
    readers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import hashlib,sys; d=open(sys.argv[1],'rb').read(); "
                f"assert hashlib.sha256(d).hexdigest()=={digest!r}",
                mount.path("wb", "input", "shared.bin"),
            ],
            env=env(),
        )
        for _ in range(3)
    ]
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, base, str(me), str(WORKERS), str(FILES)],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for me in range(WORKERS)
    ]
    for proc in writers:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err.decode()
    for proc in readers:
        assert proc.wait(timeout=60) == 0
    for me in range(WORKERS):
        for index in range(FILES):
            want = expected(me, index, 1 if index % 5 == 0 else 0)
            with open(os.path.join(base, f"w{me}", f"f{index}"), "rb") as f:
                assert f.read() == want, (me, index)
    # The durable state agrees, seen from another process.
    done = mount.facade(
        """
        import hashlib
        with root.read() as v:
            page = listing.list_recursive(v, root, 'wb', 'outputs', limit=10000)
        for child in page.children:
            print(child.name, hashlib.sha256(reading.read(root, child.entry)).hexdigest())
        """
    )
    seen = dict(line.split() for line in done.stdout.splitlines())
    assert len(seen) == WORKERS * FILES
    for me in range(WORKERS):
        for index in range(FILES):
            want = expected(me, index, 1 if index % 5 == 0 else 0)
            assert seen[f"w{me}/f{index}"] == hashlib.sha256(want).hexdigest()
