"""The pyfuse3 Operations of a nokvfs mount. It translates, and owns no state of its own.

Each handler decodes the request, asks the tree (names, nodes, rules), the handles (spools) or
the block fetcher (bytes), and turns the answer into EntryAttributes/FileInfo -- or, through
`nokvfs.fs.errors.translated`, into the one errno mapping. Unsupported calls (symlink, link,
mknod; setxattr and removexattr, which are EROFS inside a read-only view) answer ENOTSUP with a
log line that says why. Extended attributes: see nokvfs.fs.xattrs.
"""

from __future__ import annotations

import errno
import logging
import os

import pyfuse3

from nokvfs.fs import attrs
from nokvfs.fs.errors import refuse, translated
from nokvfs.fs.handles import DirHandle, HandleTable, ReadHandle, WriteHandle

log = logging.getLogger(__name__)

FRSIZE = 4096
_UNKNOWN_CAPACITY = 1 << 50  # 1 PiB: what statfs reports for a store that cannot say


class Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False  # close(2) must see the publication's error
    enable_acl = False

    def __init__(self, tree, fetcher):
        super().__init__()
        self.tree = tree
        self.fetcher = fetcher
        self.handles = HandleTable()

    # --- names -----------------------------------------------------------------------------------

    async def lookup(self, parent_inode, name, ctx=None):
        with translated("lookup"):
            tree = self.tree
            node = tree.lookup(tree.node(parent_inode), tree.component(name, creating=False))
            if node is None:
                return attrs.negative()
            tree.inodes.remember(node)
            return tree.attributes(node, fresh=False)

    async def forget(self, inode_list):
        for inode, nlookup in inode_list:
            self.tree.inodes.forget(inode, nlookup)

    async def getattr(self, inode, ctx=None):
        with translated("getattr"):
            return self.tree.attributes(self.tree.node(inode))

    async def setattr(self, inode, attr, fields, fh, ctx):
        with translated("setattr"):
            tree = self.tree
            node = tree.node(inode)
            tree.check_writable(f"setattr {node.describe()}", node)
            if fields.update_size:
                await tree.truncate(node, attr.st_size, None if fh is None else self.handles.get(fh))
            # Mode, owner and times are not part of the namespace: accepted, not stored (so tar,
            # cp -p and rsync -a succeed); mtime stays the revision's creation time.
            return tree.attributes(node, fresh=False)

    # --- directories -----------------------------------------------------------------------------

    async def opendir(self, inode, ctx):
        with translated("opendir"):
            node = self.tree.node(inode)
            return self.handles.add(lambda fh: self.tree.opendir(fh, node)).fh

    async def readdir(self, fh, start_id, token):
        with translated("readdir"):
            tree = self.tree
            handle = self.handles.get(fh)
            if not isinstance(handle, DirHandle):
                raise refuse(errno.EBADF, f"readdir on handle {fh}")
            tree.seek(handle, start_id)
            while handle.buffer or tree.fill(handle):
                item = handle.buffer[0]
                node = tree.entry_node(handle, item)
                if node is None:
                    handle.buffer.popleft()
                    tree.advance(handle, item)
                    continue
                attr = tree.attributes(node, fresh=False)
                if not pyfuse3.readdir_reply(token, item[0].encode("utf-8"), attr, handle.pos + 1):
                    tree.inodes.unused(node)
                    return
                tree.inodes.remember(node)
                handle.buffer.popleft()
                tree.advance(handle, item)

    async def releasedir(self, fh):
        handle = self.handles.pop(fh)
        if handle is not None:
            self.tree.releasedir(handle)

    async def mkdir(self, parent_inode, name, mode, ctx):
        with translated("mkdir", creating=True):
            tree = self.tree
            node = await tree.mkdir(tree.node(parent_inode), tree.component(name, creating=True))
            tree.inodes.remember(node)
            return tree.attributes(node, fresh=False)

    async def rmdir(self, parent_inode, name, ctx):
        with translated("rmdir"):
            tree = self.tree
            await tree.rmdir(tree.node(parent_inode), self._existing(name))

    # --- files -----------------------------------------------------------------------------------

    async def create(self, parent_inode, name, mode, flags, ctx):
        with translated("create", creating=True):
            tree = self.tree
            parent = tree.node(parent_inode)
            component = tree.component(name, creating=True)
            handle = self.handles.add(lambda fh: tree.create(fh, parent, component, flags))
            tree.inodes.remember(handle.node)
            return pyfuse3.FileInfo(fh=handle.fh, keep_cache=False), tree.attributes(handle.node, fresh=False)

    async def open(self, inode, flags, ctx):
        with translated("open"):
            tree = self.tree
            node = tree.node(inode)
            kept = []

            def make(fh):
                handle, keep_cache = tree.open(fh, node, flags)
                kept.append(keep_cache)
                return handle

            handle = self.handles.add(make)
            return pyfuse3.FileInfo(fh=handle.fh, keep_cache=kept[0])

    async def read(self, fh, off, size):
        with translated("read"):
            handle = self.handles.get(fh)
            if isinstance(handle, ReadHandle):
                writer = self.tree.latest_writer(handle.node)
                if writer is not None:
                    return await self._read_writer(writer, off, size, handle.stream)
                if handle.entry is not None:
                    return await self.fetcher.read(handle.entry, off, size, handle.stream)
                return b""
            if isinstance(handle, WriteHandle):
                return await self._read_writer(handle, off, size, handle.stream)
            raise refuse(errno.EBADF, f"read on handle {fh}")

    async def _read_writer(self, handle: WriteHandle, off: int, size: int, stream) -> bytes:
        """The bytes of an open writer: its spool, and its base revision where it has no bytes."""
        async with handle.lock:  # not while it is being filled or published
            size = max(0, min(size, handle.size - off))
            if size == 0 or handle.fd < 0:
                return b""
            if handle.filled:
                return handle.pread(off, size)
            if not handle.append_mode:
                return await self.fetcher.read(handle.base, off, size, stream)
            split = handle.base.logical_size
            head = b"" if off >= split else await self.fetcher.read(handle.base, off, min(size, split - off), stream)
            tail = b"" if off + size <= split else os.pread(handle.fd, off + size - max(off, split), max(off, split) - split)
            return head + tail

    async def write(self, fh, off, buf):
        with translated("write"):
            handle = self.handles.get(fh)
            if not isinstance(handle, WriteHandle):
                raise refuse(errno.EBADF, f"write on handle {fh} not opened for writing")
            async with handle.lock:
                if handle.needs_fill_for_write(off):
                    await self.tree.workers.run(handle.fill_blocking)
                handle.write(off, buf)
            return len(buf)

    async def flush(self, fh):
        handle = self.handles.get(fh)
        if isinstance(handle, WriteHandle):
            with translated("close", creating=handle.creating):
                await self.tree.publish_if_dirty(handle, why="publication at close", closing=True)

    async def fsync(self, fh, datasync):
        handle = self.handles.get(fh)
        if isinstance(handle, WriteHandle):
            with translated("fsync", creating=handle.creating):
                await self.tree.publish_if_dirty(handle, why="publication at fsync")

    async def release(self, fh):
        handle = self.handles.pop(fh)
        if handle is None:
            return
        with translated("release"):
            await self.tree.release(handle)

    async def unlink(self, parent_inode, name, ctx):
        with translated("unlink"):
            tree = self.tree
            await tree.unlink(tree.node(parent_inode), self._existing(name))

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        with translated("rename"):
            tree = self.tree
            await tree.rename(
                tree.node(parent_inode_old),
                self._existing(name_old),
                tree.node(parent_inode_new),
                tree.component(name_new, creating=True),
                flags,
            )

    def _existing(self, raw: bytes) -> str:
        name = self.tree.component(raw, creating=False)
        if name is None:
            raise refuse(errno.ENOENT, f"no entry {raw!r}")
        return name

    # --- the file system -------------------------------------------------------------------------

    async def statfs(self, ctx):
        with translated("statfs"):
            stats = await self.tree.statfs()
            used = stats.used_bytes or 0
            free = stats.free_bytes if stats.free_bytes is not None else max(0, (stats.total_bytes or _UNKNOWN_CAPACITY) - used)
            total = stats.total_bytes if stats.total_bytes is not None else used + free
            out = pyfuse3.StatvfsData()
            out.f_bsize = FRSIZE
            out.f_frsize = FRSIZE
            out.f_blocks = total // FRSIZE
            out.f_bfree = free // FRSIZE
            out.f_bavail = free // FRSIZE
            # Paths cost no inode-like resource: report a generous, constant supply.
            out.f_files = 1 << 32
            out.f_ffree = 1 << 32
            out.f_favail = 1 << 32
            out.f_namemax = 255
            return out

    # --- extended attributes ---------------------------------------------------------------------

    async def getxattr(self, inode, name, ctx):
        with translated("getxattr"):
            return self.tree.xattr(self.tree.node(inode), name)

    async def listxattr(self, inode, ctx):
        with translated("listxattr"):
            return self.tree.listxattr(self.tree.node(inode))

    async def setxattr(self, inode, name, value, ctx):
        with translated("setxattr"):
            raise self.tree.refuse_xattr_change(self.tree.node(inode))

    async def removexattr(self, inode, name, ctx):
        with translated("removexattr"):
            raise self.tree.refuse_xattr_change(self.tree.node(inode))

    # --- unsupported -----------------------------------------------------------------------------

    async def symlink(self, parent_inode, name, target, ctx):
        raise refuse(errno.ENOTSUP, "symbolic links are not artifacts")

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise refuse(errno.ENOTSUP, "hard links are not supported: a path is the identity")

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise refuse(errno.ENOTSUP, "special files are not artifacts")

    async def readlink(self, inode, ctx):
        raise refuse(errno.EINVAL, "there are no symbolic links")
