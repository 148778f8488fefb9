"""As of: a workbench's tree at a snapshot, a commit or a tag -- one model for every front end.

The mount's read-only views (`/<wb>/.snapshots/`, `.commits/`, `.tags/`) and the CLI's `as-of`
both read through here:

* `locate(view, root, workbench, kind, selector)` turns ("snapshot", id or alias), ("commit",
  id or unique hex prefix) or ("tag", name) into a `Point` within one read view: an Active
  snapshot, or a Sealed commit (a tag is the commit it names now). Anything else is NotFound;
  an ambiguous prefix is commit.AmbiguousReference.
* `open(view, root, workbench_id, incarnation, point)` returns the point's `Tree`: a snapshot's
  is a `PathTree` over PathCurrent at the snapshot's held read version (MVCC), a commit's a
  `CommitTree` over its CommitMember rows. The snapshot's Active state is checked in the view
  it is opened in, so a Retired or Reaped snapshot is NotFound to every later read.
* `points(root, workbench, kind)` enumerates what a family holds: every Active snapshot by id
  and each alias whose latest mint is Active, the head's first-parent log of Sealed commits,
  every tag.

Every Tree answers the same reads, the way `listing` answers them for the live tree: `stat`,
`entry` (the file at a path, or None), `has_children`, `children_page` (one bounded page and
the next anchor), `children` (every page) and `files` (every file below a path, in canonical
order). A `PathTree` over the current version is the live tree; `path_entry` and
`path_has_children` are its point reads for a caller that knows only the incarnation. Reads
are LMDB point reads and bounded scans; nothing is read before a tree is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, iter_prefix, list_children
from nokvfs.errors import InvalidInput, NotADirectory, NotFound
from nokvfs.schema import keys
from nokvfs.schema.enums import CommitState, SnapshotState
from nokvfs.schema.ids import check_commit_id
from nokvfs.schema.paths import join, subtree_prefix, unordered_path
from nokvfs.schema.records import CommitMember, PathEntry, WorkspaceCurrent
from nokvfs.workspace import attributes, commit, listing, snapshot, tag
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.consumers import read_commit

SNAPSHOT = "snapshot"
COMMIT = "commit"
TAG = "tag"
LOG_LIMIT = 100_000  # commits a `points(COMMIT)` enumeration walks back (first parents)


@dataclass(frozen=True)
class Point:
    """What a tree is as of: an Active snapshot (`snapshot_id`) or a Sealed commit (`commit_id`)."""

    kind: str  # SNAPSHOT or COMMIT
    snapshot_id: int | None = None
    commit_id: bytes | None = None


# --- trees ------------------------------------------------------------------------------------


class Tree:
    """The reads every as-of tree answers. `view` is the ReadView it reads, `workbench` the
    workbench as of its point."""

    view = None
    workbench: wb.Workbench = None

    def stat(self, components: tuple[str, ...]) -> listing.Stat:
        raise NotImplementedError

    def entry(self, components: tuple[str, ...]) -> PathEntry | None:
        raise NotImplementedError

    def has_children(self, components: tuple[str, ...]) -> bool:
        raise NotImplementedError

    def children_page(
        self, components: tuple[str, ...], *, start_after: bytes | None = None, limit: int = MAX_ITEMS_PER_CALL
    ):
        """One bounded page of a directory's children: ([listing.Child], next anchor or None)."""
        raise NotImplementedError

    def files(self, path: str = "", *, with_markers: bool = False):
        """Every file below `path` as (path below it, PathEntry), in canonical order; directory
        attribute markers only `with_markers` (a recursive get restores directory attributes)."""
        raise NotImplementedError

    def children(self, components: tuple[str, ...]):
        """Every child of a directory, page after bounded page."""
        anchor = None
        while True:
            page, anchor = self.children_page(components, start_after=anchor)
            yield from page
            if anchor is None:
                return


def path_entry(view, root, incarnation: bytes, components: tuple[str, ...]) -> PathEntry | None:
    """The file at a path of an incarnation: exactly one PathCurrent point read."""
    raw = view.get("path_current", keys.path_current_key(root.root_id, incarnation, components))
    return None if raw is None else PathEntry.decode(raw)


def path_has_children(view, root, incarnation: bytes, components: tuple[str, ...]) -> bool:
    """Whether anything lives below a path: one bounded prefix probe."""
    prefix = keys.path_subtree_prefix(root.root_id, incarnation, components)
    return view.seek("path_current", prefix, within=prefix) is not None


