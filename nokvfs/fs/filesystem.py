"""The mount's filesystem core: one method per request, in terms of nodes, names and bytes.

This is what `nokvfs.fs.operations` (the pyfuse3 adapter) calls, and what the kernel-less tests
drive: it keeps the handle table and the kernel's lookup counts, and asks the parts that own each
rule:

    tree.py         names to nodes, and what each node shows (attributes)
    names.py        what a name may be and where changes are refused
    listing.py      directory listings, paged
    files.py        open/read/write/flush/release/setattr/unlink/rename/symlink of files
    spools.py       the one write state of a file, and kept spools
    directories.py  mkdir/rmdir, directory attributes, `.snapshots/` mint and retire
    changes.py      what a change of another process means for the kernel's caches
    xattrs.py       index fields and facts as extended attributes
"""

from __future__ import annotations

import errno
import time

from nokvfs.fs import attrs, names
from nokvfs.fs.changes import Changes
from nokvfs.fs.directories import Directories
from nokvfs.fs.errors import refuse
from nokvfs.fs.files import FileHandle, Files, changes_of
from nokvfs.fs.inodes import Kind, Node
from nokvfs.fs.listing import DOTS, DirHandle, Listing
from nokvfs.fs.tree import Tree
from nokvfs.fs.xattrs import Xattrs

_UNKNOWN_CAPACITY = 1 << 50  # 1 PiB: what statfs reports for a store that cannot say
FRSIZE = 4096


class HandleTable:
    def __init__(self):
        self._handles: dict[int, object] = {}
        self._next = 1

    def add(self, handle) -> None:
        self._handles[handle.fh] = handle

    def next_fh(self) -> int:
        fh = self._next
        self._next += 1
        return fh

    def get(self, fh: int):
        return self._handles.get(fh)

    def pop(self, fh: int):
        return self._handles.pop(fh, None)

    def files(self):
        # list() copies in one step: `nokvfs status` asks from another thread.
        return [h for h in list(self._handles.values()) if isinstance(h, FileHandle)]

    def __len__(self) -> int:
        return len(self._handles)


