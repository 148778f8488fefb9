"""Reads of the namespace: stat, direct-child listing and recursive listing.

stat is one WorkspaceCurrent point read and one PathCurrent point read; a miss falls back to one
bounded prefix probe for an implicit directory. Listings are the engine's delimiter scans, paged;
their cursors carry the read version as a fence, a digest of what was listed and the last anchor,
so a continuation after the shard has moved is a typed ReadVersionStale, never a mixed page.

Listing a path that is itself a file follows the seed: "When the requested prefix can itself be a
published file, the metadata listing also performs one exact-prefix point read after descendant
EOF; the Workbench direct-child adapter does not expose the requested path as its own child." So
a listing scans the descendants first and, on its last page, point-reads the path itself; a file
found there is the page's `exact` item, never one of its children (`ls FILE` shows the file).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, list_children, scan_prefix
from nokvfs.errors import InvalidInput, NotFound, ReadVersionStale
from nokvfs.schema import keys
from nokvfs.schema.paths import join, normalize_path, ordered_component, unordered_path
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import attributes
from nokvfs.workspace import workbench as wb

FILE = "file"
DIRECTORY = "dir"
_UNSHIFT = bytes([255]) + bytes(range(255))


@dataclass(frozen=True)
class Stat:
    path: str  # "" for the workbench itself
    kind: str
    entry: PathEntry | None  # files only
    generation: int  # file: path generation; directory: the workspace revision
    read_version: int
    workbench: wb.Workbench

    @property
    def size(self) -> int:
        return self.entry.logical_size if self.entry else 0


@dataclass(frozen=True)
class Child:
    name: str
    kind: str
    entry: PathEntry | None


@dataclass(frozen=True)
class ListPage:
    children: tuple
    read_version: int
    cursor: str | None  # None: the listing is complete
    # The file at the listed path itself (the exact-prefix point read after descendant EOF, so
    # only on the last page); None for a directory.
    exact: Child | None = None


def split(path: str) -> tuple[str, ...]:
    """'' (the workbench root) or a normalized relative path."""
    return () if path in ("", ".") else normalize_path(path)


def stat_in(view, root, workbench: wb.Workbench, components: tuple[str, ...]) -> Stat:
    incarnation = workbench.incarnation_id

    def entry():
        raw = view.get("path_current", keys.path_current_key(root.root_id, incarnation, components))
        return None if raw is None else PathEntry.decode(raw)

    def below():
        prefix = keys.path_subtree_prefix(root.root_id, incarnation, components)
        return view.seek("path_current", prefix, within=prefix) is not None

    return stat_tree(components, workbench, view.version, workbench.revision, workbench.workbench_id, entry, below)


def stat_tree(
    components: tuple[str, ...], workbench: wb.Workbench, version: int, revision: int, label: str, entry, below
) -> Stat:
    """The one namespace rule of every tree (live, snapshot, commit): the workbench and its
    sections are directories, nothing else lives at the top, a path is the file `entry()`
    finds there, else a directory when `below()` finds something under it, else NotFound
    (named `label`:path). Directories carry `revision` as their generation."""

    def directory(path):
        return Stat(path, DIRECTORY, None, revision, version, workbench)

    if not components:
        return directory("")
    path = join(components)
    if components[0] not in wb.SECTIONS:
        raise NotFound(f"{label}:{path} does not exist")
    if len(components) == 1:
        return directory(path)
    found = entry()
    if found is not None:
        return Stat(path, FILE, found, found.generation, version, workbench)
    if below():
        return directory(path)
    raise NotFound(f"{label}:{path} does not exist")


def has_children(view, root, incarnation: bytes, components: tuple[str, ...], *, ignore_marker: bool = True) -> bool:
    """Whether a directory holds anything (rmdir's emptiness test): one bounded delimiter scan
    of at most two children, the directory's own marker not counted unless asked."""
    prefix = keys.path_subtree_prefix(root.root_id, incarnation, components)
    page = list_children(view, "path_current", prefix, limit=2)
    marker = ordered_component(attributes.DIRECTORY_MARKER)
    return any(not ignore_marker or item.is_prefix or item.child != marker for item in page.items)


def stat(view, root, workbench_id: str, path: str) -> Stat:
    _, workbench = wb.visible(view, root.root_id, workbench_id)
    return stat_in(view, root, workbench, split(path))


def children_page(
    view,
    root,
    workbench: wb.Workbench,
    components: tuple[str, ...],
    *,
    start_after: bytes | None,
    limit: int = MAX_ITEMS_PER_CALL,
):
    """One bounded engine page of a directory's children: ([Child], next anchor or None).

    Anchors are ordered component bytes; the caller (a cursor, the mount's readdir) keeps them.
    """
    if not components:
        names = [s for s in wb.SECTIONS]
        ordered = sorted(n.encode() for n in names)
        start = 0 if start_after is None else next((i for i, n in enumerate(ordered) if n > start_after), len(ordered))
        chosen = ordered[start : start + limit]
        anchor = chosen[-1] if start + limit < len(ordered) and chosen else None
        return [Child(n.decode(), DIRECTORY, None) for n in chosen], anchor
    prefix = keys.path_subtree_prefix(root.root_id, workbench.incarnation_id, components)
    children, anchor = [], start_after
    while not children:  # a page holding only the marker is never returned empty with an anchor
        page = list_children(view, "path_current", prefix, start_after=anchor, limit=limit)
        for item in page.items:
            name = item.child.translate(_UNSHIFT).decode("utf-8")
            if not item.is_prefix and name == attributes.DIRECTORY_MARKER:
                continue  # a directory's attributes, not a child (the page may come out one short)
            if item.is_prefix:
                children.append(Child(name, DIRECTORY, None))
            else:
                children.append(Child(name, FILE, PathEntry.decode(item.value)))
        anchor = page.next_marker
        if anchor is None:
            break
    return children, anchor


def _cursor_digest(workbench: wb.Workbench, components, selector: str) -> bytes:
    h = hashlib.sha256(b"nokv.listing.cursor.v1\0")
    for part in (
        workbench.workbench_id.encode(),
        workbench.incarnation_id,
        join(components).encode(),
        selector.encode(),
    ):
        h.update(len(part).to_bytes(4, "big") + part)
    return h.digest()[:16]


def _encode_cursor(version: int, digest: bytes, anchor: bytes) -> str:
    return base64.urlsafe_b64encode(struct.pack(">Q", version) + digest + anchor).decode().rstrip("=")


def _decode_cursor(cursor: str, view, digest: bytes) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, TypeError):
        raise InvalidInput("malformed listing cursor") from None
    if len(raw) < 24:
        raise InvalidInput("malformed listing cursor")
    version = struct.unpack_from(">Q", raw)[0]
    if raw[8:24] != digest:
        raise InvalidInput("the cursor belongs to another listing")
    if version != view.version:
        raise ReadVersionStale(
            f"the listing cursor was made at version {version}; the root is at {view.version}",
            expected=version,
            current=view.version,
        )
    return raw[24:]


