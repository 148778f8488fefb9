"""Views: what a part of the mount shows, and how it is read.

A view answers the read questions of the directory tree -- which workbenches exist, what a path
is, which children a directory has -- against one source:

    live                     the current version of the root (LiveView)
    snapshot:<id>[:<alias>]  `/<wb>/.snapshots/<id-or-alias>/`: MVCC reads at the snapshot's
                             read version (SnapshotView, through `snapshot.view_at`)
    commit:<hex>[:<prefix>]  `/<wb>/.commits/<id-or-unique-prefix>/`: the commit's members
                             (CommitView over `commit.tree_view`)
    tag:<hex>:<name>         `/<wb>/.tags/<name>/`: the tagged commit's members

The string is the view's *identity*: it is hashed into every inode number of the view, so a
snapshot's or commit's paths never share a number (or page cache) with their live versions, and
a view can be rebuilt from a node alone (`from_identity`), which is how views are loaded lazily
(borg's archive views): nothing is read until a directory is looked up or listed. A directory
reachable under two names (an alias and an id, or a prefix and the full id) gets one identity per
name, so no directory ever has two parents in the kernel's dentry cache. A tag's identity holds
the commit it named when it was looked up: a tag that moves gets new inodes, and the event
invalidates the old name.

Every view has the same read interface -- `read()` (a read context), `require`, `stat`,
`entry`, `has_children`, `children` -- so the tree and the handles serve them all alike; the
read-only ones say `immutable = True` (long kernel timeouts, keep_cache) and `read_only = True`.

A snapshot view re-checks on every read context that the snapshot is still Active
(`snapshot.get`, then `snapshot.view_at`), so a Retired or Reaped snapshot answers ENOENT even to
a process standing in it. A commit view re-reads the commit's row (`commit.tree_view`, Sealed
only). Reads are LMDB point reads and bounded scans, cheap enough to run inline on the event loop.

The live view caches each workbench's incarnation: Visible is terminal and its incarnation never
changes (seed: "a client may cache the incarnation because Visible is immutable"), so a cached
incarnation lets getattr of a file cost exactly one PathCurrent point read.
"""

from __future__ import annotations

import contextlib
import logging

from nokvfs.errors import InvalidInput, NotFound, PathInvalid
from nokvfs.schema import keys
from nokvfs.schema.enums import CommitState, SnapshotState
from nokvfs.schema.paths import check_component
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import commit, listing, snapshot, tag
from nokvfs.workspace import workbench as wb

log = logging.getLogger(__name__)

LIVE = "live"
SNAPSHOTS = ".snapshots"
COMMITS = ".commits"
TAGS = ".tags"
HISTORY_DIRS = (COMMITS, SNAPSHOTS, TAGS)  # in name order
LOG_LIMIT = 100_000  # commits listed in `.commits/` (the head's first-parent log, newest first)


class _PathReads:
    """Path reads over a ReadView (current or MVCC at a version): the live and snapshot views."""

    root = None

    def stat(self, view, workbench: wb.Workbench, components: tuple) -> listing.Stat:
        """One PathCurrent point read; a miss falls back to one bounded prefix probe."""
        return listing.stat_in(view, self.root, workbench, components)

    def entry(self, view, incarnation: bytes, components: tuple) -> PathEntry | None:
        """The file at a path of a known incarnation: exactly one PathCurrent point read."""
        raw = view.get("path_current", keys.path_current_key(self.root.root_id, incarnation, components))
        return None if raw is None else PathEntry.decode(raw)

    def has_children(self, view, incarnation: bytes, components: tuple) -> bool:
        prefix = keys.path_subtree_prefix(self.root.root_id, incarnation, components)
        return view.seek("path_current", prefix, within=prefix) is not None

    def children(self, view, workbench: wb.Workbench, components: tuple, *, start_after: bytes | None, limit: int):
        """One bounded page of a directory's children: ([listing.Child], next anchor or None)."""
        return listing.children_page(view, self.root, workbench, components, start_after=start_after, limit=limit)


