"""Spools: the one write state of a file in a mount, and the kept spools an operator acts on.

Every descriptor of a file in one mount shares one Spool (POSIX coherence within the mount: a read
through any descriptor sees what any other wrote). A spool is a local file under
`<data dir>/spool/mount/` and a JSON sidecar beside it, written when the spool is created and
rewritten whenever what it describes changes (its path, the revision it expects, its state), so a
daemon killed at any moment leaves every spool described. A live spool is flock'ed by its daemon;
a spool nobody holds is *kept*: its bytes were not published (a lost race, a full or failing
store, a daemon that ended) and `nokvfs spool list|retry|discard` shows, republishes or drops it.
A daemon that ended leaves two kinds that hold nothing to keep, and the next mount removes them:
an *orphaned* spool (its file was removed or renamed over while open: POSIX lets its bytes go)
and one whose sidecar says it was not `dirty` (opened and never changed, or published since).

What the spool file holds:

* a new file (create) or O_TRUNC: its whole body (`filled`);
* an existing file opened without O_TRUNC: nothing until the first write, read of the spool or
  size change; then the current body is copied in first, so every byte nobody overwrote is the
  published one;
* an existing file opened with O_APPEND: only the appended bytes, while every write lands at the
  end (`append_only`); publication then goes through the Append pipeline, reusing the base's
  blocks. Any other write turns it into a filled spool.

The expectation of a publication is the exact revision this mount last saw at the path (or its
absence), updated after each of the mount's own publications: the mount never conflicts with
itself, and a conflict means something outside this mount changed the path.

A spool file exists exactly while it may hold unpublished bytes: when the last writer's close
publishes it, the file and its sidecar are removed at once (nothing is rewritten first), and a
later write through a descriptor still open makes a new one, filled from the published revision.

Where a spool lives. Creating two files (the spool and its sidecar) on the data directory's disk
for every small file made each following flush commit them too: on ext4 a write-back close's
journal fdatasync took 2.9-3.2 ms instead of 0.4-0.7 ms. So a spool of at most MEMORY_SPOOL_MAX
bytes lives in a memory-backed directory (tmpfs: /dev/shm, or NOKVFS_MEMORY_SPOOL_DIR; "" turns
it off), private to this user and data directory (`memory_spool_dir`), and moves to
`<data dir>/spool/mount/` (same name, sidecar rewritten) before it outgrows that, before it must
be durable (a write-back acceptance that cannot carry its bytes in the journal), and when it is
kept. A memory spool survives its daemon (the next mount adopts it as kept, on disk) but not a
reboot: like a local disk's page cache, it holds only bytes nobody was told are durable (a
write-back acceptance carries them in its journal record). Every process counts what its memory
spools hold and sends new ones to disk beyond MEMORY_SPOOL_BUDGET.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import stat
import time

import trio

from nokvfs import filemodes
from nokvfs.errors import InvalidInput, NotFound, StoreError, StoreFull
from nokvfs.fs import writebehind
from nokvfs.schema.ids import new_id16
from nokvfs.workspace import append as appends
from nokvfs.workspace import body as bodies
from nokvfs.workspace import namespace, prestage, reading

log = logging.getLogger(__name__)

SPOOL_SUBDIR = "mount"
SIDECAR_FORMAT = 1
ATTRIBUTE_FIELDS = ("mode", "uid", "gid", "mtime_ns", "atime_ns", "ctime_ns")
_COPY_CHUNK = 4 * 1024 * 1024
# The clock the kernel stamps a local file's times with (CLOCK_REALTIME_COARSE: its tick, a few
# milliseconds), which the time module does not name.
_COARSE_CLOCK = getattr(time, "CLOCK_REALTIME_COARSE", 5)

LIVE = "live"  # held by a running daemon (its flock proves it)
KEPT = "kept"  # not published; nobody holds it
PENDING = "pending"  # accepted by a write-back mount (durable here), not published yet: replayed at the next mount
# Held by a running daemon after its file was removed or renamed over in that mount: its bytes go
# with the last descriptor, and with the daemon if it ends first (the next mount removes it).
ORPHANED = "orphaned"


def spool_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "spool", SPOOL_SUBDIR)


MEMORY_SPOOL_ENV = "NOKVFS_MEMORY_SPOOL_DIR"
MEMORY_SPOOL_ROOT = "/dev/shm"
# = the write-back journal's inline limit (nokvfs.fs.writeback.INLINE_MAX): an accepted memory
# spool's bytes are always in the journal record.
MEMORY_SPOOL_MAX = 256 * 1024
MEMORY_SPOOL_BUDGET = 256 * 1024 * 1024
_memory_dirs: dict[str, str | None] = {}
_memory_held = 0  # bytes this process's memory spools hold (what they were charged)


def _memory_root() -> str | None:
    root = os.environ.get(MEMORY_SPOOL_ENV, MEMORY_SPOOL_ROOT)
    if not root or not _on_memory_fs(root):
        return None
    return root


@functools.lru_cache(maxsize=8)
def _on_memory_fs(path: str) -> bool:
    """Whether `path` is on a tmpfs or ramfs (the mount whose point is its longest prefix);
    remembered, as the mount table is read once per path (scans and restores ask often)."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    best, kind = "", None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) != 2:
            continue
        point = fields[0].split()[4].encode().decode("unicode_escape")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fields[1].split()[0]
    return kind in ("tmpfs", "ramfs")


