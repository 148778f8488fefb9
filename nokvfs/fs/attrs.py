"""The one helper that builds EntryAttributes, and the kernel cache timeouts per kind of entry.

What the attributes say, and where it comes from:

* st_size: PathEntry.logical_size (a file being written here: its spool's size); 0 for dirs.
* st_mtime/st_ctime/st_atime: a file's revision creation time, the millisecond timestamp of its
  ArtifactRevisionId (a UUIDv7). A directory shows its workbench incarnation's creation time
  (also a UUIDv7): the seed's adapter "does not invent POSIX timestamps", so a directory's time
  does not move when its contents do. `touch`/utime are accepted and not stored.
* st_blocks: 512-byte units of the logical size; st_blksize: the preferred I/O size (1 MiB,
  the largest FUSE request), so cp/cat use large buffers.
* st_mode: 0644/0755, 0444/0555 on read-only views (and `.commits`/`.tags`, where nothing can be
  made; `.snapshots` is 0755: mkdir mints, rmdir retires); owner: the daemon's uid/gid.
* generation: 0 for every inode. The seed's synthesized directory generation (the workspace
  revision) and a file's path generation are served as the `user.nokvfs.generation` xattr, not
  as the FUSE generation: Linux marks a cached inode bad (EIO on every open descriptor and on a
  shell's cwd) when a lookup returns another generation for the same inode number.

Timeouts are deliberate per kind. The change-feed follower invalidates what another process
changes within ~200 ms, so the timeouts only bound staleness when an invalidation is missed:
sections and workbench directories never go away (Visible is terminal), implicit directories and
files are re-checked after a few seconds, negative entries after one. Everything inside a
snapshot, commit or tag view is immutable (its inode numbers include the view's identity), so it
is cached for an hour; the view names in `.snapshots/`, `.commits/` and `.tags/` are invalidated
by the SnapshotMinted/SnapshotRetired/CommitPublished/TagSet/TagDeleted events.
"""

from __future__ import annotations

import stat as stat_m

import pyfuse3

from nokvfs.fs.inodes import Kind

BLKSIZE = 1 << 20

# kind -> (entry_timeout, attr_timeout) in seconds
TIMEOUTS = {
    Kind.ROOT: (1.0, 1.0),
    Kind.WORKBENCH: (300.0, 10.0),
    Kind.SECTION: (3600.0, 10.0),
    Kind.DIR: (10.0, 10.0),
    Kind.FILE: (10.0, 10.0),
    Kind.HISTORY: (3600.0, 10.0),  # always present beside the sections
    Kind.VIEW: (3600.0, 3600.0),  # entries invalidated by the mint/retire/commit/tag events
}
READ_ONLY_TIMEOUTS = (3600.0, 3600.0)  # immutable views
NEGATIVE_TIMEOUT = 1.0


def build(node, *, size: int = 0, mtime_ns: int = 0, uid: int = 0, gid: int = 0, read_only: bool = False, timeouts=None) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = node.ino
    attr.generation = 0
    entry_timeout, attr_timeout = timeouts or TIMEOUTS[node.kind]
    attr.entry_timeout = entry_timeout
    attr.attr_timeout = attr_timeout
    if node.kind.is_dir:
        attr.st_mode = stat_m.S_IFDIR | (0o555 if read_only else 0o755)
        attr.st_nlink = 2
        attr.st_size = 0
    else:
        attr.st_mode = stat_m.S_IFREG | (0o444 if read_only else 0o644)
        attr.st_nlink = 1
        attr.st_size = size
    attr.st_uid = uid
    attr.st_gid = gid
    attr.st_rdev = 0
    attr.st_blksize = BLKSIZE
    attr.st_blocks = (attr.st_size + 511) // 512
    attr.st_atime_ns = mtime_ns
    attr.st_mtime_ns = mtime_ns
    attr.st_ctime_ns = mtime_ns
    return attr


def negative() -> pyfuse3.EntryAttributes:
    """A cacheable "no such entry" (st_ino 0): the kernel keeps it for NEGATIVE_TIMEOUT."""
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = 0
    attr.entry_timeout = NEGATIVE_TIMEOUT
    return attr
