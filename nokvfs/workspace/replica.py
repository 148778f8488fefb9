"""A data directory's replica role, and the guards that keep a replica from writing.

A data directory made by `nokvfs init` owns its shard and has no role file. One rebuilt from a
bucket (`nokvfs shard restore`, `nokvfs mount --follow`) records what it is in
`<data_dir>/replica.json`, strict canonical JSON (unknown, duplicate, missing and null fields
are refused)::

    {"format": 1,
     "role": "owner" | "follower" | "fenced",
     "bucket": "s3://bucket/prefix",          # the replication prefix it was rebuilt from
     "endpointUrl": "",                       # its S3 endpoint ("" = the default)
     "logicalShardId": "<32 hex>",
     "ownedEpoch": <u64>,                     # fenced: the owner epoch this directory owned; else 0
     "unshipped": [] | [first, last],         # fenced: its LSNs never in the bucket (first 0 = unknown start)
     "reason": "<text>"}                      # fenced: why (who took over, when seen)

owner     took ownership of the bucket's shard (`restore --take-ownership`): writes as any data dir.
follower  a read-only replica: only the follower's replay of the owner's increments writes it.
fenced    was the owner until another took over: its commands fail with OwnerFenced.

A replica that is not the owner opens with `ReplicaShard` and `ReadOnlyStore` in place of its
shard and object store: every read goes through, every write raises the role's typed error at
the call (ReadOnlyReplica or OwnerFenced), before anything changes locally or in the shared
store, and publish recovery is never run on it (its operations are the owner's to finish).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.errors import CanonicalJsonError, FormatError, NokvError, OwnerFenced, ReadOnlyReplica
from nokvfs.objects.store import ObjectStore
from nokvfs.schema import canonical_json
from nokvfs.schema.ids import U64_MAX

ROLE_NAME = "replica.json"
ROLE_FORMAT = 1
OWNER, FOLLOWER, FENCED = "owner", "follower", "fenced"
_FIELDS = ("format", "role", "bucket", "endpointUrl", "logicalShardId", "ownedEpoch", "unshipped", "reason")


@dataclass(frozen=True)
class ReplicaRole:
    role: str
    bucket: str
    endpoint_url: str | None
    logical_shard_id: bytes
    owned_epoch: int = 0
    unshipped: tuple[int, int] | None = None
    reason: str = ""

    @property
    def writable(self) -> bool:
        return self.role == OWNER

    def refusal(self) -> NokvError:
        """The typed error every write of this replica raises."""
        if self.role == FENCED:
            return OwnerFenced(f"this data directory is fenced: {self.reason}")
        return ReadOnlyReplica(
            f"this data directory follows {self.bucket}: it is read-only (write on the owner, or "
            "`nokvfs shard restore --take-ownership` into a new data directory to become it)"
        )

    def to_json(self) -> dict:
        return {
            "format": ROLE_FORMAT,
            "role": self.role,
            "bucket": self.bucket,
            "endpointUrl": self.endpoint_url or "",
            "logicalShardId": self.logical_shard_id.hex(),
            "ownedEpoch": self.owned_epoch,
            "unshipped": [] if self.unshipped is None else list(self.unshipped),
            "reason": self.reason,
        }


def role_path(data_dir: str) -> str:
    return os.path.join(data_dir, ROLE_NAME)


def read_role(data_dir: str) -> ReplicaRole | None:
    """The directory's role, None for a directory made by `init`; FormatError if malformed."""
    path = role_path(data_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    return parse_role(raw, where=path)


def parse_role(raw: bytes, *, where: str = ROLE_NAME) -> ReplicaRole:
    try:
        obj = canonical_json.loads(raw)
    except CanonicalJsonError as exc:
        raise FormatError(f"{where} is not strict JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{where} must be a JSON object")
    if obj.get("format") != ROLE_FORMAT or isinstance(obj.get("format"), bool):
        raise FormatError(f"{where} has format {obj.get('format')!r}; this build reads format {ROLE_FORMAT}")
    unknown, missing = sorted(set(obj) - set(_FIELDS)), [n for n in _FIELDS if n not in obj]
    if unknown or missing:
        raise FormatError(f"{where}: unknown field(s) {unknown}, missing field(s) {missing}")
    if any(value is None for value in obj.values()):
        raise FormatError(f"{where} holds an explicit null")
    role, bucket, endpoint, shard = obj["role"], obj["bucket"], obj["endpointUrl"], obj["logicalShardId"]
    epoch, unshipped, reason = obj["ownedEpoch"], obj["unshipped"], obj["reason"]
    if role not in (OWNER, FOLLOWER, FENCED):
        raise FormatError(f"{where}: role {role!r} is not owner, follower or fenced")
    if not isinstance(bucket, str) or not bucket or not isinstance(endpoint, str) or not isinstance(reason, str):
        raise FormatError(f"{where}: bucket, endpointUrl and reason must be strings (bucket non-empty)")
    try:
        shard_id = (
            bytes.fromhex(shard) if isinstance(shard, str) and len(shard) == 32 and shard == shard.lower() else None
        )
    except ValueError:
        shard_id = None
    if shard_id is None:
        raise FormatError(f"{where}: logicalShardId must be 32 lowercase hex characters")
    if not _u64(epoch) or (role == FENCED) != (epoch > 0):
        raise FormatError(f"{where}: ownedEpoch must be a u64, above 0 exactly for a fenced directory")
    if (
        not isinstance(unshipped, list)
        or len(unshipped) not in (0, 2)
        or not all(_u64(n) for n in unshipped)
        or (unshipped and (role != FENCED or unshipped[0] > unshipped[1] or unshipped[1] == 0))
    ):
        raise FormatError(f"{where}: unshipped must be [] or [first, last] LSNs (fenced directories only)")
    return ReplicaRole(role, bucket, endpoint or None, shard_id, epoch, tuple(unshipped) or None, reason)


def _u64(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def write_role(data_dir: str, role: ReplicaRole) -> None:
    """Record `role` durably and atomically (temporary file, fsync, rename, fsync of the directory)."""
    data = canonical_json.dumps(role.to_json())
    parse_role(data)  # never write what this build would refuse to read
    filemodes.replace_atomically(role_path(data_dir), data)


# --- the guards ----------------------------------------------------------------------------------


def is_read_only(root) -> bool:
    """Whether `root` was opened as a replica that is not the owner (a follower, a fenced owner)."""
    return isinstance(root.shard, ReplicaShard)


class ReplicaShard:
    """A replica's shard: every read is the shard's, every write raises the role's error.

    The follower's replay (nokvfs.replicate.follower) writes through `inner`, and after a
    re-bootstrap swaps in the new shard with `replace`, so the Root and the mount keep one
    shard object for their whole life.
    """

    def __init__(self, shard, role: ReplicaRole):
        self.inner = shard
        self.role = role

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def replace(self, shard):
        """Serve `shard` from now on; returns the one served until now (its caller closes it)."""
        old, self.inner = self.inner, shard
        return old

    def _refuse(self, *args, **kwargs):
        raise self.role.refusal()

    apply = apply_group = observe_lease_clock = advance_owner_epoch = prune_history = replay_history_prune = _refuse
    truncate_outbox = replay_outbox_truncate = prune_retained = replay_retention_prune = _refuse

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ReadOnlyStore(ObjectStore):
    """A replica's view of the shared object store: reads go through, writes and deletes raise
    the role's error (a follower must never touch the blocks the owner is staging)."""

    def __init__(self, inner: ObjectStore, role: ReplicaRole):
        self.inner = inner
        self.role = role
        self.url = inner.url

    def _refuse(self, *args, **kwargs):
        raise self.role.refusal()

    put = put_file = put_many = delete = delete_many = _refuse
    create_multipart = upload_part = complete_multipart = abort_multipart = _refuse

    def get(self, key, start=0, length=None):
        return self.inner.get(key, start, length)

    def get_vouched(self, key, length):
        return self.inner.get_vouched(key, length)

    def head(self, key):
        return self.inner.head(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def multipart_uploads(self, key):
        return self.inner.multipart_uploads(key)

    def statfs(self):
        return self.inner.statfs()

    def close(self) -> None:
        self.inner.close()
