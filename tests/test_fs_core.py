"""The mount's Operations without a kernel: every errno rule of the filesystem core, in
milliseconds (as s3ql's t3_fs_api and mountpoint-s3's reference tests drive theirs).

`Kernel` stands in for the VFS: it resolves paths with LOOKUP, keeps no caches, and calls the
pyfuse3 Operations with a fake request context. Each test is a user's call and the errno a local
filesystem (or nokvfs's documented choice) gives it; the mount tests prove the same through the
real kernel with real tools.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import pyfuse3
import pytest
import trio

from nokvfs.fs import retries as retries_module
from nokvfs.fs.filesystem import FileSystem
from nokvfs.fs.inodes import ROOT_INODE
from nokvfs.fs.operations import Operations
from nokvfs.fs.prefetch import BlockFetcher
from nokvfs.fs.retries import OpenRetries
from nokvfs.fs.threads import Workers
from nokvfs.fs.views import LiveView
from nokvfs.workspace import datadir, namespace, snapshot, workbench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class Ctx:
    """What pyfuse3 hands a handler about the caller."""

    def __init__(self, uid: int = 0, gid: int = 0, umask: int = 0o022):
        self.uid, self.gid, self.pid, self.umask = uid, gid, os.getpid(), umask


class Fields:
    """pyfuse3.SetattrFields as a handler sees it."""

    def __init__(self, **set_):
        for name in (
            "update_atime",
            "update_mtime",
            "update_ctime",
            "update_mode",
            "update_uid",
            "update_gid",
            "update_size",
        ):
            setattr(self, name, set_.get(name, False))


class NullInvalidator:
    def entry(self, *args, **kwargs):
        pass

    def inode(self, *args, **kwargs):
        pass


class Kernel:
    """A minimal VFS over Operations: path resolution by LOOKUP, no dentry or attribute cache."""

    def __init__(self, root, *, read_only: bool = False):
        workers = Workers()
        self.fs = FileSystem(
            root, LiveView(root, read_only=read_only), workers, NullInvalidator(), BlockFetcher(root, workers)
        )
        self.ops = Operations(self.fs)
        self.ctx = Ctx()

    def call(self, method, *args):
        return trio.run(getattr(self.ops, method), *args)

    def errno_of(self, method, *args) -> int:
        with pytest.raises(pyfuse3.FUSEError) as exc:
            self.call(method, *args)
        return exc.value.errno

    def ino(self, path: str) -> int:
        ino = ROOT_INODE
        for name in [p for p in path.split("/") if p]:
            attr = self.call("lookup", ino, name.encode(), self.ctx)
            if attr.st_ino == 0:
                raise FileNotFoundError(path)
            ino = attr.st_ino
        return ino

    def split(self, path: str) -> tuple[int, bytes]:
        parent, _, name = path.rpartition("/")
        return self.ino(parent), name.encode()

    # --- syscalls ---------------------------------------------------------------------------------

    def create(self, path: str, flags: int = os.O_WRONLY | os.O_CREAT, mode: int = 0o644) -> int:
        parent, name = self.split(path)
        info, _ = self.call("create", parent, name, mode, flags, self.ctx)
        return info.fh

    def open(self, path: str, flags: int = os.O_RDONLY) -> int:
        return self.call("open", self.ino(path), flags, self.ctx).fh

    def write(self, fh: int, data: bytes, offset: int = 0) -> int:
        return self.call("write", fh, offset, data)

    def read(self, fh: int, size: int = 1 << 20, offset: int = 0) -> bytes:
        return self.call("read", fh, offset, size)

    def close(self, fh: int) -> None:
        """close(2) of the last descriptor: FLUSH, then RELEASE."""
        try:
            self.call("flush", fh)
        finally:
            self.call("release", fh)

    def put(self, path: str, data: bytes) -> None:
        fh = self.create(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.write(fh, data)
        self.close(fh)

    def cat(self, path: str) -> bytes:
        fh = self.open(path)
        try:
            return self.read(fh)
        finally:
            self.close(fh)

    def stat(self, path: str):
        return self.call("getattr", self.ino(path), self.ctx)

    def setattr(self, path: str, fh=None, **values):
        attr = pyfuse3.EntryAttributes()
        fields = {}
        for name, value in values.items():
            setattr(attr, "st_" + name, value)
            fields[
                "update_" + name.removesuffix("_ns").removesuffix("time") + ("time" if name.endswith("time_ns") else "")
            ] = True
        return self.call("setattr", self.ino(path), attr, Fields(**fields), fh, self.ctx)

    def mkdir(self, path: str, mode: int = 0o755):
        parent, name = self.split(path)
        return self.call("mkdir", parent, name, mode, self.ctx)

    def listdir(self, path: str) -> list[str]:
        fh = self.call("opendir", self.ino(path), self.ctx)
        names = []
        original = pyfuse3.readdir_reply

        def reply(token, name, attr, next_id):
            if name not in (b".", b".."):  # as os.listdir
                names.append(name.decode())
            return True

        pyfuse3.readdir_reply = reply
        try:
            self.call("readdir", fh, 0, None)
        finally:
            pyfuse3.readdir_reply = original
            self.call("releasedir", fh)
        return names

    def listdir_in_batches(self, path: str, batch: int, between) -> list[str]:
        """readdir as the kernel pages it (`batch` entries a call, each call from the offset the
        last accepted entry carried), calling `between()` after the first call."""
        fh = self.call("opendir", self.ino(path), self.ctx)
        names, offset, original = [], 0, pyfuse3.readdir_reply
        try:
            while True:
                taken = []

                def reply(token, name, attr, next_id, taken=taken):
                    if len(taken) == batch:
                        return False
                    taken.append((name.decode(), next_id))
                    return True

                pyfuse3.readdir_reply = reply
                self.call("readdir", fh, offset, None)
                pyfuse3.readdir_reply = original
                if not taken:
                    return names
                names += [name for name, _ in taken if name not in (".", "..")]
                offset = taken[-1][1]
                if between is not None:
                    between()
                    between = None
        finally:
            pyfuse3.readdir_reply = original
            self.call("releasedir", fh)


@pytest.fixture
def kernel(tmp_path):
    data = str(tmp_path / "data")
    datadir.init(data)
    root = datadir.open_root(data, verify=False)
    workbench.create(root, "wb")
    workbench.create(root, "other")
    try:
        yield Kernel(root)
    finally:
        root.close()


# --- EPERM: what the layout itself forbids ---------------------------------------------------------


def test_workbenches_and_sections_are_never_removed_renamed_or_written_into(kernel):
    k = kernel
    assert k.errno_of("rmdir", ROOT_INODE, b"wb", k.ctx) == errno.EPERM
    assert k.errno_of("rmdir", k.ino("wb"), b"outputs", k.ctx) == errno.EPERM
    assert k.errno_of("rename", ROOT_INODE, b"wb", ROOT_INODE, b"renamed", 0, k.ctx) == errno.EPERM
    assert k.errno_of("unlink", k.ino("wb"), b"outputs", k.ctx) == errno.EPERM
    assert k.errno_of("create", k.ino("wb"), b"loose.txt", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EPERM
    assert k.errno_of("create", ROOT_INODE, b"loose.txt", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EPERM
    assert k.errno_of("mkdir", k.ino("wb"), b"elsewhere", 0o755, k.ctx) == errno.EPERM
    assert k.errno_of("mkdir", k.ino("wb"), b"outputs", 0o755, k.ctx) == errno.EEXIST


def test_reserved_paths_accept_no_direct_writes(kernel):
    k = kernel
    metadata = k.ino("wb/metadata")
    for name in (b"run_manifest.json", b"restore_manifest.json"):
        assert k.errno_of("create", metadata, name, 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EPERM
        assert k.errno_of("mkdir", metadata, name, 0o755, k.ctx) == errno.EPERM
    outputs = k.ino("wb/outputs")
    assert k.errno_of("create", outputs, b".nokvfs-directory", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EPERM
    k.put("wb/metadata/other.json", b"{}")  # the rest of metadata/ is open


def test_hard_links_and_special_files_are_eperm(kernel):
    k = kernel
    k.put("wb/outputs/f", b"x")
    assert k.errno_of("link", k.ino("wb/outputs/f"), k.ino("wb/outputs"), b"hard", k.ctx) == errno.EPERM
    assert k.errno_of("mknod", k.ino("wb/outputs"), b"fifo", stat.S_IFIFO | 0o644, 0, k.ctx) == errno.EPERM


# --- EROFS: views and read-only mounts ------------------------------------------------------------


def test_views_are_read_only(kernel):
    k = kernel
    k.put("wb/outputs/f", b"before")
    snapshot.mint(k.fs.tree.root, "wb", alias="s")
    view_outputs = k.ino("wb/.snapshots/s/outputs")
    assert k.cat("wb/.snapshots/s/outputs/f") == b"before"
    assert k.errno_of("create", view_outputs, b"new", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EROFS
    assert k.errno_of("unlink", view_outputs, b"f", k.ctx) == errno.EROFS
    assert k.errno_of("open", k.ino("wb/.snapshots/s/outputs/f"), os.O_WRONLY, k.ctx) == errno.EROFS
    assert k.errno_of("mkdir", k.ino("wb/.commits"), b"x", 0o755, k.ctx) == errno.EROFS
    assert k.errno_of("mkdir", k.ino("wb/.snapshots"), b"123", 0o755, k.ctx) == errno.EINVAL  # ids are the root's


def test_a_read_only_mount_refuses_every_change(tmp_path):
    data = str(tmp_path / "data")
    datadir.init(data)
    root = datadir.open_root(data, verify=False)
    try:
        workbench.create(root, "wb")
        namespace.put(root, "wb", "outputs/f", b"x")
        k = Kernel(root, read_only=True)
        outputs = k.ino("wb/outputs")
        assert k.errno_of("create", outputs, b"new", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EROFS
        assert k.errno_of("open", k.ino("wb/outputs/f"), os.O_RDWR, k.ctx) == errno.EROFS
        assert k.errno_of("unlink", outputs, b"f", k.ctx) == errno.EROFS
        assert k.errno_of("mkdir", outputs, b"d", 0o755, k.ctx) == errno.EROFS
        assert k.cat("wb/outputs/f") == b"x"
    finally:
        root.close()


# --- names ----------------------------------------------------------------------------------------


def test_name_limits_are_refused_at_the_call(kernel):
    k = kernel
    outputs = k.ino("wb/outputs")
    long_name = b"n" * 256
    assert k.errno_of("lookup", outputs, long_name, k.ctx) == errno.ENAMETOOLONG
    assert k.errno_of("create", outputs, long_name, 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.ENAMETOOLONG
    assert k.errno_of("mkdir", outputs, long_name, 0o755, k.ctx) == errno.ENAMETOOLONG
    assert k.errno_of("create", outputs, b"back\\slash", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EINVAL
    assert k.errno_of("create", outputs, b"\xff\xfe", 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.EINVAL
    k.mkdir("wb/outputs/" + "d" * 200)
    deep = k.ino("wb/outputs/" + "d" * 200)
    k.mkdir("wb/outputs/" + "d" * 200 + "/" + "e" * 200)
    deeper = k.ino("wb/outputs/" + "d" * 200 + "/" + "e" * 200)
    assert k.errno_of("create", deeper, b"f" * 60, 0o644, os.O_WRONLY | os.O_CREAT, k.ctx) == errno.ENAMETOOLONG
    assert k.errno_of("mkdir", deep, b"g" * 250, 0o755, k.ctx) == errno.ENAMETOOLONG
    out = k.call("statfs", k.ctx)
    assert out.f_namemax == 255


def test_missing_and_wrong_kind(kernel):
    k = kernel
    outputs = k.ino("wb/outputs")
    assert k.call("lookup", outputs, b"missing", k.ctx).st_ino == 0
    assert k.errno_of("unlink", outputs, b"missing", k.ctx) == errno.ENOENT
    k.mkdir("wb/outputs/d")
    k.put("wb/outputs/f", b"x")
    assert k.errno_of("unlink", outputs, b"d", k.ctx) == errno.EISDIR
    assert k.errno_of("rmdir", outputs, b"f", k.ctx) == errno.ENOTDIR
    assert k.errno_of("open", k.ino("wb/outputs/d"), os.O_RDONLY, k.ctx) == errno.EISDIR
    assert k.errno_of("opendir", k.ino("wb/outputs/f"), k.ctx) == errno.ENOTDIR
    assert k.errno_of("lookup", k.ino("wb/outputs/f"), b"below", k.ctx) == errno.ENOTDIR
    assert k.errno_of("create", outputs, b"f", 0o644, os.O_WRONLY | os.O_CREAT | os.O_EXCL, k.ctx) == errno.EEXIST
    assert k.errno_of("mkdir", outputs, b"d", 0o755, k.ctx) == errno.EEXIST
    k.put("wb/outputs/d/inside", b"y")
    assert k.errno_of("rmdir", outputs, b"d", k.ctx) == errno.ENOTEMPTY


# --- rename ------------------------------------------------------------------------------------


def test_rename_rules(kernel, monkeypatch):
    from nokvfs.workspace import namespace

    k = kernel
    outputs = k.ino("wb/outputs")
    k.put("wb/outputs/a", b"A")
    k.put("wb/outputs/b", b"B")
    assert k.errno_of("rename", outputs, b"a", outputs, b"b", RENAME_NOREPLACE, k.ctx) == errno.EEXIST
    assert k.errno_of("rename", outputs, b"a", outputs, b"b", RENAME_EXCHANGE, k.ctx) == errno.EINVAL
    assert k.errno_of("rename", outputs, b"a", k.ino("other/outputs"), b"a", 0, k.ctx) == errno.EXDEV
    k.mkdir("wb/outputs/dir")
    k.put("wb/outputs/dir/f", b"F")
    k.put("wb/outputs/dir/g", b"G")
    monkeypatch.setattr(namespace, "MAX_DIRECTORY_RENAME", 1)
    assert k.errno_of("rename", outputs, b"dir", outputs, b"moved", 0, k.ctx) == errno.EXDEV  # too big: mv copies
    monkeypatch.undo()
    k.mkdir("wb/outputs/full")
    k.put("wb/outputs/full/x", b"X")
    assert k.errno_of("rename", outputs, b"dir", outputs, b"full", 0, k.ctx) == errno.ENOTEMPTY
    k.call("rename", outputs, b"dir", outputs, b"moved", 0, k.ctx)  # one command moves the subtree
    assert k.cat("wb/outputs/moved/f") == b"F" and k.cat("wb/outputs/moved/g") == b"G"
    k.call("rename", outputs, b"a", outputs, b"b", 0, k.ctx)
    assert k.cat("wb/outputs/b") == b"A"
    assert sorted(k.listdir("wb/outputs")) == ["b", "full", "moved"]


# --- writes: one spool per file, no conflict with itself -------------------------------------------


def test_create_close_then_append_and_truncate(kernel):
    """touch f; echo line >> f; truncate -s 10 f: the mount never conflicts with itself."""
    k = kernel
    fh = k.create("wb/outputs/lg")
    k.close(fh)  # touch: published when released
    fh = k.open("wb/outputs/lg", os.O_WRONLY | os.O_APPEND)
    k.write(fh, b"line1\n", 0)
    k.close(fh)
    k.setattr("wb/outputs/lg", size=10)
    assert k.cat("wb/outputs/lg") == b"line1\n\0\0\0\0"
    assert k.stat("wb/outputs/lg").st_size == 10


def test_two_descriptors_share_one_spool(kernel):
    k = kernel
    k.put("wb/outputs/shared", b"0" * 8)
    one = k.open("wb/outputs/shared", os.O_RDWR)
    two = k.open("wb/outputs/shared", os.O_RDWR)
    k.write(one, b"AA", 0)
    assert k.read(two) == b"AA000000"
    k.write(two, b"BB", 6)
    assert k.read(one) == b"AA0000BB"
    k.close(one)
    k.close(two)
    with k.fs.tree.root.read() as view:
        from nokvfs.workspace import listing, reading

        entry = listing.stat(view, k.fs.tree.root, "wb", "outputs/shared").entry
    assert reading.read(k.fs.tree.root, entry) == b"AA0000BB"


def test_a_change_from_outside_is_ebusy_at_close_and_eexist_for_a_creation(kernel):
    k = kernel
    root = k.fs.tree.root
    k.put("wb/outputs/c", b"v1")
    fh = k.open("wb/outputs/c", os.O_WRONLY | os.O_TRUNC)
    k.write(fh, b"mine")
    namespace.put(root, "wb", "outputs/c", b"theirs")
    assert k.errno_of("flush", fh) == errno.EBUSY
    k.call("release", fh)
    fh = k.create("wb/outputs/new")
    k.write(fh, b"mine")
    namespace.put(root, "wb", "outputs/new", b"theirs")
    assert k.errno_of("flush", fh) == errno.EEXIST
    k.call("release", fh)


def test_a_create_right_after_a_lookup_that_found_nothing_reads_the_shard_once_and_sees_later_commits(
    kernel, monkeypatch
):
    """The kernel sends CREATE after its own LOOKUP found nothing: the create does not read the
    shard again while nothing was committed since. A file another process published in between,
    or a directory this mount made, is still seen: EEXIST for O_EXCL, EISDIR, and an open of the
    existing file otherwise (its close then publishes over it, no EEXIST)."""
    k = kernel
    root = k.fs.tree.root
    outputs = k.ino("wb/outputs")
    stats = []
    stat = k.fs.tree.view.stat
    monkeypatch.setattr(k.fs.tree.view, "stat", lambda *a: stats.append(a[-1]) or stat(*a))
    excl = os.O_WRONLY | os.O_CREAT | os.O_EXCL

    assert k.call("lookup", outputs, b"a", k.ctx).st_ino == 0
    fh, _ = k.call("create", outputs, b"a", 0o644, excl, k.ctx)
    assert stats == [("outputs", "a")]  # the kernel's lookup alone read the shard
    k.write(fh.fh, b"a")
    k.close(fh.fh)
    assert k.cat("wb/outputs/a") == b"a"

    assert k.call("lookup", outputs, b"b", k.ctx).st_ino == 0
    namespace.put(root, "wb", "outputs/b", b"theirs")  # another process, between LOOKUP and CREATE
    assert k.errno_of("create", outputs, b"b", 0o644, excl, k.ctx) == errno.EEXIST
    fh, _ = k.call("create", outputs, b"b", 0o644, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, k.ctx)
    k.write(fh.fh, b"mine")
    k.close(fh.fh)
    assert k.cat("wb/outputs/b") == b"mine"

    assert k.call("lookup", outputs, b"d", k.ctx).st_ino == 0
    k.call("mkdir", outputs, b"d", 0o755, k.ctx)  # this mount, nothing committed for it yet
    assert k.errno_of("create", outputs, b"d", 0o644, excl, k.ctx) == errno.EISDIR


def test_an_open_after_this_mounts_own_commits_reads_the_shard_only_when_one_wrote_the_path(kernel, monkeypatch):
    """A file this mount published is opened (and stat'd) without a shard read while the commits
    since were this process's own and did not write its path (its own publication, others'
    after it), and read again after one that did (a put of the path in this process) or after
    any commit of another process, which is never taken for one of this process's."""
    k = kernel
    root = k.fs.tree.root
    reads = []
    entry = k.fs.tree.view.entry
    monkeypatch.setattr(k.fs.tree.view, "entry", lambda v, inc, comps: reads.append(comps[-1]) or entry(v, inc, comps))
    k.put("wb/outputs/mine", b"mine")
    ino = k.ino("wb/outputs/mine")
    k.put("wb/outputs/later", b"later")  # an own commit after it
    namespace.put(root, "wb", "outputs/also-own", b"x")  # this process too
    reads.clear()
    assert k.cat("wb/outputs/mine") == b"mine"
    k.call("getattr", ino, k.ctx)
    assert "mine" not in reads

    namespace.put(root, "wb", "outputs/mine", b"replaced here")  # an own commit of the path
    assert k.errno_of("open", ino, os.O_RDONLY, k.ctx) == errno.ESTALE
    assert k.cat("wb/outputs/mine") == b"replaced here"

    ino = k.ino("wb/outputs/mine")
    k.cat("wb/outputs/mine")
    reads.clear()
    code = (
        "import sys; from nokvfs.workspace import datadir, namespace; "
        "root = datadir.open_root(sys.argv[1], verify=False); "
        "namespace.put(root, 'wb', 'outputs/mine', b'theirs'); root.close()"
    )
    subprocess.run([sys.executable, "-c", code, root.data_dir], check=True, cwd=REPO, timeout=60)
    k.put("wb/outputs/after", b"own again")  # an own commit after theirs
    assert k.errno_of("open", ino, os.O_RDONLY, k.ctx) == errno.ESTALE
    assert "mine" in reads
    assert k.cat("wb/outputs/mine") == b"theirs"


