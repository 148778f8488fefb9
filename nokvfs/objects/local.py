"""The local-directory object store: the embedded default, and the store the tests run on.

Layout under the root directory::

    .nokv-store                   marker: this directory is a store (format and version)
    .nokv-lock                    flock(2) target serialising every commit step
    .nokv-tmp/.nokv-tmp-<random>  the bytes of a write in progress where they need a name
    .nokv-multipart/<upload_id>/  staging of one multipart upload: upload.json, part-00001, ...
    <key>                         one file per object, at its key path ("a/b/c" -> a/b/c)

Object file format. Each object file is the object's bytes followed by a trailer::

    body | json | u32_be(len(json)) | b"NOKVOBJ1"

where json is ``{"etag":..., "metadata":{...}, "sha256":..., "size":N, "v":1}`` (sorted keys, no
blanks; "sha256" only when the writer gave one). The body starts at offset 0, so a ranged read is
one pread; the etag (`content_etag`: "xxh3-" and the hex XXH3-128 of the body; objects written
before 2026-12-04 carry the hex MD5, which reads and compares the same, since an etag is opaque
to every reader) and the metadata live in the same file as the bytes, so one rename publishes
all three at once and there is no sidecar to fall out of step. A trailer that does not parse,
whose size disagrees with the file, or whose "sha256" is not 64 lowercase hex digits, is
IntegrityError naming the path; keys a reader does not know are ignored.

Vouched reads. "sha256" (written since 2026-12-07) is the SHA-256 the writer had just checked the
bytes it handed over have (`content_sha256`: a publication's block, verified against its plan).
`get_vouched` returns it only after the XXH3-128 of the whole body read back equals the etag this
store computed from the bytes as it wrote them: so the bytes are the ones that SHA-256 was taken
of, and a reader that compares it with the digest it expects need not hash 4 MiB again (XXH3
runs at about 22 GB/s here, SHA-256 at 1.3 GB/s). A different object put in the key's place
carries a different "sha256"; a body changed under its trailer fails the XXH3; either way the
reader falls back to hashing. What that trusts beyond a full SHA-256: that nobody crafted an XXH3
collision inside the store's own directory, where the shard's rows, whose digests name these
objects, are protected by checksums of the same non-cryptographic kind.

Writes. Bytes go to an unnamed temp file (O_TMPFILE in the key's own directory, created for it
if missing; a named one in ``.nokv-tmp/`` where the filesystem has no O_TMPFILE), are fsynced, and
are then committed under the store lock: ``link``
of the unnamed file at the key for `if_none_match` (fails with EEXIST, so creation is atomic even
against a writer that ignores the lock), else a link at a temp name and ``rename`` over the key,
after the etag check for `if_match` (atomic because every commit takes the lock). Missing key
directories are created on the way, and after the commit the key's directory and the parent of
every directory created are fsynced, side by side in helper threads (one journal commit on
ext4, however many levels were new, and the device flushes overlap). A crash at any point
leaves either the old object or the new one at the key -- the bytes are durable before they get
a name -- plus at worst a named temp file that `list`, `get` and `head`
never show, or an empty key directory; an unnamed temp simply vanishes. Why the key's directory:
ext4 allocates a new file's inode in its directory's block group, and one temp directory shared
by every write becomes a group whose inodes GC keeps freeing; measured on this machine kind, an
O_TMPFILE there cost 370-490 us once a few thousand objects had come and gone, against 9-13 us
in fresh key directories (the same loop, interleaved). `put_many` writes several objects with one lock
round and their directories fsynced once. `stage_put` is a put in two halves: the bytes written
and fsynced, then (`StagedPut.commit`) linked at a key.

Temp files. A writer holds an flock(2) on its temp file from creating it until the temp is
published or removed, so a temp nobody holds locked is a crashed writer's. `remove_stale_temp_files`
deletes those (and only those older than a minute, which covers the instant between creating a
temp and locking it); every open of the store sweeps ``.nokv-tmp/``, one directory listing, and
`nokvfs gc` also walks the whole tree for temps an older nokvfs left beside their keys (those,
never locked, go after a day). Calls of this store are local system calls: they have no network
deadline to miss (a hung filesystem hangs them, as it hangs every program using it).

Keys whose components would make an object's path a directory of another object's path (``a`` and
``a/b``) are valid S3 keys but cannot both exist here; the second is StoreError. Deleting an
object prunes directories left empty, under the same lock, and fsyncs the directory where that
ends; `delete_many` does so for many keys with one lock round and each directory fsynced once.
Deleting an absent key prunes its directory too when empty (a write that created it and never
linked its object); `remove_stale_temp_files(everywhere=True)` prunes empty key directories older
than a day that nothing else would.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import xxhash

from nokvfs.errors import (
    AmbiguousResult,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    PreconditionFailed,
    StoreError,
    StoreFull,
)
from nokvfs.filemodes import DIR_MODE, FILE_MODE, makedirs
from nokvfs.objects import removal, zeros
from nokvfs.objects.store import (
    MIN_PART_SIZE,
    ObjectInfo,
    ObjectStore,
    StoreStats,
    check_conditions,
    check_key,
    check_metadata,
    check_part_number,
    check_parts,
    check_prefix,
    check_range,
)
from nokvfs.schema.ids import new_id16

MARKER_NAME = ".nokv-store"
LOCK_NAME = ".nokv-lock"
MULTIPART_DIR = ".nokv-multipart"
TMP_DIR = ".nokv-tmp"
TMP_PREFIX = ".nokv-tmp-"
STALE_TEMP_GRACE = 60.0  # seconds: a temp younger than this may be between creation and its lock
LEGACY_TEMP_AGE = 24 * 3600.0  # temps beside their keys were written without a lock
# The whole-tree walk for what crashes left beside keys (items older than LEGACY_TEMP_AGE) runs
# at most this often per open store: a mount's maintenance collects every few minutes, and on a
# large store a walk is seconds of interpreter time that finds nothing new within the hour.
TREE_WALK_EVERY = 3600.0
RESERVED_PREFIX = ".nokv-"
TRAILER_MAGIC = b"NOKVOBJ1"
TRAILER_VERSION = 1
_TRAILER_FIXED = 4 + len(TRAILER_MAGIC)
_MAX_TRAILER_JSON = 16 * 1024
_MARKER = {"format": "nokvfs-local-object-store", "version": 1}
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_COPY_CHUNK = 1024 * 1024
_MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)
_NO_LINK_ERRNOS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV)


def _store_error(exc: OSError, action: str, path: str) -> StoreError | InvalidInput:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(f"no space left to {action} {path}: {reason}")
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidInput(f"object key is too long for the local filesystem: {path}")
    return StoreError(f"cannot {action} {path}: {reason} (errno {exc.errno})")


@contextlib.contextmanager
def _io(action: str, path: str):
    """Translate OSError into StoreFull / StoreError naming `path`."""
    try:
        yield
    except OSError as exc:
        raise _store_error(exc, action, path) from exc


def _fsync_dir(path: str) -> None:
    with _io("fsync directory", path):
        removal.fsync_dir(path)


def _link_descriptor(fd: int, path: str) -> None:
    """linkat(2) of an O_TMPFILE descriptor at `path` through /proc (AT_SYMLINK_FOLLOW: os.link
    uses linkat, and so follows the magic link, only when a directory descriptor is given)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


