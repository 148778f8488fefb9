"""The `current` manifest of one logical shard in the bucket, and the key layout around it.

Under a configured prefix, one logical shard occupies::

    shards/<logical shard hex>/current
    shards/<logical shard hex>/packs/checkpoints/<through-generation>-<checkpoint id>.pack
    shards/<logical shard hex>/packs/increments/<generation>-<publication id>.pack

Ids are UUIDv7 in lowercase hex without punctuation (validated for version 7 and the RFC 4122
variant). Ordering is by the generation fields, never by the ids.

`current` is the only authoritative index; a listing never decides state. It is strict JSON
(nokvfs.schema.canonical_json: duplicate names are refused while parsing, integers are exact) and
written canonically. Version 1, with every field required at every level and no null anywhere::

    {
      "version": 1,
      "logicalShardId": "<32 hex>",
      "generation": <u64 >= 1>,            # +1 on every successful replacement, never reset
      "ownerEpoch": <u64 >= 1>,            # the owner epoch of the shard state at `head`
      "ownerId": "<uuid7 hex>",            # the publishing owner (changes only by a claim)
      "publicationId": "<uuid7 hex>",      # this write's proposal id (ambiguous results)
      "head": {"lsn": <u64>, "chainDigest": "<64 hex>", "commitVersion": <u64>},
      "checkpoint": {
        "id": "<uuid7 hex>", "publication": "<uuid7 hex>",
        "throughGeneration": <u64>, "throughLsn": <u64>, "commitVersion": <u64>,
        "chainDigest": "<64 hex>",
        "key": "packs/checkpoints/<throughGeneration>-<id>.pack",
        "sha256": "<64 hex>", "size": <u64>
      },
      "increments": [
        {"generation": <u64>, "publication": "<uuid7 hex>",
         "firstLsn": <u64>, "lastLsn": <u64>,
         "previousChainDigest": "<64 hex>", "chainDigest": "<64 hex>", "commitVersion": <u64>,
         "key": "packs/increments/<generation>-<publication>.pack",
         "sha256": "<64 hex>", "size": <u64>}
      ],
      "retained": [ {"checkpoint": {...}, "increments": [...], "head": {...}} ]   # newest first
    }

`validate` checks the whole chain before anything touches a pack: the checkpoint cutoff is not
beyond `generation`; increment generations increase strictly, above the cutoff and not beyond
`generation`; LSN ranges are contiguous from the checkpoint's through-LSN; each increment's
previous chain digest is the prior pack's last chain digest; `head` is the tail's end (or the
checkpoint's through point); every key is exactly the one its generation and id name; keys,
checkpoint ids and publication ids are unique across the manifest; `publicationId` is the active
checkpoint's or the last increment's publication. Each retained generation is an independent
chain under the same rules whose head is the through point of the next newer checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from nokvfs.errors import CanonicalJsonError
from nokvfs.replicate.errors import (
    ManifestChainBroken,
    ManifestGenerationInvalid,
    ManifestMalformed,
    ManifestVersionUnsupported,
)
from nokvfs.schema import canonical_json
from nokvfs.schema.ids import U64_MAX, check_id16, new_id16

MANIFEST_VERSION = 1
CURRENT = "current"
CHECKPOINTS = "packs/checkpoints/"
INCREMENTS = "packs/increments/"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_UUID7 = re.compile(r"[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}")
_SHARD = re.compile(r"[0-9a-f]{32}")
_PACK_KEY = re.compile(r"packs/(checkpoints|increments)/(0|[1-9][0-9]{0,19})-([0-9a-f]{32})\.pack")


# --- ids and keys -------------------------------------------------------------------------------


def new_uuid7_hex() -> str:
    return new_id16().hex()


def is_uuid7_hex(text: object) -> bool:
    return isinstance(text, str) and _UUID7.fullmatch(text) is not None


def shard_prefix(logical_shard_id: bytes) -> str:
    """The key prefix of one logical shard inside the replication prefix."""
    return f"shards/{check_id16(logical_shard_id, 'logical shard id').hex()}/"


def checkpoint_key(through_generation: int, checkpoint_id: str) -> str:
    return f"{CHECKPOINTS}{through_generation}-{checkpoint_id}.pack"


def increment_key(generation: int, publication: str) -> str:
    return f"{INCREMENTS}{generation}-{publication}.pack"


def parse_pack_key(key: str) -> tuple[str, int, str] | None:
    """(kind, generation, id) of a valid protocol pack key (relative to the shard), else None.

    kind is "checkpoint" or "increment". Malformed keys are None, so cleanup ignores them.
    """
    match = _PACK_KEY.fullmatch(key)
    if match is None or not is_uuid7_hex(match.group(3)):
        return None
    generation = int(match.group(2))
    if generation > U64_MAX:
        return None
    return ("checkpoint" if match.group(1) == "checkpoints" else "increment"), generation, match.group(3)


# --- the records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """A point of the recovery outbox chain: the last LSN, its chain digest and commit version."""

    lsn: int
    chain_digest: bytes
    commit_version: int


@dataclass(frozen=True)
class CheckpointDescriptor:
    id: str
    publication: str
    through_generation: int
    through_lsn: int
    commit_version: int
    chain_digest: bytes
    key: str
    sha256: bytes
    size: int

    @property
    def through(self) -> Head:
        return Head(self.through_lsn, self.chain_digest, self.commit_version)


@dataclass(frozen=True)
class IncrementDescriptor:
    generation: int
    publication: str
    first_lsn: int
    last_lsn: int
    previous_chain_digest: bytes
    chain_digest: bytes
    commit_version: int
    key: str
    sha256: bytes
    size: int

    @property
    def end(self) -> Head:
        return Head(self.last_lsn, self.chain_digest, self.commit_version)


@dataclass(frozen=True)
class Retained:
    """A replaced checkpoint generation: its checkpoint, its whole tail through the cutoff that
    replaced it, and the head it reached (the next newer checkpoint's through point)."""

    checkpoint: CheckpointDescriptor
    increments: tuple[IncrementDescriptor, ...]
    head: Head


@dataclass(frozen=True)
class Manifest:
    logical_shard_id: bytes
    generation: int
    owner_epoch: int
    owner_id: str
    publication_id: str
    head: Head
    checkpoint: CheckpointDescriptor
    increments: tuple[IncrementDescriptor, ...] = ()
    retained: tuple[Retained, ...] = field(default=())

    def live_keys(self) -> set[str]:
        """Every pack key the manifest references (active and retained): the cleanup roots."""
        keys = {self.checkpoint.key, *(i.key for i in self.increments)}
        for r in self.retained:
            keys.add(r.checkpoint.key)
            keys.update(i.key for i in r.increments)
        return keys

    def publications(self) -> set[str]:
        pubs = {self.publication_id, self.checkpoint.publication, *(i.publication for i in self.increments)}
        for r in self.retained:
            pubs.add(r.checkpoint.publication)
            pubs.update(i.publication for i in r.increments)
        return pubs

    def next_generation(self) -> int:
        if self.generation >= U64_MAX:
            raise ManifestGenerationInvalid(f"generation {self.generation} cannot advance: it would overflow u64")
        return self.generation + 1

    def with_increment(self, increment: IncrementDescriptor, owner_epoch: int, owner_id: str) -> Manifest:
        """The proposal that appends `increment` (already at generation + 1) to this manifest."""
        return replace(
            self,
            generation=increment.generation,
            owner_epoch=owner_epoch,
            owner_id=owner_id,
            publication_id=increment.publication,
            head=increment.end,
            increments=self.increments + (increment,),
        )

    # --- JSON ---------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "version": MANIFEST_VERSION,
            "logicalShardId": self.logical_shard_id.hex(),
            "generation": self.generation,
            "ownerEpoch": self.owner_epoch,
            "ownerId": self.owner_id,
            "publicationId": self.publication_id,
            "head": _head_json(self.head),
            "checkpoint": _checkpoint_json(self.checkpoint),
            "increments": [_increment_json(i) for i in self.increments],
            "retained": [
                {
                    "checkpoint": _checkpoint_json(r.checkpoint),
                    "increments": [_increment_json(i) for i in r.increments],
                    "head": _head_json(r.head),
                }
                for r in self.retained
            ],
        }

    def dumps(self) -> bytes:
        return canonical_json.dumps(self.to_json())


