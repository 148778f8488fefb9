"""Followers: a data directory kept a read-only replica of the shard a bucket holds.

    bootstrap(url, data_dir)   makes `data_dir` a follower data directory (restore_data_dir: the
                               checkpoint, the increments, placement and configuration), or
                               checks that an existing one follows that bucket
    Follower.poll_once()       applies the increments published since the last poll
    Follower.start(interval)   polls in a daemon thread (the mount's `--follow`)
    Follower.lag()             versions, records and seconds behind the bucket (also written to
                               `<data_dir>/run/follower.json` after each poll, for `nokvfs status`)

A poll costs one HEAD of `current` when nothing changed. Otherwise the follower reads `current`
(validated as a whole), finds the increment holding its next LSN in the active tail or in a
retained generation's (which are contiguous: each retained tail runs to the checkpoint that
replaced it), downloads and verifies each pack and replays its records through the engine's own
write entrypoints (nokvfs.replicate.restore.replay; a follower's shard is opened without a flush
per commit, and flushed once per poll), so the follower's shard gets exactly the
owner's rows -- its ChangeEvent rows included, which is what lets a follower's mount invalidate
its kernel cache from the replayed change feed as the owner's mount does from its own.

Re-bootstrap. When the increments it needs are gone (cleaned up behind a newer checkpoint after
the follower was away longer than the retained generations cover), or its shard is not on the
bucket's chain, the follower restores the current checkpoint into `.shard-bootstrap-*` beside
its shard, renames it into place and swaps it into the ReplicaShard the mount reads through
(nokvfs.workspace.replica.ReplicaShard.replace): the mount stays up, and since ChangeEvent rows
are never truncated the change feed continues from the version it had reached. The old
environment is closed only after RETIRE_GRACE seconds, so reads in flight on it finish.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.engine.shard import Shard
from nokvfs.errors import InvalidInput, NokvError, NotFound
from nokvfs.replicate.errors import PackMissing, ReplayFailed
from nokvfs.replicate.manifest import IncrementDescriptor, Manifest
from nokvfs.replicate.remote import ShardBucket, locate, open_remote
from nokvfs.replicate.restore import fetch_increment, replay, restore, restore_data_dir
from nokvfs.schema import canonical_json
from nokvfs.schema.ids import id16_from_hex, uuid7_unix_ms

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0  # seconds between polls of `current`
DEFAULT_LAG_WARNING = 10.0  # seconds behind (or without a successful poll) before the lag is logged
LAG_LOG_EVERY = 30.0  # a persisting lag is logged again at most this often
RETIRE_GRACE = 10.0  # seconds a replaced shard environment stays open for reads in flight
STATUS_NAME = "follower.json"  # in <data_dir>/run/
_LEFTOVER = re.compile(r"\.shard-(bootstrap|retired)-[0-9a-f]{32}")


def default_cache_dir(url: str, endpoint_url: str | None = None) -> str:
    """`$XDG_CACHE_HOME/nokvfs/follow/<bucket-prefix>-<hash>` (~/.cache when unset): one per
    bucket prefix and endpoint, so following two buckets never mixes their directories."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    parsed = urllib.parse.urlsplit(url)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{parsed.netloc}{parsed.path}").strip("-.")[:80] or "bucket"
    digest = hashlib.sha256(f"{url.rstrip('/')}\0{endpoint_url or ''}".encode()).hexdigest()[:12]
    return os.path.join(base, "nokvfs", "follow", f"{slug}-{digest}")


