"""Key layouts of the 23 metadata families, the family/tree table, and the History key.

Each family owns one named tree (an LMDB named database); keys inside it do not repeat the
family tag and carry no version byte (the store's schema marker gates their codec). Key layouts
are `@record(version=None)` classes encoded by the one codec: fixed-width ids raw, integers
unsigned big-endian, general variable strings u32-length-prefixed, tag names / snapshot aliases
u16-length-prefixed, enums one byte, normalized paths as the ordered path key (nokvfs.schema.
paths) ending in 0x01.

Three keys carry a discriminated union the generic codec cannot express in place, and are
written by hand with the same interface (`encode()`, `decode()`, `VERSION = None`):

* RevisionRefKey -- the reference_owner_id between the kind and the revision id is
  Path: incarnation | u32 len | ordered NUL-separated path bytes (no 0x01 terminator);
  Commit: commit_id (32); RevisionDependency: child artifact_revision_id (16).
* SecondaryIndexKey -- the encoded value is self-delimiting only through the index codec
  (nokvfs.schema.index_codec.decode_prefix), imported lazily by the decoder.

CommitConsumerKey and HistoryHoldKey end in their discriminated field, so they use the codec with
a trailing `RestBytes` field validated against the kind:

* CommitConsumerKey.consumer_owner_id -- WorkbenchHead: incarnation (16); Tag: incarnation |
  u16 len | tag name; Lease: operation_id (16); ChildCommit: child commit_id (32).
* HistoryHoldKey.hold_id (nokvfs decision) -- Snapshot: the SnapshotId, u64 big-endian
  (8 bytes); BuildCommit and Restore: the owning operation_id (16 bytes).

History key: source_family_tag (u8) | u32 len(user_key) | user_key | inverted commit version
(u64 big-endian of 2**64 - 1 - commit_version), so for one user key newer versions sort first.
"""

from __future__ import annotations

import dataclasses
import struct

from nokvfs.errors import CorruptRecord, FormatError, NameInvalid, PathInvalid, UnknownDiscriminant
from nokvfs.schema import records as R
from nokvfs.schema.codec import (
    U32,
    U64,
    Enum,
    Id16,
    Id32,
    Label,
    OrderedPath,
    RestBytes,
    Str,
    record,
)
from nokvfs.schema.enums import (
    CommitConsumerKind,
    HistoryHoldKind,
    OperationKind,
    ReferenceKind,
    decode_enum,
)
from nokvfs.schema.names import check_tag_name
from nokvfs.schema.paths import (
    check_component,
    normalize_path,
    ordered_path,
    path_bytes,
    subtree_prefix,
    unordered_path,
)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
U64_MAX = (1 << 64) - 1


def _components(path) -> tuple[str, ...]:
    """A normalized component tuple from a component tuple (checked) or a path text
    (normalized; PathInvalid names the broken rule)."""
    if isinstance(path, tuple):
        return _check_components(path)
    return normalize_path(path)


def _check_components(path) -> tuple[str, ...]:
    """Refuse to build a key the decoder would refuse: CorruptRecord, like the codec."""
    if not isinstance(path, tuple) or not path:
        raise CorruptRecord("path is not a non-empty component tuple")
    for index, component in enumerate(path):
        if not isinstance(component, str):
            raise CorruptRecord(f"path component {index} is not str")
        try:
            check_component(component, index)
        except PathInvalid as exc:
            raise CorruptRecord(f"path: {exc}") from None
    return path


