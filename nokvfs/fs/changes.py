"""What a ChangeEvent from the feed means for the kernel's caches (nokvfs.fs.freshness reads the
feed; this decides what to invalidate).

Changes this mount made itself are skipped (the kernel already knows them), so a local `cp -r`
does not invalidate what it created; a change of a path this mount is changing right now waits
until that change has committed, when it is known whether the event is this mount's own.

For a path that changed: a node keeps the revision it shows (its descriptors read it, the
kernel's pages are its) and is detached -- the path gets a fresh inode at its next lookup; a
file this mount is writing keeps its inode (its publication answers the conflict); an
attribute-only change refreshes the attributes of the same inode. Implicit directories above
the path may have appeared or vanished; the names in `.snapshots/`, `.commits/` and `.tags/` follow the history events.
"""

from __future__ import annotations

import logging

from nokvfs.fs import views as views_
from nokvfs.fs.inodes import ROOT_INODE, Kind
from nokvfs.schema.enums import ChangeEventKind

log = logging.getLogger(__name__)

LIVE = views_.LIVE
_PATH_KINDS = (
    ChangeEventKind.PathPut,
    ChangeEventKind.PathAppended,
    ChangeEventKind.PathRemoved,
    ChangeEventKind.PathRenamed,
)
_ATTRIBUTE_KIND = ChangeEventKind.PathAttributesChanged
_HISTORY_KINDS = (
    ChangeEventKind.SnapshotMinted,
    ChangeEventKind.SnapshotRetired,
    ChangeEventKind.CommitPublished,
    ChangeEventKind.TagSet,
    ChangeEventKind.TagDeleted,
)


