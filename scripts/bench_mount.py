#!/usr/bin/env python3
"""Benchmark the nokvfs mount against a plain local directory and a minimal pyfuse3 passthrough.

    python3 scripts/bench_mount.py [--files 2000] [--file-size 4096] [--seq-mib 256]
                                   [--big-dir 100000] [--workdir DIR] [--keep]

The same work runs on three targets in one run:

    local        a plain directory on the local disk
    passthrough  a minimal pyfuse3 passthrough (below, after pyfuse3's examples/passthroughfs.py:
                 writeback cache on, inode = the source's inode) mounted over a local directory;
                 the baseline the targets refer to
    nokvfs       `python3 -m nokvfs.cli.main mount DATA MNT --foreground`, working in bench/outputs/

Phases: create+write+close of N small files (in 10 directories), stat of all, `ls -lR`, cat of all
(open+read+close each), a sequential write of S MiB (close included: for nokvfs that is the
publication) and a sequential read of it (page cache dropped first, when running as root), and the
listing of one directory of M entries, populated beside the mount: on the local disk for local and
passthrough, through the facade in batched commands for nokvfs (not through the mount).

Targets: metadata phases within 3x of the passthrough; sequential read at least 60% of its
throughput. The script prints its figures, unmounts everything it mounted and exits.
"""

from __future__ import annotations

import argparse
import errno
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
            for name in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
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
                    os.utime(path, ns=(attr.st_atime_ns if fields.update_atime else old.st_atime_ns, attr.st_mtime_ns if fields.update_mtime else old.st_mtime_ns))
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

        async def mkdir(self, parent, name, mode, ctx):
            path = os.path.join(self._path(parent), os.fsdecode(name))
            try:
                os.mkdir(path, mode & ~ctx.umask)
            except OSError as exc:
                raise FUSEError(exc.errno) from None
            attr = self._attr(path)
            self._remember(attr.st_ino, path)
            return attr

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

        async def statfs(self, ctx):
            st = os.statvfs(self.paths[pyfuse3.ROOT_INODE])
            out = pyfuse3.StatvfsData()
            for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_namemax"):
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


def unmount(mountpoint: str) -> None:
    for argv in (["fusermount3", "-u", mountpoint], ["fusermount3", "-u", "-z", mountpoint], ["umount", "-l", mountpoint]):
        if not os.path.ismount(mountpoint):
            return
        subprocess.run(argv, capture_output=True)


