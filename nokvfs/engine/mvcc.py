"""Reads at the current version or at any retained earlier version.

Every mutation writes History(tag | u32 len(key) | key | inverted(commit_version)) holding the
value before it. A read of key K at version V is the previous value stored by the earliest change
after V if there is one, else the current row. Rows with inverted(C) < inverted(V) are the changes
after V, so that change is the row just before `set_range(K-prefix | inverted(V))`.

Seeking at an old version merges the current tree with the keys its History knows. History keys
are grouped by user-key length, so the merge visits each length group present for the family;
reads at the current version never touch History.

Every row a view uses is verified first (nokvfs.engine.rows): the value returned, the History
row an old-version read takes its value from, and -- where a lookup lands between rows, a miss or
a seek -- the rows on both sides of the landing point, so a row whose key bytes were damaged is
RowCorrupt rather than silently absent or skipped. LMDB's own corruption errors are ShardCorrupt.

History below the floor is pruned (nokvfs.engine.history), so reads below it are refused, except
visibility reads: `at(v, visibility=True)` may go below the floor for the trees whose History
keeps every change of a projection (WorkspaceCurrent's incarnation and state), and only point
reads of those trees.

ChangeEvent and CommandDedupe rows are written once and carry their commit version (in the key,
in the value): they have no History, and a read at an older version takes the current row only
if it was written at or before that version (nokvfs.engine.retention.SELF_VERSIONED). Operation
StagedObject and GcCandidate rows have no History either: they are read at the current version
only (nokvfs.engine.history.CURRENT_ONLY_TREES). ArtifactRevision and RevisionRef rows have no
History for their creation: a read at an older version takes no row created after it
(nokvfs.engine.history.CREATION_VERSIONED).
"""

from __future__ import annotations

import struct

from nokvfs.engine import rows
from nokvfs.engine.history import (
    CREATION_VERSIONED,
    CURRENT_ONLY_TREES,
    RETAINED_TREES,
    created_version,
    decode_value,
)
from nokvfs.engine.retention import SELF_VERSIONED, row_version
from nokvfs.engine.rows import lmdb_errors_translated
from nokvfs.errors import HistoryNotRetained, ReadVersionStale

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64_MAX = (1 << 64) - 1
_AFTER_ALL_VERSIONS = b"\xff" * 8  # inverted(0); commit versions start at 1
_HISTORY = "history"


def inverted(version: int) -> bytes:
    return _U64.pack(_U64_MAX - version)


