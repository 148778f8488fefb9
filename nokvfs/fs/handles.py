"""Open file and directory handles, and the write spools behind them.

A file opened for reading is pinned to the PathEntry it opened: it reads that revision to the end,
whatever is published at the path meanwhile.

A file opened for writing gets a spool file under `<data dir>/spool/mount/`. What the spool holds:

* a new file (create): its whole body, initially empty;
* an existing file opened without O_TRUNC: nothing until the first write, read or size change;
  then the current body is copied in first ("filled"), so every byte the writer did not
  overwrite is the published one. O_TRUNC (libfuse negotiates atomic O_TRUNC, so it arrives with
  the open) or a truncate to 0 before any write skips the copy;
* an existing file opened with O_APPEND: only the appended bytes; publication goes through the
  Append pipeline (reusing the base's blocks). A read or a write that is not at the end turns
  the handle into a filled one.

The generation of the path is captured at open (0 for a new file) and is the predicate of the
publication. Publication happens on flush (every close(2)) and fsync when the handle is dirty, so
close returns its error. One exception: a file created and not written yet is published at
release, not at a flush -- the shell's `echo x > f` closes a dup of the new descriptor before it
writes, and publishing an empty revision there would cost a second publication for nothing. A failed publication keeps the spool, writes a `.json` sidecar naming
the workbench, path and expected generation next to it, and logs both paths.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time

import trio

from nokvfs.errors import StoreError, StoreFull
from nokvfs.fs.prefetch import Stream
from nokvfs.schema.ids import new_id16
from nokvfs.workspace import append as appends
from nokvfs.workspace import body as bodies
from nokvfs.workspace import namespace, reading

log = logging.getLogger(__name__)

SPOOL_SUBDIR = "mount"
_COPY_CHUNK = 4 * 1024 * 1024


def spool_dir(root) -> str:
    return os.path.join(root.spool_dir, SPOOL_SUBDIR)


def _new_spool(root, workbench_id: str, components: tuple) -> tuple[str, int]:
    directory = spool_dir(root)
    os.makedirs(directory, exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in components[-1])[:64]
    path = os.path.join(directory, f"{workbench_id}--{stem}--{new_id16().hex()}.spool")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == 28:
            raise StoreFull(f"no space left for a spool file in {directory}") from None
        raise StoreError(f"cannot create a spool file in {directory}: {exc.strerror}") from None
    return path, fd


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class ReadHandle:
    """A read-only open of a file.

    It reads the revision it opened, to the end, whatever another process publishes meanwhile
    (the tree gives the path a new inode then). Within this mount the kernel shares one inode
    between readers and writers of a path, so -- as on a local filesystem -- a reader sees the
    bytes of a writer that is open in this mount, and what this mount publishes.
    """

    __slots__ = ("fh", "node", "entry", "stream")

    def __init__(self, fh: int, node, entry):
        self.fh = fh
        self.node = node
        self.entry = entry  # the PathEntry read, or None for a file only a writer here has
        self.stream = Stream()


class WriteHandle:
    def __init__(self, fh: int, node, root, *, workbench_id: str, incarnation: bytes, components: tuple, base, append: bool, expected_generation: int, creating: bool):
        self.fh = fh
        self.node = node
        self.root = root
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.components = components
        self.base = base  # the PathEntry the spool starts from (None: a new file)
        self.append_mode = append and base is not None
        self.filled = base is None
        self.size = 0 if base is None else base.logical_size
        self.expected_generation = expected_generation
        self.creating = creating
        self.dirty = creating
        self.written = False  # any write or size change through this handle
        self.orphaned = False  # unlinked through this mount: close discards, as POSIX does
        self.failed: Exception | None = None
        self.mtime_ns = time.time_ns()
        self.lock = trio.Lock()
        self.stream = Stream()
        self.spool_path, self.fd = _new_spool(root, workbench_id, components)

    @property
    def path(self) -> str:
        return "/".join(self.components)

    def describe(self) -> str:
        return f"{self.workbench_id}:{self.path}"

    # --- blocking work (worker threads, under self.lock) ---------------------------------------

    def fill_blocking(self) -> None:
        """Make the spool hold the complete current body: the base's bytes, then appended ones."""
        if self.filled:
            return
        if self.append_mode:
            delta_path, delta_fd = self.spool_path, self.fd
            self.spool_path, self.fd = _new_spool(self.root, self.workbench_id, self.components)
            self._copy_base(self.base.logical_size)
            offset, position = self.base.logical_size, 0
            while True:
                chunk = os.pread(delta_fd, _COPY_CHUNK, position)
                if not chunk:
                    break
                _write_all(self.fd, chunk, offset)
                offset += len(chunk)
                position += len(chunk)
            os.close(delta_fd)
            os.unlink(delta_path)
            self.append_mode = False
        else:
            self._copy_base(min(self.size, self.base.logical_size))
        self.filled = True

    def _copy_base(self, limit: int) -> None:
        offset = 0
        try:
            for chunk in reading.iter_body(self.root, self.base, _COPY_CHUNK):
                if offset >= limit:
                    break
                chunk = chunk[: limit - offset]
                _write_all(self.fd, chunk, offset)
                offset += len(chunk)
        except OSError as exc:
            if exc.errno == 28:
                raise StoreFull(f"no space left to fill the spool {self.spool_path}") from None
            raise StoreError(f"cannot fill the spool {self.spool_path}: {exc.strerror}") from None

    def truncate_blocking(self, size: int) -> None:
        if self.append_mode or (not self.filled and size > 0):
            self.fill_blocking()
        os.ftruncate(self.fd, size)
        self.filled = True
        self.size = size
        self.dirty = True
        self.written = True

    def publish_blocking(self):
        """Publish the spool as a new revision of the path (or the appended bytes); PathEntry."""
        body = bodies.from_file(self.spool_path, self.root.block_size)
        if self.append_mode:
            return appends.append(self.root, self.workbench_id, self.path, body, expected_generation=self.expected_generation)
        return namespace.put(self.root, self.workbench_id, self.path, body, expected_generation=self.expected_generation)

    # --- inline work (local spool I/O, on the event loop) ----------------------------------------

    def needs_fill_for_write(self, offset: int) -> bool:
        if self.append_mode:
            return offset != self.size
        return not self.filled

    def write(self, offset: int, data: bytes) -> None:
        if self.append_mode:
            _write_all(self.fd, data, offset - self.base.logical_size)
        else:
            _write_all(self.fd, data, offset)
        self.size = max(self.size, offset + len(data))
        self.dirty = True
        self.written = True
        self.mtime_ns = time.time_ns()

    def pread(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, min(size, max(0, self.size - offset)), offset)

    def published(self, entry) -> None:
        """After a successful publication: the spool now describes `entry`."""
        self.dirty = False
        self.failed = None
        self.creating = False
        self.expected_generation = entry.generation
        if self.append_mode:
            os.ftruncate(self.fd, 0)
        self.base = entry
        self.size = entry.logical_size

    def keep_spool(self, reason: str) -> str:
        """Leave the spool for the operator, with a sidecar saying what it was for."""
        sidecar = self.spool_path + ".json"
        record = {
            "workbench": self.workbench_id,
            "path": self.path,
            "expected_generation": self.expected_generation,
            "base_revision": None if self.base is None else self.base.artifact_revision_id.hex(),
            "base_size": None if self.base is None else self.base.logical_size,
            "append_only": self.append_mode,
            "size": self.size,
            "reason": reason,
            "kept_at_unix_ms": time.time_ns() // 1_000_000,
        }
        try:
            with open(sidecar, "w") as f:
                json.dump(record, f, indent=2, sort_keys=True)
                f.write("\n")
        except OSError as exc:
            log.error("cannot write spool sidecar %s: %s", sidecar, exc)
        return sidecar

    def close(self, *, keep: bool) -> None:
        try:
            if keep:
                os.fsync(self.fd)
        except OSError:
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.fd = -1
        if not keep:
            try:
                os.unlink(self.spool_path)
            except FileNotFoundError:
                pass


