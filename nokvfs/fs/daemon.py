"""Mounting and unmounting: the daemon's life from `nokvfs mount` to a clean unmount.

    nokvfs mount DATA_DIR MOUNTPOINT            (or: nokvfs --data-dir DATA_DIR mount MOUNTPOINT)
    nokvfs umount MOUNTPOINT

The command line is nokvfs.cli.mount_commands; this module takes a MountOptions.

Start-up. A mountpoint left by a killed daemon ("Transport endpoint is not connected") is lazily
unmounted first; a live mount is refused. Without --foreground the process forks before it opens
anything, the child detaches (setsid, stdio to `<data dir>/run/mount-<id>.log`) and the parent
exits 0 only after the child reports the mount live, or 1 with the child's error. "Live" means a
stat(2) of the mountpoint, made from a worker thread while the FUSE loop runs, came back; then a
pid file `<data dir>/run/mount-<id>.json` is written and systemd is told READY=1 (the
NOTIFY_SOCKET datagram protocol, when NOTIFY_SOCKET is set).

Opening the root runs the publish recovery (`datadir.open_root`): operations of a killed daemon
are resumed or cleaned. Spools a killed daemon left under `<data dir>/spool/mount/` are never
deleted: they are marked kept (nokvfs.fs.spools) and each is logged with its reason, for
`nokvfs spool list|retry|discard`.

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

import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.fs.mountinfo import clear_stale, is_stale, kernel_unmount, mount_fstype

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


# --- logging --------------------------------------------------------------------------------


def setup_logging(debug: bool, stream=None, path: str | None = None) -> None:
    handler = logging.FileHandler(path) if path else logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
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
    if (
        record.levelno >= logging.WARNING
        and message.startswith(("fuse_release(", "fuse_releasedir("))
        and "No such file or directory" in message
    ):
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger("pyfuse3").isEnabledFor(logging.DEBUG)
    return True


# --- mount ----------------------------------------------------------------------------------


@dataclass
class MountOptions:
    """Everything a mount is asked to do (`nokvfs mount`'s options, nokvfs.cli.mount_commands)."""

    data_dir: str
    mountpoint: str
    foreground: bool = False
    read_only: bool = False
    allow_other: bool = False
    debug: bool = False
    workers: int = DEFAULT_WORKERS
    memory_bytes: int = DEFAULT_MEMORY_MB << 20
    read_ahead_kb: int = DEFAULT_READ_AHEAD_KB
    syscall_timeout: float = DEFAULT_SYSCALL_TIMEOUT
    store: str | None = None  # overrides of the data directory's object store
    endpoint_url: str | None = None
    replicate: str | None = None  # ship the shard to this bucket while mounted
    replicate_endpoint_url: str | None = None
    replicate_interval: float = DEFAULT_REPLICATE_INTERVAL
    sync: bool = False  # with replicate: close(2) waits for the bucket
    write_back: bool = False  # close(2) returns once the bytes are durable here (nokvfs.fs.writeback)
    xattrs: bool = True  # False: no extended attributes, answered by the kernel (nokvfs.fs.xattrs)
    follow: str | None = None  # mount this bucket's root read-only, following it
    follow_endpoint_url: str | None = None
    follow_interval: float = DEFAULT_FOLLOW_INTERVAL
    follow_lag_warning: float = DEFAULT_FOLLOW_LAG_WARNING
    maintenance_interval: float | None = None  # seconds between background passes (0: off; None: the data directory's)
    metrics: tuple[str, int] | None = None  # (address, port) of the Prometheus listener


def mount(options: MountOptions) -> int:
    """Mount (in the foreground, or detached once live); returns the process exit code."""
    from nokvfs.errors import NokvError

    setup_logging(options.debug)
    if options.sync and not options.replicate:
        log.error("mount: --sync needs --replicate URL (the bucket a close waits for)")
        return 2
    try:
        _preflight(options.data_dir, options.mountpoint, follow=bool(options.follow))
    except (RuntimeError, OSError, NokvError) as exc:
        log.error("mount: %s", exc)
        return 1
    if options.foreground:
        return _serve_guarded(options, ready_fd=None)
    return _daemonise(options)


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


def _daemonise(options: MountOptions) -> int:
    data_dir, mountpoint = options.data_dir, options.mountpoint
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
        setup_logging(options.debug, stream=sys.stderr)
        code = _serve_guarded(options, ready_fd=write_end)
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


def _serve_guarded(options: MountOptions, *, ready_fd: int | None) -> int:
    try:
        return serve(options, ready=lambda: _report(ready_fd, "READY"))
    except Exception as exc:
        log.error("mount of %s at %s failed: %s", options.data_dir, options.mountpoint, exc, exc_info=options.debug)
        _report(ready_fd, f"ERROR {exc}")
        return 1
    finally:
        if ready_fd is not None:
            try:
                os.close(ready_fd)
            except OSError:
                pass


def serve(options: MountOptions, *, ready=None) -> int:
    """Open the root, mount it and serve until unmounted or signalled. Returns the exit code.

    `ready()` is called once the mount answers. With `options.replicate` (a bucket URL) the
    shard is replicated while mounted (nokvfs.fs.replication): started once the mount is live,
    stopped with one last push after the unmount. With `options.follow` (a bucket URL) the data
    directory is bootstrapped as its follower and mounted read-only, following.
    """
    o = options
    data_dir, mountpoint, read_only = o.data_dir, o.mountpoint, o.read_only
    import pyfuse3
    import trio

    from nokvfs.fs import spools, writeback, writebehind
    from nokvfs.fs.filesystem import FileSystem
    from nokvfs.fs.freshness import ChangeFollower, Invalidator
    from nokvfs.fs.maintenance import Maintenance
    from nokvfs.fs.operations import Operations
    from nokvfs.fs.prefetch import BlockFetcher
    from nokvfs.fs.replication import bootstrap_follower, bucket_link
    from nokvfs.fs.status import MountStatus, StatusServer, socket_path
    from nokvfs.fs.threads import Workers
    from nokvfs.fs.views import LiveView
    from nokvfs.meters import Meters
    from nokvfs.objects.metered import MeteredStore
    from nokvfs.workspace import prestage
    from nokvfs.workspace.datadir import open_root, read_config

    started = time.monotonic()
    maintenance = None
    _tame_malloc()
    if o.follow:
        bootstrap_follower(o.follow, data_dir, endpoint_url=o.follow_endpoint_url)
    store_meters = Meters()
    root = open_root(
        data_dir,
        store=o.store,
        endpoint_url=o.endpoint_url,
        store_wrapper=lambda store: MeteredStore(store, store_meters),
    )
    try:
        replication, read_only_why = bucket_link(
            data_dir,
            root,
            replicate=o.replicate,
            replicate_endpoint_url=o.replicate_endpoint_url,
            replicate_interval=o.replicate_interval,
            follow_endpoint_url=o.follow_endpoint_url,
            follow_interval=o.follow_interval,
            lag_warning=o.follow_lag_warning,
        )
    except BaseException:
        root.close()
        raise
    if read_only_why:
        log.info("mounting read-only: %s", read_only_why)
        read_only = True
    listeners = []
    try:
        if root.blocks.cache is None and read_config(data_dir).get("cache_bytes"):
            log.warning("the block cache of %s is held by another process: this mount reads uncached", data_dir)
        if not read_only:
            published, kept = writeback.replay(root, data_dir)
            if published or kept:
                log.info(
                    "write-back: %d file(s) accepted before the last daemon ended published, %d kept", published, kept
                )
        for kept in spools.adopt_orphans(data_dir, os.getpid()):
            record = kept.record
            log.warning(
                "kept spool %s (%s:%s, %d bytes): %s -- `nokvfs spool retry|discard %s`",
                kept.id,
                record.get("workbench"),
                record.get("path"),
                kept.size,
                record.get("reason"),
                kept.id,
            )
        pool = Workers(
            foreground=o.workers, background=max(1, min(4, o.workers // 2)), syscall_timeout=o.syscall_timeout
        )
        invalidator = Invalidator()
        fetcher = BlockFetcher(root, pool, memory_bytes=o.memory_bytes)
        root.blocks.fill_in_background = True  # readers do not wait for the block cache's copies
        fs = FileSystem(
            root,
            LiveView(root, read_only=read_only),
            pool,
            invalidator,
            fetcher,
            owner={"pid": os.getpid(), "mountpoint": mountpoint, "data_dir": data_dir},
            xattrs=o.xattrs,
        )
        if replication is not None:
            replication.on_fenced = lambda why: _turn_read_only(fs.tree, why)
            if o.sync and hasattr(replication, "wait_shipped"):
                fs.files.ship = replication.wait_shipped
        publisher = None
        if o.write_back and not read_only:
            publisher = fs.files.writeback = writeback.Publisher(fs.files)
            fs.directories.writeback = publisher
        operations = Operations(fs)
        if publisher is not None:
            # close(2) does not publish here, so the kernel may cache writes too (fewer, larger
            # WRITEs; the file's pages stay cached); it writes them back before FLUSH and FSYNC.
            operations.enable_writeback_cache = True
        follower = ChangeFollower(root, fs.changes)
        maintenance = Maintenance.for_mount(root, data_dir, interval=o.maintenance_interval, read_only=read_only)
        status = MountStatus(
            data_dir=data_dir,
            mountpoint=mountpoint,
            root=root,
            fs=fs,
            workers=pool,
            fetcher=fetcher,
            follower=follower,
            store_meters=store_meters,
            link=replication,
            read_only_why=read_only_why,
            maintenance=maintenance,
        )
        listeners.append(StatusServer(socket_path(data_dir, mountpoint), status.snapshot))
        if o.metrics is not None:
            from nokvfs.fs.metrics import MetricsServer

            listeners.append(MetricsServer(*o.metrics, status.snapshot))
        for listener in listeners:
            listener.start()

        options = set(pyfuse3.default_options)
        options.add("subtype=nokvfs")
        options.add("fsname=" + ("nokvfs:" + data_dir if "," not in data_dir else "nokvfs"))
        if o.allow_other:
            options.add("allow_other")
        if read_only:
            options.add("ro")
        if o.debug:
            options.add("debug")
        pyfuse3.init(operations, mountpoint, options)
        unmounted = False
        if maintenance is not None:
            maintenance.start()
        try:
            trio.run(
                _main,
                mountpoint,
                data_dir,
                pool,
                fetcher,
                follower,
                invalidator,
                ready,
                started,
                o.read_ahead_kb,
                replication,
                publisher,
            )
        except BaseException:
            pyfuse3.close(unmount=True)
            unmounted = True
            raise
        finally:
            fs.files.keep_open_spools(fs.open_spools())
        if not unmounted:
            pyfuse3.close(unmount=True)
        log.info(
            "unmounted %s (blocks: %d fetched on demand, %d prefetched, %d memory hits, %d staged while "
            "written of which %d linked at publication; %d MiB of spools written behind, %d requests "
            "skipped; %d change events followed)",
            mountpoint,
            fetcher.fetched,
            fetcher.prefetched,
            fetcher.hits,
            prestage.COUNTS["staged"],
            prestage.COUNTS["linked"],
            writebehind.COUNTS["bytes"] >> 20,
            writebehind.COUNTS["skipped"],
            follower.events_seen,
        )
        return 0
    finally:
        if maintenance is not None:
            maintenance.stop()
        for listener in listeners:
            listener.stop()
        if replication is not None:
            replication.stop_blocking()  # the kernel has let go: nothing more can be written
        _remove_pid_file(data_dir, mountpoint)
        spools.remove_memory_dir(data_dir)  # unless a spool is left there for the next mount
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


async def _main(
    mountpoint,
    data_dir,
    pool,
    fetcher,
    follower,
    invalidator,
    ready,
    started,
    read_ahead_kb,
    replication=None,
    publisher=None,
) -> None:
    import pyfuse3
    import trio

    async with trio.open_nursery() as nursery:
        pool.start(nursery)
        fetcher.start(nursery)
        nursery.start_soon(invalidator.run)
        nursery.start_soon(follower.run)
        nursery.start_soon(_signals)
        nursery.start_soon(_announce, mountpoint, data_dir, ready, started, read_ahead_kb, replication)
        if publisher is not None:
            nursery.start_soon(publisher.run)
        await pyfuse3.main()
        if publisher is not None:
            await publisher.drain()  # `nokvfs umount` returns once the daemon exits: after this
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


def umount(mountpoint: str, *, data_dirs=(), lazy: bool = False, timeout: float = 30.0) -> int:
    """Unmount, then wait for the daemon (found by its pid file in one of `data_dirs`) to exit."""
    if not logging.getLogger().handlers:
        setup_logging(False)
    mountpoint = os.path.abspath(mountpoint)
    candidates = [
        record for data_dir in dict.fromkeys(data_dirs) if (record := read_pid_file(data_dir, mountpoint)) is not None
    ]
    stale = is_stale(mountpoint)
    if not stale and mount_fstype(mountpoint) is None:
        print(f"nokvfs: {mountpoint} is not mounted", file=sys.stderr)
        return 1
    ok, message = kernel_unmount(mountpoint, lazy=lazy or stale)
    if not ok:
        print(f"nokvfs: cannot unmount {mountpoint}: {message}", file=sys.stderr)
        return 1
    if lazy:
        return 0  # detached: the daemon exits when the last user of the mount lets go
    deadline = time.monotonic() + timeout
    for record in candidates:
        pid = int(record.get("pid", 0))
        while pid and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid and _alive(pid):
            print(f"nokvfs: unmounted {mountpoint}, but daemon {pid} is still running", file=sys.stderr)
            return 1
    return 0
