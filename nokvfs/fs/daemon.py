"""Mounting and unmounting: the daemon's life from `nokvfs mount` to a clean unmount.

    nokvfs mount DATA_DIR MOUNTPOINT            (or: nokvfs --data-dir DATA_DIR mount MOUNTPOINT)
    nokvfs umount MOUNTPOINT
    python3 -m nokvfs.fs.daemon [--data-dir D] [DATA_DIR] MOUNTPOINT [--foreground] ...

Start-up. A mountpoint left by a killed daemon ("Transport endpoint is not connected") is lazily
unmounted first; a live mount is refused. Without --foreground the process forks before it opens
anything, the child detaches (setsid, stdio to `<data dir>/run/mount-<id>.log`) and the parent
exits 0 only after the child reports the mount live, or 1 with the child's error. "Live" means a
stat(2) of the mountpoint, made from a worker thread while the FUSE loop runs, came back; then a
pid file `<data dir>/run/mount-<id>.json` is written and systemd is told READY=1 (the
NOTIFY_SOCKET datagram protocol, when NOTIFY_SOCKET is set).

Opening the root runs the publish recovery (`datadir.open_root`): operations of a killed daemon
are resumed or cleaned. Spool files a killed daemon left under `<data dir>/spool/mount/` are never
deleted; the start-up log counts them.

Replication (`--replicate s3://bucket/prefix [--replicate-endpoint-url URL] [--replicate-interval
SECONDS]`): once the mount is live the shard is pushed to the bucket every interval, and after the
unmount one last push ships the rest before the shard closes (nokvfs.fs.replication). Its
failures are logged and never end the mount. If another owner takes the shard over, the mount
turns read-only (EROFS) and logs why.

Following (`nokvfs mount --follow s3://bucket/prefix MOUNTPOINT [--cache-dir DIR]
[--follow-interval SECONDS]`): a read-only mount of the bucket's root on any machine. The
data directory (DIR, default `$XDG_CACHE_HOME/nokvfs/follow/<bucket>-<hash>`) is bootstrapped
from the bucket or reused, and the bucket's increments are replayed into it while mounted
(nokvfs.replicate.follower). A data directory restored without ownership follows its bucket the
same way when mounted; a fenced one mounts read-only.

Shutdown. SIGTERM, SIGINT and SIGHUP end the FUSE loop and unmount; so does `nokvfs umount`
(fusermount3 -u, or umount(8)), after which the daemon exits by itself. Files still open for
writing at shutdown are not published (their writer never closed them): their spools are kept
and logged, like every failed publication.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from nokvfs import filemodes

log = logging.getLogger("nokvfs.fs.daemon")

DEFAULT_WORKERS = 8
DEFAULT_MEMORY_MB = 96
DEFAULT_READ_AHEAD_KB = 1024
READY_TIMEOUT = 300.0
DEFAULT_REPLICATE_INTERVAL = 5.0
DEFAULT_SYSCALL_TIMEOUT = 30.0
DEFAULT_FOLLOW_INTERVAL = 1.0  # nokvfs.replicate.follower.DEFAULT_INTERVAL (not imported: no I/O modules here)
DEFAULT_FOLLOW_LAG_WARNING = 10.0


# --- systemd readiness (sd_notify over NOTIFY_SOCKET, no dependency) --------------------------


def sd_notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") to systemd if it is listening; True if it was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as exc:
        log.warning("sd_notify(%s) failed: %s", state.splitlines()[0], exc)
        return False


# --- mount table ----------------------------------------------------------------------------


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_fstype(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at `mountpoint` (last one wins), or None."""
    target = os.path.abspath(mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 10:
                    continue
                dash = fields.index("-")
                if _unescape(fields[4]) == target:
                    found = fields[dash + 1]
    except OSError:
        return None
    return found


def is_stale(mountpoint: str) -> bool:
    """A FUSE mount whose daemon is gone. statfs always reaches the daemon (stat may be answered
    from the kernel's attribute cache), so a dead connection shows as ENOTCONN (or ECONNABORTED)."""
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def _run_quiet(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, (done.stderr or done.stdout).strip()


def kernel_unmount(mountpoint: str, *, lazy: bool = False) -> tuple[bool, str]:
    """fusermount3 -u (or fusermount, or umount); lazy detaches a busy or dead mount."""
    attempts = []
    for tool in ("fusermount3", "fusermount"):
        if shutil.which(tool):
            attempts.append([tool, "-u"] + (["-z"] if lazy else []) + [mountpoint])
            break
    if shutil.which("umount"):
        attempts.append(["umount"] + (["-l"] if lazy else []) + [mountpoint])
    message = "no fusermount3, fusermount or umount found"
    for argv in attempts:
        code, message = _run_quiet(argv)
        if code == 0:
            return True, ""
    return False, message


def clear_stale(mountpoint: str) -> None:
    """Lazily unmount a dead FUSE mount at `mountpoint` (left by a killed daemon)."""
    if is_stale(mountpoint):
        log.warning("%s is a dead mount (Transport endpoint is not connected): unmounting it lazily", mountpoint)
        ok, message = kernel_unmount(mountpoint, lazy=True)
        if not ok or is_stale(mountpoint):
            raise RuntimeError(f"cannot clear the dead mount at {mountpoint}: {message}")


# --- pid files ------------------------------------------------------------------------------


def mount_id(mountpoint: str) -> str:
    import xxhash

    return xxhash.xxh3_64_hexdigest(os.path.abspath(mountpoint).encode())


def pid_file(data_dir: str, mountpoint: str) -> str:
    return os.path.join(data_dir, "run", f"mount-{mount_id(mountpoint)}.json")


def log_file(data_dir: str, mountpoint: str) -> str:
    return os.path.join(data_dir, "run", f"mount-{mount_id(mountpoint)}.log")


def read_pid_file(data_dir: str, mountpoint: str) -> dict | None:
    try:
        with open(pid_file(data_dir, mountpoint)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


# --- options --------------------------------------------------------------------------------


def add_mount_arguments(parser: argparse.ArgumentParser, *, debug_option: bool = True) -> None:
    parser.add_argument("mount_first", metavar="DATA_DIR", help="the data directory; alone, the mountpoint (the data directory is then --data-dir)")
    parser.add_argument("mount_second", nargs="?", metavar="MOUNTPOINT", help="the mountpoint")
    parser.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (default: detach once the mount is live)")
    parser.add_argument("--read-only", action="store_true", help="refuse every change (EROFS)")
    parser.add_argument("--allow-other", action="store_true", help="let other users access the mount (needs user_allow_other in /etc/fuse.conf for non-root)")
    if debug_option:  # the nokvfs CLI has a global --debug
        parser.add_argument("--debug", action="store_true", help="debug logging")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help=f"worker threads for uploads, downloads and commits (default {DEFAULT_WORKERS})")
    parser.add_argument("--memory-cache-mb", type=int, default=DEFAULT_MEMORY_MB, help=f"verified blocks kept in memory for reads (default {DEFAULT_MEMORY_MB})")
    parser.add_argument("--read-ahead-kb", type=int, default=DEFAULT_READ_AHEAD_KB, help=f"kernel readahead of the mount, 0 keeps the kernel's (default {DEFAULT_READ_AHEAD_KB}; needs root)")
    parser.add_argument("--syscall-timeout", metavar="SECONDS", type=_positive_seconds, default=DEFAULT_SYSCALL_TIMEOUT, help=f"longest a syscall on the mount waits for the store or a publication before it fails with EIO (default {DEFAULT_SYSCALL_TIMEOUT:g})")
    parser.add_argument("--replicate", metavar="URL", default=None, help="while mounted, ship the shard to this bucket (s3://bucket/prefix); a last push at unmount")
    parser.add_argument("--sync", action="store_true", help="with --replicate: close(2) and fsync(2) return only once the bucket holds the write (no accepted write is lost with the machine)")
    parser.add_argument("--replicate-endpoint-url", metavar="URL", default=None, help="S3 endpoint of the --replicate bucket (default: AWS)")
    parser.add_argument("--replicate-interval", metavar="SECONDS", type=_positive_seconds, default=DEFAULT_REPLICATE_INTERVAL, help=f"seconds between pushes (default {DEFAULT_REPLICATE_INTERVAL:g})")
    parser.add_argument("--follow", metavar="URL", default=None, help="mount the root a bucket (s3://bucket/prefix) holds, read-only, following its owner")
    parser.add_argument("--cache-dir", metavar="DIR", default=None, help="the follower's data directory (default: under $XDG_CACHE_HOME/nokvfs/follow/)")
    parser.add_argument("--follow-endpoint-url", metavar="URL", default=None, help="S3 endpoint of the --follow bucket (default: --endpoint-url, else AWS)")
    parser.add_argument("--follow-interval", metavar="SECONDS", type=_positive_seconds, default=DEFAULT_FOLLOW_INTERVAL, help=f"seconds between polls of the bucket (default {DEFAULT_FOLLOW_INTERVAL:g})")
    parser.add_argument("--follow-lag-warning", metavar="SECONDS", type=_positive_seconds, default=DEFAULT_FOLLOW_LAG_WARNING, help=f"log the lag once it exceeds this (default {DEFAULT_FOLLOW_LAG_WARNING:g})")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 86400 * 365:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def add_umount_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    parser.add_argument("--lazy", action="store_true", help="detach now even if busy (umount -l)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the daemon to exit (default 30)")


def resolve_data_dir(explicit: str | None) -> str:
    if explicit:
        return os.path.abspath(explicit)
    env = os.environ.get("NOKVFS_DATA_DIR")
    if env:
        return os.path.abspath(env)
    from nokvfs.workspace.datadir import default_data_dir

    return default_data_dir()


def split_mount_paths(args) -> tuple[str, str]:
    """(data dir, mountpoint): `mount DATA_DIR MOUNTPOINT` (the positional wins) or `mount MOUNTPOINT`."""
    paths = [p for p in (args.mount_first, args.mount_second) if p is not None]
    if len(paths) == 2:
        return os.path.abspath(paths[0]), os.path.abspath(paths[1])
    if getattr(args, "follow", None):
        if args.cache_dir:
            return os.path.abspath(args.cache_dir), os.path.abspath(paths[0])
        from nokvfs.replicate.follower import default_cache_dir

        return default_cache_dir(args.follow, _follow_endpoint(args)), os.path.abspath(paths[0])
    return resolve_data_dir(getattr(args, "data_dir", None)), os.path.abspath(paths[0])


def _follow_endpoint(args) -> str | None:
    return getattr(args, "follow_endpoint_url", None) or getattr(args, "endpoint_url", None)


# --- logging --------------------------------------------------------------------------------


def setup_logging(debug: bool, stream=None, path: str | None = None) -> None:
    handler = logging.FileHandler(path) if path else logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    root_logger = logging.getLogger()
    for old in list(root_logger.handlers):
        root_logger.removeHandler(old)
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.DEBUG if debug else logging.INFO)
    pyfuse3_logger = logging.getLogger("pyfuse3")
    pyfuse3_logger.addFilter(_late_release_replies)
    if not debug:
        pyfuse3_logger.setLevel(logging.WARNING)


def _late_release_replies(record: logging.LogRecord) -> bool:
    """A release(dir) the kernel sent in the background can be answered after the unmount has
    torn the connection down; pyfuse3 logs the failed reply as an ERROR although nothing is
    wrong (the kernel no longer waits for it). Such a record is kept at DEBUG."""
    message = record.getMessage()
    if record.levelno >= logging.WARNING and message.startswith(("fuse_release(", "fuse_releasedir(")) and "No such file or directory" in message:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger("pyfuse3").isEnabledFor(logging.DEBUG)
    return True


# --- mount ----------------------------------------------------------------------------------


def mount(args) -> int:
    """The `mount` subcommand: returns the process exit code."""
    from nokvfs.errors import NokvError

    data_dir, mountpoint = split_mount_paths(args)
    args.debug = bool(getattr(args, "debug", False))
    setup_logging(args.debug)
    if getattr(args, "sync", False) and not getattr(args, "replicate", None):
        log.error("mount: --sync needs --replicate URL (the bucket a close waits for)")
        return 2
    try:
        _preflight(data_dir, mountpoint, follow=bool(getattr(args, "follow", None)))
    except (RuntimeError, OSError, NokvError) as exc:
        log.error("mount: %s", exc)
        return 1
    if args.foreground:
        return _serve_guarded(args, data_dir, mountpoint, ready_fd=None)
    return _daemonise(args, data_dir, mountpoint)


def _preflight(data_dir: str, mountpoint: str, *, follow: bool = False) -> None:
    from nokvfs.workspace.datadir import read_config

    if not follow:  # a follower's directory may not exist yet: serve() bootstraps it
        read_config(data_dir)  # NotFound if this is no data directory: fail before forking
    clear_stale(mountpoint)
    if not os.path.isdir(mountpoint):
        raise RuntimeError(f"mountpoint {mountpoint} is not a directory")
    fstype = mount_fstype(mountpoint)
    if fstype is not None and os.path.ismount(mountpoint):
        raise RuntimeError(f"{mountpoint} is already mounted ({fstype})")


def _daemonise(args, data_dir: str, mountpoint: str) -> int:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return _await_child(pid, read_end, data_dir, mountpoint)
    # The child: detach from the terminal and the parent's session.
    os.close(read_end)
    try:
        os.setsid()
        os.chdir("/")
        filemodes.makedirs(data_dir)  # a follower's directory may not exist yet: private from the start
        filemodes.makedirs(os.path.join(data_dir, "run"))
        devnull = os.open(os.devnull, os.O_RDWR)
        logfd = os.open(log_file(data_dir, mountpoint), os.O_WRONLY | os.O_CREAT | os.O_APPEND, filemodes.FILE_MODE)
        os.dup2(devnull, 0)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        os.close(devnull)
        os.close(logfd)
        setup_logging(args.debug, stream=sys.stderr)
        code = _serve_guarded(args, data_dir, mountpoint, ready_fd=write_end)
    except BaseException as exc:  # noqa: BLE001 - the child must report, never return to the CLI
        _report(write_end, f"ERROR {exc}")
        code = 1
    os._exit(code)


def _await_child(pid: int, read_end: int, data_dir: str, mountpoint: str) -> int:
    deadline = time.monotonic() + READY_TIMEOUT
    message = b""
    with os.fdopen(read_end, "rb") as pipe:
        while time.monotonic() < deadline:
            chunk = pipe.readline()
            if not chunk:
                break
            message = chunk.strip()
            if message.startswith(b"READY") or message.startswith(b"ERROR"):
                break
    text = message.decode("utf-8", "replace")
    if text.startswith("READY"):
        print(f"nokvfs: {data_dir} mounted at {mountpoint} (pid {pid})", file=sys.stderr)
        return 0
    detail = text[6:] if text.startswith("ERROR") else "the daemon exited before the mount was live"
    print(f"nokvfs: mount failed: {detail} (log: {log_file(data_dir, mountpoint)})", file=sys.stderr)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return 1


def _report(fd: int | None, message: str) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (message.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def _serve_guarded(args, data_dir: str, mountpoint: str, *, ready_fd: int | None) -> int:
    try:
        return serve(
            data_dir,
            mountpoint,
            read_only=args.read_only,
            allow_other=args.allow_other,
            debug=args.debug,
            workers=args.workers,
            memory_bytes=args.memory_cache_mb * 1024 * 1024,
            read_ahead_kb=args.read_ahead_kb,
            store=getattr(args, "store", None),
            endpoint_url=getattr(args, "endpoint_url", None),
            ready=lambda: _report(ready_fd, "READY"),
            replicate=getattr(args, "replicate", None),
            replicate_endpoint_url=getattr(args, "replicate_endpoint_url", None),
            replicate_interval=getattr(args, "replicate_interval", DEFAULT_REPLICATE_INTERVAL),
            syscall_timeout=getattr(args, "syscall_timeout", DEFAULT_SYSCALL_TIMEOUT),
            sync=getattr(args, "sync", False),
            follow=getattr(args, "follow", None),
            follow_endpoint_url=_follow_endpoint(args),
            follow_interval=getattr(args, "follow_interval", DEFAULT_FOLLOW_INTERVAL),
            follow_lag_warning=getattr(args, "follow_lag_warning", DEFAULT_FOLLOW_LAG_WARNING),
        )
    except Exception as exc:  # noqa: BLE001 - reported to the waiting parent and the log
        log.error("mount of %s at %s failed: %s", data_dir, mountpoint, exc, exc_info=args.debug)
        _report(ready_fd, f"ERROR {exc}")
        return 1
    finally:
        if ready_fd is not None:
            try:
                os.close(ready_fd)
            except OSError:
                pass


def serve(data_dir: str, mountpoint: str, *, read_only=False, allow_other=False, debug=False, workers=DEFAULT_WORKERS, memory_bytes=DEFAULT_MEMORY_MB << 20, read_ahead_kb=DEFAULT_READ_AHEAD_KB, store=None, endpoint_url=None, ready=None, replicate=None, replicate_endpoint_url=None, replicate_interval=DEFAULT_REPLICATE_INTERVAL, syscall_timeout=DEFAULT_SYSCALL_TIMEOUT, sync=False, follow=None, follow_endpoint_url=None, follow_interval=DEFAULT_FOLLOW_INTERVAL, follow_lag_warning=DEFAULT_FOLLOW_LAG_WARNING) -> int:
    """Open the root, mount it and serve until unmounted or signalled. Returns the exit code.

    With `replicate` (a bucket URL) the shard is replicated while mounted (nokvfs.fs.replication):
    started once the mount is live, stopped with one last push after the unmount. With `follow`
    (a bucket URL) `data_dir` is bootstrapped as its follower and mounted read-only, following.
    """
    import pyfuse3
    import trio

    from nokvfs.fs import spools
    from nokvfs.fs.filesystem import FileSystem
    from nokvfs.fs.freshness import ChangeFollower, Invalidator
    from nokvfs.fs.operations import Operations
    from nokvfs.fs.prefetch import BlockFetcher
    from nokvfs.fs.replication import bootstrap_follower, bucket_link
    from nokvfs.fs.threads import Workers
    from nokvfs.fs.views import LiveView
    from nokvfs.workspace.datadir import open_root

    started = time.monotonic()
    _tame_malloc()
    if follow:
        bootstrap_follower(follow, data_dir, endpoint_url=follow_endpoint_url)
    root = open_root(data_dir, store=store, endpoint_url=endpoint_url)
    try:
        replication, read_only_why = bucket_link(
            data_dir, root, replicate=replicate, replicate_endpoint_url=replicate_endpoint_url, replicate_interval=replicate_interval,
            follow_endpoint_url=follow_endpoint_url, follow_interval=follow_interval, lag_warning=follow_lag_warning,
        )
    except BaseException:
        root.close()
        raise
    if read_only_why:
        log.info("mounting read-only: %s", read_only_why)
        read_only = True
    try:
        if root.blocks.cache is None:
            log.warning("the block cache of %s is held by another process: this mount reads uncached", data_dir)
        for kept in spools.adopt_orphans(data_dir, os.getpid()):
            record = kept.record
            log.warning(
                "kept spool %s (%s:%s, %d bytes): %s -- `nokvfs spool retry|discard %s`",
                kept.id, record.get("workbench"), record.get("path"), kept.size, record.get("reason"), kept.id,
            )
        pool = Workers(foreground=workers, background=max(1, min(4, workers // 2)), syscall_timeout=syscall_timeout)
        invalidator = Invalidator()
        fetcher = BlockFetcher(root, pool, memory_bytes=memory_bytes)
        fs = FileSystem(
            root, LiveView(root, read_only=read_only), pool, invalidator, fetcher,
            owner={"pid": os.getpid(), "mountpoint": mountpoint, "data_dir": data_dir},
        )
        if replication is not None:
            replication.on_fenced = lambda why: _turn_read_only(fs.tree, why)
            if sync and hasattr(replication, "wait_shipped"):
                fs.files.ship = replication.wait_shipped
        operations = Operations(fs)
        follower = ChangeFollower(root, fs.changes)

        options = set(pyfuse3.default_options)
        options.add("subtype=nokvfs")
        options.add("fsname=" + ("nokvfs:" + data_dir if "," not in data_dir else "nokvfs"))
        if allow_other:
            options.add("allow_other")
        if read_only:
            options.add("ro")
        if debug:
            options.add("debug")
        pyfuse3.init(operations, mountpoint, options)
        unmounted = False
        try:
            trio.run(_main, mountpoint, data_dir, pool, fetcher, follower, invalidator, ready, started, read_ahead_kb, replication)
        except BaseException:
            pyfuse3.close(unmount=True)
            unmounted = True
            raise
        finally:
            fs.files.keep_open_spools(fs.open_spools())
        if not unmounted:
            pyfuse3.close(unmount=True)
        log.info(
            "unmounted %s (blocks: %d fetched on demand, %d prefetched, %d memory hits; %d change events followed)",
            mountpoint, fetcher.fetched, fetcher.prefetched, fetcher.hits, follower.events_seen,
        )
        return 0
    finally:
        if replication is not None:
            replication.stop_blocking()  # the kernel has let go: nothing more can be written
        _remove_pid_file(data_dir, mountpoint)
        cache = getattr(root.blocks, "cache", None)
        if cache is not None:
            cache.close()
        root.close()


def _turn_read_only(tree, why: str) -> None:
    """Another owner took the shard over: every change is EROFS from now on."""
    tree.read_only = True
    log.error("the mount is read-only from now on: %s", why)


def _tame_malloc() -> None:
    """Keep block-sized buffers from pinning memory.

    glibc raises its mmap threshold each time a large mmapped chunk is freed, after which 1-4 MiB
    buffers (FUSE writes, blocks) come from per-thread arenas that rarely shrink: a daemon that
    moved a few GiB would sit on hundreds of MiB. A fixed threshold and few arenas keep every
    large buffer an mmap that is returned on free.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD (also disables the dynamic threshold)
        libc.mallopt(-8, 4)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


async def _main(mountpoint, data_dir, pool, fetcher, follower, invalidator, ready, started, read_ahead_kb, replication=None) -> None:
    import pyfuse3
    import trio

    async with trio.open_nursery() as nursery:
        pool.start(nursery)
        fetcher.start(nursery)
        nursery.start_soon(invalidator.run)
        nursery.start_soon(follower.run)
        nursery.start_soon(_signals)
        nursery.start_soon(_announce, mountpoint, data_dir, ready, started, read_ahead_kb, replication)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


async def _signals() -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for number in signals:
            log.info("%s: unmounting", signal.Signals(number).name)
            sd_notify("STOPPING=1")
            pyfuse3.terminate()
            return


def _set_read_ahead(device: int, kib: int) -> None:
    """Kernel readahead for this mount (its bdi is 0:<minor of st_dev>).

    The default, 128 KiB, turns a sequential read into 128 KiB FUSE requests; nokvfs serves reads
    out of whole blocks in memory, so fewer, larger requests (up to the 1 MiB FUSE maximum) are
    cheaper. Needs root (or write access to sysfs); otherwise the default stays.
    """
    if kib <= 0:
        return
    path = f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kib))
    except OSError as exc:
        log.debug("cannot set %s: %s", path, exc)


async def _announce(mountpoint, data_dir, ready, started, read_ahead_kb, replication=None) -> None:
    import trio

    # The stat blocks until the kernel's INIT and GETATTR were answered by the loop running now.
    st = await trio.to_thread.run_sync(os.stat, mountpoint)
    _set_read_ahead(st.st_dev, read_ahead_kb)
    _write_pid_file(data_dir, mountpoint)
    log.info("mounted %s at %s in %.2f s (pid %d)", data_dir, mountpoint, time.monotonic() - started, os.getpid())
    sd_notify(f"READY=1\nSTATUS=mounted {mountpoint}\nMAINPID={os.getpid()}")
    if ready is not None:
        ready()
    if replication is not None:
        replication.start()  # in the background: the bucket may be slow or unreachable


def _write_pid_file(data_dir: str, mountpoint: str) -> None:
    path = pid_file(data_dir, mountpoint)
    record = {"pid": os.getpid(), "mountpoint": mountpoint, "data_dir": data_dir, "started_unix": int(time.time())}
    tmp = path + ".tmp"
    with open(tmp, "w", opener=filemodes.opener) as f:
        json.dump(record, f)
        f.write("\n")
    os.rename(tmp, path)


def _remove_pid_file(data_dir: str, mountpoint: str) -> None:
    record = read_pid_file(data_dir, mountpoint)
    if record is not None and record.get("pid") == os.getpid():
        try:
            os.unlink(pid_file(data_dir, mountpoint))
        except FileNotFoundError:
            pass


# --- umount ---------------------------------------------------------------------------------


def umount(args) -> int:
    """The `umount` subcommand: unmount, then wait for the daemon to exit."""
    if not logging.getLogger().handlers:
        setup_logging(False)
    mountpoint = os.path.abspath(args.mountpoint)
    candidates = []
    for data_dir in {resolve_data_dir(getattr(args, "data_dir", None)), *filter(None, [os.environ.get("NOKVFS_DATA_DIR")])}:
        record = read_pid_file(data_dir, mountpoint)
        if record is not None:
            candidates.append(record)
    stale = is_stale(mountpoint)
    if not stale and mount_fstype(mountpoint) is None:
        print(f"nokvfs: {mountpoint} is not mounted", file=sys.stderr)
        return 1
    ok, message = kernel_unmount(mountpoint, lazy=args.lazy or stale)
    if not ok:
        print(f"nokvfs: cannot unmount {mountpoint}: {message}", file=sys.stderr)
        return 1
    if args.lazy:
        return 0  # detached: the daemon exits when the last user of the mount lets go
    deadline = time.monotonic() + args.timeout
    for record in candidates:
        pid = int(record.get("pid", 0))
        while pid and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid and _alive(pid):
            print(f"nokvfs: unmounted {mountpoint}, but daemon {pid} is still running", file=sys.stderr)
            return 1
    return 0


# --- python3 -m nokvfs.fs.daemon ------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m nokvfs.fs.daemon", description="Mount a nokvfs data directory.")
    parser.add_argument("--data-dir", default=None, help="the data directory (default: $NOKVFS_DATA_DIR or ~/.local/share/nokvfs)")
    add_mount_arguments(parser)
    args = parser.parse_args(argv)
    return mount(args)


if __name__ == "__main__":
    sys.exit(main())
