"""History rows and the rule for pruning them below the history floor.

Every mutation writes History(tag | u32 len(key) | key | inverted(commit_version)) holding the value
the key had before the change committed at that version. A read at version V uses, per key, the
earliest change after V, so a row at commit version C serves only reads at versions below C: once
no read below the floor F can happen (`ReadView.at` refuses them), every row with C <= F is dead.

One exception comes from the seed: the change feed interprets each ChangeEvent by its workbench's
visibility (incarnation and state) at the event's own version, and the format does not truncate
ChangeEvent "or the visibility History needed to interpret it". So WorkspaceCurrent history below
the floor is compacted rather than dropped: a row goes only when the projection (incarnation,
state) before its change equals the projection after it. Every surviving row still changes the
projection, so a visibility read at any version -- `ReadView.at(v, visibility=True)` -- returns a
row with the exact incarnation and state of version v (its other fields may be a later version's).

`plan` decides, over one key range of the History tree, which rows go. It only reads, so the
write entrypoint (`Shard.prune_history`) and the read-only estimate (`Shard.prunable_history`)
share it, and a replica replaying a recorded range deletes exactly the same rows.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from nokvfs.engine.records import HistoryValue
from nokvfs.errors import FormatError, IntegrityError
from nokvfs.schema import keys as family_keys
from nokvfs.schema.records import WorkspaceCurrent

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64_MAX = (1 << 64) - 1

# Bounds of one pruning batch (one write transaction and one outbox record).
MAX_PRUNED_ROWS = 4096
MAX_VISITED_ROWS = 32768


def _visibility(raw: bytes | None):
    if raw is None:
        return None
    marker = WorkspaceCurrent.decode(raw)
    return marker.workspace_incarnation_id, marker.state


# Families whose History keeps, below the floor, every row that changes this projection.
RETAINED_PROJECTIONS = {family_keys.FAMILY_BY_NAME["workspace_current"].tag: _visibility}
RETAINED_TREES = frozenset(family_keys.FAMILY_BY_TAG[tag].name for tag in RETAINED_PROJECTIONS)


@dataclass(frozen=True)
class Plan:
    deletions: list  # (history key, value) in key order
    end_key: bytes | None  # exclusive end of the range planned; None: the end of the tree
    visited: int

    def digest(self) -> bytes:
        """SHA-256 over the deleted keys (u32 length | key each), in order."""
        h = hashlib.sha256(b"nokv.history.prune.v1\0")
        for key, _ in self.deletions:
            h.update(_U32.pack(len(key)) + key)
        return h.digest()


def _split(key: bytes) -> tuple[int, bytes, int]:
    """(tag, user-key prefix tag|len|key, commit version) of a History key; IntegrityError if malformed."""
    if len(key) < 13:
        raise IntegrityError(f"history key {key.hex()} is too short")
    (length,) = _U32.unpack_from(key, 1)
    if len(key) != 13 + length:
        raise IntegrityError(f"history key {key.hex()} does not match its length field")
    return key[0], key[: 5 + length], _U64_MAX - _U64.unpack_from(key, 5 + length)[0]


def plan(txn, history_db, family_dbs_by_tag: dict, floor: int, start: bytes, *, end: bytes | None = None,
         max_rows: int | None = MAX_PRUNED_ROWS, max_visits: int | None = MAX_VISITED_ROWS) -> Plan:
    """The History rows in [start, end) that go at `floor` (end None: to the end of the tree).

    The range also stops after `max_rows` deletions or `max_visits` visited rows; end_key is then
    the first row not visited. A replica replays a recorded range with both limits None.
    """
    cursor = txn.cursor(history_db)
    probe = txn.cursor(history_db)
    deletions = []
    visited = 0
    user = None
    after = None
    found = cursor.set_range(start)
    while found:
        key = cursor.key()
        if end is not None and key >= end:
            return Plan(deletions, end, visited)
        if (max_rows is not None and len(deletions) >= max_rows) or (max_visits is not None and visited >= max_visits):
            return Plan(deletions, key, visited)
        visited += 1
        tag, prefix, version = _split(key)
        project = RETAINED_PROJECTIONS.get(tag)
        if project is None:
            if version <= floor:
                deletions.append((key, cursor.value()))
        else:
            try:
                if prefix != user:
                    # The first row of this key in the range: the value after its change is the
                    # one the next newer row (just before it in key order) recorded, or the current row.
                    user = prefix
                    after = project(_value_after(txn, probe, family_dbs_by_tag[tag], key, prefix))
                before = project(HistoryValue.decode(cursor.value()).previous)
            except FormatError as exc:
                raise IntegrityError(f"history row {key.hex()} does not decode: {exc}") from None
            if version <= floor and before == after:
                deletions.append((key, cursor.value()))
            after = before
        found = cursor.next()
    return Plan(deletions, end, visited)


def _value_after(txn, probe, family_db, key: bytes, prefix: bytes) -> bytes | None:
    if probe.set_range(key) and probe.prev() and probe.key().startswith(prefix) and len(probe.key()) == len(key):
        return HistoryValue.decode(probe.value()).previous
    return txn.get(prefix[5:], db=family_db)
