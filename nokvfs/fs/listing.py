"""Directory listings: opendir/readdir/releasedir, paged from an anchor the handle keeps.

Directories with a short, fixed or facade-listed set of names (the root's workbenches, a
workbench's sections and views, `.snapshots/`, `.commits/`, `.tags/`) are listed from a list
taken at opendir; the others page the engine's delimiter scan, at most 255 children a call,
merged in the same name order with the daemon's overlay (directories made by mkdir and files
created but not yet published). The anchor is the ordered name of the last entry handed over,
so an entry that moves from the overlay to the shard while the listing pages (a file created
here and published by its release) is handed over exactly once, wherever the listing stands.
A directory's attribute marker is never listed.
"""

from __future__ import annotations

import collections
import errno

from nokvfs.fs import overlay as overlays
from nokvfs.fs import views as views_
from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import Kind, Node
from nokvfs.fs.tree import PAGE
from nokvfs.schema.paths import ordered_component
from nokvfs.workspace import attributes
from nokvfs.workspace import workbench as wb

DOTS = 2  # "." and "..": readdir hands them over first, at offsets 1 and 2 (FileSystem.readdir)
LIVE = views_.LIVE


class DirHandle:
    """One open directory: where its listing stands, so readdir pages from an anchor."""

    __slots__ = ("fh", "node", "pos", "anchor", "buffer", "phase", "history", "static")

    HISTORY = 1024  # positions remembered for seekdir/rewinddir (bounded)

    def __init__(self, fh: int, node):
        self.fh = fh
        self.node = node
        # The whole listing, taken at opendir, for directories whose names are not a delimiter
        # scan; the anchor is then an index into it. None: page the scan.
        self.static = None
        self.reset()

    def reset(self) -> None:
        self.pos = 0  # readdir offset of the last entry handed to the kernel
        self.anchor = None  # the ordered name of that entry (an index into a static listing)
        self.buffer = collections.deque()  # fetched children not handed over yet
        self.phase = "scan"  # scan -> done
        self.history = collections.OrderedDict()

    def remember(self, phase: str) -> None:
        """Record how to resume right after the entry at self.pos (in `phase`)."""
        self.history[self.pos] = (self.anchor, phase)
        if len(self.history) > self.HISTORY:
            self.history.popitem(last=False)  # positions only grow between resets

    def restore(self, pos: int) -> bool:
        state = self.history.get(pos)
        if state is None:
            return False
        self.pos = pos
        self.anchor, self.phase = state
        self.buffer = collections.deque()
        return True