def test_an_open_of_a_replaced_file_is_estale_so_the_kernel_looks_again(kernel):
    k = kernel
    k.put("wb/outputs/r", b"old")
    ino = k.ino("wb/outputs/r")
    namespace.put(k.fs.tree.root, "wb", "outputs/r", b"new")
    assert k.errno_of("open", ino, os.O_RDONLY, k.ctx) == errno.ESTALE
    assert k.ino("wb/outputs/r") != ino  # the retried lookup hands out the path's new inode
    assert k.cat("wb/outputs/r") == b"new"


def test_an_open_retried_after_estale_reads_what_its_own_lookup_showed(kernel):
    """open(2) racing two replacements in a row: the first open answers ESTALE, the kernel looks
    the path up again (LOOKUP_REVAL, once) and the path is replaced again before its second open.
    That lookup ran inside this open(2), so the open reads the revision it showed, as a local
    disk resolves the path once; an ESTALE here would reach the caller."""
    k = kernel
    root = k.fs.tree.root
    retrying, other = Ctx(), Ctx()
    retrying.pid, other.pid = 4242, 4343
    k.put("wb/outputs/r", b"v1")
    ino = k.ino("wb/outputs/r")
    namespace.put(root, "wb", "outputs/r", b"v2")
    assert k.errno_of("open", ino, os.O_RDONLY, retrying) == errno.ESTALE
    parent, name = k.split("wb/outputs/r")
    retried = k.call("lookup", parent, name, retrying).st_ino  # the kernel's LOOKUP_REVAL
    assert retried != ino
    namespace.put(root, "wb", "outputs/r", b"v3")
    # Another caller reaching that inode from the dentry cache gets no such grace: it must see v3.
    assert k.errno_of("open", retried, os.O_RDONLY, other) == errno.ESTALE
    fh = k.call("open", retried, os.O_RDONLY, retrying).fh
    try:
        assert k.read(fh) == b"v2"
    finally:
        k.close(fh)
    assert k.cat("wb/outputs/r") == b"v3"


