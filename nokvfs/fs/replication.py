"""`nokvfs mount ... --replicate s3://bucket/prefix`: ship the shard to a bucket while mounted.

Once the mount is live, a background thread opens the bucket (`Replicator.from_url(root.shard,
url, endpoint_url=...)`) and starts the replicator's loop in its own daemon thread: one push every
`interval` seconds, at once again while a push left lag (nokvfs.replicate.replicator). A bucket
that cannot be opened yet (no network at boot, a bucket not created yet) is retried with a
growing delay (up to a minute); only a malformed URL gives up. At unmount -- after the kernel has
let go, so nothing can be written any more -- the loop is stopped and one last push ships
whatever the last seconds wrote, before the shard is closed.

Replication never takes the mount down and never holds up the mount's start. Every failure is
logged (the replicator retries transient push failures by itself) and the mount goes on serving;
a last push that fails, or replication that never started, is logged with the command that ships
the rest (`nokvfs shard push --to URL`); the shard itself stays intact.

The mount's hooks into replication (the rest of this module is the mount's business only):

    Replication.on_fenced(reason)   set by the daemon: called once, from the replication thread,
                                    when another owner took the shard over. The data directory is
                                    already marked fenced and the shard's owner epoch advanced (so
                                    every command this mount builds fails with OwnerFenced); the
                                    mount must refuse changes from now on (EROFS) and say why.
    Replication.wait_shipped(lsn, timeout)
                                    blocks until the increment holding `lsn` is in the bucket (the
                                    primitive of `--sync`): OwnerFenced, NotShipped (a StoreError)
                                    or ReplicaDiverged otherwise.
    Following                       `--follow URL` (or a follower data directory): the follower
                                    engine (nokvfs.replicate.follower) replaying the bucket's
                                    increments into the shard the mount reads, started once the
                                    mount is live, stopped at unmount; `lag()` for `nokvfs status`.
    bucket_link(...)                which of the two a data directory gets, and whether it must
                                    mount read-only (a follower, a fenced owner) and why.
"""

from __future__ import annotations

import logging
import threading
import time

from nokvfs.errors import InvalidInput

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0
MAX_RETRY_DELAY = 60.0
STOP_TIMEOUT = 60.0  # seconds to wait for a push in flight when the mount ends
CONNECT_JOIN_TIMEOUT = 1.0  # an open of the bucket still in flight at unmount is abandoned


