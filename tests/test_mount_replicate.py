"""`nokvfs mount --replicate s3://...`: the shard reaches the bucket while mounted, a last push at
unmount ships the rest, a restore elsewhere has every file -- and replication never breaks the mount.

The bucket is a moto S3 server on 127.0.0.1 (tests/s3_fixtures.py); nothing else is contacted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from nokvfs.engine.shard import Shard
from nokvfs.replicate import Replicator
from nokvfs.replicate.restore import restore
from tests.mount_fixtures import env, mounted, needs_fuse

pytest_plugins = ["tests.s3_fixtures"]
pytestmark = needs_fuse


def files_of(data_dir: str) -> dict[str, str]:
    """workbench:path -> SHA-256 of the body, for every file of every Visible workbench (the facade)."""
    from nokvfs.workspace import datadir, listing, reading
    from nokvfs.workspace import workbench as wb

    root = datadir.open_root(data_dir, verify=True, recover=False)
    try:
        out = {}
        with root.read() as view:
            for workbench in wb.list_visible(view, root.root_id):
                cursor = None
                while True:
                    page = listing.list_recursive(view, root, workbench.workbench_id, cursor=cursor)
                    for child in page.children:
                        body = reading.read(root, child.entry, view=view)
                        out[f"{workbench.workbench_id}:{child.name}"] = hashlib.sha256(body).hexdigest()
                    cursor = page.cursor
                    if cursor is None:
                        break
        return out
    finally:
        if root.blocks.cache is not None:
            root.close()  # closes its block cache too


def replication_status(data_dir: str, url: str, endpoint: str) -> dict:
    """The bucket's view of the shard next to its local applied LSN, read from another process's
    handle on the shard (LMDB is multi-process), without writing anything."""
    shard = Shard.open(os.path.join(data_dir, "shard"), verify=False)
    try:
        return Replicator.from_url(shard, url, endpoint_url=endpoint).status()
    finally:
        shard.close()


def write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_files_written_through_the_mount_are_replicated_and_restore_elsewhere(tmp_path, s3_bucket, s3_endpoint):
    url = f"s3://{s3_bucket}/mounted"
    args = ("--replicate", url, "--replicate-endpoint-url", s3_endpoint, "--replicate-interval", "0.2")
    rng = random.Random(9)
    with mounted(str(tmp_path), extra_args=args) as m:
        write(m.path("wb", "outputs", "model.bin"), rng.randbytes(5 * 1024 * 1024 + 3))
        write(m.path("wb", "logs", "run.log"), b"started\n")
        with open(m.path("wb", "logs", "run.log"), "ab") as f:
            f.write(b"finished\n")
        os.mkdir(m.path("wb", ".snapshots", "replicated"))
        # The loop pushes by itself: wait until the bucket's head is the shard's applied LSN.
        deadline = time.monotonic() + 30
        while True:
            status = replication_status(m.data_dir, url, s3_endpoint)
            if status.get("head_lsn") == status["local_applied_lsn"] and status["lag"] == 0:
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        assert status["generation"] >= 1 and not status["fenced"]
        # Written just before the unmount: only the last push can ship this one.
        write(m.path("wb", "outputs", "last-second.txt"), b"written right before umount")
        log_path = m.log_path
    with open(log_path) as f:
        log = f.read()
    assert "replicating shard" in log and "last push to" in log
    assert "ERROR" not in log and "Traceback" not in log

    data_dir = str(tmp_path / "data")
    status = replication_status(data_dir, url, s3_endpoint)
    assert status["head_lsn"] == status["local_applied_lsn"] and status["lag"] == 0

    # Another machine: the shard from the bucket, the data directory's configuration and the
    # control plane beside it (the object store is shared: blocks live outside the shard).
    fresh = tmp_path / "elsewhere"
    result = restore(url, str(fresh / "shard"), endpoint_url=s3_endpoint)
    assert result.applied_lsn == status["local_applied_lsn"]
    shutil.copy(os.path.join(data_dir, "nokvfs.json"), fresh / "nokvfs.json")
    shutil.copytree(os.path.join(data_dir, "control"), fresh / "control")
    original, restored = files_of(data_dir), files_of(str(fresh))
    assert restored == original
    assert {"wb:outputs/model.bin", "wb:logs/run.log", "wb:outputs/last-second.txt"} <= set(restored)
    from nokvfs.workspace import datadir, reading, snapshot

    root = datadir.open_root(str(fresh), verify=False, recover=False)
    try:
        assert snapshot.get(root, "wb", "replicated").ref.state.name == "Active"
        from nokvfs.workspace import listing

        with root.read() as view:
            entry = listing.stat(view, root, "wb", "logs/run.log").entry
            assert reading.read(root, entry, view=view) == b"started\nfinished\n"
    finally:
        root.close()  # closes its block cache too


def test_a_bucket_that_cannot_be_reached_never_breaks_the_mount(tmp_path, aws_test_env, closed_loopback_port):
    endpoint = f"http://127.0.0.1:{closed_loopback_port}"
    args = ("--replicate", "s3://nowhere/prefix", "--replicate-endpoint-url", endpoint, "--replicate-interval", "0.5")
    with mounted(str(tmp_path), extra_args=args) as m:
        write(m.path("wb", "outputs", "f.txt"), b"still served")
        deadline = time.monotonic() + 20
        while "cannot open s3://nowhere/prefix yet" not in m.log():  # the first open gave up
            assert time.monotonic() < deadline, m.log()
            write(m.path("wb", "outputs", "f.txt"), b"still served")  # and the mount serves on
            time.sleep(0.2)
        with open(m.path("wb", "outputs", "f.txt"), "rb") as f:
            assert f.read() == b"still served"
        asked = subprocess.run(
            [sys.executable, "-m", "nokvfs.cli.main", "status", m.mountpoint, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env(),
        )
        replication = json.loads(asked.stdout)["replication"]  # status says what the log says
        assert replication == {
            "role": "owner",
            "bucket": "s3://nowhere/prefix",
            "started": False,
            "local_lsn": replication["local_lsn"],
        }
        log_path = m.log_path
        ending = time.monotonic()
    assert time.monotonic() - ending < 10  # a retry in flight does not hold up the unmount
    with open(log_path) as f:
        log = f.read()
    # Opening the bucket is retried in the background; at unmount the operator is told how to
    # ship what this mount could not.
    assert "cannot open s3://nowhere/prefix yet" in log
    assert (
        "replication to s3://nowhere/prefix never started" in log
        and "nokvfs shard push --to s3://nowhere/prefix" in log
    )
    assert "unmounted" in log and "Traceback" not in log


def test_with_sync_close_returns_only_once_the_bucket_holds_the_write(tmp_path, s3_bucket, s3_endpoint):
    """`--replicate URL --sync`: an accepted write is never lost with the machine. Right after
    close(2) returns, the bucket's head has reached the shard's LSN -- no waiting, no poll."""
    url = f"s3://{s3_bucket}/synced"
    # A long interval: only the close itself can have pushed what it wrote.
    args = ("--replicate", url, "--replicate-endpoint-url", s3_endpoint, "--replicate-interval", "3600", "--sync")
    with mounted(str(tmp_path), extra_args=args) as m:
        for index in range(3):
            write(m.path("wb", "outputs", f"synced-{index}.txt"), f"write {index}".encode())
            status = replication_status(m.data_dir, url, s3_endpoint)
            assert status["head_lsn"] is not None and status["head_lsn"] >= status["local_applied_lsn"], status
        fd = os.open(m.path("wb", "outputs", "synced-fsync.txt"), os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"fsynced")
        os.fsync(fd)
        status = replication_status(m.data_dir, url, s3_endpoint)
        assert status["head_lsn"] >= status["local_applied_lsn"], status
        os.close(fd)


def fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", ["default", "write-back"])
def test_with_sync_fsync_of_a_directory_returns_once_the_bucket_holds_its_entries(
    tmp_path, s3_bucket, s3_endpoint, mode
):
    """The durable rename (write a temporary, fsync it, rename it over, fsync the directory), and
    files closed (write-back: accepted, published later) in a directory made with mkdir: with
    `--sync`, fsync(2) of the directory returns only once the bucket holds them. It returned at
    once (the mount had no fsyncdir), so losing the machine right after it lost the rename."""
    url = f"s3://{s3_bucket}/dirsync-{mode}"
    args = ("--replicate", url, "--replicate-endpoint-url", s3_endpoint, "--replicate-interval", "3600", "--sync")
    # Write-back: enough files that the publisher is still at them when the fsync comes.
    count = 1
    if mode == "write-back":
        args += ("--write-back",)
        count = 200
    closed = {f"closed-{i}.txt": f"closed {i}".encode() for i in range(count)}
    with mounted(str(tmp_path), extra_args=args) as m:
        outputs = m.path("wb", "outputs")
        with open(os.path.join(outputs, "state.tmp"), "wb") as f:
            f.write(b"state 1")
            os.fsync(f.fileno())
        os.mkdir(os.path.join(outputs, "made"))
        for name, body in closed.items():
            write(os.path.join(outputs, "made", name), body)
        if mode == "default":
            time.sleep(1)  # a push the last close started may run on after it returned: let it end
        os.rename(os.path.join(outputs, "state.tmp"), os.path.join(outputs, "state"))
        before = replication_status(m.data_dir, url, s3_endpoint)
        fsync_directory(os.path.join(outputs, "made"))
        fsync_directory(outputs)
        after = replication_status(m.data_dir, url, s3_endpoint)
        assert after["head_lsn"] is not None and after["head_lsn"] >= after["local_applied_lsn"], (before, after)
        if mode == "default":
            assert before["head_lsn"] < before["local_applied_lsn"], before  # the rename was not shipped yet
        # The machine is lost now: another one restores what the bucket holds (while this mount
        # still runs, so no unmount's last push can have shipped anything).
        fresh = tmp_path / "elsewhere"
        restore(url, str(fresh / "shard"), endpoint_url=s3_endpoint)
        shutil.copy(os.path.join(m.data_dir, "nokvfs.json"), fresh / "nokvfs.json")
        shutil.copytree(os.path.join(m.data_dir, "control"), fresh / "control")
        files = files_of(str(fresh))
    assert files["wb:outputs/state"] == hashlib.sha256(b"state 1").hexdigest()
    assert "wb:outputs/state.tmp" not in files
    missing = [n for n, body in closed.items() if files.get(f"wb:outputs/made/{n}") != hashlib.sha256(body).hexdigest()]
    assert missing == [], f"{len(missing)} of {len(closed)} closed files not in the bucket after fsync of the directory"
