#!/usr/bin/env python3
"""Benchmark the nokvfs mount against pyfuse3's passthrough example: prints figures, asserts
nothing about time.

    python3 scripts/bench_mount.py [--files 2000] [--dirs 20] [--file-size 4096] [--seq-mib 256]
                                   [--tar-files 4000] [--big-dir 20000] [--modes durable,write-back]
                                   [--s3] [--s3-seq-mib 64] [--workdir DIR] [--keep]

The same work runs on every target in one run, phase by phase (targets interleaved, so a busy
machine weighs on all of them alike):

    local         a plain directory on the local disk (for scale)
    passthrough   pyfuse3's examples/passthroughfs.py (below, the same operations: writeback
                  cache on, inode = the source's inode; rename, symlink and link for the tools
                  of scripts/bench_tools.py) over a local directory: the reference
    nokvfs        `python3 -m nokvfs.cli.main mount DATA MNT --foreground`, durable at close (default)
    nokvfs-wb     the same with `--write-back` (close returns once the bytes are durable locally)
    nokvfs-nx, nokvfs-wb-nx   with --modes no-xattrs / write-back-no-xattrs: the same two with
                  `--no-xattrs` (the kernel answers every xattr call itself)
    nokvfs-s3, nokvfs-s3-wb   with --s3: the same two over a loopback moto S3 server this script
                  starts itself (127.0.0.1 only)

Phases, in order: create+write+close of N small files in D directories, and on the local
directory and the passthrough the same made durable by hand (write, fsync, the directory's fsync:
what the nokvfs default guarantees at close, as a second reference); for write-back targets
the wait until every accepted file is published (an fsync(2) of the last one: publication is in
order), measured right after the target's own phase so that its publisher never runs beside
another target's phase (and before every measurement, untimed, a sync(2): no target pays for the
writes of the one before it); first read of the files just written (open+read+close each); stat of all; `ls -lR`;
`tar x` of a tree of T small files (a tar made locally first), with its publication wait; a
sequential write of S MiB (close included), and on the references the same made durable by hand
(fsync of the file and of its directory); a warm sequential read of it; every FUSE target
unmounted and mounted again (write-back targets drain at unmount); a sequential read after the
remount (page cache of the mount gone, the host's kept), the same with the host's caches dropped
(root only); the listing of a directory of M entries populated beside the mount.

Every figure is printed as a rate and as a ratio to the passthrough's in the same run (above 1:
faster). The nokvfs daemons' resident memory is printed after every phase and at the end.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


# --- the minimal passthrough baseline ---------------------------------------------------------


def passthrough_operations():
    import stat as stat_m
    from collections import defaultdict

    import pyfuse3
    from pyfuse3 import FUSEError

    class Passthrough(pyfuse3.Operations):
        enable_writeback_cache = True

        def __init__(self, source):
            super().__init__()
            self.paths = {pyfuse3.ROOT_INODE: source}
            self.lookups = defaultdict(int)
            self.dirs = {}
            self.next_dir = 1

        def _path(self, inode):
            try:
                return self.paths[inode]
            except KeyError:
                raise FUSEError(errno.ENOENT) from None

        def _attr(self, path=None, fd=None):
            try:
                st = os.lstat(path) if fd is None else os.fstat(fd)
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            attr = pyfuse3.EntryAttributes()
            for name in (
                "st_ino",
                "st_mode",
                "st_nlink",
                "st_uid",
                "st_gid",
                "st_rdev",
                "st_size",
                "st_atime_ns",
                "st_mtime_ns",
                "st_ctime_ns",
            ):
                setattr(attr, name, getattr(st, name))
            attr.generation = 0
            attr.entry_timeout = 0
            attr.attr_timeout = 0
            attr.st_blksize = 512
            attr.st_blocks = (attr.st_size + 511) // 512
            return attr

        def _remember(self, inode, path):
            self.lookups[inode] += 1
            self.paths[inode] = path

        async def lookup(self, parent, name, ctx=None):
            path = os.path.join(self._path(parent), os.fsdecode(name))
            attr = self._attr(path)
            if name not in (b".", b".."):
                self._remember(attr.st_ino, path)
            return attr

        async def forget(self, inode_list):
            for inode, count in inode_list:
                self.lookups[inode] -= count
                if self.lookups[inode] <= 0:
                    self.lookups.pop(inode, None)
                    if inode != pyfuse3.ROOT_INODE:
                        self.paths.pop(inode, None)

        async def getattr(self, inode, ctx=None):
            return self._attr(self._path(inode))

        async def setattr(self, inode, attr, fields, fh, ctx):
            path = self._path(inode)
            try:
                if fields.update_size:
                    os.truncate(path, attr.st_size) if fh is None else os.ftruncate(fh, attr.st_size)
                if fields.update_mode:
                    os.chmod(path, stat_m.S_IMODE(attr.st_mode))
                if fields.update_atime or fields.update_mtime:
                    old = os.lstat(path)
                    os.utime(
                        path,
                        ns=(
                            attr.st_atime_ns if fields.update_atime else old.st_atime_ns,
                            attr.st_mtime_ns if fields.update_mtime else old.st_mtime_ns,
                        ),
                    )
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            return self._attr(path)

        async def opendir(self, inode, ctx):
            path = self._path(inode)
            try:
                names = sorted(e.name for e in os.scandir(path))
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            handle = self.next_dir
            self.next_dir += 1
            self.dirs[handle] = (path, names)
            return handle

        async def readdir(self, handle, offset, token):
            path, names = self.dirs[handle]
            for index in range(offset, len(names)):
                child = os.path.join(path, names[index])
                try:
                    attr = self._attr(child)
                except FUSEError:
                    continue
                if not pyfuse3.readdir_reply(token, os.fsencode(names[index]), attr, index + 1):
                    break
                self._remember(attr.st_ino, child)

        async def releasedir(self, handle):
            self.dirs.pop(handle, None)

        def _made(self, parent, name, make):
            """make(path) of a new entry `name` in `parent`, remembered: its attributes."""
            path = os.path.join(self._path(parent), os.fsdecode(name))
            try:
                make(path)
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            attr = self._attr(path)
            self._remember(attr.st_ino, path)
            return attr

        async def mkdir(self, parent, name, mode, ctx):
            return self._made(parent, name, lambda path: os.mkdir(path, mode & ~ctx.umask))

        async def unlink(self, parent, name, ctx):
            try:
                os.unlink(os.path.join(self._path(parent), os.fsdecode(name)))
            except OSError as exc:
                raise FUSEError(exc.errno) from None

        async def rmdir(self, parent, name, ctx):
            try:
                os.rmdir(os.path.join(self._path(parent), os.fsdecode(name)))
            except OSError as exc:
                raise FUSEError(exc.errno) from None

        async def rename(self, parent_old, name_old, parent_new, name_new, flags, ctx):
            if flags:
                raise FUSEError(errno.EINVAL)
            old = os.path.join(self._path(parent_old), os.fsdecode(name_old))
            new = os.path.join(self._path(parent_new), os.fsdecode(name_new))
            try:
                os.rename(old, new)
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            below = old + os.sep
            for inode, path in list(self.paths.items()):
                if path == old or path.startswith(below):
                    self.paths[inode] = new + path[len(old) :]

        async def symlink(self, parent, name, target, ctx):
            return self._made(parent, name, lambda path: os.symlink(os.fsdecode(target), path))

        async def readlink(self, inode, ctx):
            try:
                return os.fsencode(os.readlink(self._path(inode)))
            except OSError as exc:
                raise FUSEError(exc.errno) from None

        async def link(self, inode, new_parent, new_name, ctx):
            return self._made(new_parent, new_name, lambda path: os.link(self._path(inode), path))

        async def statfs(self, ctx):
            st = os.statvfs(self.paths[pyfuse3.ROOT_INODE])
            out = pyfuse3.StatvfsData()
            for name in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            ):
                setattr(out, name, getattr(st, name))
            return out

        async def open(self, inode, flags, ctx):
            try:
                return pyfuse3.FileInfo(fh=os.open(self._path(inode), flags & ~os.O_CREAT))
            except OSError as exc:
                raise FUSEError(exc.errno) from None

        async def create(self, parent, name, mode, flags, ctx):
            path = os.path.join(self._path(parent), os.fsdecode(name))
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_TRUNC, mode)
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            attr = self._attr(fd=fd)
            self._remember(attr.st_ino, path)
            return pyfuse3.FileInfo(fh=fd), attr

        async def read(self, fd, offset, size):
            return os.pread(fd, size, offset)

        async def write(self, fd, offset, buf):
            return os.pwrite(fd, buf, offset)

        async def release(self, fd):
            os.close(fd)

        # fsync(2) and a directory's fsync(2) reach the source (the durable reference phase).
        async def fsync(self, fd, datasync):
            try:
                (os.fdatasync if datasync else os.fsync)(fd)
            except OSError as exc:
                raise FUSEError(exc.errno) from None

        async def fsyncdir(self, handle, datasync):
            path, _ = self.dirs[handle]
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            finally:
                os.close(fd)

    return Passthrough


def serve_passthrough(source: str, mountpoint: str) -> None:
    import pyfuse3
    import trio

    operations = passthrough_operations()(source)
    options = set(pyfuse3.default_options)
    options.add("fsname=passthrough")
    pyfuse3.init(operations, mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    except BaseException:
        pyfuse3.close(unmount=True)
        raise
    pyfuse3.close()


# --- the harness ------------------------------------------------------------------------------

MiB = 1 << 20


def unmount(mountpoint: str) -> None:
    for argv in (
        ["fusermount3", "-u", mountpoint],
        ["fusermount3", "-u", "-z", mountpoint],
        ["umount", "-l", mountpoint],
    ):
        if not os.path.ismount(mountpoint):
            return
        subprocess.run(argv, capture_output=True)


def wait_mounted(mountpoint: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            try:
                os.statvfs(mountpoint)
                return
            except OSError:
                pass
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited before mounting")
        time.sleep(0.02)
    raise SystemExit(f"{what} did not mount")


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Target:
    """One place the phases run: a directory, and for a mount the daemon serving it."""

    def __init__(self, name: str, base: str, *, argv=None, mountpoint=None, env=None, log=None, publishes_later=False):
        self.name = name
        self.base = base  # where the phases work
        self.argv = argv  # the daemon's command line (None: a plain directory)
        self.mountpoint = mountpoint
        self.env = env
        self.log = log
        self.publishes_later = publishes_later
        self.proc = None
        self.peak_rss_kib = 0

    @property
    def nokvfs(self) -> bool:
        return self.name.startswith("nokvfs")

    def start(self) -> None:
        if self.argv is None:
            return
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=self.log, env=self.env, cwd=REPO)
        wait_mounted(self.mountpoint, self.proc, self.name)

    def stop(self) -> None:
        """Unmount and wait for the daemon to exit (a write-back daemon drains first)."""
        if self.proc is None:
            return
        self.rss()
        unmount(self.mountpoint)
        try:
            self.proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def rss(self) -> int:
        kib = rss_kib(self.proc.pid) if self.proc is not None else 0
        self.peak_rss_kib = max(self.peak_rss_kib, kib)
        return kib


def nokvfs_target(name: str, data: str, mnt: str, mode: str, env: dict, log) -> Target:
    """A nokvfs daemon mounting `data` (workbench "bench") at `mnt` in `mode` (MODES); the phases
    work in its outputs section."""
    argv = [sys.executable, "-m", "nokvfs.cli.main", "mount", data, mnt, "--foreground", *MODES[mode][1]]
    return Target(
        name,
        os.path.join(mnt, "bench", "outputs"),
        argv=argv,
        mountpoint=mnt,
        env=env,
        log=log,
        publishes_later="--write-back" in MODES[mode][1],
    )


# mode: (target name suffix, mount options)
MODES = {
    "durable": ("", ()),
    "write-back": ("-wb", ("--write-back",)),
    "no-xattrs": ("-nx", ("--no-xattrs",)),
    "write-back-no-xattrs": ("-wb-nx", ("--write-back", "--no-xattrs")),
}


def small_paths(base: str, count: int, dirs: int) -> list[str]:
    return [os.path.join(base, "small", f"d{i % dirs:02d}", f"file{i:05d}") for i in range(count)]


def make_tree_tar(path: str, count: int) -> int:
    """A tar of `count` small files (sizes 0..16 KiB) in nested directories, like a source tree."""
    import random
    import tarfile

    rng = random.Random(7)
    total = 0
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            size = rng.choice((0, 100, 700, 1500, 4096, 9000, 16384))
            info = tarfile.TarInfo(f"tree/m{i % 7}/p{i % 41:02d}/f{i:05d}.txt")
            info.size = size
            info.mode = 0o644
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(rng.randbytes(size)))
            total += size
    return total


def start_moto():
    """A loopback moto S3 server (serialised like the tests' one) and its endpoint URL."""
    from tests.s3_fixtures import start_loopback_moto

    return start_loopback_moto()


def _load() -> str:
    # The machine may be shared: the figures mean little if something else ran meanwhile.
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--dirs", type=int, default=20)
    parser.add_argument("--file-size", type=int, default=4096)
    parser.add_argument("--seq-mib", type=int, default=256)
    parser.add_argument("--tar-files", type=int, default=4000)
    parser.add_argument("--big-dir", type=int, default=20_000)
    parser.add_argument(
        "--modes",
        default="durable,write-back",
        help="nokvfs modes to run, comma-separated: durable, write-back, no-xattrs, write-back-no-xattrs (mount "
        "options --write-back and --no-xattrs; default: durable,write-back)",
    )
    parser.add_argument("--s3", action="store_true", help="also run nokvfs over a loopback moto S3 server")
    parser.add_argument(
        "--s3-seq-mib", type=int, default=64, help="sequential size on S3 targets (moto holds objects in memory)"
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--serve-passthrough", nargs=2, metavar=("SOURCE", "MOUNTPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_passthrough:
        serve_passthrough(*args.serve_passthrough)
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: unknown mode(s) {', '.join(unknown) or '(none given)'}; use {', '.join(MODES)}")

    work = args.workdir or tempfile.mkdtemp(
        prefix="nokvfs-bench-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None
    )
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NOTIFY_SOCKET", None)
    targets: list[Target] = []
    moto = None
    log = open(os.path.join(work, "daemons.log"), "ab")
    try:
        print(f"work directory {work}; {_load()}", flush=True)
        from nokvfs.workspace import datadir, workbench
        from tests.mount_fixtures import populate_many

        local = os.path.join(work, "local")
        pt_source, pt_mount = os.path.join(work, "pt-source"), os.path.join(work, "pt-mount")
        for path in (local, pt_source, pt_mount):
            os.makedirs(path, exist_ok=True)
        targets.append(Target("local", local))
        targets.append(
            Target(
                "passthrough",
                pt_mount,
                argv=[sys.executable, os.path.abspath(__file__), "--serve-passthrough", pt_source, pt_mount],
                mountpoint=pt_mount,
                env=env,
                log=log,
            )
        )
        stores = [("nokvfs", None, None)]
        if args.s3:
            moto, endpoint = start_moto()
            import boto3

            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="nokvfs-bench")
            env.update(
                {
                    k: os.environ[k]
                    for k in (
                        "AWS_ACCESS_KEY_ID",
                        "AWS_SECRET_ACCESS_KEY",
                        "AWS_DEFAULT_REGION",
                        "AWS_CONFIG_FILE",
                        "AWS_SHARED_CREDENTIALS_FILE",
                        "AWS_EC2_METADATA_DISABLED",
                        "NO_PROXY",
                    )
                }
            )
            stores.append(("nokvfs-s3", "s3://nokvfs-bench/{name}", endpoint))
        for prefix, store, endpoint in stores:
            for mode in modes:
                name = prefix + MODES[mode][0]
                data, mnt = os.path.join(work, name + "-data"), os.path.join(work, name + "-mnt")
                os.makedirs(mnt, exist_ok=True)
                datadir.init(data, store=None if store is None else store.format(name=name), endpoint_url=endpoint)
                root = datadir.open_root(data, verify=False)
                try:
                    workbench.create(root, "bench")
                    if args.big_dir:
                        started = time.perf_counter()
                        populate_many(root, "bench", "outputs/big", args.big_dir)
                        print(
                            f"  {name}: {args.big_dir} paths through the facade in {time.perf_counter() - started:.1f} "
                            "s",
                            flush=True,
                        )
                finally:
                    if root.blocks.cache is not None:
                        root.blocks.cache.close()
                    root.close()
                targets.append(nokvfs_target(name, data, mnt, mode, env, log))
        for base in (local, pt_source):
            os.makedirs(os.path.join(base, "big"))
            for i in range(args.big_dir):
                os.close(os.open(os.path.join(base, "big", f"f{i:06d}"), os.O_WRONLY | os.O_CREAT, 0o644))
        tar_path = os.path.join(work, "tree.tar")
        if args.tar_files:
            make_tree_tar(tar_path, args.tar_files)

        for target in targets:
            target.start()
            for d in range(args.dirs):
                os.makedirs(os.path.join(target.base, "small", f"d{d:02d}"), exist_ok=True)

        payload = os.urandom(args.file_size)
        chunk = os.urandom(MiB)

        def numbered(data: bytes, index: int) -> bytes:
            # Each file and each MiB its own bytes (its index in the first 8): equal blocks would
            # be one entry of a content-addressed block cache, which every later read would hit.
            return index.to_bytes(8, "big")[: len(data)] + data[8:]

        def mebibyte(index: int) -> bytes:
            return numbered(chunk, index)

        def seq_mib(target):
            return args.s3_seq_mib if "-s3" in target.name else args.seq_mib

        def create_all(target):
            for index, path in enumerate(small_paths(target.base, args.files, args.dirs)):
                with open(path, "wb") as f:
                    f.write(numbered(payload, index))

        def create_durably(target):
            # The default mode's guarantee by hand: the file's bytes and its directory entry on
            # disk before the next file (as a careful tool without nokvfs would do it).
            for index, path in enumerate(small_paths(os.path.join(target.base, "durable"), args.files, args.dirs)):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, numbered(payload, index))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)

        def published(target, path):
            # fsync(2) waits for the file's publication; publication is in order, so for the
            # last file written it waits for everything accepted before it.
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        def drain_small(target):
            published(target, small_paths(target.base, args.files, args.dirs)[-1])

        def cat_all(target):
            for path in small_paths(target.base, args.files, args.dirs):
                with open(path, "rb") as f:
                    if len(f.read()) != args.file_size:
                        raise SystemExit(f"short read of {path}")

        def stat_all(target):
            for path in small_paths(target.base, args.files, args.dirs):
                os.stat(path)

        def xattrs_of_ls(target):
            # The two getxattr(2) calls `ls -l` makes per file (the kernel caches no answer).
            for path in small_paths(target.base, args.files, args.dirs):
                for name in ("security.selinux", "system.posix_acl_access"):
                    try:
                        os.getxattr(path, name, follow_symlinks=False)
                    except OSError:
                        pass

        def ls_lr(target):
            subprocess.run(["ls", "-lR", os.path.join(target.base, "small")], stdout=subprocess.DEVNULL, check=True)

        def tar_x(target):
            os.makedirs(os.path.join(target.base, "untar"), exist_ok=True)
            subprocess.run(["tar", "xf", tar_path, "-C", os.path.join(target.base, "untar")], check=True)

        last_tar_file = None
        if args.tar_files:
            i = args.tar_files - 1
            last_tar_file = os.path.join("untar", "tree", f"m{i % 7}", f"p{i % 41:02d}", f"f{i:05d}.txt")

        def drain_tar(target):
            published(target, os.path.join(target.base, last_tar_file))

        def seq_write(target):
            with open(os.path.join(target.base, "seq.bin"), "wb") as f:
                for index in range(seq_mib(target)):
                    f.write(mebibyte(index))

        def seq_write_durably(target):
            # What the default mode promises at close(2), by hand: the bytes on disk (one fsync at
            # the end, as `dd conv=fsync` does) and the new file's directory entry.
            path = os.path.join(target.base, "seq-durable.bin")
            with open(path, "wb") as f:
                for index in range(seq_mib(target)):
                    f.write(mebibyte(index))
                f.flush()
                os.fsync(f.fileno())
            directory = os.open(target.base, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
            os.unlink(path)

        def drain_seq(target):
            published(target, os.path.join(target.base, "seq.bin"))

        def seq_read(target):
            total = 0
            with open(os.path.join(target.base, "seq.bin"), "rb", buffering=0) as f:
                while True:
                    data_ = f.read(MiB)
                    if not data_:
                        break
                    total += len(data_)
            if total != seq_mib(target) * MiB:
                raise SystemExit(f"read {total} bytes of seq.bin on {target.name}")

        def remount(target):
            target.stop()
            target.start()

        def list_big(target):
            count = sum(1 for _ in os.scandir(os.path.join(target.base, "big")))
            if count != args.big_dir:
                raise SystemExit(f"listed {count} entries in {target.base}/big")

        # (phase, function, unit, amount(target) or None for seconds, which targets)
        def files_phase(t):
            return args.files

        phases = [
            (f"create+write+close {args.files}", create_all, "files/s", files_phase, None),
            ("  same, fsync + directory fsync", create_durably, "files/s", files_phase, "references"),
            ("  write-back: published", drain_small, "s", None, "later"),
            (f"first read of the {args.files}", cat_all, "files/s", files_phase, None),
            (f"stat {args.files}", stat_all, "files/s", files_phase, None),
            (f"getxattr x2 of the {args.files} (as ls -l)", xattrs_of_ls, "files/s", files_phase, None),
            ("ls -lR", ls_lr, "s", None, None),
        ]
        if args.tar_files:
            phases += [
                (f"tar x {args.tar_files} files", tar_x, "s", None, None),
                ("  write-back: published", drain_tar, "s", None, "later"),
            ]
        phases += [
            ("sequential write", seq_write, "MB/s", seq_mib, None),
            ("  same, fsync + directory fsync", seq_write_durably, "MB/s", seq_mib, "references"),
            ("  write-back: published", drain_seq, "s", None, "later"),
            ("sequential read, warm", seq_read, "MB/s", seq_mib, None),
            ("unmount + mount", remount, "s", None, "mounts"),
            ("sequential read after remount", seq_read, "MB/s", seq_mib, None),
            ("sequential read, caches dropped", seq_read, "MB/s", seq_mib, "drop"),
        ]
        if args.big_dir:
            phases.append((f"list {args.big_dir} entries", list_big, "s", None, None))

        results: dict[tuple[int, str], float] = {}
        rss_after: dict[str, list] = {t.name: [] for t in targets if t.nokvfs}
        dropped = None

        def measure(index: int, target) -> None:
            # Untimed: what the targets before this one left dirty goes to disk first. On ext4
            # (data=ordered) a journal commit writes every dirty block allocated in it, so the
            # first fsync of a target otherwise pays for the files the previous one wrote.
            os.sync()
            started = time.perf_counter()
            phases[index][1](target)
            elapsed = time.perf_counter() - started
            results[(index, target.name)] = elapsed
            extra = ""
            if target.nokvfs:
                kib = target.rss()
                rss_after[target.name].append(kib)
                extra = f"   RSS {kib / 1024:.0f} MiB"
            print(f"  {phases[index][0]:<34} {target.name:<14} {elapsed:8.3f} s{extra}", flush=True)

        def publication_wait(index: int) -> int | None:
            """The "later" phase that follows phase `index` (past its references), if any."""
            for later in range(index + 1, len(phases)):
                if phases[later][4] == "later":
                    return later
                if phases[later][4] != "references":
                    return None
            return None

        for index, (_phase, _fn, _unit, _amount, which) in enumerate(phases):
            if which == "later":
                continue  # measured right after the phase it drains, below
            wait = publication_wait(index)
            for target in targets:
                if which == "mounts" and target.argv is None:
                    continue
                if which == "references" and target.nokvfs:
                    continue
                if which == "drop":
                    dropped = drop_caches()
                measure(index, target)
                if wait is not None and target.publishes_later:
                    # Before the next target starts: a write-back publisher still busy with this
                    # target's files would otherwise run beside (and slow) the next target's phase.
                    measure(wait, target)

        names = [t.name for t in targets]
        print(f"phases done; {_load()}")
        print()
        print("rates (ratio to passthrough in this run; above 1 is faster)")
        print(f"{'phase':<34}" + "".join(f"{n:>22}" for n in names))
        for index, (phase, _fn, unit, amount, _which) in enumerate(phases):
            row = f"{phase:<34}"
            reference = results.get((index, "passthrough"))
            for target in targets:
                elapsed = results.get((index, target.name))
                if elapsed is None:
                    row += f"{'':>22}"
                    continue
                if unit == "s":
                    text = f"{elapsed:.3f} s"
                    ratio = reference / elapsed if reference and elapsed else None
                else:
                    rate = amount(target) / elapsed if elapsed else float("inf")
                    text = f"{rate:,.0f} {unit}"
                    ratio = None
                    if reference:
                        pt = next(t for t in targets if t.name == "passthrough")
                        ratio = (amount(target) / elapsed) / (amount(pt) / reference)
                cell = text + (f" {ratio:5.2f}x" if ratio is not None and target.name != "passthrough" else "")
                row += f"{cell:>22}"
            print(row)
        for plain, durably, what in (
            (create_all, create_durably, "create+write+close"),
            (seq_write, seq_write_durably, "sequential write"),
        ):
            index = next(i for i, (_p, fn, *_rest) in enumerate(phases) if fn is plain)
            by_hand = next(i for i, (_p, fn, *_rest) in enumerate(phases) if fn is durably)
            reference = results.get((by_hand, "passthrough"))
            if not reference:
                continue
            pt = next(t for t in targets if t.name == "passthrough")
            amount = phases[index][3]
            rate = amount(pt) / reference
            unit = phases[index][2]
            cells = [
                f"{t.name} {amount(t) / results[(index, t.name)] / rate:.2f}x"
                for t in targets
                if t.nokvfs and (index, t.name) in results
            ]
            print(
                f"{what} against the passthrough made durable by hand ({rate:,.0f} {unit}; "
                f"{rate / (amount(pt) / results[(index, 'passthrough')]):.2f}x the plain passthrough): "
                + ", ".join(cells)
            )
        if dropped is False:
            print("(not root: the page cache was not dropped before the cold read)")
        print()
        for target in targets:
            if target.nokvfs:
                now = target.rss()
                print(
                    f"{target.name} daemon RSS: end {now / 1024:.0f} MiB, peak seen {target.peak_rss_kib / 1024:.0f} "
                    "MiB "
                    f"(after each phase: {', '.join(f'{k / 1024:.0f}' for k in rss_after[target.name])} MiB)"
                )
        return 0
    finally:
        for target in reversed(targets):
            try:
                target.stop()
            except Exception as exc:  # noqa: BLE001 - keep unmounting the others
                print(f"stopping {target.name}: {exc}", file=sys.stderr)
        left = [t.mountpoint for t in targets if t.mountpoint and os.path.ismount(t.mountpoint)]
        if left:
            print(f"still mounted: {left}", file=sys.stderr)
        if moto is not None:
            moto.stop()
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