def _files(view, family: str, prefix: bytes, base: int, components, decode, with_markers: bool):
    for key, value in iter_prefix(view, family, prefix):
        full = unordered_path(key[base:])
        if with_markers or full[-1] != attributes.DIRECTORY_MARKER:
            yield join(full[len(components) :]), decode(value)


class PathTree(Tree):
    """A workbench's PathCurrent rows at a ReadView's version: the live tree at the current
    version, a snapshot's at its held read version."""

    def __init__(self, view, root, workbench: wb.Workbench):
        self.view = view
        self.root = root
        self.workbench = workbench

    def stat(self, components):
        """One PathCurrent point read; a miss falls back to one bounded prefix probe."""
        return listing.stat_in(self.view, self.root, self.workbench, components)

    def entry(self, components):
        return path_entry(self.view, self.root, self.workbench.incarnation_id, components)

    def has_children(self, components):
        return path_has_children(self.view, self.root, self.workbench.incarnation_id, components)

    def children_page(self, components, *, start_after=None, limit=MAX_ITEMS_PER_CALL):
        return listing.children_page(
            self.view, self.root, self.workbench, components, start_after=start_after, limit=limit
        )

    def files(self, path="", *, with_markers=False):
        components = listing.split(path)
        incarnation = self.workbench.incarnation_id
        whole = keys.path_current_prefix(self.root.root_id, incarnation)
        prefix = whole if not components else keys.path_subtree_prefix(self.root.root_id, incarnation, components)
        return _files(self.view, "path_current", prefix, len(whole), components, PathEntry.decode, with_markers)


class CommitTree(Tree):
    """A Sealed commit's tree served like a workbench at a version, over its CommitMember rows
    (bounded delimiter scans, never a scan per descendant). Entries are PathEntry projections
    (commit.entry_of) of the members, their versions the commit's."""

    def __init__(self, view, root, commit_id: bytes, sealed, workbench: wb.Workbench):
        self.view = view
        self.root = root
        self.commit_id = commit_id
        self.commit = sealed
        self.workbench = workbench
        self._prefix = keys.commit_member_prefix(root.root_id, commit_id)

    def _entry_of(self, raw: bytes) -> PathEntry:
        return commit.entry_of(CommitMember.decode(raw), self.commit.created_version)

    def entry(self, components):
        if len(components) < 2:
            return None  # the workbench and its sections are directories
        raw = self.view.get(
            "commit_member", keys.CommitMemberKey(self.root.root_id, self.commit_id, components).encode()
        )
        return None if raw is None else self._entry_of(raw)

    def has_children(self, components):
        try:
            return self.stat(components).kind == listing.DIRECTORY
        except NotFound:
            return False

    def stat(self, components):
        def below():
            sub = self._prefix + subtree_prefix(components)
            return self.view.seek("commit_member", sub, within=sub) is not None

        label = f"{self.workbench.workbench_id}@{self.commit_id.hex()[:12]}"
        revision = self.commit.tree_manifest_revision
        return listing.stat_tree(
            components, self.workbench, self.view.version, revision, label, lambda: self.entry(components), below
        )

    def children_page(self, components, *, start_after=None, limit=MAX_ITEMS_PER_CALL):
        if not components:
            names = sorted(s.encode() for s in wb.SECTIONS)
            start = 0 if start_after is None else next((i for i, n in enumerate(names) if n > start_after), len(names))
            chosen = names[start : start + limit]
            anchor = chosen[-1] if start + limit < len(names) and chosen else None
            return [listing.Child(n.decode(), listing.DIRECTORY, None) for n in chosen], anchor
        info = self.stat(components)
        if info.kind != listing.DIRECTORY:
            raise NotADirectory(f"{info.path} is a file")
        out, anchor = [], start_after
        while not out:  # never an empty page with an anchor (a page of only the marker)
            page = list_children(
                self.view, "commit_member", self._prefix + subtree_prefix(components), start_after=anchor, limit=limit
            )
            for item in page.items:
                name = unordered_path(item.child + b"\x01")[0]
                if item.is_prefix:
                    out.append(listing.Child(name, listing.DIRECTORY, None))
                elif name != attributes.DIRECTORY_MARKER:  # a directory's attributes, not a child
                    out.append(listing.Child(name, listing.FILE, self._entry_of(item.value)))
            anchor = page.next_marker
            if anchor is None:
                break
        return out, anchor

    def files(self, path="", *, with_markers=False):
        components = listing.split(path)
        return _files(
            self.view,
            "commit_member",
            self._prefix + subtree_prefix(components),
            len(self._prefix),
            components,
            self._entry_of,
            with_markers,
        )


# --- points -----------------------------------------------------------------------------------


