"""Write-back mode (`nokvfs mount --write-back`): close(2) returns once the file's bytes are
durable on this machine; a background publisher publishes them afterwards, in order.

Acceptance. At close (flush) one record is appended to the mount's journal and the journal
fdatasync'd: the sidecar the spool would need to be published (state `pending`, the attributes
its publication stores) and, for a file of at most INLINE_MAX bytes, the bytes themselves --
one sync per close and no file created. A larger file's spool is fsync'd (with its directory)
first and the record names it. From then on nothing accepted is lost: the publisher publishes
it, or -- after a crash -- the next mount does (`replay`: each journal a dead daemon left is
turned back into spool files and pending sidecars, then published), or it becomes a kept spool
for `nokvfs spool list|retry|discard`. The journal is emptied whenever nothing accepted is
unpublished, and removed at a clean unmount.

Publishing. One task drains the accepted spools in the order they were accepted (a spool accepted
again while still queued keeps its place and publishes its latest bytes). The head of the queue
goes as one group (group commit, nokvfs.workspace.publish.run_group: up to GROUP_MAX files, each
step of the publish state machine one engine transaction for all of them, their blocks in one
store batch) when its files are plain puts; an append or an attributes-only change goes alone
through the publication the default mode runs at close (nokvfs.fs.files.Files.publish). Either
way expectations, conflicts and attributes follow the same rules, and a file refused in a group
does not hold back the others. A publication that fails leaves the spool's bytes in place; once
the file's last descriptor is gone the spool is kept with its sidecar and a log line says where
(a conflict: something outside this mount changed the path). The published records of a group
reach the journal with one sync. A file written after its acceptance through a descriptor still
open for writing (the close of a duplicate accepted it: dd, a shell's `> F`) is passed over until
that descriptor's close accepts it again (Publisher._deferred): its bytes then are no close's.

fsync(2) on a file waits until the publisher has published it (and everything accepted before
it) and reports that publication's error. rename(2) and unlink(2) of an accepted file still
waiting in the queue change the journal instead (one synced record: the file accepted again at
its new name, in its old place in the order, or its acceptance ended), so tools that save through
a temporary name (git, pip, editors) do not wait for the backlog; those of a file whose
publication has started wait for it (they then move or remove what is published). A
publication's journal record is synced, so a replay never brings back a file that was renamed or
removed after its close. Unmounting
(`nokvfs umount`, a signal) drains the queue before the daemon exits; files still open then are
kept as in the default mode.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import json
import logging
import os
import struct
import time

import trio
import xxhash

from nokvfs import filemodes
from nokvfs.errors import CorruptRecord, GenerationConflict, SyscallTimeout, UnknownVersion
from nokvfs.fs import spools, views
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.schema.ids import new_id16
from nokvfs.workspace import attributes, publish

log = logging.getLogger(__name__)


# --- the acceptance journal -----------------------------------------------------------------------
#
# <data dir>/spool/mount/writeback-<id>.journal, one per write-back daemon, held under its flock.
# A record: "NKWB" | u8 version (1) | u8 kind | u32 length | meta (JSON, UTF-8) | u8 inline |
# u64 length | body | u64 xxh3-64 of everything before it, all integers big-endian. Kind 1
# (accepted): meta is the spool's pending sidecar plus "spool" (its file name); with inline 1 the
# body is the file's complete bytes, with inline 0 (and no body) the spool file holds them. Kind 2
# (published): meta is {"spool": name}; that acceptance needs no replay. Kind 3 (directory, a
# nokvfs extension of 2026-12-05): a directory's attribute change accepted here (mkdir's marker,
# chmod/chown/utime of a directory), no body; meta is {"spool": "directory-<hex id>" (the change's
# name: a later record of that name replaces it, a published record ends it; a change accepted
# again is written as a new one plus the published record of the one it replaces), "workbench",
# "incarnation" (hex), "path" (the directory's, below a section), "changes" (mode, uid, gid,
# mtime_ns, atime_ns: integers), "made_ns" and "changed_ns" (first and last acceptance)}. A record
# cut short or failing its checksum ends the journal (a close that never returned); an unknown
# version or kind is refused, and the journal is left untouched.

JOURNAL_MAGIC = b"NKWB"
JOURNAL_VERSION = 1
ACCEPTED, PUBLISHED, DIRECTORY = 1, 2, 3
DIRECTORY_CHANGES = ("mode", "uid", "gid", "mtime_ns", "atime_ns")
# A memory spool (nokvfs.fs.spools) is never larger: its bytes always travel in the journal.
INLINE_MAX = spools.MEMORY_SPOOL_MAX
_HEAD = struct.Struct(">4sBBI")
_BODY = struct.Struct(">BQ")
_SUM = struct.Struct(">Q")
JOURNAL_PREFIX, JOURNAL_SUFFIX = "writeback-", ".journal"


def encode_record(kind: int, meta: dict, body: bytes | None = None) -> bytes:
    raw = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    out = _HEAD.pack(JOURNAL_MAGIC, JOURNAL_VERSION, kind, len(raw)) + raw
    out += _BODY.pack(0 if body is None else 1, 0 if body is None else len(body)) + (body or b"")
    return out + _SUM.pack(xxhash.xxh3_64_intdigest(out))


def decode_records(data: bytes) -> list[tuple[int, dict, bytes | None]]:
    """The journal's records up to the first one cut short or damaged (kind, meta, body or None).
    UnknownVersion / CorruptRecord for a whole record this build cannot read."""
    records, pos = [], 0
    while pos + _HEAD.size <= len(data):
        magic, version, kind, meta_len = _HEAD.unpack_from(data, pos)
        at = pos + _HEAD.size + meta_len
        if magic != JOURNAL_MAGIC or at + _BODY.size > len(data):
            break
        inline, body_len = _BODY.unpack_from(data, at)
        end = at + _BODY.size + body_len
        if end + _SUM.size > len(data) or _SUM.unpack_from(data, end)[0] != xxhash.xxh3_64_intdigest(data[pos:end]):
            break  # the tail of a close that never returned
        if version != JOURNAL_VERSION:
            raise UnknownVersion(
                f"write-back journal record version {version}, this build knows only {JOURNAL_VERSION}"
            )
        if kind not in (ACCEPTED, PUBLISHED, DIRECTORY) or inline not in (0, 1) or (kind == DIRECTORY and inline):
            raise CorruptRecord(
                f"write-back journal record of kind {kind} (inline {inline}) is not one this build knows"
            )
        try:
            meta = json.loads(data[pos + _HEAD.size : at])
        except ValueError:
            raise CorruptRecord("write-back journal record with unreadable meta") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("spool"), str) or os.sep in meta["spool"]:
            raise CorruptRecord("write-back journal record names no spool file")
        if kind == DIRECTORY:
            _check_directory_meta(meta)
        records.append((kind, meta, bytes(data[at + _BODY.size : end]) if inline else None))
        pos = end + _SUM.size
    return records


def _check_directory_meta(meta: dict) -> None:
    changes = meta.get("changes")
    try:
        bytes.fromhex(meta["incarnation"])
        valid = (
            isinstance(meta["workbench"], str)
            and isinstance(meta["path"], str)
            and isinstance(changes, dict)
            and all(k in DIRECTORY_CHANGES and type(v) is int for k, v in changes.items())
            and type(meta["made_ns"]) is int
            and type(meta["changed_ns"]) is int
        )
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid:
        raise CorruptRecord("write-back journal directory record with unreadable fields")


class Journal:
    """This daemon's acceptance journal (created at the first acceptance)."""

    def __init__(self, data_dir: str):
        directory = spools.spool_dir(data_dir)
        filemodes.makedirs(directory)
        self.path = os.path.join(directory, f"{JOURNAL_PREFIX}{new_id16().hex()}{JOURNAL_SUFFIX}")
        self.fd = os.open(
            self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, filemodes.FILE_MODE
        )
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # live: the next mount leaves it alone
        filemodes.fsync_directory(directory)
        self.size = 0

    def append(self, record: bytes, *, sync: bool) -> None:
        os.write(self.fd, record)
        self.size += len(record)
        if sync:
            os.fdatasync(self.fd)

    def reset(self) -> None:
        """Nothing accepted is unpublished: start over (durably, so no stale record replays)."""
        if self.size:
            os.ftruncate(self.fd, 0)
            os.fdatasync(self.fd)
            self.size = 0

    def remove(self) -> None:
        os.unlink(self.path)
        os.close(self.fd)


