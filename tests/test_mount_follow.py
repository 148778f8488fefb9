"""`nokvfs mount --follow s3://bucket/prefix MOUNTPOINT`: a read-only mount of the owner's root on
another "machine" (another process and data directory; the bucket on loopback is all they share).

What the owner's mount writes shows in the follower's mount; a file the follower's kernel has
cached is replaced within 6 s, below the 10 s kernel timeout of files, so only the replayed
change feed's invalidation can have done it; writes are EROFS; the follower's directory answers
the read commands; the follower re-bootstraps in place when the increments it needs were cleaned.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from nokvfs.workspace import datadir, namespace, workbench
from tests.mount_fixtures import REPO, env, mounted, needs_fuse, unmount
from tests.test_mount_freshness import read, within

pytest_plugins = ["tests.s3_fixtures"]
pytestmark = needs_fuse

SHOWS = 15.0  # seconds for an owner's write to reach the follower's mount (pushed, polled, replayed)
INVALIDATES = 6.0  # below the kernel's 10 s timeout for files: only an invalidation explains it


def write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def nokvfs(*argv, check=True, extra_env=None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", *argv],
        capture_output=True,
        env={**env(), **(extra_env or {})},
        cwd=REPO,
        timeout=120,
    )
    if check:
        assert done.returncode == 0, done.stderr.decode()
    return done


def init_owner(data_dir: str, bucket: str, endpoint: str) -> None:
    """An owner data directory whose artifact bytes are in S3 (a follower elsewhere reads them there)."""
    datadir.init(data_dir, store=f"s3://{bucket}/objects", endpoint_url=endpoint)
    with datadir.open_root(data_dir) as root:
        workbench.create(root, "wb")
        namespace.put(root, "wb", "input/a.txt", b"alpha\n")


def owner_args(url: str, endpoint: str) -> tuple:
    return ("--replicate", url, "--replicate-endpoint-url", endpoint, "--replicate-interval", "0.2")


def follow_args(url: str, endpoint: str) -> tuple:
    return ("--follow", url, "--follow-endpoint-url", endpoint, "--follow-interval", "0.2")


def test_the_follower_mount_shows_the_owners_writes_invalidates_as_the_owner_does_and_refuses_writes(
    tmp_path, s3_bucket, s3_endpoint
):
    url = f"s3://{s3_bucket}/dr"
    init_owner(str(tmp_path / "a" / "data"), s3_bucket, s3_endpoint)
    with mounted(str(tmp_path / "a"), init=False, extra_args=owner_args(url, s3_endpoint)) as a:
        within(lambda: b"replicating shard" in open(a.log_path, "rb").read(), 30, "owner replicating")
        within(
            lambda: b"published the data directory record" in open(a.log_path, "rb").read(), 30, "data directory record"
        )
        with mounted(str(tmp_path / "b"), init=False, extra_args=follow_args(url, s3_endpoint)) as b:
            assert read(b.path("wb", "input", "a.txt")) == b"alpha\n"
            write(a.path("wb", "outputs", "x.txt"), b"one")
            within(lambda: read(b.path("wb", "outputs", "x.txt")) == b"one", SHOWS, "a new file")
            assert os.stat(b.path("wb", "outputs", "x.txt")).st_size == 3  # cached by the follower's kernel now
            write(a.path("wb", "outputs", "x.txt"), b"two, and longer")
            within(
                lambda: read(b.path("wb", "outputs", "x.txt")) == b"two, and longer",
                INVALIDATES + SHOWS / 3,
                "a rewrite",
            )
            assert os.stat(b.path("wb", "outputs", "x.txt")).st_size == len(b"two, and longer")
            os.unlink(a.path("wb", "input", "a.txt"))
            within(lambda: not os.path.exists(b.path("wb", "input", "a.txt")), SHOWS, "a removal")
            a.facade("workbench.create(root, 'later')")
            within(lambda: "later" in os.listdir(b.mountpoint), SHOWS, "a new workbench")

            # Writes are EROFS, whatever the call.
            for attempt in (
                lambda: open(b.path("wb", "outputs", "mine.txt"), "wb"),
                lambda: open(b.path("wb", "outputs", "x.txt"), "ab"),
                lambda: os.mkdir(b.path("wb", "outputs", "d")),
                lambda: os.unlink(b.path("wb", "outputs", "x.txt")),
                lambda: os.rename(b.path("wb", "outputs", "x.txt"), b.path("wb", "outputs", "y.txt")),
                lambda: os.mkdir(b.path("wb", ".snapshots", "s")),
            ):
                with pytest.raises(OSError) as info:
                    attempt()
                assert info.value.errno == errno.EROFS

            # The follower's data directory answers the read commands while it is mounted, and
            # refuses the writing ones.
            assert nokvfs("--data-dir", b.data_dir, "ls", "-R", "wb").stdout.split() == [b"outputs/x.txt"]
            assert nokvfs("--data-dir", b.data_dir, "get", "wb:outputs/x.txt").stdout == b"two, and longer"
            refused = nokvfs("--data-dir", b.data_dir, "put", "wb:outputs/z.txt", "-", check=False)
            assert refused.returncode == 7 and b"read only replica" in refused.stderr

            # The lag is exposed for `nokvfs status` (its status file, written by the daemon).
            def caught_up():
                with open(os.path.join(b.data_dir, "run", "follower.json")) as f:
                    status = json.load(f)
                return (
                    status["pid"] == b.proc.pid
                    and status["lag"]["records_behind"] == 0
                    and status["lag"]["since_poll_ms"] < 5000
                )

            within(caught_up, SHOWS, "the follower's status")

            # `nokvfs status` of both mounts: the owner ships, the follower follows, each says so.
            def asked(m):
                done = nokvfs("status", m.mountpoint, "--json")
                return json.loads(done.stdout)

            def follower_caught_up():
                s = asked(b)
                return (
                    s["mode"] == "follower" and s["replication"]["started"] and s["replication"]["records_behind"] == 0
                )

            within(follower_caught_up, SHOWS, "the follower's `nokvfs status`")
            assert (
                asked(b)["replication"]["bucket"].startswith(url + "/shards/")
                and f"is a follower of {url}" in asked(b)["read_only_reason"]
            )

            def owner_shipped():
                s = asked(a)["replication"]
                return (
                    s["role"] == "owner"
                    and s["started"]
                    and s["records_behind"] == 0
                    and s["last_push_unix"] is not None
                )

            within(owner_shipped, SHOWS, "the owner's `nokvfs status`")
            assert asked(a)["mode"] == "owner" and asked(a)["replication"]["last_error"] is None
            b_log = b.log_path
        with open(b_log) as f:
            log = f.read()
    assert "following s3://" in log and "mounting read-only" in log and "Traceback" not in log
    followed = int(log.rsplit(" change events followed", 1)[0].rsplit("; ", 1)[1])
    assert followed >= 4  # the put, the rewrite, the removal and the workbench reached the feed


def test_mount_follow_with_only_a_mountpoint_uses_the_xdg_cache_home(tmp_path, s3_bucket, s3_endpoint):
    from nokvfs.replicate.follower import default_cache_dir

    url = f"s3://{s3_bucket}/dr"
    owner = str(tmp_path / "owner")
    init_owner(owner, s3_bucket, s3_endpoint)
    nokvfs("--endpoint-url", s3_endpoint, "--data-dir", owner, "shard", "push", "--to", url)
    mountpoint = str(tmp_path / "mnt")
    os.mkdir(mountpoint)
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    os.environ["XDG_CACHE_HOME"] = xdg["XDG_CACHE_HOME"]
    try:
        cache = default_cache_dir(url, s3_endpoint)
    finally:
        del os.environ["XDG_CACHE_HOME"]
    assert cache.startswith(str(tmp_path / "xdg" / "nokvfs" / "follow") + os.sep)
    try:
        nokvfs("--endpoint-url", s3_endpoint, "mount", "--follow", url, mountpoint, extra_env=xdg)
        assert read(os.path.join(mountpoint, "wb", "input", "a.txt")) == b"alpha\n"
        assert os.path.exists(os.path.join(cache, "nokvfs.json"))
        from nokvfs.fs.daemon import read_pid_file

        pid = read_pid_file(cache, mountpoint)["pid"]
        nokvfs("umount", mountpoint)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}")
    finally:
        unmount(mountpoint)


def test_a_follower_re_bootstraps_without_unmounting_when_its_increments_were_cleaned_up(
    tmp_path, s3_bucket, s3_endpoint, cuttable_proxy
):
    from nokvfs.engine.shard import Shard
    from nokvfs.replicate import Replicator

    url = f"s3://{s3_bucket}/dr"
    owner = str(tmp_path / "owner")
    init_owner(owner, s3_bucket, s3_endpoint)

    def publish(path: str, body: bytes, *, checkpoint: bool = False) -> None:
        with datadir.open_root(owner) as root:
            namespace.put(root, "wb", path, body)
            replicator = Replicator.from_url(root.shard, url, endpoint_url=s3_endpoint, data_dir=owner)
            replicator.push_once()
            if checkpoint:
                replicator.checkpoint_once()
            replicator.bucket.store.close()

    publish("outputs/v0.txt", b"v0")
    args = ("--follow", url, "--follow-endpoint-url", cuttable_proxy.endpoint, "--follow-interval", "0.2")
    with mounted(str(tmp_path / "b"), init=False, extra_args=args) as b:
        within(lambda: read(b.path("wb", "outputs", "v0.txt")) == b"v0", SHOWS, "bootstrap")
        held = open(b.path("wb", "input", "a.txt"), "rb")  # a reader across the re-bootstrap
        try:
            cuttable_proxy.cut()  # the follower is away while the owner checkpoints twice
            for n in (1, 2, 3):
                publish(f"outputs/v{n}.txt", b"v%d" % n, checkpoint=n > 1)
            with Shard.open(os.path.join(owner, "shard"), verify=False) as shard:
                manifest = Replicator.from_url(shard, url, endpoint_url=s3_endpoint).bucket.read()[0]
            assert all(r.checkpoint.through_lsn > 0 for r in manifest.retained) and len(manifest.retained) == 1
            cuttable_proxy.mend()
            within(lambda: read(b.path("wb", "outputs", "v3.txt")) == b"v3", SHOWS, "after the re-bootstrap")
            assert os.path.ismount(b.mountpoint)
            assert held.read() == b"alpha\n"
        finally:
            held.close()
        assert "re-bootstraps from" in b.log()
        b_log = b.log_path
    with open(b_log) as f:
        assert "Traceback" not in f.read()


def test_a_restored_data_directory_mounts_at_once_and_follows_its_bucket(tmp_path, s3_bucket, s3_endpoint):
    url = f"s3://{s3_bucket}/dr"
    owner = str(tmp_path / "owner")
    init_owner(owner, s3_bucket, s3_endpoint)
    nokvfs("--endpoint-url", s3_endpoint, "--data-dir", owner, "shard", "push", "--to", url)
    restored = str(tmp_path / "new" / "data")
    nokvfs("--endpoint-url", s3_endpoint, "--data-dir", restored, "shard", "restore", "--from", url)
    with mounted(str(tmp_path / "new"), init=False, extra_args=("--follow-interval", "0.2")) as m:
        assert read(m.path("wb", "input", "a.txt")) == b"alpha\n"
        with datadir.open_root(owner) as root:
            namespace.put(root, "wb", "input/later.txt", b"later")
        nokvfs("--endpoint-url", s3_endpoint, "--data-dir", owner, "shard", "push", "--to", url)
        within(lambda: read(m.path("wb", "input", "later.txt")) == b"later", SHOWS, "the owner's next push")
        with pytest.raises(OSError) as info:
            write(m.path("wb", "input", "mine.txt"), b"x")
        assert info.value.errno == errno.EROFS
        assert "is a follower of" in m.log()


def test_a_follower_mounts_while_its_bucket_is_unreachable_and_follows_once_it_is_back(
    tmp_path, s3_bucket, s3_endpoint, cuttable_proxy
):
    from nokvfs.replicate.restore import restore_data_dir

    url = f"s3://{s3_bucket}/dr"
    owner = str(tmp_path / "owner")
    init_owner(owner, s3_bucket, s3_endpoint)
    nokvfs("--endpoint-url", s3_endpoint, "--data-dir", owner, "shard", "push", "--to", url)
    restore_data_dir(url, str(tmp_path / "b" / "data"), endpoint_url=s3_endpoint)
    cuttable_proxy.cut()
    args = ("--follow", url, "--follow-endpoint-url", cuttable_proxy.endpoint, "--follow-interval", "0.2")
    with mounted(str(tmp_path / "b"), init=False, extra_args=args) as b:
        assert read(b.path("wb", "input", "a.txt")) == b"alpha\n"  # its last state, served at once
        with datadir.open_root(owner) as root:
            namespace.put(root, "wb", "input/while-away.txt", b"away")
        nokvfs("--endpoint-url", s3_endpoint, "--data-dir", owner, "shard", "push", "--to", url)
        within(lambda: "cannot open the bucket of" in b.log(), SHOWS, "the retry")
        cuttable_proxy.mend()
        within(lambda: read(b.path("wb", "input", "while-away.txt")) == b"away", SHOWS * 4, "following once reachable")
