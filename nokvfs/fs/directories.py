"""Directories in the mount: mkdir, rmdir, renames of directories, their attributes, and the
`.snapshots/` directory where mkdir mints a snapshot and rmdir retires it (as ZFS's .zfs/snapshot).

Directories are implicit in the seed: a directory is the prefix of a published path, and empty
directory identity is unsupported. So the mount stores each directory it makes or empties in the
directory's attribute marker, an ordinary artifact inside it (nokvfs.workspace.attributes):
`mkdir` publishes it (with the mode), chmod, chown and utime change it, and `keep` publishes it
before the directory's last path goes. A directory then stays until rmdir, across remounts.

What is refused, and with which errno: EPERM for the root's workbenches and a workbench's sections
and views (never removed or renamed), and for attributes of `/` and `/<wb>/`; EEXIST for mkdir
of an existing name; ENOTEMPTY for rmdir of a directory with entries; EXDEV for renaming a
directory that holds more published paths than one command moves (namespace.MAX_DIRECTORY_RENAME,
1,000: like overlayfs the mount then answers EXDEV and `mv` falls back to copy and remove; a
smaller tree moves in one atomic command); EINVAL for mkdir of a numeric
name or an invalid alias in `.snapshots/`; EBUSY for rmdir of a snapshot a restore/fork consumes.
"""

from __future__ import annotations

import errno
import logging
import time

from nokvfs.errors import AlreadyExists, CommandTooLarge, NameInvalid, NotADirectory
from nokvfs.fs import names
from nokvfs.fs import views as views_
from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import Kind, Node
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.schema.names import check_snapshot_alias, check_workbench_id
from nokvfs.workspace import attributes, namespace, snapshot
from nokvfs.workspace import workbench as wb

log = logging.getLogger(__name__)

LIVE = views_.LIVE
DEFAULT_MODE = 0o755