def test_the_retry_grace_is_one_open_of_the_inode_its_lookup_handed_out(kernel):
    k = kernel
    root = k.fs.tree.root
    ctx = Ctx()
    ctx.pid = 4242
    k.put("wb/outputs/r", b"v1")
    ino = k.ino("wb/outputs/r")
    namespace.put(root, "wb", "outputs/r", b"v2")
    assert k.errno_of("open", ino, os.O_RDONLY, ctx) == errno.ESTALE
    parent, name = k.split("wb/outputs/r")
    retried = k.call("lookup", parent, name, ctx).st_ino
    namespace.put(root, "wb", "outputs/r", b"v3")
    # A writer is not served a revision the path no longer holds: its close could only conflict.
    assert k.errno_of("open", retried, os.O_WRONLY, ctx) == errno.ESTALE
    # The grace was used up by that open: the same caller's next open of the inode is refused.
    assert k.errno_of("open", retried, os.O_RDONLY, ctx) == errno.ESTALE
    # A lookup by a caller that was not retrying an open earns nothing either.
    fresh = k.call("lookup", parent, name, ctx).st_ino
    namespace.put(root, "wb", "outputs/r", b"v4")
    assert k.errno_of("open", fresh, os.O_RDONLY, Ctx()) == errno.ESTALE
    assert k.cat("wb/outputs/r") == b"v4"


