"""Real tools' sequences on a real mount that the other mount tests do not run: each is compared
with what a local disk gives (SEMANTICS.md's contract; "Known limits" in README.md)."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct

from tests.mount_fixtures import mount, needs_fuse  # noqa: F401 - the fixture

pytestmark = needs_fuse

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