def _listed_path(root, workbench: wb.Workbench, workbench_id: str, components: tuple[str, ...]) -> None:
    """NotFound for a path outside the sections (nothing can exist there)."""
    if components and components[0] not in wb.SECTIONS:
        raise NotFound(f"{workbench_id}:{join(components)} does not exist")


def _after_descendant_eof(
    view, root, workbench: wb.Workbench, workbench_id: str, components, found_any: bool, first_page: bool
):
    """The exact-prefix point read after descendant EOF: the file at the listed path, or None.
    NotFound when a first and last page found neither descendants nor the path itself (and the
    directory holds not even its attributes marker, which listings leave out)."""
    exact = None
    if len(components) >= 2:  # the workbench and its sections are never files
        raw = view.get("path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, components))
        if raw is not None:
            exact = Child(components[-1], FILE, PathEntry.decode(raw))
    if exact is None and not found_any and first_page and len(components) >= 2:
        prefix = keys.path_subtree_prefix(root.root_id, workbench.incarnation_id, components)
        if view.seek("path_current", prefix, within=prefix) is None:
            raise NotFound(f"{workbench_id}:{join(components)} does not exist")
    return exact


def list_dir(
    view,
    root,
    workbench_id: str,
    path: str = "",
    *,
    cursor: str | None = None,
    limit: int = 1000,
    selector: str = "live",
) -> ListPage:
    """A protocol page of direct children (several bounded engine calls when limit > 255); on the
    last page, `exact` is the file at `path` itself if it is one."""
    if limit < 1:
        raise InvalidInput("limit must be positive")
    _, workbench = wb.visible(view, root.root_id, workbench_id)
    components = split(path)
    _listed_path(root, workbench, workbench_id, components)
    digest = _cursor_digest(workbench, components, selector)
    anchor = None if cursor is None else _decode_cursor(cursor, view, digest)
    out = []
    while len(out) < limit:
        children, anchor = children_page(
            view, root, workbench, components, start_after=anchor, limit=min(MAX_ITEMS_PER_CALL, limit - len(out))
        )
        out += children
        if anchor is None:
            break
    if anchor is not None:
        return ListPage(tuple(out), view.version, _encode_cursor(view.version, digest, anchor))
    exact = _after_descendant_eof(view, root, workbench, workbench_id, components, bool(out), cursor is None)
    return ListPage(tuple(out), view.version, None, exact)


def list_recursive(
    view,
    root,
    workbench_id: str,
    path: str = "",
    *,
    cursor: str | None = None,
    limit: int = 1000,
    with_markers: bool = False,
) -> ListPage:
    """Every file below `path`, in canonical path order; Child.name is the path below `path`. On
    the last page, `exact` is the file at `path` itself if it is one.

    Directory markers are left out unless `with_markers` (a recursive get restores directory
    attributes from them); a page may then hold fewer than `limit` children and a cursor.
    """
    if limit < 1:
        # Without this, limit 0 returns an empty page with no cursor: "complete" while it is not.
        raise InvalidInput("limit must be positive")
    _, workbench = wb.visible(view, root.root_id, workbench_id)
    components = split(path)
    _listed_path(root, workbench, workbench_id, components)
    prefix = (
        keys.path_current_prefix(root.root_id, workbench.incarnation_id)
        if not components
        else keys.path_subtree_prefix(root.root_id, workbench.incarnation_id, components)
    )
    base = len(keys.path_current_prefix(root.root_id, workbench.incarnation_id))
    digest = _cursor_digest(workbench, components, "recursive")
    marker = None if cursor is None else _decode_cursor(cursor, view, digest)
    out = []
    while len(out) < limit:
        page = scan_prefix(
            view, "path_current", prefix, start_after=marker, limit=min(MAX_ITEMS_PER_CALL, limit - len(out))
        )
        for key, value in page.items:
            full = unordered_path(key[base:])
            if not with_markers and full[-1] == attributes.DIRECTORY_MARKER:
                continue
            out.append(Child(join(full[len(components) :]), FILE, PathEntry.decode(value)))
        marker = page.next_marker
        if marker is None:
            break
    if marker is not None:
        return ListPage(tuple(out), view.version, _encode_cursor(view.version, digest, marker))
    exact = _after_descendant_eof(view, root, workbench, workbench_id, components, bool(out), cursor is None)
    return ListPage(tuple(out), view.version, None, exact)