class FileSystem:
    def __init__(
        self,
        root,
        view,
        workers,
        invalidator,
        fetcher,
        *,
        uid: int | None = None,
        gid: int | None = None,
        owner: dict | None = None,
        xattrs: bool = True,
    ):
        self.tree = Tree(root, view, workers, invalidator, uid=uid, gid=gid)
        self.listing = Listing(self.tree)
        self.files = Files(self.tree, fetcher, owner=owner)
        self.directories = Directories(self.tree)
        self.changes = Changes(self.tree)
        self.xattrs = Xattrs(self.tree, offered=xattrs)
        self.handles = HandleTable()
        self._statfs = None

    # --- names ------------------------------------------------------------------------------------

    def _name(self, raw: bytes, *, creating: bool) -> str | None:
        return names.component(raw, creating=creating)

    def _existing(self, raw: bytes) -> str:
        name = self._name(raw, creating=False)
        if name is None:
            raise refuse(errno.ENOENT, f"no entry {raw!r}")
        return name

    def _entry(self, node: Node):
        """A node the kernel now holds one more lookup reference to, and its attributes."""
        self.tree.inodes.remember(node)
        return self.tree.attributes(node, fresh=False)

    def lookup(self, parent_ino: int, raw: bytes, pid: int | None = None):
        tree = self.tree
        node, shown = tree.lookup_shown(tree.node(parent_ino), self._name(raw, creating=False))
        if node is None:
            self.files.retries.looked_up(pid, None)
            return attrs.negative()
        if shown is not None and node.kind is Kind.FILE and node.shows(shown):
            self.files.retries.looked_up(pid, node.ino, shown)  # the kernel's retry of an open
        return self._entry(node)

    def forget(self, inode_list) -> None:
        for inode, count in inode_list:
            self.tree.inodes.forget(inode, count)

    def getattr(self, ino: int):
        node = self.tree.node(ino)
        if node.spool is not None:
            node.spool.mtime_shown = True  # its next write moves the mtime (spools.modified_ns)
        return self.tree.attributes(node)

    async def setattr(self, ino: int, attr, fields, fh: int | None, uid: int, gid: int):
        tree = self.tree
        node = tree.node(ino)
        changes = changes_of(attr, fields, time.time_ns())
        size = attr.st_size if fields.update_size else None
        if size is None and not changes:
            return tree.attributes(node, fresh=False)
        tree.check_writable(f"setattr {node.describe()}", node)
        if node.kind.is_dir:
            if size is not None:
                raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
            await self.directories.set_attributes(node, changes)
            node.dir_ctime_ns = None
            return tree.attributes(node)
        handle = None if fh is None else self.handles.get(fh)
        await self.files.setattr(node, changes, size, handle if isinstance(handle, FileHandle) else None)
        return tree.attributes(node, fresh=False)

    # --- directories ------------------------------------------------------------------------------

    def opendir(self, ino: int) -> int:
        handle = self.listing.opendir(self.handles.next_fh(), self.tree.node(ino))
        self.handles.add(handle)
        return handle.fh

    def readdir(self, fh: int, start_id: int, reply) -> None:
        """Hand entries to `reply(name, attributes, next_id)` until it returns False or the end:
        "." and ".." first (offsets 1 and 2, as a local file system lists them; the kernel counts
        no lookup for them), then the listing's entries."""
        listing, tree = self.listing, self.tree
        handle = self.handles.get(fh)
        if not isinstance(handle, DirHandle):
            raise refuse(errno.EBADF, f"readdir on handle {fh}")
        if start_id < DOTS:
            for offset, name in ((1, "."), (2, ".."))[start_id:]:
                node = tree.lookup(handle.node, name)
                attr = tree.attributes(node, fresh=False)
                tree.inodes.unused(node)
                if not reply(name.encode(), attr, offset):
                    return
            start_id = DOTS
        listing.seek(handle, start_id - DOTS)
        while handle.buffer or listing.fill(handle):
            item = handle.buffer[0]
            node = listing.entry_node(handle, item)
            if node is None:
                handle.buffer.popleft()
                listing.advance(handle, item)
                continue
            attr = tree.attributes(node, fresh=False)
            if not reply(item[0].encode("utf-8"), attr, DOTS + handle.pos + 1):
                tree.inodes.unused(node)
                return
            tree.inodes.remember(node)
            handle.buffer.popleft()
            listing.advance(handle, item)

    async def fsyncdir(self, fh: int) -> None:
        handle = self.handles.get(fh)
        if not isinstance(handle, DirHandle):
            raise refuse(errno.EBADF, f"no open directory {fh}")
        await self.files.sync_directory(handle.node)

    def releasedir(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        if isinstance(handle, DirHandle):
            self.listing.releasedir(handle)

    async def mkdir(self, parent_ino: int, raw: bytes, mode: int, uid: int, gid: int):
        tree = self.tree
        node = await self.directories.mkdir(tree.node(parent_ino), self._name(raw, creating=True), mode, uid, gid)
        return self._entry(node)

    async def rmdir(self, parent_ino: int, raw: bytes) -> None:
        await self.directories.rmdir(self.tree.node(parent_ino), self._existing(raw))

    # --- files ------------------------------------------------------------------------------------

    async def create(self, parent_ino: int, raw: bytes, mode: int, flags: int, uid: int, gid: int):
        tree = self.tree
        parent = tree.node(parent_ino)
        name = self._name(raw, creating=True)
        handle = await self.files.create(self.handles.next_fh(), parent, name, flags, mode, uid, gid)
        self.handles.add(handle)
        return handle.fh, self._entry(handle.node)

    async def open(self, ino: int, flags: int, pid: int | None = None) -> tuple[int, bool]:
        handle, keep_cache = await self.files.open(self.handles.next_fh(), self.tree.node(ino), flags, pid)
        self.handles.add(handle)
        return handle.fh, keep_cache

    def _file(self, fh: int) -> FileHandle:
        handle = self.handles.get(fh)
        if not isinstance(handle, FileHandle):
            raise refuse(errno.EBADF, f"no open file {fh}")
        return handle

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        return await self.files.read(self._file(fh), offset, size)

    async def write(self, fh: int, offset: int, data) -> int:
        return await self.files.write(self._file(fh), offset, data)

    async def flush(self, fh: int) -> None:
        handle = self.handles.get(fh)
        if isinstance(handle, FileHandle):
            await self.files.flush(handle)

    async def fsync(self, fh: int) -> None:
        handle = self.handles.get(fh)
        if isinstance(handle, FileHandle):
            await self.files.fsync(handle)

    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        if isinstance(handle, FileHandle):
            await self.files.release(handle)

    async def unlink(self, parent_ino: int, raw: bytes) -> None:
        await self.files.unlink(self.tree.node(parent_ino), self._existing(raw), self.directories)

    async def rename(
        self, old_parent_ino: int, old_raw: bytes, new_parent_ino: int, new_raw: bytes, flags: int
    ) -> None:
        tree = self.tree
        await self.files.rename(
            tree.node(old_parent_ino),
            self._existing(old_raw),
            tree.node(new_parent_ino),
            self._name(new_raw, creating=True),
            flags,
            self.directories,
        )

    async def symlink(self, parent_ino: int, raw: bytes, target: bytes, uid: int, gid: int):
        node = await self.files.symlink(self.tree.node(parent_ino), self._name(raw, creating=True), target, uid, gid)
        return self._entry(node)

    async def readlink(self, ino: int) -> bytes:
        return await self.files.readlink(self.tree.node(ino))

    def link(self, ino: int, new_parent_ino: int, raw: bytes):
        self._name(raw, creating=True)
        raise refuse(errno.EPERM, "hard links are not supported: a path is the identity (the seed has no link records)")

    def mknod(self, parent_ino: int, raw: bytes, mode: int):
        self._name(raw, creating=True)
        raise refuse(errno.EPERM, "device nodes, FIFOs and sockets are not artifacts")

    # --- extended attributes ------------------------------------------------------------------------

    def getxattr(self, ino: int, name: bytes) -> bytes:
        return self.xattrs.get(self.tree.node(ino), name)

    def listxattr(self, ino: int) -> list[bytes]:
        return self.xattrs.list(self.tree.node(ino))

    def change_xattr(self, ino: int):
        raise self.xattrs.refuse_change(self.tree.node(ino))

    # --- the file system ------------------------------------------------------------------------

    async def statfs(self):
        """(f_bsize, f_blocks, f_bfree, f_namemax) from the store, cached for a second."""
        now = time.monotonic()
        if self._statfs is None or now - self._statfs[0] > 1.0:
            tree = self.tree
            stats = await tree.workers.bounded("statfs", tree.workers.run, tree.root.store.statfs)
            self._statfs = (now, stats)
        stats = self._statfs[1]
        used = stats.used_bytes or 0
        free = (
            stats.free_bytes
            if stats.free_bytes is not None
            else max(0, (stats.total_bytes or _UNKNOWN_CAPACITY) - used)
        )
        total = stats.total_bytes if stats.total_bytes is not None else used + free
        return total, free

    def open_spools(self):
        """Spools of files still open (for the end of the mount)."""
        seen = []
        for handle in self.handles.files():
            spool = handle.node.spool
            if spool is not None and spool not in seen:
                seen.append(spool)
        return seen
