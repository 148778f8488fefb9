"""Records only the engine writes: System rows, History values and the recovery outbox framing.

Declared with the same codec as the metadata families. the README's "Durable format" section lists their bytes.
"""

from __future__ import annotations

from typing import Annotated

from nokvfs.schema.codec import (
    U8,
    U32,
    U64,
    Bytes,
    Enum,
    FixedBytes,
    Flag,
    Id16,
    Id32,
    List,
    Opt,
    Str,
    Struct,
    record,
)
from nokvfs.schema.enums import MutationKind, OutboxPayloadEncoding, OutboxRecordKind, PredicateKind, RetainedFamily

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
# Written by the first retention step (outbox truncation, ChangeEvent or CommandDedupe
# retention); absent means nothing was ever removed, so stores made before it open unchanged.
SYS_RETENTION = b"retention"
OPTIONAL_SYSTEM_KEYS = frozenset({SYS_RETENTION})

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


@record(version=1)
class RetentionFloors:
    """What retention has removed (the System row `retention`; absent: nothing, all zero).

    outbox_floor_lsn: outbox records at or below it are truncated; the chain is verified from
    outbox_floor_digest (the chain digest of record outbox_floor_lsn; the genesis digest at 0),
    and outbox_floor_commit_version is that record's commit version.
    event_floor_version: ChangeEvent rows of commit versions at or below it may be gone; a feed
    position below it is CursorExpired.
    request_horizon_ms / request_floor_version: CommandDedupe rows whose request id is a UUIDv7
    older than request_horizon_ms (Unix ms) and whose commit version is at or below
    request_floor_version may be gone; a command with such a request id and no dedupe row is
    RequestExpired, never applied.
    """

    outbox_floor_lsn: U64
    outbox_floor_digest: Id32
    outbox_floor_commit_version: U64
    event_floor_version: U64
    request_horizon_ms: U64
    request_floor_version: U64


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


@record(version=2)
class DeflatedHistoryValue:
    """A HistoryValue whose previous value is stored as one zlib stream (RFC 1950) primed with
    the preset dictionary nokvfs.engine.compression.DICTIONARY_1 (written when the value exceeds
    128 bytes and the stream is smaller; nokvfs.engine.history.encode_value)."""

    previous_length: U32
    deflated: Bytes


@record(version=3)
class RowHistoryValue:
    """A HistoryValue whose previous value was a row stored deflated (row envelope version 2,
    nokvfs.engine.rows): `body` is that row's body as stored -- u32 value length | u8 tail
    length | zlib stream (8 KiB window) primed with DICTIONARY_1 of the value but its tail | the
    tail, raw -- kept as it is rather than inflated and deflated again. (Until 2026-12-07 only
    rows without a raw tail were kept so; the same reader reads both.)"""

    body: Bytes


# --- CommandDedupe ---------------------------------------------------------------------------


@record(version=3)
class DeflatedCommandDedupe:
    """A CommandDedupe row (the seed's record is version 2) whose result is stored as one zlib
    stream primed with nokvfs.engine.compression.DICTIONARY_1 (nokvfs.engine.dedupe)."""

    command_digest: Id32
    result_length: U32
    deflated_result: Bytes
    commit_version: U64
    recovery_lsn: U64


# --- recovery outbox -------------------------------------------------------------------------

OUTBOX_HEADER_PREFIX = b"\x00"
OUTBOX_CHUNK_PREFIX = b"\x01"
OUTBOX_CHUNK_BYTES = 64 * 1024


@record(version=1)
class OutboxHeader:
    """The logical header of an outbox record (what shipped packs carry), and the stored header
    of records written before StoredOutboxHeader, whose chunks are under OUTBOX_CHUNK_PREFIX."""

    record_kind: Enum(OutboxRecordKind)
    commit_version: U64
    chunk_count: U32
    payload_length: U64
    payload_sha256: Id32
    previous_chain_digest: Id32
    chain_digest: Id32


@record(version=2)
class StoredOutboxHeader:
    """The stored header of outbox records from format 2 on (key 0x00 | u64 lsn); its chunks
    (OutboxChunk, pieces of the stored payload in `encoding`) follow it under
    0x00 | u64 lsn | u32 index, so a record's rows are appended in key order. The previous chain
    digest is not stored (a reader knows it: it is the chain it verifies); the logical
    OutboxHeader is rebuilt with it."""

    record_kind: Enum(OutboxRecordKind)
    commit_version: U64
    chunk_count: U32
    payload_length: U64
    payload_sha256: Id32
    encoding: Enum(OutboxPayloadEncoding)
    chain_digest: Id32


PayloadCheck = Annotated[bytes, FixedBytes(8)]  # the first 8 bytes of a payload's SHA-256


@record(version=3)
class InlineOutboxRecord:
    """The stored form of an outbox record from format 3 on: one row (key 0x00 | u64 lsn) that
    holds the record's stored payload itself (in `encoding`), for a stored payload of at most
    OUTBOX_CHUNK_BYTES; a longer one is a StoredOutboxHeader and its chunks. One row instead of
    a header and a chunk: a small publish's three records each spared a key, an envelope and an
    LMDB node. The logical OutboxHeader is rebuilt as for StoredOutboxHeader, with the chunk
    count format 2 would have stored and the payload's SHA-256 computed: the row keeps only its
    first 8 bytes (`payload_check`), enough to catch a damaged payload, as the chain digest
    (which binds the whole SHA-256) is what proves it."""

    record_kind: Enum(OutboxRecordKind)
    commit_version: U64
    payload_length: U64
    payload_check: PayloadCheck
    encoding: Enum(OutboxPayloadEncoding)
    chain_digest: Id32
    stored: Bytes

    @property
    def chunk_count(self) -> int:
        """Chunk rows following this row: none."""
        return 0


@record(version=1)
class OutboxChunk:
    data: Bytes


@record(version=2)
class OutboxDeflatedChunk:
    """A piece of the record's payload compressed as one zlib stream (RFC 1950): the record's
    chunks, in index order, concatenate to that stream. The header's payload length and
    SHA-256 are of the payload itself, so the chain and the shipped packs are unchanged."""

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


@record(version=1)
class OutboxTruncateRecord:
    """One truncation of the recovery outbox (Shard.truncate_outbox): the records at or below
    through_lsn were removed; the chain continues from through_chain_digest, the chain digest of
    record through_lsn (its commit version through_commit_version)."""

    owner_epoch: U64
    through_lsn: U64
    through_chain_digest: Id32
    through_commit_version: U64
    removed_records: U64


@record(version=1)
class RetentionPruneRecord:
    """One batch of ChangeEvent or CommandDedupe retention (Shard.prune_retained): the rows of
    `family` in [start_key, end_key) that the rule of nokvfs.engine.retention removes at
    (floor_version, horizon_ms). A replica replays the range and must remove exactly
    pruned_rows rows with this digest of their keys."""

    owner_epoch: U64
    family: Enum(RetainedFamily)
    floor_version: U64
    horizon_ms: U64
    start_key: Bytes
    end_key: Opt(Bytes)  # None: to the end of the tree
    pruned_rows: U64
    pruned_digest: Id32