_fsync_pool: tuple[int, ThreadPoolExecutor] | None = None


def _start(function, *args) -> Future:
    """Run `function(*args)` (an fsync: it holds the GIL only to start and to end) in a helper
    thread, so the flush overlaps what the caller does next."""
    global _fsync_pool
    if _fsync_pool is None or _fsync_pool[0] != os.getpid():  # not inherited across fork
        _fsync_pool = (os.getpid(), ThreadPoolExecutor(max_workers=8, thread_name_prefix="nokvfs-fsync"))
    return _fsync_pool[1].submit(function, *args)


def _start_fsync_dirs(directories: list[str]) -> list[Future]:
    """fsync each distinct directory once, all at the same time: the flushes of one put's new
    directories overlap instead of queueing one behind the other. `_wait_all` waits for them."""
    return [_start(_fsync_dir, d) for d in dict.fromkeys(directories)]


def _fsync_file(fd: int, shown: str) -> None:
    with _io("write", shown):
        os.fsync(fd)


def _wait_all(futures: list[Future], *, quiet: bool = False) -> None:
    """Wait for every future; then raise the first one's error, if any failed (unless quiet)."""
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None and not quiet:
            raise error


def _fsync_dirs(directories: list[str]) -> None:
    """fsync each distinct directory once (one in this thread, the others beside it)."""
    distinct = list(dict.fromkeys(directories))
    if not distinct:
        return
    others = _start_fsync_dirs(distinct[1:]) if len(distinct) > 1 else []
    try:
        _fsync_dir(distinct[0])
    finally:
        _wait_all(others)


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pread_exact(fd: int, length: int, offset: int, path: str) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise IntegrityError(f"object file {path} ended early")
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _check_sha256(sha256) -> bytes | None:
    if sha256 is not None and not (isinstance(sha256, bytes) and len(sha256) == 32):
        raise InvalidInput(f"content_sha256 must be 32 raw bytes, got {sha256!r}")
    return sha256