def _check_width(value, width: int, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != width:
        got = f"{len(value)} bytes" if isinstance(value, (bytes, bytearray)) else type(value).__name__
        raise CorruptRecord(f"{what}: expected exactly {width} bytes, got {got}")
    return bytes(value)


def _coerce_enum(obj, field: str, enum_type):
    value = getattr(obj, field)
    if isinstance(value, enum_type):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptRecord(f"{type(obj).__name__}.{field}: {value!r} is not a {enum_type.__name__}")
    value = decode_enum(enum_type, value)
    object.__setattr__(obj, field, value)
    return value


def _need(data: bytes, pos: int, n: int, what: str) -> None:
    if pos + n > len(data):
        raise CorruptRecord(f"{what}: truncated, need {n} bytes at offset {pos}")


# --- simple key layouts (the generic codec) ---------------------------------------------------


@record(version=None)
class RootFenceKey:
    root_id: Id16


@record(version=None)
class WorkspaceCurrentKey:
    root_id: Id16
    workbench_id: Str


@record(version=None)
class WorkspaceIncarnationClaimKey:
    root_id: Id16
    workspace_incarnation_id: Id16


@record(version=None)
class PathCurrentKey:
    root_id: Id16
    workspace_incarnation_id: Id16
    path: OrderedPath


@record(version=None)
class ArtifactRevisionKey:
    root_id: Id16
    artifact_revision_id: Id16


@record(version=None)
class ArtifactManifestKey:
    root_id: Id16
    artifact_revision_id: Id16
    object_index: U64


@record(version=None)
class CommitKey:
    root_id: Id16
    commit_id: Id32


@record(version=None)
class CommitMemberKey:
    root_id: Id16
    commit_id: Id32
    path: OrderedPath


@record(version=None)
class WorkbenchCommitHeadKey:
    root_id: Id16
    workspace_incarnation_id: Id16


@record(version=None)
class TagKey:
    root_id: Id16
    workspace_incarnation_id: Id16
    tag_name: Label


@record(version=None)
class SnapshotRefKey:
    root_id: Id16
    workspace_incarnation_id: Id16
    snapshot_id: U64


@record(version=None)
class SnapshotAliasKey:
    root_id: Id16
    workspace_incarnation_id: Id16
    alias: Label


_HOLD_ID_WIDTH = {
    HistoryHoldKind.Snapshot: 8,
    HistoryHoldKind.BuildCommit: 16,
    HistoryHoldKind.Restore: 16,
}


@record(version=None)
class HistoryHoldKey:
    """hold_id: u64 big-endian SnapshotId for Snapshot holds, the operation_id otherwise."""

    root_id: Id16
    hold_kind: Enum(HistoryHoldKind)
    hold_id: RestBytes

    def __post_init__(self):
        kind = _coerce_enum(self, "hold_kind", HistoryHoldKind)
        _check_width(self.hold_id, _HOLD_ID_WIDTH[kind], f"HistoryHoldKey.hold_id ({kind.name})")

    @classmethod
    def snapshot(cls, root_id: bytes, snapshot_id: int) -> HistoryHoldKey:
        return cls(root_id, HistoryHoldKind.Snapshot, R.snapshot_selector(snapshot_id))

    @property
    def snapshot_id(self) -> int | None:
        if self.hold_kind != HistoryHoldKind.Snapshot:
            return None
        return int.from_bytes(self.hold_id, "big")


@record(version=None)
class CommitConsumerKey:
    """consumer_owner_id is discriminated by consumer_kind (see the module docstring)."""

    root_id: Id16
    commit_id: Id32
    consumer_kind: Enum(CommitConsumerKind)
    consumer_owner_id: RestBytes

    def __post_init__(self):
        kind = _coerce_enum(self, "consumer_kind", CommitConsumerKind)
        check_consumer_owner(kind, self.consumer_owner_id)

    def owner(self):
        return decode_consumer_owner(self.consumer_kind, self.consumer_owner_id)


@record(version=None)
class ChangeEventKey:
    root_id: Id16
    commit_version: U64
    event_sequence: U32


@record(version=None)
class OperationKey:
    root_id: Id16
    operation_kind: Enum(OperationKind)
    operation_id: Id16


@record(version=None)
class RestoreMemberKey:
    root_id: Id16
    operation_id: Id16
    member_sequence: U64


@record(version=None)
class StagedObjectKey:
    root_id: Id16
    publish_operation_id: Id16
    object_sequence: U32


@record(version=None)
class CommandDedupeKey:
    root_id: Id16
    request_id: Id16


@record(version=None)
class GcCandidateKey:
    root_id: Id16
    artifact_revision_id: Id16
    reference_epoch: U64


@record(version=None)
class GcBarrierKey:
    root_id: Id16


# --- discriminated owner ids -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PathOwner:
    """A Path reference owner: the workspace incarnation and the normalized path."""

    workspace_incarnation_id: bytes
    path: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TagOwner:
    """A Tag consumer owner: the workspace incarnation and the tag name."""

    workspace_incarnation_id: bytes
    tag_name: str


def path_reference_owner(workspace_incarnation_id: bytes, path) -> bytes:
    """incarnation | u32(len) | ordered NUL-separated path bytes (no 0x01 terminator)."""
    inc = _check_width(workspace_incarnation_id, 16, "path owner incarnation")
    raw = path_bytes(_components(path))
    return inc + _U32.pack(len(raw)) + raw


def commit_reference_owner(commit_id: bytes) -> bytes:
    return _check_width(commit_id, 32, "commit owner")


def dependency_reference_owner(child_artifact_revision_id: bytes) -> bytes:
    return _check_width(child_artifact_revision_id, 16, "dependency owner")


def reference_owner(kind: ReferenceKind, *args) -> bytes:
    """The owner id of `kind` from its parts: Path(incarnation, path), Commit(commit_id),
    RevisionDependency(child_revision_id)."""
    kind = decode_enum(ReferenceKind, int(kind))
    if kind == ReferenceKind.Path:
        return path_reference_owner(*args)
    if kind == ReferenceKind.Commit:
        return commit_reference_owner(*args)
    return dependency_reference_owner(*args)


def _read_reference_owner(kind: ReferenceKind, data: bytes, pos: int) -> tuple[bytes, int]:
    """The owner id of `kind` starting at `pos` and the offset after it."""
    what = f"RevisionRefKey.reference_owner_id ({kind.name})"
    if kind == ReferenceKind.Path:
        _need(data, pos, 20, what)
        (n,) = _U32.unpack_from(data, pos + 16)
        _need(data, pos + 20, n, what)
        end = pos + 20 + n
    else:
        end = pos + (32 if kind == ReferenceKind.Commit else 16)
        _need(data, pos, end - pos, what)
    return bytes(data[pos:end]), end


def decode_reference_owner(kind: ReferenceKind, owner: bytes):
    """PathOwner for Path, the raw commit id / child revision id otherwise. Fails closed."""
    kind = decode_enum(ReferenceKind, int(kind))
    owner = bytes(owner)
    value, end = _read_reference_owner(kind, owner, 0)
    if end != len(owner):
        raise CorruptRecord(f"RevisionRefKey.reference_owner_id ({kind.name}): {len(owner) - end} trailing bytes")
    if kind != ReferenceKind.Path:
        return value
    raw = value[20:]
    if not raw:
        raise CorruptRecord("RevisionRefKey.reference_owner_id (Path): empty path")
    try:
        components = unordered_path(raw + b"\x01")
    except PathInvalid as exc:
        raise CorruptRecord(f"RevisionRefKey.reference_owner_id (Path): {exc}") from None
    return PathOwner(value[:16], components)


def workbench_head_consumer_owner(workspace_incarnation_id: bytes) -> bytes:
    return _check_width(workspace_incarnation_id, 16, "workbench head consumer owner")


def tag_consumer_owner(workspace_incarnation_id: bytes, tag_name: str) -> bytes:
    """incarnation | u16(len) | tag name."""
    inc = _check_width(workspace_incarnation_id, 16, "tag consumer owner incarnation")
    try:
        raw = check_tag_name(tag_name).encode("utf-8")
    except NameInvalid as exc:
        raise CorruptRecord(f"tag consumer owner: {exc}") from None
    return inc + _U16.pack(len(raw)) + raw


def lease_consumer_owner(operation_id: bytes) -> bytes:
    return _check_width(operation_id, 16, "lease consumer owner")


def child_commit_consumer_owner(child_commit_id: bytes) -> bytes:
    return _check_width(child_commit_id, 32, "child commit consumer owner")


_CONSUMER_OWNER_WIDTH = {
    CommitConsumerKind.WorkbenchHead: 16,
    CommitConsumerKind.Lease: 16,
    CommitConsumerKind.ChildCommit: 32,
}


def consumer_owner(kind: CommitConsumerKind, *args) -> bytes:
    kind = decode_enum(CommitConsumerKind, int(kind))
    return {
        CommitConsumerKind.WorkbenchHead: workbench_head_consumer_owner,
        CommitConsumerKind.Tag: tag_consumer_owner,
        CommitConsumerKind.Lease: lease_consumer_owner,
        CommitConsumerKind.ChildCommit: child_commit_consumer_owner,
    }[kind](*args)


def check_consumer_owner(kind: CommitConsumerKind, owner) -> bytes:
    decode_consumer_owner(kind, owner)
    return bytes(owner)


def decode_consumer_owner(kind: CommitConsumerKind, owner):
    """TagOwner for Tag, the raw incarnation / operation id / child commit id otherwise."""
    kind = decode_enum(CommitConsumerKind, int(kind))
    what = f"CommitConsumerKey.consumer_owner_id ({kind.name})"
    if kind != CommitConsumerKind.Tag:
        return _check_width(owner, _CONSUMER_OWNER_WIDTH[kind], what)
    if not isinstance(owner, (bytes, bytearray)):
        raise CorruptRecord(f"{what}: {type(owner).__name__} is not bytes")
    owner = bytes(owner)
    _need(owner, 0, 18, what)
    (n,) = _U16.unpack_from(owner, 16)
    if 18 + n != len(owner):
        raise CorruptRecord(f"{what}: tag name length {n} does not match {len(owner) - 18} bytes")
    try:
        name = check_tag_name(owner[18:].decode("utf-8"))
    except (UnicodeDecodeError, NameInvalid) as exc:
        raise CorruptRecord(f"{what}: {exc}") from None
    return TagOwner(owner[:16], name)


# --- hand-written key layouts ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RevisionRefKey:
    """root_id | reference_kind (u8) | reference_owner_id | artifact_revision_id.

    `reference_owner_id` is the raw owner id (build it with `reference_owner` and friends).
    """

    root_id: bytes
    reference_kind: ReferenceKind
    reference_owner_id: bytes
    artifact_revision_id: bytes

    VERSION = None

    def __post_init__(self):
        _check_width(self.root_id, 16, "RevisionRefKey.root_id")
        kind = _coerce_enum(self, "reference_kind", ReferenceKind)
        if not isinstance(self.reference_owner_id, (bytes, bytearray)):
            raise CorruptRecord("RevisionRefKey.reference_owner_id is not bytes")
        decode_reference_owner(kind, self.reference_owner_id)
        _check_width(self.artifact_revision_id, 16, "RevisionRefKey.artifact_revision_id")

    def encode(self) -> bytes:
        return (
            bytes(self.root_id)
            + bytes([int(self.reference_kind)])
            + bytes(self.reference_owner_id)
            + bytes(self.artifact_revision_id)
        )

    @classmethod
    def decode(cls, data: bytes) -> RevisionRefKey:
        data = bytes(data)
        _need(data, 0, 17, "RevisionRefKey")
        try:
            kind = decode_enum(ReferenceKind, data[16])
        except UnknownDiscriminant as exc:
            raise UnknownDiscriminant(f"RevisionRefKey.reference_kind: {exc}") from None
        owner, pos = _read_reference_owner(kind, data, 17)
        _need(data, pos, 16, "RevisionRefKey.artifact_revision_id")
        if pos + 16 != len(data):
            raise CorruptRecord(f"RevisionRefKey: {len(data) - pos - 16} trailing bytes")
        return cls(data[:16], kind, owner, data[pos:])

    def owner(self):
        """PathOwner for Path references, the raw commit / child revision id otherwise."""
        return decode_reference_owner(self.reference_kind, self.reference_owner_id)

    @classmethod
    def path(cls, root_id, workspace_incarnation_id, path, artifact_revision_id):
        """The Path reference of (incarnation, path) to a revision."""
        owner = path_reference_owner(workspace_incarnation_id, path)
        return cls(root_id, ReferenceKind.Path, owner, artifact_revision_id)

    @classmethod
    def commit(cls, root_id, commit_id, artifact_revision_id) -> RevisionRefKey:
        owner = commit_reference_owner(commit_id)
        return cls(root_id, ReferenceKind.Commit, owner, artifact_revision_id)

    @classmethod
    def dependency(cls, root_id, child_artifact_revision_id, artifact_revision_id) -> RevisionRefKey:
        owner = dependency_reference_owner(child_artifact_revision_id)
        return cls(root_id, ReferenceKind.RevisionDependency, owner, artifact_revision_id)


def _check_index_id(index_id) -> bytes:
    if not isinstance(index_id, str):
        raise CorruptRecord(f"SecondaryIndexKey.index_id: {type(index_id).__name__} is not str")
    try:
        raw = index_id.encode("utf-8")
    except UnicodeEncodeError:
        raise CorruptRecord("SecondaryIndexKey.index_id is not encodable as UTF-8") from None
    if not raw or len(raw) > 0xFFFF or b"\x00" in raw:
        raise CorruptRecord("SecondaryIndexKey.index_id must be 1..65535 UTF-8 bytes without NUL")
    return raw


def _default_decode_prefix():
    from nokvfs.schema import index_codec  # lazy: written alongside this module

    return index_codec.decode_prefix


@dataclasses.dataclass(frozen=True, slots=True)
class SecondaryIndexKey:
    """root_id | u16 len(index_id) | index_id | encoded_value | incarnation | ordered path.

    `encoded_value` is the order-preserving, self-delimiting encoding of the index codec; its end
    is found with index_codec.decode_prefix(data, pos) -> (value, end).
    """

    root_id: bytes
    index_id: str
    encoded_value: bytes
    workspace_incarnation_id: bytes
    path: tuple

    VERSION = None

    def __post_init__(self):
        _check_width(self.root_id, 16, "SecondaryIndexKey.root_id")
        _check_index_id(self.index_id)
        if not isinstance(self.encoded_value, (bytes, bytearray)) or not self.encoded_value:
            raise CorruptRecord("SecondaryIndexKey.encoded_value must be non-empty bytes")
        _check_width(self.workspace_incarnation_id, 16, "SecondaryIndexKey.workspace_incarnation_id")
        _check_components(self.path)

    def encode(self) -> bytes:
        raw = _check_index_id(self.index_id)
        return (
            bytes(self.root_id)
            + _U16.pack(len(raw))
            + raw
            + bytes(self.encoded_value)
            + bytes(self.workspace_incarnation_id)
            + ordered_path(self.path)
        )

    @classmethod
    def decode(cls, data: bytes, *, decode_prefix=None) -> SecondaryIndexKey:
        data = bytes(data)
        _need(data, 0, 18, "SecondaryIndexKey")
        (n,) = _U16.unpack_from(data, 16)
        _need(data, 18, n, "SecondaryIndexKey.index_id")
        try:
            index_id = data[18 : 18 + n].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecord("SecondaryIndexKey.index_id: invalid UTF-8") from None
        pos = 18 + n
        decode_prefix = decode_prefix or _default_decode_prefix()
        try:
            _, end = decode_prefix(data, pos)
        except FormatError:
            raise
        except Exception as exc:  # noqa: BLE001 - the index codec's own typed errors: a corrupt key
            raise CorruptRecord(f"SecondaryIndexKey.encoded_value: {exc}") from None
        if not isinstance(end, int) or not pos < end <= len(data):
            raise CorruptRecord(f"SecondaryIndexKey.encoded_value: bad end offset {end!r}")
        encoded_value = data[pos:end]
        _need(data, end, 16, "SecondaryIndexKey.workspace_incarnation_id")
        incarnation = data[end : end + 16]
        try:
            path = unordered_path(data[end + 16 :])
        except PathInvalid as exc:
            raise CorruptRecord(f"SecondaryIndexKey.path: {exc}") from None
        return cls(data[:16], index_id, encoded_value, incarnation, path)


# --- the family table ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Family:
    """One metadata family: its tree, its History source tag, its key and value layouts.

    `value_record` is None for Operation, whose value record is chosen by the key's kind.
    """

    name: str
    tag: int
    key_layout: type
    value_record: type | None

    def decode_value(self, value: bytes, key: bytes | None = None):
        if self.value_record is not None:
            return self.value_record.decode(value)
        if key is None:
            raise CorruptRecord(f"{self.name}: the value record is chosen by the key; pass the key")
        return R.decode_operation(OperationKey.decode(key).operation_kind, value)


FAMILIES: tuple[Family, ...] = (
    Family("root_fence", 0x01, RootFenceKey, R.RootFence),
    Family("workspace_current", 0x02, WorkspaceCurrentKey, R.WorkspaceCurrent),
    Family("path_current", 0x03, PathCurrentKey, R.PathEntry),
    Family("artifact_revision", 0x04, ArtifactRevisionKey, R.ArtifactRevision),
    Family("artifact_manifest", 0x05, ArtifactManifestKey, R.ArtifactManifest),
    Family("revision_ref", 0x06, RevisionRefKey, R.RevisionRef),
    Family("commit", 0x07, CommitKey, R.Commit),
    Family("commit_member", 0x08, CommitMemberKey, R.CommitMember),
    Family("workbench_commit_head", 0x09, WorkbenchCommitHeadKey, R.WorkbenchCommitHead),
    Family("tag", 0x0A, TagKey, R.Tag),
    Family("snapshot_ref", 0x0B, SnapshotRefKey, R.SnapshotRef),
    Family("snapshot_alias", 0x0C, SnapshotAliasKey, R.SnapshotAlias),
    Family("history_hold", 0x0D, HistoryHoldKey, R.HistoryHold),
    Family("commit_consumer", 0x0E, CommitConsumerKey, R.CommitConsumer),
    Family("secondary_index", 0x0F, SecondaryIndexKey, R.SecondaryIndex),
    Family("change_event", 0x10, ChangeEventKey, R.ChangeEvent),
    Family("operation", 0x11, OperationKey, None),
    Family("restore_member", 0x12, RestoreMemberKey, R.RestoreMember),
    Family("staged_object", 0x13, StagedObjectKey, R.StagedObject),
    Family("command_dedupe", 0x14, CommandDedupeKey, R.CommandDedupe),
    Family("gc_candidate", 0x15, GcCandidateKey, R.GcCandidate),
    Family("gc_barrier", 0x16, GcBarrierKey, R.GcBarrier),
    Family(
        "workspace_incarnation_claim",
        0x17,
        WorkspaceIncarnationClaimKey,
        R.WorkspaceIncarnationClaim,
    ),
)

FAMILY_BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
FAMILY_BY_TAG: dict[int, Family] = {f.tag: f for f in FAMILIES}

SYSTEM_TREE = "system"
HISTORY_TREE = "history"
RECOVERY_OUTBOX_TREE = "recovery_outbox"
RESERVED_TREES: tuple[str, ...] = (SYSTEM_TREE, HISTORY_TREE, RECOVERY_OUTBOX_TREE)

TREE_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES) + RESERVED_TREES

