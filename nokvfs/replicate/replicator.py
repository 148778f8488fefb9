"""The Replicator: ships one local logical shard to its keys in a bucket.

push_once        reads `current`, ships the local outbox records after its head as one increment
                 pack, and publishes generation + 1 by conditional write (the first push publishes
                 a checkpoint of the whole shard as generation 1). After `checkpoint_packs`
                 active increments it runs a checkpoint; a failed checkpoint never fails the push.
checkpoint_once  builds a checkpoint of the stable prefix (a compacted LMDB copy taken inside one
                 read transaction, so writers are never blocked), makes sure an increment ends
                 exactly at the copy's LSN, uploads the pack, and swaps it in for that prefix by
                 the same compare-and-swap, keeping every later increment and retaining the
                 replaced generation(s). Only after that write succeeded does cleanup run, and
                 the checkpoint's through point is recorded as the shard's durable horizon
                 (nokvfs.engine.horizon): retention truncates the local outbox behind it.
run_forever      push_once every `interval` seconds (at once again while a push left lag), until
                 stop() or until the owner is fenced; `start()` runs it in a daemon thread, as the
                 mount daemon's `--replicate s3://...` does. `status()` reports the lag.
claim_ownership  makes this shard (restored to the bucket's head) the owner: advances the local
                 owner epoch through `Shard.advance_owner_epoch` and publishes it.
wait_shipped     blocks until the increment holding an LSN is in the bucket (or raises): the
                 primitive of a mount's `--sync` close.

Given its data directory (`data_dir`), the Replicator also keeps the bucket's data directory
record (nokvfs.replicate.datadir_record: configuration and the root's placement) equal to the
local one -- published once per process after its first accepted push, and again after a claim
-- and, when it finds itself fenced, records that in the directory (nokvfs.workspace.replica:
role "fenced", with the LSN range of local records the bucket never received), so every later
command on the directory fails with OwnerFenced, not only those of this process.

Ownership and fencing. `current` names its owner twice: `ownerId`, a UUIDv7 the owning shard
keeps in `replica-owner.json` in its LMDB directory (written by the first publication and by a
claim, never replicated), and `ownerEpoch`, the owner epoch of the shard state at the head (the
first checkpoint's, raised by every published OwnerEpochAdvance record). A machine that restored
the shard takes over with `claim_ownership`: a new owner id, the local epoch advanced through the
engine's own `Shard.advance_owner_epoch`, and both published by the same conditional write as
any increment. A Replicator that reads a `current` naming another owner id, or an epoch newer
than its local shard's, stops writing for good: that push and every later one raise
OwnerFenced; with fence_local (the default) it first raises its local shard's owner epoch to the
bucket's, through `Shard.advance_owner_epoch`. Every facade of the old owner holds the epoch it
was built with (nokvfs.workspace.root.Root captures it), so each of its later commands fails in
the engine with the typed OwnerFenced error. A process started later on the fenced machine reads
the old owner id from its file and is fenced as well, even though its epoch now matches.

Independently of ownership, nothing is published unless the local outbox extends the bucket's
chain exactly (ReplicaDiverged otherwise), so the bucket's history stays one linear chain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.engine import horizon
from nokvfs.engine.records import OwnerEpochRecord
from nokvfs.errors import (
    CanonicalJsonError,
    FormatError,
    HistoryNotRetained,
    OwnerFenced,
    PreconditionFailed,
)
from nokvfs.objects.store import ObjectStore
from nokvfs.replicate import manifest as mf
from nokvfs.replicate.datadir_record import DataDirRecord
from nokvfs.replicate.errors import NotShipped, ReplicaDiverged
from nokvfs.replicate.manifest import (
    CheckpointDescriptor,
    IncrementDescriptor,
    Manifest,
    Retained,
)
from nokvfs.replicate.packs import build_increment, write_checkpoint_pack
from nokvfs.replicate.remote import CleanupReport, Contention, ShardBucket, open_remote
from nokvfs.schema import canonical_json
from nokvfs.schema.enums import OutboxRecordKind

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_PACKS = 256
DEFAULT_RETAINED_CHECKPOINTS = 1
DEFAULT_MAX_PACK_RECORDS = 4096
DEFAULT_MAX_PACK_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_ATTEMPTS = 32
OWNER_FILE = "replica-owner.json"  # in the shard's directory: the owner id this shard publishes as


@dataclass(frozen=True)
class PushResult:
    """What one push published. kind: "checkpoint" (the first publication), "increment" or "none"."""

    kind: str
    generation: int
    first_lsn: int | None = None
    last_lsn: int | None = None
    key: str | None = None
    lag: int = 0  # local records still after the bucket's head once this push finished

    @property
    def records(self) -> int:
        return 0 if self.first_lsn is None else self.last_lsn - self.first_lsn + 1


@dataclass(frozen=True)
class Fencing:
    """Why a replicator stopped writing: who publishes `current` now, the owner epoch this shard
    had (its commands are built at it), and its records the bucket never received: the LSNs
    `unshipped` (None: none), where a first LSN of 0 means the bucket no longer holds any point
    of this shard's chain, so where the unshipped records start is unknown."""

    reason: str
    owned_epoch: int
    unshipped: tuple[int, int] | None

    def describe_unshipped(self) -> str:
        if self.unshipped is None:
            return "every record of this shard is in the bucket"
        first, last = self.unshipped
        if first == 0:
            return (
                f"records up to LSN {last} may not be in the bucket (it holds no point of this shard's chain any more)"
            )
        return f"LSNs {first}..{last} of this shard were never shipped to the bucket"


