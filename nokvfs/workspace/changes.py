"""ReadChanges: the ChangeEvent log at root or workspace scope.

(commit_version, event_sequence) is an append-only log position. A cursor is bound to the root,
the scope and that position; unlike listing cursors it may resume against a later root version.
Both scopes seek the root-wide ChangeEvent keyspace strictly after the position; a workspace scope
filters on the event's stable workbench id. Visibility is re-evaluated at each event's own commit
version (one WorkspaceCurrent point read per workbench and commit, shared by that commit's
events), so a Staging incarnation never leaks. An after_commit_version newer than the root fails
closed.

Retention (README "Retention") removes ChangeEvent rows at or below the shard's event floor: a
position before the end of the floor's commit is CursorExpired (the consumer resynchronises:
reads the current state, then follows from the version it read it at); a feed read without a
position starts after the floor.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, scan_prefix
from nokvfs.errors import CursorExpired, InvalidInput, ReadVersionStale
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, WorkspaceState
from nokvfs.schema.names import check_workbench_id
from nokvfs.schema.records import ChangeEvent, WorkspaceCurrent

_POSITION = struct.Struct(">QI")


@dataclass(frozen=True)
class Change:
    commit_version: int
    event_sequence: int
    workbench_id: str
    incarnation_id: bytes
    kind: ChangeEventKind
    path: str | None
    before: bytes | None
    after: bytes | None


@dataclass(frozen=True)
class ChangesPage:
    changes: tuple
    cursor: str  # resume strictly after the last position read (always present: feeds go on)
    read_version: int
    more: bool  # whether events beyond this page existed at read_version


def _scope_digest(root_id: bytes, workbench_id: str | None) -> bytes:
    scope = b"root" if workbench_id is None else b"workspace\0" + workbench_id.encode()
    return hashlib.sha256(b"nokv.changes.cursor.v1\0" + root_id + scope).digest()[:16]


def _encode(digest: bytes, version: int, sequence: int) -> str:
    return base64.urlsafe_b64encode(digest + _POSITION.pack(version, sequence)).decode().rstrip("=")


def _decode(cursor: str, digest: bytes) -> tuple[int, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, TypeError):
        raise InvalidInput("malformed changes cursor") from None
    if len(raw) != 16 + _POSITION.size:
        raise InvalidInput("malformed changes cursor")
    if raw[:16] != digest:
        raise InvalidInput("the changes cursor belongs to another root or scope")
    return _POSITION.unpack_from(raw, 16)


def read_changes(
    root,
    *,
    workbench_id: str | None = None,
    cursor: str | None = None,
    after_commit_version: int | None = None,
    limit: int = 100,
) -> ChangesPage:
    if workbench_id is not None:
        check_workbench_id(workbench_id)
    if not 1 <= limit <= 10_000:
        raise InvalidInput("limit must be between 1 and 10000")
    digest = _scope_digest(root.root_id, workbench_id)
    prefix = keys.change_event_prefix(root.root_id)
    with root.read() as view:
        if cursor is not None:
            if after_commit_version is not None:
                raise InvalidInput("give a cursor or after_commit_version, not both")
            version, sequence = _decode(cursor, digest)
            start_after = keys.change_event_key(root.root_id, version, sequence)
        elif after_commit_version is not None:
            if after_commit_version > view.version:
                raise ReadVersionStale(
                    f"after_commit_version {after_commit_version} is newer than the root's {view.version}",
                    expected=after_commit_version,
                    current=view.version,
                )
            # Version-only: exclude every sequence of that commit.
            version, sequence = after_commit_version, 0xFFFFFFFF
            start_after = keys.change_event_key(root.root_id, version, sequence)
        elif view.event_floor:
            version, sequence = view.event_floor, 0xFFFFFFFF
            start_after = keys.change_event_key(root.root_id, version, sequence)
        else:
            version, sequence, start_after = 0, 0, None
        if view.event_floor and start_after is not None and (version, sequence) < (view.event_floor, 0xFFFFFFFF):
            raise _expired(view, version)
        if version > view.version:
            raise ReadVersionStale(
                f"the cursor is at version {version}, newer than the root's {view.version}",
                expected=version,
                current=view.version,
            )
        visible: dict[tuple[str, int], bytes | None] = {}
        out = []
        more = False
        marker = start_after
        while True:
            page = scan_prefix(view, "change_event", prefix, start_after=marker, limit=MAX_ITEMS_PER_CALL)
            for key, value in page.items:
                decoded = keys.ChangeEventKey.decode(key)
                event = ChangeEvent.decode(value)
                if workbench_id is None or event.workbench_id == workbench_id:
                    if len(out) == limit:
                        more = True  # the one visible-page lookahead
                        break
                    if _visible_at(view, root, visible, event, decoded.commit_version):
                        out.append(
                            Change(
                                decoded.commit_version,
                                decoded.event_sequence,
                                event.workbench_id,
                                event.workspace_incarnation_id,
                                event.kind,
                                event.path,
                                event.before,
                                event.after,
                            )
                        )
                version, sequence = decoded.commit_version, decoded.event_sequence
            else:
                if page.next_marker is None:
                    break
                marker = page.next_marker
                continue
            break
        return ChangesPage(tuple(out), _encode(digest, version, sequence), view.version, more)


def _visible_at(view, root, cache: dict, event: ChangeEvent, commit_version: int) -> bool:
    slot = (event.workbench_id, commit_version)
    if slot not in cache:
        # A visibility read: it may go below the history floor, which kept the projection.
        raw = view.at(commit_version, visibility=True).get(
            "workspace_current", keys.WorkspaceCurrentKey(root.root_id, event.workbench_id).encode()
        )
        cache[slot] = raw
    raw = cache[slot]
    if raw is None:
        return False
    marker = WorkspaceCurrent.decode(raw)
    return marker.state == WorkspaceState.Visible and marker.workspace_incarnation_id == event.workspace_incarnation_id


def _expired(view, position: int) -> CursorExpired:
    return CursorExpired(
        f"the change-feed position (version {position}) is older than the retained events (the feed keeps "
        f"those after version {view.event_floor}): resynchronise -- read the current state (version "
        f"{view.version}), then follow from it (`nokvfs changes --after {view.version} --follow`)",
        position=position,
        floor=view.event_floor,
        current=view.version,
    )


def events_after(view, root, version: int):
    """Every (commit version, ChangeEvent) of the root committed after `version`, read in `view`
    in log order (bounded pages): the raw feed a follower applies, Staging incarnations included
    (the follower judges them itself). CursorExpired when events after `version` may be gone."""
    if version < view.event_floor:
        raise _expired(view, version)
    prefix = keys.change_event_prefix(root.root_id)
    marker = keys.change_event_key(root.root_id, version, 0xFFFFFFFF)
    while True:
        page = scan_prefix(view, "change_event", prefix, start_after=marker)
        for key, value in page.items:
            yield keys.ChangeEventKey.decode(key).commit_version, ChangeEvent.decode(value)
        if page.next_marker is None:
            return
        marker = page.next_marker