class Changes:
    def __init__(self, tree):
        self.tree = tree
        tree.replay_deferred = self.changed

    def changed(self, version: int, event) -> None:
        """One ChangeEvent from the feed: invalidate what the kernel may hold of it."""
        tree = self.tree
        kind = event.kind
        if kind in (ChangeEventKind.WorkspaceCreated, ChangeEventKind.WorkspaceRestored):
            tree.refresh_workbenches()
            if tree.take_own(kind, event.workbench_id.encode()):
                return
            tree.invalidator.entry(ROOT_INODE, event.workbench_id)
            tree.invalidator.inode(ROOT_INODE, attr_only=True)
            return
        if kind in _HISTORY_KINDS:
            self._history_changed(event)
            if kind is ChangeEventKind.CommitPublished and event.path:
                # The commit also published metadata/run_manifest.json in the live view (the event
                # names the commit, not the manifest's revision: the kernel's copy is dropped).
                self._path_changed(event.workspace_incarnation_id, tuple(event.path.split("/")), False, None)
            return
        attribute_only = kind is _ATTRIBUTE_KIND
        if (kind not in _PATH_KINDS and not attribute_only) or event.path is None:
            return
        revision = event.before if kind is ChangeEventKind.PathRemoved else event.after
        if tree.take_own(kind, revision):
            return  # this mount made the change; the kernel already knows
        incarnation = event.workspace_incarnation_id
        paths = [(tuple(event.path.split("/")), kind is ChangeEventKind.PathRemoved)]
        if kind is ChangeEventKind.PathRenamed and event.before:
            paths.append((tuple(event.before.decode("utf-8").split("/")), True))
        for components, _ in paths:
            if tree.in_flight(incarnation, components):
                tree.defer(incarnation, components, version, event)
                return
        for components, gone in paths:
            if attribute_only:
                self._attributes_changed(incarnation, components)
            else:
                self._path_changed(incarnation, components, gone, event.after)

    def resync(self) -> None:
        """The feed expired under this mount (retention removed events it had not read): every
        live path it may cache is compared with the current state, as if each had changed, and
        every directory's cached listing and the workbench list are dropped."""
        tree = self.tree
        tree.refresh_workbenches()
        tree.invalidator.inode(ROOT_INODE)
        for node in tree.inodes.attached():
            if node.view != LIVE or node.kind in (Kind.ROOT, Kind.VIEW, Kind.HISTORY) or not node.components:
                if node.kind is not Kind.ROOT:
                    tree.invalidator.inode(node.ino)
                continue
            if node.kind.is_dir:
                node.dir_ctime_ns = node.dir_subdirs = None
                tree.invalidator.inode(node.ino)  # its cached listing too
                continue
            if node.spool is not None:
                continue  # a file this mount is writing: its publication answers any conflict
            entry = tree.current_entry(node)
            if entry is None:
                self._path_changed(node.incarnation, node.components, True, None)
            elif not node.shows(entry):
                self._path_changed(node.incarnation, node.components, False, entry.artifact_revision_id)

    def _attributes_changed(self, incarnation: bytes, components: tuple) -> None:
        """Only attributes changed (the revision, hence the kernel's pages, stay right)."""
        tree = self.tree
        node = tree.inodes.find(LIVE, incarnation, components)
        if node is not None:
            entry = tree.current_entry(node)
            if entry is not None and node.shows(entry):
                node.learn(entry)
            tree.invalidator.inode(node.ino, attr_only=True)
        directory = tree.inodes.find(LIVE, incarnation, components[:-1])
        if directory is not None:
            directory.dir_ctime_ns = None
            tree.invalidator.inode(directory.ino, attr_only=True)

    def _path_changed(self, incarnation: bytes, components: tuple, gone: bool, revision: bytes | None) -> None:
        tree = self.tree
        view = tree.view.name
        node = tree.inodes.find(view, incarnation, components)
        parent = tree.inodes.find(view, incarnation, components[:-1]) if len(components) > 1 else None
        if node is not None:
            if gone:
                if tree.overlay.pending(incarnation, components) is node:
                    return  # a file this mount is still writing keeps its name here
                tree.detach(node, parent=parent, deleted=True)
            elif node.kind.is_dir or node.spool is not None:
                # A directory that became a file's name, or a file this mount is writing (its
                # publication will answer the conflict): the kernel looks again at its next use.
                tree.invalidator.inode(node.ino, attr_only=True)
            elif revision is None or node.revision != revision:
                # Another revision: the node stays the one it shows (for its descriptors and the
                # kernel's pages) and the path gets a fresh inode at its next lookup.
                tree.detach(node, parent=parent)
            else:
                tree.invalidator.inode(node.ino, attr_only=True)
        elif parent is not None:
            tree.invalidator.entry(parent.ino, components[-1])  # a cached negative entry
        if parent is not None and not gone:
            parent.dir_ctime_ns = None  # re-derived from its entries at the next stat
            tree.invalidator.inode(parent.ino, attr_only=True)
        # Implicit directories above the path may have appeared or vanished, and with them the
        # link counts of the directories above those: counted again unless the directory below
        # was known here already and the path was not removed (it did not appear, then).
        for depth in range(len(components) - 2, 0, -1):
            above = tree.inodes.find(view, incarnation, components[:depth])
            if above is None or above.dir_subdirs is None:
                continue
            if gone or tree.inodes.find(view, incarnation, components[: depth + 1]) is None:
                above.dir_subdirs = None
                tree.invalidator.inode(above.ino, attr_only=True)
        with tree.view.read() as v:
            for depth in range(len(components) - 1, 1, -1):
                directory = components[:depth]
                dir_node = tree.inodes.find(view, incarnation, directory)
                above = tree.inodes.find(view, incarnation, directory[:-1])
                if gone:
                    if dir_node is None or tree.overlay.is_dir(incarnation, directory):
                        continue
                    if not tree.view.has_children(v, incarnation, directory):
                        if above is not None:
                            tree.invalidator.entry(above.ino, directory[-1], deleted=dir_node.ino)
                        tree.inodes.detach(dir_node)
                elif dir_node is None and above is not None:
                    tree.invalidator.entry(above.ino, directory[-1])

    def _history_changed(self, event) -> None:
        """A snapshot minted or retired, a commit published, a tag set or deleted: the names in
        `/<wb>/.snapshots/`, `.commits/` or `.tags/` the kernel may hold (or hold as negative)
        are invalidated, so the next lookup resolves them again."""
        tree = self.tree
        kind, incarnation = event.kind, event.workspace_incarnation_id
        listed = []
        if kind in (ChangeEventKind.SnapshotMinted, ChangeEventKind.SnapshotRetired):
            family = views_.SNAPSHOTS
            if event.path:
                listed.append(event.path)  # the alias
            raw = event.after if kind is ChangeEventKind.SnapshotMinted else event.before
            if raw:
                listed.append(str(int.from_bytes(raw, "big")))
        elif kind is ChangeEventKind.CommitPublished:
            family = views_.COMMITS
            if event.after:
                listed.append(event.after.hex())
            # A prefix that named one commit may name two now: every prefix the kernel holds.
            for node in tree.inodes.of_workbench(event.workbench_id):
                if node.kind is Kind.VIEW and node.incarnation == incarnation and node.view.startswith("commit:"):
                    view = tree.view_of(node)
                    if view.entry_name != view.commit_id.hex():
                        listed.append(view.entry_name)
        else:
            family = views_.TAGS
            if event.path:
                listed.append(event.path)
        history = tree.inodes.find(LIVE, incarnation, (family,))
        if history is None:
            return  # the kernel holds nothing below it
        for name in dict.fromkeys(listed):
            tree.invalidator.entry(history.ino, name)
