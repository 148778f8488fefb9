"""Views: what a part of the mount shows, and how it is read.

A view answers the read questions of the directory tree -- which workbenches exist, what a path
is, which children a directory has -- against one source. The live view reads the current
version of the root; read-only views of a snapshot, a commit or a tag (the `.snapshots/`,
`.commits/` and `.tags/` names beside the sections) will answer the same questions at their
pinned version or member list, with `read_only = True` and long kernel timeouts, so the tree and
the handles do not change when they are added.

Reads are LMDB point reads and bounded scans, cheap enough to run inline on the event loop.
The live view caches each workbench's incarnation: Visible is terminal and its incarnation never
changes (seed: "a client may cache the incarnation because Visible is immutable"), so a cached
incarnation lets getattr of a file cost exactly one PathCurrent point read.
"""

from __future__ import annotations

from nokvfs.errors import NotFound
from nokvfs.schema import keys
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import listing
from nokvfs.workspace import workbench as wb


class LiveView:
    name = "live"
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

    # --- paths ----------------------------------------------------------------------------------

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

    def require(self, view, workbench_id: str, incarnation: bytes) -> wb.Workbench:
        """The workbench, checked to still be the incarnation a node was made for."""
        workbench = self.workbench(view, workbench_id)
        if workbench.incarnation_id != incarnation:
            raise NotFound(f"workbench {workbench_id!r} is another incarnation now")
        return workbench