class DirHandle:
    """One open directory: where its listing stands, so readdir pages from an anchor."""

    __slots__ = ("fh", "node", "pos", "anchor", "buffer", "phase", "overlay_index", "history", "static")

    HISTORY = 1024  # positions remembered for seekdir/rewinddir (bounded)

    def __init__(self, fh: int, node):
        self.fh = fh
        self.node = node
        # The whole listing, taken at opendir, for directories whose names are not a delimiter
        # scan (the root's workbenches, a workbench's sections and views, `.snapshots/` ...);
        # the anchor is then an index into it. None: page the scan.
        self.static = None
        self.reset()

    def reset(self) -> None:
        self.pos = 0  # readdir offset of the last entry handed to the kernel
        self.anchor = None  # scan anchor after that entry
        self.buffer = collections.deque()  # fetched children not handed over yet
        self.phase = "scan"  # scan -> overlay -> done
        self.overlay_index = 0
        self.history = collections.OrderedDict()

    def remember(self, phase: str) -> None:
        """Record how to resume right after the entry at self.pos (in `phase`)."""
        self.history[self.pos] = (self.anchor, phase, self.overlay_index)
        if len(self.history) > self.HISTORY:
            self.history.popitem(last=False)  # positions only grow between resets

    def restore(self, pos: int) -> bool:
        state = self.history.get(pos)
        if state is None:
            return False
        self.pos = pos
        self.anchor, self.phase, self.overlay_index = state
        self.buffer = collections.deque()
        return True


class HandleTable:
    def __init__(self):
        self._handles: dict[int, object] = {}
        self._next = 1

    def add(self, make) -> object:
        fh = self._next
        self._next += 1
        handle = make(fh)
        self._handles[fh] = handle
        return handle

    def get(self, fh: int):
        return self._handles.get(fh)

    def pop(self, fh: int):
        return self._handles.pop(fh, None)

    def writers(self):
        return [h for h in self._handles.values() if isinstance(h, WriteHandle)]

    def __len__(self) -> int:
        return len(self._handles)