def test_the_retry_grace_ends_at_a_lookup_that_finds_nothing_and_lapses_after_its_window():
    now = [100.0]
    retries = OpenRetries(clock=lambda: now[0])
    retries.refused(7)
    retries.looked_up(7, 11, "entry")
    assert retries.take(7, 11) == "entry"
    assert retries.take(7, 11) is None  # used up
    retries.refused(7)
    retries.looked_up(7, None)  # the retry's lookup found nothing: the open failed with ENOENT
    retries.looked_up(7, 11, "entry")  # a later lookup by the same task is another system call
    assert retries.take(7, 11) is None
    retries.refused(7)
    retries.looked_up(7, 11, "entry")
    now[0] += retries_module.WINDOW + 0.1  # the task never opened: its id may be another's now
    assert retries.take(7, 11) is None
    retries.refused(8)
    retries.looked_up(8, 12, "entry")
    assert retries.take(8, 13) is None  # another inode than its lookup handed out
    assert retries.take(None, 12) is None


def test_fsync_of_a_directory_with_sync_publishes_a_created_file_whose_release_has_not_come(kernel):
    """`touch f` (or `: > f`), then fsync(2) of its directory, on a `--sync` mount: an empty new
    (or emptied) file is published at RELEASE, which the kernel sends after close(2) returned, so it can come after the
    fsync. The fsync publishes it, and ships an LSN that holds it."""
    k = kernel
    root = k.fs.tree.root
    shipped = []
    k.fs.files.ship = lambda lsn, timeout: shipped.append(lsn)
    fh = k.create("wb/outputs/touched", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    k.call("flush", fh)  # close(2) returned; its RELEASE is still queued
    assert namespace_entry(root, "outputs/touched") is None
    k.put("wb/outputs/emptied", b"was here")
    emptied = k.open("wb/outputs/emptied", os.O_WRONLY | os.O_TRUNC)  # `: > emptied`
    k.call("flush", emptied)
    writing = k.create("wb/outputs/half-written")
    k.write(writing, b"half")  # another process is still writing this one: it is not published
    dh = k.call("opendir", k.ino("wb/outputs"), k.ctx)
    try:
        k.call("fsyncdir", dh, False)
    finally:
        k.call("releasedir", dh)
    assert namespace_entry(root, "outputs/touched") is not None
    assert namespace_entry(root, "outputs/emptied").logical_size == 0
    assert shipped and shipped[-1] >= root.shard.recovery_tail.applied_lsn
    k.call("release", fh)
    k.call("release", emptied)
    assert k.cat("wb/outputs/touched") == b""
    assert k.cat("wb/outputs/emptied") == b""
    assert namespace_entry(root, "outputs/half-written") is None
    k.write(writing, b" and done", offset=4)
    k.close(writing)
    assert k.cat("wb/outputs/half-written") == b"half and done"


def namespace_entry(root, path: str):
    from nokvfs.errors import NotFound
    from nokvfs.workspace import listing

    with root.read() as view:
        try:
            return listing.stat(view, root, "wb", path).entry
        except NotFound:
            return None


# --- attributes and links --------------------------------------------------------------------------


def test_chmod_chown_and_utime_are_stored_or_refused(kernel):
    k = kernel
    k.put("wb/outputs/f", b"x")
    k.setattr("wb/outputs/f", mode=stat.S_IFREG | 0o750)
    k.setattr("wb/outputs/f", uid=1234, gid=5678)
    k.setattr("wb/outputs/f", mtime_ns=1_000_000_000_123, atime_ns=2_000_000_000_456)
    st = k.stat("wb/outputs/f")
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, st.st_atime_ns) == (
        0o750,
        1234,
        5678,
        1_000_000_000_123,
        2_000_000_000_456,
    )
    assert (
        k.errno_of("setattr", ROOT_INODE, pyfuse3.EntryAttributes(), Fields(update_mode=True), None, k.ctx)
        == errno.EPERM
    )
    assert (
        k.errno_of("setattr", k.ino("wb"), pyfuse3.EntryAttributes(), Fields(update_mode=True), None, k.ctx)
        == errno.EPERM
    )