class LiveView(_PathReads):
    name = LIVE
    family = None
    immutable = False  # snapshot, commit and tag views are; they get long kernel timeouts

    def __init__(self, root, *, read_only: bool = False):
        self.root = root
        self.read_only = read_only
        self._incarnations: dict[str, bytes] = {}

    def read(self):
        """A consistent read context (a ReadView at the current version)."""
        return self.root.read()

    # --- workbenches ----------------------------------------------------------------------------

    def workbenches(self, view) -> list[wb.Workbench]:
        found = wb.list_visible(view, self.root.root_id)
        for workbench in found:
            self._incarnations[workbench.workbench_id] = workbench.incarnation_id
        return found

    def workbench(self, view, workbench_id: str) -> wb.Workbench:
        """One WorkspaceCurrent point read: the Visible workbench, or NotFound."""
        _, workbench = wb.visible(view, self.root.root_id, workbench_id)
        self._incarnations[workbench_id] = workbench.incarnation_id
        return workbench

    def incarnation(self, workbench_id: str) -> bytes | None:
        return self._incarnations.get(workbench_id)

    def require(self, view, workbench_id: str, incarnation: bytes) -> wb.Workbench:
        """The workbench, checked to still be the incarnation a node was made for."""
        workbench = self.workbench(view, workbench_id)
        if workbench.incarnation_id != incarnation:
            raise NotFound(f"workbench {workbench_id!r} is another incarnation now")
        return workbench

    def facts(self) -> dict:
        return {}


# --- read-only views ----------------------------------------------------------------------------


class SnapshotView(_PathReads):
    """The workbench as of a snapshot's read version (an MVCC view), sections included."""

    family = SNAPSHOTS
    immutable = True
    read_only = True

    def __init__(self, root, workbench_id: str, incarnation: bytes, snapshot_id: int, entry_name: str | None = None):
        self.root = root
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.snapshot_id = snapshot_id
        self.entry_name = str(snapshot_id) if entry_name is None else entry_name
        self.name = f"snapshot:{snapshot_id}" if self.entry_name == str(snapshot_id) else f"snapshot:{snapshot_id}:{self.entry_name}"

    @contextlib.contextmanager
    def read(self):
        """A ReadView at the snapshot's read version; NotFound once it is not Active."""
        snap = snapshot.get(self.root, self.workbench_id, self.snapshot_id)
        if snap.workbench.incarnation_id != self.incarnation:
            raise NotFound(f"snapshot {self.snapshot_id} belongs to another incarnation of {self.workbench_id}")
        with self.root.read() as current:
            yield snapshot.view_at(current, self.root, snap)

    def require(self, view, workbench_id: str, incarnation: bytes) -> wb.Workbench:
        """The workbench as it was at the snapshot (its revision then)."""
        _, workbench = wb.visible(view, self.root.root_id, workbench_id)
        if workbench.incarnation_id != incarnation:
            raise NotFound(f"workbench {workbench_id!r} was another incarnation at snapshot {self.snapshot_id}")
        return workbench

    def facts(self) -> dict:
        return {b"user.nokvfs.snapshot": str(self.snapshot_id)}


class CommitView:
    """A Sealed commit's tree (its CommitMember rows), sections included; also a tag's."""

    immutable = True
    read_only = True

    def __init__(self, root, workbench_id: str, incarnation: bytes, commit_id: bytes, entry_name: str | None = None, *, family: str = COMMITS):
        self.root = root
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.commit_id = commit_id
        self.family = family
        full = commit_id.hex()
        self.entry_name = full if entry_name is None else entry_name
        if family == TAGS:
            self.name = f"tag:{full}:{self.entry_name}"
        else:
            self.name = f"commit:{full}" if self.entry_name == full else f"commit:{full}:{self.entry_name}"

    @contextlib.contextmanager
    def read(self):
        """The commit's CommitTree in a fresh read transaction; NotFound unless it is Sealed."""
        with self.root.read() as current:
            yield commit.tree_view(current, self.root, self.commit_id)

    def require(self, tree, workbench_id: str, incarnation: bytes) -> wb.Workbench:
        # The commit's own workbench (a tag may name a commit of another workbench).
        return tree.workbench

    def stat(self, tree, workbench, components: tuple) -> listing.Stat:
        return tree.stat(components)

    def entry(self, tree, incarnation: bytes, components: tuple) -> PathEntry | None:
        if len(components) < 2:
            return None
        return tree.entry(components)

    def has_children(self, tree, incarnation: bytes, components: tuple) -> bool:
        try:
            return tree.stat(components).kind == listing.DIRECTORY
        except NotFound:
            return False

    def children(self, tree, workbench, components: tuple, *, start_after: bytes | None, limit: int):
        return tree.children_page(components, start_after=start_after, limit=limit)

    def facts(self) -> dict:
        return {b"user.nokvfs.commit": self.commit_id.hex()}


def from_identity(root, identity: str, workbench_id: str, incarnation: bytes):
    """The read-only view an identity names (the inverse of `view.name`)."""
    kind, _, rest = identity.partition(":")
    ident, _, entry_name = rest.partition(":")
    if kind == "snapshot":
        return SnapshotView(root, workbench_id, incarnation, int(ident), entry_name or None)
    if kind == "commit":
        return CommitView(root, workbench_id, incarnation, bytes.fromhex(ident), entry_name or None)
    if kind == "tag":
        return CommitView(root, workbench_id, incarnation, bytes.fromhex(ident), entry_name, family=TAGS)
    raise ValueError(f"not a view identity: {identity!r}")


