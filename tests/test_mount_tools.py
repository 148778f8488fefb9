"""Real tools' sequences on a real mount that the other mount tests do not run: each is compared
with what a local disk gives (SEMANTICS.md's contract; "Known limits" in README.md)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest

from tests.mount_fixtures import REPO, env, mount, mounted, needs_fuse  # noqa: F401 - the fixture

pytestmark = needs_fuse
pytest_plugins = ["tests.s3_fixtures"]

SYS_GETDENTS64 = 217  # x86_64


def getdents(fd: int, size: int = 2048) -> list[str]:
    """One getdents64(2) call with a `size`-byte buffer (Go's os.ReadDir reads 8 KiB a call;
    glibc's readdir reads st_blksize, 1 MiB on this mount): the names it returned."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(size)
    n = libc.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    names, at = [], 0
    while at < n:
        reclen = struct.unpack_from("<H", buf.raw, at + 16)[0]
        name = buf.raw[at + 19 : at + reclen].split(b"\0", 1)[0].decode()
        if name not in (".", ".."):
            names.append(name)
        at += reclen
    return names


def test_a_directory_listed_while_its_new_files_are_published_lists_each_once(mount):
    """`for i in ...; do : > d/fN; done; rm -r d` (shutil.rmtree, `find d -delete`): the last
    files created are published by their release while the listing pages, and each must still be
    listed once, or rmdir fails with ENOTEMPTY. Here a file created before the listing stays open
    (pending) until the listing has read its first buffer, then fsync publishes it."""
    d = mount.path("wb", "outputs", "d")
    os.mkdir(d)
    names = [f"f{i:03d}" for i in range(120)]
    for name in names:
        with open(os.path.join(d, name), "wb"):
            pass
    fd = os.open(os.path.join(d, "f005p"), os.O_CREAT | os.O_WRONLY, 0o644)
    listing = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        listed = getdents(listing)
        assert 0 < len(listed) < len(names)
        os.write(fd, b"x")
        os.fsync(fd)  # published while the listing stands after its first buffer
        while batch := getdents(listing):
            listed += batch
    finally:
        os.close(listing)
        os.close(fd)
    assert sorted(listed) == sorted(names + ["f005p"])
    shutil.rmtree(d)
    assert not os.path.exists(d)


def _published(m, relative: str) -> bytes | None:
    """What `nokvfs get` reads at wb:relative (None: nothing there)."""
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, "get", f"wb:{relative}"],
        capture_output=True,
        env=env(),
        cwd=REPO,
        timeout=120,
    )
    return done.stdout if done.returncode == 0 else None


def test_a_publication_its_close_gave_up_on_keeps_the_file_to_itself(tmp_path, s3_bucket, s3_endpoint):
    """A close(2) whose publication makes no progress for the syscall deadline answers EIO while
    the publication goes on (a bucket behind a link so slow that storing one 1 MiB block takes
    about a second, against a 0.3 s deadline); until it ends nothing else may touch the file's
    spool. A write through another descriptor then waits (or fails) and is published by the
    next close, never dropped with the spool of the first publication; and `truncate -s` (whose
    release publishes again) never conflicts with its own publication (a kept spool)."""
    from tests.s3_fixtures import slow_link

    body = bytes(range(256)) * (32 * 1024)  # 8 MiB: 8 blocks, about 2 s to store
    with (
        slow_link(s3_endpoint, os.path.join(str(tmp_path), "data"), 1 << 20) as link,
        mounted(
            str(tmp_path),
            extra_args=("--syscall-timeout", "0.3"),
            store=f"s3://{s3_bucket}/objects",
            endpoint_url=link.endpoint,
            block_size=1 << 20,
        ) as m,
    ):
        path = m.path("wb", "outputs", "slow.bin")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, body)
        with pytest.raises(OSError) as exc:
            os.close(os.dup(fd))  # `exec 3>&1 ...`: a duplicate's close publishes, and gives up
        assert exc.value.errno == errno.EIO
        deadline = time.monotonic() + 60
        while True:  # a careful writer retries a write that failed
            try:
                os.pwrite(fd, b"more", len(body))
                break
            except OSError as exc:
                assert exc.errno == errno.EIO and time.monotonic() < deadline
        with contextlib.suppress(OSError):
            os.close(fd)  # may give up waiting too: the release publishes then
        deadline = time.monotonic() + 60
        while _published(m, "outputs/slow.bin") != body + b"more":
            assert time.monotonic() < deadline, "the write through the second descriptor was never published"
            time.sleep(0.2)

        truncated = m.path("wb", "outputs", "image")
        done = subprocess.run(["truncate", "-s", "8M", truncated], capture_output=True, text=True)
        assert done.returncode in (0, 1), done.stderr  # 1: its close gave up waiting (EIO)
        deadline = time.monotonic() + 60
        while _published(m, "outputs/image") != bytes(8 << 20):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        spools = subprocess.run(
            [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, "spool", "list"],
            capture_output=True,
            text=True,
            env=env(),
            cwd=REPO,
        )
        assert spools.returncode == 0 and "kept" not in spools.stdout, spools.stdout + spools.stderr


@pytest.mark.parametrize("mode", ["default", "write-back"])
@pytest.mark.damages_store("deletes the bucket's copies of blocks the cache holds")
def test_files_written_to_a_bucket_are_read_back_from_the_local_cache_after_a_remount(
    tmp_path, s3_bucket, s3_endpoint, s3_client, mode
):
    """A mount over S3 keeps what it publishes in its block cache: after `cp` and `dd` through
    the mount and a remount, `cat` reads the files with no object of theirs left in the bucket
    (deleted behind the mount's back: only the cache can answer)."""
    sources = {"small.txt": b"cached line\n" * 100, "big.bin": os.urandom((3 << 20) + 5)}
    for name, data in sources.items():
        (tmp_path / name).write_bytes(data)
    options = dict(store=f"s3://{s3_bucket}/objects", endpoint_url=s3_endpoint, block_size=1 << 20)
    extra = ("--write-back",) if mode == "write-back" else ()
    with mounted(str(tmp_path), extra_args=extra, **options) as m:
        subprocess.run(["cp", str(tmp_path / "small.txt"), m.path("wb", "outputs", "small.txt")], check=True)
        subprocess.run(
            ["dd", f"if={tmp_path / 'big.bin'}", f"of={m.path('wb', 'outputs', 'big.bin')}", "bs=64k", "status=none"],
            check=True,
        )
    listed = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="objects/nokv/artifacts/").get("Contents", [])
    assert len(listed) == 1 + 4  # one block, four blocks
    for item in listed:
        s3_client.delete_object(Bucket=s3_bucket, Key=item["Key"])
    with mounted(str(tmp_path), init=False, extra_args=extra) as m:
        for name, data in sources.items():
            out = subprocess.run(["cat", m.path("wb", "outputs", name)], capture_output=True, check=True).stdout
            assert out == data, name
