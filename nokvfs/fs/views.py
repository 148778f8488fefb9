"""Views: what a part of the mount shows, and how it is read.

A view answers the read questions of the directory tree -- which workbenches exist, what a path
is, which children a directory has -- against one source:

    live                     the current version of the root (LiveView)
    snapshot:<id>[:<alias>]  `/<wb>/.snapshots/<id-or-alias>/`: MVCC reads at the snapshot's
                             read version (SnapshotView)
    commit:<hex>[:<prefix>]  `/<wb>/.commits/<id-or-unique-prefix>/`: the commit's members
                             (CommitView)
    tag:<hex>:<name>         `/<wb>/.tags/<name>/`: the tagged commit's members

The read-only views are a thin adapter over the workspace's as-of model (nokvfs.workspace.asof):
each read context is an asof Tree and every read is the tree's.

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
(`asof.at_snapshot`), so a Retired or Reaped snapshot answers ENOENT even to a process standing
in it. A commit view re-reads the commit's row (`asof.at_commit`, Sealed only). Reads are LMDB
point reads and bounded scans, cheap enough to run inline on the event loop.

The live view caches each workbench's incarnation: Visible is terminal and its incarnation never
changes (seed: "a client may cache the incarnation because Visible is immutable"), so a cached
incarnation lets getattr of a file cost exactly one PathCurrent point read.
"""

from __future__ import annotations

import contextlib
import logging

from nokvfs.errors import InvalidInput, NotFound, PathInvalid
from nokvfs.schema.paths import check_component
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import asof, attributes, commit, listing
from nokvfs.workspace import workbench as wb

log = logging.getLogger(__name__)

LIVE = "live"
SNAPSHOTS = ".snapshots"
COMMITS = ".commits"
TAGS = ".tags"
HISTORY_DIRS = (COMMITS, SNAPSHOTS, TAGS)  # in name order
_KINDS = {SNAPSHOTS: asof.SNAPSHOT, COMMITS: asof.COMMIT, TAGS: asof.TAG}


class LiveView:
    name = LIVE
    family = None
    immutable = False  # snapshot, commit and tag views are; they get long kernel timeouts

    def __init__(self, root, *, read_only: bool = False):
        self.root = root
        self.read_only = read_only

    def read(self):
        """A consistent read context (a ReadView at the current version)."""
        return self.root.read()

    # --- workbenches ----------------------------------------------------------------------------

    def workbenches(self, view) -> list[wb.Workbench]:
        return wb.list_visible(view, self.root.root_id)

    def workbench(self, view, workbench_id: str) -> wb.Workbench:
        """One WorkspaceCurrent point read: the Visible workbench, or NotFound."""
        _, workbench = wb.visible(view, self.root.root_id, workbench_id)
        return workbench

    def require(self, view, workbench_id: str, incarnation: bytes) -> wb.Workbench:
        """The workbench, checked to still be the incarnation a node was made for."""
        workbench = self.workbench(view, workbench_id)
        if workbench.incarnation_id != incarnation:
            raise NotFound(f"workbench {workbench_id!r} is another incarnation now")
        return workbench

    def stat(self, view, workbench: wb.Workbench, components: tuple) -> listing.Stat:
        """One PathCurrent point read; a miss falls back to one bounded prefix probe."""
        return asof.PathTree(view, self.root, workbench).stat(components)

    def entry(self, view, incarnation: bytes, components: tuple) -> PathEntry | None:
        """The file at a path of a known incarnation: exactly one PathCurrent point read."""
        return asof.path_entry(view, self.root, incarnation, components)

    def has_children(self, view, incarnation: bytes, components: tuple) -> bool:
        return asof.path_has_children(view, self.root, incarnation, components)

    def children(self, view, workbench: wb.Workbench, components: tuple, *, start_after: bytes | None, limit: int):
        """One bounded page of a directory's children: ([listing.Child], next anchor or None)."""
        return asof.PathTree(view, self.root, workbench).children_page(components, start_after=start_after, limit=limit)

    def directory_attributes(self, view, incarnation: bytes, components: tuple):
        """A directory's stored attributes (its marker's), or None: one point read."""
        entry = asof.path_entry(view, self.root, incarnation, components + (attributes.DIRECTORY_MARKER,))
        return None if entry is None else attributes.shown(entry)

    def facts(self) -> dict:
        return {}


# --- read-only views ----------------------------------------------------------------------------


