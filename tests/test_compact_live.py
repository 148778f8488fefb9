"""Compaction of a shard this process has open (`Shard.compact_live`, what a mount's maintenance
runs): it shrinks the file while reads and writes go on, loses no write that committed during
its copy, steps aside when another process has the shard open, and survives a crash at each step
of the swap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from nokvfs.engine import compact
from nokvfs.fs.status import query
from nokvfs.workspace import datadir, fsck, listing, namespace, reading
from tests.mount_fixtures import mounted, needs_fuse
from tests.test_compact import REPO, build, check


def read_all(root, expected: dict) -> None:
    with root.read() as view:
        entries = {path: listing.stat(view, root, "w", path).entry for path in expected}
    for path, body in expected.items():
        assert reading.read(root, entries[path]) == body, path


def test_live_compaction_shrinks_the_file_while_reads_and_writes_go_on(tmp_path):
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    mdb = os.path.join(data_dir, "shard", "data.mdb")
    root = datadir.open_root(data_dir)
    errors: list[BaseException] = []
    stop = threading.Event()
    written: dict[str, bytes] = {}

    def reader():
        try:
            while not stop.is_set():
                read_all(root, expected)
        except BaseException as exc:
            errors.append(exc)

    def writer():
        n = 0
        try:
            while not stop.is_set():
                body = b"during %d\n" % n
                namespace.put(root, "w", f"outputs/during{n % 5}", body)
                written[f"outputs/during{n % 5}"] = body
                n += 1
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    try:
        used, before = root.shard.space()
        assert used < before / 2, (used, before)  # free pages dominate: what compaction is for
        threads = [threading.Thread(target=reader) for _ in range(2)] + [threading.Thread(target=writer)]
        for t in threads:
            t.start()
        report = None
        for _ in range(20):
            report = root.shard.compact_live()
            if report is not None:
                break
        time.sleep(0.3)  # reads and writes on the swapped environment
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert report is not None, "20 live compactions in a row found a write committed during their copy"
        assert report.before_bytes == before
        assert report.after_bytes < before / 2
        assert os.path.getsize(mdb) < before / 2  # and the writes since went on in the compacted file
        assert not compact.has_leftovers(os.path.join(data_dir, "shard"))
        read_all(root, {**expected, **written})
        namespace.put(root, "w", "outputs/after-swap", b"on the new file")
    finally:
        stop.set()
        root.close()
    check(data_dir, {**expected, **written, "outputs/after-swap": b"on the new file"})


def test_a_write_committed_during_the_copy_is_never_swapped_away(tmp_path, monkeypatch):
    """After each copy another thread writes. The first attempts copy while writes go on: the
    write commits after the copy, so the swap must not happen (it would put back a shard without
    it). The last attempt holds writes back while it copies: the write waits, the swap happens,
    and the write lands on the compacted file."""
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    root = datadir.open_root(data_dir)
    copy = compact._copy_verified
    writes: dict[str, bytes] = {}
    finished_before_swap = []

    def copy_then_write(source, path, *, side_files):
        point = copy(source, path, side_files=side_files)
        name = f"outputs/late{len(finished_before_swap)}"
        body = b"committed after copy %d" % len(finished_before_swap)
        writer = threading.Thread(target=lambda: (namespace.put(root, "w", name, body), writes.update({name: body})))
        writer.start()
        writer.join(1.0)
        finished_before_swap.append(not writer.is_alive())
        threads.append(writer)
        return point

    threads: list[threading.Thread] = []
    monkeypatch.setattr(compact, "_copy_verified", copy_then_write)
    try:
        report = root.shard.compact_live(attempts=3)
        for t in threads:
            t.join(30)
        assert finished_before_swap == [True, True, False]
        assert report is not None and report.after_bytes < report.before_bytes / 2
        assert len(writes) == 3
        read_all(root, {**expected, **writes})
        assert not compact.has_leftovers(os.path.join(data_dir, "shard"))
    finally:
        root.close()
    check(data_dir, {**expected, **writes})


def test_live_compaction_steps_aside_while_another_process_has_the_shard_open(tmp_path):
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from nokvfs.workspace import datadir; r = datadir.open_root(sys.argv[1]); "
            "print('open', flush=True); sys.stdin.read(); r.close()",
            data_dir,
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    root = datadir.open_root(data_dir)
    try:
        assert holder.stdout.readline() == b"open\n"
        assert root.shard.compact_live() is None
        # Still shared: the other process's commands work, and so do this one's.
        namespace.put(root, "w", "outputs/still", b"works")
        holder.communicate(b"", timeout=60)
        assert holder.returncode == 0
        report = root.shard.compact_live()  # alone now
        assert report is not None and report.after_bytes < report.before_bytes / 2
        # `nokvfs compact` from another process is refused while this one has it open.
        with pytest.raises(Exception, match="open in another process"):
            compact.compact(os.path.join(data_dir, "shard"))
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        root.close()
    check(data_dir, {**expected, "outputs/still": b"works"})


@pytest.mark.parametrize("step", ["copied", "new", "old", "swapped"])
def test_a_crash_at_each_step_of_a_live_swap_loses_nothing(tmp_path, step):
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    script = (
        "import sys; from nokvfs.workspace import datadir, namespace\n"
        "r = datadir.open_root(sys.argv[1])\n"
        "namespace.put(r, 'w', 'outputs/before-crash', b'accepted')\n"
        "r.shard.compact_live()\n"
        "print('not crashed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, data_dir],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO, **{compact.CRASH_ENV: step}),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 137, done.stderr.decode() + done.stdout.decode()
    check(data_dir, {**expected, "outputs/before-crash": b"accepted"})


@needs_fuse
def test_a_mount_compacts_its_shard_in_the_background_and_keeps_serving(tmp_path):
    base = str(tmp_path)
    data_dir = os.path.join(base, "data")
    expected = build(data_dir)
    path = os.path.join(data_dir, "nokvfs.json")
    with open(path) as f:
        config = json.load(f)
    config["maintenance"] = {"compact_free_ratio": 0.5, "compact_min_bytes": 0}
    with open(path, "w") as f:
        json.dump(config, f)
    mdb = os.path.join(data_dir, "shard", "data.mdb")
    before = os.path.getsize(mdb)
    with mounted(base, init=False, workbenches=("w",), extra_args=["--maintenance-interval", "0.5"]) as m:
        deadline = time.monotonic() + 120
        n = 0
        latencies = []
        while "compacted the shard" not in m.log():
            assert time.monotonic() < deadline, "the mount did not compact:\n" + m.log()[-3000:]
            start = time.monotonic()
            with open(m.path("w", "outputs", f"new{n}"), "wb") as f:
                f.write(b"while compacting %d" % n)
            for name, body in expected.items():
                with open(m.path("w", *name.split("/")), "rb") as f:
                    assert f.read() == body
            latencies.append(time.monotonic() - start)
            n += 1
            time.sleep(0.05)
        assert os.path.getsize(mdb) < before / 2
        shown = query(m.data_dir, m.mountpoint)
        assert shown["maintenance"]["compactions"] >= 1 and shown["maintenance"]["compacted_bytes"] > before / 2
        assert shown["shard"]["used_bytes"] <= shown["shard"]["file_bytes"] < before / 2
        with open(m.path("w", "outputs", "after"), "wb") as f:  # a publish on the swapped file
            f.write(b"after the swap")
        assert sorted(os.listdir(m.path("w", "outputs"))) == sorted(
            [p.split("/")[1] for p in expected] + [f"new{i}" for i in range(n)] + ["after"]
        )
        assert "Traceback" not in m.log()
        assert max(latencies) < 1.0, sorted(latencies)[-5:]
    root = datadir.open_root(data_dir, verify=True)
    try:
        assert fsck.check(root).ok
        read_all(root, {**expected, "outputs/after": b"after the swap"})
    finally:
        root.close()
