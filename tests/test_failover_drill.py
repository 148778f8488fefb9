"""The failover drill of issue 15, as a test. Three "machines" (processes with their own data
directories) share nothing but a bucket on a loopback S3 endpoint:

  A  the owner, mounted with --replicate (through a proxy the test can cut: a partition)
  B  a follower, mounted with --follow
  C  a fresh data directory that takes over with `shard restore --take-ownership`

A writes, B shows it; A is cut off from the bucket, accepts one more write it cannot ship, and is
SIGKILLed; C restores with --take-ownership and mounts; B keeps following C; A restarted is
fenced: its mount turns read-only, it names the LSNs it could not ship, its commands exit 7.
"""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest

from nokvfs.engine.shard import Shard
from nokvfs.replicate.remote import open_remote
from tests.mount_fixtures import (
    mounted,
    needs_fuse,
    start_daemon,
    stop,
    unmount,
    wait_mounted,
)
from tests.test_mount_follow import (
    SHOWS,
    follow_args,
    init_owner,
    nokvfs,
    owner_args,
    write,
)
from tests.test_mount_freshness import read, within

pytest_plugins = ["tests.s3_fixtures"]
pytestmark = needs_fuse


def bucket_head(url: str, endpoint: str) -> int:
    bucket = open_remote(url, endpoint_url=endpoint)
    try:
        return bucket.read()[0].head.lsn
    finally:
        bucket.store.close()


def local_tail(data_dir: str) -> int:
    with Shard.open(os.path.join(data_dir, "shard"), verify=False) as shard:
        return shard.recovery_tail.applied_lsn


