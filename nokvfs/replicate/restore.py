"""Restore a logical shard from its bucket keys onto a machine that has nothing of it.

1. Read and validate `current` (the whole chain, before any pack is touched).
2. Download the active checkpoint pack straight into a temporary directory beside the target,
   verifying its size and SHA-256 before anything is used, then its framing; open it with the
   engine's full verification (schema gate, outbox chain, every tree's state digest) and check
   its recovery tail and commit clock are the checkpoint's.
3. For each increment: download, verify size and SHA-256, parse and verify its chain, and replay
   every record through the shard's own write entrypoints (nokvfs.engine.replay: `Shard.apply`
   of the exact command, `observe_lease_clock`, `advance_owner_epoch`, and the retention
   entrypoints, which remove exactly the recorded rows) -- checking after each that the shard
   appended exactly that record (same LSN, same chain digest). There is no second apply path.
4. Check the chain end to end: the restored recovery tail is the manifest's head.
5. Rename the temporary directory into place. Any failure removes it: a corrupt or truncated
   pack is an IntegrityError and materialises nothing.

A stale reader that finds a referenced pack gone (a newer checkpoint's cleanup) rereads `current`
and starts again.

`restore_data_dir` rebuilds a whole data directory: the shard as above into `DIR/shard`, then,
from the bucket's data directory record (nokvfs.replicate.datadir_record), the root's placement
in `DIR/control` and the configuration `DIR/nokvfs.json` -- once the restored shard is checked to
carry the root's fence at the record's placement generation. Its replica role
(nokvfs.workspace.replica) is written before the configuration, so the directory is never a
writable data directory by accident: a follower until a claim of ownership succeeds.

`progress(stage, done, total, done_bytes, total_bytes)`, when given, is called as packs arrive
and records replay (stage "restore": records replayed of those after the checkpoint, pack
bytes downloaded of the manifest's total).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.engine import replay as engine_replay
from nokvfs.engine.records import RecoveryTail
from nokvfs.engine.shard import Shard
from nokvfs.errors import AlreadyExists, IntegrityError, NotFound
from nokvfs.replicate.datadir_record import DATADIR, DataDirRecord
from nokvfs.replicate.errors import PackCorrupt, PackMissing, ReplayFailed
from nokvfs.replicate.manifest import CURRENT, IncrementDescriptor, Manifest
from nokvfs.replicate.packs import CheckpointSink, IncrementPack, parse_increment
from nokvfs.replicate.remote import ShardBucket, open_remote
from nokvfs.schema.enums import RootActivationState
from nokvfs.schema.keys import RootFenceKey
from nokvfs.schema.records import RootFence

log = logging.getLogger(__name__)

MAX_RESTARTS = 3


@dataclass(frozen=True)
class RestoreResult:
    path: str
    logical_shard_id: bytes
    generation: int
    applied_lsn: int
    commit_version: int
    owner_epoch: int
    increments: int


def restore(
    bucket_url,
    data_dir_shard_path: str,
    *,
    logical_shard_id: bytes | str | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    progress=None,
) -> RestoreResult:
    """Restore the shard at `bucket_url` into `data_dir_shard_path` (absent or an empty directory).

    `bucket_url` is `s3://bucket/prefix` (optionally ending in `shards/<hex>`) or an ObjectStore;
    `logical_shard_id` is needed only when the prefix holds several shards.
    """
    bucket = open_remote(bucket_url, logical_shard_id=logical_shard_id, endpoint_url=endpoint_url, region=region)
    target = os.path.abspath(data_dir_shard_path)
    if os.path.lexists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise AlreadyExists(f"{target} exists and is not an empty directory: restore needs a fresh one")
    parent = os.path.dirname(target)
    filemodes.makedirs(parent)
    for attempt in range(MAX_RESTARTS + 1):
        manifest, _ = bucket.read()
        if manifest is None:
            raise NotFound(f"{bucket.url}{CURRENT} does not exist: nothing to restore")
        work = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.restore-", dir=parent)
        try:
            result = _materialise(bucket, manifest, work, target, _Progress(manifest, progress))
            _install(work, target)
            return result
        except PackMissing:
            shutil.rmtree(work, ignore_errors=True)
            latest, _ = bucket.read()
            if attempt == MAX_RESTARTS or latest is None or latest.generation == manifest.generation:
                raise
            log.info(
                "a pack of generation %d was removed; restarting from generation %d",
                manifest.generation,
                latest.generation,
            )
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class DataDirRestoreResult:
    data_dir: str
    shard: RestoreResult
    record: DataDirRecord
    config: dict  # the configuration written (the record's, with any store override)
    warnings: tuple[str, ...]  # what the user must know (an object store this machine cannot reach)


def restore_data_dir(
    bucket_url,
    data_dir: str,
    *,
    logical_shard_id: bytes | str | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    store: str | None = None,
    store_endpoint_url: str | None = None,
) -> DataDirRestoreResult:
    """Rebuild a complete data directory at `data_dir` (absent, empty or holding only `run/`) from the bucket, as a
    follower of it (nokvfs.workspace.replica; `Replicator.claim_ownership` makes it the owner).

    `store` / `store_endpoint_url` replace the object store the record names (for example when
    the bytes were copied elsewhere). A failure removes everything this call created.
    """
    from nokvfs.workspace import datadir, replica

    bucket = open_remote(bucket_url, logical_shard_id=logical_shard_id, endpoint_url=endpoint_url, region=region)
    data_dir = os.path.abspath(data_dir)
    # `run/` may be there already: a mount daemon that bootstraps a follower logs into it first.
    if os.path.lexists(data_dir) and (not os.path.isdir(data_dir) or set(os.listdir(data_dir)) - {"run"}):
        raise AlreadyExists(f"{data_dir} exists and is not an empty directory: a restore needs a fresh one")
    existing = set(os.listdir(data_dir)) if os.path.isdir(data_dir) else set()
    record, _ = bucket.read_datadir()
    if record is None:
        raise NotFound(
            f"{bucket.url}{DATADIR} does not exist: the owner has not published its data directory record "
            f"(a push from its data directory does), so only the shard can be restored: "
            f"`nokvfs shard restore --from URL DIR/shard`"
        )
    created = not os.path.exists(data_dir)
    filemodes.makedirs(data_dir)
    try:
        shard_result = restore(bucket, os.path.join(data_dir, "shard"))
        _check_fence(os.path.join(data_dir, "shard"), record)
        config = record.config()
        if store is not None:
            config.update(store=store, endpoint_url=store_endpoint_url, region=None)
        replica.write_role(
            data_dir, replica.ReplicaRole(replica.FOLLOWER, bucket.store.url, endpoint_url, bucket.logical_shard_id)
        )
        datadir.adopt(data_dir, config, record.placement)
    except BaseException:
        if created:
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            for name in set(os.listdir(data_dir)) - existing:
                path = os.path.join(data_dir, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
        raise
    return DataDirRestoreResult(data_dir, shard_result, record, config, tuple(_store_warnings(config)))


def take_ownership(data_dir: str, bucket_url: str, *, endpoint_url: str | None = None):
    """Make the restored data directory `data_dir` the owner of the bucket's shard: claim it
    (a new owner id and an advanced owner epoch, published by the conditional write, which fences
    the old owner), publish the data directory record, then record the role "owner"."""
    from nokvfs.replicate.replicator import Replicator
    from nokvfs.workspace import replica

    role = replica.read_role(data_dir)
    if role is None or role.role != replica.FOLLOWER:
        raise AlreadyExists(
            f"{data_dir} is not a restored follower (its role is {None if role is None else role.role})"
        )
    shard = Shard.open(os.path.join(data_dir, "shard"), verify=False)
    try:
        replicator = Replicator.for_data_dir(data_dir, shard, bucket_url, endpoint_url=endpoint_url)
        try:
            result = replicator.claim_ownership()
            replica.write_role(
                data_dir, replica.ReplicaRole(replica.OWNER, role.bucket, role.endpoint_url, role.logical_shard_id)
            )
            return result, shard.owner_epoch
        finally:
            replicator.bucket.store.close()
    finally:
        shard.close()


def _check_fence(shard_path: str, record: DataDirRecord) -> None:
    """The restored shard must hold the record's root, Active at the record's placement generation."""
    with Shard.open(shard_path, verify=False) as shard:
        with shard.read() as view:
            raw = view.get("root_fence", RootFenceKey(record.root_id).encode())
    fence = None if raw is None else RootFence.decode(raw)
    if (
        fence is None
        or fence.logical_shard_id != record.logical_shard_id
        or (fence.placement_generation != record.placement.placement_generation)
        or fence.activation_state != RootActivationState.Active
    ):
        raise IntegrityError(
            f"the bucket's {DATADIR} record places root {record.root_id.hex()} at generation "
            f"{record.placement.placement_generation}, but the shard's fence is {fence}"
        )


def _store_warnings(config: dict) -> list[str]:
    import urllib.parse

    from nokvfs.objects.local import MARKER_NAME

    url = config["store"]
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("", "file"):
        path = urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else url
        if not os.path.exists(os.path.join(path, MARKER_NAME)):
            return [
                f"the artifact bytes are in {url}, a directory of the owner's machine that is not here: "
                "reads fail until `--store URL` names a copy of it (restore again with `--store`)"
            ]
    return []


class _Progress:
    """The restore's figures for a progress callback: pack bytes downloaded, records replayed."""

    def __init__(self, manifest: Manifest, callback):
        self.callback = callback
        self.records_total = manifest.head.lsn - manifest.checkpoint.through_lsn
        self.bytes_total = manifest.checkpoint.size + sum(i.size for i in manifest.increments)
        self.records = self.bytes = 0

    def downloaded(self, nbytes: int) -> None:
        self.bytes += nbytes
        self._report()

    def replayed(self) -> None:
        self.records += 1
        self._report()

    def _report(self) -> None:
        if self.callback is not None:
            self.callback("restore", self.records, self.records_total, self.bytes, self.bytes_total)


