"""POSIX attributes of paths (placeholder until the attributes branch lands: shows defaults only)."""

from __future__ import annotations

import dataclasses

from nokvfs.schema.ids import creation_unix_ms

SYMLINK_CONTENT_TYPE = "inode/symlink"
DIRECTORY_MARKER = ".nokvfs-directory"
FILE_MODE = 0o644
LINK_MODE = 0o777
DIRECTORY_MODE = 0o755


@dataclasses.dataclass(frozen=True)
class Attributes:
    mode: int
    uid: int | None
    gid: int | None
    mtime_ns: int
    atime_ns: int
    ctime_ns: int


def is_symlink(entry) -> bool:
    return entry.content_type == SYMLINK_CONTENT_TYPE


def shown(entry) -> Attributes:
    t = creation_unix_ms(entry.artifact_revision_id) * 1_000_000
    return Attributes(LINK_MODE if is_symlink(entry) else FILE_MODE, None, None, t, t, t)
