"""The mount's directory tree: names to nodes, and what each node shows.

    /                     the Visible workbenches (mkdir creates one; nothing else lives here)
    /<wb>/                the five sections, always present, never removed, renamed or shadowed,
                          and beside them the dot-names of the read-only views (`ls -a`):
    /<wb>/.snapshots/     Active snapshots by id and alias; mkdir <alias> mints, rmdir retires
    /<wb>/.commits/       the head's first-parent log by full id; any unique prefix resolves
    /<wb>/.tags/          the tags
    /<wb>/.snapshots/<name>/<section>/...   the workbench as of that point (nokvfs.fs.views)
    /<wb>/<section>/...   artifacts, links and implicit directories (plus this daemon's overlay)

Reads follow the seed's cost model. A cold lookup is one WorkspaceCurrent point read (it also
proves the workbench is still the incarnation the parent node was made for) and one PathCurrent
point read; a miss costs one bounded prefix probe for an implicit directory. getattr of a file is
one PathCurrent point read (the incarnation is cached) and never reads the ArtifactRevision.

One revision per inode: a file's node shows one revision (`Node.facts`). When the path holds
another revision while the node is in use (open descriptors, or this mount's spool), the node is
detached and the path gets a fresh inode at its next lookup, so the kernel never serves one
inode's page cache for two revisions; an open(2) that reaches such a node answers ESTALE, on
which the kernel looks the path up again and opens the fresh inode.

A directory's times are derived from what the shard records: the newest change time (ctime) of
the entries directly in it, or its stored attributes when they were set after that (chmod,
chown, utime on a directory store them in its attribute marker, nokvfs.workspace.attributes).
The shard records no time for a removal, a rename away or an empty `mkdir`: those made through
this mount move the directory's time for as long as this mount runs (the next mount derives it
again from the entries recorded); made by another process they do not move it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import time

from nokvfs.errors import NameInvalid, NotFound
from nokvfs.fs import attrs, names
from nokvfs.fs import overlay as overlays
from nokvfs.fs import views as views_
from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import InodeTable, Kind, Node, facts_of
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.schema.ids import creation_unix_ms
from nokvfs.schema.names import check_workbench_id
from nokvfs.workspace import attributes
from nokvfs.workspace import workbench as wb

log = logging.getLogger(__name__)

LIVE = views_.LIVE
_OWN_CHANGES_BOUND = 65536
_VIEW_CACHE = 4096  # read-only view objects kept (each is rebuilt from its identity on demand)
DIR_SCAN_LIMIT = 4096  # children read to derive a directory's time and link count


def _ms_to_ns(ms: int) -> int:
    return ms * 1_000_000


PATH_CURRENT = "path_current"  # the shard tree the values _read_kept keeps are read from
ENTRIES_KEPT = 4096  # live values _read_kept keeps of each kind (all dropped at once beyond it)
PAGE = 255  # children per engine page of a directory (a scan's and a listing's)
PAGES_KEPT = 32  # pages `page_reader` keeps (the oldest dropped beyond it)


class Page:
    """One page of a directory's children, as read while the shard was at `stamp`, and the facts
    of its files once asked for (`facts`): a directory's scan and the listing that follows it, or
    two listings with nothing committed between them, decode each entry once."""

    __slots__ = ("stamp", "children", "anchor", "_facts")

    def __init__(self, stamp, children: list, anchor):
        self.stamp = stamp
        self.children = children
        self.anchor = anchor
        self._facts = None

    def facts(self) -> list:
        """facts_of(child.entry) for each child (None for a directory)."""
        if self._facts is None:
            self._facts = [None if child.entry is None else facts_of(child.entry) for child in self.children]
        return self._facts


class Tree:
    def __init__(self, root, view, workers, invalidator, *, uid: int | None = None, gid: int | None = None):
        self.root = root
        self.view = view
        self.workers = workers
        self.invalidator = invalidator
        self.inodes = InodeTable()
        self.overlay = overlays.Overlay()
        # Write-back mode: directory attribute changes accepted and not yet stored
        # ((incarnation, components) -> nokvfs.fs.writeback.DirectoryChange), shown over the marker.
        self.pending_directories: dict = {}
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.read_only = view.read_only
        self.mounted_ns = time.time_ns()
        self._workbench_times: dict[str, int] = {}
        self._root_mtime_ns = self.mounted_ns
        # ino -> [shard change stamp, node, value, its facts or None, the PathCurrent key read]
        # (_read_kept): the PathEntry of each file (current_entry; its facts for `learn`), a
        # directory's stored attributes
        self._entries: dict = {}
        self._directories: dict = {}
        # (view, incarnation, components, start_after) -> Page (page_reader)
        self._pages = collections.OrderedDict()
        self._own = collections.OrderedDict()  # (event kind, revision id) this mount committed
        # Paths with a change of this mount in flight: their events wait until it is known whether
        # they are this mount's own (the commit lands before the facade call returns).
        self._inflight = collections.Counter()
        self._deferred: dict[tuple, list] = {}
        self.replay_deferred = None  # set by the change handler: replays events held back above
        self._views = collections.OrderedDict()  # (identity, incarnation) -> read-only view
        self._missed = None  # (parent node, name, shard change stamp) of the last lookup that found nothing
        # This process's own commits (publications, the write-back publisher's groups) move the
        # shard's change stamp; a value kept above stays valid across those that did not write
        # the rows it was read from (nokvfs.engine.owncommits).
        self._own_commits = root.shard.own_commits
        self._own_commits.watch((PATH_CURRENT,))
        self.refresh_workbenches()

    # --- nodes -----------------------------------------------------------------------------------

    def node(self, ino: int) -> Node:
        node = self.inodes.get(ino)
        if node is None:
            raise refuse(errno.ESTALE, f"inode {ino} is not known to this mount")
        return node

    def check_writable(self, what: str, *nodes: Node) -> None:
        names.check_writable(what, self.read_only, *nodes)

    # --- views -----------------------------------------------------------------------------------

    def view_of(self, node: Node):
        """The view a node reads from: the live view, or the read-only view its identity names."""
        if node.view == LIVE:
            return self.view
        key = (node.view, node.incarnation)
        view = self._views.get(key)
        if view is None:
            view = views_.from_identity(self.root, node.view, node.workbench_id, node.incarnation)
            self.keep_view(view)
        else:
            self._views.move_to_end(key)
        return view

    def keep_view(self, view) -> None:
        self._views[(view.name, view.incarnation)] = view
        while len(self._views) > _VIEW_CACHE:
            self._views.popitem(last=False)

    def history_node(self, workbench_node: Node, family: str) -> Node:
        return self.inodes.node(Kind.HISTORY, LIVE, workbench_node.workbench_id, workbench_node.incarnation, (family,))

    def view_root(self, view) -> Node:
        self.keep_view(view)
        return self.inodes.node(Kind.VIEW, view.name, view.workbench_id, view.incarnation, ())

    # --- workbenches -----------------------------------------------------------------------------

    def refresh_workbenches(self) -> list[wb.Workbench]:
        with self.view.read() as v:
            found = self.view.workbenches(v)
        for workbench in found:
            self._workbench_times.setdefault(
                workbench.workbench_id, _ms_to_ns(creation_unix_ms(workbench.incarnation_id))
            )
        self._workbenches = sorted(found, key=lambda w: w.workbench_id)
        if self._workbench_times:
            self._root_mtime_ns = max(self._workbench_times.values())
        return self._workbenches

    def workbench_node(self, workbench: wb.Workbench) -> Node:
        return self.inodes.node(Kind.WORKBENCH, self.view.name, workbench.workbench_id, workbench.incarnation_id, ())

    def child(self, parent: Node, kind: Kind, name: str) -> Node:
        return self.inodes.node(kind, parent.view, parent.workbench_id, parent.incarnation, parent.components + (name,))

    def path_node(self, parent: Node, name: str, entry, facts=None) -> Node:
        """The node of a published file or link at parent/name, showing `entry`.

        A node that shows another revision stays that revision's (its descriptors and the
        kernel's pages are that revision's) and is detached: the path gets a fresh node. The one
        exception is a file this mount is writing: it keeps its inode, and its publication will
        find out whether the change came from outside. `facts`: facts_of(entry), when known.
        """
        if facts is None:
            facts = facts_of(entry)
        kind = Kind.LINK if facts.is_link else Kind.FILE
        node = self.inodes.find(parent.view, parent.incarnation, parent.components + (name,))
        if node is not None and node.spool is not None:
            return node
        if node is not None and not node.shows(entry):
            self.detach(node, parent=parent)
        node = self.child(parent, kind, name)
        node.facts = facts
        return node

    def detach(self, node: Node, *, parent: Node | None = None, deleted: bool = False) -> None:
        """The path no longer shows this node: the kernel must look it up again."""
        if parent is None:
            parent = (
                self.inodes.find(node.view, node.incarnation, node.components[:-1])
                if len(node.components) > 1
                else None
            )
        if parent is not None:
            self.invalidator.entry(parent.ino, node.components[-1], deleted=node.ino if deleted else 0)
        self.inodes.detach(node)

    def parent_of(self, node: Node) -> Node:
        if node.kind in (Kind.ROOT, Kind.WORKBENCH):
            return self.inodes.root
        if node.kind is Kind.VIEW:
            family = self.view_of(node).family
            return self.inodes.node(Kind.HISTORY, LIVE, node.workbench_id, node.incarnation, (family,))
        components = node.components[:-1]
        if not components and node.view != LIVE:
            return self.inodes.node(Kind.VIEW, node.view, node.workbench_id, node.incarnation, ())
        kind = Kind.WORKBENCH if not components else Kind.SECTION if len(components) == 1 else Kind.DIR
        return self.inodes.node(kind, node.view, node.workbench_id, node.incarnation, components)

    # --- lookup -----------------------------------------------------------------------------------

    def lookup(self, parent: Node, name: str | None) -> Node | None:
        return self.lookup_shown(parent, name)[0]

    def lookup_shown(self, parent: Node, name: str | None) -> tuple[Node | None, object]:
        """The node of parent/name, and the PathEntry the lookup found there (None for anything
        but a published file or link): what the node shows as of this lookup."""
        if name is None:
            return None, None
        if name == ".":
            return parent, None
        if name == "..":
            return self.parent_of(parent), None
        if not parent.kind.is_dir:
            raise refuse(errno.ENOTDIR, f"{parent.describe()} is not a directory")
        if parent.kind is Kind.HISTORY:
            with self.view.read() as v:
                workbench = self.view.require(v, parent.workbench_id, parent.incarnation)
            view = views_.resolve(self.root, workbench, parent.components[0], name)
            return (None if view is None else self.view_root(view)), None
        view = self.view_of(parent)
        # Taken before the read: a commit racing it makes lookup_to_create read again.
        stamp = None if parent.view != LIVE else self.root.shard.change_stamp()
        with view.read() as v:
            if parent.kind is Kind.ROOT:
                try:
                    check_workbench_id(name)
                    return self.workbench_node(self.view.workbench(v, name)), None
                except (NameInvalid, NotFound):
                    return None, None
            workbench = view.require(v, parent.workbench_id, parent.incarnation)
            if parent.kind is Kind.WORKBENCH:
                if name in views_.HISTORY_DIRS:
                    return self.history_node(parent, name), None
                return (self.child(parent, Kind.SECTION, name) if name in wb.SECTIONS else None), None
            if parent.kind is Kind.VIEW:
                return (self.child(parent, Kind.SECTION, name) if name in wb.SECTIONS else None), None
            if name == attributes.DIRECTORY_MARKER:
                return None, None  # a directory's attributes, never an entry of its own
            components = parent.components + (name,)
            try:
                found = view.stat(v, workbench, components)
            except NotFound:
                found = None
        if found is not None and found.entry is not None:
            return self.path_node(parent, name, found.entry), found.entry
        if found is not None:
            return self.child(parent, Kind.DIR, name), None
        if parent.view != LIVE:
            return None, None
        if stamp is not None:
            self._missed = (parent, name, stamp)
        return self._unpublished(parent, name, components), None

    def _unpublished(self, parent: Node, name: str, components: tuple) -> Node | None:
        """What this mount has at parent/name and has not published: a file it is writing, or a
        directory it made."""
        pending = self.overlay.pending(parent.incarnation, components)
        if pending is not None:
            return pending
        if self.overlay.is_dir(parent.incarnation, components):
            return self.child(parent, Kind.DIR, name)
        return None

    def lookup_to_create(self, parent: Node, name: str) -> Node | None:
        """lookup(parent, name) for a create(2), which the kernel sends right after its own lookup
        of the name found nothing: while nothing was committed since that lookup, the shard still
        holds nothing there, and only this mount's unpublished files and directories are asked
        again (a create storm, `tar x`, reads the shard once per file, not twice)."""
        missed = self._missed
        if missed is not None and missed[0] is parent and missed[1] == name:
            stamp = self.root.shard.change_stamp()
            if stamp is not None and stamp == missed[2]:
                return self._unpublished(parent, name, parent.components + (name,))
        return self.lookup(parent, name)

    def current_entry(self, node: Node):
        """The PathEntry at the node's path now (None: nothing published there)."""
        if node.detached:
            return None
        # An open(2) or stat(2) of a file nobody changes then costs no read transaction, no
        # PathCurrent read and no attribute decoding (`learn`).
        view = self.view_of(node)
        return self._read_kept(
            self._entries, node, view, lambda v: view.entry(v, node.incarnation, node.components), node.components
        )

    def _read_kept(self, kept: dict, node: Node, view, read, components: tuple):
        """`read(v)` in a read of `view`, kept in `kept` for the node: a live view's value is
        read again only once something was committed since the last read of it (the stamp is
        taken before the read: a commit racing the read makes the next call read again) that
        was not this process's own, or was and wrote the PathCurrent row of `components` (the
        one row `read` reads)."""
        stamp = None if view.immutable else self.root.shard.change_stamp()
        if stamp is not None:
            seen = kept.get(node.ino)
            if seen is not None and seen[1] is node:
                if seen[0] == stamp:
                    return seen[2]
                if self._own_commits.unchanged(seen[0], stamp, PATH_CURRENT, seen[4]):
                    seen[0] = stamp
                    return seen[2]
        with view.read() as v:
            value = read(v)
        if stamp is not None:
            self._keep(kept, node, stamp, value, keys.path_current_key(self.root.root_id, node.incarnation, components))
        return value

    @staticmethod
    def _keep(kept: dict, node: Node, stamp, value, key: bytes) -> None:
        if len(kept) >= ENTRIES_KEPT:
            kept.clear()
        kept[node.ino] = [stamp, node, value, None, key]

    def keep_published(self, node: Node, entry, stamp, components: tuple) -> None:
        """`entry`, which this process's commit that made change stamp `stamp` published at
        `components`, as current_entry would read it at that stamp: kept when the node is still
        at that path and that commit is the last one of this process to write the path's row (a
        later one, or a commit of another process, makes current_entry read again). An open(2)
        or stat(2) after the close that published it then reads nothing."""
        if stamp is None or node.detached or node.view != LIVE or node.components != components:
            return
        key = keys.path_current_key(self.root.root_id, node.incarnation, components)
        if self._own_commits.wrote(stamp, PATH_CURRENT, key):
            self._keep(self._entries, node, stamp, entry, key)

    def learn(self, node: Node, entry) -> None:
        """node.learn(entry), with the facts decoded once per entry `current_entry` kept."""
        seen = self._entries.get(node.ino)
        kept = seen is not None and seen[1] is node and seen[2] is entry
        if kept and seen[3] is not None:
            node.facts = seen[3]
            return
        node.learn(entry)
        if kept:
            seen[3] = node.facts

    # --- attributes -------------------------------------------------------------------------------

    def attributes(self, node: Node, *, fresh: bool = True):
        kind = node.kind
        read_only = (
            self.read_only or node.view != LIVE or (kind is Kind.HISTORY and node.components[0] != views_.SNAPSHOTS)
        )
        timeouts = attrs.READ_ONLY_TIMEOUTS if node.view != LIVE else None
        if kind.is_dir:
            return attrs.build(node, self._directory_shown(node, read_only), timeouts=timeouts)
        spool = node.spool
        if spool is not None:
            base = node.facts
            mode = attrs.FILE_MODE if base is None else base.mode
            uid = self.uid if base is None or base.uid is None else base.uid
            gid = self.gid if base is None or base.gid is None else base.gid
            pending = spool.attributes
            if pending is not None:
                mode = pending.get("mode", mode)
                uid = pending.get("uid", uid)
                gid = pending.get("gid", gid)
            mtime = spool.mtime_ns if spool.dirty or base is None else base.mtime_ns
            if pending is not None and "mtime_ns" in pending:
                mtime = pending["mtime_ns"]
            atime = (
                pending.get("atime_ns", mtime) if pending is not None else (mtime if base is None else base.atime_ns)
            )
            ctime = max(mtime, base.ctime_ns) if base is not None else mtime
            shown = attrs.Shown(mode, spool.size, uid, gid, mtime, atime, ctime)
            return attrs.build(node, shown, timeouts=timeouts)
        view = self.view_of(node)
        # A view's file never changes: what a lookup or listing learnt of it stays true.
        if ((fresh and not view.immutable) or node.facts is None) and not node.detached:
            entry = self.current_entry(node)
            if entry is not None and node.shows(entry):
                self.learn(node, entry)  # the same revision; its attributes may have changed
            elif entry is not None:
                # The path moved to another revision and the change feed has not said so yet:
                # this inode stays the file the kernel knows (size included), as the follower
                # would leave it, and the path gets a fresh inode at its next lookup.
                self.detach(node)
        facts = node.facts
        if facts is None:
            shown = attrs.Shown(
                attrs.FILE_MODE, 0, self.uid, self.gid, self.mounted_ns, self.mounted_ns, self.mounted_ns
            )
        else:
            mode = facts.mode if not read_only else (facts.mode & ~0o222 if not facts.is_link else facts.mode)
            shown = attrs.Shown(
                mode,
                facts.size,
                self.uid if facts.uid is None else facts.uid,
                self.gid if facts.gid is None else facts.gid,
                facts.mtime_ns,
                facts.atime_ns,
                facts.ctime_ns,
            )
        return attrs.build(node, shown, timeouts=timeouts)

    def _directory_shown(self, node: Node, read_only: bool) -> attrs.Shown:
        mode = attrs.READ_ONLY_DIRECTORY_MODE if read_only else attrs.DIRECTORY_MODE
        kind = node.kind
        if kind is Kind.ROOT:
            t = self._root_mtime_ns
            return attrs.Shown(mode, 0, self.uid, self.gid, t, t, t, 2 + len(self._workbenches))
        floor = self._workbench_times.get(node.workbench_id)
        if floor is None:
            floor = _ms_to_ns(creation_unix_ms(node.incarnation))
        if kind not in (Kind.SECTION, Kind.DIR):
            if kind is Kind.WORKBENCH:
                nlink = 2 + len(wb.SECTIONS) + len(views_.HISTORY_DIRS)
            elif kind is Kind.VIEW:
                nlink = 2 + len(wb.SECTIONS)
            else:
                nlink = 1  # a view family: not counted
            return attrs.Shown(mode, 0, self.uid, self.gid, floor, floor, floor, nlink)
        newest = self.directory_time(node, floor)
        subdirs = self.subdirectories(node)
        nlink = 1 if subdirs < 0 else 2 + subdirs
        stored = self.directory_attributes(node)
        pending = (
            self.pending_directories.get((node.incarnation, node.components)) if self.pending_directories else None
        )
        if pending is not None:
            # What storing it will make of the marker: the stored attributes, or a new marker's
            # (times from when the change was first accepted), with the change over them.
            base = stored or attributes.Attributes(
                attrs.DIRECTORY_MODE, None, None, pending.made_ns, pending.made_ns, pending.made_ns
            )
            stored = attributes.merged(base, **pending.changes, ctime_ns=pending.changed_ns)
        if stored is None:
            return attrs.Shown(mode, 0, self.uid, self.gid, newest, newest, newest, nlink)
        if read_only:
            stored_mode = stored.mode & ~0o222
        else:
            stored_mode = stored.mode
        uid = self.uid if stored.uid is None else stored.uid
        gid = self.gid if stored.gid is None else stored.gid
        if stored.ctime_ns >= newest:
            return attrs.Shown(stored_mode, 0, uid, gid, stored.mtime_ns, stored.atime_ns, stored.ctime_ns, nlink)
        return attrs.Shown(stored_mode, 0, uid, gid, newest, newest, newest, nlink)

    def directory_attributes(self, node: Node):
        """A directory's stored attributes (its marker), or None. Read again only once something
        was committed since the last read (as current_entry): a stat of a directory, and each
        create in it, read nothing from the shard while nothing changes."""
        view = self.view_of(node)
        getter = getattr(view, "directory_attributes", None)
        if getter is None:
            return None
        marker = node.components + (attributes.DIRECTORY_MARKER,)
        return self._read_kept(
            self._directories, node, view, lambda v: getter(v, node.incarnation, node.components), marker
        )

    def directory_time(self, node: Node, floor: int) -> int:
        """The newest change time of the entries directly in a directory (cached on the node)."""
        if node.dir_ctime_ns is None and not self._scan_directory(node, floor):
            return floor
        return max(node.dir_ctime_ns, floor)

    def subdirectories(self, node: Node) -> int:
        """How many directories a section or directory holds (cached on the node); -1 when it
        has more than DIR_SCAN_LIMIT children, which are not all read for a stat."""
        if node.dir_subdirs is None and not self._scan_directory(node, 0):
            return 0
        return node.dir_subdirs

    def _scan_directory(self, node: Node, floor: int) -> bool:
        """One pass over the children of a directory (DIR_SCAN_LIMIT at most) for the two facts
        its stat derives from them: their newest change time and the subdirectories among them
        (implicit ones, ones with a marker, and this mount's own not stored yet). A cached time
        this mount set for its own change is kept. False: the workbench is gone (nothing cached).
        Its pages are kept for the listing that usually follows (page_reader)."""
        newest, subdirs = floor, set()
        anchor, seen = None, 0
        try:
            with self.page_reader(node) as pages:
                while seen < DIR_SCAN_LIMIT:
                    page = pages(anchor)
                    for child, facts in zip(page.children, page.facts()):
                        seen += 1
                        if child.entry is None:
                            subdirs.add(child.name)
                        elif child.name != attributes.DIRECTORY_MARKER:
                            newest = max(newest, facts.ctime_ns)
                    anchor = page.anchor
                    if anchor is None:
                        break
        except NotFound:
            return False
        if node.view == LIVE:
            subdirs.update(
                name for name, kind in self.overlay.children(node.incarnation, node.components) if kind == overlays.DIR
            )
        if node.dir_ctime_ns is None:
            node.dir_ctime_ns = newest
        node.dir_scans += 1
        node.dir_subdirs = -1 if anchor is not None else len(subdirs)
        return True

    @contextlib.contextmanager
    def page_reader(self, node: Node):
        """`pages(start_after)` -> the Page of the node's directory children after that anchor:
        the one kept, when nothing was committed since it was read (by any process: the shard's
        change stamp), else read in this read of the node's view and kept. NotFound if the
        workbench is gone. The stamp is taken before the read, so a commit racing it makes the
        next reader read again."""
        view = self.view_of(node)
        stamp = self.root.shard.change_stamp()
        with view.read() as v:
            workbench = view.require(v, node.workbench_id, node.incarnation)

            def pages(start_after) -> Page:
                key = (node.view, node.incarnation, node.components, start_after)
                page = self._pages.get(key)
                if page is not None and stamp is not None and page.stamp == stamp:
                    self._pages.move_to_end(key)
                    return page
                children, anchor = view.children(v, workbench, node.components, start_after=start_after, limit=PAGE)
                page = Page(stamp, children, anchor)
                if stamp is not None:
                    self._pages[key] = page
                    while len(self._pages) > PAGES_KEPT:
                        self._pages.popitem(last=False)
                return page

            yield pages

    def subdirectories_token(self, incarnation: bytes, components: tuple) -> int | None:
        """Taken before an own change that awaits (rmdir, rename): `subdirectories_changed` then
        knows whether a scan ran meanwhile and may have seen the change already."""
        node = self.inodes.find(LIVE, incarnation, components)
        return None if node is None else node.dir_scans

    def subdirectories_changed(self, incarnation: bytes, components: tuple, delta: int, token=None) -> None:
        """This mount made (+1) or removed (-1) a directory directly in `components`. The cached
        count moves by `delta` rather than being counted again: the kernel stats the parent
        after each mkdir, and a scan of a big directory costs ~50 us per child. Counted again
        at the next stat when a scan ran since `token` (it may have counted the change)."""
        node = self.inodes.find(LIVE, incarnation, components)
        if node is None or node.dir_subdirs is None or node.dir_subdirs < 0:
            return  # not counted yet, or too many children to count
        if token is not None and token != node.dir_scans:
            node.dir_subdirs = None
        else:
            node.dir_subdirs = max(0, node.dir_subdirs + delta)

    def directory_changed(self, incarnation: bytes, components: tuple, ctime_ns: int | None) -> None:
        """An entry directly in the directory `components` changed at ctime_ns (None: unknown):
        this mount's own change (a file it created, before the shard records it, or published)."""
        node = self.inodes.find(LIVE, incarnation, components)
        if node is None or ctime_ns is None or node.kind not in (Kind.SECTION, Kind.DIR):
            return
        floor = self._workbench_times.get(node.workbench_id) or _ms_to_ns(creation_unix_ms(node.incarnation))
        node.dir_ctime_ns = max(self.directory_time(node, floor), ctime_ns)

    # --- this mount's own changes -----------------------------------------------------------------

    def begin_change(self, incarnation: bytes, *paths: tuple) -> None:
        for components in paths:
            self._inflight[(incarnation, components)] += 1

    def end_change(self, incarnation: bytes, *paths: tuple) -> None:
        replay = []
        for components in paths:
            key = (incarnation, components)
            self._inflight[key] -= 1
            if self._inflight[key] <= 0:
                del self._inflight[key]
                replay += self._deferred.pop(key, [])
        if replay and self.replay_deferred is not None:
            for version, event in replay:
                self.replay_deferred(version, event)

    def in_flight(self, incarnation: bytes, components: tuple) -> bool:
        return (incarnation, components) in self._inflight

    def defer(self, incarnation: bytes, components: tuple, version: int, event) -> None:
        self._deferred.setdefault((incarnation, components), []).append((version, event))

    def own(self, kind: ChangeEventKind, revision_id: bytes) -> None:
        """Remember a change this mount committed, so the follower does not invalidate it.

        Counted: one revision renamed there and back is two changes of the same kind and
        revision, and each of the two events must be recognised as this mount's.
        """
        key = (kind, revision_id)
        self._own[key] = self._own.get(key, 0) + 1
        self._own.move_to_end(key)
        while len(self._own) > _OWN_CHANGES_BOUND:
            self._own.popitem(last=False)

    def take_own(self, kind: ChangeEventKind, revision_id: bytes) -> bool:
        """Whether (kind, revision) is a change of this mount (each one recognised once)."""
        key = (kind, revision_id)
        count = self._own.get(key)
        if not count:
            return False
        if count == 1:
            del self._own[key]
        else:
            self._own[key] = count - 1
        return True