class ReadView:
    """One consistent LMDB read transaction, read at `version`. Not thread-safe; cheap to open."""

    def __init__(
        self,
        txn,
        dbs: dict,
        tags: dict,
        history_db,
        version: int,
        current: int,
        floor: int = 0,
        *,
        visibility_only: bool = False,
        event_floor: int = 0,
    ):
        self._txn = txn
        self.floor = floor
        # ChangeEvent rows at or below this version may be gone (nokvfs.engine.retention): a
        # change-feed position below it is CursorExpired.
        self.event_floor = event_floor
        self._visibility_only = visibility_only
        self._dbs = dbs
        self._tags = tags
        self._history = history_db
        self.version = version
        self.current_version = current
        self.ops = 0  # cursor operations (seeks and steps), reported by benchmarks
        self._cursors: dict = {}
        self._groups: dict = {}

    def at(self, version: int, *, visibility: bool = False) -> "ReadView":
        """A view of the same transaction at another retained version. With `visibility`, a
        version below the history floor gives a view that point-reads only RETAINED_TREES, whose
        rows there carry the exact projection (incarnation, state) of that version."""
        if version > self.current_version:
            raise ReadVersionStale(
                f"version {version} is newer than the shard's {self.current_version}",
                expected=version,
                current=self.current_version,
            )
        below = version < self.floor
        if below and not visibility:
            raise HistoryNotRetained(f"version {version} is older than the history floor {self.floor}")
        return ReadView(
            self._txn,
            self._dbs,
            self._tags,
            self._history,
            version,
            self.current_version,
            self.floor,
            visibility_only=below,
            event_floor=self.event_floor,
        )

    def _below_floor(self) -> HistoryNotRetained:
        return HistoryNotRetained(
            f"version {self.version} is older than the history floor {self.floor}: only visibility reads remain"
        )

    @property
    def is_current(self) -> bool:
        return self.version == self.current_version

    def _cursor(self, name: str):
        cursor = self._cursors.get(name)
        if cursor is None:
            db = self._history if name == "\0history" else self._dbs[name]
            cursor = self._cursors[name] = self._txn.cursor(db)
        return cursor

    # --- point reads ---------------------------------------------------------------------

    @lmdb_errors_translated
    def get(self, tree: str, key: bytes) -> bytes | None:
        self.ops += 1
        if self.version == self.current_version and not self._visibility_only:  # most reads: the row itself
            raw = self._txn.get(key, db=self._dbs[tree])
            if raw is None:
                self.ops += 2
                rows.verify_neighbours(self._cursor(tree), tree, key)
                return None
            return rows.unseal(tree, key, raw)
        if self._visibility_only and tree not in RETAINED_TREES:
            raise self._below_floor()
        if not self.is_current and tree in SELF_VERSIONED:
            return self._self_versioned(tree, key, self._txn.get(key, db=self._dbs[tree]))
        if not self.is_current and tree in CURRENT_ONLY_TREES:
            raise self._current_only(tree)
        if not self.is_current:
            changed, previous = self._previous_after(self._tags[tree], key)
            if changed:
                return self._created_by_now(tree, previous)
        raw = self._txn.get(key, db=self._dbs[tree])
        if raw is None:
            self.ops += 2
            rows.verify_neighbours(self._cursor(tree), tree, key)
            return None
        value = rows.unseal(tree, key, raw)
        return value if self.is_current else self._created_by_now(tree, value)

    def _created_by_now(self, tree: str, value: bytes | None) -> bytes | None:
        # A row of a CREATION_VERSIONED family created after this version was absent at it (its
        # creation wrote no History to say so).
        if value is None or tree not in CREATION_VERSIONED:
            return value
        created = created_version(tree, value)
        return None if created is not None and created > self.version else value

    def _current_only(self, tree: str) -> HistoryNotRetained:
        return HistoryNotRetained(f"{tree} rows are read at the current version only, not at version {self.version}")

    def _self_versioned(self, tree: str, key: bytes, raw: bytes | None) -> bytes | None:
        if raw is None:
            self.ops += 2
            rows.verify_neighbours(self._cursor(tree), tree, key)
            return None
        value = rows.unseal(tree, key, raw)
        return value if row_version(tree, key, value) <= self.version else None

    def _previous_after(self, tag: int, key: bytes):
        """(True, value-before) for the earliest change of key after self.version, else (False, None)."""
        prefix = bytes([tag]) + _U32.pack(len(key)) + key
        cursor = self._cursor("\0history")
        self.ops += 1
        found = cursor.set_range(prefix + inverted(self.version))
        if found:
            # The row after the landing point is verified too, so damage cannot hide a change.
            rows.unseal(_HISTORY, cursor.key(), cursor.value())
        moved = cursor.prev() if found else cursor.last()
        if moved:
            hkey = cursor.key()
            value = rows.unseal(_HISTORY, hkey, cursor.value())
            if len(hkey) == len(prefix) + 8 and hkey.startswith(prefix):
                return True, decode_value(value)
        return False, None

    # --- ordered reads -------------------------------------------------------------------

    @lmdb_errors_translated
    def seek(self, tree: str, key: bytes, within: bytes = b""):
        """The first (key, value) with key >= `key` that exists at self.version, or None.

        `within` bounds the search to keys starting with it (None once past it).
        """
        if self._visibility_only:
            raise self._below_floor()  # visibility views point-read only
        cursor = self._cursor(tree)
        if self.is_current:
            self.ops += 2
            if not cursor.set_range(key):
                if cursor.last():
                    rows.verify(tree, cursor.key(), cursor.value())
                return None
            found = cursor.key()
            value = rows.unseal(tree, found, cursor.value())
            if cursor.prev():
                # The row before the landing point: a row whose key was damaged sorts wrongly and
                # would be stepped over without this check.
                rows.verify(tree, cursor.key(), cursor.value())
            if not found.startswith(within):
                return None
            return found, value
        probe = key
        if tree in CURRENT_ONLY_TREES:
            raise self._current_only(tree)
        if tree in SELF_VERSIONED:
            while True:
                self.ops += 1
                if not cursor.set_range(probe):
                    return None
                found = cursor.key()
                if not found.startswith(within):
                    return None
                value = rows.unseal(tree, found, cursor.value())
                if row_version(tree, found, value) <= self.version:
                    return found, value
                # ChangeEvent keys of one root sort by version: the rest of this root is newer.
                following = int.from_bytes(found[:16], "big") + 1 if tree == "change_event" else None
                if following is not None and following < 1 << 128:
                    probe = following.to_bytes(16, "big")
                elif following is not None:
                    return None
                else:
                    probe = found + b"\x00"
        while True:
            candidates = []
            self.ops += 1
            if cursor.set_range(probe):
                candidates.append(cursor.key())
            historic = self._history_min_ge(self._tags[tree], probe, len(within))
            if historic is not None:
                candidates.append(historic)
            if not candidates:
                return None
            candidate = min(candidates)
            if not candidate.startswith(within):
                return None
            value = self.get(tree, candidate)
            if value is not None:
                return candidate, value
            probe = candidate + b"\x00"

    @lmdb_errors_translated
    def walk(self, tree: str, key: bytes, within: bytes, limit: int) -> tuple[list, bool]:
        """(up to `limit` rows (key, value) in key order from `key` on, all starting with
        `within`; whether they ran out before `limit`): exactly what `seek` returns when called
        again and again just past the row it found, verified the same way (each row returned,
        and the rows on both sides of the range). At the current version that is one pass of
        the cursor, not a new seek per row."""
        if not self.is_current:
            items, position = [], key
            while len(items) < limit:
                found = self.seek(tree, position, within)
                if found is None:
                    return items, True
                items.append(found)
                position = found[0] + b"\x00"
            return items, False
        cursor = self._cursor(tree)
        self.ops += 2
        if not cursor.set_range(key):
            if cursor.last():
                rows.unseal(tree, cursor.key(), cursor.value())
            return [], True
        # The row before the landing point, as `seek` verifies it: a row whose key was damaged
        # sorts wrongly and would be stepped over without this check.
        if cursor.prev():
            rows.unseal(tree, cursor.key(), cursor.value())
            cursor.next()
        else:
            cursor.first()  # the landing row is the first (a failed step leaves the cursor nowhere)
        items = []
        while True:
            found = cursor.key()
            value = rows.unseal(tree, found, cursor.value())
            if not found.startswith(within):
                return items, True
            items.append((found, value))
            if len(items) == limit:
                return items, False
            self.ops += 1
            if not cursor.next():
                return items, True

    def _length_groups(self, tag: int) -> tuple[int, ...]:
        groups = self._groups.get(tag)
        if groups is None:
            cursor = self._cursor("\0history")
            lengths = []
            position = bytes([tag]) + _U32.pack(0)
            while True:
                self.ops += 1
                if not cursor.set_range(position) or cursor.key()[0] != tag:
                    break
                length = _U32.unpack_from(cursor.key(), 1)[0]
                lengths.append(length)
                if length == 0xFFFFFFFF:
                    break
                position = bytes([tag]) + _U32.pack(length + 1)
            groups = self._groups[tag] = tuple(lengths)
        return groups

    def _history_min_ge(self, tag: int, key: bytes, min_length: int) -> bytes | None:
        """The smallest user key >= `key` that has any History row in family `tag`."""
        cursor = self._cursor("\0history")
        best = None
        for length in self._length_groups(tag):
            if length < min_length:
                continue
            group = bytes([tag]) + _U32.pack(length)
            self.ops += 1
            if not cursor.set_range(group + key):
                continue
            hkey = cursor.key()
            if not hkey.startswith(group):
                continue
            user = hkey[5:-8]
            if user < key:
                # A shorter key equal to key's prefix: step past all of its versions.
                self.ops += 1
                if not cursor.set_range(group + user + _AFTER_ALL_VERSIONS):
                    continue
                if cursor.key() == group + user + _AFTER_ALL_VERSIONS:
                    self.ops += 1
                    if not cursor.next():
                        continue
                hkey = cursor.key()
                if not hkey.startswith(group):
                    continue
                user = hkey[5:-8]
            if best is None or user < best:
                best = user
        return best