KEY_LAYOUTS: tuple[type, ...] = tuple(f.key_layout for f in FAMILIES)


# --- History key -----------------------------------------------------------------------------


def _check_tag(tag) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int) or tag not in FAMILY_BY_TAG:
        raise UnknownDiscriminant(f"history source family tag {tag!r} is not registered")
    return tag


def inverted_version(commit_version: int) -> bytes:
    if isinstance(commit_version, bool) or not isinstance(commit_version, int):
        raise CorruptRecord(f"commit version {commit_version!r} is not an integer")
    if not 0 <= commit_version <= U64_MAX:
        raise CorruptRecord(f"commit version {commit_version} is not a u64")
    return _U64.pack(U64_MAX - commit_version)


def history_key_prefix(tag: int, user_key: bytes) -> bytes:
    """tag | u32 len(user_key) | user_key: the prefix of every History row of one key."""
    user_key = bytes(user_key)
    if len(user_key) > 0xFFFFFFFF:
        raise CorruptRecord("history user key does not fit a u32 length")
    return bytes([_check_tag(tag)]) + _U32.pack(len(user_key)) + user_key


def history_key(tag: int, user_key: bytes, commit_version: int) -> bytes:
    """tag | u32 len(user_key) | user_key | u64(2**64 - 1 - commit_version)."""
    return history_key_prefix(tag, user_key) + inverted_version(commit_version)


