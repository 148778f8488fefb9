"""One logical shard's keys in the bucket: reading and conditionally replacing `current`,
uploading and fetching packs with their SHA-256 and size, and cleanup.

Concurrency control is the conditional write of `current` and nothing else (no lock object, no
lease): the first write is `If-None-Match: *`, every later one `If-Match` with the ETag returned
by the read it was built from. 412 is contention (`Contention`: reread, merge, retry). A timeout
after sending (AmbiguousResult) is resolved by rereading `current` and looking for the proposal's
publication id: found means it was accepted (perhaps already built upon), not found means it was
not and the caller merges and retries like after a 412. A late arrival of the lost request
cannot do harm: it carries the old ETag, so at most one of it and the retry wins, and the
manifest's head tells the next push what is already published.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import urllib.parse
from dataclasses import dataclass, field

from nokvfs.errors import (
    AmbiguousResult,
    InvalidInput,
    NotFound,
    ObjectMissing,
    PreconditionFailed,
    StoreError,
)
from nokvfs.objects.local import content_etag
from nokvfs.objects.store import ObjectStore, open_store
from nokvfs.replicate import datadir_record
from nokvfs.replicate import manifest as mf
from nokvfs.replicate.datadir_record import DATADIR, DataDirRecord
from nokvfs.replicate.errors import (
    ManifestError,
    ManifestGenerationInvalid,
    PackConflict,
    PackCorrupt,
    PackMissing,
)
from nokvfs.replicate.manifest import CURRENT, Manifest
from nokvfs.schema.ids import id16_from_hex

log = logging.getLogger(__name__)

META_SHA256 = "nokvfs-sha256"
META_SIZE = "nokvfs-size"
META_KIND = "nokvfs-kind"
META_GENERATION = "nokvfs-generation"
DELETE_BATCH = 1000
FETCH_CHUNK = 16 * 1024 * 1024
_AMBIGUOUS_READS = 5
_SHARD_IN_URL = re.compile(r"(.*?)/?shards/([0-9a-f]{32})/?")


class Contention(Exception):
    """The proposal was not accepted (412, or an ambiguous write that did not land): merge, retry."""


@dataclass
class CleanupReport:
    cutoff: int
    deleted: list[str] = field(default_factory=list)
    kept_live: int = 0
    ignored: int = 0  # keys under the pack namespaces that are not protocol keys
    errors: dict[str, str] = field(default_factory=dict)  # key -> why; retried by a later cleanup
    stopped: str | None = None  # why cleanup stopped early (current unreadable, fenced, ...)


class ShardBucket:
    """The keys of one logical shard under `shards/<hex>/` in `store`."""

    def __init__(self, store: ObjectStore, logical_shard_id: bytes):
        self.store = store
        self.logical_shard_id = logical_shard_id
        self.prefix = mf.shard_prefix(logical_shard_id)
        self._seen: tuple[int, str] | None = None  # (generation, publication) of the newest read
        self._seen_datadir: tuple[int, str] | None = None  # the same for the data directory record
        # Reads (GET through observation) and observations of our own writes are serialised, so
        # a slow reader can never observe an older generation after a newer one was observed.
        self._observing = threading.Lock()

    def key(self, relative: str) -> str:
        return self.prefix + relative

    @property
    def url(self) -> str:
        return f"{self.store.url.rstrip('/')}/{self.prefix}"

    # --- current ------------------------------------------------------------------------------

    def read(self) -> tuple[Manifest | None, str | None]:
        """The validated manifest and the ETag of exactly those bytes, or (None, None) if absent.

        The ObjectStore gives bytes and ETag in separate requests, so the pair is only accepted
        when the ETag is provably the one of these bytes: it is their MD5 (S3 single-part and the
        local store), or two HEADs around the GET agree (each manifest is unique by its
        publication id and generations only grow, so the object cannot change and change back).
        """
        with self._observing:
            return self._read()

    def _read(self) -> tuple[Manifest | None, str | None]:
        data, etag = self._read_bytes(CURRENT)
        if data is None:
            self._check_absent()
            return None, None
        return self._accept(data), etag

    def _read_bytes(self, relative: str) -> tuple[bytes | None, str | None]:
        """The bytes at `relative` and the ETag provably of exactly them, or (None, None)."""
        key = self.key(relative)
        for _ in range(8):
            before = self.store.head(key)
            if before is None:
                return None, None
            try:
                data = self.store.get(key)
            except ObjectMissing:
                continue
            # The etag as S3 makes it (MD5) or as a local-directory bucket does: then no second HEAD.
            if before.etag in (hashlib.md5(data, usedforsecurity=False).hexdigest(), content_etag(data)):
                return data, before.etag
            after = self.store.head(key)
            if after is not None and after.etag == before.etag:
                return data, before.etag
        raise StoreError(f"{self.url}{relative} kept changing while it was read")

    def current_etag(self) -> str | None:
        """The ETag of `current` (one HEAD): a follower polls this and reads only on a change."""
        info = self.store.head(self.key(CURRENT))
        return None if info is None else info.etag

    def _check_absent(self) -> None:
        if self._seen is not None:
            raise ManifestGenerationInvalid(
                f"{self.url}{CURRENT} is absent after generation {self._seen[0]} was read: generations never reset"
            )

    def _accept(self, data: bytes) -> Manifest:
        manifest = mf.loads(data, logical_shard_id=self.logical_shard_id)
        self._observe(manifest)
        return manifest

    def _observe(self, manifest: Manifest) -> None:
        if self._seen is not None:
            generation, publication = self._seen
            if manifest.generation < generation or (
                manifest.generation == generation and manifest.publication_id != publication
            ):
                raise ManifestGenerationInvalid(
                    f"{self.url}{CURRENT} went from generation {generation} to {manifest.generation}"
                    + (" with another publication" if manifest.generation == generation else "")
                    + ": generations increase strictly"
                )
        self._seen = (manifest.generation, manifest.publication_id)

    def publish(self, proposal: Manifest, etag: str | None) -> tuple[Manifest, str]:
        """Replace `current` (etag None: create it) with `proposal`; return (manifest, new etag).

        Raises Contention when the proposal was not accepted. When an ambiguous write is found
        to have been accepted but already built upon, the newer manifest is returned.
        """
        mf.validate(proposal, logical_shard_id=self.logical_shard_id)
        body = proposal.dumps()
        key = self.key(CURRENT)
        try:
            if etag is None:
                new_etag = self.store.put(key, body, if_none_match=True)
            else:
                new_etag = self.store.put(key, body, if_match=etag)
        except PreconditionFailed:
            raise Contention(f"{self.url}{CURRENT} changed since it was read (412)") from None
        except AmbiguousResult as exc:
            log.warning("publishing generation %d to %s: %s; rereading current", proposal.generation, self.url, exc)
            return self._resolve(proposal)
        with self._observing:
            self._observe(proposal)
        return proposal, new_etag

    def _resolve(self, proposal: Manifest) -> tuple[Manifest, str]:
        last: Exception | None = None
        for _ in range(_AMBIGUOUS_READS):
            try:
                latest, etag = self.read()
            except (StoreError, ManifestError) as exc:
                last = exc
                continue
            if latest is not None and proposal.publication_id in latest.publications():
                return latest, etag
            raise Contention(f"publication {proposal.publication_id} is not in {self.url}{CURRENT}: not accepted")
        raise AmbiguousResult(
            f"cannot reread {self.url}{CURRENT} to resolve publication {proposal.publication_id}: {last}"
        )

    # --- the data directory record (nokvfs.replicate.datadir_record) ---------------------------

    def read_datadir(self) -> tuple[DataDirRecord | None, str | None]:
        """The validated data directory record and the ETag of its bytes, or (None, None)."""
        with self._observing:
            data, etag = self._read_bytes(DATADIR)
            if data is None:
                if self._seen_datadir is not None:
                    raise ManifestGenerationInvalid(
                        f"{self.url}{DATADIR} is absent after generation {self._seen_datadir[0]} was read"
                    )
                return None, None
            record = datadir_record.loads(data, logical_shard_id=self.logical_shard_id)
            self._observe_datadir(record)
            return record, etag

    def _observe_datadir(self, record: DataDirRecord) -> None:
        if self._seen_datadir is not None:
            generation, publication = self._seen_datadir
            if record.generation < generation or (
                record.generation == generation and record.publication_id != publication
            ):
                raise ManifestGenerationInvalid(
                    f"{self.url}{DATADIR} went from generation {generation} to {record.generation}: generations "
                    "increase strictly"
                )
        self._seen_datadir = (record.generation, record.publication_id)

    def publish_datadir(self, proposal: DataDirRecord, etag: str | None) -> DataDirRecord:
        """Create (etag None) or replace the data directory record; Contention if not accepted."""
        datadir_record.validate(proposal, logical_shard_id=self.logical_shard_id)
        key = self.key(DATADIR)
        try:
            if etag is None:
                self.store.put(key, proposal.dumps(), if_none_match=True)
            else:
                self.store.put(key, proposal.dumps(), if_match=etag)
        except PreconditionFailed:
            raise Contention(f"{self.url}{DATADIR} changed since it was read (412)") from None
        except AmbiguousResult as exc:
            log.warning("publishing %s generation %d: %s; rereading it", DATADIR, proposal.generation, exc)
            latest, _ = self.read_datadir()
            if latest is not None and latest.publication_id == proposal.publication_id:
                return latest
            raise Contention(
                f"publication {proposal.publication_id} is not in {self.url}{DATADIR}: not accepted"
            ) from None
        with self._observing:
            self._observe_datadir(proposal)
        return proposal

    # --- packs --------------------------------------------------------------------------------

    def upload(
        self,
        relative: str,
        *,
        sha256: bytes,
        size: int,
        kind: str,
        generation: int,
        data: bytes | None = None,
        path: str | None = None,
    ) -> None:
        """Create the pack at `relative` (If-None-Match: *) with its SHA-256 and size as metadata.

        A retry that finds bytes already at the key accepts them only when the recorded SHA-256
        and the size both match; anything else there is PackConflict.
        """
        key = self.key(relative)
        metadata = {META_SHA256: sha256.hex(), META_SIZE: str(size), META_KIND: kind, META_GENERATION: str(generation)}
        for attempt in range(3):
            try:
                if data is not None:
                    self.store.put(key, data, if_none_match=True, metadata=metadata)
                else:
                    self.store.put_file(key, path, if_none_match=True, metadata=metadata)
                return
            except (PreconditionFailed, AmbiguousResult) as exc:
                info = self.store.head(key)
                if info is None:
                    if isinstance(exc, AmbiguousResult) and attempt < 2:
                        continue
                    raise
                if info.size == size and info.metadata.get(META_SHA256) == sha256.hex():
                    return
                raise PackConflict(
                    f"{self.url}{relative} already holds {info.size} bytes with SHA-256 "
                    f"{info.metadata.get(META_SHA256)!r}, not ours ({size} bytes, {sha256.hex()})"
                ) from None

    def fetch(self, relative: str, *, sha256: bytes, size: int, sink=None) -> bytes | None:
        """Download a pack and verify its size and SHA-256 before anything uses it.

        With `sink` (an object with `write(chunk)`), bytes are streamed into it and None is
        returned; the sink must not be trusted unless this returns. Otherwise the bytes are
        returned. A size or digest mismatch is PackCorrupt; an absent pack PackMissing.
        """
        key = self.key(relative)
        info = self.store.head(key)
        if info is None:
            raise PackMissing(f"{self.url}{relative} is referenced by current but absent")
        if info.size != size:
            raise PackCorrupt(f"{self.url}{relative} is {info.size} bytes, its descriptor says {size}")
        h = hashlib.sha256()
        parts = []
        offset = 0
        try:
            while offset < size:
                chunk = self.store.get(key, offset, min(FETCH_CHUNK, size - offset))
                if not chunk:
                    break
                h.update(chunk)
                offset += len(chunk)
                if sink is not None:
                    sink.write(chunk)
                else:
                    parts.append(chunk)
        except ObjectMissing:
            raise PackMissing(f"{self.url}{relative} disappeared while it was read") from None
        if offset != size:
            raise PackCorrupt(f"{self.url}{relative}: read {offset} bytes, its descriptor says {size}")
        if h.digest() != sha256:
            raise PackCorrupt(
                f"{self.url}{relative}: SHA-256 {h.hexdigest()} differs from its descriptor {sha256.hex()}"
            )
        return None if sink is not None else b"".join(parts)

    # --- cleanup ------------------------------------------------------------------------------

    def cleanup(self, cutoff: int, *, owner_id: str | None = None) -> CleanupReport:
        """Delete unreferenced pack keys whose generation is at or before `cutoff`.

        Lists only the two pack namespaces (following every continuation), ignores keys that are
        not protocol keys, rereads and validates `current` before each batch of at most 1,000
        keys and spares every key it references, active or retained; stops if `current` names
        another owner than `owner_id`. `current` is never a candidate. Per-key failures are
        recorded, not raised: a later cleanup lists them again.
        """
        report = CleanupReport(cutoff)
        candidates = []
        for namespace in (mf.CHECKPOINTS, mf.INCREMENTS):
            for info in self.store.list(self.key(namespace)):
                relative = info.key[len(self.prefix) :]
                parsed = mf.parse_pack_key(relative)
                if parsed is None:
                    report.ignored += 1
                elif parsed[1] <= cutoff:
                    candidates.append(relative)
        for start in range(0, len(candidates), DELETE_BATCH):
            batch = candidates[start : start + DELETE_BATCH]
            try:
                manifest, _ = self.read()
            except (StoreError, ManifestError) as exc:
                report.stopped = f"current could not be reread: {exc}"
                return report
            if manifest is None:
                report.stopped = "current is absent"
                return report
            if owner_id is not None and manifest.owner_id != owner_id:
                report.stopped = f"current is published by another owner ({manifest.owner_id})"
                return report
            live = manifest.live_keys()
            for relative in batch:
                if relative in live or relative == CURRENT:
                    report.kept_live += 1
                    continue
                try:
                    self.store.delete(self.key(relative))
                except StoreError as exc:
                    report.errors[relative] = str(exc)
                else:
                    report.deleted.append(relative)
        return report


def open_remote(
    url_or_store,
    *,
    logical_shard_id: bytes | str | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
) -> ShardBucket:
    """The ShardBucket a URL (`s3://bucket/prefix`, optionally ending in `shards/<hex>`) names
    (an ObjectStore stands for its URL; a ShardBucket is returned as it is).

        Without a shard id (in the URL or given), the one shard under the prefix is used: the
        listing only names it, `current` alone decides its state. Several shards: InvalidInput.
    """
    if isinstance(url_or_store, ShardBucket):
        if logical_shard_id is not None and _shard_bytes(logical_shard_id) != url_or_store.logical_shard_id:
            raise InvalidInput(f"{url_or_store.url} is not shard {_shard_bytes(logical_shard_id).hex()}")
        return url_or_store
    if isinstance(url_or_store, ObjectStore):
        store = url_or_store
    else:
        url = url_or_store
        parsed = urllib.parse.urlsplit(url)
        match = _SHARD_IN_URL.fullmatch(parsed.path)
        if match and parsed.scheme == "s3":
            if logical_shard_id is not None and _shard_bytes(logical_shard_id) != bytes.fromhex(match.group(2)):
                raise InvalidInput(f"{url} names shard {match.group(2)}, not {_shard_bytes(logical_shard_id).hex()}")
            logical_shard_id = match.group(2)
            url = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, match.group(1), "", ""))
        store = open_store(url, endpoint_url=endpoint_url, region=region)
    if logical_shard_id is None:
        shards = sorted(
            {
                info.key.split("/")[1]
                for info in store.list("shards/")
                if re.fullmatch(r"shards/[0-9a-f]{32}/current", info.key)
            }
        )
        if not shards:
            raise NotFound(f"{store.url} holds no shard (no shards/<id>/current)")
        if len(shards) > 1:
            raise InvalidInput(f"{store.url} holds {len(shards)} shards ({', '.join(shards)}): name one")
        logical_shard_id = shards[0]
    return ShardBucket(store, _shard_bytes(logical_shard_id))


def locate(url: str) -> tuple[str, bytes | None]:
    """(the URL of the store `open_remote(url)` opens, as that store spells it; the logical shard
    the URL names, or None), worked out without contacting anything."""
    parsed = urllib.parse.urlsplit(url)
    match = _SHARD_IN_URL.fullmatch(parsed.path)
    if parsed.scheme == "s3":
        path, shard = (match.group(1), bytes.fromhex(match.group(2))) if match else (parsed.path, None)
        prefix = path.strip("/")
        return f"s3://{parsed.netloc}/{prefix + '/' if prefix else ''}", shard
    path = urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else url
    return "file://" + os.path.abspath(path), None


def _shard_bytes(value: bytes | str) -> bytes:
    return id16_from_hex(value, "logical shard id") if isinstance(value, str) else value