class _AsOfView:
    """A read-only view: each read context is the as-of Tree of its point; reads are the tree's."""

    immutable = True
    read_only = True
    root = None
    incarnation: bytes = None
    workbench_id: str = None

    @contextlib.contextmanager
    def read(self):
        """The view's asof Tree in a fresh read transaction; NotFound once its point is gone."""
        with self.root.read() as current:
            yield asof.open(current, self.root, self.workbench_id, self.incarnation, self.point)

    def require(self, tree, workbench_id: str, incarnation: bytes) -> wb.Workbench:
        """The workbench as of the point (a tag may name a commit of another workbench)."""
        return tree.workbench

    def stat(self, tree, workbench, components: tuple) -> listing.Stat:
        return tree.stat(components)

    def entry(self, tree, incarnation: bytes, components: tuple) -> PathEntry | None:
        return tree.entry(components)

    def has_children(self, tree, incarnation: bytes, components: tuple) -> bool:
        return tree.has_children(components)

    def children(self, tree, workbench, components: tuple, *, start_after: bytes | None, limit: int):
        return tree.children_page(components, start_after=start_after, limit=limit)

    def directory_attributes(self, tree, incarnation: bytes, components: tuple):
        entry = tree.entry(components + (attributes.DIRECTORY_MARKER,))
        return None if entry is None else attributes.shown(entry)


class SnapshotView(_AsOfView):
    """The workbench as of a snapshot's read version (an MVCC view), sections included."""

    family = SNAPSHOTS

    def __init__(self, root, workbench_id: str, incarnation: bytes, snapshot_id: int, entry_name: str | None = None):
        self.root = root
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.snapshot_id = snapshot_id
        self.point = asof.Point(asof.SNAPSHOT, snapshot_id=snapshot_id)
        self.entry_name = str(snapshot_id) if entry_name is None else entry_name
        self.name = (
            f"snapshot:{snapshot_id}"
            if self.entry_name == str(snapshot_id)
            else f"snapshot:{snapshot_id}:{self.entry_name}"
        )

    def facts(self) -> dict:
        return {b"user.nokvfs.snapshot": str(self.snapshot_id)}


class CommitView(_AsOfView):
    """A Sealed commit's tree (its CommitMember rows), sections included; also a tag's."""

    def __init__(
        self,
        root,
        workbench_id: str,
        incarnation: bytes,
        commit_id: bytes,
        entry_name: str | None = None,
        *,
        family: str = COMMITS,
    ):
        self.root = root
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.commit_id = commit_id
        self.point = asof.Point(asof.COMMIT, commit_id=commit_id)
        self.family = family
        full = commit_id.hex()
        self.entry_name = full if entry_name is None else entry_name
        if family == TAGS:
            self.name = f"tag:{full}:{self.entry_name}"
        else:
            self.name = f"commit:{full}" if self.entry_name == full else f"commit:{full}:{self.entry_name}"

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
    kind = _KINDS.get(family)
    if kind is None:
        return None
    selector = name
    if family == SNAPSHOTS:
        if name.isascii() and name.isdigit() and not _canonical_number(name):
            return None
        selector = int(name) if _canonical_number(name) else name
    try:
        with root.read() as view:
            point = asof.locate(view, root, workbench, kind, selector)
    except commit.AmbiguousReference as exc:
        log.warning(
            "/%s/%s/%s is ambiguous (ENOENT): it is a prefix of %d commits: %s",
            workbench.workbench_id,
            family,
            name,
            len(exc.matches),
            ", ".join(exc.matches),
        )
        return None
    except (NotFound, InvalidInput):
        return None
    return _view(root, workbench, family, point, name)


def _view(root, workbench: wb.Workbench, family: str, point: asof.Point, name: str | None):
    if point.kind == asof.SNAPSHOT:
        return SnapshotView(root, workbench.workbench_id, workbench.incarnation_id, point.snapshot_id, name)
    return CommitView(root, workbench.workbench_id, workbench.incarnation_id, point.commit_id, name, family=family)


def names(root, workbench: wb.Workbench, family: str) -> list:
    """(name, view) of every entry of `/<wb>/<family>/`, in listing order (asof.points): every
    Active snapshot by id, then each usable alias whose latest mint is Active; the head's
    Sealed first-parent log by full id; every tag with a usable name."""
    out = []
    for name, point in asof.points(root, workbench, _KINDS[family]):
        if family == SNAPSHOTS and name != str(point.snapshot_id):
            if _usable(name) and not (name.isascii() and name.isdigit()):
                out.append((name, _view(root, workbench, family, point, name)))
        elif family == TAGS:
            if _usable(name):
                out.append((name, _view(root, workbench, family, point, name)))
        else:
            out.append((name, _view(root, workbench, family, point, None)))
    return out