def at_snapshot(view, root, workbench_id: str, incarnation: bytes | None, snapshot_id: int) -> PathTree:
    """The workbench as of an Active snapshot of its incarnation (`incarnation`: the current
    one when None): MVCC reads at the snapshot's read version, the workbench as it was then."""
    _, workbench = wb.visible(view, root.root_id, workbench_id)
    if incarnation is not None and workbench.incarnation_id != incarnation:
        raise NotFound(f"snapshot {snapshot_id} belongs to another incarnation of {workbench_id}")
    at = snapshot.view_at(view, root, snapshot.find(view, root, workbench, snapshot_id))
    _, then = wb.visible(at, root.root_id, workbench_id)
    if then.incarnation_id != workbench.incarnation_id:
        raise NotFound(f"workbench {workbench_id!r} was another incarnation at snapshot {snapshot_id}")
    return PathTree(at, root, then)


def at_commit(view, root, commit_id: bytes) -> CommitTree:
    """The tree of a Sealed commit (NotFound for Retiring/Retired: their members are released)."""
    _, sealed = read_commit(view, root.root_id, check_commit_id(commit_id))
    if sealed is None or sealed.state != CommitState.Sealed:
        raise NotFound(f"commit {commit_id.hex()} is not a Sealed commit")
    raw = view.get("workspace_current", wb.current_key(root.root_id, sealed.source_workbench_id))
    if raw is None:
        raise NotFound(f"the workbench of commit {commit_id.hex()} is gone")
    workbench = wb.Workbench.from_record(sealed.source_workbench_id, WorkspaceCurrent.decode(raw))
    return CommitTree(view, root, commit_id, sealed, workbench)


def locate(view, root, workbench: wb.Workbench, kind: str, selector) -> Point:
    """The point a selector names in `workbench` right now (see the module docstring)."""
    if kind == SNAPSHOT:
        found = snapshot.find(view, root, workbench, selector)
        if found.ref.state != SnapshotState.Active:
            raise NotFound(f"snapshot {found.snapshot_id} is {found.ref.state.name}")
        return Point(SNAPSHOT, snapshot_id=found.snapshot_id)
    if kind == COMMIT:
        commit_id = (
            bytes(selector)
            if isinstance(selector, (bytes, bytearray))
            else commit.resolve_in(view, root, workbench, selector)
        )
    elif kind == TAG:
        commit_id = tag.resolve_in(view, root, workbench, selector).commit_id
    else:
        raise InvalidInput(f"an as-of point is a snapshot, commit or tag, not {kind!r}")
    at_commit(view, root, commit_id)  # Sealed, or NotFound
    return Point(COMMIT, commit_id=commit_id)


def open(view, root, workbench_id: str, incarnation: bytes | None, point: Point) -> Tree:
    """The tree of a point, read in `view`."""
    if point.kind == SNAPSHOT:
        return at_snapshot(view, root, workbench_id, incarnation, point.snapshot_id)
    return at_commit(view, root, point.commit_id)


def points(root, workbench: wb.Workbench, kind: str) -> list[tuple[str, Point]]:
    """(name, point) of every entry of a family, in listing order: snapshots by id (ascending)
    and then each alias whose latest mint is Active (a terminal latest mint does not fall back
    to an earlier one); commits of the head's first-parent log, newest first, by full id;
    tags by name."""
    out = []
    if kind == SNAPSHOT:
        found = [
            s
            for s in snapshot.list_snapshots(root, workbench.workbench_id)
            if s.workbench.incarnation_id == workbench.incarnation_id
        ]
        latest: dict[str, snapshot.Snapshot] = {}
        for snap in found:
            alias = snap.ref.alias
            if alias is not None and (alias not in latest or snap.snapshot_id > latest[alias].snapshot_id):
                latest[alias] = snap
        for snap in sorted(found, key=lambda s: s.snapshot_id):
            if snap.ref.state == SnapshotState.Active:
                out.append((str(snap.snapshot_id), Point(SNAPSHOT, snapshot_id=snap.snapshot_id)))
        for alias in sorted(latest, key=lambda a: a.encode("utf-8")):
            if latest[alias].ref.state == SnapshotState.Active:
                out.append((alias, Point(SNAPSHOT, snapshot_id=latest[alias].snapshot_id)))
    elif kind == COMMIT:
        for info in commit.log(root, workbench.workbench_id, limit=LOG_LIMIT):
            if info.state == CommitState.Sealed:
                out.append((info.hex, Point(COMMIT, commit_id=info.commit_id)))
    elif kind == TAG:
        for info in tag.list_tags(root, workbench.workbench_id):
            out.append((info.name, Point(COMMIT, commit_id=info.commit_id)))
    return out
