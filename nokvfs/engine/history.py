"""History rows and the rule for pruning them below the history floor.

Every mutation writes History(tag | u32 len(key) | key | inverted(commit_version)) holding the value
the key had before the change committed at that version. A read at version V uses, per key, the
earliest change after V, so a row at commit version C serves only reads at versions below C: once
no read below the floor F can happen (`ReadView.at` refuses them), every row with C <= F is dead.

One exception comes from the seed: the change feed interprets each ChangeEvent by its workbench's
visibility (incarnation and state) at the event's own version, so WorkspaceCurrent history below
the floor and above the ChangeEvent retention floor (nokvfs.engine.retention) is compacted rather
than dropped: a row goes only when the projection (incarnation,
state) before its change equals the projection after it. Every surviving row still changes the
projection, so a visibility read at any version -- `ReadView.at(v, visibility=True)` -- returns a
row with the exact incarnation and state of version v (its other fields may be a later version's).

`plan` decides, over one key range of the History tree, which rows go. It only reads, so the
write entrypoint (`Shard.prune_history`) and the read-only estimate (`Shard.prunable_history`)
share it, and a replica replaying a recorded range deletes exactly the same rows.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

from nokvfs.engine import compression, rows
from nokvfs.engine.records import DeflatedHistoryValue, HistoryValue, RowHistoryValue
from nokvfs.engine.retention import SELF_VERSIONED
from nokvfs.errors import CorruptRecord, FormatError, IntegrityError
from nokvfs.schema import keys as family_keys
from nokvfs.schema.records import ArtifactRevision, RevisionRef, WorkspaceCurrent

_U32 = struct.Struct(">I")

_HISTORY = "history"

# Bounds of one pruning batch (one write transaction and one outbox record).
MAX_PRUNED_ROWS = 4096
MAX_VISITED_ROWS = 32768


def encode_value(previous: bytes | None, stored: bytes | None = None) -> bytes:
    """The stored History value holding `previous` (None: a tombstone). `stored`: the verified
    row `previous` was read from; a row stored deflated is kept as it is, raw tail included
    (RowHistoryValue: deflating it again would cost a tenth of a command's row write; the same
    size, or for an ArtifactRevision row, whose 33-byte tail stays raw, about 20 bytes more).
    Otherwise deflated with the preset dictionary when that is smaller (DeflatedHistoryValue),
    else a HistoryValue."""
    if previous is not None:
        body = None if stored is None else rows.deflated_body(stored)
        if body is not None:
            return RowHistoryValue(body).encode()
        deflated = compression.deflate(previous)
        if deflated is not None:
            return DeflatedHistoryValue(len(previous), deflated).encode()
    return HistoryValue(previous).encode()


def decode_value(raw: bytes) -> bytes | None:
    """The previous value a stored History value holds (None: a tombstone), or a FormatError."""
    version = raw[:1]
    if version == _ROW_HISTORY_VALUE:
        try:
            return rows.inflate_body(RowHistoryValue.decode(raw).body)
        except ValueError as exc:
            raise CorruptRecord(f"RowHistoryValue: {exc}") from None
    if version != _DEFLATED_HISTORY_VALUE:
        return HistoryValue.decode(raw).previous
    stored = DeflatedHistoryValue.decode(raw)
    try:
        return compression.inflate(stored.deflated, stored.previous_length)
    except ValueError as exc:
        raise CorruptRecord(f"DeflatedHistoryValue: {exc}") from None


_DEFLATED_HISTORY_VALUE = bytes([DeflatedHistoryValue.VERSION])
_ROW_HISTORY_VALUE = bytes([RowHistoryValue.VERSION])


def _visibility(raw: bytes | None):
    if raw is None:
        return None
    marker = WorkspaceCurrent.decode(raw)
    return marker.workspace_incarnation_id, marker.state


# The state machines' working rows (operations, their staged-object ledgers and GC's
# candidates) are read at the current version only: a read at any other version is refused, so
# their changes write no History (most of a publish's History bytes were these rows' phase
# changes).
CURRENT_ONLY_TREES = frozenset({"operation", "staged_object", "gc_candidate"})

# Families whose rows carry the commit version that created them (the seed's created_version).
# Creating such a row at exactly that version writes no History: a read at an older version
# finds no change after it and filters the row it would take by its created_version
# (nokvfs.engine.mvcc). A key deleted and created again still has the History row of its
# deletion, so a read between the two sees the absence; a creation whose created_version is
# another version writes History as any change does.
CREATION_VERSIONED = {"artifact_revision": ArtifactRevision, "revision_ref": RevisionRef}


def created_version(tree: str, value: bytes) -> int | None:
    """The created_version of a row of a CREATION_VERSIONED family (None if it does not decode:
    the engine then treats it as any row, with History for its creation)."""
    try:
        return CREATION_VERSIONED[tree].decode(value).created_version
    except FormatError:
        return None


def records_change(tree: str, old: bytes | None, new: bytes | None, commit_version: int) -> bool:
    """Whether the first change of a key of `tree` in the command committing at `commit_version`
    writes a History row (the value before the command, `old`)."""
    if tree in SELF_VERSIONED or tree in CURRENT_ONLY_TREES:
        return False  # immutable rows that carry their version, or read at the current version only
    if old is None and new is not None and tree in CREATION_VERSIONED:
        return created_version(tree, new) != commit_version
    return True


# Families whose History keeps, below the floor, every row that changes this projection.
RETAINED_PROJECTIONS = {family_keys.FAMILY_BY_NAME["workspace_current"].tag: _visibility}
RETAINED_TREES = frozenset(family_keys.FAMILY_BY_TAG[tag].name for tag in RETAINED_PROJECTIONS)


@dataclass(frozen=True)
class Plan:
    deletions: list  # (history key, value) in key order
    end_key: bytes | None  # exclusive end of the range planned; None: the end of the tree

    def digest(self) -> bytes:
        """SHA-256 over the deleted keys (u32 length | key each), in order."""
        pack = _U32.pack
        data = b"".join([pack(len(key)) + key for key, _ in self.deletions])  # one update, the same digest
        return hashlib.sha256(b"nokv.history.prune.v1\0" + data).digest()


def plan(
    txn,
    history_db,
    family_dbs_by_tag: dict,
    floor: int,
    start: bytes,
    *,
    end: bytes | None = None,
    max_rows: int | None = MAX_PRUNED_ROWS,
    max_visits: int | None = MAX_VISITED_ROWS,
    event_floor: int = 0,
) -> Plan:
    """The History rows in [start, end) that go at `floor` (end None: to the end of the tree).

    Below the ChangeEvent retention floor (`event_floor`) no event is left to interpret, so the
    visibility rows kept for the change feed go there like any other row.

    The range also stops after `max_rows` deletions or `max_visits` visited rows; end_key is then
    the first row not visited. A replica replays a recorded range with both limits None.
    """
    cursor = txn.cursor(history_db)
    probe = txn.cursor(history_db)
    deletions = []
    visited = 0
    user = None
    after = None
    # Every row of the range passes here: the loop's calls are bound once (no limit is inf).
    max_rows = math.inf if max_rows is None else max_rows
    max_visits = math.inf if max_visits is None else max_visits
    unseal, decode_key, projection, delete = (
        rows.unseal,
        family_keys.decode_history_key,
        RETAINED_PROJECTIONS.get,
        deletions.append,
    )
    for key, stored in cursor.iternext() if cursor.set_range(start) else ():
        if end is not None and key >= end:
            return Plan(deletions, end)
        if len(deletions) >= max_rows or visited >= max_visits:
            return Plan(deletions, key)
        visited += 1
        value = unseal(_HISTORY, key, stored)
        try:
            tag, user_key, version = decode_key(key)
            project = projection(tag)
            if project is None:
                if version <= floor:
                    delete((key, value))
            else:
                if (tag, user_key) != user:
                    # The first row of this key in the range: the value after its change is the
                    # one the next newer row (just before it in key order) recorded, or the current row.
                    user = (tag, user_key)
                    after = project(_value_after(txn, probe, family_dbs_by_tag[tag], key, user_key))
                before = project(decode_value(value))
                if version <= floor and (before == after or version <= event_floor):
                    delete((key, value))
                after = before
        except FormatError as exc:
            raise IntegrityError(f"history row {key.hex()} does not decode: {exc}") from None
    return Plan(deletions, end)


def _value_after(txn, probe, family_db, key: bytes, user_key: bytes) -> bytes | None:
    # Same tag, length and user key, differing only in the trailing inverted version.
    if probe.set_range(key) and probe.prev() and probe.key()[:-8] == key[:-8]:
        return decode_value(rows.unseal(_HISTORY, probe.key(), probe.value()))
    tag = key[0]
    return rows.get(txn, family_db, family_keys.FAMILY_BY_TAG[tag].name, user_key)