def _encode_trailer(etag: str, size: int, metadata: dict[str, str], sha256: bytes | None = None) -> bytes:
    fields = {"etag": etag, "metadata": metadata, "size": size, "v": TRAILER_VERSION}
    if sha256 is not None:
        fields["sha256"] = sha256.hex()
    body = json.dumps(
        fields,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode("ascii")
    return body + struct.pack(">I", len(body)) + TRAILER_MAGIC


class StagedPut:
    """Bytes written and fsync'd by `LocalStore.stage_put`, waiting for a key: `commit` links
    them there (as `put` would, unconditionally); `discard` drops them. Exactly one of the two,
    once."""

    def __init__(
        self, store: "LocalStore", fd: int, tmp: str | None, etag: str, flushing: Future, near=None, created=()
    ):
        self._store, self._fd, self._tmp, self.etag = store, fd, tmp, etag
        self._flushing = flushing  # the temp's fsync
        self._near = near  # the key directory made for the temp, if any
        self._created = list(created)  # directories given new entries for it, not yet fsync'd
        self._settling: list[Future] = []

    def commit(self, key: str, *, wait: bool = True) -> str:
        """Link the bytes at `key`. The object is durable once the directories that changed are
        fsync'd: before this returns, or with `wait=False` once `wait` returns (the caller does
        other work meanwhile, none of which may depend on the object being durable)."""
        if self._fd < 0:
            raise InvalidInput("this staged object was already committed or discarded")
        try:
            final = self._store._path(key)
            self._flushing.result()  # the bytes durable before they get a name
        except BaseException:
            self.discard()
            raise
        fd, self._fd = self._fd, -1
        self._settling = self._store._commit(
            fd, self._tmp, final, key, False, None, wait=wait, near=self._near, created=self._created
        )
        return self.etag

    def wait(self) -> None:
        """Wait until a `commit(wait=False)` is durable; its directory fsync's error, if any."""
        settling, self._settling = self._settling, []
        _wait_all(settling)

    def discard(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _wait_all([self._flushing], quiet=True)  # never close a descriptor being fsynced
            os.close(fd)
            _unlink_quietly(self._tmp)
            self._store._unmake_key_dir(self._near)


class LocalStore(ObjectStore):
    """Objects as files under `root` (see the module docstring for the layout and guarantees).

    With ``create=True`` a missing or empty directory is initialised as a store; a non-empty
    directory without the marker is refused either way, so a mistyped path never scatters
    objects into an unrelated tree.
    """

    def __init__(self, root: str | os.PathLike, *, create: bool = True, unnamed_temps: bool = True):
        root = os.path.abspath(os.fspath(root))
        self.root = root
        self.url = "file://" + root
        self._lock_path = os.path.join(root, LOCK_NAME)
        self._multipart_root = os.path.join(root, MULTIPART_DIR)
        self._tmp_root = os.path.join(root, TMP_DIR)
        self._remover = removal.Remover()  # delete_many's helper process, started when needed
        self._walked_at: float | None = None  # monotonic time of the last whole-tree walk
        # Unnamed (O_TMPFILE) temps where the filesystem has them; `unnamed_temps=False` names
        # every temp, as on a filesystem without them.
        self._tmpfile_ok = unnamed_temps and hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
        self._open_root(create)
        self._remove_multipart_trash()
        self.remove_stale_temp_files()

    # --- opening ------------------------------------------------------------------------------

    def _open_root(self, create: bool) -> None:
        marker = os.path.join(self.root, MARKER_NAME)
        with _io("open object store", self.root):
            try:
                with open(marker, "rb") as f:
                    found = f.read(4096)
            except FileNotFoundError:
                found = None
        if found is not None:
            try:
                parsed = json.loads(found)
            except ValueError:
                parsed = None
            if parsed != _MARKER:
                raise StoreError(f"{marker} is not a nokvfs local store marker of version {_MARKER['version']}")
            return
        if not create:
            raise StoreError(f"{self.root} is not a nokvfs local object store (no {MARKER_NAME})")
        with _io("create object store", self.root):
            makedirs(self.root)
            foreign = [name for name in os.listdir(self.root) if not name.startswith(RESERVED_PREFIX)]
        if foreign:
            raise StoreError(f"refusing to make a non-empty directory an object store: {self.root}")
        data = json.dumps(_MARKER, sort_keys=True).encode() + b"\n"
        tmp = self._write_small_temp(data)
        with _io("create object store marker", marker):
            os.replace(tmp, marker)
        _fsync_dir(self.root)
        _fsync_dir(os.path.dirname(self.root))

    def _remove_multipart_trash(self) -> None:
        # Trash directories were renamed away under the lock; nobody can be using them.
        with contextlib.suppress(OSError):
            for name in os.listdir(self._multipart_root):
                if name.startswith("trash-"):
                    shutil.rmtree(os.path.join(self._multipart_root, name), ignore_errors=True)

    # --- paths and locking --------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    @contextlib.contextmanager
    def _locked(self):
        """The store-wide commit lock: flock(2) on a fresh descriptor, so it excludes other
        threads of this process as well as other processes."""
        with _io("lock object store", self._lock_path):
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            with _io("lock object store", self._lock_path):
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _ensure_dir(self, directory: str, changed: list | None = None) -> None:
        """Create `directory` and missing parents. Each new one is fsynced into its parent, or,
        given `changed`, its parent is appended there for the caller to fsync once at the end."""
        if directory == self.root or os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        self._ensure_dir(parent, changed)
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise StoreError(f"an object already exists where a key directory is needed: {directory}") from None
            return
        except NotADirectoryError:
            raise StoreError(f"an object already exists where a key directory is needed: {parent}") from None
        except OSError as exc:
            raise _store_error(exc, "create directory", directory) from exc
        if changed is None:
            _fsync_dir(parent)
        else:
            changed.append(parent)

    def _create_temp(self, *, named: bool = False, near: str | None = None) -> tuple[int, str | None]:
        """A new temp file, locked (flock) by this writer for as long as the returned descriptor
        is open: unnamed (path None) in directory `near` (else the temp directory) unless `named`
        or the filesystem has no O_TMPFILE; a named one in the temp directory."""
        self._ensure_dir(self._tmp_root)
        if not named and self._tmpfile_ok:
            try:
                fd = self._open_unnamed(near)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    raise _store_error(exc, "create temp file in", near or self._tmp_root) from exc
                self._tmpfile_ok = False
            else:
                # Locked like a named temp: linked at a temp name later, it must not look abandoned.
                fcntl.flock(fd, fcntl.LOCK_EX)
                return fd, None
        path = os.path.join(self._tmp_root, TMP_PREFIX + os.urandom(8).hex())
        with _io("create temp file in", self._tmp_root):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            with _io("lock temp file", path):
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        return fd, path

    def _open_unnamed(self, near: str | None) -> int:
        flags = os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC
        if near is not None:
            try:
                return os.open(near, flags, FILE_MODE)
            except (FileNotFoundError, NotADirectoryError):
                pass  # pruned by a delete meanwhile: the temp directory serves, the link recreates it
        return os.open(self._tmp_root, flags, FILE_MODE)

    def _prepare_key_dir(self, final: str) -> tuple[str | None, list[str]]:
        """Create the directory of the object path `final` ahead of its write, so the write's
        temp can be born there (see the module docstring): (that directory, or None when temps
        are named, the directories whose new entries the commit must fsync)."""
        if not self._tmpfile_ok:
            return None, []
        changed: list[str] = []
        directory = os.path.dirname(final)
        self._ensure_dir(directory, changed)
        return directory, changed

    def _unmake_key_dir(self, directory: str | None) -> None:
        """After a write that made `directory` for its temp failed: remove it and the parents
        that leaves empty (under the lock, as a delete prunes), best effort."""
        if directory is None:
            return
        with contextlib.suppress(OSError), self._locked():
            while directory != self.root:
                os.rmdir(directory)  # refused unless empty: ends the walk
                directory = os.path.dirname(directory)

    def _write_small_temp(self, data: bytes) -> str:
        fd, path = self._create_temp(named=True)
        try:
            with _io("write", path):
                _write_all(fd, data)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        os.close(fd)
        return path

    def _write_temp(
        self,
        chunks: Iterable[bytes],
        metadata: dict[str, str],
        *,
        named: bool = False,
        sync: bool = True,
        near: str | None = None,
        sha256: bytes | None = None,
    ) -> tuple[int, str | None, str, int]:
        """Write body chunks and the trailer to a fsynced temp file (unnamed ones in `near`, the
        key directory `_prepare_key_dir` made for this write, removed again if the write fails):
        (fd, path or None when unnamed, etag, size). The descriptor stays open, holding the
        temp's lock, until the caller commits or drops it. `sync=False` leaves the fsync to the
        caller. `sha256`: the writer's `content_sha256`, kept in the trailer."""
        fd, path = self._create_temp(named=named, near=near)
        try:
            tag = _ContentTag()
            size = 0
            with _io("write", path or f"a temp file in {self._tmp_root}"):
                for chunk in chunks:
                    tag.update(chunk)
                    size += len(chunk)
                    if zeros.is_zero(chunk):
                        os.lseek(fd, len(chunk), os.SEEK_CUR)  # a hole: reads back as these zeros
                    else:
                        _write_all(fd, chunk)
                etag = tag.etag()
                _write_all(fd, _encode_trailer(etag, size, metadata, sha256))
                if sync:
                    os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            self._unmake_key_dir(near)
            raise
        return fd, path, etag, size

    def _commit(
        self,
        fd: int,
        tmp: str | None,
        final: str,
        key: str,
        if_none_match: bool,
        if_match: str | None,
        *,
        wait=True,
        near: str | None = None,
        created: list[str] = (),
    ) -> list[Future]:
        """Publish the temp at `final` under the lock, honouring the write condition, then fsync
        the directories that changed (with `created`, those `_prepare_key_dir` gave new entries);
        the temp's descriptor (and lock) is released last. With `wait=False` the directory fsyncs
        are left running: the caller waits (`_wait_all`). A commit that fails (a refused
        condition too) removes `near`, the key directory made for the write, if it is empty."""
        changed: list[str] = list(created)
        try:
            with self._locked():
                tmp = self._link_locked(fd, tmp, final, key, if_none_match, if_match, changed)
            if not wait:
                return _start_fsync_dirs([os.path.dirname(final)] + changed)
            _fsync_dirs([os.path.dirname(final)] + changed)
            return []
        except BaseException:
            self._unmake_key_dir(near)
            raise
        finally:
            _unlink_quietly(tmp)
            os.close(fd)

    def _link_locked(
        self, fd: int, tmp: str | None, final: str, key: str, if_none_match: bool, if_match: str | None, changed: list
    ) -> str | None:
        """The commit step of one write (the caller holds the lock); returns the temp name still
        to remove, if any. Directories whose entries changed are appended to `changed`."""
        self._ensure_dir(os.path.dirname(final), changed)
        if if_none_match:
            if tmp is None:
                self._link_unnamed(fd, final, key)
                return None
            self._link_new(tmp, final, key)
            return tmp
        if if_match is not None:
            current = self._info_at(final, key)
            if current is None:
                raise PreconditionFailed(f"if_match {if_match}: object {key} is absent")
            if current.etag != if_match:
                raise PreconditionFailed(f"if_match {if_match}: object {key} has etag {current.etag}")
        if os.path.isdir(final):
            raise StoreError(f"a key directory already exists where object {key} belongs: {final}")
        if tmp is None:
            if if_match is None and not os.path.lexists(final):
                # Nothing to replace (and the lock keeps it so): the unnamed file goes straight
                # to its key.
                self._link_unnamed(fd, final, key)
                return None
            tmp = os.path.join(self._tmp_root, TMP_PREFIX + os.urandom(8).hex())
            with _io("name temp file", tmp):
                _link_descriptor(fd, tmp)
            changed.append(self._tmp_root)
        with _io("rename into", final):
            os.replace(tmp, final)
        return None

    def _link_unnamed(self, fd: int, final: str, key: str) -> None:
        try:
            _link_descriptor(fd, final)
        except FileExistsError:
            if os.path.isdir(final):
                raise StoreError(f"a key directory already exists where object {key} belongs: {final}") from None
            raise PreconditionFailed(f"if_none_match: object {key} already exists") from None
        except OSError as exc:
            raise _store_error(exc, "link into", final) from exc

    def _link_new(self, tmp: str, final: str, key: str) -> None:
        try:
            os.link(tmp, final, follow_symlinks=False)
        except FileExistsError:
            if os.path.isdir(final):
                raise StoreError(f"a key directory already exists where object {key} belongs: {final}") from None
            raise PreconditionFailed(f"if_none_match: object {key} already exists") from None
        except OSError as exc:
            if exc.errno not in _NO_LINK_ERRNOS:
                raise _store_error(exc, "link into", final) from exc
            # No hard links on this filesystem: the lock we hold makes check-then-rename atomic
            # against every LocalStore writer.
            if os.path.lexists(final):
                raise PreconditionFailed(f"if_none_match: object {key} already exists") from None
            with _io("rename into", final):
                os.replace(tmp, final)
            return
        with _io("remove temp file", tmp):
            os.unlink(tmp)

    # --- reading ------------------------------------------------------------------------------

    def _open_object(self, path: str) -> int | None:
        """A read descriptor on the object file at `path`, or None if there is no object."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS or exc.errno == errno.ELOOP:
                return None
            raise _store_error(exc, "open", path) from exc
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            os.close(fd)
            raise _store_error(exc, "stat", path) from exc
        if not stat.S_ISREG(mode):
            os.close(fd)
            return None
        return fd

    def _read_trailer(self, fd: int, path: str, key: str) -> ObjectInfo:
        return self._read_trailer_fields(fd, path, key)[0]

    def _read_trailer_fields(self, fd: int, path: str, key: str) -> tuple[ObjectInfo, bytes | None]:
        """The object's info and the writer's SHA-256 from its trailer (None if it has none)."""
        with _io("read", path):
            file_size = os.fstat(fd).st_size
            if file_size < _TRAILER_FIXED:
                raise IntegrityError(f"object file {path} is too short to hold its trailer")
            tail_len = min(file_size, _TRAILER_FIXED + _MAX_TRAILER_JSON)
            tail = _pread_exact(fd, tail_len, file_size - tail_len, path)
        if tail[-len(TRAILER_MAGIC) :] != TRAILER_MAGIC:
            raise IntegrityError(f"object file {path} has no nokvfs trailer")
        (json_len,) = struct.unpack(">I", tail[-_TRAILER_FIXED : -len(TRAILER_MAGIC)])
        if json_len > tail_len - _TRAILER_FIXED:
            raise IntegrityError(f"object file {path} has a trailer longer than the file")
        try:
            fields = json.loads(tail[-_TRAILER_FIXED - json_len : -_TRAILER_FIXED])
            etag, size, metadata, version = fields["etag"], fields["size"], fields["metadata"], fields["v"]
            sha256 = None
            if "sha256" in fields:
                if not isinstance(fields["sha256"], str) or not _SHA256_HEX.fullmatch(fields["sha256"]):
                    raise ValueError(fields["sha256"])
                sha256 = bytes.fromhex(fields["sha256"])
        except (ValueError, KeyError, TypeError):
            raise IntegrityError(f"object file {path} has a malformed trailer") from None
        if (
            version != TRAILER_VERSION
            or not isinstance(etag, str)
            or not isinstance(size, int)
            or not isinstance(metadata, dict)
            or size != file_size - json_len - _TRAILER_FIXED
        ):
            raise IntegrityError(f"object file {path} has a trailer that disagrees with the file")
        return ObjectInfo(key=key, size=size, etag=etag, metadata=metadata), sha256

    def _info_at(self, path: str, key: str) -> ObjectInfo | None:
        fd = self._open_object(path)
        if fd is None:
            return None
        try:
            return self._read_trailer(fd, path, key)
        finally:
            os.close(fd)

    # --- the interface ------------------------------------------------------------------------

    def put(self, key, data, *, if_none_match=False, if_match=None, metadata=None, content_sha256=None) -> str:
        final = self._path(key)
        check_conditions(if_none_match, if_match)
        metadata = check_metadata(metadata)
        sha256 = _check_sha256(content_sha256)
        data = _byte_view(data)
        near, created = self._prepare_key_dir(final)
        fd, tmp, etag, _ = self._write_temp([data], metadata, near=near, sha256=sha256)
        self._commit(fd, tmp, final, key, if_none_match, if_match, near=near, created=created)
        return etag

    def stage_put(self, data, *, metadata=None, key_hint: str | None = None, content_sha256=None) -> StagedPut:
        """The first half of `put`: the bytes in a temp file that no key names yet (unnamed where
        the filesystem allows), its fsync started in a helper thread; this returns once the bytes
        are written. `StagedPut.commit(key)` is the second half (it waits for the fsync before
        the link: the bytes are durable before they get a name); a crash in between leaves
        nothing behind (an unnamed temp vanishes, a named one is swept as stale). A publish
        stages its object this way, then commits its ledger while the fsync runs, then links.
        `key_hint`, the key the bytes are meant for, puts the temp in that key's directory (any
        key may still be given to `commit`). `data` is bytes-like, or a list of bytes-like pieces
        that are the object's bytes in order (written as they are, not joined first);
        `content_sha256` as for `put`."""
        metadata = check_metadata(metadata)
        sha256 = _check_sha256(content_sha256)
        chunks = [_byte_view(piece) for piece in data] if isinstance(data, list) else [_byte_view(data)]
        near, created = self._prepare_key_dir(self._path(key_hint)) if key_hint is not None else (None, [])
        fd, tmp, etag, _ = self._write_temp(chunks, metadata, sync=False, near=near, sha256=sha256)
        flushing = _start(_fsync_file, fd, tmp or f"a temp file in {near or self._tmp_root}")
        return StagedPut(self, fd, tmp, etag, flushing, near, created)

    def put_file(self, key, path, *, if_none_match=False, if_match=None, metadata=None, on_multipart=None) -> str:
        # One streamed pass whatever the size: the local store never needs parts, so
        # `on_multipart` is never called.
        final = self._path(key)
        check_conditions(if_none_match, if_match)
        metadata = check_metadata(metadata)
        source = os.fspath(path)
        with _io("open source file", source):
            f = open(source, "rb")
        with f:
            near, created = self._prepare_key_dir(final)
            fd, tmp, etag, _ = self._write_temp(_chunks(f, source), metadata, near=near)
        self._commit(fd, tmp, final, key, if_none_match, if_match, near=near, created=created)
        return etag

    def put_many(self, items, *, if_none_match=False, metadata=None, on_stored=None, content_sha256s=None) -> list:
        """Store several objects: every body written and fsynced first, then all linked under one
        lock round, then each changed directory fsynced once. Returns, per (key, data) item, its
        etag or the exception that refused it (the others are stored regardless); `on_stored`
        hears of each stored item at the end, when they all become durable together."""
        metadata = check_metadata(metadata)
        written, results = [], []
        changed: list[str] = []  # directories whose new entries must be fsynced
        try:
            for index, (key, data) in enumerate(items):
                try:
                    final = self._path(key)
                    data = _byte_view(data)
                    sha256 = None if content_sha256s is None else _check_sha256(content_sha256s[index])
                    near, created = self._prepare_key_dir(final)
                    fd, tmp, etag, _ = self._write_temp([data], metadata, near=near, sha256=sha256)
                except Exception as exc:  # noqa: BLE001 - reported per item
                    results.append(exc)
                    continue
                changed += created
                written.append((len(results), key, final, fd, tmp))
                results.append(etag)
            with self._locked():
                for position, key, final, fd, tmp in written:
                    try:
                        left = self._link_locked(fd, tmp, final, key, if_none_match, None, changed)
                        changed.append(os.path.dirname(final))
                    except Exception as exc:  # noqa: BLE001 - reported per item
                        results[position] = exc
                        left = tmp
                    _unlink_quietly(left)
            _fsync_dirs(changed)
        finally:
            for _, _, _, fd, _ in written:
                os.close(fd)
        if on_stored is not None:
            for index, result in enumerate(results):
                if not isinstance(result, Exception):
                    on_stored(index)
        return results

    def get(self, key, start=0, length=None) -> bytes:
        path = self._path(key)
        check_range(start, length)
        fd = self._open_object(path)
        if fd is None:
            raise ObjectMissing(f"object {key} is absent from {self.url}")
        try:
            size = self._read_trailer(fd, path, key).size
            if start > size:
                raise InvalidInput(f"range start {start} is beyond the end of {key} ({size} bytes)")
            end = size if length is None else min(size, start + length)
            with _io("read", path):
                return _pread_exact(fd, end - start, start, path)
        finally:
            os.close(fd)

    def get_vouched(self, key, length) -> tuple[bytes, bytes | None]:
        """See ObjectStore.get_vouched and the module docstring ("Vouched reads")."""
        path = self._path(key)
        check_range(0, length)
        fd = self._open_object(path)
        if fd is None:
            raise ObjectMissing(f"object {key} is absent from {self.url}")
        try:
            info, sha256 = self._read_trailer_fields(fd, path, key)
            end = min(info.size, length)
            with _io("read", path):
                data = _pread_exact(fd, end, 0, path)
        finally:
            os.close(fd)
        if sha256 is None or end != info.size or content_etag(data) != info.etag:
            return data, None
        return data, sha256

    def head(self, key) -> ObjectInfo | None:
        return self._info_at(self._path(key), key)

    def delete(self, key) -> None:
        (failure,) = self.delete_many([key])
        if failure is not None:
            raise failure

    def delete_many(self, keys) -> list:
        """Remove several objects under one lock round: every file unlinked, the directories
        that leaves empty pruned, then each directory that changed fsynced once (so a key is
        answered None only once its removal is durable). Per key, None or the exception that
        kept it. Many keys are removed by a helper process (nokvfs.objects.removal says why);
        an answer it lost is AmbiguousResult for each of its keys."""
        results: list = []
        paths = []
        for key in keys:
            try:
                paths.append((len(results), self._path(key)))
                results.append(None)
            except InvalidInput as exc:
                results.append(exc)
        if not paths:
            return results
        with self._locked():
            try:
                removed, _ = self._remover.remove(self.root, [final for _, final in paths])
            except removal.HelperLost as exc:
                removed = [("delete", final, None, str(exc)) for _, final in paths]
        for (position, _), failure in zip(paths, removed, strict=True):
            if failure is not None:
                action, path, number, reason = failure
                if number is None:
                    results[position] = AmbiguousResult(f"cannot {action} {path}: {reason}")
                else:
                    results[position] = _store_error(OSError(number, reason), action, path)
        return results

    def list(self, prefix="") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        base = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        start_dir = os.path.join(self.root, *base.split("/")[:-1]) if base else self.root
        return self._walk(start_dir, base, prefix)

    def _walk(self, directory: str, dir_key: str, prefix: str) -> Iterator[ObjectInfo]:
        try:
            with os.scandir(directory) as it:
                entries = []
                for entry in it:
                    if entry.name.startswith(RESERVED_PREFIX):
                        continue
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if not is_dir and not entry.is_file(follow_symlinks=False):
                        continue
                    entries.append((entry.name + "/" if is_dir else entry.name, entry.path, is_dir))
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS:
                return
            raise _store_error(exc, "list", directory) from exc
        # Sorting a directory as "name/" yields keys in exact byte order, as S3 lists them.
        for sort_name, path, is_dir in sorted(entries):
            key = dir_key + sort_name
            if is_dir:
                if key.startswith(prefix) or prefix.startswith(key):
                    yield from self._walk(path, key, prefix)
            elif key.startswith(prefix):
                info = self._info_at(path, key)
                if info is not None:
                    yield ObjectInfo(key=key, size=info.size, etag=info.etag)

    def statfs(self) -> StoreStats:
        """Figures of the filesystem holding the store (as df(1) reports them)."""
        with _io("statfs", self.root):
            st = os.statvfs(self.root)
        return StoreStats(
            total_bytes=st.f_blocks * st.f_frsize,
            free_bytes=st.f_bavail * st.f_frsize,
            used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        )

    # --- multipart ----------------------------------------------------------------------------

    def _upload_dir(self, upload_id: str) -> str:
        if not isinstance(upload_id, str) or not _UPLOAD_ID.fullmatch(upload_id):
            raise ObjectMissing(f"no multipart upload {upload_id!r} in {self.url}")
        return os.path.join(self._multipart_root, upload_id)

    def _load_upload(self, key: str, upload_id: str) -> tuple[str, dict[str, str]]:
        directory = self._upload_dir(upload_id)
        manifest = os.path.join(directory, "upload.json")
        try:
            with open(manifest, "rb") as f:
                fields = json.loads(f.read())
        except OSError as exc:
            if exc.errno in _MISSING_ERRNOS:
                raise ObjectMissing(f"no multipart upload {upload_id} in {self.url}") from None
            raise _store_error(exc, "read", manifest) from exc
        except ValueError:
            raise IntegrityError(f"multipart manifest {manifest} is malformed") from None
        if fields.get("key") != key:
            raise ObjectMissing(f"multipart upload {upload_id} is not an upload to {key}")
        return directory, fields.get("metadata") or {}

    def create_multipart(self, key, *, metadata=None) -> str:
        check_key(key)
        metadata = check_metadata(metadata)
        upload_id = new_id16().hex()
        directory = os.path.join(self._multipart_root, upload_id)
        self._ensure_dir(self._multipart_root)
        with _io("create multipart staging", directory):
            os.mkdir(directory, DIR_MODE)
        data = json.dumps({"key": key, "metadata": metadata}, sort_keys=True).encode()
        tmp = self._write_small_temp(data)
        with _io("create multipart manifest in", directory):
            os.replace(tmp, os.path.join(directory, "upload.json"))
        _fsync_dir(directory)
        _fsync_dir(self._multipart_root)
        return upload_id

    def upload_part(self, key, upload_id, part_number, data) -> str:
        check_key(key)
        check_part_number(part_number)
        data = _byte_view(data)
        directory, _ = self._load_upload(key, upload_id)
        part = os.path.join(directory, f"part-{part_number:05d}")
        tmp = os.path.join(directory, TMP_PREFIX + os.urandom(8).hex())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except FileNotFoundError:
            raise ObjectMissing(f"multipart upload {upload_id} was aborted") from None
        except OSError as exc:
            raise _store_error(exc, "write part in", directory) from exc
        try:
            try:
                with _io("write", part):
                    _write_all(fd, data)
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.replace(tmp, part)
            except FileNotFoundError:
                raise ObjectMissing(f"multipart upload {upload_id} was aborted") from None
            except OSError as exc:
                raise _store_error(exc, "write part", part) from exc
        finally:
            _unlink_quietly(tmp)
        _fsync_dir(directory)
        return content_etag(data)

    def complete_multipart(self, key, upload_id, parts, *, if_none_match=False) -> str:
        final = self._path(key)
        parts = check_parts(parts)
        directory, metadata = self._load_upload(key, upload_id)
        paths = []
        for position, (part_number, _) in enumerate(parts):
            part = os.path.join(directory, f"part-{part_number:05d}")
            try:
                size = os.stat(part).st_size
            except FileNotFoundError:
                raise InvalidInput(f"part {part_number} of upload {upload_id} was never uploaded") from None
            except OSError as exc:
                raise _store_error(exc, "stat", part) from exc
            if size < MIN_PART_SIZE and position != len(parts) - 1:
                raise InvalidInput(f"part {part_number} is {size} bytes; all but the last must be >= {MIN_PART_SIZE}")
            paths.append(part)
        fd, tmp, etag, _ = self._write_temp(_verified_parts(parts, paths), metadata)
        try:
            with self._locked():
                # Abort renames the staging away under this lock, so complete and abort are
                # mutually exclusive: exactly one of them takes effect.
                if not os.path.exists(os.path.join(directory, "upload.json")):
                    raise ObjectMissing(f"multipart upload {upload_id} was aborted")
                changed: list[str] = []
                tmp = self._link_locked(fd, tmp, final, key, if_none_match, None, changed)
                _fsync_dirs([os.path.dirname(final)] + changed)
                trash = self._trash_upload(directory)
        finally:
            _unlink_quietly(tmp)
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        return etag

    def abort_multipart(self, key, upload_id) -> None:
        check_key(key)
        try:
            directory, _ = self._load_upload(key, upload_id)
        except ObjectMissing:
            return
        with self._locked():
            if not os.path.exists(directory):
                return
            trash = self._trash_upload(directory)
        shutil.rmtree(trash, ignore_errors=True)

    def multipart_uploads(self, key) -> list[str]:
        check_key(key)
        try:
            names = sorted(os.listdir(self._multipart_root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _store_error(exc, "list", self._multipart_root) from exc
        found = []
        for name in names:
            if not _UPLOAD_ID.fullmatch(name):
                continue  # trash of a finished or aborted upload
            try:
                self._load_upload(key, name)
            except ObjectMissing:
                continue
            found.append(name)
        return found

    def _trash_upload(self, directory: str) -> str:
        trash = os.path.join(self._multipart_root, f"trash-{os.path.basename(directory)}-{os.urandom(4).hex()}")
        with _io("retire multipart staging", directory):
            os.rename(directory, trash)
        _fsync_dir(self._multipart_root)
        return trash

    # --- maintenance --------------------------------------------------------------------------

    def remove_stale_temp_files(
        self,
        *,
        everywhere: bool = False,
        grace_seconds: float = STALE_TEMP_GRACE,
        legacy_age_seconds: float = LEGACY_TEMP_AGE,
    ) -> int:
        """Delete the temp files of writers that are gone; return how many. A temp in the temp
        directory goes when no writer holds its lock and it is older than `grace_seconds`. With
        `everywhere`, the whole tree is walked too (at most once per TREE_WALK_EVERY), for temps
        an older nokvfs wrote beside their keys without a lock, and for key directories left empty
        (a write that made one for its temp and never linked its object): those go once older
        than `legacy_age_seconds`."""
        removed = 0
        now = time.time()
        try:
            names = os.listdir(self._tmp_root)
        except FileNotFoundError:
            names = []
        except OSError as exc:
            raise _store_error(exc, "list", self._tmp_root) from exc
        for name in names:
            if name.startswith(TMP_PREFIX):
                removed += _remove_if_abandoned(os.path.join(self._tmp_root, name), now - grace_seconds)
        if not everywhere or (self._walked_at is not None and time.monotonic() - self._walked_at < TREE_WALK_EVERY):
            return removed
        self._walked_at = time.monotonic()
        cutoff = now - legacy_age_seconds
        directories = []
        for directory, dirs, files in os.walk(self.root):
            if directory == self.root:
                dirs[:] = [d for d in dirs if not d.startswith(RESERVED_PREFIX)]
            elif not files:
                with contextlib.suppress(OSError):
                    directories.append((directory, os.lstat(directory).st_mtime, list(dirs)))
            for name in files:
                if name.startswith(TMP_PREFIX):
                    path = os.path.join(directory, name)
                    with contextlib.suppress(OSError):
                        if os.lstat(path).st_mtime < cutoff:
                            os.unlink(path)
                            removed += 1
        self._prune_old_empty_dirs(reversed(directories), cutoff)
        return removed

    def _prune_old_empty_dirs(self, directories, cutoff: float) -> None:
        """rmdir those of `directories` ((path, mtime, subdirectory names) of each directory the
        walk found holding no file, children before parents) that were older than `cutoff` and
        hold nothing once their empty children are gone. Under the lock: a writer links its
        object only under the lock, after making sure its key's directory exists."""
        pruned: set[str] = set()
        for directory, mtime, subdirs in directories:
            if mtime >= cutoff or any(os.path.join(directory, name) not in pruned for name in subdirs):
                continue
            with contextlib.suppress(OSError), self._locked():
                os.rmdir(directory)  # refused unless empty
                pruned.add(directory)

    def close(self) -> None:
        """Let the removal helper process, if one was started, exit."""
        self._remover.close()

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"


def _chunks(f, path: str) -> Iterator[bytes]:
    while True:
        with _io("read source file", path):
            chunk = f.read(_COPY_CHUNK)
        if not chunk:
            return
        yield chunk


def _verified_parts(parts: list[tuple[int, str]], paths: list[str]) -> Iterator[bytes]:
    """The bytes of each part in order, checking each against the etag the caller recorded."""
    for (part_number, etag), path in zip(parts, paths):
        # A part uploaded before content_etag has an MD5 etag: checked the way it was made.
        tag = _ContentTag() if etag.startswith(ETAG_PREFIX) else _LegacyTag()
        with _io("read part", path):
            f = open(path, "rb")
        with f:
            for chunk in _chunks(f, path):
                tag.update(chunk)
                yield chunk
        if tag.etag() != etag:
            raise InvalidInput(f"part {part_number} has etag {tag.etag()}, not the recorded {etag}")


def _remove_if_abandoned(path: str, cutoff: float) -> int:
    """Unlink the temp at `path` if it is older than `cutoff` and no writer holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return 0  # published or removed meanwhile
    try:
        if os.fstat(fd).st_mtime >= cutoff:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # a live writer holds it
        try:
            os.unlink(path)
        except OSError:
            return 0
        return 1
    finally:
        os.close(fd)


ETAG_PREFIX = "xxh3-"


class _ContentTag:
    """The etag of bytes fed in order: "xxh3-" and their hex XXH3-128. An etag only has to change
    when the bytes do (If-Match compares it as an opaque string); MD5, as S3 uses, cost 3.3 ms per
    MiB on this machine kind against 0.13 ms, and was most of the CPU a large write spent storing
    its blocks."""

    def __init__(self):
        self._hash = xxhash.xxh3_128()

    def update(self, chunk) -> None:
        self._hash.update(chunk)

    def etag(self) -> str:
        return ETAG_PREFIX + self._hash.hexdigest()


class _LegacyTag:
    """The etag objects and parts were given before content_etag: the hex MD5 of the bytes."""

    def __init__(self):
        self._hash = hashlib.md5(usedforsecurity=False)

    def update(self, chunk) -> None:
        self._hash.update(chunk)

    def etag(self) -> str:
        return self._hash.hexdigest()


def content_etag(data) -> str:
    """The etag the local store gives an object (or a part) holding exactly `data`."""
    tag = _ContentTag()
    tag.update(data)
    return tag.etag()


def _byte_view(data) -> memoryview:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInput(f"object data must be bytes, got {type(data).__name__}")
    return memoryview(data).cast("B")


def _unlink_quietly(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