def wait_mounted(mountpoint: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
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
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Timer:
    def __init__(self):
        self.results: dict[tuple[str, str], float] = {}

    def run(self, phase: str, target: str, fn, *args):
        start = time.perf_counter()
        fn(*args)
        elapsed = time.perf_counter() - start
        self.results[(phase, target)] = elapsed
        print(f"  {phase:<28} {target:<12} {elapsed:8.3f} s", flush=True)
        return elapsed


def small_paths(base: str, count: int) -> list[str]:
    return [os.path.join(base, "small", f"d{i % 10}", f"file{i:05d}") for i in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--file-size", type=int, default=4096)
    parser.add_argument("--seq-mib", type=int, default=256)
    parser.add_argument("--big-dir", type=int, default=100_000)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--serve-passthrough", nargs=2, metavar=("SOURCE", "MOUNTPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_passthrough:
        serve_passthrough(*args.serve_passthrough)
        return 0

    work = args.workdir or tempfile.mkdtemp(prefix="nokvfs-bench-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.makedirs(work, exist_ok=True)
    local = os.path.join(work, "local")
    pt_source, pt_mount = os.path.join(work, "pt-source"), os.path.join(work, "pt-mount")
    data, nk_mount = os.path.join(work, "nk-data"), os.path.join(work, "nk-mount")
    for path in (local, pt_source, pt_mount, nk_mount):
        os.makedirs(path, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NOTIFY_SOCKET", None)
    procs = []
    timer = Timer()
    try:
        print(f"work directory {work}")
        print(f"populating the {args.big_dir}-entry directories beside the mounts ...", flush=True)
        from nokvfs.workspace import datadir, workbench
        from tests.mount_fixtures import populate_many

        datadir.init(data)
        root = datadir.open_root(data, verify=False)
        try:
            workbench.create(root, "bench")
            started = time.perf_counter()
            populate_many(root, "bench", "outputs/big", args.big_dir)
            print(f"  nokvfs: {args.big_dir} paths through the facade in {time.perf_counter() - started:.1f} s")
        finally:
            if root.blocks.cache is not None:
                root.blocks.cache.close()
            root.close()
        for base in (local, pt_source):
            os.makedirs(os.path.join(base, "big"))
            for i in range(args.big_dir):
                os.close(os.open(os.path.join(base, "big", f"f{i:06d}"), os.O_WRONLY | os.O_CREAT, 0o644))

        log = open(os.path.join(work, "daemons.log"), "ab")
        pt = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-passthrough", pt_source, pt_mount], stdout=log, stderr=log, env=env)
        procs.append((pt, pt_mount))
        wait_mounted(pt_mount, pt, "the passthrough")
        nk = subprocess.Popen([sys.executable, "-m", "nokvfs.cli.main", "mount", data, nk_mount, "--foreground"], stdout=log, stderr=log, env=env, cwd=REPO)
        procs.append((nk, nk_mount))
        wait_mounted(nk_mount, nk, "the nokvfs daemon")
        targets = {"local": local, "passthrough": pt_mount, "nokvfs": os.path.join(nk_mount, "bench", "outputs")}

        payload = os.urandom(args.file_size)
        for base in targets.values():
            for d in range(10):
                os.makedirs(os.path.join(base, "small", f"d{d}"), exist_ok=True)

        def create_all(base):
            for path in small_paths(base, args.files):
                with open(path, "wb") as f:
                    f.write(payload)

        def stat_all(base):
            for path in small_paths(base, args.files):
                os.stat(path)

        def ls_lr(base):
            subprocess.run(["ls", "-lR", os.path.join(base, "small")], stdout=subprocess.DEVNULL, check=True)

        def cat_all(base):
            for path in small_paths(base, args.files):
                with open(path, "rb") as f:
                    if len(f.read()) != args.file_size:
                        raise SystemExit(f"short read of {path}")

        chunk = os.urandom(1 << 20)

        def seq_write(base):
            with open(os.path.join(base, "seq.bin"), "wb") as f:
                for _ in range(args.seq_mib):
                    f.write(chunk)

        def seq_read(base):
            total = 0
            with open(os.path.join(base, "seq.bin"), "rb", buffering=0) as f:
                while True:
                    data_ = f.read(1 << 20)
                    if not data_:
                        break
                    total += len(data_)
            if total != args.seq_mib << 20:
                raise SystemExit(f"read {total} bytes of seq.bin")

        def list_big(base):
            count = sum(1 for _ in os.scandir(os.path.join(base, "big")))
            if count != args.big_dir:
                raise SystemExit(f"listed {count} entries in {base}/big")

        phases = [
            (f"create+write+close {args.files}", create_all),
            (f"stat {args.files}", stat_all),
            ("ls -lR", ls_lr),
            (f"cat {args.files}", cat_all),
            (f"seq write {args.seq_mib} MiB", seq_write),
            (f"seq read {args.seq_mib} MiB (cold)", seq_read),
            (f"seq read {args.seq_mib} MiB (warm)", seq_read),
            (f"list {args.big_dir} entries", list_big),
        ]
        dropped = None
        rss = {}
        for phase, fn in phases:
            for name, base in targets.items():
                if "(cold)" in phase:
                    dropped = drop_caches()
                if phase.startswith("list"):
                    drop_caches()
                    before = rss_kib(nk.pid)
                timer.run(phase, name, fn, base)
                if phase.startswith("list") and name == "nokvfs":
                    rss["list"] = (before, rss_kib(nk.pid))
                if name == "nokvfs":
                    rss.setdefault("phases", []).append((phase, rss_kib(nk.pid)))

        print()
        print(f"{'phase':<32}{'local':>10}{'passthru':>10}{'nokvfs':>10}{'nokvfs/passthru':>17}{'nokvfs/local':>14}")
        for phase, _ in phases:
            l, p, n = (timer.results[(phase, t)] for t in ("local", "passthrough", "nokvfs"))
            if phase.startswith("seq"):
                mib = args.seq_mib
                print(f"{phase:<32}{mib / l:>7.0f}MB/s{mib / p:>6.0f}MB/s{mib / n:>6.0f}MB/s{p / n * 100:>15.0f}% of{'':>1}{l / n * 100:>10.0f}% of")
            else:
                print(f"{phase:<32}{l:>9.3f}s{p:>9.3f}s{n:>9.3f}s{n / p:>16.2f}x{n / l:>13.2f}x")
        if dropped is False:
            print("(not root: the page cache was not dropped before the cold read)")
        print("nokvfs daemon RSS after each phase: " + ", ".join(f"{p.split(' ')[0]} {kib / 1024:.0f} MiB" for p, kib in rss.get("phases", [])))
        if "list" in rss:
            before, after = rss["list"]
            print(f"nokvfs daemon RSS around the {args.big_dir}-entry listing: {before / 1024:.0f} MiB -> {after / 1024:.0f} MiB")
        return 0
    finally:
        for proc, mountpoint in reversed(procs):
            unmount(mountpoint)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        left = [m for _, m in procs if os.path.ismount(m)]
        if left:
            print(f"still mounted: {left}", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
