"""Background maintenance in a mount: GC and retention run in bounded slices while FUSE requests
keep being served (none waits for a whole pass)."""

from __future__ import annotations

import os
import re
import time

from tests.mount_fixtures import mounted, needs_fuse

pytestmark = needs_fuse

REWRITES = 800
PATHS = 40


def populate(base: str) -> str:
    from nokvfs.workspace import datadir, namespace, workbench
    from nokvfs.workspace.retention import RetentionSettings

    data_dir = os.path.join(base, "data")
    datadir.init(data_dir, retention=RetentionSettings(versions=10, request_seconds=0, outbox_records=100))
    root = datadir.open_root(data_dir)
    try:
        workbench.create(root, "wb")
        for n in range(REWRITES):
            namespace.put(root, "wb", f"outputs/f{n % PATHS}", b"rewrite %d\n" % n)
    finally:
        if root.blocks.cache is not None:
            root.blocks.cache.close()
        root.close()
    return data_dir


def freed(log: str) -> int:
    return sum(int(n) for n in re.findall(r"maintenance: .*?freed (\d+) revision", log))


def test_maintenance_frees_in_the_background_without_starving_requests(tmp_path):
    base = str(tmp_path)
    populate(base)
    with mounted(base, init=False, extra_args=["--maintenance-interval", "0.3"]) as m:
        latencies = []
        n = 0
        deadline = time.monotonic() + 120
        while freed(m.log()) < REWRITES - PATHS:
            assert time.monotonic() < deadline, "maintenance did not free the rewritten revisions:\n" + m.log()[-3000:]
            start = time.monotonic()
            with open(m.path("wb", "outputs", f"new{n}"), "wb") as f:  # a publish: needs the writer
                f.write(b"while maintenance runs")
            os.listdir(m.path("wb", "outputs"))
            latencies.append(time.monotonic() - start)
            n += 1
        assert n >= 5, "requests were served while the pass ran"
        latencies.sort()
        # A request waiting for a whole pass would wait seconds (hundreds of revisions, each a
        # few commands); one waiting for one step waits milliseconds.
        assert latencies[-1] < 1.0, latencies[-5:]
        assert "Traceback" not in m.log()
        with open(m.path("wb", "outputs", "f1"), "rb") as f:
            assert f.read() == b"rewrite %d\n" % (REWRITES - PATHS + 1)
    from nokvfs.workspace import datadir, fsck

    root = datadir.open_root(os.path.join(base, "data"))
    try:
        assert fsck.check(root).ok
        assert root.shard.retention_floors.event_floor_version > 0
    finally:
        root.close()
