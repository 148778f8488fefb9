"""`shards/<logical shard hex>/datadir`: what rebuilds a data directory besides its shard.

`current` says where the shard is; this object says what the data directory around it was: its
root, the root's placement in the control plane, and the configuration (`nokvfs.json`). The owner
publishes it beside `current` with the same discipline: created with `If-None-Match: *` at
generation 1, replaced only with `If-Match: <etag of the bytes read>` at generation + 1 and only
when its content changed, read strictly (nokvfs.schema.canonical_json: duplicate names refused
while parsing; then the version before anything else; then exactly these fields at every level,
none null)::

    {
      "version": 1,
      "logicalShardId": "<32 hex>",
      "generation": <u64 >= 1>,                 # +1 on every replacement, never reset
      "publicationId": "<uuid7 hex>",           # this write's id (resolves an ambiguous write)
      "rootId": "<32 hex>",
      "placement": {"generation": <u64 >= 1>, "lifecycle": "Provisioning" | "Active" | ...},
      "config": {
        "store": "<object store URL>",          # where the artifact bytes are
        "endpointUrl": "<URL>" | "",            # its S3 endpoint ("" = the default)
        "region": "<name>" | "",                # its region ("" = the default)
        "blockSize": <4096 .. 2^30>,
        "cacheBytes": <u64>,
        "historyRetentionVersions": <0 .. 2^63-1>
      }
    }

The shard (restored from `current`) must carry the root's RootFence at exactly this placement
generation; a restore checks that before it makes anything a data directory.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from nokvfs.replicate.errors import ManifestGenerationInvalid, ManifestMalformed
from nokvfs.replicate.manifest import is_uuid7_hex, members, strict_object
from nokvfs.schema import canonical_json
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.ids import U64_MAX
from nokvfs.schema.records import RootPlacement

DATADIR = "datadir"
RECORD_VERSION = 1
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 4096, 1 << 30
_HEX32 = re.compile(r"[0-9a-f]{32}")
_TOP_FIELDS = ("version", "logicalShardId", "generation", "publicationId", "rootId", "placement", "config")
_PLACEMENT_FIELDS = ("generation", "lifecycle")
_CONFIG_FIELDS = ("store", "endpointUrl", "region", "blockSize", "cacheBytes", "historyRetentionVersions")


@dataclass(frozen=True)
class DataDirRecord:
    logical_shard_id: bytes
    generation: int
    publication_id: str
    root_id: bytes
    placement: RootPlacement
    store: str
    endpoint_url: str | None
    region: str | None
    block_size: int
    cache_bytes: int
    history_retention_versions: int

    @classmethod
    def from_data_dir(
        cls, config: dict, placement: RootPlacement, *, generation: int, publication_id: str
    ) -> DataDirRecord:
        """The record of a data directory's configuration (`nokvfs.json`) and placement."""
        record = cls(
            logical_shard_id=bytes.fromhex(config["logical_shard_id"]),
            generation=generation,
            publication_id=publication_id,
            root_id=bytes.fromhex(config["root_id"]),
            placement=placement,
            store=config["store"],
            endpoint_url=config.get("endpoint_url") or None,
            region=config.get("region") or None,
            block_size=int(config["block_size"]),
            cache_bytes=int(config["cache_bytes"]),
            history_retention_versions=int(config.get("history_retention_versions", 0)),
        )
        validate(record)
        return record

    def config(self) -> dict:
        """The data directory configuration (`nokvfs.json` fields, without `format`)."""
        return {
            "root_id": self.root_id.hex(),
            "logical_shard_id": self.logical_shard_id.hex(),
            "store": self.store,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "block_size": self.block_size,
            "cache_bytes": self.cache_bytes,
            "history_retention_versions": self.history_retention_versions,
        }

    def next_generation(self) -> int:
        if self.generation >= U64_MAX:
            raise ManifestGenerationInvalid(
                f"{DATADIR} generation {self.generation} cannot advance: it would overflow u64"
            )
        return self.generation + 1

    def same_content(self, other: DataDirRecord) -> bool:
        """Equal but for generation and publication id (nothing to republish)."""
        return dataclasses.replace(other, generation=self.generation, publication_id=self.publication_id) == self

    def to_json(self) -> dict:
        return {
            "version": RECORD_VERSION,
            "logicalShardId": self.logical_shard_id.hex(),
            "generation": self.generation,
            "publicationId": self.publication_id,
            "rootId": self.root_id.hex(),
            "placement": {
                "generation": self.placement.placement_generation,
                "lifecycle": self.placement.lifecycle.name,
            },
            "config": {
                "store": self.store,
                "endpointUrl": self.endpoint_url or "",
                "region": self.region or "",
                "blockSize": self.block_size,
                "cacheBytes": self.cache_bytes,
                "historyRetentionVersions": self.history_retention_versions,
            },
        }

    def dumps(self) -> bytes:
        return canonical_json.dumps(self.to_json())