def log_of(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


@pytest.mark.damages_store(
    "A's write that never reached the bucket leaves blocks C does not reference: checked at the end"
)
@pytest.mark.long
def test_failover_drill(tmp_path, s3_bucket, s3_endpoint, cuttable_proxy):
    url = f"s3://{s3_bucket}/prod"
    a_dir, a_mnt = str(tmp_path / "a" / "data"), str(tmp_path / "a" / "mnt")
    os.makedirs(a_mnt)
    init_owner(a_dir, s3_bucket, s3_endpoint)
    a_args = owner_args(url, cuttable_proxy.endpoint)
    a = start_daemon(a_dir, a_mnt, str(tmp_path / "a" / "first.log"), a_args)
    try:
        wait_mounted(a_mnt, a, str(tmp_path / "a" / "first.log"))
        within(
            lambda: "published the data directory record" in log_of(str(tmp_path / "a" / "first.log")),
            SHOWS,
            "A's first push",
        )
        with mounted(str(tmp_path / "b"), init=False, extra_args=follow_args(url, s3_endpoint)) as b:
            # A writes, B shows it.
            write(os.path.join(a_mnt, "wb", "outputs", "x.txt"), b"written on A")
            within(lambda: read(b.path("wb", "outputs", "x.txt")) == b"written on A", SHOWS, "A's write on B")

            # A is cut off from the bucket, accepts a write it cannot ship, and dies.
            cuttable_proxy.cut()
            write(os.path.join(a_mnt, "wb", "outputs", "y.txt"), b"never shipped")
            time.sleep(0.5)  # A's loop tries (and fails) to push it
            a.send_signal(signal.SIGKILL)
            a.wait(30)
            unmount(a_mnt)
            shipped, a_tail = bucket_head(url, s3_endpoint), local_tail(a_dir)
            assert a_tail > shipped

            # C takes over with one command and mounts; B keeps following, now C.
            c_dir = str(tmp_path / "c" / "data")
            done = nokvfs(
                "--endpoint-url",
                s3_endpoint,
                "--data-dir",
                c_dir,
                "shard",
                "restore",
                "--from",
                url,
                "--take-ownership",
            )
            assert b"took ownership at owner epoch 2" in done.stdout
            with mounted(str(tmp_path / "c"), init=False, extra_args=owner_args(url, s3_endpoint)) as c:
                assert read(c.path("wb", "outputs", "x.txt")) == b"written on A"
                assert read(c.path("wb", "outputs", "y.txt")) is None
                write(c.path("wb", "outputs", "z.txt"), b"written on C")
                within(lambda: read(b.path("wb", "outputs", "z.txt")) == b"written on C", SHOWS, "C's write on B")
                assert read(b.path("wb", "outputs", "y.txt")) is None

                # A comes back (its network too): fenced, read-only, and it says what it lost.
                cuttable_proxy.mend()
                a_log = str(tmp_path / "a" / "restarted.log")
                a = start_daemon(a_dir, a_mnt, a_log, a_args)
                wait_mounted(a_mnt, a, a_log)
                lost = f"LSNs {shipped + 1}..{a_tail} of this shard were never shipped to the bucket"
                within(
                    lambda: lost in log_of(a_log) and "the mount is read-only from now on" in log_of(a_log),
                    SHOWS,
                    "A fenced",
                )
                with pytest.raises(OSError) as info:
                    write(os.path.join(a_mnt, "wb", "outputs", "late.txt"), b"after the takeover")
                assert info.value.errno == errno.EROFS
                assert read(os.path.join(a_mnt, "wb", "outputs", "y.txt")) == b"never shipped"  # A still reads its own
                refused = nokvfs("--data-dir", a_dir, "put", "wb:outputs/late.txt", "-", check=False)
                assert refused.returncode == 7 and b"owner fenced" in refused.stderr
                status = nokvfs(
                    "--endpoint-url", s3_endpoint, "--data-dir", a_dir, "shard", "status", "--to", url
                ).stdout
                assert b"FENCED" in status and f"LSNs {shipped + 1}..{a_tail}".encode() in status

                # C goes on; B follows it.
                write(c.path("wb", "outputs", "w.txt"), b"C again")
                within(lambda: read(b.path("wb", "outputs", "w.txt")) == b"C again", SHOWS, "C's second write on B")
                unmount(a_mnt)
                stop(a)
    finally:
        unmount(a_mnt)
        if a.poll() is None:
            a.kill()
            a.wait(30)
    assert "Traceback" not in log_of(str(tmp_path / "a" / "restarted.log"))

    # What is left: B and A check clean; C's only findings are the blocks of A's unshipped write.
    from tests.conftest import fsck_data_dir

    assert fsck_data_dir(b.data_dir).ok and fsck_data_dir(a_dir).ok
    findings = fsck_data_dir(c_dir).findings
    y_blocks = {f.subject for f in findings}
    assert findings and {f.code for f in findings} == {"ORPHAN_OBJECT"}
    from nokvfs.workspace import datadir, listing

    with datadir.open_root(a_dir, recover=False) as root, root.read() as view:
        y = listing.stat(view, root, "wb", "outputs/y.txt").entry
    assert all(f"/{y.artifact_revision_id.hex()}/blocks/" in key for key in y_blocks)


def test_a_live_owner_mount_turns_read_only_when_another_owner_takes_over(tmp_path, s3_bucket, s3_endpoint):
    url = f"s3://{s3_bucket}/prod"
    init_owner(str(tmp_path / "a" / "data"), s3_bucket, s3_endpoint)
    with mounted(str(tmp_path / "a"), init=False, extra_args=owner_args(url, s3_endpoint)) as a:
        within(lambda: "published the data directory record" in a.log(), SHOWS, "A's first push")
        write(a.path("wb", "outputs", "before.txt"), b"shipped")
        within(lambda: bucket_head(url, s3_endpoint) == local_tail(a.data_dir), SHOWS, "A shipped")
        writer = open(a.path("wb", "outputs", "open.txt"), "wb")  # open across the takeover
        try:
            nokvfs(
                "--endpoint-url",
                s3_endpoint,
                "--data-dir",
                str(tmp_path / "c"),
                "shard",
                "restore",
                "--from",
                url,
                "--take-ownership",
            )
            within(lambda: "the mount is read-only from now on" in a.log(), SHOWS, "A fenced")
            assert "every record of this shard is in the bucket" in a.log()
            writer.write(b"accepted by nobody")
            with pytest.raises(OSError) as info:
                writer.close()  # the publish is refused: its spool is kept
            assert info.value.errno == errno.EROFS
        finally:
            if not writer.closed:
                writer.close()
        for attempt in (
            lambda: write(a.path("wb", "outputs", "new.txt"), b"x"),
            lambda: os.unlink(a.path("wb", "outputs", "before.txt")),
        ):
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS
        assert read(a.path("wb", "outputs", "before.txt")) == b"shipped"
        assert nokvfs("--data-dir", a.data_dir, "put", "wb:outputs/cli.txt", "-", check=False).returncode == 7
