"""The one helper that builds EntryAttributes, and the kernel cache timeouts per kind of entry.

What the attributes say, and where it comes from:

* st_size: PathEntry.logical_size (a file this mount is writing: its spool's size; a symbolic link:
  the length of its target); 0 for directories.
* st_mode, st_uid, st_gid, st_mtime, st_atime, st_ctime of a file or link: its stored POSIX
  attributes (nokvfs.workspace.attributes); a path published without them shows 0644 (0777 for
  a link), the mount's owner, and its revision's creation time (the UUIDv7 timestamp of its
  ArtifactRevisionId) for all three times. Access times are not updated by reads (noatime).
* a directory below a section: its stored attributes when it has them, else 0755 and the mount's
  owner; its mtime/ctime are derived from what the shard records (nokvfs.fs.tree). Sections,
  workbenches and the root show 0755; read-only views 0555 (files 0444).
* st_nlink of a directory: 2 plus its subdirectories, as on ext4 (find's leaf optimisation and
  `ls -ld` read it); 1, the usual "not counted", for the view families (`.snapshots/`, `.commits/`,
  `.tags/`: the first-parent log may be long) and for a directory with more children than
  tree.DIR_SCAN_LIMIT. A file or link: 1 (0 once no name links it).
* st_blocks: 512-byte units of the logical size; st_blksize: the preferred I/O size (1 MiB, the
  largest FUSE request), so cp/cat use large buffers.
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
from dataclasses import dataclass

import pyfuse3

from nokvfs.fs.inodes import Kind

BLKSIZE = 1 << 20
FILE_MODE = 0o644
LINK_MODE = 0o777
DIRECTORY_MODE = 0o755
READ_ONLY_DIRECTORY_MODE = 0o555

# kind -> (entry_timeout, attr_timeout) in seconds
TIMEOUTS = {
    Kind.ROOT: (1.0, 1.0),
    Kind.WORKBENCH: (300.0, 10.0),
    Kind.SECTION: (3600.0, 10.0),
    Kind.DIR: (10.0, 10.0),
    Kind.FILE: (10.0, 10.0),
    Kind.LINK: (10.0, 10.0),
    Kind.HISTORY: (3600.0, 10.0),  # always present beside the sections
    Kind.VIEW: (3600.0, 3600.0),  # entries invalidated by the mint/retire/commit/tag events
}
READ_ONLY_TIMEOUTS = (3600.0, 3600.0)  # immutable views
NEGATIVE_TIMEOUT = 1.0


@dataclass(frozen=True)
class Shown:
    """What one stat(2) shows of an inode (before the file-type bits are added)."""

    mode: int  # permission bits
    size: int
    uid: int
    gid: int
    mtime_ns: int
    atime_ns: int
    ctime_ns: int
    nlink: int = 2  # directories: 2 + subdirectories, or 1 when not counted


def build(node, shown: Shown, *, timeouts=None) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = node.ino
    attr.generation = 0
    entry_timeout, attr_timeout = timeouts or TIMEOUTS[node.kind]
    attr.entry_timeout = entry_timeout
    attr.attr_timeout = attr_timeout
    if node.kind.is_dir:
        attr.st_mode = stat_m.S_IFDIR | shown.mode
        attr.st_nlink = shown.nlink
        attr.st_size = 0
    elif node.kind is Kind.LINK:
        attr.st_mode = stat_m.S_IFLNK | shown.mode
        attr.st_nlink = 0 if node.detached else 1
        attr.st_size = shown.size
    else:
        attr.st_mode = stat_m.S_IFREG | shown.mode
        attr.st_nlink = 0 if node.detached else 1  # removed or replaced: no name links it any more
        attr.st_size = shown.size
    attr.st_uid = shown.uid
    attr.st_gid = shown.gid
    attr.st_rdev = 0
    attr.st_blksize = BLKSIZE
    attr.st_blocks = (attr.st_size + 511) // 512
    attr.st_atime_ns = shown.atime_ns
    attr.st_mtime_ns = shown.mtime_ns
    attr.st_ctime_ns = shown.ctime_ns
    return attr


def negative() -> pyfuse3.EntryAttributes:
    """A cacheable "no such entry" (st_ino 0): the kernel keeps it for NEGATIVE_TIMEOUT."""
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = 0
    attr.entry_timeout = NEGATIVE_TIMEOUT
    return attr