def _int(value, where: str, low: int = 0, high: int = U64_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ManifestMalformed(f"{where} must be an integer in {low}..{high}, got {value!r}")
    return value


def _text(value, where: str, *, empty: bool) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise ManifestMalformed(f"{where} must be a {'' if empty else 'non-empty '}string, got {value!r}")
    return value


def _hex16(value, where: str) -> bytes:
    if not isinstance(value, str) or not _HEX32.fullmatch(value):
        raise ManifestMalformed(f"{where} must be 32 lowercase hex characters, got {value!r}")
    return bytes.fromhex(value)


def loads(data: bytes, *, logical_shard_id: bytes | None = None) -> DataDirRecord:
    """Parse and validate the record strictly; every failure is a typed ManifestError."""
    obj = strict_object(data, DATADIR, RECORD_VERSION)
    o = members(obj, DATADIR, _TOP_FIELDS)
    p = members(o["placement"], f"{DATADIR}.placement", _PLACEMENT_FIELDS)
    c = members(o["config"], f"{DATADIR}.config", _CONFIG_FIELDS)
    lifecycle = p["lifecycle"]
    if not isinstance(lifecycle, str) or lifecycle not in RootPlacementLifecycle.__members__:
        raise ManifestMalformed(f"{DATADIR}.placement.lifecycle {lifecycle!r} is not a RootPlacement lifecycle")
    publication = o["publicationId"]
    if not is_uuid7_hex(publication):
        raise ManifestMalformed(
            f"{DATADIR}.publicationId must be a UUIDv7 as 32 lowercase hex characters, got {publication!r}"
        )
    shard = _hex16(o["logicalShardId"], f"{DATADIR}.logicalShardId")
    record = DataDirRecord(
        logical_shard_id=shard,
        generation=_int(o["generation"], f"{DATADIR}.generation", 1),
        publication_id=publication,
        root_id=_hex16(o["rootId"], f"{DATADIR}.rootId"),
        placement=RootPlacement(
            shard, _int(p["generation"], f"{DATADIR}.placement.generation", 1), RootPlacementLifecycle[lifecycle]
        ),
        store=_text(c["store"], f"{DATADIR}.config.store", empty=False),
        endpoint_url=_text(c["endpointUrl"], f"{DATADIR}.config.endpointUrl", empty=True) or None,
        region=_text(c["region"], f"{DATADIR}.config.region", empty=True) or None,
        block_size=_int(c["blockSize"], f"{DATADIR}.config.blockSize", MIN_BLOCK_SIZE, MAX_BLOCK_SIZE),
        cache_bytes=_int(c["cacheBytes"], f"{DATADIR}.config.cacheBytes"),
        history_retention_versions=_int(
            c["historyRetentionVersions"], f"{DATADIR}.config.historyRetentionVersions", 0, (1 << 63) - 1
        ),
    )
    validate(record, logical_shard_id=logical_shard_id)
    return record


def validate(record: DataDirRecord, *, logical_shard_id: bytes | None = None) -> None:
    """The checks `loads` makes, for a record about to be written."""
    if logical_shard_id is not None and record.logical_shard_id != logical_shard_id:
        raise ManifestMalformed(
            f"{DATADIR} names logical shard {record.logical_shard_id.hex()}, expected {logical_shard_id.hex()}"
        )
    if record.placement.logical_shard_id != record.logical_shard_id:
        raise ManifestMalformed(f"{DATADIR}: the placement names another logical shard")
    if not MIN_BLOCK_SIZE <= record.block_size <= MAX_BLOCK_SIZE:
        raise ManifestMalformed(
            f"{DATADIR}: block size {record.block_size} is not in {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}"
        )
    if not record.store or record.generation < 1 or not is_uuid7_hex(record.publication_id):
        raise ManifestMalformed(f"{DATADIR}: a store URL, a generation >= 1 and a UUIDv7 publication id are required")