def _head_json(h: Head) -> dict:
    return {"lsn": h.lsn, "chainDigest": h.chain_digest.hex(), "commitVersion": h.commit_version}


def _checkpoint_json(c: CheckpointDescriptor) -> dict:
    return {
        "id": c.id,
        "publication": c.publication,
        "throughGeneration": c.through_generation,
        "throughLsn": c.through_lsn,
        "commitVersion": c.commit_version,
        "chainDigest": c.chain_digest.hex(),
        "key": c.key,
        "sha256": c.sha256.hex(),
        "size": c.size,
    }


def _increment_json(i: IncrementDescriptor) -> dict:
    return {
        "generation": i.generation,
        "publication": i.publication,
        "firstLsn": i.first_lsn,
        "lastLsn": i.last_lsn,
        "previousChainDigest": i.previous_chain_digest.hex(),
        "chainDigest": i.chain_digest.hex(),
        "commitVersion": i.commit_version,
        "key": i.key,
        "sha256": i.sha256.hex(),
        "size": i.size,
    }


# --- strict reading -----------------------------------------------------------------------------


def _u64(value, where):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64_MAX:
        raise ManifestMalformed(f"{where} must be an unsigned 64-bit integer, got {value!r}")
    return value


def _digest(value, where):
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ManifestMalformed(f"{where} must be 64 lowercase hex characters, got {value!r}")
    return bytes.fromhex(value)


