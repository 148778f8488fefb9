"""Directory listings: opendir/readdir/releasedir, paged from an anchor the handle keeps.

Directories with a short, fixed or facade-listed set of names (the root's workbenches, a
workbench's sections and views, `.snapshots/`, `.commits/`, `.tags/`) are listed from a list
taken at opendir; the others page the engine's delimiter scan, at most 255 children a call,
then the daemon's overlay (directories made by mkdir and files created but not yet published).
A directory's attribute marker is never listed.
"""

from __future__ import annotations

import collections
import errno

from nokvfs.fs import overlay as overlays
from nokvfs.fs import views as views_
from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import Kind, Node
from nokvfs.schema.paths import ordered_component
from nokvfs.workspace import attributes
from nokvfs.workspace import workbench as wb

PAGE = 255
LIVE = views_.LIVE


class DirHandle:
    """One open directory: where its listing stands, so readdir pages from an anchor."""

    __slots__ = ("fh", "node", "pos", "anchor", "buffer", "phase", "overlay_index", "history", "static")

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
        self.anchor = None  # scan anchor after that entry
        self.buffer = collections.deque()  # fetched children not handed over yet
        self.phase = "scan"  # scan -> overlay -> done
        self.overlay_index = 0
        self.history = collections.OrderedDict()

    def remember(self, phase: str) -> None:
        """Record how to resume right after the entry at self.pos (in `phase`)."""
        self.history[self.pos] = (self.anchor, phase, self.overlay_index)
        if len(self.history) > self.HISTORY:
            self.history.popitem(last=False)  # positions only grow between resets

    def restore(self, pos: int) -> bool:
        state = self.history.get(pos)
        if state is None:
            return False
        self.pos = pos
        self.anchor, self.phase, self.overlay_index = state
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
        sections = [(name, Kind.SECTION, None, None) for name in sorted(wb.SECTIONS)]
        if node.kind is Kind.ROOT:
            handle.static = [(w.workbench_id, Kind.WORKBENCH, w, None) for w in tree.refresh_workbenches()]
        elif node.kind is Kind.WORKBENCH:
            with tree.view.read() as v:
                tree.view.require(v, node.workbench_id, node.incarnation)
            handle.static = [(name, Kind.HISTORY, None, None) for name in views_.HISTORY_DIRS] + sections
        elif node.kind is Kind.HISTORY:
            with tree.view.read() as v:
                workbench = tree.view.require(v, node.workbench_id, node.incarnation)
            handle.static = [
                (name, Kind.VIEW, view, None) for name, view in views_.names(tree.root, workbench, node.components[0])
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

        Items are (name, kind, PathEntry | Workbench | view | None, overlay index | None).
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
        if handle.phase == "scan":
            view = tree.view_of(node)
            with view.read() as v:
                workbench = view.require(v, node.workbench_id, node.incarnation)
                children, anchor = view.children(v, workbench, node.components, start_after=handle.anchor, limit=PAGE)
            child_kind = Kind.SECTION if node.kind in (Kind.WORKBENCH, Kind.VIEW) else Kind.DIR
            for child in children:
                if child.entry is not None:
                    if child.name == attributes.DIRECTORY_MARKER:
                        continue
                    kind = Kind.LINK if attributes.is_symlink(child.entry) else Kind.FILE
                    handle.buffer.append((child.name, kind, child.entry, None))
                else:
                    handle.buffer.append((child.name, child_kind, None, None))
            if anchor is None:
                handle.phase = "overlay"
            else:
                handle.anchor = anchor if not handle.buffer else handle.anchor
                if not handle.buffer:
                    return self.fill(handle)  # a page of only the marker: the next one
            if handle.buffer:
                return True
        if handle.phase == "overlay":
            if node.kind is not Kind.WORKBENCH and node.view == LIVE:
                listed = tree.overlay.children(node.incarnation, node.components)
                with tree.view.read() as v:
                    for index in range(handle.overlay_index, len(listed)):
                        name, kind = listed[index]
                        components = node.components + (name,)
                        if tree.view.entry(v, node.incarnation, components) is None and not tree.view.has_children(
                            v, node.incarnation, components
                        ):
                            handle.buffer.append((name, Kind.FILE if kind == overlays.FILE else Kind.DIR, None, index))
            handle.phase = "done"
            return bool(handle.buffer)
        return False

    def entry_node(self, handle: DirHandle, item) -> Node | None:
        """The node of a buffered listing item (None: it is gone, skip it)."""
        tree = self.tree
        name, kind, extra, overlay_index = item
        parent = handle.node
        if kind is Kind.WORKBENCH:
            return tree.workbench_node(extra)
        if kind is Kind.HISTORY:
            return tree.history_node(parent, name)
        if kind is Kind.VIEW:
            return tree.view_root(extra)
        if overlay_index is not None and kind is Kind.FILE:
            return tree.overlay.pending(parent.incarnation, parent.components + (name,))
        if kind in (Kind.FILE, Kind.LINK):
            return tree.path_node(parent, name, extra)
        return tree.child(parent, kind, name)

    def advance(self, handle: DirHandle, item) -> None:
        """`item` (just taken from the head of the buffer) was handed to the kernel."""
        handle.pos += 1
        if item[3] is not None:
            handle.overlay_index = item[3] + 1
        elif handle.static is not None:
            handle.anchor = (handle.anchor or 0) + 1
        else:
            handle.anchor = ordered_component(item[0])
        if handle.buffer:
            resume = "overlay" if handle.buffer[0][3] is not None else "scan"
        else:
            resume = handle.phase
        handle.remember(resume)

    def releasedir(self, handle: DirHandle) -> None:
        self.tree.inodes.closed(handle.node)