class _CountingSink:
    """A fetch sink that tells `counted` how many bytes each chunk had."""

    def __init__(self, sink, counted):
        self.sink, self.counted = sink, counted

    def write(self, chunk) -> None:
        self.sink.write(chunk)
        self.counted(len(chunk))


def _materialise(bucket: ShardBucket, manifest: Manifest, work: str, target: str, progress: _Progress) -> RestoreResult:
    """Build the restored environment in `work`; nothing outside it is touched."""
    checkpoint = manifest.checkpoint
    sink = CheckpointSink(os.path.join(work, "data.mdb"))
    try:
        bucket.fetch(
            checkpoint.key,
            sha256=checkpoint.sha256,
            size=checkpoint.size,
            sink=_CountingSink(sink, progress.downloaded),
        )
        header = sink.finish()
    finally:
        sink.close()
    expected = (bucket.logical_shard_id, checkpoint.through_lsn, checkpoint.commit_version, checkpoint.chain_digest)
    stated = (header.logical_shard_id, header.through_lsn, header.commit_version, header.chain_digest)
    if stated != expected:
        raise PackCorrupt(f"{checkpoint.key}: its header states another shard or through point than its descriptor")
    # The shard is assembled in a temporary directory and renamed into place only when complete,
    # so replay need not flush each record: one sync at the end makes the whole of it durable.
    shard = Shard.open(work, verify=True, sync=False)
    try:
        if shard.logical_shard_id != bucket.logical_shard_id:
            raise PackCorrupt(f"{checkpoint.key} holds logical shard {shard.logical_shard_id.hex()}")
        if shard.recovery_tail != RecoveryTail(checkpoint.through_lsn, checkpoint.chain_digest) or (
            shard.commit_version != checkpoint.commit_version
        ):
            raise PackCorrupt(f"{checkpoint.key}: the shard inside is not at the checkpoint's through point")
        for increment in manifest.increments:
            pack = fetch_increment(bucket, increment)
            progress.downloaded(increment.size)
            for entry in pack.entries:
                replay(shard, entry)
                progress.replayed()
        head = manifest.head
        if (
            shard.recovery_tail != RecoveryTail(head.lsn, head.chain_digest)
            or shard.commit_version != head.commit_version
        ):
            raise ReplayFailed(f"the restored shard does not end at the manifest's head (LSN {head.lsn})")
        if shard.owner_epoch != manifest.owner_epoch:
            raise ReplayFailed(
                f"the restored owner epoch {shard.owner_epoch} is not the manifest's {manifest.owner_epoch}"
            )
        shard.sync()
        return RestoreResult(
            path=target,
            logical_shard_id=shard.logical_shard_id,
            generation=manifest.generation,
            applied_lsn=head.lsn,
            commit_version=head.commit_version,
            owner_epoch=shard.owner_epoch,
            increments=len(manifest.increments),
        )
    finally:
        shard.close()