def memory_spool_path(data_dir: str) -> str | None:
    """Where the data directory's memory spools live (this user's, one directory per data
    directory), or None when there is no memory-backed file system to put them on."""
    root = _memory_root()
    if root is None:
        return None
    tag = hashlib.blake2b(os.path.realpath(data_dir).encode(), digest_size=8).hexdigest()
    return os.path.join(root, f"nokvfs-{os.geteuid()}-{tag}", SPOOL_SUBDIR)


def memory_spool_dir(data_dir: str) -> str | None:
    """`memory_spool_path`, made if missing, when it is a directory only this user can enter
    (anything else there, e.g. made by another user in the shared /dev/shm: None, and spools
    stay on disk)."""
    if data_dir in _memory_dirs:
        return _memory_dirs[data_dir]
    path = memory_spool_path(data_dir)
    if path is not None:
        parent = os.path.dirname(path)
        try:
            os.mkdir(parent, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            log.warning("memory spools off: cannot make %s: %s", parent, exc)
            path = None
        if path is not None and not _private_directory(parent):
            log.warning("memory spools off: %s is not a directory private to uid %d", parent, os.geteuid())
            path = None
        if path is not None:
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                log.warning("memory spools off: cannot make %s: %s", path, exc)
                path = None
    _memory_dirs[data_dir] = path
    return path


def _private_directory(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def remove_memory_dir(data_dir: str) -> None:
    """At a daemon's end: remove the data directory's memory spool directory if nothing is left
    in it (a spool a killed daemon left waits there for the next mount)."""
    path = memory_spool_path(data_dir)
    _memory_dirs.pop(data_dir, None)
    if path is None:
        return
    for directory in (path, os.path.dirname(path)):
        try:
            os.rmdir(directory)
        except OSError:
            return


def forget_memory_copy(data_dir: str, name: str) -> None:
    """Remove the memory spool `name` (and its sidecar): its bytes were restored elsewhere."""
    path = memory_spool_path(data_dir)
    if path is None:
        return
    for victim in (os.path.join(path, name), os.path.join(path, name + ".json")):
        try:
            os.unlink(victim)
        except FileNotFoundError:
            pass


def modified_ns(mtime_ns: int, shown: bool) -> int:
    """The mtime of a file modified now whose mtime was `mtime_ns`: kept while the clock's tick
    has not moved past it and no stat(2) has shown it since, otherwise the time now. This is the
    rule of the kernel's multigrain timestamps on a local file system (a local file's times
    advance by ticks unless a stat(2) saw the last one). Here it also keeps the kernel's pages:
    the kernel drops the pages a file was written with when a stat(2) answers with an mtime it
    did not know (FUSE auto_inval_data, which pyfuse3 always asks for), so a file created and
    written within one tick is read back from them rather than from the daemon."""
    now = time.time_ns()
    if shown or time.clock_gettime_ns(_COARSE_CLOCK) > mtime_ns or mtime_ns > now:
        return now
    return mtime_ns


def _storage_error(what: str, exc: OSError) -> Exception:
    if exc.errno == errno.ENOSPC:
        return StoreFull(f"no space left for {what}")
    if exc.errno in (errno.EFBIG, errno.EINVAL):
        return exc  # a size beyond what a file may have: the caller's errno, as on a local disk
    return StoreError(f"cannot {what}: {exc.strerror}")


def _write_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


_made_directories: set[str] = set()


def _made(directory: str) -> str:
    """`directory`, made (private) if this process has not made or found it yet."""
    if directory not in _made_directories:
        filemodes.makedirs(directory)
        _made_directories.add(directory)
    return directory


def _copy_to_new_file(source_fd: int, path: str) -> int:
    """A new file at `path` (it must not exist) holding the bytes of `source_fd`, fsync'd; its
    descriptor (a spool moved or adopted to disk). Nothing is left at `path` on failure."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, filemodes.FILE_MODE)
    try:
        length = os.fstat(source_fd).st_size
        offset = 0
        while offset < length:
            chunk = os.pread(source_fd, min(_COPY_CHUNK, length - offset), offset)
            if not chunk:
                break
            _write_all(fd, chunk, offset)
            offset += len(chunk)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return fd


def _sidecar_bytes(record: dict) -> bytes:
    # One line, without indentation: json's C encoder serves only that form, at a third of the
    # cost of an indented dump (written at every create, a large part of a small file's close).
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def _exclusive_json(path: str, record: dict) -> None:
    """A new JSON file at `path` (which must not exist)."""
    data = _sidecar_bytes(record)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, filemodes.FILE_MODE)
    try:
        _write_all(fd, data, 0)
    finally:
        os.close(fd)


def _atomic_json(path: str, record: dict, *, durable: bool = False) -> None:
    # durable: the directory fsync also covers the spool file's own entry beside it.
    filemodes.replace_atomically(path, _sidecar_bytes(record), durable=durable)


class Spool:
    """The shared write state of one file in one mount (see the module docstring)."""

    def __init__(
        self,
        root,
        *,
        workbench_id: str,
        incarnation: bytes,
        components: tuple,
        base,
        owner: dict,
        stage: bool = True,
        write_behind: bool = False,
    ):
        self.root = root
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.components = components
        self.base = base  # the PathEntry the bytes start from (None: a new file)
        self.expected_revision = None if base is None else base.artifact_revision_id
        self.append_only = False
        self.filled = base is None
        self.size = 0 if base is None else base.logical_size
        self.dirty = base is None  # bytes (or the existence of a new file) not yet published
        self.written = False  # any write or size change since the spool was made
        self.truncated_only = False  # emptied by an O_TRUNC open and not written since
        self.orphaned = False  # unlinked in this mount: its bytes go with the last descriptor
        self.failed: Exception | None = None  # the last publication's error, if it failed
        # Advanced as a publication stores blocks or a fill copies the base: a syscall waiting on
        # the spool waits as long as it moves (nokvfs.fs.threads, `progress`).
        self.progress = 0
        self.mtime_ns = time.time_ns()
        self.mtime_shown = False  # a stat(2) has shown mtime_ns (modified_ns)
        self.attributes = None  # attribute changes waiting for the next publication
        self.accepted_ns = None  # write-back: when its unpublished state was last accepted
        self.acceptances = 0  # write-back: how many times it was accepted (never reset)
        self.modifications = 0  # writes and size changes (never reset)
        self.accepted_modifications = 0  # write-back: `modifications` at its last acceptance
        self.writers = 0  # descriptors open for writing
        # The spool's lock: a Semaphore, which has no owner, so a publication's syscall can take
        # it and its work release it (Workers.bounded_holding).
        self.lock = trio.Semaphore(1)
        # Its complete blocks, staged in the store while it is written (nokvfs.workspace.prestage);
        # None when the store stages nothing or the caller publishes without staged blocks.
        self.prestager = prestage.Prestager.for_store(root.store, root.block_size) if stage else None
        # The spool file's blocks, hashed as they are written (publication reads only the rest);
        # each block hashed in order is staged from the bytes hashed, and whatever makes those
        # hashes stale makes the staged blocks stale too.
        self.hashes = bodies.WrittenBody(
            root.block_size,
            on_change=self._forget_staged,
            on_block=None if self.prestager is None else self._stage_block,
        )
        # A spool synced when its close is accepted (write-back) sends its bytes to the disk as it
        # grows, so that sync has little left to wait for (nokvfs.fs.writebehind).
        self.behind = writebehind.WriteBehind() if write_behind else None
        self._owner = owner
        self.created_unix_ms = time.time_ns() // 1_000_000
        self.fd = -1  # no spool file (yet, or any more: see the module docstring)
        self.path = None
        self.in_memory = False  # the spool file is in the memory spool directory (module docstring)
        self._charged = 0  # bytes counted against MEMORY_SPOOL_BUDGET for it
        self.closed = False
        self.open_file()

    def open_file(self) -> None:
        """Create the spool file and its sidecar (the first sidecar is written in place: a new,
        exclusive file needs no rename to appear whole to `nokvfs spool list`): in the memory
        spool directory when the file's current bytes fit there, else on disk."""
        start = 0 if self.filled else self.base.logical_size
        memory = None
        if start <= MEMORY_SPOOL_MAX and _memory_held + start <= MEMORY_SPOOL_BUDGET:
            memory = memory_spool_dir(self.root.data_dir)
        directory = _made(memory or spool_dir(self.root.data_dir))
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.components[-1])[:64]
        path = os.path.join(directory, f"{self.workbench_id}--{stem}--{new_id16().hex()}.spool")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, filemodes.FILE_MODE)
        except OSError as exc:
            raise _storage_error(f"a spool file in {directory}", exc) from None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # live: ours alone
        self.fd, self.path, self.in_memory = fd, path, memory is not None
        self._charge(start)
        self.hashes.reset()
        if self.behind is not None:
            self.behind.reset()
        self.describe_state(LIVE, new=True)

    def _charge(self, size: int) -> None:
        """Count `size` bytes against the memory budget for a memory spool."""
        global _memory_held
        if self.in_memory:
            _memory_held += size - self._charged
            self._charged = size

    def _room_for(self, end: int) -> None:
        """Before the spool file grows to `end` bytes: move it to disk if a memory spool would
        outgrow MEMORY_SPOOL_MAX or the budget."""
        if (
            self.in_memory
            and end > self._charged
            and (end > MEMORY_SPOOL_MAX or _memory_held + end - self._charged > MEMORY_SPOOL_BUDGET)
        ):
            self.to_disk()

    def to_disk(self) -> None:
        """Move a memory spool to the data directory's spool directory: the same name, its bytes
        copied and synced, its sidecar rewritten there, then the memory copy removed (a crash in
        between leaves both; `scan` prefers the disk copy and adoption drops the other)."""
        if not self.in_memory or self.fd < 0:
            return
        directory = _made(spool_dir(self.root.data_dir))
        path = os.path.join(directory, os.path.basename(self.path))
        try:
            fd = _copy_to_new_file(self.fd, path)
        except OSError as exc:
            raise _storage_error(f"move the spool {self.path} to {directory}", exc) from None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # live: ours alone (a new file: free)
        old, old_fd = self.path, self.fd
        self._charge(0)
        self.fd, self.path, self.in_memory = fd, path, False
        self.describe_state(LIVE, new=True)
        for victim in (old, old + ".json"):
            with contextlib.suppress(OSError):
                os.unlink(victim)
        with contextlib.suppress(OSError):
            os.close(old_fd)

    def _need_file(self) -> None:
        if self.fd < 0:
            self.open_file()

    @contextlib.asynccontextmanager
    async def locked(self):
        """Hold the spool's lock; without yielding to other tasks when nobody holds it, so a
        request that finds the spool idle finishes before anything else can run (a release
        racing an unmount must reply while the kernel still listens)."""
        try:
            self.lock.acquire_nowait()
        except trio.WouldBlock:
            await self.lock.acquire()
        try:
            yield
        finally:
            self.lock.release()

    # --- what it is ------------------------------------------------------------------------------

    @property
    def published_at_release(self) -> bool:
        """An empty new file, or one emptied by O_TRUNC, not written since: published when its
        last descriptor is released rather than at close (nokvfs.fs.files, the shell's
        `echo x > f`)."""
        return self.truncated_only or (self.base is None and not self.written)

    @property
    def sidecar(self) -> str | None:
        return None if self.path is None else self.path + ".json"

    @property
    def text_path(self) -> str:
        return "/".join(self.components)

    def describe(self) -> str:
        return f"{self.workbench_id}:{self.text_path}"

    def describe_state(self, state: str, reason: str | None = None, *, new: bool = False) -> None:
        """(Re)write the sidecar: what the bytes are for, what publishing them expects."""
        if self.path is None:
            return  # no spool file: nothing to describe
        record = self.record(state, reason)
        try:
            if new:
                _exclusive_json(self.sidecar, record)
            else:
                _atomic_json(self.sidecar, record)
        except OSError as exc:
            log.error("cannot write the spool sidecar %s: %s", self.sidecar, exc)
            if self.dirty and not new:
                # The old sidecar may say the spool holds nothing unpublished, and the next mount
                # would remove it: without one, the spool is kept ("no sidecar").
                with contextlib.suppress(OSError):
                    os.unlink(self.sidecar)

    def record(self, state: str, reason: str | None = None) -> dict:
        """The sidecar's content."""
        return {
            "format": SIDECAR_FORMAT,
            "state": ORPHANED if state == LIVE and self.orphaned else state,
            # False: the spool holds nothing unpublished (the next mount removes it if its daemon
            # ended); rewritten before the write that changes that is answered.
            "dirty": self.dirty,
            "reason": reason,
            "workbench": self.workbench_id,
            "incarnation": self.incarnation.hex(),
            "path": self.text_path,
            "expected_revision": None if self.expected_revision is None else self.expected_revision.hex(),
            "base_revision": None if self.base is None else self.base.artifact_revision_id.hex(),
            "base_size": None if self.base is None else self.base.logical_size,
            "append_only": self.append_only,
            "filled": self.filled,
            "size": self.size,
            "created_unix_ms": self.created_unix_ms,
            "updated_unix_ms": time.time_ns() // 1_000_000,
            **self._owner,
        }

    # --- write-back acceptance (nokvfs.fs.writeback) --------------------------------------------

    def pending_record(self, attributes=None) -> dict:
        """The sidecar the next mount gives this spool if the daemon ends before publishing it:
        state pending, with the attributes its publication stores."""
        record = self.record(PENDING)
        record["accepted_unix_ns"] = time.time_ns()  # the next mount replays in this order
        if attributes is not None:
            record["attributes"] = {name: getattr(attributes, name) for name in ATTRIBUTE_FIELDS}
        return record

    def whole_body(self, limit: int) -> bytes | None:
        """The file's complete bytes when the spool holds them whole and they are at most
        `limit` bytes (a write-back journal holds small files' bytes itself), else None."""
        if self.fd < 0 or self.append_only or not self.filled or self.size > limit:
            return None
        data = os.pread(self.fd, self.size, 0)
        return data if len(data) == self.size else None

    def sync_blocking(self) -> None:
        """The spool file's bytes and its directory entry on disk (a memory spool moved there)."""
        self.to_disk()
        try:
            os.fsync(self.fd)
            filemodes.fsync_directory(os.path.dirname(self.path))
        except OSError as exc:
            raise _storage_error(f"sync the spool {self.path}", exc) from None

    def moved(self, components: tuple) -> None:
        self.components = components
        self.describe_state(LIVE)

    def orphan(self) -> None:
        """Its file was removed or renamed over in this mount: POSIX lets the bytes written
        through descriptors still open vanish with the last of them, and so they vanish if the
        daemon ends first (the sidecar says so)."""
        self.orphaned = True
        self.describe_state(LIVE)

    def _dirtied(self) -> None:
        """Something unpublished now: the sidecar says so before the call that did it returns."""
        if not self.dirty:
            self.dirty = True
            self.describe_state(LIVE)

    # --- blocking work (worker threads, under self.lock) ---------------------------------------

    def fill_blocking(self) -> None:
        """Make the spool hold the complete current body: the base's bytes, then appended ones."""
        if self.filled:
            return
        self._need_file()
        self._room_for(max(self.size, self.base.logical_size))
        try:
            if self.append_only:
                # The appended bytes move up behind the base's, the last chunk first, so no byte
                # is overwritten before it has been moved; then the base fills the front.
                base_size = self.base.logical_size
                tail = self.size - base_size
                for position in reversed(range(0, tail, _COPY_CHUNK)):
                    chunk = os.pread(self.fd, min(_COPY_CHUNK, tail - position), position)
                    _write_all(self.fd, chunk, base_size + position)
                self.hashes.forget()
                self._copy_base(base_size)
                self.append_only = False
            else:
                self.hashes.reset()
                self._copy_base(min(self.size, self.base.logical_size))
        except OSError as exc:
            self.hashes.forget()
            raise _storage_error(f"fill the spool {self.path}", exc) from None
        self.filled = True
        self._charge(max(self._charged, self.size))

    def _copy_base(self, limit: int) -> None:
        offset = 0
        for chunk in reading.iter_body(self.root, self.base, _COPY_CHUNK):
            if offset >= limit:
                break
            chunk = chunk[: limit - offset]
            _write_all(self.fd, chunk, offset)
            self.hashes.wrote(offset, chunk)
            offset += len(chunk)
            self.progress += 1

    def truncate_blocking(self, size: int) -> None:
        if self.append_only or (not self.filled and size > 0):
            self.fill_blocking()
        self._need_file()
        self._room_for(size)
        try:
            os.ftruncate(self.fd, size)
        except OSError as exc:
            self.hashes.forget()
            raise _storage_error(f"truncate the spool {self.path}", exc) from None
        self._charge(size)
        if self.behind is not None:
            self.behind.shrunk(size)
        self.hashes.truncated(size)
        self.filled = True
        self.size = size
        self.written = True
        self._dirtied()
        self.truncated_only = False
        self._modified()

    def publish_blocking(self, attributes=None):
        """Publish the spool as the path's next revision (or the appended bytes); the PathEntry."""
        path = self.text_path
        extra = {"expected_revision_id": self.expected_revision, "progress": self.progressed}
        if attributes is not None:
            extra["attributes"] = attributes
        if self.append_only and self.base is not None and self.size > self.base.logical_size:
            body = self.hashes.body(self.path, self.size - self.base.logical_size, self.progressed)
            return appends.append(self.root, self.workbench_id, path, body, **extra)
        body = self._whole_body_blocking()
        if self.prestager is not None:
            body.prestaged = self.prestager.take()
        try:
            if self.expected_revision is None:
                del extra["expected_revision_id"]
                return namespace.put(self.root, self.workbench_id, path, body, expected_generation=0, **extra)
            return namespace.put(self.root, self.workbench_id, path, body, **extra)
        finally:
            prestage.release(body.prestaged)  # the blocks it did not link
            body.prestaged = {}

    def _whole_body_blocking(self):
        """The file's complete bytes as a Body over the spool file."""
        if not self.filled:
            self.fill_blocking()
        body = self.hashes.body(self.path, self.size, self.progressed)  # hashed while written (WrittenBody)
        if body.size != self.size:
            raise InvalidInput(f"the spool of {self.describe()} holds {body.size} bytes, expected {self.size}")
        return body

    def publication_blocking(self, attributes=None):
        """The Publication `publish_blocking` runs for a spool that is not an append (for a
        group of them: nokvfs.workspace.publish.run_group); the caller discards its body."""
        body = self._whole_body_blocking()
        return namespace.publication(
            self.workbench_id,
            self.components,
            body,
            expected_generation=0 if self.expected_revision is None else None,
            expected_revision_id=self.expected_revision,
            attributes=attributes,
            progress=self.progressed,
        )

    def progressed(self, done=None, total=None) -> None:
        """A publication's progress callback (publish.Publication.progress): one step more."""
        self.progress += 1

    @property
    def appends(self) -> bool:
        """Whether publishing the spool appends to its base (the append pipeline) rather than
        putting a whole body."""
        return self.append_only and self.base is not None and self.size > self.base.logical_size

    # --- inline work (local spool I/O, on the event loop) ----------------------------------------

    def needs_fill_for_write(self, offset: int) -> bool:
        if self.append_only:
            return offset != self.size
        return not self.filled

    def start_appending(self) -> None:
        """An O_APPEND open of a spool that holds nothing yet: keep only the appended bytes."""
        if not self.filled and not self.written and self.base is not None:
            self.append_only = True

    def write(self, offset: int, data) -> None:
        self._need_file()
        at = offset - self.base.logical_size if self.append_only else offset  # in the spool file
        end = at + len(data)
        self._room_for(end)
        try:
            try:
                _write_all(self.fd, data, at)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or not self.in_memory:
                    raise
                self.to_disk()  # the memory file system is full: the disk may have room
                _write_all(self.fd, data, at)
        except OSError as exc:
            self.hashes.changed(at, end)  # some of it may have landed
            raise _storage_error(f"write the spool {self.path}", exc) from None
        self._charge(max(self._charged, end))
        if self.behind is not None and not self.in_memory:
            self.behind.grown(self.fd, end)
        self.hashes.wrote(at, data)
        self.size = max(self.size, offset + len(data))
        self.written = True
        self._dirtied()
        self.truncated_only = False
        self._modified()

    def _modified(self) -> None:
        self.modifications += 1
        self.mtime_ns = modified_ns(self.mtime_ns, self.mtime_shown)
        self.mtime_shown = False

    def _stage_block(self, index: int, digest: bytes, pieces) -> None:
        """A block written in order is hashed (in the hashing thread): stage it from its bytes
        (nokvfs.workspace.prestage). An appending spool's blocks are not the file's: never."""
        if not self.append_only:
            self.prestager.block_hashed(index, digest, pieces)

    def _forget_staged(self) -> None:
        if self.prestager is not None:  # None: no staging (write-back, S3)
            self.prestager.forget()

    def pread(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, min(size, max(0, self.size - offset)), offset)

    def truncated_on_open(self) -> None:
        """O_TRUNC: the file is empty in this mount from now on (and for everyone once published)."""
        self._need_file()
        os.ftruncate(self.fd, 0)
        self._charge(0)
        if self.behind is not None:
            self.behind.reset()
        self.hashes.reset()
        self.filled, self.size, self.append_only = True, 0, False
        self.written = self.truncated_only = True
        self._dirtied()
        self._modified()

    def published(self, entry, *, drop_file: bool = False) -> None:
        """After a successful publication: the spool describes `entry` and holds nothing
        unpublished. With `drop_file` (its last writer is closing) the spool file and sidecar
        go at once; a later write makes a new one from `entry`."""
        if drop_file:
            self._remove_file()
            self.filled = False
            self.append_only = False
        elif self.append_only:
            os.ftruncate(self.fd, 0)
            self._charge(0)
            self.hashes.reset()
            self.filled = False
        self.base = entry
        self.expected_revision = entry.artifact_revision_id
        self.size = entry.logical_size
        self.dirty = False
        self.failed = None
        self.attributes = None
        self.accepted_ns = None
        if not drop_file:
            self.describe_state(LIVE)

    def keep(self, reason: str) -> None:
        """Leave the bytes for the operator: described, synced, and no longer held."""
        if self.fd < 0:
            self.closed = True
            return
        try:
            self.to_disk()  # kept bytes must outlive a reboot
        except (StoreError, OSError) as exc:
            log.error("the kept spool %s stays in memory (lost at a reboot): %s", self.path, exc)
        self.describe_state(KEPT, reason)
        try:
            os.fsync(self.fd)
        except OSError:
            pass
        self.close(remove=False)

    def close(self, *, remove: bool) -> None:
        self.closed = True
        # Through the hashes: they first wait for the blocks still being hashed, whose on_block
        # would otherwise stage a block after the staged ones were dropped (and hold it forever).
        self.hashes.forget()
        if remove:
            self._remove_file()
        elif self.fd >= 0:
            try:
                os.close(self.fd)  # also drops the flock
            except OSError:
                pass
            self.fd = -1
            self._charge(0)

    def _remove_file(self) -> None:
        """Unlink the spool file and its sidecar (the file first: a sidecar alone describes
        nothing), then let go of the descriptor and its flock."""
        if self.path is not None:
            for path in (self.path, self.sidecar):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self._charge(0)
        self.fd, self.path, self.in_memory = -1, None, False


