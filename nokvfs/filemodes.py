"""Private local files: what nokvfs keeps on disk is readable by its owner only.

A data directory holds every artifact's bytes (objects/, cache/, spool/), the metadata (shard/,
control/) and live state (run/). Every directory nokvfs creates there is 0700 and every file
0600. The mode is given when the directory or file is created (`os.mkdir`, `os.open`, LMDB's
`mode`), so the caller's umask can only narrow it, never widen it.

`fsync_directory` and `replace_atomically` are the two durable-write steps every local record
(roles, owner records, sidecars, installed shards) shares.

`audit` finds what is wider on an existing data directory (one made before this rule, or
chmod'ed since): any group or other permission bit. fsck reports it (WIDE_MODE) and, with
--repair, `narrow` clears those bits (owner bits are kept).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

DIR_MODE = 0o700
FILE_MODE = 0o600
OTHERS = 0o077  # group and other bits: none of them belongs on a private file


def makedirs(path: str) -> None:
    """`os.makedirs(path, exist_ok=True)` with the leaf created 0700 (missing parents get the
    default mode: they are outside what nokvfs owns, like ~/.local/share)."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)


def opener(path: str, flags: int) -> int:
    """For `open(path, mode, opener=opener)`: a file it creates is 0600."""
    return os.open(path, flags, FILE_MODE)


def fsync_directory(path: str) -> None:
    """Make the entries of directory `path` durable (a file created, renamed or removed there)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: str, data: bytes, *, durable: bool = True) -> None:
    """Put `data` at `path` atomically: a private temporary file beside it, renamed over `path`;
    `durable`, the temporary fsynced first and the directory after. A crash leaves the old file
    or the new one (and at worst the temporary, which the next replace overwrites)."""
    with open(path + ".tmp", "wb", opener=opener) as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    if durable:
        fsync_directory(os.path.dirname(path) or ".")


@dataclass
class Wide:
    """The entries of one area of a data directory (`objects`, `shard`, `nokvfs.json`, ...)
    that others may access: (path, mode) of directories and of files."""

    area: str
    directories: list = field(default_factory=list)
    files: list = field(default_factory=list)

    def describe(self, top: str) -> str:
        parts = []
        for entries, wanted, one, many in (
            (self.directories, DIR_MODE, "directory", "directories"),
            (self.files, FILE_MODE, "file", "files"),
        ):
            if entries:
                path, mode = entries[0]
                parts.append(
                    f"{len(entries)} {one if len(entries) == 1 else many} wider than {wanted:04o} "
                    f"(e.g. {os.path.relpath(path, top)}: {stat.S_IMODE(mode):04o})"
                )
        return "; ".join(parts)


def audit(top: str) -> list[Wide]:
    """Every area of the data directory `top` holding a directory or file with group/other
    permission bits (symlinks are not followed), the data directory itself first."""
    found: dict[str, Wide] = {}

    def note(path: str, mode: int, area: str) -> None:
        if mode & OTHERS:
            wide = found.setdefault(area, Wide(area))
            (wide.directories if stat.S_ISDIR(mode) else wide.files).append((path, mode))

    note(top, os.lstat(top).st_mode, ".")
    with os.scandir(top) as entries:
        children = sorted(entries, key=lambda e: e.name)
    for child in children:
        mode = child.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            continue
        note(child.path, mode, child.name)
        if stat.S_ISDIR(mode):
            for path, below in _walk(child.path):
                note(path, below, child.name)
    return list(found.values())


def _walk(top: str):
    """(path, lstat mode) of everything below `top`, not following symlinks; entries removed
    while walking (a concurrent cache eviction, a finished spool) are skipped."""
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        continue
                    if stat.S_ISLNK(mode):
                        continue
                    yield entry.path, mode
                    if stat.S_ISDIR(mode):
                        stack.append(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            continue


def narrow(wide: Wide) -> list[str]:
    """Clear the group/other bits of every entry `wide` lists; the paths changed. Each is
    opened without following a symlink and changed through its descriptor, so an entry swapped
    for a link since the audit is never followed."""
    changed = []
    for path, _ in wide.directories + wide.files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink now: not ours to change
                continue
            raise
        try:
            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~OTHERS)
        finally:
            os.close(fd)
        changed.append(path)
    return changed