def decode_history_key(data: bytes) -> tuple[int, bytes, int]:
    """(tag, user_key, commit_version) of a History key. Fails closed."""
    # A well-formed key takes no call but the two unpacks (History pruning decodes every row it
    # visits); any other goes through the checks below, which say what is wrong.
    if type(data) is bytes and len(data) >= 13 and data[0] in FAMILY_BY_TAG:
        n = len(data) - 13
        if _U32.unpack_from(data, 1)[0] == n:
            return data[0], data[5 : 5 + n], U64_MAX - _U64.unpack_from(data, 5 + n)[0]
    return _decode_history_key_checked(data)


def _decode_history_key_checked(data: bytes) -> tuple[int, bytes, int]:
    data = bytes(data)
    _need(data, 0, 5, "history key")
    tag = _check_tag(data[0])
    (n,) = _U32.unpack_from(data, 1)
    _need(data, 5, n + 8, "history key")
    if 5 + n + 8 != len(data):
        raise CorruptRecord(f"history key: {len(data) - 13 - n} trailing bytes")
    (inv,) = _U64.unpack_from(data, 5 + n)
    return tag, data[5 : 5 + n], U64_MAX - inv


# --- keys and prefixes the engine and the workspace layer use ---------------------------------


def _id(value, width: int, what: str) -> bytes:
    return _check_width(value, width, what)