def fetch_increment(bucket: ShardBucket, increment: IncrementDescriptor) -> IncrementPack:
    """Download an increment pack, verify size, SHA-256 and framing, and that its header is its descriptor's."""
    pack = parse_increment(bucket.fetch(increment.key, sha256=increment.sha256, size=increment.size))
    stated = (pack.logical_shard_id, pack.first_lsn, pack.last_lsn, pack.previous_chain_digest, pack.chain_digest)
    expected = (
        bucket.logical_shard_id,
        increment.first_lsn,
        increment.last_lsn,
        increment.previous_chain_digest,
        increment.chain_digest,
    )
    if stated != expected:
        raise PackCorrupt(f"{increment.key}: its header differs from its descriptor")
    return pack


# Every record replays through the shard's own entrypoints (one function for restore, the
# follower and a compaction's catch-up).
replay = engine_replay.replay


def _install(work: str, target: str) -> None:
    """Make the restored environment durable, then rename it into place (atomic on one fs)."""
    for name in os.listdir(work):
        if name != "data.mdb":
            os.unlink(os.path.join(work, name))  # lock.mdb: recreated on open
    _fsync_file(os.path.join(work, "data.mdb"))
    filemodes.fsync_directory(work)
    if os.path.isdir(target):
        os.rmdir(target)  # empty, checked before we started
    os.rename(work, target)
    filemodes.fsync_directory(os.path.dirname(target))


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