def restore_journals(data_dir: str) -> tuple[int, list, list]:
    """Turn each journal a dead write-back daemon left into spool files and pending sidecars
    (`replay` then publishes them). Returns (the number of acceptances restored, the directory
    changes still to store (their meta, in acceptance order), the journals read: `replay` removes
    them once those changes are stored)."""
    directory = spools.spool_dir(data_dir)
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(JOURNAL_PREFIX) and n.endswith(JOURNAL_SUFFIX))
    except FileNotFoundError:
        return 0, [], []
    restored = 0
    directories: list = []
    journals: list = []
    for name in names:
        path = os.path.join(directory, name)
        if spools._held(path):
            continue  # a live daemon's
        try:
            with open(path, "rb") as f:
                records = decode_records(f.read())
        except (OSError, UnknownVersion, CorruptRecord) as exc:
            log.error("write-back journal %s cannot be replayed by this build (%s): left in place", path, exc)
            continue
        pending: dict = {}
        changes: dict = {}  # a directory change accepted again moves to the end, as in the queue
        for kind, meta, body in records:
            pending.pop(meta["spool"], None)
            changes.pop(meta["spool"], None)
            if kind == ACCEPTED:
                pending[meta["spool"]] = (meta, body)
            elif kind == DIRECTORY:
                changes[meta["spool"]] = meta
        for spool_name, (meta, body) in pending.items():
            spool_path = os.path.join(directory, spool_name)
            if body is not None:
                fd = os.open(spool_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, filemodes.FILE_MODE)
                try:
                    spools._write_all(fd, body, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            elif not os.path.exists(spool_path):
                continue  # published and dropped; its published record did not reach the disk
            record = {k: v for k, v in meta.items() if k != "spool"}
            spools._atomic_json(spool_path + ".json", record, durable=True)
            spools.forget_memory_copy(data_dir, spool_name)  # superseded by the journal's bytes
            restored += 1
        directories.extend(changes.values())
        journals.append(path)
    return restored, directories, journals


# A burst of closes (tar x, a build) runs first and its publications after it: the publisher
# starts once no file was accepted for QUIET seconds, or at once when someone waits (fsync(2),
# unmount) or the backlog reaches half its limit. Each accepted spool holds a descriptor and a
# flock until it is published, so acceptance waits while the limit is queued: MAX_BACKLOG, or
# less when the descriptor limit (raised to its hard limit first) leaves less room.
QUIET = 0.05
QUIET_ENV = "NOKVFS_WRITEBACK_QUIET"  # tests: another quiet time (seconds) for the daemon they start
MAX_BACKLOG = 8192
_RESERVED_DESCRIPTORS = 1024  # for everything else the daemon opens


def backlog_limit() -> int:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_BACKLOG + _RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return MAX_BACKLOG
    return max(16, min(MAX_BACKLOG, (soft - _RESERVED_DESCRIPTORS) // 2))


class DirectoryChange:
    """A directory's attribute change accepted here and not yet stored: mkdir's marker, or chmod,
    chown, utime of a directory. Queued with the files, in acceptance order; a change accepted for
    a directory whose change is still queued is merged into it and moves it to the end of the
    queue, so a directory's times set after its files (tar x) are stored after them."""

    __slots__ = ("workbench_id", "incarnation", "components", "changes", "made_ns", "changed_ns", "name")

    def __init__(self, workbench_id: str, incarnation: bytes, components: tuple, now_ns: int):
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.components = components
        self.changes: dict = {}
        self.made_ns = self.changed_ns = now_ns
        self.name = f"directory-{new_id16().hex()}"

    @property
    def path(self) -> str:
        return "/".join(self.components)

    def describe(self) -> str:
        return f"{self.workbench_id}:{self.path}/"

    def meta(self) -> dict:
        return {
            "spool": self.name,
            "workbench": self.workbench_id,
            "incarnation": self.incarnation.hex(),
            "path": self.path,
            "changes": dict(self.changes),
            "made_ns": self.made_ns,
            "changed_ns": self.changed_ns,
        }

    def item(self) -> tuple:
        """What namespace.set_directories_attributes takes."""
        return (self.workbench_id, self.path, dict(self.changes), self.made_ns, self.changed_ns)


class Publisher:
    """The accepted, not yet published spools of a write-back mount, and the task publishing them."""

    def __init__(self, files, *, quiet: float | None = None, max_backlog: int | None = None):
        self.files = files
        self.quiet = float(os.environ.get(QUIET_ENV, QUIET)) if quiet is None else quiet
        self.max_backlog = backlog_limit() if max_backlog is None else max_backlog
        self._queue: dict = {}  # spool -> node, in acceptance order (dicts keep insertion order)
        self._done: dict = {}  # spool -> trio.Event set once its queued publication ran
        self._outcome: dict = {}  # spool -> the exception its last publication raised (None: published)
        self._wakeup = trio.Event()
        self._wanted: collections.Counter = collections.Counter()  # item -> tasks waiting for it (fsync, rename)
        self._idle = False  # the publisher waits for an acceptance (nothing it may publish now)
        self._room = trio.Event()  # set when the backlog falls below MAX_BACKLOG
        self._last_accept = 0.0
        self._journal: Journal | None = None
        self._journal_lock = trio.Lock()
        # One publication turn at a time: the publisher task's and the unmount's drain run side by
        # side, and a turn ends by settling its files and resetting the journal after dequeuing.
        self._turn = trio.Lock()
        self._accepting = 0  # acceptances between their journal record and the queue
        self._journal_names: dict = {}  # spool -> its file name in the last acceptance record
        # (incarnation, components) -> its DirectoryChange, queued or being stored; shared with
        # the tree, which shows it until it is stored.
        self._directories: dict = files.tree.pending_directories
        self._storing: set = set()  # DirectoryChanges taken from the queue and being stored
        self.accepted = 0
        self.published = 0
        self.failed = 0
        self._publishing: list = []  # the spools of the publication under way (their progress)

    def holds(self, spool) -> bool:
        return spool in self._queue

    @property
    def backlog(self) -> int:
        return len(self._queue)

    # --- acceptance ----------------------------------------------------------------------------

    async def accept(self, node) -> None:
        """close(2) in write-back mode: make the file's unpublished state durable here and queue
        its publication. Errors (a full or failing local disk) are close(2)'s."""
        spool = node.spool
        if spool is None or spool.orphaned:
            return
        files = self.files
        if len(self._queue) >= self.max_backlog and spool not in self._queue:
            await self._while_progressing(
                f"room in the write-back backlog for {spool.describe()}", self._room_for, spool
            )
        await files.workers.bounded_holding(
            f"acceptance of {spool.describe()}",
            spool.lock,
            self._accept_held,
            node,
            spool,
            inline=spool.path is None,
            progress=lambda: spool.progress,  # the file's previous publication, under way
        )

    async def _room_for(self, item=None) -> None:
        """Until the backlog has room for one more acceptance (or `item` is queued already)."""
        while len(self._queue) >= self.max_backlog and (item is None or item not in self._queue):
            self._wakeup.set()
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()

    async def _accept_held(self, node, spool) -> None:
        """(spool locked, by the work: a close that gave up waiting leaves the lock held until the
        acceptance ends, so no write lands while its record is taken, and the journal record and
        the queue always agree) Record the acceptance in the journal and queue the spool."""
        if spool.orphaned or node.spool is not spool or (not spool.dirty and not spool.attributes):
            return
        self._accepting += 1
        # The file's change time is its acceptance (its close), not its later publication: a
        # directory's times set after its files (tar x) stay newer than theirs.
        spool.accepted_ns = time.time_ns()
        spool.acceptances += 1
        spool.accepted_modifications = spool.modifications  # a deferred file may go on (_wake_for_acceptance)
        try:
            if spool.path is not None:  # else attributes only, nothing in a file: the publication applies them
                record = spool.pending_record(self.files.attributes_to_publish(node, spool))
                record["spool"] = os.path.basename(spool.path)
                async with self._journal_lock:
                    await self.files.workers.run(self._record_acceptance, spool, record)
                self._journal_names[spool] = record["spool"]
            if spool not in self._queue:
                self._queue[spool] = node
                self._done[spool] = trio.Event()
                self.accepted += 1
        finally:
            self._accepting -= 1
        self._last_accept = trio.current_time()
        self._wake_for_acceptance()

    def _wake_for_acceptance(self) -> None:
        """After an acceptance: wake the publisher only where it may wait without a deadline (the
        queue was empty, or holds only deferred files) or must stop waiting (half the backlog).
        Waiting for a quiet moment, it looks at the time of the last acceptance when its deadline
        comes, so a burst of closes does not wake it (a trio cancel scope and an Event each) once
        per file."""
        if self._idle or len(self._queue) <= 1 or len(self._queue) >= self.max_backlog // 2:
            self._wakeup.set()

    def _record_acceptance(self, spool, record: dict | None, tail: bytes = b"") -> None:
        """(worker thread, spools and journal locked) The acceptance on disk: one journal record
        holding a small file's bytes, or naming a larger file's spool once that is synced, and
        `tail` (a rename's or unlink's end of another acceptance) in the same synced write; no
        `record`: the tail alone."""
        try:
            out = b""
            if record is not None:
                body = spool.whole_body(INLINE_MAX)
                if body is None:
                    spool.sync_blocking()
                out = encode_record(ACCEPTED, record, body)
            if self._journal is None:
                self._journal = Journal(self.files.root.data_dir)
            self._journal.append(out + tail, sync=True)
        except OSError as exc:
            raise spools._storage_error("record a write-back acceptance", exc) from None

    async def _record_published(self, names: list) -> None:
        """The PUBLISHED records of `names` (spools or directory changes stored), one sync; a
        failure is logged (a replay then publishes them again, under their expectations)."""
        if not names or self._journal is None:
            return
        records = b"".join(encode_record(PUBLISHED, {"spool": name}) for name in names)
        try:
            await self.files.workers.run(self._journal.append, records, sync=True)
        except OSError as exc:
            log.warning("write-back journal %s: %s", self._journal.path, exc)

    # --- rename and unlink of what was accepted ----------------------------------------------

    def movable(self, node) -> bool:
        """A file created in this mount, accepted at close and queued, whose publication has not
        started: rename(2) and unlink(2) change its journal record instead of waiting for it."""
        spool = node.spool
        return (
            spool is not None
            and spool in self._queue
            and spool in self._journal_names
            and spool.lock.value == 1
            and spool.path is not None
            and spool.base is None
            and not spool.orphaned
            and spool.failed is None
            and self.files.tree.overlay.pending(node.incarnation, node.components) is node
        )

    async def journal_rename(self, node, components: tuple, expected_revision, target, apply) -> None:
        """rename(2) of a movable file to `components` (over `target`, a node or None), expecting
        `expected_revision` there: one synced journal write -- the file accepted again at its new
        name (same spool, same place in the order) and the acceptance of a file it replaces
        ended -- then `apply()` (the mount's side). A replay after a crash publishes the bytes at
        the new name and never the replaced file's."""
        spool = node.spool
        record = spool.pending_record(self.files.attributes_to_publish(node, spool))
        record.update(
            spool=self._journal_names[spool],
            path="/".join(components),
            expected_revision=None if expected_revision is None else expected_revision.hex(),
            accepted_unix_ns=spool.accepted_ns or record["accepted_unix_ns"],
        )
        replaced = None if target is None or target is node else target
        await self._journal_change(f"rename of {spool.describe()}", spool, record, replaced, apply)

    async def journal_unlink(self, node, apply) -> None:
        """unlink(2) of a movable file: its acceptance ended in the journal (synced), then `apply()`."""
        await self._journal_change(f"unlink of {node.spool.describe()}", None, None, node, apply)

    async def _journal_change(self, what: str, spool, record, ended, apply) -> None:
        """(no task holds the spools' locks: `movable`) Hold them, write `record` (spool's
        acceptance again, with its bytes when small) and the end of the acceptance of `ended`
        (a node, if its spool is queued) with one sync, then apply() -- in that order also when
        the syscall gives up waiting (SyscallTimeout), so the journal and the queue always agree.
        An ended spool nobody has open goes at once: no replay or later mount finds it."""
        ended_spool = None if ended is None else ended.spool
        held = [s for s in (spool, ended_spool) if s is not None]
        for each in held:
            each.lock.acquire_nowait()
        ended_name = None if ended_spool is None else self._journal_names.get(ended_spool)
        tail = b"" if ended_name is None else encode_record(PUBLISHED, {"spool": ended_name})

        async def work() -> None:
            try:
                self._accepting += 1
                try:
                    async with self._journal_lock:
                        await self.files.workers.run(self._record_acceptance, spool, record, tail)
                finally:
                    self._accepting -= 1
                apply()
                if ended_name is not None:
                    self._journal_names.pop(ended_spool, None)
                    if ended.spool is ended_spool:
                        self._drop(ended, ended_spool)
            finally:
                for each in held:
                    each.lock.release()

        await self.files.workers.bounded(what, work)
        self._wakeup.set()

    def _made_room(self) -> None:
        """After spools left the queue: wake the acceptances waiting for room, if there is some."""
        if len(self._queue) < self.max_backlog:
            self._room.set()

    def _drop(self, node, spool) -> None:
        """(spool locked) An accepted spool whose file was removed or replaced before its
        publication started: out of the queue, and its file gone if nobody has it open (else
        the last release removes it, as for any orphaned spool; left queued, its release would
        leave it to a publisher that may never come before a crash, and the next mount would
        keep the bytes of a removed file). A publisher waiting for its lock skips it."""
        self._queue.pop(spool, None)
        self._outcome.pop(spool, None)
        done = self._done.pop(spool, None)
        if done is not None:
            done.set()
        if node.handles == 0:
            node.spool = None
            spool.close(remove=True)
        self._made_room()

    async def accept_at_release(self, node) -> bool:
        """The last descriptor of a file went: True if the publisher now owns the spool's end
        (it is queued, or has just been accepted), False if the release settles it itself."""
        spool = node.spool
        if spool in self._queue:
            return True
        if spool.dirty and not spool.orphaned and spool.failed is None:
            await self.accept(node)
            return spool in self._queue
        return False

    async def wait_published(self, node) -> None:
        """fsync(2): accept what the file holds, wait for its publication, report its error."""
        spool = node.spool
        if spool is None:
            return
        if spool not in self._queue:
            await self.accept(node)
        await self.wait_settled(f"the write-back publication of {spool.describe()}", spool)
        error = self._outcome.get(spool)
        if error is not None:
            raise error

    async def settled(self, spool) -> None:
        """Wait until the spool's accepted publication (if one is queued) has run; its error
        stays with the file (fsync, the kept spool)."""
        done = self._done.get(spool)
        if done is not None:
            self._wanted[spool] += 1
            self._wakeup.set()
            try:
                await done.wait()
            finally:
                self._wanted[spool] -= 1
                if not self._wanted[spool]:
                    del self._wanted[spool]

    async def _settled_each(self, accepted: list) -> None:
        for item in accepted:
            await self.settled(item)

    async def wait_settled(self, what: str, item) -> None:
        """settled, for a syscall (fsync, and rename, unlink or rmdir of what was accepted):
        bounded by _while_progressing."""
        await self._while_progressing(what, self.settled, item)

    async def wait_settled_all(self, what: str) -> None:
        """Wait until every publication accepted so far has run (before a directory rename: the
        files below it must not be replayed at their old paths; before fsync of a directory under
        --sync), bounded by _while_progressing: what was accepted when it was called, so a writer
        that keeps accepting files cannot extend the wait."""
        await self._while_progressing(what, self._settled_each, list(self._done))

    def _progress(self) -> tuple:
        """What moves while the publisher works: publications that succeeded, and the steps
        (blocks planned or stored) of the one under way. Failures are not progress: over a store
        that answers every publication with an error after its own deadline, a waiting call
        gives up after one syscall deadline instead of once per failed file."""
        return self.published, sum(spool.progress for spool in self._publishing)

    async def _while_progressing(self, what: str, wait, *args) -> None:
        """await wait(*args) for as long as the publisher makes progress (publications succeed, or
        the one under way stores blocks): SyscallTimeout only once a whole syscall deadline
        passed without any (a stalled publisher: a store or disk that hangs or fails; it goes
        on, and a later call waits again). A backlog of thousands of files, or one large file,
        can take longer than the deadline to publish, and is not an error: fsync(2) on a local
        disk waits as long as its writes take. Waiting does no work and holds no lock, so giving
        up leaves nothing behind."""
        workers = self.files.workers
        while True:
            progress = self._progress()
            with trio.move_on_after(workers.syscall_timeout):
                await wait(*args)
                return
            if self._progress() == progress:
                workers.timeouts += 1
                raise SyscallTimeout(
                    f"{what} did not finish, and no write-back publication made progress within "
                    f"{workers.syscall_timeout:g} s (it goes on in the background)"
                )

    async def accept_directory(self, node, changes: dict) -> None:
        """mkdir, or chmod/chown/utime of a directory, in write-back mode: the change is durable
        here (one journal record, synced) and queued; the directory shows it from now on."""
        key = (node.incarnation, node.components)
        change = self._directories.get(key)
        what = f"room in the write-back backlog for directory {'/'.join(node.components)}"
        if change is not None and change in self._storing:
            # Being stored: the next change is another one.
            await self._while_progressing(what, self.settled, change)
            change = self._directories.get(key)
        while change is None and len(self._queue) >= self.max_backlog:
            await self._while_progressing(what, self._room_for)
            change = self._directories.get(key)
        now = time.time_ns()
        merged = DirectoryChange(node.workbench_id, node.incarnation, node.components, now)
        if change is not None:
            merged.made_ns = change.made_ns
            merged.changes.update(change.changes)
        merged.changes.update({k: v for k, v in changes.items() if k in DIRECTORY_CHANGES})
        # Under a name of its own, with the change it replaces ended in the same synced write: the
        # publisher may take that one meanwhile, and its published record must not end this one.
        record = encode_record(DIRECTORY, merged.meta())
        if change is not None:
            record += encode_record(PUBLISHED, {"spool": change.name})
        self._accepting += 1
        try:
            async with self._journal_lock:
                await self.files.workers.bounded(
                    f"acceptance of directory {merged.describe()}",
                    self.files.workers.run,
                    self._append_directory,
                    record,
                )
            # Recorded: the merged change replaces the queued one, at the end of the queue.
            done = None
            if change is not None:
                self._queue.pop(change, None)
                done = self._done.pop(change, None)
            self._directories[key] = merged
            self._queue[merged] = node
            self._done[merged] = done if done is not None else trio.Event()
            if change is None:
                self.accepted += 1
        finally:
            self._accepting -= 1
        self._last_accept = trio.current_time()
        self._wake_for_acceptance()

    def _append_directory(self, record: bytes) -> None:
        try:
            if self._journal is None:
                self._journal = Journal(self.files.root.data_dir)
            self._journal.append(record, sync=True)
        except OSError as exc:
            raise spools._storage_error("record a write-back directory change", exc) from None

    async def directory_settled(self, node) -> None:
        """Before rmdir: the directory's accepted change (if any) is stored first."""
        change = self._directories.get((node.incarnation, node.components))
        if change is not None:
            await self.wait_settled(f"the write-back change of directory {change.describe()}", change)

    # --- publishing ----------------------------------------------------------------------------

    def writer_released(self, spool) -> None:
        """A descriptor open for writing went: a file the idle publisher deferred may be published."""
        if self._idle and spool in self._queue:
            self._wakeup.set()

    def _deferred(self, item) -> bool:
        """A file written since its last acceptance through a descriptor still open for writing:
        the close of a duplicate accepted it (dd of=F and a shell's `> F` open F, move the
        descriptor and close the first), and it is still being written. Its bytes now are no
        close's: publishing them would put a torn prefix in its history and its blocks in the
        bucket. It keeps its place until that descriptor's close accepts it again, unless a call
        waits for it (fsync, a directory rename), the backlog is full, or the daemon exits (drain)."""
        return (
            not isinstance(item, DirectoryChange)
            and item.writers > 0
            and item.modifications != item.accepted_modifications
            and item not in self._wanted
            and len(self._queue) < self.max_backlog
        )

    def _publishable(self, force: bool = False):
        """The queue's items in order, without those deferred (all of them with `force`)."""
        return ((item, node) for item, node in self._queue.items() if force or not self._deferred(item))

    async def run(self) -> None:
        """The publisher task: publish accepted spools in order, for as long as the mount lives."""
        while True:
            if next(self._publishable(), None) is None:
                self._idle = True  # waiting without a deadline: every acceptance wakes it
                try:
                    await self._wakeup.wait()
                finally:
                    self._idle = False
                self._wakeup = trio.Event()
                continue
            if not self._wanted and len(self._queue) < self.max_backlog // 2:
                idle = trio.current_time() - self._last_accept
                if idle < self.quiet:
                    with trio.move_on_after(self.quiet - idle):
                        await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
            await self._publish_next()

    async def drain(self) -> None:
        """Publish everything accepted (at unmount, before the daemon exits)."""
        if self._queue:
            log.info("write-back: publishing %d accepted file(s) before the daemon exits", len(self._queue))
        while self._queue:
            await self._publish_next(force=True)
        # The publisher task's turn may still be settling what it dequeued, or resetting the
        # journal in a worker thread: the journal goes once that turn has ended.
        async with self._turn, self._journal_lock:
            if self._journal is not None and not self._outcome:
                try:
                    self._journal.remove()  # every acceptance published or kept (with its sidecar)
                except OSError as exc:
                    log.warning("write-back journal %s: %s", self._journal.path, exc)
                self._journal = None

    async def _publish_next(self, force: bool = False) -> None:
        """Publish the head of the queue (deferred files left out, unless `force`): the longest
        run (at most GROUP_MAX) of files a plain put publishes as one group (group commit:
        nokvfs.workspace.publish.run_group), or the head alone (an append, attributes only)
        through the default mode's publication. One turn at a time (`_turn`)."""
        async with self._turn:
            await self._take_turn(force)

    async def _take_turn(self, force: bool) -> None:
        files = self.files
        head = list(itertools.islice(self._publishable(force), GROUP_MAX))
        if not head:
            return
        if isinstance(head[0][0], DirectoryChange):
            await self._store_directories([key for key, _ in itertools.takewhile(_is_directory, head)])
            return
        group, errors = [], []
        self._publishing = [spool for spool, _ in head if not isinstance(spool, DirectoryChange)]
        taken = {}  # spool: its acceptances when its publication took its bytes
        async with contextlib.AsyncExitStack() as locks:
            for spool, node in head:
                if isinstance(spool, DirectoryChange) or not _groupable(spool, node):
                    break
                await locks.enter_async_context(spool.locked())
                if not _groupable(spool, node):
                    break
                group.append((spool, node))
                taken[spool] = spool.acceptances
            if group:
                errors = await files.publish_group(
                    [node for _, node in group],
                    "write-back publication",
                    [_closing(spool) for spool, _ in group],
                )
        if not group:
            spool, node = head[0]
            error = None
            # Taken before its publication holds the lock: an acceptance in between is published
            # too, and only costs the spool a second (empty) turn.
            taken[spool] = spool.acceptances
            try:
                await files.publish(node, why="write-back publication", closing=_closing(spool), deadline=False)
            except Exception as exc:  # noqa: BLE001 - Files logged it with the spool's path; fsync reports it
                error = exc
            group, errors = [(spool, node)], [error]
        # Dequeued, then the published ones recorded in the journal with one sync (a replay must
        # never bring back what a later unlink or rename changed), then each one settled. A file
        # written and closed again since its publication took its bytes was accepted again: it
        # keeps its place, its journal record (the newer bytes') and its waiters, for the next
        # turn. Decided and written under the journal's lock, which an acceptance holds for its
        # record: an acceptance is counted before this decision, or its record follows ours.
        async with self._journal_lock:
            names, settling = [], []
            for (spool, node), error in zip(group, errors):
                if error is None:
                    self.published += 1
                    self._outcome.pop(spool, None)
                    if spool.acceptances != taken[spool] and node.spool is spool and not spool.orphaned:
                        continue
                self._queue.pop(spool, None)
                name = self._journal_names.pop(spool, None)
                settling.append((spool, node, self._done.pop(spool, None)))
                if error is None:
                    if name is not None:
                        names.append(name)
                else:
                    self.failed += 1
                    self._outcome[spool] = error
            self._made_room()
            if len(group) > 1:
                refused = sum(error is not None for error in errors)
                log.info("write-back: published %d file(s) as one group, %d refused", len(group) - refused, refused)
            await self._record_published(names)
        for spool, node, done in settling:
            # Not one accepted again meanwhile (queued anew while the journal was written).
            if node.handles == 0 and node.spool is spool and spool not in self._queue:
                await files.settle(node, spool)  # kept (with a log line) when its publication failed
                self._outcome.pop(spool, None)
                if node.handles == 0:
                    node.bound = None
                    files.tree.inodes.settled(node)
            if done is not None:
                done.set()
        if not self._queue:
            await self._reset_journal()

    async def _store_directories(self, changes: list) -> None:
        """Store a run of directory changes from the head of the queue (new markers as one group,
        namespace.set_directories_attributes), then record them published with one sync. One
        that is refused is logged: what it would have stored is a directory's attributes (an empty
        one's existence), never a file's bytes."""
        from nokvfs.workspace import namespace

        files, tree = self.files, self.files.tree
        self._storing.update(changes)
        try:
            try:
                outcomes = await files.workers.run(
                    namespace.set_directories_attributes, files.root, [c.item() for c in changes]
                )
            except Exception as exc:  # noqa: BLE001 - the whole run failed (a damaged or full shard)
                outcomes = [exc] * len(changes)
        finally:
            self._storing.difference_update(changes)
        names = []
        for change, outcome in zip(changes, outcomes):
            self._queue.pop(change, None)
            key = (change.incarnation, change.components)
            if self._directories.get(key) is change:
                del self._directories[key]
            names.append(change.name)
            if isinstance(outcome, Exception):
                self.failed += 1
                log.error(
                    "write-back: the attributes of directory %s (%s) could not be stored: %s: %s",
                    change.describe(),
                    change.changes,
                    type(outcome).__name__,
                    outcome,
                )
                continue
            self.published += 1
            tree.own(ChangeEventKind.PathPut, outcome.artifact_revision_id)
            tree.own(ChangeEventKind.PathAttributesChanged, outcome.artifact_revision_id)
            tree.overlay.published(change.incarnation, change.components + (attributes.DIRECTORY_MARKER,))
            node = tree.inodes.find(views.LIVE, change.incarnation, change.components)
            if node is not None:
                node.dir_ctime_ns = None  # the marker's times take over from the change shown
        self._made_room()
        await self._record_published(names)
        for change in changes:
            done = self._done.pop(change, None)
            if done is not None:
                done.set()
        if not self._queue:
            await self._reset_journal()

    async def _reset_journal(self) -> None:
        async with self._journal_lock:
            # Not while a failed publication's file is still open: its accepted bytes are only
            # in the journal until it is kept.
            if self._journal is not None and not self._queue and not self._accepting and not self._outcome:
                try:
                    await self.files.workers.run(self._journal.reset)
                except OSError as exc:
                    log.warning("write-back journal %s: %s", self._journal.path, exc)


GROUP_MAX = publish.GROUP_MAX  # files one group publication takes from the head of the queue


def _is_directory(item) -> bool:
    return isinstance(item[0], DirectoryChange)


def _groupable(spool, node) -> bool:
    """A file whose publication is a plain put of its spool (not an append, not attributes
    only, not given up), still the file's spool."""
    return node.spool is spool and spool.dirty and not spool.orphaned and spool.path is not None and not spool.appends


def _closing(spool) -> bool:
    """The last writer is gone: the spool file goes with the publication. An empty new or
    O_TRUNC-emptied file is published all the same (the default mode's release rule)."""
    return spool.writers == 0 and not spool.published_at_release


def publish_spools_blocking(root, items) -> list:
    """(worker thread, each spool locked) Publish (spool, attributes) items as one group, in
    order: per item the PathEntry, or the error that refused it."""
    results: list = [None] * len(items)
    pubs = []
    try:
        for index, (spool, stored) in enumerate(items):
            try:
                pubs.append((index, spool.publication_blocking(stored)))
            except Exception as exc:  # noqa: BLE001 - that file's error (its spool unreadable)
                results[index] = exc
        for (index, _), outcome in zip(pubs, publish.run_group(root, [pub for _, pub in pubs])):
            results[index] = outcome
    finally:
        for _, pub in pubs:
            pub.body.discard()
    return results


# --- after a crash ------------------------------------------------------------------------------


def replay(root, data_dir: str) -> tuple[int, int]:
    """At mount start: publish the pending spools a write-back daemon accepted and did not
    publish before it ended, oldest first, then store the directory changes it accepted (last, as
    the publisher would have: a directory's restored times are not overtaken by the files
    published below it). One that cannot be published (its path changed since, say) becomes a
    kept spool with the reason in its sidecar and a log line; a directory change that cannot be
    stored is logged. Returns (published, kept)."""
    _, directories, journals = restore_journals(data_dir)
    pending = [s for s in spools.scan(data_dir) if not s.live and s.record.get("state") == spools.PENDING]
    pending.sort(key=lambda s: (s.record.get("accepted_unix_ns") or 0, s.record.get("created_unix_ms") or 0))
    published = kept = 0
    for spool in pending:
        record = spool.record
        try:
            spools.retry(root, spool)
            published += 1
            log.info(
                "write-back: published %s:%s (%d bytes) accepted before the last daemon ended",
                record.get("workbench"),
                record.get("path"),
                spool.size,
            )
        except GenerationConflict as exc:
            if _already_published(root, spool):
                spools.discard(spool)  # the daemon ended after the publication, before dropping the spool
                published += 1
                continue
            kept += 1
            _keep(spool, f"write-back replay: the path changed since the bytes were accepted ({exc})")
        except Exception as exc:  # noqa: BLE001 - nothing accepted is dropped: it is kept and logged
            kept += 1
            _keep(spool, f"write-back replay failed: {type(exc).__name__}: {exc}")
    try:
        _replay_directories(root, directories)
    except Exception:
        log.exception("write-back replay: the accepted directory changes were not stored; journals kept: %s", journals)
        return published, kept
    for path in journals:
        os.unlink(path)
    return published, kept


def _replay_directories(root, changes: list) -> None:
    """Store the directory changes a dead daemon accepted (those of a workbench since replaced
    are not: the directory went with its incarnation)."""
    from nokvfs.workspace import namespace
    from nokvfs.workspace import workbench as wb

    items = []
    for meta in changes:
        with root.read() as view:
            try:
                _, workbench = wb.visible(view, root.root_id, meta["workbench"])
            except Exception as exc:  # noqa: BLE001 - logged below, with the change
                workbench, why = None, f"{type(exc).__name__}: {exc}"
            else:
                why = "the workbench was replaced since"
        if workbench is None or workbench.incarnation_id.hex() != meta["incarnation"]:
            log.error("write-back replay: directory %s:%s not stored (%s)", meta["workbench"], meta["path"], why)
            continue
        items.append((meta["workbench"], meta["path"], meta["changes"], meta["made_ns"], meta["changed_ns"]))
    for (workbench_id, path, _, _, _), outcome in zip(items, namespace.set_directories_attributes(root, items)):
        if isinstance(outcome, Exception):
            log.error(
                "write-back replay: directory %s:%s not stored (%s: %s)",
                workbench_id,
                path,
                type(outcome).__name__,
                outcome,
            )
        else:
            log.info("write-back: stored directory %s:%s accepted before the last daemon ended", workbench_id, path)


def _already_published(root, spool) -> bool:
    """Whether the path already holds exactly the spool's body (a complete body, not appended bytes)."""
    from nokvfs.schema import keys
    from nokvfs.schema.paths import normalize_path
    from nokvfs.schema.records import PathEntry
    from nokvfs.workspace import body as bodies
    from nokvfs.workspace import workbench as wb

    record = spool.record
    if record.get("append_only"):
        return False
    try:
        with root.read() as view:
            _, workbench = wb.visible(view, root.root_id, record["workbench"])
            raw = view.get(
                "path_current",
                keys.path_current_key(root.root_id, workbench.incarnation_id, normalize_path(record["path"])),
            )
        body = bodies.from_file(spool.path, root.block_size)
    except Exception:  # noqa: BLE001 - cannot tell: keep it
        return False
    if raw is None:
        return False
    entry = PathEntry.decode(raw)
    return entry.logical_size == body.size and entry.body_digest_uri == body.digest_uri


def _keep(spool, reason: str) -> None:
    spools.mark_kept(spool, reason)
    record = spool.record
    log.warning(
        "kept spool %s (%s:%s, %d bytes): %s -- `nokvfs spool retry|discard %s`",
        spool.id,
        record.get("workbench"),
        record.get("path"),
        spool.size,
        reason,
        spool.id,
    )