def bootstrap(url: str, data_dir: str, *, endpoint_url: str | None = None, logical_shard_id: bytes | str | None = None):
    """Make `data_dir` a follower of `url` (restore it when absent or empty), or check that it
    already is one of that bucket and shard; returns its ReplicaRole."""
    from nokvfs.workspace import replica

    data_dir = os.path.abspath(data_dir)
    if not os.path.exists(os.path.join(data_dir, "nokvfs.json")):
        log.info("bootstrapping follower %s from %s", data_dir, url)
        restore_data_dir(url, data_dir, logical_shard_id=logical_shard_id, endpoint_url=endpoint_url)
        return replica.read_role(data_dir)
    role = replica.read_role(data_dir)
    if role is None or role.role != replica.FOLLOWER:
        raise InvalidInput(
            f"{data_dir} is a data directory but not a follower (role {None if role is None else role.role})"
        )
    store_url, shard = locate(url)  # offline: an existing follower mounts while the bucket is unreachable
    if shard is None and logical_shard_id is not None:
        shard = (
            logical_shard_id
            if isinstance(logical_shard_id, bytes)
            else id16_from_hex(logical_shard_id, "logical shard id")
        )
    shard = shard or role.logical_shard_id
    if store_url != role.bucket or shard != role.logical_shard_id:
        raise InvalidInput(
            f"{data_dir} follows shard {role.logical_shard_id.hex()} of {role.bucket}, not {url}: choose another "
            "--cache-dir"
        )
    _remove_leftovers(data_dir)
    shard_dir = os.path.join(data_dir, "shard")
    damage = _damage(shard_dir)
    if damage is not None:
        # A crash between the two renames of a re-bootstrap, or a system crash while replayed
        # commits were not flushed yet: the follower's shard is a cache, rebuilt from the bucket.
        log.warning("%s: %s; restoring its shard from %s", data_dir, damage, role.bucket)
        shutil.rmtree(shard_dir, ignore_errors=True)
        bucket = open_remote(
            role.bucket, logical_shard_id=role.logical_shard_id, endpoint_url=endpoint_url or role.endpoint_url
        )
        try:
            restore(bucket, shard_dir)
        finally:
            bucket.store.close()
    return role


def _damage(shard_dir: str) -> str | None:
    """Why the follower's shard cannot be used as it is (None: it opens and verifies)."""
    if not os.path.exists(os.path.join(shard_dir, "data.mdb")):
        return "it has no shard (an interrupted re-bootstrap)"
    try:
        Shard.open(shard_dir, verify=True).close()
    except Exception as exc:  # noqa: BLE001 - a torn file can fail in LMDB itself (lmdb.BadTxnError)
        return f"its shard does not open and verify ({type(exc).__name__}: {exc})"
    return None


def _remove_leftovers(data_dir: str) -> None:
    for name in os.listdir(data_dir):
        if _LEFTOVER.fullmatch(name):
            shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)


@dataclass(frozen=True)
class Lag:
    """How far a follower is behind the bucket, as of its last successful poll."""

    bucket: str
    generation: int  # of `current`
    head_lsn: int
    head_commit_version: int
    local_lsn: int
    local_commit_version: int
    versions_behind: int  # commit versions the bucket has that this follower does not
    records_behind: int  # outbox records likewise
    seconds_behind: float  # age of the oldest published increment not applied yet (0: caught up)
    seconds_since_poll: float | None  # since the last successful poll (None: none yet)
    rebootstraps: int
    last_error: str | None

    def to_json(self) -> dict:
        """The fields, with the two durations as integer milliseconds (canonical JSON has no floats)."""
        out = dataclasses.asdict(self)
        behind, since = out.pop("seconds_behind"), out.pop("seconds_since_poll")
        out["behind_ms"] = int(behind * 1000)
        out["since_poll_ms"] = None if since is None else int(since * 1000)
        return out


@dataclass(frozen=True)
class PollResult:
    records: int  # outbox records replayed by this poll
    increments: int
    rebootstrapped: bool
    generation: int


class _Restart(Exception):
    """A pack vanished while it was read: reread `current` and plan again."""


