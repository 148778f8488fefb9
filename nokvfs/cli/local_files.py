"""The local side of put and get: walking a local tree, and writing files, links and attributes
back into one, never through a symbolic link.

A walk (put) yields regular files, symbolic links and directories. What happens to a symlink:
  --links (-l)       it is stored as a link (its target, never resolved; like rsync -l);
  --copy-links (-L)  a link to a file is read by content wherever it points;
  neither            a link to a file inside the walked tree is read by content (as before); one
                     that points outside it, a link to a directory and a dangling link are skipped
                     with a warning, so a put never reads outside the tree it was given.
Directories come after everything below them (deepest first), so their attributes are stored
last, as rsync sets directory times after their contents.

Writing (get) creates missing directories below DEST and refuses a path whose existing parent
is a symbolic link, so a tree written under DEST stays under DEST. Files are written to a temp
file beside the destination, their mode, owner and times set on it, fsynced and renamed.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_module
import tempfile
from dataclasses import dataclass

from nokvfs import filemodes
from nokvfs.cli.common import warn
from nokvfs.errors import InvalidInput, NotADirectory

FILE = "file"
LINK = "link"
DIRECTORY = "dir"


@dataclass(frozen=True)
class Local:
    path: str  # the local path
    below: tuple[str, ...]  # its components below the walked top (() for the top itself)
    kind: str  # FILE, LINK or DIRECTORY


def _inside(path: str, top: str) -> bool:
    real = os.path.realpath(path)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def classify_link(path: str, top_real: str | None, *, links: bool, copy_links: bool) -> str | None:
    """What a put does with the symlink at `path`: LINK, FILE (read by content) or None (skip,
    with a warning saying why). `top_real`: the walked tree's real path (None for an operand)."""
    if links:
        return LINK
    try:
        target = os.stat(path)
    except OSError:
        warn(f"skipping {path!r}: a dangling symlink (-l stores it as a link)")
        return None
    if stat_module.S_ISDIR(target.st_mode):
        warn(f"skipping {path!r}: a symlink to a directory is not followed (-l stores it as a link)")
        return None
    if not stat_module.S_ISREG(target.st_mode):
        warn(f"skipping {path!r}: not a regular file")
        return None
    if copy_links or top_real is None or _inside(path, top_real):
        return FILE
    warn(f"skipping {path!r}: it points outside {top_real!r} (-l stores the link, -L copies what it points to)")
    return None


def walk(top: str, *, links: bool = False, copy_links: bool = False, directories: bool = True):
    """Every Local below `top` (top included as a directory when `directories`), files and links
    in name order (a directory's files before its subdirectories), then the directories deepest
    first."""

    def fail(exc):
        raise exc

    top_real = os.path.realpath(top)
    found_dirs = []
    for dirpath, dirnames, filenames in os.walk(top, onerror=fail):
        below_dir = () if dirpath == top else tuple(os.path.relpath(dirpath, top).split(os.sep))
        found_dirs.append(Local(dirpath, below_dir, DIRECTORY))
        entries = list(filenames)
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                dirnames.remove(name)  # os.walk does not follow it; it is handled as a link
                entries.append(name)
        dirnames.sort()
        for name in sorted(entries):
            local = os.path.join(dirpath, name)
            below = below_dir + (name,)
            if os.path.islink(local):
                kind = classify_link(local, top_real, links=links, copy_links=copy_links)
                if kind is not None:
                    yield Local(local, below, kind)
            elif stat_module.S_ISREG(os.lstat(local).st_mode):
                yield Local(local, below, FILE)
            else:
                warn(f"skipping {local!r}: not a regular file")
    if directories:
        yield from sorted(found_dirs, key=lambda d: len(d.below), reverse=True)


# --- writing ----------------------------------------------------------------------------------


def ensure_directory(base: str, components: tuple[str, ...]) -> str:
    """base/components as a directory, created as needed; an existing component that is a
    symbolic link or not a directory is refused (InvalidInput), so nothing is written through it."""
    path = base
    for name in components:
        path = os.path.join(path, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path)
            continue
        if stat_module.S_ISLNK(info.st_mode):
            raise InvalidInput(f"refusing to write through the symbolic link {path!r}")
        if not stat_module.S_ISDIR(info.st_mode):
            raise NotADirectory(f"{path!r} exists and is not a directory")
    return path


def default_mode(dest: str) -> int:
    """An existing destination's mode, else what the umask gives a new file."""
    try:
        return stat_module.S_IMODE(os.stat(dest).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(dest: str, chunks, *, attributes=None, owner: bool = False) -> None:
    """Write `chunks` to a temp file beside `dest`, set its mode (the stored one, else as
    default_mode), owner (only `owner`) and times (stored ones), fsync it, rename it over `dest`."""
    directory = os.path.dirname(os.path.abspath(dest))
    mode = attributes.mode if attributes is not None else default_mode(dest)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(dest) + ".", suffix=".nokvfs-tmp", dir=directory)
    with _installed(tmp, dest), os.fdopen(fd, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        if owner and attributes is not None:
            os.fchown(f.fileno(), _id(attributes.uid), _id(attributes.gid))
        os.fchmod(f.fileno(), mode)  # after fchown, which clears setuid/setgid
        if attributes is not None:
            os.utime(f.fileno(), ns=(attributes.atime_ns, attributes.mtime_ns))
        os.fsync(f.fileno())


@contextlib.contextmanager
def _installed(tmp: str, dest: str):
    """Rename the temp file `tmp` over `dest` once the block is done (and fsync the directory);
    remove it if the block fails."""
    try:
        yield
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    filemodes.fsync_directory(os.path.dirname(os.path.abspath(dest)))


def write_link(dest: str, target: str, *, attributes=None, owner: bool = False) -> None:
    """A symbolic link at `dest` (replacing what is there, atomically), with the stored times
    (and owner when asked); a link has no mode of its own on Linux."""
    directory = os.path.dirname(os.path.abspath(dest))
    for attempt in range(100):
        tmp = os.path.join(directory, f".{os.path.basename(dest)}.{os.getpid()}.{attempt}.nokvfs-tmp")
        try:
            os.symlink(target, tmp)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {dest!r}")
    with _installed(tmp, dest):
        if owner and attributes is not None:
            os.lchown(tmp, _id(attributes.uid), _id(attributes.gid))
        if attributes is not None:
            os.utime(tmp, ns=(attributes.atime_ns, attributes.mtime_ns), follow_symlinks=False)


def set_directory(path: str, attributes, *, owner: bool = False) -> None:
    """A directory's stored mode, owner (when asked) and times."""
    if owner:
        os.chown(path, _id(attributes.uid), _id(attributes.gid), follow_symlinks=False)
    os.chmod(path, attributes.mode)
    os.utime(path, ns=(attributes.atime_ns, attributes.mtime_ns), follow_symlinks=False)


def _id(value: int | None) -> int:
    return -1 if value is None else value  # -1: leave it as it is