class Listing:
    def __init__(self, tree):
        self.tree = tree

    def opendir(self, fh: int, node: Node) -> DirHandle:
        tree = self.tree
        if not node.kind.is_dir:
            raise refuse(errno.ENOTDIR, f"{node.describe()} is not a directory")
        handle = DirHandle(fh, node)
        sections = [(name, Kind.SECTION, None, None, None) for name in sorted(wb.SECTIONS)]
        if node.kind is Kind.ROOT:
            handle.static = [(w.workbench_id, Kind.WORKBENCH, w, None, None) for w in tree.refresh_workbenches()]
        elif node.kind is Kind.WORKBENCH:
            with tree.view.read() as v:
                tree.view.require(v, node.workbench_id, node.incarnation)
            handle.static = [(name, Kind.HISTORY, None, None, None) for name in views_.HISTORY_DIRS] + sections
        elif node.kind is Kind.HISTORY:
            with tree.view.read() as v:
                workbench = tree.view.require(v, node.workbench_id, node.incarnation)
            handle.static = [
                (name, Kind.VIEW, view, None, None)
                for name, view in views_.names(tree.root, workbench, node.components[0])
            ]
        elif node.kind is Kind.VIEW:
            view = tree.view_of(node)
            with view.read() as v:
                view.require(v, node.workbench_id, node.incarnation)
            handle.static = sections
        node.open_count += 1
        return handle

    def seek(self, handle: DirHandle, start_id: int) -> None:
        """Position the handle so the next entry handed over has offset start_id + 1."""
        if start_id == handle.pos:
            return
        if start_id == 0:
            handle.reset()
            return
        if handle.restore(start_id):
            return
        # An offset this handle no longer remembers: recount from the start (bounded memory).
        handle.reset()
        while handle.pos < start_id:
            if not handle.buffer and not self.fill(handle):
                return
            self.advance(handle, handle.buffer.popleft())

    def fill(self, handle: DirHandle) -> bool:
        """Fetch the next page of children into handle.buffer; False at the end of the listing.

        Items are (name, kind, PathEntry | Workbench | view | None, listed from the overlay, the
        facts of a PathEntry or None).
        """
        tree = self.tree
        node = handle.node
        if handle.phase == "done":
            return False
        if handle.static is not None:
            index = handle.anchor or 0
            handle.buffer.extend(handle.static[index : index + PAGE])
            if not handle.buffer:
                handle.phase = "done"
            return bool(handle.buffer)
        with tree.page_reader(node) as pages:
            page = pages(handle.anchor)
        children, anchor = page.children, page.anchor
        child_kind = Kind.SECTION if node.kind in (Kind.WORKBENCH, Kind.VIEW) else Kind.DIR
        items, scanned = [], set()
        for child, facts in zip(children, page.facts()):
            scanned.add(child.name)
            if child.entry is not None:
                if child.name == attributes.DIRECTORY_MARKER:
                    continue
                kind = Kind.LINK if facts.is_link else Kind.FILE
                items.append((child.name, kind, child.entry, False, facts))
            else:
                items.append((child.name, child_kind, None, False, None))
        if node.view == LIVE:
            # The overlay's entries in the range this page covers (all the rest after the last
            # page) that the scan did not list. The scan is read first: a file published since
            # is still pending in the overlay (which changes only on this thread), so it is
            # listed here, never lost between the two.
            upper = None
            if anchor is not None:
                upper = ordered_component(children[-1].name) if children else anchor
            for name, kind in tree.overlay.children(node.incarnation, node.components):
                key = ordered_component(name)
                if name in scanned or (handle.anchor is not None and key <= handle.anchor):
                    continue
                if upper is None or key <= upper:
                    items.append((name, Kind.FILE if kind == overlays.FILE else Kind.DIR, None, True, None))
        items.sort(key=lambda item: ordered_component(item[0]))
        handle.buffer.extend(items)
        if anchor is None:
            handle.phase = "done"
        elif not handle.buffer:
            handle.anchor = anchor
            return self.fill(handle)  # a page of only the marker: the next one
        return bool(handle.buffer)

    def entry_node(self, handle: DirHandle, item) -> Node | None:
        """The node of a buffered listing item (None: it is gone, skip it)."""
        tree = self.tree
        name, kind, extra, from_overlay, facts = item
        parent = handle.node
        if kind is Kind.WORKBENCH:
            return tree.workbench_node(extra)
        if kind is Kind.HISTORY:
            return tree.history_node(parent, name)
        if kind is Kind.VIEW:
            return tree.view_root(extra)
        if from_overlay and kind is Kind.FILE:
            pending = tree.overlay.pending(parent.incarnation, parent.components + (name,))
            return pending if pending is not None else tree.lookup(parent, name)  # published since
        if kind in (Kind.FILE, Kind.LINK):
            return tree.path_node(parent, name, extra, facts)
        return tree.child(parent, kind, name)

    def advance(self, handle: DirHandle, item) -> None:
        """`item` (just taken from the head of the buffer) was handed to the kernel."""
        handle.pos += 1
        if handle.static is not None:
            handle.anchor = (handle.anchor or 0) + 1
        else:
            handle.anchor = ordered_component(item[0])
        handle.remember("scan" if handle.buffer else handle.phase)

    def releasedir(self, handle: DirHandle) -> None:
        self.tree.inodes.closed(handle.node)
