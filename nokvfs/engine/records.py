"""Records only the engine writes: System rows, History values and the recovery outbox framing.

Declared with the same codec as the metadata families. the README's "Durable format" section lists their bytes.
"""

from __future__ import annotations

from nokvfs.schema.codec import (
    U8,
    U32,
    U64,
    Bytes,
    Enum,
    Flag,
    Id16,
    Id32,
    List,
    Opt,
    Str,
    Struct,
    record,
)
from nokvfs.schema.enums import MutationKind, OutboxRecordKind, PredicateKind

# --- System tree keys ------------------------------------------------------------------------

SYS_SCHEMA = b"schema"
SYS_TREES = b"tree_registry"
SYS_SHARD = b"shard"
SYS_CLOCK = b"commit_clock"
SYS_RECOVERY = b"recovery_tail"
SYS_OWNER = b"owner"
SYS_LEASE_CLOCK = b"lease_clock"
SYS_HISTORY_FLOOR = b"history_floor"
SYS_STATE_DIGEST = b"state_digest"

SYSTEM_KEYS = frozenset(
    {
        SYS_SCHEMA,
        SYS_TREES,
        SYS_SHARD,
        SYS_CLOCK,
        SYS_RECOVERY,
        SYS_OWNER,
        SYS_LEASE_CLOCK,
        SYS_HISTORY_FLOOR,
        SYS_STATE_DIGEST,
    }
)


@record(version=1)
class SchemaMarker:
    value_format_version: U32
    schema_id: Str
    format_version: U32


@record(version=None)
class TreeEntry:
    name: Str
    tag: U8  # 0 for the reserved engine trees, which are not history sources


@record(version=1)
class TreeRegistry:
    trees: List(Struct(TreeEntry))


@record(version=1)
class ShardIdentity:
    logical_shard_id: Id16
    created_unix_ms: U64


@record(version=1)
class CommitClock:
    commit_version: U64


@record(version=1)
class RecoveryTail:
    applied_lsn: U64
    chain_digest: Id32


@record(version=1)
class OwnerRecord:
    owner_epoch: U64


@record(version=1)
class LeaseClock:
    high_water_unix_ms: U64


@record(version=1)
class HistoryFloor:
    # Reads at a version below this are refused: history older than it may have been pruned.
    floor_version: U64


@record(version=None)
class TreeDigest:
    name: Str
    row_count: U64
    digest: Id32  # sum mod 2**256 of BLAKE3(u32 len(key) | key | value) over the tree's rows


@record(version=1)
class StateDigest:
    trees: List(Struct(TreeDigest))


# --- History ---------------------------------------------------------------------------------


@record(version=1)
class HistoryValue:
    """The value a key had before the change at the History key's commit version."""

    previous: Opt(Bytes)  # None: the key was absent (tombstone)


# --- recovery outbox -------------------------------------------------------------------------

OUTBOX_HEADER_PREFIX = b"\x00"
OUTBOX_CHUNK_PREFIX = b"\x01"
OUTBOX_CHUNK_BYTES = 64 * 1024


@record(version=1)
class OutboxHeader:
    record_kind: Enum(OutboxRecordKind)
    commit_version: U64
    chunk_count: U32
    payload_length: U64
    payload_sha256: Id32
    previous_chain_digest: Id32
    chain_digest: Id32


@record(version=1)
class OutboxChunk:
    data: Bytes


@record(version=None)
class PredicateRow:
    kind: Enum(PredicateKind)
    tree: Str
    key: Bytes
    value: Opt(Bytes)  # ValueEquals: the exact value
    record_name: Opt(Str)  # FieldEquals/Generation/State
    field: Opt(Str)
    expected: Opt(Bytes)  # the expected field value, encoded with the field's codec


@record(version=None)
class MutationRow:
    kind: Enum(MutationKind)
    tree: Str
    key: Bytes
    value: Opt(Bytes)


@record(version=2)
class CommandRecord:
    """The logical outbox record of a MetadataCommand: enough to replay it exactly."""

    schema_id: Str
    root_id: Id16
    logical_shard_id: Id16
    placement_generation: U64
    owner_epoch: U64
    request_id: Id16
    command_digest: Id32
    read_version: U64
    commit_version: U64
    fence_install: Flag
    predicates: List(Struct(PredicateRow))
    mutations: List(Struct(MutationRow))
    events: List(Bytes)
    result: Bytes


@record(version=2)
class LeaseClockRecord:
    observed_unix_ms: U64


@record(version=2)
class OwnerEpochRecord:
    owner_epoch: U64


@record(version=2)
class HistoryPruneRecord:
    """One batch of History pruning (Shard.prune_history): the History rows in [start_key,
    end_key) that the rule of nokvfs.engine.history removes at floor_version. A replica replays
    the range and must remove exactly pruned_rows rows with this digest of their keys."""

    owner_epoch: U64
    floor_version: U64
    start_key: Bytes
    end_key: Opt(Bytes)  # None: to the end of the History tree
    pruned_rows: U64
    pruned_digest: Id32