def test_extended_attributes_other_than_index_fields_are_not_stored(kernel):
    k = kernel
    k.put("wb/outputs/f", b"x")
    ino = k.ino("wb/outputs/f")
    assert k.errno_of("setxattr", ino, b"user.note", b"v", k.ctx) == errno.ENOTSUP
    assert k.errno_of("removexattr", ino, b"user.note", k.ctx) == errno.ENOTSUP
    assert k.errno_of("getxattr", ino, b"user.missing", k.ctx) == errno.ENODATA
    assert k.call("listxattr", ino, k.ctx) == []


def test_symlinks(kernel):
    k = kernel
    outputs = k.ino("wb/outputs")
    k.call("symlink", outputs, b"latest", b"v3.csv", k.ctx)
    assert k.call("readlink", k.ino("wb/outputs/latest"), k.ctx) == b"v3.csv"
    assert stat.S_ISLNK(k.stat("wb/outputs/latest").st_mode)
    assert k.errno_of("symlink", outputs, b"latest", b"other", k.ctx) == errno.EEXIST
    assert k.errno_of("symlink", outputs, b"long", b"t" * 4096, k.ctx) == errno.ENAMETOOLONG
    assert k.errno_of("readlink", outputs, k.ctx) == errno.EINVAL
    assert "latest" in k.listdir("wb/outputs")