def _uuid7(value, where):
    if not is_uuid7_hex(value):
        raise ManifestMalformed(f"{where} must be a UUIDv7 as 32 lowercase hex characters, got {value!r}")
    return value


def _string(value, where):
    if not isinstance(value, str):
        raise ManifestMalformed(f"{where} must be a string, got {value!r}")
    return value


def members(obj, where: str, names: tuple[str, ...]) -> dict:
    """`obj` if it is an object with exactly `names`, else ManifestMalformed (nulls are refused
    earlier, by `strict_object`)."""
    if not isinstance(obj, dict):
        raise ManifestMalformed(f"{where} must be an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(names))
    if unknown:
        raise ManifestMalformed(f"{where} has unknown field(s) {unknown}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise ManifestMalformed(f"{where} is missing field(s) {missing}")
    return obj


def _list(value, where):
    if not isinstance(value, list):
        raise ManifestMalformed(f"{where} must be an array, got {type(value).__name__}")
    return value


_HEAD_FIELDS = ("lsn", "chainDigest", "commitVersion")
_CHECKPOINT_FIELDS = (
    "id",
    "publication",
    "throughGeneration",
    "throughLsn",
    "commitVersion",
    "chainDigest",
    "key",
    "sha256",
    "size",
)
_INCREMENT_FIELDS = (
    "generation",
    "publication",
    "firstLsn",
    "lastLsn",
    "previousChainDigest",
    "chainDigest",
    "commitVersion",
    "key",
    "sha256",
    "size",
)
_RETAINED_FIELDS = ("checkpoint", "increments", "head")
_TOP_FIELDS = (
    "version",
    "logicalShardId",
    "generation",
    "ownerEpoch",
    "ownerId",
    "publicationId",
    "head",
    "checkpoint",
    "increments",
    "retained",
)


def _check_nulls(value, where: str) -> None:
    """Explicit null anywhere is refused before any value is decoded."""
    if value is None:
        raise ManifestMalformed(f"{where} is an explicit null")
    if isinstance(value, dict):
        for name, member in value.items():
            _check_nulls(member, f"{where}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_nulls(item, f"{where}[{index}]")


def _head(obj, where) -> Head:
    o = members(obj, where, _HEAD_FIELDS)
    return Head(
        _u64(o["lsn"], f"{where}.lsn"),
        _digest(o["chainDigest"], f"{where}.chainDigest"),
        _u64(o["commitVersion"], f"{where}.commitVersion"),
    )


def _checkpoint(obj, where) -> CheckpointDescriptor:
    o = members(obj, where, _CHECKPOINT_FIELDS)
    return CheckpointDescriptor(
        id=_uuid7(o["id"], f"{where}.id"),
        publication=_uuid7(o["publication"], f"{where}.publication"),
        through_generation=_u64(o["throughGeneration"], f"{where}.throughGeneration"),
        through_lsn=_u64(o["throughLsn"], f"{where}.throughLsn"),
        commit_version=_u64(o["commitVersion"], f"{where}.commitVersion"),
        chain_digest=_digest(o["chainDigest"], f"{where}.chainDigest"),
        key=_string(o["key"], f"{where}.key"),
        sha256=_digest(o["sha256"], f"{where}.sha256"),
        size=_u64(o["size"], f"{where}.size"),
    )


def _increment(obj, where) -> IncrementDescriptor:
    o = members(obj, where, _INCREMENT_FIELDS)
    return IncrementDescriptor(
        generation=_u64(o["generation"], f"{where}.generation"),
        publication=_uuid7(o["publication"], f"{where}.publication"),
        first_lsn=_u64(o["firstLsn"], f"{where}.firstLsn"),
        last_lsn=_u64(o["lastLsn"], f"{where}.lastLsn"),
        previous_chain_digest=_digest(o["previousChainDigest"], f"{where}.previousChainDigest"),
        chain_digest=_digest(o["chainDigest"], f"{where}.chainDigest"),
        commit_version=_u64(o["commitVersion"], f"{where}.commitVersion"),
        key=_string(o["key"], f"{where}.key"),
        sha256=_digest(o["sha256"], f"{where}.sha256"),
        size=_u64(o["size"], f"{where}.size"),
    )


def _increments(value, where) -> tuple[IncrementDescriptor, ...]:
    return tuple(_increment(item, f"{where}[{n}]") for n, item in enumerate(_list(value, where)))


def strict_object(data: bytes, name: str, version: int) -> dict:
    """The JSON object `name` at `version`, read strictly: duplicate names fail while parsing
    (before any value exists), then the version is checked before any other field (a future
    schema is refused as such, ManifestVersionUnsupported), then an explicit null anywhere is
    refused. Each record then checks its own fields (`members`)."""
    try:
        obj = canonical_json.loads(data)
    except CanonicalJsonError as exc:
        raise ManifestMalformed(f"{name} is not strict JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ManifestMalformed(f"{name} must be a JSON object, got {type(obj).__name__}")
    if "version" not in obj:
        raise ManifestMalformed(f"{name} is missing field(s) ['version']")
    found = obj["version"]
    if found is None:
        raise ManifestMalformed(f"{name}.version is an explicit null")
    if not isinstance(found, int) or isinstance(found, bool) or found != version:
        raise ManifestVersionUnsupported(f"{name} has version {found!r}; this reader knows version {version}")
    _check_nulls(obj, name)
    return obj


def loads(data: bytes, *, logical_shard_id: bytes | None = None) -> Manifest:
    """Parse and validate `current` strictly; every failure is a typed ManifestError.

    Duplicate names fail while parsing (before any value exists); then the version is checked
    before any other field, so a future schema is refused as such; then every object level must
    have exactly its fields, none null; then the whole chain is validated.
    """
    obj = strict_object(data, CURRENT, MANIFEST_VERSION)
    o = members(obj, "current", _TOP_FIELDS)
    shard_hex = o["logicalShardId"]
    if not isinstance(shard_hex, str) or not _SHARD.fullmatch(shard_hex):
        raise ManifestMalformed(f"current.logicalShardId must be 32 lowercase hex characters, got {shard_hex!r}")
    retained = []
    for n, item in enumerate(_list(o["retained"], "current.retained")):
        where = f"current.retained[{n}]"
        r = members(item, where, _RETAINED_FIELDS)
        retained.append(
            Retained(
                _checkpoint(r["checkpoint"], f"{where}.checkpoint"),
                _increments(r["increments"], f"{where}.increments"),
                _head(r["head"], f"{where}.head"),
            )
        )
    manifest = Manifest(
        logical_shard_id=bytes.fromhex(shard_hex),
        generation=_u64(o["generation"], "current.generation"),
        owner_epoch=_u64(o["ownerEpoch"], "current.ownerEpoch"),
        owner_id=_uuid7(o["ownerId"], "current.ownerId"),
        publication_id=_uuid7(o["publicationId"], "current.publicationId"),
        head=_head(o["head"], "current.head"),
        checkpoint=_checkpoint(o["checkpoint"], "current.checkpoint"),
        increments=_increments(o["increments"], "current.increments"),
        retained=tuple(retained),
    )
    validate(manifest, logical_shard_id=logical_shard_id)
    return manifest


# --- chain validation ---------------------------------------------------------------------------


def _validate_chain(
    checkpoint: CheckpointDescriptor, increments, head: Head, upper_generation: int, where: str
) -> None:
    if checkpoint.key != checkpoint_key(checkpoint.through_generation, checkpoint.id):
        raise ManifestMalformed(
            f"{where}.checkpoint.key {checkpoint.key!r} is not "
            f"{checkpoint_key(checkpoint.through_generation, checkpoint.id)!r}"
        )
    if not 1 <= checkpoint.through_generation <= upper_generation:
        raise ManifestGenerationInvalid(
            f"{where}.checkpoint.throughGeneration {checkpoint.through_generation} is not in 1..{upper_generation}"
        )
    generation = checkpoint.through_generation
    end = checkpoint.through
    for n, inc in enumerate(increments):
        at = f"{where}.increments[{n}]"
        if inc.key != increment_key(inc.generation, inc.publication):
            raise ManifestMalformed(f"{at}.key {inc.key!r} is not {increment_key(inc.generation, inc.publication)!r}")
        if not generation < inc.generation <= upper_generation:
            raise ManifestGenerationInvalid(
                f"{at}.generation {inc.generation} does not increase from {generation} "
                f"(and stay at or below {upper_generation})"
            )
        if inc.first_lsn != end.lsn + 1:
            kind = "gap" if inc.first_lsn > end.lsn + 1 else "overlap"
            raise ManifestChainBroken(f"{at} starts at LSN {inc.first_lsn}, expected {end.lsn + 1} (an LSN {kind})")
        if inc.last_lsn < inc.first_lsn:
            raise ManifestChainBroken(f"{at} ends at LSN {inc.last_lsn}, before its first LSN {inc.first_lsn}")
        if inc.previous_chain_digest != end.chain_digest:
            raise ManifestChainBroken(f"{at}.previousChainDigest is not the prior pack's last chain digest")
        if inc.commit_version < end.commit_version:
            raise ManifestChainBroken(f"{at}.commitVersion {inc.commit_version} goes back from {end.commit_version}")
        generation = inc.generation
        end = inc.end
    if head != end:
        raise ManifestChainBroken(f"{where}.head {head} is not the end of its chain {end}")


def validate(m: Manifest, *, logical_shard_id: bytes | None = None) -> None:
    """The whole-manifest checks described in the module docstring."""
    if logical_shard_id is not None and m.logical_shard_id != logical_shard_id:
        raise ManifestMalformed(
            f"current names logical shard {m.logical_shard_id.hex()}, expected {logical_shard_id.hex()}"
        )
    if m.generation < 1:
        raise ManifestGenerationInvalid(f"current.generation is {m.generation}; the first manifest is generation 1")
    if m.owner_epoch < 1:
        raise ManifestMalformed("current.ownerEpoch must be at least 1")
    _validate_chain(m.checkpoint, m.increments, m.head, m.generation, "current")
    newer = m.checkpoint
    for n, r in enumerate(m.retained):
        where = f"current.retained[{n}]"
        if r.checkpoint.through_generation >= newer.through_generation:
            raise ManifestGenerationInvalid(
                f"{where}.checkpoint.throughGeneration {r.checkpoint.through_generation} is not older than "
                f"{newer.through_generation}"
            )
        _validate_chain(r.checkpoint, r.increments, r.head, newer.through_generation, where)
        if r.head != newer.through:
            raise ManifestChainBroken(f"{where}.head is not the through point of the checkpoint that replaced it")
        newer = r.checkpoint
    descriptors = [m.checkpoint, *m.increments]
    for r in m.retained:
        descriptors += [r.checkpoint, *r.increments]
    keys = [d.key for d in descriptors]
    if len(set(keys)) != len(keys):
        raise ManifestChainBroken("current references one pack key twice")
    ids = [m.checkpoint.id, *(r.checkpoint.id for r in m.retained)]
    if len(set(ids)) != len(ids):
        raise ManifestChainBroken("current names one checkpoint id twice")
    pubs = [d.publication for d in descriptors]
    if len(set(pubs)) != len(pubs):
        raise ManifestChainBroken("current names one publication id twice")
    latest = m.increments[-1].publication if m.increments else None
    if m.publication_id not in (m.checkpoint.publication, latest):
        raise ManifestChainBroken(
            "current.publicationId is neither the checkpoint's nor the last increment's publication"
        )