# --- the names in `.snapshots/`, `.commits/` and `.tags/` ---------------------------------------


def _canonical_number(name: str) -> bool:
    return name.isascii() and name.isdigit() and str(int(name)) == name


def _usable(name: str) -> bool:
    """A name a directory entry can have (the path normalizer's component rules)."""
    try:
        check_component(name)
    except PathInvalid:
        return False
    return name not in (".", "..")


def resolve(root, workbench: wb.Workbench, family: str, name: str):
    """The view `/<wb>/<family>/<name>` shows right now, or None (ENOENT).

    `.snapshots`: a canonical decimal number is a snapshot id, anything else an alias (its latest
    mint); only an Active snapshot resolves. `.commits`: a full id or any unique lowercase hex
    prefix of a commit of the workbench (Sealed); an ambiguous prefix logs its matches and
    resolves to nothing. `.tags`: the tag's commit (Sealed).
    """
    workbench_id = workbench.workbench_id
    if family == SNAPSHOTS:
        if name.isascii() and name.isdigit() and not _canonical_number(name):
            return None
        selector = int(name) if _canonical_number(name) else name
        try:
            found = snapshot.get(root, workbench_id, selector)
        except (NotFound, InvalidInput):
            return None
        if found.ref.state != SnapshotState.Active or found.workbench.incarnation_id != workbench.incarnation_id:
            return None
        return SnapshotView(root, workbench_id, workbench.incarnation_id, found.snapshot_id, name)
    if family == COMMITS:
        try:
            commit_id = commit.resolve(root, workbench_id, name)
        except commit.AmbiguousReference as exc:
            log.warning(
                "/%s/%s/%s is ambiguous (ENOENT): it is a prefix of %d commits: %s",
                workbench_id, COMMITS, name, len(exc.matches), ", ".join(exc.matches),
            )
            return None
        except (NotFound, InvalidInput):
            return None
        if not _sealed(root, commit_id):
            return None
        return CommitView(root, workbench_id, workbench.incarnation_id, commit_id, name)
    if family == TAGS:
        try:
            info = tag.resolve(root, workbench_id, name)
        except (NotFound, InvalidInput):
            return None
        if not _sealed(root, info.commit_id):
            return None
        return CommitView(root, workbench_id, workbench.incarnation_id, info.commit_id, name, family=TAGS)
    return None


def _sealed(root, commit_id: bytes) -> bool:
    with root.read() as current:
        try:
            commit.tree_view(current, root, commit_id)
        except NotFound:
            return False
    return True


def names(root, workbench: wb.Workbench, family: str) -> list:
    """(name, view) of every entry of `/<wb>/<family>/`, in listing order.

    `.snapshots`: every Active snapshot by id (ascending), then each alias whose latest mint is
    Active (a terminal latest mint does not fall back to an earlier one). `.commits`: the head's
    first-parent log, newest first, by full id. `.tags`: every tag whose commit is Sealed, by name.
    """
    workbench_id, incarnation = workbench.workbench_id, workbench.incarnation_id
    out = []
    if family == SNAPSHOTS:
        found = [s for s in snapshot.list_snapshots(root, workbench_id) if s.workbench.incarnation_id == incarnation]
        latest: dict[str, snapshot.Snapshot] = {}
        for snap in found:
            alias = snap.ref.alias
            if alias is not None and (alias not in latest or snap.snapshot_id > latest[alias].snapshot_id):
                latest[alias] = snap
        for snap in sorted(found, key=lambda s: s.snapshot_id):
            if snap.ref.state == SnapshotState.Active:
                out.append((str(snap.snapshot_id), SnapshotView(root, workbench_id, incarnation, snap.snapshot_id)))
        for alias in sorted(latest, key=lambda a: a.encode("utf-8")):
            snap = latest[alias]
            if snap.ref.state == SnapshotState.Active and _usable(alias) and not (alias.isascii() and alias.isdigit()):
                out.append((alias, SnapshotView(root, workbench_id, incarnation, snap.snapshot_id, alias)))
    elif family == COMMITS:
        for info in commit.log(root, workbench_id, limit=LOG_LIMIT):
            if info.state == CommitState.Sealed:
                out.append((info.hex, CommitView(root, workbench_id, incarnation, info.commit_id)))
    elif family == TAGS:
        for info in tag.list_tags(root, workbench_id):
            if _usable(info.name):
                out.append((info.name, CommitView(root, workbench_id, incarnation, info.commit_id, info.name, family=TAGS)))
    return out