def test_a_directory_stays_when_its_last_entry_goes(kernel):
    """mkdir d; cd d; mkdir e; chmod 700 e (stored); rmdir e: d is still there (the shell in it
    can go on creating files), as on a local disk."""
    k = kernel
    k.mkdir("wb/outputs/d")
    k.mkdir("wb/outputs/d/e")
    k.setattr("wb/outputs/d/e", mode=stat.S_IFDIR | 0o700)  # a marker: d and e are durable now
    d = k.ino("wb/outputs/d")
    k.call("rmdir", d, b"e", k.ctx)
    assert k.listdir("wb/outputs/d") == []
    k.put("wb/outputs/d/f", b"still here")
    k.call("unlink", d, b"f", k.ctx)
    k.call("rename", k.ino("wb/outputs"), b"d", k.ino("wb/outputs"), b"d2", 0, k.ctx)
    assert "d2" in k.listdir("wb/outputs")


def test_every_directory_outlives_the_mount_that_saw_it(kernel, tmp_path):
    """As on a local disk, a directory stays until rmdir: one made by mkdir and never written
    into, one emptied by unlink, by a rename out of it, by rmdir of its last subdirectory and by
    moving its last subdirectory away, including directories that only existed because a file
    was published below them (the CLI's put). A fresh mount over the same root (a remount, or
    another machine) shows every one of them. git leaves `.git/refs/heads` like this after gc."""
    k = kernel
    root = k.fs.tree.root
    k.mkdir("wb/outputs/made")
    k.mkdir("wb/outputs/made/inner")
    k.mkdir("wb/outputs/private", 0o700)
    for path in ("emptied/f", "renamed/f", "nested/sub/f", "moved/sub/f"):
        namespace.put(root, "wb", "outputs/" + path, b"x")  # directories implicit in the path
    k.call("unlink", k.ino("wb/outputs/emptied"), b"f", k.ctx)
    k.call("rename", k.ino("wb/outputs/renamed"), b"f", k.ino("wb/outputs"), b"f", 0, k.ctx)
    k.call("unlink", k.ino("wb/outputs/nested/sub"), b"f", k.ctx)
    k.call("rmdir", k.ino("wb/outputs/nested"), b"sub", k.ctx)
    k.call("rename", k.ino("wb/outputs/moved"), b"sub", k.ino("wb/outputs"), b"sub", 0, k.ctx)

    again = Kernel(root)  # a new mount: nothing of the first one's memory
    expected = ["emptied", "f", "made", "moved", "nested", "private", "renamed", "sub"]
    assert sorted(again.listdir("wb/outputs")) == expected
    for path in ("made", "made/inner", "emptied", "renamed", "nested", "moved", "private"):
        assert stat.S_ISDIR(again.stat("wb/outputs/" + path).st_mode), path
    assert again.listdir("wb/outputs/made") == ["inner"]
    assert again.listdir("wb/outputs/sub") == ["f"]
    for path in ("made/inner", "emptied", "renamed", "nested", "moved"):
        assert again.listdir("wb/outputs/" + path) == [], path
    assert stat.S_IMODE(again.stat("wb/outputs/private").st_mode) == 0o700
    assert stat.S_IMODE(again.stat("wb/outputs/made").st_mode) == 0o755
    # rmdir of the last of them still leaves its parent, and the section never goes
    again.call("rmdir", again.ino("wb/outputs/made"), b"inner", again.ctx)
    assert Kernel(root).listdir("wb/outputs/made") == []


