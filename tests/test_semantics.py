"""SEMANTICS.md is true: every row of its table is executed against a real mount and must answer
exactly the documented result, and every documented row has a check here (and only those)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import re
import stat

import pytest

from tests.mount_fixtures import REPO, mounted, needs_fuse

pytestmark = needs_fuse

SEMANTICS = os.path.join(REPO, "SEMANTICS.md")
ROW = re.compile(r"^\| ([a-z0-9-]+) \| .* \| ([A-Z0-9]+) \|$")
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2


def documented() -> dict[str, str]:
    with open(SEMANTICS) as f:
        rows = [ROW.match(line.strip()) for line in f]
    return {m.group(1): m.group(2) for m in rows if m}


def renameat2(old: str, new: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, old.encode(), AT_FDCWD, new.encode(), flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


class Place:
    """The mount a row runs on: /wb with files, /other, a snapshot view, and what each needs."""

    def __init__(self, m, read_only):
        self.m = m
        self.read_only = read_only
        self.count = 0

    def path(self, *parts) -> str:
        return self.m.path(*parts)

    def fresh(self, name: str = "f", data: bytes = b"data") -> str:
        """A new published file in wb/outputs, its path."""
        self.count += 1
        path = self.path("wb", "outputs", f"{name}{self.count}")
        with open(path, "wb") as f:
            f.write(data)
        return path

    def view_file(self) -> str:
        return self.path("wb", ".snapshots", "v", "outputs", "seed.txt")


def close_after_outside_change(p: Place):
    path = p.fresh()
    other = p.m.facade_waiting(f"namespace.put(root, 'wb', 'outputs/{os.path.basename(path)}', b'elsewhere')")
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"mine")
    other.communicate(b"go\n", timeout=60)
    os.close(fd)


def close_after_outside_create(p: Place):
    p.count += 1
    name = f"new{p.count}"
    other = p.m.facade_waiting(f"namespace.put(root, 'wb', 'outputs/{name}', b'elsewhere')")
    fd = os.open(p.path("wb", "outputs", name), os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"mine")
    other.communicate(b"go\n", timeout=60)
    os.close(fd)


def write_on_read_only_fd(p: Place):
    fd = os.open(p.fresh(), os.O_RDONLY)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


def mmap_shared_write(p: Place):
    path = p.fresh(data=b"." * 8192)
    fd = os.open(path, os.O_RDWR)
    with mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mapped:
        mapped[0:5] = b"MAPPD"
    os.close(fd)
    with open(path, "rb") as f:
        assert f.read(5) == b"MAPPD"


def fallocate(mode: int):
    def check(p: Place):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        fd = os.open(p.fresh(data=b"x" * 8192), os.O_RDWR)
        try:
            if libc.fallocate(fd, mode, 0, 4096) != 0:
                number = ctypes.get_errno()
                raise OSError(number, os.strerror(number))
        finally:
            os.close(fd)

    return check


def posix_fallocate(p: Place):
    path = p.fresh(data=b"head")
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 10000)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"head" + bytes(9996)


def seek_hole(p: Place):
    fd = os.open(p.fresh(data=b"x" * 10000), os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_DATA) == 0
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 10000
    finally:
        os.close(fd)


def statfs(p: Place):
    assert os.statvfs(p.path("wb", "outputs")).f_namemax == 255


def flock(p: Place):
    with open(p.fresh(), "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_UN)


def fcntl_lock(p: Place):
    with open(p.fresh(), "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(f, fcntl.LOCK_UN)


def dir_with_file(p: Place) -> str:
    p.count += 1
    directory = p.path("wb", "outputs", f"full{p.count}")
    os.mkdir(directory)
    with open(os.path.join(directory, "inside"), "w") as f:
        f.write("x")
    return directory


def too_long(p: Place):
    deep = p.path("wb", "outputs", "d" * 150, "e" * 150)
    os.makedirs(deep, exist_ok=True)
    open(os.path.join(deep, "f" * 140), "w").close()


CHECKS = {
    "open-read": lambda p: os.close(os.open(p.fresh(), os.O_RDONLY)),
    "open-missing": lambda p: os.open(p.path("wb", "outputs", "missing"), os.O_RDONLY),
    "open-dir-for-writing": lambda p: os.open(p.path("wb", "outputs"), os.O_WRONLY),
    "create-excl-existing": lambda p: os.open(p.fresh(), os.O_WRONLY | os.O_CREAT | os.O_EXCL),
    "create-in-workbench": lambda p: open(p.path("wb", "loose"), "w"),
    "create-in-root": lambda p: open(p.path("loose"), "w"),
    "create-run-manifest": lambda p: open(p.path("wb", "metadata", "run_manifest.json"), "w"),
    "create-marker": lambda p: open(p.path("wb", "outputs", ".nokvfs-directory"), "w"),
    "create-name-256": lambda p: open(p.path("wb", "outputs", "n" * 256), "w"),
    "create-path-too-long": too_long,
    "create-backslash": lambda p: open(p.path("wb", "outputs", "back\\slash"), "w"),
    "create-in-view": lambda p: open(p.path("wb", ".snapshots", "v", "outputs", "new"), "w"),
    "open-write-in-view": lambda p: os.open(p.view_file(), os.O_WRONLY),
    "create-read-only": lambda p: open(p.path("wb", "outputs", "new-on-read-only"), "w"),
    "write-read-only-fd": write_on_read_only_fd,
    "close-outside-change": close_after_outside_change,
    "close-outside-create": close_after_outside_create,
    "truncate": lambda p: os.truncate(p.fresh(), 2),
    "unlink": lambda p: os.unlink(p.fresh()),
    "unlink-missing": lambda p: os.unlink(p.path("wb", "outputs", "missing")),
    "unlink-dir": lambda p: os.unlink(dir_with_file(p)),
    "unlink-in-view": lambda p: os.unlink(p.view_file()),
    "mkdir": lambda p: os.mkdir(p.path("wb", "outputs", f"made{p.fresh() and p.count}")),
    "mkdir-existing": lambda p: os.mkdir(p.path("wb", "outputs")),
    "mkdir-in-workbench": lambda p: os.mkdir(p.path("wb", "elsewhere")),
    "mkdir-section": lambda p: os.mkdir(p.path("wb", "outputs")),
    "mkdir-in-view": lambda p: os.mkdir(p.path("wb", ".snapshots", "v", "outputs", "d")),
    "mkdir-snapshot": lambda p: os.mkdir(p.path("wb", ".snapshots", f"s{p.fresh() and p.count}")),
    "mkdir-snapshot-numeric": lambda p: os.mkdir(p.path("wb", ".snapshots", "123")),
    "mkdir-commits": lambda p: os.mkdir(p.path("wb", ".commits", "x")),
    "rmdir-empty": lambda p: (os.mkdir(p.path("wb", "outputs", "empty")), os.rmdir(p.path("wb", "outputs", "empty"))),
    "rmdir-nonempty": lambda p: os.rmdir(dir_with_file(p)),
    "rmdir-file": lambda p: os.rmdir(p.fresh()),
    "rmdir-section": lambda p: os.rmdir(p.path("wb", "outputs")),
    "rmdir-workbench": lambda p: os.rmdir(p.path("wb")),
    "rmdir-snapshot": lambda p: (
        os.mkdir(p.path("wb", ".snapshots", "gone")),
        os.rmdir(p.path("wb", ".snapshots", "gone")),
    ),
    "rename": lambda p: os.rename(p.fresh(), p.path("wb", "outputs", "renamed")),
    "rename-across-workbenches": lambda p: os.rename(p.fresh(), p.path("other", "outputs", "moved")),
    "rename-dir-with-files": lambda p: os.rename(dir_with_file(p), p.path("wb", "outputs", f"moved-dir{p.count}")),
    "rename-dir-onto-nonempty": lambda p: os.rename(dir_with_file(p), dir_with_file(p)),
    "rename-noreplace": lambda p: renameat2(p.fresh(), p.fresh(), RENAME_NOREPLACE),
    "rename-exchange": lambda p: renameat2(p.fresh(), p.fresh(), RENAME_EXCHANGE),
    "rename-section": lambda p: os.rename(p.path("wb", "outputs"), p.path("wb", "renamed")),
    "rename-in-view": lambda p: os.rename(p.view_file(), p.path("wb", ".snapshots", "v", "outputs", "x")),
    "symlink": lambda p: os.symlink("target", p.path("wb", "outputs", f"link{p.fresh() and p.count}")),
    "readlink": lambda p: (os.symlink("t", p.path("wb", "outputs", "rl")), os.readlink(p.path("wb", "outputs", "rl"))),
    "link": lambda p: os.link(p.fresh(), p.path("wb", "outputs", "hard")),
    "mkfifo": lambda p: os.mkfifo(p.path("wb", "outputs", "fifo")),
    "mknod-char": lambda p: os.mknod(p.path("wb", "outputs", "dev"), stat.S_IFCHR | 0o600, os.makedev(1, 3)),
    "setxattr": lambda p: os.setxattr(p.fresh(), "user.note", b"v"),
    "setxattr-in-view": lambda p: os.setxattr(p.view_file(), "user.note", b"v"),
    "getxattr-missing": lambda p: os.getxattr(p.fresh(), "user.missing"),
    "getxattr-revision": lambda p: os.getxattr(p.fresh(), "user.nokvfs.revision"),
    "chmod": lambda p: os.chmod(p.fresh(), 0o600),
    "chmod-dir": lambda p: (os.mkdir(p.path("wb", "outputs", "cd")), os.chmod(p.path("wb", "outputs", "cd"), 0o700)),
    "chmod-workbench": lambda p: os.chmod(p.path("wb"), 0o700),
    "chmod-in-view": lambda p: os.chmod(p.view_file(), 0o600),
    "chown": lambda p: os.chown(p.fresh(), 1234, 5678),
    "utime": lambda p: os.utime(p.fresh(), (1_000_000, 2_000_000)),
    "fsync": lambda p: (lambda fd: (os.write(fd, b"x"), os.fsync(fd), os.close(fd)))(os.open(p.fresh(), os.O_WRONLY)),
    "flock": flock,
    "fcntl-lock": fcntl_lock,
    "mmap-shared-write": mmap_shared_write,
    "fallocate": fallocate(0),
    "fallocate-punch-hole": fallocate(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE),
    "posix-fallocate": posix_fallocate,
    "seek-hole": seek_hole,
    "open-tmpfile": lambda p: os.close(os.open(p.path("wb", "outputs"), os.O_TMPFILE | os.O_WRONLY, 0o600)),
    "statfs": statfs,
}
READ_ONLY_ROWS = {"create-read-only"}


def outcome(check, place) -> str:
    try:
        check(place)
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "0"


def test_every_documented_row_has_a_check_and_no_check_is_undocumented():
    rows = documented()
    assert len(rows) >= 60
    assert set(rows) == set(CHECKS), set(rows) ^ set(CHECKS)


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    base = tmp_path_factory.mktemp("semantics")
    with mounted(str(base / "live"), workbenches=("wb", "other")) as live:
        with open(live.path("wb", "outputs", "seed.txt"), "w") as f:
            f.write("seed")
        os.mkdir(live.path("wb", ".snapshots", "v"))
        with mounted(str(base / "ro"), extra_args=("--read-only",)) as read_only:
            yield Place(live, read_only=False), Place(read_only, read_only=True)


def test_every_row_answers_what_it_documents(places):
    live, read_only = places
    failures = []
    for row, expected in documented().items():
        place = read_only if row in READ_ONLY_ROWS else live
        got = outcome(CHECKS[row], place)
        if got != expected:
            failures.append(f"{row}: documented {expected}, got {got}")
    assert not failures, "\n".join(failures)