class Follower:
    """Keeps the follower data directory `data_dir` current with its bucket.

    `shard` is the directory's ReplicaShard (the one its Root reads through, so a mount sees
    every replayed command and a re-bootstrap's new shard); the follower alone writes through it.
    """

    def __init__(self, data_dir: str, shard, bucket: ShardBucket, *, lag_warning: float = DEFAULT_LAG_WARNING):
        self.data_dir = os.path.abspath(data_dir)
        self.shard = shard
        self.bucket = bucket
        self.lag_warning = lag_warning
        self._lock = threading.Lock()  # one poll at a time
        self._etag: str | None = None
        self._manifest: Manifest | None = None
        self._behind_since: float | None = None  # unix time of the oldest unapplied publication
        self._last_poll: float | None = None
        self._last_lag_log = 0.0
        self._retired: list[tuple[float, object, str]] = []  # (retired at, shard, its directory)
        self.rebootstraps = 0
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def attach(cls, data_dir: str, shard, *, endpoint_url: str | None = None, **options) -> Follower:
        """The Follower of a follower data directory whose ReplicaShard is `shard`."""
        from nokvfs.workspace import replica

        role = replica.read_role(data_dir)
        if role is None or role.role != replica.FOLLOWER:
            raise InvalidInput(f"{data_dir} is not a follower data directory")
        bucket = open_remote(
            role.bucket, logical_shard_id=role.logical_shard_id, endpoint_url=endpoint_url or role.endpoint_url
        )
        return cls(data_dir, shard, bucket, **options)

    # --- one poll ------------------------------------------------------------------------------

    def poll_once(self) -> PollResult:
        """Apply whatever the bucket published since the last poll (re-bootstrapping if needed)."""
        with self._lock:
            try:
                result = self._poll()
            except BaseException as exc:
                self.last_error = exc
                raise
            self.last_error = None
            self._last_poll = time.time()
            self._retire_old()
        self._report()
        return result

    def _poll(self) -> PollResult:
        etag = self.bucket.current_etag()
        if etag is None:
            raise NotFound(f"{self.bucket.url}current does not exist: nothing to follow")
        if etag == self._etag and self._manifest is not None and self._local().applied_lsn == self._manifest.head.lsn:
            return PollResult(0, 0, False, self._manifest.generation)
        for _ in range(3):
            manifest, etag = self.bucket.read()
            if manifest is None:
                raise NotFound(f"{self.bucket.url}current does not exist: nothing to follow")
            try:
                records, increments, rebooted = self._catch_up(manifest)
            except _Restart:
                continue
            finally:
                self.shard.inner.sync()  # one flush per poll, not one per replayed record
            self._manifest, self._etag = manifest, etag
            self._behind_since = None
            return PollResult(records, increments, rebooted, manifest.generation)
        raise PackMissing(f"{self.bucket.url}: packs kept disappearing while the follower read them")

    def _local(self):
        return self.shard.inner.recovery_tail

    def _catch_up(self, manifest: Manifest) -> tuple[int, int, bool]:
        local = self._local()
        head = manifest.head
        if local.applied_lsn == head.lsn and local.chain_digest == head.chain_digest:
            return 0, 0, False
        plan = None if local.applied_lsn >= head.lsn else _plan(manifest, local.applied_lsn)
        if plan is None:
            why = (
                f"its shard (LSN {local.applied_lsn}) is not on the bucket's chain (head LSN {head.lsn})"
                if local.applied_lsn >= head.lsn
                else f"the increments after its LSN {local.applied_lsn} were cleaned up behind a newer checkpoint"
            )
            self._rebootstrap(why)
            return 0, 0, True
        self._behind_since = uuid7_unix_ms(bytes.fromhex(plan[0].publication)) / 1000
        records = 0
        for increment in plan:
            try:
                pack = fetch_increment(self.bucket, increment)
            except PackMissing:
                raise _Restart() from None
            try:
                for entry in pack.entries:
                    if entry.lsn > self._local().applied_lsn:
                        replay(self.shard.inner, entry)
                        records += 1
            except ReplayFailed as exc:
                self._rebootstrap(f"a record does not replay onto its shard ({exc})")
                return records, 0, True
        return records, len(plan), False

    def _rebootstrap(self, why: str) -> None:
        """Restore the bucket's checkpoint beside the shard and swap it in (see the module docstring)."""
        log.warning("follower %s re-bootstraps from %s: %s", self.data_dir, self.bucket.url, why)
        fresh = os.path.join(self.data_dir, f".shard-bootstrap-{uuid.uuid4().hex}")
        retired = os.path.join(self.data_dir, f".shard-retired-{uuid.uuid4().hex}")
        shard_dir = os.path.join(self.data_dir, "shard")
        try:
            result = restore(self.bucket, fresh)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        os.rename(shard_dir, retired)
        os.rename(fresh, shard_dir)
        filemodes.fsync_directory(self.data_dir)
        old = self.shard.replace(Shard.open(shard_dir, verify=False, sync=False))
        self._retired.append((time.monotonic(), old, retired))
        self.rebootstraps += 1
        log.info(
            "follower %s re-bootstrapped at generation %d (LSN %d)",
            self.data_dir,
            result.generation,
            result.applied_lsn,
        )

    def _retire_old(self, *, now: float | None = None, force: bool = False) -> None:
        now = time.monotonic() if now is None else now
        keep = []
        for retired_at, shard, directory in self._retired:
            if force or now - retired_at >= RETIRE_GRACE:
                shard.close()
                shutil.rmtree(directory, ignore_errors=True)
            else:
                keep.append((retired_at, shard, directory))
        self._retired = keep

    # --- lag -----------------------------------------------------------------------------------

    def lag(self) -> Lag:
        manifest = self._manifest
        shard = self.shard.inner
        local, version = shard.recovery_tail.applied_lsn, shard.commit_version
        now = time.time()
        head_lsn = local if manifest is None else manifest.head.lsn
        head_version = version if manifest is None else manifest.head.commit_version
        behind = self._behind_since
        if manifest is not None and behind is None and local < head_lsn:
            plan = _plan(manifest, local)
            behind = uuid7_unix_ms(bytes.fromhex(plan[0].publication)) / 1000 if plan else now
        return Lag(
            bucket=self.bucket.url,
            generation=0 if manifest is None else manifest.generation,
            head_lsn=head_lsn,
            head_commit_version=head_version,
            local_lsn=local,
            local_commit_version=version,
            versions_behind=max(0, head_version - version),
            records_behind=max(0, head_lsn - local),
            seconds_behind=0.0 if behind is None else max(0.0, now - behind),
            seconds_since_poll=None if self._last_poll is None else max(0.0, now - self._last_poll),
            rebootstraps=self.rebootstraps,
            last_error=None if self.last_error is None else f"{type(self.last_error).__name__}: {self.last_error}",
        )

    def _report(self) -> None:
        """Write the lag for `nokvfs status`, and log it when it is over the threshold."""
        lag = self.lag()
        write_status(self.data_dir, lag)
        stale = max(lag.seconds_behind, lag.seconds_since_poll or 0.0)
        if stale > self.lag_warning and time.monotonic() - self._last_lag_log >= LAG_LOG_EVERY:
            self._last_lag_log = time.monotonic()
            log.warning(
                "follower %s is %d version(s) and %.1f s behind %s (last successful poll %.1f s ago%s)",
                self.data_dir,
                lag.versions_behind,
                lag.seconds_behind,
                lag.bucket,
                lag.seconds_since_poll or 0.0,
                f"; last error {lag.last_error}" if lag.last_error else "",
            )

    # --- the loop ------------------------------------------------------------------------------

    def run_forever(self, interval: float = DEFAULT_INTERVAL) -> None:
        """Poll every `interval` seconds until stop(); failures are logged and retried."""
        while not self._stop.is_set():
            try:
                self.poll_once()
            except NokvError as exc:
                log.warning("following %s: %s: %s", self.bucket.url, type(exc).__name__, exc)
                self._report()
            except Exception:
                log.exception("following %s: unexpected failure", self.bucket.url)
                self._report()
            self._stop.wait(interval)

    def start(self, interval: float = DEFAULT_INTERVAL) -> threading.Thread:
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the follower is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self.run_forever, args=(interval,), name="nokvfs-follow", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop polling; close the shards a re-bootstrap replaced (not the current one: its owner closes it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            self._retire_old(force=True)
        self.bucket.store.close()


def _plan(manifest: Manifest, local_lsn: int) -> list[IncrementDescriptor] | None:
    """The increments from the one holding LSN `local_lsn + 1` to the head, across the retained
    generations (oldest first) and the active tail; None if no stored increment holds it."""
    chains = [r.increments for r in reversed(manifest.retained)] + [manifest.increments]
    flat = [increment for chain in chains for increment in chain]
    for index, increment in enumerate(flat):
        if increment.first_lsn <= local_lsn + 1 <= increment.last_lsn:
            return flat[index:]
    return None


# --- the status file ----------------------------------------------------------------------------


def status_path(data_dir: str) -> str:
    return os.path.join(data_dir, "run", STATUS_NAME)


def write_status(data_dir: str, lag: Lag) -> None:
    """`<data_dir>/run/follower.json`: the lag (seconds as integer milliseconds) and who wrote it."""
    path = status_path(data_dir)
    record = {"pid": os.getpid(), "written_unix_ms": int(time.time() * 1000), "lag": lag.to_json()}
    try:
        filemodes.makedirs(os.path.dirname(path))
        with open(path + ".tmp", "wb", opener=filemodes.opener) as f:
            f.write(canonical_json.dumps(record))
        os.rename(path + ".tmp", path)
    except OSError as exc:
        log.debug("cannot write %s: %s", path, exc)


def read_status(data_dir: str) -> dict | None:
    """The last lag a follower of `data_dir` wrote (None if none did): what `nokvfs status` shows."""
    try:
        with open(status_path(data_dir), "rb") as f:
            return canonical_json.loads(f.read())
    except (OSError, NokvError):
        return None