def workspace_current_key(root_id: bytes, workbench_id: str) -> bytes:
    return WorkspaceCurrentKey(root_id, workbench_id).encode()


def workspace_current_prefix(root_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id")


def path_current_prefix(root_id: bytes, workspace_incarnation_id: bytes) -> bytes:
    """Every PathCurrent key of one workspace incarnation."""
    return _id(root_id, 16, "root_id") + _id(workspace_incarnation_id, 16, "workspace_incarnation_id")


def path_current_key(root_id: bytes, workspace_incarnation_id: bytes, path) -> bytes:
    return PathCurrentKey(root_id, workspace_incarnation_id, _components(path)).encode()


def path_subtree_prefix(root_id: bytes, workspace_incarnation_id: bytes, path=()) -> bytes:
    """Prefix of every PathCurrent key strictly below directory `path` (() is the root)."""
    components = () if path in ((), "") else _components(path)
    return path_current_prefix(root_id, workspace_incarnation_id) + subtree_prefix(components)


def change_event_prefix(root_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id")


def change_event_key(root_id: bytes, commit_version: int, event_sequence: int) -> bytes:
    return ChangeEventKey(root_id, commit_version, event_sequence).encode()


def staged_object_prefix(root_id: bytes, publish_operation_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id") + _id(publish_operation_id, 16, "publish_operation_id")


def artifact_manifest_prefix(root_id: bytes, artifact_revision_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id") + _id(artifact_revision_id, 16, "artifact_revision_id")


def revision_ref_prefix(root_id: bytes, kind: ReferenceKind, owner: bytes | None = None) -> bytes:
    """Every RevisionRef of one owner (`owner` from `reference_owner`), or of one kind."""
    kind = decode_enum(ReferenceKind, int(kind))
    prefix = _id(root_id, 16, "root_id") + bytes([kind])
    if owner is None:
        return prefix
    decode_reference_owner(kind, owner)
    return prefix + bytes(owner)


def commit_member_prefix(root_id: bytes, commit_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id") + _id(commit_id, 32, "commit_id")


def restore_member_prefix(root_id: bytes, operation_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id") + _id(operation_id, 16, "operation_id")


def snapshot_ref_prefix(root_id: bytes, workspace_incarnation_id: bytes) -> bytes:
    return _id(root_id, 16, "root_id") + _id(workspace_incarnation_id, 16, "workspace_incarnation_id")


def commit_consumer_prefix(root_id: bytes, commit_id: bytes, kind: CommitConsumerKind | None = None) -> bytes:
    """Every CommitConsumer of one commit, or of one commit and kind."""
    prefix = _id(root_id, 16, "root_id") + _id(commit_id, 32, "commit_id")
    if kind is None:
        return prefix
    return prefix + bytes([decode_enum(CommitConsumerKind, int(kind))])


def secondary_index_prefix(root_id: bytes, index_id: str, encoded_value: bytes | None = None) -> bytes:
    """Every SecondaryIndex row of one index, or of one index and exact encoded value."""
    raw = _check_index_id(index_id)
    prefix = _id(root_id, 16, "root_id") + _U16.pack(len(raw)) + raw
    return prefix if encoded_value is None else prefix + bytes(encoded_value)


def operation_prefix(root_id: bytes, kind: OperationKind) -> bytes:
    return _check_width(root_id, 16, "root_id") + bytes([int(OperationKind(kind))])


def operation_key(root_id: bytes, kind: OperationKind, operation_id: bytes) -> bytes:
    return OperationKey(root_id, decode_enum(OperationKind, int(kind)), operation_id).encode()
