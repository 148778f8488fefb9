"""`nokvfs status`: what a running mount says about itself, over a channel only its owner opens.

The daemon listens on a Unix socket, `<data_dir>/run/mount-<id>.sock` (the id hashes the
mountpoint, like the pid file's). The socket is 0600 in the 0700 `run/` directory, and each
connection's peer credentials (SO_PEERCRED) are checked as well: only the daemon's own uid and
root are answered; anyone else gets a one-line refusal. The protocol is one JSON document per
connection: the client connects, the daemon writes the snapshot and closes.

The socket is bound through `/proc/self/fd/<directory>` so that a long data-directory path does
not hit the 108-byte limit of a socket address.

    MountStatus.snapshot()   the document (also what the metrics endpoint exports, nokvfs.fs.metrics)
    StatusServer             the listening thread
    query(data_dir, mountpoint)   the client side: the document, or MountUnavailable
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time

from nokvfs.errors import MountUnavailable

log = logging.getLogger(__name__)

QUERY_TIMEOUT = 5.0  # seconds a client waits for a daemon's answer
MAX_ANSWER = 16 << 20


def socket_path(data_dir: str, mountpoint: str) -> str:
    from nokvfs.fs.daemon import mount_id

    return os.path.join(data_dir, "run", f"mount-{mount_id(mountpoint)}.sock")


def _short_address(path: str) -> tuple[int, str]:
    """(a descriptor of the socket's directory, an address of the socket through it)."""
    directory, name = os.path.split(path)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return fd, f"/proc/self/fd/{fd}/{name}"


def _memory() -> dict:
    """Resident memory from /proc/self/status, split as the kernel counts it: anonymous (the
    daemon's own heap), file-backed (mostly the shard's LMDB map: page cache, reclaimable) and
    shared."""
    fields = {
        "VmRSS": "rss_bytes",
        "RssAnon": "rss_anon_bytes",
        "RssFile": "rss_file_bytes",
        "RssShmem": "rss_shmem_bytes",
    }
    found = dict.fromkeys(fields.values(), 0)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in fields:
                    found[fields[name]] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


class MountStatus:
    """The live figures of one mount, gathered on demand from the parts that own them."""

    def __init__(
        self,
        *,
        data_dir: str,
        mountpoint: str,
        root,
        fs,
        workers,
        fetcher,
        follower,
        store_meters,
        link=None,
        read_only_why: str | None = None,
        maintenance=None,
    ):
        self.data_dir = data_dir
        self.mountpoint = mountpoint
        self.root = root
        self.fs = fs
        self.workers = workers
        self.fetcher = fetcher
        self.follower = follower  # the mount's change-feed follower (nokvfs.fs.freshness)
        self.store_meters = store_meters
        self.link = link  # Replication, Following or None (nokvfs.fs.replication)
        self.read_only_why = read_only_why
        self.maintenance = maintenance  # nokvfs.fs.maintenance.Maintenance, None when off
        self.started_monotonic = time.monotonic()
        self.started_unix = time.time()

    def mode(self) -> str:
        from nokvfs.fs.replication import Following

        if isinstance(self.link, Following):
            return "follower"
        if self.fs.tree.read_only:
            return "read-only"
        return "owner"

    def snapshot(self) -> dict:
        from nokvfs.fs import spools

        files = self.fs.files
        live_spools, kept, kept_bytes, reasons = 0, 0, 0, {}
        for spool in spools.scan(self.data_dir):
            if spool.live:
                live_spools += 1
                continue
            kept += 1
            kept_bytes += max(0, spool.size)
            why = str(spool.record.get("reason") or spool.record.get("state") or "unknown").split(":", 1)[0]
            reasons[why] = reasons.get(why, 0) + 1
        shard = self.root.shard
        version = shard.commit_version
        cache = getattr(self.root.blocks, "cache", None)
        return {
            "mountpoint": self.mountpoint,
            "data_dir": self.data_dir,
            "pid": os.getpid(),
            "mode": self.mode(),
            "read_only_reason": self.read_only_why or (None if not self.fs.tree.read_only else "read-only mount"),
            "started_unix": int(self.started_unix),
            "uptime_s": round(time.monotonic() - self.started_monotonic, 3),
            **_memory(),
            "publications": files.meters["publication"].snapshot(),
            "reads": files.meters["read"].snapshot(),
            "writes": files.meters["write"].snapshot(),
            "xattrs": {"offered": self.fs.xattrs.offered, "calls": self.fs.xattrs.calls},
            "store": self.store_meters.snapshot(),
            "syscall_timeouts": self.workers.timeouts,
            "spools": {
                "open": len(self.fs.open_spools()),
                "live": live_spools,
                "kept": kept,
                "kept_bytes": kept_bytes,
                "kept_by_reason": reasons,
            },
            "block_cache": self._cache(cache),
            "memory_blocks": {
                "bytes": self.fetcher.held_bytes,
                "max_bytes": self.fetcher.memory_bytes,
                "fetched": self.fetcher.fetched,
                "prefetched": self.fetcher.prefetched,
                "hits": self.fetcher.hits,
            },
            "change_feed": {
                "shard_commit_version": version,
                "followed_commit_version": self.follower.last_version,
                "versions_behind": max(0, version - self.follower.last_version),
                "events_followed": self.follower.events_seen,
            },
            "replication": self._replication(),
            "write_back": self._write_back(),
            "shard": self._shard(),
            "maintenance": self._maintenance(),
        }

    def _shard(self) -> dict:
        used, size = self.root.shard.space()
        return {"file_bytes": size, "used_bytes": used}

    def _maintenance(self) -> dict | None:
        m = self.maintenance
        if m is None:
            return None
        return {
            "interval_s": m.interval,
            "passes": m.passes,
            "freed_revisions": m.freed_revisions,
            "compactions": m.compactions,
            "compacted_bytes": m.compacted_bytes,
        }

    def _write_back(self) -> dict | None:
        """`--write-back`: files accepted at close and not published yet, and the totals."""
        publisher = getattr(self.fs.files, "writeback", None)
        if publisher is None:
            return None
        return {
            "backlog": publisher.backlog,
            "accepted": publisher.accepted,
            "published": publisher.published,
            "failed": publisher.failed,
        }

    @staticmethod
    def _cache(cache) -> dict | None:
        if cache is None:
            return None
        stats = cache.stats()
        looked = stats.hits + stats.misses
        return {
            "bytes": stats.bytes,
            "max_bytes": stats.max_bytes,
            "entries": stats.entries,
            "hits": stats.hits,
            "misses": stats.misses,
            "hit_rate": round(stats.hits / looked, 4) if looked else None,
            "evictions": stats.evictions,
            "corrupt_drops": stats.corrupt_drops,
        }

    def _replication(self) -> dict | None:
        from nokvfs.fs.replication import Following, Replication

        link = self.link
        if isinstance(link, Following):
            lag = link.lag()
            return {"role": "follower", "started": lag is not None, **({} if lag is None else lag.to_json())}
        if isinstance(link, Replication):
            replicator = link.replicator
            applied = self.root.shard.recovery_tail.applied_lsn
            if replicator is None:
                return {"role": "owner", "bucket": link.url, "started": False, "local_lsn": applied}
            error = replicator.last_error
            return {
                "role": "owner",
                "bucket": link.url,
                "started": True,
                "local_lsn": applied,
                "shipped_lsn": replicator.shipped_lsn,
                "records_behind": max(0, applied - replicator.shipped_lsn),
                "last_push_unix": None if replicator.last_push_at is None else int(replicator.last_push_at),
                "seconds_since_push": None
                if replicator.last_push_at is None
                else round(max(0.0, time.time() - replicator.last_push_at), 3),
                "fenced": bool(replicator.fenced),
                "last_error": None if error is None else f"{type(error).__name__}: {error}",
            }
        return None


class StatusServer:
    """Answers each connection to the mount's socket with one snapshot (owner and root only)."""

    def __init__(self, path: str, snapshot):
        self.path = path
        self.snapshot = snapshot
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fd, address = _short_address(self.path)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            old = os.umask(0o177)  # the socket is created 0600 (bind has no mode argument)
            try:
                sock.bind(address)
            finally:
                os.umask(old)
            os.chmod(address, 0o600)
        finally:
            os.close(fd)
        sock.listen(8)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="nokvfs-status", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # stop() shut the socket down
                return
            with conn:
                conn.settimeout(QUERY_TIMEOUT)
                try:
                    self._answer(conn)
                except Exception as exc:  # noqa: BLE001 - a status query must never take the mount down
                    log.warning("status query failed: %s: %s", type(exc).__name__, exc)

    def _answer(self, conn: socket.socket) -> None:
        pid, uid, gid = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        if uid not in (0, os.getuid()):
            log.warning(
                "status query from uid %d (pid %d) refused: only uid %d and root may ask", uid, pid, os.getuid()
            )
            conn.sendall(
                json.dumps({"error": f"permission denied: only uid {os.getuid()} and root may ask this mount"}).encode()
                + b"\n"
            )
            return
        conn.sendall(json.dumps(self.snapshot(), sort_keys=True).encode() + b"\n")

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            # shutdown(2) wakes the accept(2) the serving thread is blocked in (close alone does
            # not), so an unmount does not wait for it; a timeout to poll instead cost every
            # unmount up to that long.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._thread is not None:
            self._thread.join(2.0)
        try:
            os.unlink(self.path)
        except OSError:
            pass


def query(data_dir: str, mountpoint: str, *, timeout: float = QUERY_TIMEOUT) -> dict:
    """The status document of the mount of `data_dir` at `mountpoint`."""
    path = socket_path(data_dir, os.path.abspath(mountpoint))
    try:
        fd, address = _short_address(path)
    except PermissionError:
        raise MountUnavailable(
            f"permission denied: the status of {mountpoint} is its owner's and root's to ask"
        ) from None
    except OSError as exc:
        raise MountUnavailable(f"no status channel for {mountpoint} in {data_dir}: {exc.strerror}") from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(address)
                chunks, size = [], 0
                while size <= MAX_ANSWER:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
            except FileNotFoundError:
                raise MountUnavailable(f"{mountpoint} has no running nokvfs daemon for {data_dir}") from None
            except ConnectionRefusedError:
                raise MountUnavailable(
                    f"the daemon of {mountpoint} is gone (a stale socket in {data_dir}/run)"
                ) from None
            except PermissionError:
                raise MountUnavailable(
                    f"permission denied: the status of {mountpoint} is its owner's and root's to ask"
                ) from None
            except TimeoutError:
                raise MountUnavailable(f"the daemon of {mountpoint} did not answer within {timeout:g} s") from None
    finally:
        os.close(fd)
    try:
        document = json.loads(b"".join(chunks))
    except ValueError:
        raise MountUnavailable(f"the daemon of {mountpoint} sent no status document") from None
    if "error" in document:
        raise MountUnavailable(f"{mountpoint}: {document['error']}")
    return document
