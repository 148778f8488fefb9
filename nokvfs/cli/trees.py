"""A workbench's tree as the read commands see it: live or as of a snapshot (the listing facade
over a read view), or as of a commit (its sealed members). ls, stat and get take one of these, so
the live and as-of commands list, print and write exactly the same way.
"""

from __future__ import annotations

from nokvfs.errors import IntegrityError
from nokvfs.schema.paths import join
from nokvfs.workspace import attributes as attrs

PAGE_LIMIT = 1000  # entries per listing page (one read version)


class ViewTree:
    """The workbench in a read view: the live view, or a snapshot's MVCC view.

    `body_view` is the view bodies and link targets are read in: None (live) reads the current
    manifests, so a get need not hold the listing's read view while it downloads.
    """

    def __init__(self, view, root, workbench_id: str, *, body_view=None, page_limit: int = PAGE_LIMIT):
        from nokvfs.workspace import workbench as wb

        self.view, self.root, self.workbench_id, self.body_view = view, root, workbench_id, body_view
        self.page_limit = page_limit
        _, self.workbench = wb.visible(view, root.root_id, workbench_id)

    def stat(self, components):
        from nokvfs.workspace import listing

        return listing.stat_in(self.view, self.root, self.workbench, tuple(components))

    def rows(self, base: str, recursive: bool):
        """(name below base, kind, entry) of a directory's children, or of every file below it."""
        from nokvfs.workspace import listing

        pager = listing.list_recursive if recursive else listing.list_dir
        cursor = None
        while True:
            page = pager(self.view, self.root, self.workbench_id, base, cursor=cursor, limit=self.page_limit)
            for child in page.children:
                yield child.name, child.kind, child.entry
            cursor = page.cursor
            if cursor is None:
                return

    def files(self, base: str, *, with_markers: bool = False):
        """(path below base, entry) of every file below base, directory markers when asked."""
        from nokvfs.workspace import listing

        cursor = None
        while True:
            page = listing.list_recursive(
                self.view,
                self.root,
                self.workbench_id,
                base,
                cursor=cursor,
                limit=self.page_limit,
                with_markers=with_markers,
            )
            for child in page.children:
                yield child.name, child.entry
            cursor = page.cursor
            if cursor is None:
                return

    def directory_attributes(self, components) -> attrs.Attributes | None:
        from nokvfs.workspace import namespace

        if not components:
            return None  # the workbench itself stores none
        return namespace.directory_attributes(self.view, self.root, self.workbench.incarnation_id, tuple(components))

    def read_link(self, entry) -> str:
        from nokvfs.workspace import namespace

        return namespace.read_link(self.root, entry, view=self.body_view)

    def chunks(self, entry, progress):
        """The body a block at a time (its manifest read in body_view)."""
        from nokvfs.workspace import reading

        offset = 0
        while offset < entry.logical_size:
            data = reading.read(self.root, entry, offset, self.root.block_size, view=self.body_view)
            if not data:  # read() raises on a short manifest; never loop on an empty read
                raise IntegrityError(
                    f"revision {entry.artifact_revision_id.hex()} ends at byte {offset} of {entry.logical_size}"
                )
            offset += len(data)
            progress(offset, entry.logical_size)
            yield data


class AsOfTree(ViewTree):
    """A workbench as of a snapshot, a commit or a tag: an as-of tree of the workspace
    (nokvfs.workspace.asof), with bodies and link targets read in the view that holds it."""

    def __init__(self, root, tree):
        self.root, self.tree = root, tree
        self.view = self.body_view = tree.view
        self.workbench = tree.workbench
        self.workbench_id = tree.workbench.workbench_id

    def stat(self, components):
        return self.tree.stat(tuple(components))

    def rows(self, base: str, recursive: bool):
        from nokvfs.workspace import listing

        if recursive:
            for below, entry in self.tree.files(base):
                yield below, listing.FILE, entry
            return
        for child in self.tree.children(listing.split(base)):
            yield child.name, child.kind, child.entry

    def files(self, base: str, *, with_markers: bool = False):
        yield from self.tree.files(base, with_markers=with_markers)

    def directory_attributes(self, components) -> attrs.Attributes | None:
        if not components:
            return None
        marker = self.tree.entry(tuple(components) + (attrs.DIRECTORY_MARKER,))
        return None if marker is None else attrs.shown(marker)


def path_of(base: str, name: str) -> str:
    return join((base, name)) if base else name