class Replication:
    def __init__(
        self,
        shard,
        url: str,
        *,
        endpoint_url: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        data_dir: str | None = None,
    ):
        self.shard = shard
        self.url = url
        self.endpoint_url = endpoint_url
        self.interval = interval
        self.data_dir = data_dir
        self.on_fenced = None  # the daemon's hook: on_fenced(reason: str)
        self.replicator = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connector: threading.Thread | None = None
        self._connected = threading.Event()

    def start(self) -> None:
        """Open the bucket and start the loop in the background (returns at once)."""
        self._connector = threading.Thread(target=self._connect, name="nokvfs-replicate-open", daemon=True)
        self._connector.start()

    def _connect(self) -> None:
        from nokvfs.replicate import Replicator

        replicator = _open_until_stopped(
            lambda: Replicator.from_url(
                self.shard, self.url, endpoint_url=self.endpoint_url, data_dir=self.data_dir, on_fenced=self._fenced
            ),
            self._stop,
            self.interval,
            what=f"replication to {self.url}",
            target=self.url,
            meanwhile="the mount goes on without it",
        )
        if replicator is None:
            return
        with self._lock:
            if self._stop.is_set():
                return  # the mount ended while the bucket was being opened
            try:
                replicator.start(self.interval)
            except Exception as exc:  # noqa: BLE001
                log.error("replication to %s not started: %s: %s", self.url, type(exc).__name__, exc)
                return
            self.replicator = replicator
            self._connected.set()
        log.info("replicating shard %s to %s every %.3g s", self.shard.logical_shard_id.hex(), self.url, self.interval)

    def _fenced(self, fencing) -> None:
        """The replicator found another owner (it logged why and what was never shipped)."""
        if self.on_fenced is not None:
            self.on_fenced(f"{fencing.reason}; {fencing.describe_unshipped()}")

    def wait_shipped(self, lsn: int, timeout: float) -> int:
        """Block until the increment holding `lsn` is in the bucket (see Replicator.wait_shipped)."""
        from nokvfs.replicate.errors import NotShipped

        deadline = time.monotonic() + timeout
        if not self._connected.wait(timeout):
            raise NotShipped(
                f"replication to {self.url} has not started yet: LSN {lsn} is not shipped after {timeout:g} s"
            )
        replicator = self.replicator
        if replicator is None:
            raise NotShipped(f"replication to {self.url} has stopped: LSN {lsn} is not shipped")
        return replicator.wait_shipped(lsn, max(0.0, deadline - time.monotonic()))

    def stop_blocking(self) -> None:
        """Stop the loop and push once more (the mount is already unmounted)."""
        self._stop.set()
        if self._connector is None:
            return  # the mount never became live
        self._connector.join(CONNECT_JOIN_TIMEOUT)
        with self._lock:
            replicator, self.replicator = self.replicator, None
        if replicator is None:
            log.error(
                "replication to %s never started: this mount shipped nothing; `nokvfs shard push --to %s` ships the "
                "shard",
                self.url,
                self.url,
            )
            return
        try:
            replicator.stop(timeout=STOP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001
            log.error("stopping replication to %s: %s: %s", self.url, type(exc).__name__, exc)
        if replicator.fenced:
            log.error("replication to %s was fenced (%s): no last push", self.url, replicator.last_error)
            return
        try:
            result = replicator.push_once()
        except Exception as exc:  # noqa: BLE001
            log.error(
                "last push to %s failed (%s: %s); the shard is intact here: `nokvfs shard push --to %s` ships the rest",
                self.url,
                type(exc).__name__,
                exc,
                self.url,
            )
            return
        log.info(
            "last push to %s: %s, generation %d, %d record(s), lag %d",
            self.url,
            result.kind,
            result.generation,
            result.records,
            result.lag,
        )


class Following:
    """The follower engine behind a read-only mount of a follower data directory.

    `root` was opened on the directory (its shard is a nokvfs.workspace.replica.ReplicaShard):
    the follower replays the bucket's increments into that shard, so the mount's change feed
    (nokvfs.fs.freshness) sees the owner's ChangeEvent rows and invalidates as on the owner.
    """

    def __init__(
        self,
        data_dir: str,
        root,
        *,
        endpoint_url: str | None = None,
        interval: float | None = None,
        lag_warning: float | None = None,
    ):
        from nokvfs.replicate import follower

        self.data_dir = data_dir
        self.root = root
        self.endpoint_url = endpoint_url
        self.interval = follower.DEFAULT_INTERVAL if interval is None else interval
        self.lag_warning = follower.DEFAULT_LAG_WARNING if lag_warning is None else lag_warning
        self.follower = None
        self.on_fenced = None  # never called: a follower owns nothing
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connector: threading.Thread | None = None

    def start(self) -> None:
        """Open the bucket and start following in the background (returns at once); an
        unreachable bucket is retried with a growing delay, the mount serving its last state."""
        self._connector = threading.Thread(target=self._connect, name="nokvfs-follow-open", daemon=True)
        self._connector.start()

    def _connect(self) -> None:
        from nokvfs.replicate.follower import Follower

        follower = _open_until_stopped(
            lambda: Follower.attach(
                self.data_dir, self.root.shard, endpoint_url=self.endpoint_url, lag_warning=self.lag_warning
            ),
            self._stop,
            self.interval,
            what=f"following the bucket of {self.data_dir}",
            target=f"the bucket of {self.data_dir}",
            meanwhile="the mount serves its last state",
        )
        if follower is None:
            return
        with self._lock:
            if self._stop.is_set():
                follower.bucket.store.close()
                return
            follower.start(self.interval)
            self.follower = follower
        log.info("following %s every %.3g s into %s", follower.bucket.url, self.interval, self.data_dir)

    def lag(self):
        """The follower's Lag (nokvfs.replicate.follower.Lag), None until it follows."""
        return None if self.follower is None else self.follower.lag()

    def stop_blocking(self) -> None:
        self._stop.set()
        if self._connector is not None:
            self._connector.join(CONNECT_JOIN_TIMEOUT)
        with self._lock:
            follower, self.follower = self.follower, None
        if follower is not None:
            follower.stop(timeout=STOP_TIMEOUT)


def _open_until_stopped(open_, stop: threading.Event, interval: float, *, what: str, target: str, meanwhile: str):
    """open_()'s result, retried with a delay growing from `interval` to MAX_RETRY_DELAY while it
    fails (no network at boot, a bucket not created yet); None once `stop` is set or when the
    failure cannot heal (a malformed URL). The mount never waits for this."""
    delay = min(interval, MAX_RETRY_DELAY)
    while not stop.is_set():
        try:
            return open_()
        except (InvalidInput, ValueError) as exc:
            log.error("%s not started: %s: %s (%s)", what, type(exc).__name__, exc, meanwhile)
            return None
        except Exception as exc:  # noqa: BLE001 - the link to the bucket must never crash the mount
            log.warning("cannot open %s yet (%s: %s); retrying in %.3g s", target, type(exc).__name__, exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)
    return None


def bootstrap_follower(url: str, data_dir: str, *, endpoint_url: str | None = None) -> None:
    """`--follow URL`: make `data_dir` a follower of the bucket before it is opened (a fresh
    directory downloads the checkpoint and the increments; an existing one is checked)."""
    from nokvfs.replicate.follower import bootstrap

    bootstrap(url, data_dir, endpoint_url=endpoint_url)


def bucket_link(
    data_dir: str,
    root,
    *,
    replicate: str | None,
    replicate_endpoint_url: str | None = None,
    replicate_interval: float = DEFAULT_INTERVAL,
    follow_endpoint_url: str | None = None,
    follow_interval: float | None = None,
    lag_warning: float | None = None,
):
    """(the mount's link to its bucket or None, why the mount must be read-only or None).

    A follower data directory follows its bucket (and is read-only); a fenced one is read-only
    and links to nothing; otherwise `--replicate URL` replicates.
    """
    from nokvfs.workspace import replica

    role = replica.read_role(data_dir)
    if role is not None and role.role == replica.FOLLOWER:
        if replicate:
            log.warning("--replicate %s ignored: %s follows %s", replicate, data_dir, role.bucket)
        link = Following(
            data_dir, root, endpoint_url=follow_endpoint_url, interval=follow_interval, lag_warning=lag_warning
        )
        return link, f"{data_dir} is a follower of {role.bucket}"
    if role is not None and role.role == replica.FENCED:
        return None, f"{data_dir} is fenced: {role.reason}"
    if not replicate:
        return None, None
    return Replication(
        root.shard, replicate, endpoint_url=replicate_endpoint_url, interval=replicate_interval, data_dir=data_dir
    ), None