@dataclass(frozen=True)
class CheckpointResult:
    generation: int
    through_generation: int
    through_lsn: int
    key: str
    compacted: int  # increments the checkpoint replaced
    cleanup: CleanupReport | None


class Replicator:
    """Replicates `shard` to `store` (keys under `shards/<logical shard hex>/`). Thread-safe."""

    def __init__(
        self,
        shard,
        store: ObjectStore,
        *,
        checkpoint_packs: int = DEFAULT_CHECKPOINT_PACKS,
        retained_checkpoints: int = DEFAULT_RETAINED_CHECKPOINTS,
        max_pack_records: int = DEFAULT_MAX_PACK_RECORDS,
        max_pack_bytes: int = DEFAULT_MAX_PACK_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        auto_checkpoint: bool = True,
        fence_local: bool = True,
        work_dir: str | None = None,
        data_dir: str | None = None,
        on_fenced=None,
    ):
        if checkpoint_packs < 1 or retained_checkpoints < 0 or max_pack_records < 1 or max_attempts < 1:
            raise ValueError("checkpoint_packs, max_pack_records and max_attempts must be >= 1, retained >= 0")
        self.shard = shard
        self.bucket = ShardBucket(store, shard.logical_shard_id)
        self.checkpoint_packs = checkpoint_packs
        self.retained_checkpoints = retained_checkpoints
        self.max_pack_records = max_pack_records
        self.max_pack_bytes = max_pack_bytes
        self.max_attempts = max_attempts
        self.auto_checkpoint = auto_checkpoint
        self.fence_local = fence_local
        self.work_dir = work_dir or os.path.dirname(os.path.abspath(shard.path))
        self._lock = threading.RLock()  # one read-modify-write of `current` at a time in-process
        self.owner_id = self._load_owner_id()  # None: this shard has never owned the bucket keys
        self._fenced_by: str | None = None  # why this replicator stopped writing, for good
        self.fencing: Fencing | None = None
        self.data_dir = data_dir
        self.endpoint_url: str | None = None  # the bucket's S3 endpoint, when opened from a URL
        self.on_fenced = on_fenced  # called once, with the Fencing, from the thread that found it
        self._datadir_synced = False
        # The bucket's head as this owner last saw it accepted: wait_shipped's condition.
        self.shipped_lsn = 0
        self._shipped = threading.Condition()
        self._wake = threading.Event()
        self._pending_cleanup: int | None = None  # a cutoff whose cleanup left errors to retry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_push: PushResult | None = None
        self.last_push_at: float | None = None
        self.last_error: BaseException | None = None

    @classmethod
    def from_url(cls, shard, url: str, *, endpoint_url: str | None = None, region: str | None = None, **options):
        """A Replicator for `s3://bucket/prefix` (or any object store URL `open_store` takes)."""
        bucket = open_remote(url, logical_shard_id=shard.logical_shard_id, endpoint_url=endpoint_url, region=region)
        replicator = cls(shard, bucket.store, **options)
        replicator.endpoint_url = endpoint_url
        return replicator

    @classmethod
    def for_data_dir(cls, data_dir: str, shard, url: str, *, endpoint_url: str | None = None, **options):
        """A Replicator of the data directory `data_dir` (whose open shard is `shard`)."""
        return cls.from_url(shard, url, endpoint_url=endpoint_url, data_dir=data_dir, **options)

    # --- fencing ------------------------------------------------------------------------------

    @property
    def fenced(self) -> bool:
        return self._fenced_by is not None

    def _owner_path(self) -> str:
        return os.path.join(self.shard.path, OWNER_FILE)

    def _load_owner_id(self) -> str | None:
        try:
            with open(self._owner_path(), "rb") as f:
                data = canonical_json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, CanonicalJsonError) as exc:
            raise FormatError(f"{self._owner_path()} does not parse: {exc}") from None
        if (
            not isinstance(data, dict)
            or set(data) != {"logicalShardId", "ownerId"}
            or data["logicalShardId"] != self.shard.logical_shard_id.hex()
            or not mf.is_uuid7_hex(data["ownerId"])
        ):
            raise FormatError(f"{self._owner_path()} is not this shard's owner record")
        return data["ownerId"]

    def _save_owner_id(self, owner_id: str) -> None:
        """Record (durably, atomically) that this local shard publishes as `owner_id`."""
        path = self._owner_path()
        record = {"logicalShardId": self.shard.logical_shard_id.hex(), "ownerId": owner_id}
        filemodes.replace_atomically(path, canonical_json.dumps(record))
        self.owner_id = owner_id

    def _is_owner(self, manifest: Manifest, *, claiming: bool = False) -> bool:
        """`current` names this shard's owner id at an epoch no newer than the local one (or,
        claiming, at an epoch older than the one the claim advanced to)."""
        local = self.shard.owner_epoch
        if manifest.owner_id == self.owner_id and manifest.owner_epoch <= local:
            return True
        return claiming and manifest.owner_epoch < local

    def _check_owner(self, manifest: Manifest | None, *, claiming: bool = False) -> None:
        """OwnerFenced unless this shard is the owner `current` names (or, claiming, is newer).

        The owner is `current`'s ownerId at an owner epoch no newer than the local shard's. Once
        fenced, a Replicator stays fenced; with `fence_local` it first raises the local owner
        epoch to the bucket's, so commands built at the old epoch fail in the engine.
        """
        if self._fenced_by is None and manifest is not None and not self._is_owner(manifest, claiming=claiming):
            local = self.shard.owner_epoch
            self._fenced_by = (
                f"{self.bucket.url}current is published by owner {manifest.owner_id} at owner epoch "
                f"{manifest.owner_epoch}; this shard (owner {self.owner_id}, epoch {local}) is not the owner"
            )
            fencing = Fencing(self._fenced_by, local, self.unshipped(manifest))
            if self.fence_local and local < manifest.owner_epoch:
                try:
                    self.shard.advance_owner_epoch(manifest.owner_epoch)
                except OwnerFenced:
                    pass  # the local epoch moved on meanwhile: fenced either way
            self._fenced(fencing)
        if self._fenced_by is not None:
            raise OwnerFenced(self._fenced_by + ", so this replicator stops writing")

    def _fenced(self, fencing: Fencing) -> None:
        """Record the fencing: in the data directory's role, for waiters, for the caller's hook."""
        self.fencing = fencing
        log.error("%s; %s", fencing.reason, fencing.describe_unshipped())
        if self.data_dir is not None:
            from nokvfs.workspace import replica

            try:
                replica.write_role(
                    self.data_dir,
                    replica.ReplicaRole(
                        replica.FENCED,
                        self.bucket.store.url,
                        self.endpoint_url,
                        self.shard.logical_shard_id,
                        owned_epoch=max(1, fencing.owned_epoch),
                        unshipped=fencing.unshipped,
                        reason=f"{fencing.reason}; {fencing.describe_unshipped()}",
                    ),
                )
            except OSError as exc:
                log.error("cannot record the fencing in %s: %s", self.data_dir, exc)
        with self._shipped:
            self._shipped.notify_all()
        if self.on_fenced is not None:
            try:
                self.on_fenced(fencing)
            except Exception:
                log.exception("the on_fenced hook failed")

    def unshipped(self, manifest: Manifest) -> tuple[int, int] | None:
        """The local LSNs the bucket's chain does not hold: after the newest point (a checkpoint's
        through point, an increment's start or end) at which the bucket's chain digest is the local
        outbox's, through the local tail. None when the bucket holds the whole local outbox."""
        tail = self.shard.recovery_tail.applied_lsn
        points = set()
        for checkpoint, increments in [(manifest.checkpoint, manifest.increments)] + [
            (r.checkpoint, r.increments) for r in manifest.retained
        ]:
            points.add((checkpoint.through_lsn, checkpoint.chain_digest))
            for inc in increments:
                points.add((inc.first_lsn - 1, inc.previous_chain_digest))
                points.add((inc.last_lsn, inc.chain_digest))
        for lsn, digest in sorted(points, reverse=True):
            if lsn > tail:
                continue
            try:
                local, _ = self.shard.outbox_after(lsn, max_records=0)
            except HistoryNotRetained:
                break  # truncated behind this point: older points cannot be compared either
            if local == digest:
                return None if lsn == tail else (lsn + 1, tail)
        return None if tail == 0 else (0, tail)

    def _note_shipped(self, manifest: Manifest) -> None:
        with self._shipped:
            if manifest.head.lsn > self.shipped_lsn:
                self.shipped_lsn = manifest.head.lsn
                self._shipped.notify_all()

    def _entries_after(self, manifest: Manifest, *, through_lsn: int | None = None):
        """The local outbox entries after the bucket's head, checking the local chain extends it."""
        head = manifest.head
        digest, entries = self.shard.outbox_after(
            head.lsn, through_lsn=through_lsn, max_records=self.max_pack_records, max_bytes=self.max_pack_bytes
        )
        if digest is None:
            raise ReplicaDiverged(
                f"the bucket's head is LSN {head.lsn} but the local shard ends at "
                f"{self.shard.recovery_tail.applied_lsn}: the local shard is behind the bucket (restore it)"
            )
        if digest != head.chain_digest:
            raise ReplicaDiverged(
                f"the local outbox's chain digest at LSN {head.lsn} differs from the bucket's head: "
                "another history was published"
            )
        return entries

    def _lag(self, manifest: Manifest | None) -> int:
        local = self.shard.recovery_tail.applied_lsn
        return local if manifest is None else max(0, local - manifest.head.lsn)

    # --- push ---------------------------------------------------------------------------------

    def push_once(self, *, through_lsn: int | None = None, checkpoint: bool | None = None) -> PushResult:
        """Ship the local records after the bucket's head (up to `through_lsn`) as one increment.

        Contention is merged and retried up to `max_attempts`; the first publication is a
        checkpoint. Raises OwnerFenced unless `current` names this shard as its owner, and
        ReplicaDiverged unless the local outbox extends the bucket's chain.
        """
        with self._lock:
            result, manifest = self._push(through_lsn)
            self.last_push, self.last_push_at = result, time.time()
        self._note_shipped(manifest)
        if not self._datadir_synced:
            self._sync_datadir_quietly()
        due = self.auto_checkpoint if checkpoint is None else checkpoint
        if due and result.kind == "increment" and len(manifest.increments) >= self.checkpoint_packs:
            self._checkpoint_quietly()
        elif self._pending_cleanup is not None:
            self._cleanup_quietly(self._pending_cleanup)
        return result

    def _push(self, through_lsn: int | None, *, claiming: bool = False) -> tuple[PushResult, Manifest]:
        built: tuple | None = None  # (first, last, bytes, sha256): reused while the range holds
        for _ in range(self.max_attempts):
            self._check_owner(None)
            manifest, etag = self.bucket.read()
            if manifest is None:
                try:
                    manifest = self._publish_first()
                except Contention:
                    continue
                return PushResult(
                    "checkpoint", 1, 1, manifest.head.lsn, manifest.checkpoint.key, self._lag(manifest)
                ), manifest
            self._check_owner(manifest, claiming=claiming)
            entries = self._entries_after(manifest, through_lsn=through_lsn)
            if not entries:
                return PushResult("none", manifest.generation, lag=self._lag(manifest)), manifest
            first, last = entries[0].lsn, entries[-1].lsn
            if built is None or built[:2] != (first, last):
                data = build_increment(self.shard.logical_shard_id, manifest.head.chain_digest, entries)
                built = (first, last, data, _sha256(data))
            data, sha = built[2], built[3]
            generation = manifest.next_generation()
            publication = mf.new_uuid7_hex()
            increment = IncrementDescriptor(
                generation=generation,
                publication=publication,
                first_lsn=first,
                last_lsn=last,
                previous_chain_digest=manifest.head.chain_digest,
                chain_digest=entries[-1].header.chain_digest,
                commit_version=entries[-1].header.commit_version,
                key=mf.increment_key(generation, publication),
                sha256=sha,
                size=len(data),
            )
            # A lost race re-uploads under the new generation's key: the descriptor's generation
            # and its key always agree, and a pack is never published under a key a concurrent
            # cleanup may consider old.
            self.bucket.upload(
                increment.key, data=data, sha256=sha, size=len(data), kind="increment", generation=generation
            )
            # The bucket's owner epoch is the owner epoch of the state at its head.
            epoch = max([manifest.owner_epoch, *_advanced_epochs(entries)])
            proposal = manifest.with_increment(increment, epoch, self.owner_id)
            try:
                accepted, _ = self.bucket.publish(proposal, etag)
            except Contention as exc:
                log.info("push of LSNs %d..%d lost a race (%s); merging", first, last, exc)
                continue
            return PushResult(
                "increment", accepted.generation, first, last, increment.key, self._lag(accepted)
            ), accepted
        raise PreconditionFailed(f"{self.bucket.url}current: no push won after {self.max_attempts} attempts")

    def _publish_first(self) -> Manifest:
        """Generation 1: a checkpoint of the whole local shard, created with If-None-Match: *."""
        if self.owner_id is None:
            self._save_owner_id(mf.new_uuid7_hex())
        with self._workspace() as work:
            point, data_dir = self._copy(work)
            path, sha, size = self._pack(work, point, data_dir)
            checkpoint = _checkpoint_descriptor(point, 1, sha, size)
            self.bucket.upload(checkpoint.key, path=path, sha256=sha, size=size, kind="checkpoint", generation=1)
        proposal = Manifest(
            logical_shard_id=self.shard.logical_shard_id,
            generation=1,
            owner_epoch=point.owner_epoch,
            owner_id=self.owner_id,
            publication_id=checkpoint.publication,
            head=checkpoint.through,
            checkpoint=checkpoint,
        )
        accepted, _ = self.bucket.publish(proposal, None)
        self._record_horizon(point)
        return accepted

    def _record_horizon(self, point) -> None:
        """The checkpoint `current` now names holds everything up to its through point: the
        local recovery outbox may be truncated behind it (nokvfs.engine.horizon). Best effort:
        a horizon not recorded only keeps records longer."""
        try:
            horizon.record(self.shard.path, self.shard.logical_shard_id, point.applied_lsn, point.chain_digest)
        except OSError as exc:
            log.warning(
                "the durable horizon of %s (LSN %d) was not recorded: %s", self.shard.path, point.applied_lsn, exc
            )

    # --- checkpoints --------------------------------------------------------------------------

    def checkpoint_once(self, *, force: bool = True) -> CheckpointResult | None:
        """Replace the stable prefix with a checkpoint; None when there is nothing to compact.

        Without `force`, only when the active tail holds at least `checkpoint_packs` increments.
        Neither the copy nor the upload holds the push lock: pushes go on meanwhile, and the swap
        keeps every increment published after the checkpoint's cutoff.
        """
        manifest, _ = self.bucket.read()
        self._check_owner(manifest)
        if manifest is None:
            self.push_once(checkpoint=False)  # the first publication is a checkpoint
            return None
        if not force and len(manifest.increments) < self.checkpoint_packs:
            return None
        with self._workspace() as work:
            point, data_dir = self._copy(work)
            if point.applied_lsn <= manifest.checkpoint.through_lsn:
                return None
            # The checkpoint must end exactly where an increment ends: publish up to the copy.
            while manifest.head.lsn < point.applied_lsn:
                if self.push_once(through_lsn=point.applied_lsn, checkpoint=False).kind == "none":
                    break
                manifest, _ = self.bucket.read()
                self._check_owner(manifest)
            cutoff = next((i for i in manifest.increments if i.last_lsn == point.applied_lsn), None)
            if cutoff is None:
                log.info("checkpoint at LSN %d is not aligned with an increment; discarded", point.applied_lsn)
                return None
            if cutoff.chain_digest != point.chain_digest:
                raise ReplicaDiverged(f"the bucket's chain at LSN {point.applied_lsn} differs from the local copy's")
            path, sha, size = self._pack(work, point, data_dir)
            checkpoint = _checkpoint_descriptor(point, cutoff.generation, sha, size)
            self.bucket.upload(
                checkpoint.key, path=path, sha256=sha, size=size, kind="checkpoint", generation=cutoff.generation
            )
        with self._lock:
            swapped = self._swap_in(checkpoint, cutoff)
        if swapped is None:
            return None
        accepted, compacted = swapped
        self._record_horizon(point)
        report = self._cleanup_quietly(cutoff.generation)
        return CheckpointResult(
            accepted.generation, cutoff.generation, point.applied_lsn, checkpoint.key, compacted, report
        )

    def _swap_in(self, checkpoint: CheckpointDescriptor, cutoff: IncrementDescriptor):
        """CAS the checkpoint in for the prefix ending at `cutoff` while the latest manifest still
        has that exact prefix: (accepted manifest, increments replaced), or None when a competing
        checkpoint removed the prefix (our pack is then simply unreferenced)."""
        for _ in range(self.max_attempts):
            latest, etag = self.bucket.read()
            self._check_owner(latest)
            position = next((n for n, i in enumerate(latest.increments) if i == cutoff), None)
            if position is None:
                log.info(
                    "a competing checkpoint replaced the prefix through generation %d; ours is discarded",
                    cutoff.generation,
                )
                return None
            publication = mf.new_uuid7_hex()
            replaced = Retained(latest.checkpoint, latest.increments[: position + 1], cutoff.end)
            proposal = Manifest(
                logical_shard_id=latest.logical_shard_id,
                generation=latest.next_generation(),
                owner_epoch=latest.owner_epoch,
                owner_id=latest.owner_id,
                publication_id=publication,
                head=latest.head,
                checkpoint=dataclasses.replace(checkpoint, publication=publication),
                increments=latest.increments[position + 1 :],
                retained=((replaced,) + latest.retained)[: self.retained_checkpoints],
            )
            try:
                accepted, _ = self.bucket.publish(proposal, etag)
            except Contention:
                continue  # a lost race costs one more manifest rewrite, never another build
            return accepted, position + 1
        raise PreconditionFailed(f"{self.bucket.url}current: the checkpoint swap lost {self.max_attempts} races")

    def _copy(self, work: str):
        """A consistent compacted copy of the local shard in `work`: (CopyPoint, its directory)."""
        data_dir = os.path.join(work, "copy")
        os.mkdir(data_dir, filemodes.DIR_MODE)
        return self.shard.copy_to(data_dir), data_dir

    def _pack(self, work: str, point, data_dir: str):
        """Frame the copy into a checkpoint pack: (path, SHA-256, size); the copy is removed."""
        path = os.path.join(work, "checkpoint.pack")
        sha, size = write_checkpoint_pack(
            os.path.join(data_dir, "data.mdb"),
            path,
            logical_shard_id=self.shard.logical_shard_id,
            through_lsn=point.applied_lsn,
            commit_version=point.commit_version,
            chain_digest=point.chain_digest,
            owner_epoch=point.owner_epoch,
        )
        shutil.rmtree(data_dir)
        return path, sha, size

    def _checkpoint_quietly(self) -> None:
        try:
            self.checkpoint_once(force=False)
        except Exception as exc:  # noqa: BLE001 - a checkpoint failure never changes an accepted push
            log.warning("checkpoint of %s failed: %s", self.bucket.url, exc)

    def _cleanup_quietly(self, cutoff: int) -> CleanupReport | None:
        try:
            report = self.bucket.cleanup(cutoff, owner_id=self.owner_id)
        except Exception as exc:  # noqa: BLE001 - cleanup failure never fails a push or a checkpoint
            log.warning("cleanup of %s through generation %d failed: %s", self.bucket.url, cutoff, exc)
            self._pending_cleanup = cutoff
            return None
        self._pending_cleanup = cutoff if report.errors or report.stopped else None
        return report

    def _workspace(self):
        return tempfile.TemporaryDirectory(prefix=".nokvfs-replicate-", dir=self.work_dir)

    # --- ownership ----------------------------------------------------------------------------

    def claim_ownership(self) -> PushResult:
        """Become the owner: a new owner id, the local owner epoch advanced past the bucket's
        through `Shard.advance_owner_epoch`, and both published by the conditional write.

        The local shard must extend the bucket's chain (typically: just restored from it). If
        the previous owner publishes in between, the push diverges and is refused (restore
        again); if another claimant wins, this one is fenced.
        """
        with self._lock:
            manifest, _ = self.bucket.read()
            if manifest is None:
                raise ReplicaDiverged(f"{self.bucket.url}current does not exist: there is nothing to claim")
            self._entries_after(manifest)
            self._save_owner_id(mf.new_uuid7_hex())
            self.shard.advance_owner_epoch(max(manifest.owner_epoch, self.shard.owner_epoch) + 1)
            self._fenced_by = None
            self.fencing = None
            result, manifest = self._push(None, claiming=True)
            self.last_push, self.last_push_at = result, time.time()
        self._note_shipped(manifest)
        self._datadir_synced = False
        self._sync_datadir_quietly()  # the claim stands even if this must wait for the next push
        return result

    # --- the data directory record ------------------------------------------------------------

    def sync_datadir(self) -> DataDirRecord:
        """Publish the data directory's configuration and placement if the bucket's record differs.

        Written only by the owner `current` names (checked on the latest manifest before each
        attempt), by the conditional write; a lost race rereads and compares again.
        """
        from nokvfs.workspace import datadir

        if self.data_dir is None:
            raise ValueError("this Replicator was not given its data directory")
        config, placement = datadir.describe(self.data_dir)
        for _ in range(self.max_attempts):
            manifest, _ = self.bucket.read()
            self._check_owner(manifest)
            existing, etag = self.bucket.read_datadir()
            proposal = DataDirRecord.from_data_dir(
                config,
                placement,
                generation=1 if existing is None else existing.next_generation(),
                publication_id=mf.new_uuid7_hex(),
            )
            if existing is not None and existing.same_content(proposal):
                self._datadir_synced = True
                return existing
            try:
                accepted = self.bucket.publish_datadir(proposal, etag)
            except Contention:
                continue
            self._datadir_synced = True
            log.info("published the data directory record of %s as generation %d", self.data_dir, accepted.generation)
            return accepted
        raise PreconditionFailed(f"{self.bucket.url}datadir: no write won after {self.max_attempts} attempts")

    def _sync_datadir_quietly(self) -> None:
        if self.data_dir is None:
            return
        try:
            self.sync_datadir()
        except OwnerFenced:
            raise
        except Exception as exc:  # noqa: BLE001 - retried after the next push; never fails this one
            log.warning(
                "publishing the data directory record to %s failed (retried after the next push): %s",
                self.bucket.url,
                exc,
            )

    # --- durability at close --------------------------------------------------------------------

    def wait_shipped(self, lsn: int, timeout: float) -> int:
        """Block until the bucket's accepted head is at or past `lsn`; returns that head's LSN.

        The loop (start()) is woken to push at once, so concurrent waiters share pushes; without
        a running loop the caller's thread pushes itself. Raises OwnerFenced once this shard is
        fenced, ReplicaDiverged if the loop stopped on it, and NotShipped (a StoreError, with
        the last push failure) when `timeout` seconds pass first.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._shipped:
                if self.shipped_lsn >= lsn:
                    return self.shipped_lsn
            if self._fenced_by is not None:
                raise OwnerFenced(self._fenced_by + f": LSN {lsn} will never be shipped")
            if isinstance(self.last_error, ReplicaDiverged) and not self.running:
                raise ReplicaDiverged(f"replication stopped ({self.last_error}): LSN {lsn} will never be shipped")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                why = (
                    ""
                    if self.last_error is None
                    else f" (last push failure: {type(self.last_error).__name__}: {self.last_error})"
                )
                raise NotShipped(
                    f"the increment holding LSN {lsn} is not in {self.bucket.url} after {timeout:g} s; the bucket's "
                    "head "
                    f"is LSN {self.shipped_lsn}{why}"
                )
            if self.running:
                self._wake.set()
                with self._shipped:
                    if self.shipped_lsn < lsn and self._fenced_by is None:
                        self._shipped.wait(min(remaining, 1.0))
            else:
                try:
                    self.push_once()
                except (OwnerFenced, ReplicaDiverged):
                    raise
                except Exception as exc:  # noqa: BLE001 - retried until the deadline
                    self.last_error = exc
                    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- status and the loop --------------------------------------------------------------------

    def status(self) -> dict:
        """The bucket's manifest summary and the local shard's lag behind it."""
        manifest, _ = self.bucket.read()
        tail = self.shard.recovery_tail
        status = {
            "bucket": self.bucket.url,
            "logical_shard_id": self.shard.logical_shard_id.hex(),
            "local_applied_lsn": tail.applied_lsn,
            "local_commit_version": self.shard.commit_version,
            "local_owner_epoch": self.shard.owner_epoch,
            "local_owner_id": self.owner_id,
            "fenced": self.fenced or (manifest is not None and not self._is_owner(manifest)),
            "lag": self._lag(manifest),
            "last_push_unix": None if self.last_push_at is None else int(self.last_push_at),
            "last_error": None if self.last_error is None else f"{type(self.last_error).__name__}: {self.last_error}",
            "generation": 0,
        }
        if manifest is not None:
            status.update(
                generation=manifest.generation,
                owner_epoch=manifest.owner_epoch,
                owner_id=manifest.owner_id,
                head_lsn=manifest.head.lsn,
                head_commit_version=manifest.head.commit_version,
                checkpoint_through_lsn=manifest.checkpoint.through_lsn,
                checkpoint_through_generation=manifest.checkpoint.through_generation,
                increments=len(manifest.increments),
                retained=[r.checkpoint.through_generation for r in manifest.retained],
            )
            if status["fenced"]:
                # Once fenced, the local outbox also holds the epoch advance that fenced it.
                unshipped = self.fencing.unshipped if self.fencing is not None else self.unshipped(manifest)
                status["unshipped"] = None if unshipped is None else list(unshipped)
            record, _ = self.bucket.read_datadir()
            status["datadir_generation"] = 0 if record is None else record.generation
        return status

    def run_forever(self, interval: float = 1.0) -> None:
        """Push every `interval` seconds until `stop()`; returns at once when fenced or diverged.

        Lag is bounded: a push that left records behind (pack limits) is followed immediately by
        the next. Other failures are recorded in `last_error`, logged, and retried.
        """
        self._stop.clear()
        while not self._stop.is_set():
            self._wake.clear()
            try:
                result = self.push_once()
                self.last_error = None
                if result.lag and result.kind != "none":
                    continue
            except (OwnerFenced, ReplicaDiverged) as exc:
                self.last_error = exc
                log.error("replication of %s stopped: %s", self.bucket.url, exc)
                with self._shipped:
                    self._shipped.notify_all()
                return
            except Exception as exc:  # noqa: BLE001 - keep replicating through transient failures
                self.last_error = exc
                log.warning("push to %s failed: %s", self.bucket.url, exc)
            self._wake.wait(interval)  # wait_shipped and stop() cut the wait short

    def start(self, interval: float = 1.0) -> threading.Thread:
        """Run `run_forever(interval)` in a daemon thread (the mount daemon's --replicate)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the replicator is already running")
        self._thread = threading.Thread(target=self.run_forever, args=(interval,), name="nokvfs-replicate", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def _checkpoint_descriptor(point, through_generation: int, sha256: bytes, size: int) -> CheckpointDescriptor:
    """The descriptor of a checkpoint pack of `point` (its publication is set when it is proposed)."""
    checkpoint_id = mf.new_uuid7_hex()
    return CheckpointDescriptor(
        id=checkpoint_id,
        publication=mf.new_uuid7_hex(),
        through_generation=through_generation,
        through_lsn=point.applied_lsn,
        commit_version=point.commit_version,
        chain_digest=point.chain_digest,
        key=mf.checkpoint_key(through_generation, checkpoint_id),
        sha256=sha256,
        size=size,
    )


def _advanced_epochs(entries) -> list[int]:
    return [
        OwnerEpochRecord.decode(e.payload).owner_epoch
        for e in entries
        if e.header.record_kind == OutboxRecordKind.OwnerEpochAdvance
    ]


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