class Directories:
    def __init__(self, tree):
        self.tree = tree
        self.root = tree.root
        self.workers = tree.workers
        # Write-back mode (nokvfs.fs.writeback.Publisher): mkdir and a directory's attribute
        # changes are accepted into its journal and stored by its publisher.
        self.writeback = None

    async def mkdir(self, parent: Node, name: str, mode: int, uid: int, gid: int) -> Node:
        tree = self.tree
        if parent.kind is Kind.HISTORY and parent.components[0] == views_.SNAPSHOTS:
            return await self._mint(parent, name)
        tree.check_writable(f"mkdir {name}", parent)
        if parent.kind is Kind.ROOT:
            try:
                check_workbench_id(name)
            except NameInvalid as exc:
                raise refuse(errno.EINVAL, str(exc)) from None
            tree.own(ChangeEventKind.WorkspaceCreated, name.encode())
            created = await self.workers.bounded(f"mkdir /{name}", self.workers.run, wb.create, self.root, name)
            tree.refresh_workbenches()
            return tree.workbench_node(created)
        if parent.kind is Kind.WORKBENCH:
            if name in wb.SECTIONS or name in views_.HISTORY_DIRS:
                raise refuse(errno.EEXIST, f"{name} is a section or a view directory")
            raise refuse(errno.EPERM, f"directories live below a section {wb.SECTIONS}, not in {parent.describe()}")
        names.check_entry_parent(parent, f"mkdir {name}")
        components = parent.components + (name,)
        names.check_directory_path(self.root, parent, components)
        if tree.lookup(parent, name) is not None:
            raise refuse(errno.EEXIST, f"{parent.describe()}/{name} exists")
        tree.subdirectories_changed(parent.incarnation, parent.components, +1)
        tree.overlay.add_dir(parent.incarnation, components)
        node = tree.child(parent, Kind.DIR, name)
        now = time.time_ns()
        node.dir_ctime_ns = now  # this mount's own change, shown until the shard records newer ones
        node.dir_subdirs = 0  # new and empty: no scan for the stat the kernel makes next
        tree.directory_changed(parent.incarnation, parent.components, now)
        # The directory is stored with its marker: without one an empty directory would live only
        # in this daemon's memory, and vanish at the next mount (git's empty `.git/refs/heads`
        # with it). An owner other than the mount's is stored too. At once by default; in
        # write-back mode accepted into the journal and stored by the publisher.
        changes = {"mode": mode & 0o7777}
        if (uid, gid) != (tree.uid, tree.gid):
            changes.update(uid=uid, gid=gid)
        try:
            await self.set_attributes(node, changes)
        except BaseException:
            tree.overlay.remove_dir(parent.incarnation, components)
            tree.subdirectories_changed(parent.incarnation, parent.components, -1)
            tree.inodes.detach(node)
            raise
        return node

    async def keep(self, parent: Node, leaving: str) -> None:
        """Before `leaving` goes from `parent` (unlink, rmdir, a rename to another directory):
        when it is the directory's last published path and the directory has no marker, store
        one first, so the directory stays, as on a local disk (the seed's directories are
        implicit: one made by a put below it would vanish with its last path). First, so a crash
        in between leaves a marker too many, never a directory too few."""
        if parent.kind is not Kind.DIR:
            return  # sections, workbenches and the root never go
        tree = self.tree
        with tree.view.read() as v:
            workbench = tree.view.require(v, parent.workbench_id, parent.incarnation)
            children, anchor = tree.view.children(v, workbench, parent.components, start_after=None, limit=2)
        if anchor is not None or len(children) != 1 or children[0].name != leaving:
            return  # other entries (the marker among them) keep it
        await self.set_attributes(parent, {}, now=True)  # stored before the path goes, in either mode

    async def rmdir(self, parent: Node, name: str) -> None:
        tree = self.tree
        if parent.kind is Kind.ROOT:
            if tree.lookup(parent, name) is None:
                raise refuse(errno.ENOENT, f"no workbench {name}")
            raise refuse(errno.EPERM, "a Visible workbench is never removed")
        if parent.kind is Kind.WORKBENCH:
            if name in wb.SECTIONS or name in views_.HISTORY_DIRS:
                raise refuse(errno.EPERM, f"{name} is a section or a view directory: it cannot be removed")
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
        if parent.kind is Kind.HISTORY and parent.components[0] == views_.SNAPSHOTS:
            await self._retire(parent, name)
            return
        tree.check_writable(f"rmdir {name}", parent)
        node = tree.lookup(parent, name)
        if node is None:
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
        if not node.kind.is_dir:
            raise refuse(errno.ENOTDIR, f"{node.describe()} is not a directory")
        if self._has_entries(node) or tree.overlay.has_children(node.incarnation, node.components):
            raise refuse(errno.ENOTEMPTY, f"{node.describe()} is not empty")
        token = tree.subdirectories_token(parent.incarnation, parent.components)
        await self.keep(parent, name)
        if self.writeback is not None:
            await self.writeback.directory_settled(node)  # its marker stored, then removed
        if self._marker(node) is not None:
            await self.workers.bounded(
                f"rmdir {node.describe()}",
                self.workers.run,
                namespace.remove_directory_attributes,
                self.root,
                node.workbench_id,
                node.path,
            )
        tree.overlay.remove_dir(node.incarnation, node.components)
        # The parent stays, as on a local disk, even when this was its last entry.
        tree.overlay.add_dir(node.incarnation, node.components[:-1])
        tree.subdirectories_changed(parent.incarnation, parent.components, -1, token)
        tree.directory_changed(parent.incarnation, parent.components, time.time_ns())
        tree.inodes.detach(node)

    def _has_entries(self, node: Node) -> bool:
        """Entries below the directory other than its attribute marker."""
        tree = self.tree
        with tree.view.read() as v:
            workbench = tree.view.require(v, node.workbench_id, node.incarnation)
            children, anchor = tree.view.children(v, workbench, node.components, start_after=None, limit=2)
        return anchor is not None or any(c.name != attributes.DIRECTORY_MARKER or c.entry is None for c in children)

    def _marker(self, node: Node):
        tree = self.tree
        with tree.view.read() as v:
            return tree.view.entry(v, node.incarnation, node.components + (attributes.DIRECTORY_MARKER,))

    async def rename_dir(self, source: Node, target: Node | None, dst: tuple) -> None:
        """rename(2) of a directory. Its published paths move in one command (at most
        namespace.MAX_DIRECTORY_RENAME of them: a bigger tree is EXDEV, and mv copies it); what
        only this mount holds (empty directories, files not published yet, open spools) moves
        in memory with it, and every inode below keeps its number, as on a local disk."""
        tree = self.tree
        incarnation = source.incarnation
        src = source.components
        limit = namespace.MAX_DIRECTORY_RENAME
        tokens = [tree.subdirectories_token(incarnation, c) for c in (src[:-1], dst[:-1])]
        with tree.view.read() as v:
            durable = namespace.paths_below(v, self.root, incarnation, src, limit + 1)
        if len(durable) > limit:
            raise refuse(
                errno.EXDEV,
                f"{source.describe()} holds more than {limit} files: a tree that big is moved by copying (mv does this "
                "on EXDEV)",
            )
        if target is not None:
            if not target.kind.is_dir:
                raise refuse(errno.ENOTDIR, f"{target.describe()} is not a directory")
            if self._has_entries(target) or tree.overlay.has_children(incarnation, dst):
                raise refuse(errno.ENOTEMPTY, f"{target.describe()} is not empty")
            if not durable and self._marker(target) is not None:
                await self.workers.bounded(
                    f"rename over {target.describe()}",
                    self.workers.run,
                    namespace.remove_directory_attributes,
                    self.root,
                    target.workbench_id,
                    target.path,
                )
        if durable:
            paths = [c for _, _, c in durable] + [dst + c[len(src) :] for _, _, c in durable]
            tree.begin_change(incarnation, *paths)
            try:
                moved = await self.workers.bounded(
                    f"rename of {source.describe()}",
                    self.workers.run,
                    lambda: namespace.rename_directory(self.root, source.workbench_id, source.path, "/".join(dst)),
                )
                for _, _, entry in moved:
                    tree.own(ChangeEventKind.PathRenamed, entry.artifact_revision_id)
            except CommandTooLarge:
                raise refuse(errno.EXDEV, f"{source.describe()} holds more than {limit} files: mv copies it") from None
            except AlreadyExists:
                raise refuse(errno.ENOTEMPTY, f"{source.workbench_id}:{'/'.join(dst)} is not empty") from None
            except NotADirectory as exc:
                raise refuse(errno.ENOTDIR, str(exc)) from None
            finally:
                tree.end_change(incarnation, *paths)
            entries = {new: entry for _, new, entry in moved}
        else:
            entries = {}
        if target is not None:
            tree.overlay.remove_dir(incarnation, dst)
            if target is not source:
                tree.inodes.detach(target)
        below = tree.inodes.below(source.view, incarnation, src)
        tree.overlay.move_tree(incarnation, src, dst)
        tree.inodes.move(source, dst)
        for node in below:
            new = dst + node.components[len(src) :]
            tree.inodes.move(node, new)
            entry = entries.get(new)
            if entry is not None:
                node.learn(entry)
                if node.bound is not None:
                    node.bound = entry
            if node.spool is not None:
                if entry is not None and node.spool.base is not None:
                    node.spool.base = entry
                node.spool.moved(new)
        if not durable:
            tree.overlay.add_dir(incarnation, dst)
        tree.overlay.add_dir(incarnation, src[:-1])  # the old parent stays
        now = time.time_ns()
        tree.subdirectories_changed(incarnation, src[:-1], -1, tokens[0])
        if target is None:
            tree.subdirectories_changed(incarnation, dst[:-1], +1, tokens[1])
        tree.directory_changed(incarnation, src[:-1], now)
        tree.directory_changed(incarnation, dst[:-1], now)

    # --- attributes ----------------------------------------------------------------------------

    async def set_attributes(self, node: Node, changes: dict, *, now: bool = False) -> None:
        """chmod/chown/utime of a directory below a section: stored in its attribute marker (in
        write-back mode accepted, and stored by the publisher, unless `now`)."""
        tree = self.tree
        tree.check_writable(f"attributes of {node.describe()}", node)
        if node.kind not in (Kind.SECTION, Kind.DIR):
            raise refuse(
                errno.EPERM, f"the attributes of {node.describe()} are fixed (the root, a workbench or a view)"
            )
        names.check_storable(self.root, node.workbench_id, node.components + (attributes.DIRECTORY_MARKER,))
        if self.writeback is not None and not now:
            await self.writeback.accept_directory(node, changes)
            return
        entry = await self.workers.bounded(
            f"attributes of {node.describe()}",
            self.workers.run,
            lambda: namespace.set_directory_attributes(self.root, node.workbench_id, node.path, **changes),
        )
        # One event follows, of the one kind the call caused: PathPut when it made the marker
        # (created and modified at one commit), PathAttributesChanged when it changed one (which
        # keeps the revision). Owning both left the other pending, and it then swallowed the next
        # attribute change of this directory by another process.
        made = entry.created_version == entry.modified_version
        tree.own(ChangeEventKind.PathPut if made else ChangeEventKind.PathAttributesChanged, entry.artifact_revision_id)
        tree.overlay.published(node.incarnation, node.components + (attributes.DIRECTORY_MARKER,))

    # --- snapshots: mkdir mints, rmdir retires (as in ZFS's .zfs/snapshot) ----------------------

    async def _mint(self, parent: Node, name: str) -> Node:
        """mkdir /<wb>/.snapshots/<alias>: mint a snapshot with that alias (the default lease)."""
        tree = self.tree
        tree.check_writable(f"mkdir {name}")
        if name.isascii() and name.isdigit():
            raise refuse(
                errno.EINVAL,
                f"{name!r} is numeric: snapshot ids are given by the root, an alias must not look like one",
            )
        try:
            check_snapshot_alias(name)
        except NameInvalid as exc:
            raise refuse(errno.EINVAL, str(exc)) from None
        if tree.lookup(parent, name) is not None:
            raise refuse(errno.EEXIST, f"snapshot {name!r} exists (rmdir retires it)")
        minted = await self.workers.bounded(
            f"mint {name}", self.workers.run, lambda: snapshot.mint(self.root, parent.workbench_id, alias=name)
        )
        if minted.workbench.incarnation_id != parent.incarnation:
            raise refuse(errno.ENOENT, f"{parent.describe()} is another incarnation now")
        log.info(
            "minted snapshot %d (%s) of %s at version %d",
            minted.snapshot_id,
            name,
            parent.workbench_id,
            minted.read_version,
        )
        return tree.view_root(
            views_.SnapshotView(self.root, parent.workbench_id, parent.incarnation, minted.snapshot_id, name)
        )

    async def _retire(self, parent: Node, name: str) -> None:
        """rmdir /<wb>/.snapshots/<alias-or-id>: retire it (EBUSY while a restore/fork consumes it)."""
        tree = self.tree
        tree.check_writable(f"rmdir {name}")
        node = tree.lookup(parent, name)
        if node is None:
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} is not an Active snapshot")
        view = tree.view_of(node)
        retired = await self.workers.bounded(
            f"retire {name}", self.workers.run, snapshot.retire, self.root, parent.workbench_id, view.snapshot_id
        )
        log.info("retired snapshot %d (%s) of %s", retired, name, parent.workbench_id)
        tree.inodes.detach(node)
        # The kernel drops `name` itself; the same snapshot under its other name (the alias or the
        # numeric id) is gone too, and must not wait for the change feed to come round to it.
        for other in list(tree.inodes.of_workbench(parent.workbench_id)):
            if other is node or other.kind is not Kind.VIEW or other.incarnation != parent.incarnation:
                continue
            other_view = tree.view_of(other)
            if isinstance(other_view, views_.SnapshotView) and other_view.snapshot_id == view.snapshot_id:
                tree.invalidator.entry(parent.ino, other_view.entry_name, deleted=other.ino)
                tree.inodes.detach(other)