def test_a_listing_hands_over_every_entry_once_while_created_files_get_published(kernel):
    """`find d -delete` / `shutil.rmtree(d)` right after a shell loop of `: > d/fN`: the files
    created here are pending (listed from the overlay) until their release publishes them, and a
    listing that pages while they are published must still return each exactly once -- a missed
    entry leaves rmdir with ENOTEMPTY."""
    k = kernel
    k.mkdir("wb/outputs/d")
    published = [f"f{i:02d}" for i in range(40)]
    for name in published:
        k.put(f"wb/outputs/d/{name}", b"x")
    early = k.create("wb/outputs/d/f05p")  # created, not yet published (listed before f06)
    late = k.create("wb/outputs/d/f35p")  # listed long after the first page
    k.mkdir("wb/outputs/d/f07sub")  # made by mkdir: the overlay's until a file is published below

    def publish_them():
        k.close(early)
        k.close(late)
        k.put("wb/outputs/d/f07sub/x", b"x")

    listed = k.listdir_in_batches("wb/outputs/d", 10, publish_them)
    assert sorted(listed) == sorted(published + ["f05p", "f35p", "f07sub"])
    assert len(listed) == len(set(listed))


def test_a_listing_starts_with_dot_and_dot_dot_and_pages_from_any_offset(kernel):
    """As on a local disk, readdir hands over "." (the directory) and ".." (its parent) first,
    at offsets 1 and 2; the kernel may restart the listing at any offset it was given."""
    k = kernel
    k.mkdir("wb/outputs/d")
    for name in ("a", "b", "c"):
        k.put(f"wb/outputs/d/{name}", b"x")
    fh = k.call("opendir", k.ino("wb/outputs/d"), k.ctx)
    original = pyfuse3.readdir_reply
    try:

        def listed(offset, batch=100):
            taken = []

            def reply(token, name, attr, next_id):
                if len(taken) == batch:
                    return False
                taken.append((name.decode(), attr.st_ino, next_id))
                return True

            pyfuse3.readdir_reply = reply
            k.call("readdir", fh, offset, None)
            return taken

        whole = listed(0)
        assert [(name, offset) for name, _, offset in whole] == [(".", 1), ("..", 2), ("a", 3), ("b", 4), ("c", 5)]
        assert whole[0][1] == k.ino("wb/outputs/d") and whole[1][1] == k.ino("wb/outputs")
        assert listed(1) == whole[1:] and listed(2) == whole[2:] and listed(4) == whole[4:]
        one_by_one, offset = [], 0
        while step := listed(offset, batch=1):
            one_by_one += step
            offset = step[-1][2]
        assert one_by_one == whole
    finally:
        pyfuse3.readdir_reply = original
        k.call("releasedir", fh)
    root_listing = []
    fh = k.call("opendir", ROOT_INODE, k.ctx)
    try:
        pyfuse3.readdir_reply = lambda token, name, attr, next_id: root_listing.append((name, attr.st_ino)) or True
        k.call("readdir", fh, 0, None)
    finally:
        pyfuse3.readdir_reply = original
        k.call("releasedir", fh)
    assert root_listing[:2] == [(b".", ROOT_INODE), (b"..", ROOT_INODE)]
    assert k.stat("").st_ino == ROOT_INODE  # listing the root's ".." did not drop the root