# --- kept spools: what the operator sees and does -----------------------------------------------


class KeptSpool:
    """A spool on disk with its sidecar (or without one: an older daemon's)."""

    def __init__(self, path: str, record: dict | None, live: bool):
        self.path = path
        self.record = record or {}
        self.live = live

    @property
    def id(self) -> str:
        return os.path.basename(self.path)[: -len(".spool")]

    @property
    def size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return -1

    def as_json(self) -> dict:
        return {"id": self.id, "spool": self.path, "bytes": self.size, "live": self.live, **self.record}


def _held(path: str) -> bool:
    """Whether a live daemon holds the spool (its flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read_sidecar(path: str) -> dict | None:
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _spool_names(directory: str | None) -> list[str]:
    if directory is None:
        return []
    try:
        return sorted(n for n in os.listdir(directory) if n.endswith(".spool"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def scan(data_dir: str) -> list[KeptSpool]:
    """Every spool of the data directory, on disk and in memory, live ones included (marked),
    oldest first. A name in both places (a move to disk cut short) is the disk copy."""
    directory = spool_dir(data_dir)
    found = []
    names = _spool_names(directory)
    for name in names:
        path = os.path.join(directory, name)
        found.append(KeptSpool(path, _read_sidecar(path + ".json"), _held(path)))
    memory = memory_spool_path(data_dir)
    if memory is not None and _private_directory(os.path.dirname(memory)):
        on_disk = set(names)
        for name in _spool_names(memory):
            if name not in on_disk:
                path = os.path.join(memory, name)
                found.append(KeptSpool(path, _read_sidecar(path + ".json"), _held(path)))
    found.sort(key=lambda s: s.record.get("created_unix_ms") or 0)
    return found


def _adopt_to_disk(data_dir: str, spool: KeptSpool) -> None:
    """Move a memory spool nobody holds to the data directory's spool directory (kept bytes
    must outlive a reboot); a disk copy of the same name (a move cut short) wins."""
    name = os.path.basename(spool.path)
    target = os.path.join(_made(spool_dir(data_dir)), name)
    if not os.path.exists(target):
        source = os.open(spool.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.close(_copy_to_new_file(source, target))
        finally:
            os.close(source)
    if spool.record and not os.path.exists(target + ".json"):
        _atomic_json(target + ".json", spool.record, durable=True)
    forget_memory_copy(data_dir, name)
    spool.path = target


def adopt_orphans(data_dir: str, pid: int) -> list[KeptSpool]:
    """At mount start: spools whose daemon is gone become kept, with the reason written down;
    those that held nothing to keep are removed: a removed or replaced file's (ORPHANED) and one
    whose sidecar says it held nothing unpublished (`dirty` false: opened and never changed, or
    published and not written since).

    Returns every kept spool (for the start-up log)."""
    kept = []
    memory = memory_spool_path(data_dir)
    for spool in scan(data_dir):
        if spool.live:
            continue
        if holds_nothing_to_keep(spool.record):
            try:
                discard(spool)
            except OSError as exc:
                log.error("cannot remove the spool %s, which holds nothing to keep: %s", spool.path, exc)
            else:
                log.info(
                    "removed the spool of %s:%s left by a daemon that ended: it %s",
                    spool.record.get("workbench"),
                    spool.record.get("path"),
                    why_nothing_to_keep(spool.record),
                )
            continue
        if memory is not None and os.path.dirname(spool.path) == memory:
            try:
                _adopt_to_disk(data_dir, spool)
            except OSError as exc:
                log.error("cannot move the memory spool %s to disk: %s", spool.path, exc)
        record = spool.record
        if record.get("state") == PENDING:
            continue  # accepted by a write-back mount: nokvfs.fs.writeback.replay publishes it
        if record.get("state") != KEPT:
            record = dict(record)
            record["state"] = KEPT
            owner = record.get("pid")
            record["reason"] = (
                f"the daemon that held it (pid {owner}) ended before publishing it"
                if owner is not None and owner != pid
                else "no sidecar: left by an older daemon"
                if not spool.record
                else "its daemon ended before publishing it"
            )
            try:
                _atomic_json(spool.path + ".json", record)
            except OSError as exc:
                log.error("cannot describe the kept spool %s: %s", spool.path, exc)
            spool.record = record
        kept.append(spool)
    return kept


def holds_nothing_to_keep(record: dict) -> bool:
    """Whether a sidecar left by a daemon that ended says its spool holds nothing anyone may want:
    only a state and flag this build wrote say so (an older sidecar, or one of a state a reader
    does not know, is kept)."""
    state = record.get("state")
    return state == ORPHANED or (state == LIVE and record.get("dirty") is False)


def why_nothing_to_keep(record: dict) -> str:
    """What makes a spool hold nothing to keep (`holds_nothing_to_keep`), as "it ..." goes on."""
    if record.get("state") == ORPHANED:
        return "belongs to a file that was removed or renamed over while open"
    return "holds nothing unpublished"


def mark_kept(spool: KeptSpool, reason: str) -> None:
    """Describe a spool nobody holds as kept, for `reason` (the sidecar durably rewritten)."""
    spool.record = dict(spool.record, state=KEPT, reason=reason)
    try:
        _atomic_json(spool.path + ".json", spool.record, durable=True)
    except OSError as exc:
        log.error("cannot describe the kept spool %s: %s", spool.path, exc)


def find(data_dir: str, ident: str) -> KeptSpool:
    matches = [s for s in scan(data_dir) if s.id == ident or s.id.endswith(ident) or os.path.basename(s.path) == ident]
    if not matches:
        raise NotFound(f"no spool {ident!r} in {spool_dir(data_dir)}")
    if len(matches) > 1:
        raise InvalidInput(f"{ident!r} names {len(matches)} spools: give more of the id")
    return matches[0]


def discard(spool: KeptSpool) -> None:
    if spool.live:
        raise InvalidInput(f"spool {spool.id} is held by a running mount: close the file there")
    for path in (spool.path, spool.path + ".json"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def retry(root, spool: KeptSpool, *, force: bool = False):
    """Publish a kept spool's bytes at its path, with the expectation its sidecar records (or
    unconditionally with force); the PathEntry. The spool is removed once published."""
    if spool.live:
        raise InvalidInput(f"spool {spool.id} is held by a running mount: close the file there")
    record = spool.record
    if holds_nothing_to_keep(record):
        # Left by a daemon that ended; the next mount removes it. Publishing it would bring back
        # a file that was removed, or publish again bytes that are published.
        raise InvalidInput(
            f"spool {spool.id} {why_nothing_to_keep(record)}: nothing to publish (`nokvfs spool discard` it)"
        )
    workbench_id, path = record.get("workbench"), record.get("path")
    if not workbench_id or not path:
        raise InvalidInput(f"spool {spool.id} has no sidecar naming its workbench and path: give them (`nokvfs put`)")
    extra = {}
    if isinstance(record.get("attributes"), dict):  # a write-back spool names what to publish with it
        from nokvfs.workspace.attributes import Attributes

        try:
            extra["attributes"] = Attributes(**{name: record["attributes"].get(name) for name in ATTRIBUTE_FIELDS})
        except (TypeError, InvalidInput) as exc:
            raise InvalidInput(f"spool {spool.id}: its sidecar's attributes are not valid: {exc}") from None
    if record.get("append_only"):
        body = bodies.from_file(spool.path, root.block_size)
        expected = None if force or not record.get("expected_revision") else bytes.fromhex(record["expected_revision"])
        entry = appends.append(root, workbench_id, path, body, expected_revision_id=expected, **extra)
    else:
        body = bodies.from_file(spool.path, root.block_size)
        if record.get("size") is not None and body.size != record["size"]:
            raise InvalidInput(
                f"spool {spool.id} holds {body.size} bytes, its sidecar says {record['size']}: not a complete body"
            )
        if force:
            entry = namespace.put(root, workbench_id, path, body, **extra)
        elif record.get("expected_revision"):
            entry = namespace.put(
                root, workbench_id, path, body, expected_revision_id=bytes.fromhex(record["expected_revision"]), **extra
            )
        else:
            entry = namespace.put(root, workbench_id, path, body, expected_generation=0, **extra)
    discard(spool)
    return entry
