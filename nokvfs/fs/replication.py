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
"""

from __future__ import annotations

import logging
import threading

from nokvfs.errors import InvalidInput

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0
MAX_RETRY_DELAY = 60.0
STOP_TIMEOUT = 60.0  # seconds to wait for a push in flight when the mount ends
CONNECT_JOIN_TIMEOUT = 1.0  # an open of the bucket still in flight at unmount is abandoned


class Replication:
    def __init__(self, shard, url: str, *, endpoint_url: str | None = None, interval: float = DEFAULT_INTERVAL):
        self.shard = shard
        self.url = url
        self.endpoint_url = endpoint_url
        self.interval = interval
        self.replicator = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connector: threading.Thread | None = None

    def start(self) -> None:
        """Open the bucket and start the loop in the background (returns at once)."""
        self._connector = threading.Thread(target=self._connect, name="nokvfs-replicate-open", daemon=True)
        self._connector.start()

    def _connect(self) -> None:
        from nokvfs.replicate import Replicator

        delay = min(self.interval, MAX_RETRY_DELAY)
        while not self._stop.is_set():
            try:
                replicator = Replicator.from_url(self.shard, self.url, endpoint_url=self.endpoint_url)
            except (InvalidInput, ValueError) as exc:
                log.error("replication to %s not started: %s: %s (the mount goes on without it)", self.url, type(exc).__name__, exc)
                return
            except Exception as exc:  # noqa: BLE001 - replication must never crash the mount
                log.warning("cannot open %s yet (%s: %s); retrying in %.3g s", self.url, type(exc).__name__, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
                continue
            with self._lock:
                if self._stop.is_set():
                    return  # the mount ended while the bucket was being opened
                try:
                    replicator.start(self.interval)
                except Exception as exc:  # noqa: BLE001
                    log.error("replication to %s not started: %s: %s", self.url, type(exc).__name__, exc)
                    return
                self.replicator = replicator
            log.info("replicating shard %s to %s every %.3g s", self.shard.logical_shard_id.hex(), self.url, self.interval)
            return

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
                "replication to %s never started: this mount shipped nothing; `nokvfs shard push --to %s` ships the shard",
                self.url, self.url,
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
                self.url, type(exc).__name__, exc, self.url,
            )
            return
        log.info(
            "last push to %s: %s, generation %d, %d record(s), lag %d",
            self.url, result.kind, result.generation, result.records, result.lag,
        )