# --- a directory's link count ------------------------------------------------------------------------


def test_a_directory_link_count_follows_this_mounts_mkdir_rmdir_and_rename_as_a_fresh_count(kernel):
    """The count moves with this mount's own changes (the kernel stats the parent after each, and a
    rescan of a big directory is costly); whatever the sequence, it equals what a mount that never
    cached it counts, and what ext4 would show."""
    import random

    rng = random.Random(7)
    kernel.mkdir("/wb/outputs/d")
    kernel.put("/wb/outputs/d/file", b"x")
    made: set[str] = set()
    for step in range(120):
        kernel.stat("/wb/outputs/d")  # counted, then cached
        choice = rng.random()
        name = f"s{rng.randrange(12)}"
        if choice < 0.45 and name not in made:
            kernel.mkdir(f"/wb/outputs/d/{name}")
            made.add(name)
        elif choice < 0.7 and made:
            gone = rng.choice(sorted(made))
            kernel.call("rmdir", kernel.ino("/wb/outputs/d"), gone.encode(), kernel.ctx)
            made.discard(gone)
        elif made:
            old = rng.choice(sorted(made))
            new = f"s{rng.randrange(12)}"
            parent = kernel.ino("/wb/outputs/d")
            kernel.call("rename", parent, old.encode(), parent, new.encode(), 0, kernel.ctx)  # may replace
            made.discard(old)
            made.add(new)
        fresh = Kernel(kernel.fs.tree.root)
        assert kernel.stat("/wb/outputs/d").st_nlink == 2 + len(made) == fresh.stat("/wb/outputs/d").st_nlink, step
    assert kernel.stat("/wb/outputs").st_nlink == 3


def test_a_stat_of_the_parent_during_an_rmdir_or_a_move_leaves_no_stale_count(kernel):
    """A getattr of the parent while rmdir or rename awaits its command may count the change
    already (when an event of another process dropped the cached count meanwhile); the count is
    then taken again, never moved twice. (Directories this mount made are counted from its
    overlay until they go, so the race needs ones it only found stored.)"""
    kernel.mkdir("/wb/outputs/p")
    kernel.mkdir("/wb/outputs/q")
    for name in ("a", "b"):
        kernel.mkdir(f"/wb/outputs/p/{name}")
        kernel.put(f"/wb/outputs/p/{name}/file", b"x")  # published paths: the rename awaits a command
        kernel.call("unlink", kernel.ino(f"/wb/outputs/p/{name}"), b"file", kernel.ctx)  # leaves a marker
    kernel = Kernel(kernel.fs.tree.root)  # as after a remount: the directories are only stored ones
    p, q = kernel.ino("/wb/outputs/p"), kernel.ino("/wb/outputs/q")
    assert kernel.stat("/wb/outputs/p").st_nlink == 4
    node = kernel.fs.tree.node(p)

    async def racing(change):
        done = trio.Event()

        async def run():
            await change()
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.lowlevel.checkpoint()
            while not done.is_set():
                node.dir_subdirs = None  # as the change follower does on another process's event
                await kernel.ops.getattr(p, kernel.ctx)
                await trio.sleep(0.0005)

    trio.run(racing, lambda: kernel.ops.rmdir(p, b"a", kernel.ctx))
    assert kernel.stat("/wb/outputs/p").st_nlink == 3
    trio.run(racing, lambda: kernel.ops.rename(p, b"b", q, b"b", 0, kernel.ctx))
    assert (kernel.stat("/wb/outputs/p").st_nlink, kernel.stat("/wb/outputs/q").st_nlink) == (2, 3)


def test_a_directorys_lookup_and_the_listings_after_it_read_each_page_once_until_a_commit(kernel):
    """The scan a directory's attributes need (its time, its link count) and the listing that
    follows share the engine pages they read, and listings repeat none while nothing commits."""
    root = kernel.fs.tree.root
    names = [f"f{i:03d}" for i in range(300)]  # two engine pages
    for name in names:
        namespace.put(root, "wb", "outputs/big/" + name, b"x")
    view = kernel.fs.tree.view
    pages = []
    original = view.children

    def counted(v, workbench, components, **kwargs):
        if components == ("outputs", "big"):
            pages.append(kwargs["start_after"])
        return original(v, workbench, components, **kwargs)

    view.children = counted
    assert kernel.stat("wb/outputs/big").st_nlink == 2  # the scan: both pages
    assert len(pages) == 2
    assert kernel.listdir("wb/outputs/big") == names
    assert kernel.listdir_in_batches("wb/outputs/big", 7, None) == names
    assert len(pages) == 2  # the two listings read nothing

    namespace.put(root, "wb", "outputs/big/f150a", b"new")  # any commit: everything read again
    assert kernel.listdir("wb/outputs/big") == sorted(names + ["f150a"])
    assert len(pages) == 4
    assert kernel.stat("wb/outputs/big/f150a").st_size == 3
