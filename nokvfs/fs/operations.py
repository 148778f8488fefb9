"""The pyfuse3 Operations of a nokvfs mount: protocol translation only.

Each handler unpacks the request, calls the filesystem core (nokvfs.fs.filesystem.FileSystem) and
packs its answer into EntryAttributes/FileInfo/StatvfsData -- or, through
`nokvfs.fs.errors.translated`, turns a typed error into the one errno mapping. No rule lives here.
"""

from __future__ import annotations

import pyfuse3

from nokvfs.fs.errors import translated
from nokvfs.fs.names import NAME_MAX

FRSIZE = 4096


class Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False  # close(2) must see the publication's error
    enable_acl = False

    def __init__(self, fs):
        super().__init__()
        self.fs = fs

    # --- names -----------------------------------------------------------------------------------

    async def lookup(self, parent_inode, name, ctx=None):
        with translated("lookup"):
            return self.fs.lookup(parent_inode, name, None if ctx is None else ctx.pid)

    async def forget(self, inode_list):
        self.fs.forget(inode_list)

    async def getattr(self, inode, ctx=None):
        with translated("getattr"):
            return self.fs.getattr(inode)

    async def setattr(self, inode, attr, fields, fh, ctx):
        with translated("setattr"):
            return await self.fs.setattr(inode, attr, fields, fh, ctx.uid, ctx.gid)

    # --- directories -----------------------------------------------------------------------------

    async def opendir(self, inode, ctx):
        with translated("opendir"):
            return self.fs.opendir(inode)

    async def readdir(self, fh, start_id, token):
        with translated("readdir"):
            self.fs.readdir(fh, start_id, lambda name, attr, next_id: pyfuse3.readdir_reply(token, name, attr, next_id))

    async def fsyncdir(self, fh, datasync):
        with translated("fsyncdir"):
            await self.fs.fsyncdir(fh)

    async def releasedir(self, fh):
        self.fs.releasedir(fh)

    async def mkdir(self, parent_inode, name, mode, ctx):
        with translated("mkdir", creating=True):
            return await self.fs.mkdir(parent_inode, name, _masked(mode, ctx), ctx.uid, ctx.gid)

    async def rmdir(self, parent_inode, name, ctx):
        with translated("rmdir"):
            await self.fs.rmdir(parent_inode, name)

    # --- files -----------------------------------------------------------------------------------

    async def create(self, parent_inode, name, mode, flags, ctx):
        with translated("create", creating=True):
            fh, attr = await self.fs.create(parent_inode, name, _masked(mode, ctx), flags, ctx.uid, ctx.gid)
            return pyfuse3.FileInfo(fh=fh, keep_cache=False), attr

    async def open(self, inode, flags, ctx):
        with translated("open"):
            fh, keep_cache = await self.fs.open(inode, flags, ctx.pid)
            return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache)

    async def read(self, fh, off, size):
        with translated("read"):
            return await self.fs.read(fh, off, size)

    async def write(self, fh, off, buf):
        with translated("write"):
            return await self.fs.write(fh, off, buf)

    async def flush(self, fh):
        with translated("close"):
            await self.fs.flush(fh)

    async def fsync(self, fh, datasync):
        with translated("fsync"):
            await self.fs.fsync(fh)

    async def release(self, fh):
        with translated("release"):
            await self.fs.release(fh)

    async def unlink(self, parent_inode, name, ctx):
        with translated("unlink"):
            await self.fs.unlink(parent_inode, name)

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        with translated("rename"):
            await self.fs.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    async def symlink(self, parent_inode, name, target, ctx):
        with translated("symlink", creating=True):
            return await self.fs.symlink(parent_inode, name, target, ctx.uid, ctx.gid)

    async def readlink(self, inode, ctx):
        with translated("readlink"):
            return await self.fs.readlink(inode)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        with translated("link"):
            return self.fs.link(inode, new_parent_inode, new_name)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        with translated("mknod"):
            return self.fs.mknod(parent_inode, name, mode)

    # --- the file system -------------------------------------------------------------------------

    async def statfs(self, ctx):
        with translated("statfs"):
            total, free = await self.fs.statfs()
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
            out.f_namemax = NAME_MAX
            return out

    # --- extended attributes ---------------------------------------------------------------------

    async def getxattr(self, inode, name, ctx):
        with translated("getxattr"):
            return self.fs.getxattr(inode, name)

    async def listxattr(self, inode, ctx):
        with translated("listxattr"):
            return self.fs.listxattr(inode)

    async def setxattr(self, inode, name, value, ctx):
        with translated("setxattr"):
            self.fs.change_xattr(inode)

    async def removexattr(self, inode, name, ctx):
        with translated("removexattr"):
            self.fs.change_xattr(inode)


def _masked(mode: int, ctx) -> int:
    """The mode a create or mkdir asks for, with the caller's umask applied (the kernel leaves it
    to the filesystem when it negotiated FUSE_DONT_MASK; applying it twice changes nothing)."""
    return mode & ~getattr(ctx, "umask", 0)
