"""Retention of the engine-written families: which ChangeEvent and CommandDedupe rows go.

The seed keeps ChangeEvent and CommandDedupe forever and says any future GC of them must first
define a shared consumer frontier and a typed expired-position failure, and an explicit
retention contract that preserves exact replay. nokvfs's contract (README "Durable format",
"Retention"):

* ChangeEvent: one shard-wide floor, `event_floor_version` (System `retention`). Rows of commit
  versions at or below it may be gone; a feed position below it is CursorExpired (the consumer
  resynchronises). Consumers need no lease: the floor only moves as the configured window
  allows, and every consumer learns it is behind by the typed error.
* CommandDedupe: a request id that is a UUIDv7 (RFC 9562: the ids `new_id16` makes) carries the
  time its request was made. `request_horizon_ms` (never past the persisted lease clock) and
  `request_floor_version` bound which rows may go: a row goes only when its request is older
  than the horizon *and* it committed at or below the floor. A command whose request id is a
  UUIDv7 older than the horizon and which finds no dedupe row is RequestExpired: its result may
  have been removed, so it is never applied again. The horizon is the only tombstone the
  contract needs (one System row, not one per request). Rows of request ids that are not UUIDv7
  (ids a caller chose, or nokvfs's derived ids, which `derived_id16` keeps out of the UUIDv7
  space) carry no time and are kept, so their replay stays exact forever.

`plan` decides, over one key range, which rows go. It only reads, so the write entrypoint
(`Shard.prune_retained`) and a replica replaying a recorded range delete exactly the same rows.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from nokvfs.engine import dedupe, rows
from nokvfs.errors import FormatError, IntegrityError
from nokvfs.schema.enums import RetainedFamily
from nokvfs.schema.ids import is_uuid7, uuid7_unix_ms

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

TREES = {RetainedFamily.ChangeEvent: "change_event", RetainedFamily.CommandDedupe: "command_dedupe"}
# The families whose rows carry their own commit version (ChangeEvent in its key, CommandDedupe
# in its value) and are never changed once written: the engine writes no History for them, and
# a read at an older version filters their current rows by that version instead.
SELF_VERSIONED = frozenset(TREES.values())

MAX_PRUNED_ROWS = 4096
MAX_VISITED_ROWS = 32768


def event_version(key: bytes) -> int:
    """The commit version in a ChangeEvent key (root | u64 version | u32 sequence)."""
    if len(key) != 28:
        raise FormatError(f"a ChangeEvent key of {len(key)} bytes")
    return _U64.unpack_from(key, 16)[0]


def row_version(tree: str, key: bytes, value: bytes) -> int:
    """The commit version a row of a SELF_VERSIONED tree was written at."""
    if tree == "change_event":
        return event_version(key)
    return dedupe.decode(value).commit_version


def request_expired(request_id: bytes, horizon_ms: int) -> bool:
    """Whether a request id is a UUIDv7 made before the horizon (its dedupe row may be gone)."""
    return horizon_ms > 0 and is_uuid7(request_id) and uuid7_unix_ms(request_id) < horizon_ms


@dataclass(frozen=True)
class Plan:
    deletions: list  # (key, value) in key order
    end_key: bytes | None  # exclusive end of the range planned; None: the end of the tree

    def digest(self) -> bytes:
        """SHA-256 over the deleted keys (u32 length | key each), in order."""
        h = hashlib.sha256(b"nokv.retention.prune.v1\0")
        for key, _ in self.deletions:
            h.update(_U32.pack(len(key)) + key)
        return h.digest()


def _goes(family: RetainedFamily, key: bytes, value: bytes, floor: int, horizon_ms: int) -> bool:
    if family == RetainedFamily.ChangeEvent:
        return event_version(key) <= floor
    if len(key) != 32:
        raise FormatError(f"a CommandDedupe key of {len(key)} bytes")
    return request_expired(key[16:], horizon_ms) and dedupe.decode(value).commit_version <= floor


def plan(
    txn,
    db,
    family: RetainedFamily,
    floor: int,
    horizon_ms: int,
    start: bytes,
    *,
    end: bytes | None = None,
    max_rows: int | None = MAX_PRUNED_ROWS,
    max_visits: int | None = MAX_VISITED_ROWS,
) -> Plan:
    """The rows of `family` in [start, end) that go at (floor, horizon_ms); the range also stops
    after `max_rows` deletions or `max_visits` visited rows (end_key is then the first row not
    visited). A replica replays a recorded range with both limits None."""
    tree = TREES[family]
    cursor = txn.cursor(db)
    deletions = []
    visited = 0
    found = cursor.set_range(start)
    while found:
        key = cursor.key()
        if end is not None and key >= end:
            return Plan(deletions, end)
        if (max_rows is not None and len(deletions) >= max_rows) or (max_visits is not None and visited >= max_visits):
            return Plan(deletions, key)
        visited += 1
        value = rows.unseal(tree, key, cursor.value())
        try:
            if _goes(family, key, value, floor, horizon_ms):
                deletions.append((key, value))
            elif _rest_of_root_stays(family, key, floor, horizon_ms):
                # Keys of one root sort by commit version (ChangeEvent) or by the request's
                # time (a UUIDv7 begins with it): nothing further in this root can go.
                following = _next_root(key[:16])
                found = following is not None and cursor.set_range(following)
                continue
        except FormatError as exc:
            raise IntegrityError(f"{tree} row {key.hex()} does not decode: {exc}") from None
        found = cursor.next()
    return Plan(deletions, end)


def _rest_of_root_stays(family: RetainedFamily, key: bytes, floor: int, horizon_ms: int) -> bool:
    if family == RetainedFamily.ChangeEvent:
        return event_version(key) > floor
    return int.from_bytes(key[16:22], "big") >= horizon_ms


def _next_root(root_id: bytes) -> bytes | None:
    value = int.from_bytes(root_id, "big") + 1
    return None if value >> 128 else value.to_bytes(16, "big")
