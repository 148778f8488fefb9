"""Files in the mount: open, create, read, write, flush, fsync, release, setattr, unlink, rename,
symlink and readlink -- the rules a local filesystem keeps, over revisions and one spool per file.

Readers. A descriptor reads the revision its inode shows (`Node.bound`, fixed while any
descriptor is open), to the end, whatever another process publishes or removes at the path
meanwhile: the path gets a fresh inode then (nokvfs.fs.tree). Within this mount every descriptor
of a file shares the file's spool once one of them writes, so reads see every write of the mount
(POSIX coherence), exactly as on a local disk.

Writers. All descriptors of a file share one Spool (nokvfs.fs.spools). A dirty spool is published
at flush (every close(2)) and fsync, so close(2) reports a publication's error: EBUSY when
something outside this mount changed the path since this mount last saw it (EEXIST when this
mount was creating it), ENOSPC for a full store, EIO for a failing one. Publications expect the
exact revision this mount last saw (or its absence), so nothing a single process does through one
mount with ordinary calls conflicts with itself. One exception to "at flush": a file created, or
emptied by an O_TRUNC open, and not written since is published when its last descriptor is
released -- the shell's `echo x > f` closes a dup of the new descriptor before it writes, and
publishing an empty revision there would cost a second publication (and a revision in history)
for nothing; every other open of the file meanwhile joins the same spool. A publication that
fails keeps its spool (described by its sidecar) for `nokvfs spool retry|discard` once its last
descriptor is closed.

Attributes. chmod, chown and utime of a file with unpublished bytes (a new file, or a dirty
spool) are published with those bytes; otherwise they are one metadata-only command at once.
truncate(2) of a file nobody here writes publishes the truncated body at once.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import time

from nokvfs.errors import GenerationConflict, NotFound
from nokvfs.fs import names
from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import Kind, Node
from nokvfs.fs.prefetch import Stream
from nokvfs.fs.retries import OpenRetries
from nokvfs.fs.spools import Spool
from nokvfs.meters import Meters
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.workspace import attributes, namespace

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_ATTRIBUTE_FIELDS = ("mode", "uid", "gid", "mtime_ns", "atime_ns")
KEEP_PUBLISHED_MAX = 256 * 1024  # a published file this small stays in the fetcher's memory


class FileHandle:
    """One open(2) of a file: its node, how it was opened, and its read pattern."""

    __slots__ = ("fh", "node", "writable", "append", "stream")

    def __init__(self, fh: int, node: Node, *, writable: bool, append: bool):
        self.fh = fh
        self.node = node
        self.writable = writable
        self.append = append
        self.stream = Stream()


class Files:
    def __init__(self, tree, fetcher, *, owner: dict | None = None):
        self.tree = tree
        self.fetcher = fetcher
        self.root = tree.root
        self.workers = tree.workers
        self._owner = owner or {"pid": os.getpid()}
        # `--sync`: ship(lsn, timeout) blocks until the bucket holds the increment with that LSN
        # (nokvfs.fs.replication.Replication.wait_shipped); None: a publication is done once it
        # is durable on this machine.
        self.ship = None
        # Counts and latencies of reads, writes and publications (`nokvfs status`, metrics).
        self.meters = Meters()
        # `--write-back`: a nokvfs.fs.writeback.Publisher; close(2) then accepts (durable here)
        # and the publisher publishes. None: close(2) publishes.
        self.writeback = None
        # Callers whose open(2) was answered ESTALE, and what the kernel's retry of it may read.
        self.retries = OpenRetries()

    # --- opening -----------------------------------------------------------------------------------

    async def open(self, fh: int, node: Node, flags: int, pid: int | None = None) -> tuple[FileHandle, bool]:
        """A handle for open(2) of a file by the kernel task `pid`, and whether the kernel may keep
        its page cache."""
        tree = self.tree
        retry = self.retries.take(pid, node.ino)
        if node.kind.is_dir:
            raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
        if node.kind is Kind.LINK:
            raise refuse(errno.ELOOP, f"{node.describe()} is a symbolic link")
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        if writing or flags & os.O_TRUNC:
            tree.check_writable(f"open {node.describe()} for writing", node)
            names.check_publishable(self.root, node, node.components)
        if node.spool is None or not node.spool.dirty:
            # Nothing unpublished here: the open reads the path's revision (ESTALE if another
            # process replaced it, even while this mount still holds the file's write state).
            self._entry_to_open(node, writing, pid, retry)
        # An inode only ever holds one revision's bytes (or this mount's own, published as its
        # next revision): its page cache is always right.
        keep_cache = True
        handle = FileHandle(fh, node, writable=writing, append=bool(flags & os.O_APPEND))
        if writing:
            spool = node.spool
            if spool is None:
                spool = node.spool = self._new_spool(node, node.bound)
                if handle.append:
                    spool.start_appending()
            spool.writers += 1
            if flags & os.O_TRUNC:  # libfuse negotiates atomic O_TRUNC: the flag arrives here
                await self._holding(f"open(O_TRUNC) of {spool.describe()}", spool, _now(spool.truncated_on_open))
        node.handles += 1
        node.open_count += 1
        return handle, keep_cache

    def _entry_to_open(self, node: Node, writing: bool, pid: int | None = None, retry=None):
        """The revision an open of a node without a spool reads: the node's own. ESTALE when the
        path holds another one now (or nothing): the kernel then looks the path up again, and the
        lookup hands it the path's current inode. `retry`: what that lookup showed when this open
        is the kernel's retry (nokvfs.fs.retries): a reader reads it, though the path moved on."""
        tree = self.tree
        if node.detached:
            if node.handles and node.bound is not None and not writing:
                return node.bound  # reopened through /proc/PID/fd: the same file
            return self._retried(node, writing, pid, retry, f"{node.describe()} was replaced or removed")
        entry = tree.current_entry(node)
        if entry is None or not node.shows(entry):
            tree.detach(node)
            return self._retried(
                node, writing, pid, retry, f"{node.describe()} was replaced or removed: look it up again"
            )
        tree.learn(node, entry)
        if node.bound is None:
            node.bound = entry
        return node.bound

    def _retried(self, node: Node, writing: bool, pid: int | None, retry, why: str):
        if retry is not None and not writing and node.shows(retry):
            if node.bound is None:
                node.bound = retry
            if node.bound.artifact_revision_id == retry.artifact_revision_id:
                return node.bound
        self.retries.refused(pid)
        raise refuse(errno.ESTALE, why)

    def _new_spool(self, node: Node, base) -> Spool:
        # The write-back publisher publishes in groups (publish.run_group), whose blocks go in one
        # store batch that does not take blocks staged ahead: staging them would write every byte
        # once more for nothing. Decided at construction: the spool's running hash calls the stager.
        return Spool(
            self.root,
            workbench_id=node.workbench_id,
            incarnation=node.incarnation,
            components=node.components,
            base=base,
            owner=self._owner,
            stage=self.writeback is None,
            write_behind=self.writeback is not None,  # synced when its close is accepted
        )

    async def create(self, fh: int, parent: Node, name: str, flags: int, mode: int, uid: int, gid: int) -> FileHandle:
        """open(O_CREAT): a new file, pending in the overlay until its first publication."""
        tree = self.tree
        tree.check_writable(f"create {name}", parent)
        names.check_entry_parent(parent, f"create {name}")
        components = parent.components + (name,)
        names.check_publishable(self.root, parent, components)
        existing = tree.lookup_to_create(parent, name)
        if existing is not None and existing.kind.is_dir:
            raise refuse(errno.EISDIR, f"{existing.describe()} is a directory")
        if existing is not None:
            if flags & os.O_EXCL:
                raise refuse(errno.EEXIST, f"{existing.describe()} exists")
            handle, _ = await self.open(fh, existing, flags)
            return handle
        stale = tree.inodes.find(parent.view, parent.incarnation, components)
        if stale is not None:
            tree.detach(stale, parent=parent)  # a new file is a new inode
        node = tree.child(parent, Kind.FILE, name)
        node.unlearn()
        node.bound = None
        spool = node.spool = self._new_spool(node, None)
        spool.attributes = {"mode": mode & 0o7777, "uid": uid, "gid": gid}
        spool.writers += 1
        tree.overlay.add_file(node.incarnation, components, node)
        tree.directory_changed(parent.incarnation, parent.components, spool.mtime_ns)
        handle = FileHandle(fh, node, writable=True, append=bool(flags & os.O_APPEND))
        node.handles += 1
        node.open_count += 1
        return handle

    # --- bytes ---------------------------------------------------------------------------------

    async def read(self, handle: FileHandle, offset: int, size: int) -> bytes:
        with self.meters["read"].timing():
            return await self._read(handle, offset, size)

    async def _read(self, handle: FileHandle, offset: int, size: int) -> bytes:
        node = handle.node
        spool = node.spool
        if spool is not None:
            return await self._read_spool(spool, offset, size, handle.stream)
        entry = node.bound
        if entry is None:
            return b""
        return await self.workers.bounded(
            f"read of {node.describe()}", self.fetcher.read, entry, offset, size, handle.stream
        )

    async def _read_spool(self, spool: Spool, offset: int, size: int, stream) -> bytes:
        """The bytes of the file as this mount has written it: its spool, and its base revision
        where the spool holds nothing yet."""
        if spool.filled and not spool.append_only:
            return spool.pread(offset, size)  # publications only read the spool: no lock needed
        # Not while it is being filled.
        return await self._holding(f"read of {spool.describe()}", spool, self._read_held, spool, offset, size, stream)

    async def _read_held(self, spool: Spool, offset: int, size: int, stream) -> bytes:
        """(spool locked) The spool's bytes, and its base revision's where it holds none yet."""
        size = max(0, min(size, spool.size - offset))
        if size == 0 or spool.closed:
            return b""
        if spool.filled:
            return spool.pread(offset, size)
        if not spool.append_only:
            return await self.workers.bounded("read", self.fetcher.read, spool.base, offset, size, stream)
        split = spool.base.logical_size
        head = (
            b""
            if offset >= split
            else await self.workers.bounded(
                "read", self.fetcher.read, spool.base, offset, min(size, split - offset), stream
            )
        )
        tail = (
            b""
            if offset + size <= split
            else os.pread(spool.fd, offset + size - max(offset, split), max(offset, split) - split)
        )
        return b"".join((head, tail))

    async def write(self, handle: FileHandle, offset: int, data) -> int:
        with self.meters["write"].timing():
            return await self._write(handle, offset, data)

    async def _write(self, handle: FileHandle, offset: int, data) -> int:
        if not handle.writable:
            raise refuse(errno.EBADF, f"write on a descriptor of {handle.node.describe()} not opened for writing")
        spool = handle.node.spool
        await self._holding(
            f"write to {spool.describe()}",
            spool,
            self._write_held,
            spool,
            offset,
            data,
            cheap=not spool.needs_fill_for_write(offset),
        )
        return len(data)

    async def _write_held(self, spool: Spool, offset: int, data) -> None:
        """(spool locked) Fill the spool from its base when the write needs it, then write."""
        if spool.needs_fill_for_write(offset):
            await self.workers.run(spool.fill_blocking)
        spool.write(offset, data)
        if spool.attributes is not None:  # a write sets the modification time again
            spool.attributes.pop("mtime_ns", None)

    async def _holding(self, what: str, spool: Spool, async_fn, *args, cheap: bool = True):
        """async_fn(*args) with the spool's lock, within the syscall deadline.

        The lock is taken in this call's turn and released by the work when it ends, never by a
        syscall that gave up waiting: a publication (or a fill, a truncate) whose close(2) answered
        EIO keeps the spool to itself until it ends, so no write lands in a spool that its end
        marks published, and no second publication of the same bytes races it. A `cheap` call
        (no I/O, or I/O it bounds itself) runs in this task. The deadline counts only time in
        which the spool's work made no progress (a large file stored at a healthy pace is not an
        error; a store that stops answering is).
        """
        return await self.workers.bounded_holding(
            what, spool.lock, async_fn, *args, inline=cheap, progress=lambda: spool.progress
        )

    # --- publication -------------------------------------------------------------------------------

    async def flush(self, handle: FileHandle) -> None:
        if handle.writable:
            if self.writeback is not None:
                await self.writeback.accept(handle.node)
                return
            await self.publish(handle.node, why="publication at close", closing=True)

    async def fsync(self, handle: FileHandle) -> None:
        if handle.writable or handle.node.spool is not None:
            if self.writeback is not None:
                await self.writeback.wait_published(handle.node)
                return
            await self.publish(handle.node, why="publication at fsync")

    async def sync_directory(self, node: Node) -> None:
        """fsync(2) of a directory. Its entries are durable on this machine when each call that
        made them returned (a command, or a synced write-back journal record), so there is
        nothing to wait for, except where the durability boundary is further: in write-back mode
        with `--sync` what the publisher has not stored yet, and with `--sync` the bucket, which
        receives a rename, unlink or mkdir only with a later publication. Waits for both then, for
        the whole mount (which entries are the directory's is not worth telling apart)."""
        if self.ship is None:
            return
        if self.writeback is not None:
            await self.writeback.wait_settled_all(f"the write-back publications before fsync of {node.describe()}")
        else:
            await self._publications_settled(node)
        lsn = self.root.shard.recovery_tail.applied_lsn
        await self.workers.bounded(
            f"shipping before fsync of {node.describe()}",
            self.workers.run,
            self.ship,
            lsn,
            self.workers.syscall_timeout,
        )

    async def _publications_settled(self, directory: Node) -> None:
        """Before a directory's fsync ships: a publication under way has committed (each holds
        its spool's lock), and a file created or emptied by O_TRUNC and closed without a write is
        published now -- its RELEASE, which would publish it, comes after close(2) returned and
        may come after this fsync. A file still being written is not published: only waited on."""
        for other in self.tree.inodes.with_spools():
            spool = other.spool
            if spool is None or spool.orphaned or spool.closed:
                continue
            if spool.dirty and spool.published_at_release:
                await self._holding(
                    f"publication of {spool.describe()} at fsync of {directory.describe()}",
                    spool,
                    self._publish_held,
                    other,
                    spool,
                    "publication at fsync of a directory",
                    False,
                    cheap=False,
                )
            else:
                await self._holding(f"fsync of {directory.describe()}", spool, _settled)

    async def publish(self, node: Node, *, why: str, closing: bool = False, deadline: bool = True) -> None:
        """Publish the node's spool if it holds anything unpublished (bytes or attributes);
        within the syscall deadline unless `deadline` is False (the write-back publisher, which
        no syscall waits on directly: its outcome must be the publication's own)."""
        spool = node.spool
        if spool is None:
            return
        if deadline:
            await self._holding(
                f"{why} of {spool.describe()}", spool, self._publish_held, node, spool, why, closing, cheap=False
            )
        else:
            async with spool.locked():
                await self._publish_held(node, spool, why, closing)
        if self.ship is not None:
            # --sync: close(2) returns once the increment holding the publication is in the
            # bucket (an error here leaves it published on this machine, shipped later).
            lsn = self.root.shard.recovery_tail.applied_lsn
            timeout = self.workers.syscall_timeout
            if deadline:
                await self.workers.bounded(f"shipping {spool.describe()}", self.workers.run, self.ship, lsn, timeout)
            else:
                await self.workers.run(self.ship, lsn, timeout)

    async def _publish_held(self, node: Node, spool: Spool, why: str, closing: bool) -> None:
        """(spool locked) Publish what the spool holds unpublished, if anything."""
        if spool.orphaned or spool.closed or node.spool is not spool:
            return  # unlinked, or settled while this waited for the lock
        if not spool.dirty:
            if spool.attributes:
                await self._apply_attributes(node, spool.attributes)
                spool.attributes = None
            return
        if closing and spool.published_at_release:
            return  # an empty new or O_TRUNC-emptied file is published at release (module docstring)
        await self._publish_locked(node, spool, why, closing and spool.writers <= 1)

    async def _publish_locked(self, node: Node, spool: Spool, why: str, last_close: bool = False) -> None:
        stored, started = self._publication_starts(node, spool)
        appending = spool.append_only and spool.base is not None and spool.size > spool.base.logical_size
        try:
            entry, published, stamp = await self.workers.run(self._publish_blocking, spool, stored, appending)
        except Exception as exc:
            error = self._publication_failed(node, spool, why, exc, started)
            if error is exc:
                raise
            raise error from None
        if published is not None:
            self.fetcher.keep_published(entry, published)
        self._publication_done(node, spool, entry, started, appending=appending, last_close=last_close)
        self.tree.keep_published(node, entry, stamp, spool.components)

    def _publish_blocking(self, spool: Spool, stored, appending: bool):
        """Publish the spool; (the PathEntry, a small file's bytes as published or None, and the
        shard's change stamp after this thread's last commit: the publication's, normally)."""
        # The default mode's first stat after a write drops the file's pages (see the README's
        # Known limits): the bytes the next read asks for are kept, read under the spool's lock.
        published = None if appending else spool.whole_body(KEEP_PUBLISHED_MAX)
        entry, stamp = self.root.shard.own_commits.committing(spool.publish_blocking, stored)
        return entry, published, stamp

    async def publish_group(self, nodes: list, why: str, last_closes: list) -> list:
        """Publish the spools of several nodes with group commit (nokvfs.workspace.publish
        .run_group), in order; the caller holds each spool's lock and passes only spools a
        plain put publishes (dirty, not appended to). Per node: None, or the error its
        publication raised (already logged with its spool, as `_publish_locked` does)."""
        from nokvfs.fs.writeback import publish_spools_blocking

        prepared = [(node, node.spool, *self._publication_starts(node, node.spool)) for node in nodes]
        stamp = None
        try:
            # The stamp after the group's last commit: that of the last part's publications,
            # which keep_published keeps; an earlier part's entries are read at their next open.
            results, stamp = await self.workers.run(
                self.root.shard.own_commits.committing,
                publish_spools_blocking,
                self.root,
                [(spool, stored) for _, spool, stored, _ in prepared],
            )
        except Exception as exc:  # noqa: BLE001 - the whole group failed (a damaged or full shard)
            results = [exc] * len(prepared)
        # A path published twice in one group: which entry its row holds is not this loop's to say.
        paths = collections.Counter(spool.components for _, spool, _, _ in prepared)
        errors = []
        for (node, spool, _, started), result, last_close in zip(prepared, results, last_closes):
            if isinstance(result, Exception):
                errors.append(self._publication_failed(node, spool, why, result, started))
            else:
                self._publication_done(node, spool, result, started, appending=False, last_close=last_close)
                if paths[spool.components] == 1:
                    self.tree.keep_published(node, result, stamp, spool.components)
                errors.append(None)
        if self.ship is not None and None in errors:
            # --sync: the group is done once the increment holding its last publication is in
            # the bucket; a failure to ship is each published file's error, as in `publish`.
            lsn = self.root.shard.recovery_tail.applied_lsn
            try:
                await self.workers.run(self.ship, lsn, self.workers.syscall_timeout)
            except Exception as exc:  # noqa: BLE001 - reported per file (fsync)
                errors = [exc if error is None else error for error in errors]
        return errors

    def _publication_starts(self, node: Node, spool: Spool):
        """(the attributes the publication stores, when it started)"""
        stored = self.attributes_to_publish(node, spool)
        self.tree.begin_change(spool.incarnation, spool.components)
        return stored, time.monotonic()

    def _publication_failed(self, node: Node, spool: Spool, why: str, exc: Exception, started: float) -> Exception:
        """Log a failed publication (nothing is lost: the spool keeps the bytes); the error the
        syscall reports (a conflict as EEXIST or EBUSY)."""
        tree = self.tree
        self.meters["publication"].record(time.monotonic() - started, exc)
        tree.end_change(spool.incarnation, spool.components)
        spool.failed = exc
        spool.describe_state("live", f"{type(exc).__name__}: {exc}")
        log.error(
            "%s of %s failed (%s: %s); nothing is lost: the bytes are kept in %s (described in %s)",
            why,
            spool.describe(),
            type(exc).__name__,
            exc,
            spool.path,
            spool.sidecar,
        )
        tree.invalidator.inode(node.ino)  # its pages hold bytes that were not published
        if isinstance(exc, GenerationConflict):
            # Something outside this mount changed the path since the mount last saw it.
            return refuse(errno.EEXIST if spool.expected_revision is None else errno.EBUSY, str(exc))
        return exc

    def _publication_done(
        self, node: Node, spool: Spool, entry, started: float, *, appending: bool, last_close: bool
    ) -> None:
        tree = self.tree
        components = spool.components
        kind = ChangeEventKind.PathAppended if appending else ChangeEventKind.PathPut
        tree.own(kind, entry.artifact_revision_id)
        tree.end_change(spool.incarnation, components)
        self.meters["publication"].record(time.monotonic() - started)
        # The last writer's close: nothing unpublished is left to keep, so the spool file goes
        # now (a later write through a descriptor still open makes a new one).
        spool.published(entry, drop_file=last_close)
        if node.components == components and not node.detached:
            # The inode's next revision: the kernel's pages of it are exactly the bytes published.
            node.learn(entry)
            node.bound = entry
        tree.overlay.published(spool.incarnation, components)
        tree.directory_changed(spool.incarnation, components[:-1], node.facts.ctime_ns if node.facts else None)
        log.debug("published %s generation %d (%d bytes)", spool.describe(), entry.generation, entry.logical_size)

    def attributes_to_publish(self, node: Node, spool: Spool):
        """The Attributes a publication of the spool stores: the file's, with what was changed."""
        base = node.facts
        pending = spool.attributes or {}
        now = attributes.now_ns()
        mtime = pending.get("mtime_ns", spool.mtime_ns if spool.written or base is None else base.mtime_ns)
        if spool.accepted_ns is not None:  # write-back: changed when accepted, never before the last revision
            now = spool.accepted_ns if base is None else max(spool.accepted_ns, base.ctime_ns)
        return attributes.Attributes(
            mode=pending.get("mode", attributes.FILE_MODE if base is None else base.mode),
            uid=pending.get("uid", None if base is None else base.uid),
            gid=pending.get("gid", None if base is None else base.gid),
            mtime_ns=mtime,
            atime_ns=pending.get("atime_ns", mtime if base is None or spool.written else base.atime_ns),
            ctime_ns=now,
        )

    async def release(self, handle: FileHandle) -> None:
        tree = self.tree
        node = handle.node
        node.handles = max(0, node.handles - 1)
        spool = node.spool
        if handle.writable and spool is not None:
            spool.writers = max(0, spool.writers - 1)
            if self.writeback is not None:
                self.writeback.writer_released(spool)
        try:
            if (
                spool is not None
                and node.handles == 0
                and self.writeback is not None
                and await self.writeback.accept_at_release(node)
            ):
                pass  # the publisher publishes it, then settles it
            elif spool is not None and node.handles == 0:
                if spool.dirty and not spool.orphaned and spool.failed is None:
                    try:
                        await self.publish(node, why="publication at release")
                    except Exception:  # noqa: BLE001 - already logged with the spool's path
                        pass
                await self.settle(node, spool)
        finally:
            # Also when a write-back acceptance gave up (EIO): the handle is gone all the same;
            # the unaccepted spool stays the file's, for its next close or the next mount.
            if node.handles == 0:
                node.bound = None
            tree.inodes.closed(node)

    async def settle(self, node: Node, spool: Spool) -> None:
        """The last descriptor is gone: drop a published spool, keep an unpublished one."""
        tree = self.tree
        async with spool.locked():
            if node.spool is not spool or node.handles:
                return  # another descriptor opened the file meanwhile: the spool is still in use
            node.spool = None
            if tree.overlay.pending(spool.incarnation, spool.components) is node:
                # Created here and never published: the name goes away with its last descriptor.
                tree.overlay.remove_file(spool.incarnation, spool.components)
                tree.detach(node)
            elif spool.dirty:
                # Its bytes were not published: the path shows what is durable, on a fresh inode.
                tree.invalidator.inode(node.ino)
                tree.detach(node)
            if spool.dirty and not spool.orphaned:
                reason = (
                    "its publication failed"
                    if spool.failed is None
                    else f"{type(spool.failed).__name__}: {spool.failed}"
                )
                spool.keep(reason)
                log.warning(
                    "unpublished bytes of %s are kept in %s (`nokvfs spool list`)", spool.describe(), spool.path
                )
            else:
                spool.close(remove=True)

    # --- attributes and size -----------------------------------------------------------------------

    async def setattr(self, node: Node, changes: dict, size: int | None, handle: FileHandle | None) -> None:
        """truncate(2)/ftruncate(2) and chmod/chown/utime of a file or link."""
        if size is not None:
            await self.truncate(node, size, handle)
        if not changes:
            return
        spool = node.spool
        if spool is not None and (spool.dirty or spool.base is None or spool.orphaned):
            if await self._holding(f"setattr of {spool.describe()}", spool, _now(_attributes_to_spool, spool, changes)):
                return
        if node.detached:
            # Removed or renamed over: the file lives on only for its open descriptors (and the
            # kernel's cache of it, whose times the writeback cache flushes at a reader's close).
            # As on a local disk its attributes change for them; no path holds it to store them.
            node.facts = changed_facts(node.facts, changes)
            return
        await self._apply_attributes(node, changes)

    async def _apply_attributes(self, node: Node, changes: dict) -> None:
        """One metadata-only command: no upload, no new revision."""
        tree = self.tree
        expected = node.revision
        tree.begin_change(node.incarnation, node.components)
        try:
            entry = await self.workers.bounded(
                f"attributes of {node.describe()}",
                self.workers.run,
                lambda: namespace.set_attributes(
                    self.root, node.workbench_id, node.path, expected_revision_id=expected, **changes
                ),
            )
        except (GenerationConflict, NotFound):
            # Another process replaced or removed the path since this inode was looked up: the
            # change applies to the file this inode is (as if it came just before), now nameless.
            tree.detach(node)
            node.facts = changed_facts(node.facts, changes)
            return
        finally:
            tree.end_change(node.incarnation, node.components)
        tree.own(ChangeEventKind.PathAttributesChanged, entry.artifact_revision_id)
        node.learn(entry)
        if node.bound is not None:
            node.bound = entry
        if node.spool is not None and not node.spool.dirty:
            node.spool.base = entry

    async def truncate(self, node: Node, size: int, handle: FileHandle | None) -> None:
        tree = self.tree
        if node.kind.is_dir:
            raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
        if node.kind is Kind.LINK:
            raise refuse(errno.EINVAL, f"{node.describe()} is a symbolic link")
        tree.check_writable(f"truncate {node.describe()}", node)
        names.check_publishable(self.root, node, node.components)
        while (spool := node.spool) is not None:
            if await self._holding(
                f"truncate of {spool.describe()}", spool, self._truncate_held, node, spool, size, cheap=False
            ):
                return
            # Its last descriptor's release settled the spool while this waited: as below.
        # truncate(2) of a file nobody here has open: publish the truncated body now.
        entry = tree.current_entry(node)
        if entry is None:
            raise refuse(errno.ENOENT, f"{node.describe()} does not exist")
        if not node.shows(entry):
            tree.detach(node)
            raise refuse(errno.ESTALE, f"{node.describe()} was replaced: look it up again")
        if entry.logical_size == size:
            return
        node.learn(entry)
        spool = node.spool = self._new_spool(node, entry)
        try:
            await self._holding(
                f"truncate of {spool.describe()}", spool, self._truncate_held, node, spool, size, cheap=False
            )
        finally:
            await self.settle(node, spool)

    async def _truncate_held(self, node: Node, spool: Spool, size: int) -> bool:
        """(spool locked) Set the spool's size (which sets the modification time) and, when nobody
        has the file open for writing, publish it in the same hold: a release settling the spool
        in between would keep it as unpublished. False: the spool was settled meanwhile."""
        if node.spool is not spool or spool.closed:
            return False
        await self.workers.run(spool.truncate_blocking, size)
        if spool.attributes is not None:
            spool.attributes.pop("mtime_ns", None)
        if spool.writers == 0:
            await self._publish_held(node, spool, "truncate", closing=False)  # nobody will close it
        return True

    # --- names -------------------------------------------------------------------------------------

    async def quiesce(self, *nodes) -> None:
        """Wait for publications in flight on these nodes (a release publishes after close(2)
        returned, so the application's next rename or unlink can overtake it) -- in write-back
        mode for their accepted publications too, so the rename or unlink applies to what is
        published and no later replay can bring back what it moved or removed."""
        for node in nodes:
            spool = getattr(node, "spool", None)
            if spool is not None:
                if self.writeback is not None:
                    await self.writeback.wait_settled(f"the write-back publication of {spool.describe()}", spool)
                await self._holding(f"publication of {spool.describe()}", spool, _now(lambda: None))

    def _moves_in_journal(self, source, target) -> bool:
        """Write-back: whether rename(2) of `source` over `target` (or unlink(2) of `source`,
        target None) changes the journal instead of waiting for publications: `source` was
        created in this mount, accepted at close and its publication has not started, and no
        publication holds `target`."""
        if self.writeback is None or source is None or source.kind.is_dir or not self.writeback.movable(source):
            return False
        if target is None or target is source:
            return True
        return not target.kind.is_dir and (target.spool is None or target.spool.lock.value == 1)

    async def unlink(self, parent: Node, name: str, directories) -> None:
        tree = self.tree
        if parent.kind in (Kind.ROOT, Kind.WORKBENCH):
            if tree.lookup(parent, name) is None:
                raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
            raise refuse(errno.EPERM, f"{parent.describe()}/{name} is a workbench or a section")
        tree.check_writable(f"unlink {name}", parent)
        if not self._moves_in_journal(tree.lookup(parent, name), None):
            await self.quiesce(tree.lookup(parent, name))
        node = tree.lookup(parent, name)
        if node is None:
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
        if node.kind.is_dir:
            raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
        names.check_publishable(self.root, node, node.components)
        pending = tree.overlay.pending(node.incarnation, node.components) is node
        with tree.view.read() as v:
            durable = tree.view.entry(v, node.incarnation, node.components) is not None
        if self._moves_in_journal(node, None):
            if not durable:
                # Accepted at close, not published: its acceptance is ended in the journal (one
                # synced record) instead of waiting for its publication.
                await self.writeback.journal_unlink(node, lambda: self._unlinked(parent, node))
                return
            await self.quiesce(node)  # something outside this mount made the path meanwhile
        if durable:
            await directories.keep(parent, name)
            tree.begin_change(node.incarnation, node.components)
            try:
                removed = await self.workers.bounded(
                    f"unlink of {node.describe()}",
                    self.workers.run,
                    namespace.remove,
                    self.root,
                    node.workbench_id,
                    node.path,
                )
                tree.own(ChangeEventKind.PathRemoved, removed.artifact_revision_id)
            finally:
                tree.end_change(node.incarnation, node.components)
        elif not pending:
            raise refuse(errno.ENOENT, f"{node.describe()} does not exist")
        self._unlinked(parent, node)

    def _unlinked(self, parent: Node, node: Node) -> None:
        """The mount's side of an unlink (no awaits: it happens at once)."""
        tree = self.tree
        tree.overlay.remove_file(node.incarnation, node.components)
        if node.spool is not None:
            node.spool.orphan()  # POSIX: bytes written to an unlinked file vanish with it
        tree.overlay.add_dir(node.incarnation, node.components[:-1])
        tree.directory_changed(parent.incarnation, parent.components, time.time_ns())
        tree.inodes.detach(node)

    async def rename(
        self, old_parent: Node, old_name: str, new_parent: Node, new_name: str, flags: int, directories
    ) -> None:
        tree = self.tree
        for parent in (old_parent, new_parent):
            if parent.view != names.LIVE or parent.kind is Kind.HISTORY:
                raise refuse(errno.EROFS, f"rename in {parent.describe()}: views are read-only")
        for parent in (old_parent, new_parent):
            if parent.kind in (Kind.ROOT, Kind.WORKBENCH):
                raise refuse(
                    errno.EPERM, f"entries of {parent.describe()} (workbenches, sections) cannot be renamed or replaced"
                )
        tree.check_writable("rename")
        if (old_parent.view, old_parent.workbench_id, old_parent.incarnation) != (
            new_parent.view,
            new_parent.workbench_id,
            new_parent.incarnation,
        ):
            raise refuse(
                errno.EXDEV, f"rename from {old_parent.describe()} to {new_parent.describe()} crosses workbenches"
            )
        if flags & RENAME_EXCHANGE:
            raise refuse(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        replace = not flags & RENAME_NOREPLACE
        src = old_parent.components + (old_name,)
        dst = new_parent.components + (new_name,)
        if src == dst:
            return
        names.check_publishable(self.root, old_parent, src)
        names.check_publishable(self.root, new_parent, dst)
        if dst[: len(src)] == src:
            raise refuse(errno.EINVAL, "cannot move a directory into itself")
        if not self._moves_in_journal(tree.lookup(old_parent, old_name), tree.lookup(new_parent, new_name)):
            await self.quiesce(tree.lookup(old_parent, old_name), tree.lookup(new_parent, new_name))
        source = tree.lookup(old_parent, old_name)
        if source is None:
            raise refuse(errno.ENOENT, f"{old_parent.describe()}/{old_name} does not exist")
        target = tree.lookup(new_parent, new_name)
        if target is not None and not replace:
            raise refuse(errno.EEXIST, f"{target.describe()} exists")
        incarnation = old_parent.incarnation
        if source.kind.is_dir and self.writeback is not None:
            # Accepted files below move as published ones. First: a wait that gives up (EIO)
            # leaves nothing changed, not even the old parent's marker below.
            await self.writeback.wait_settled_all(f"the write-back publications before rename of {source.describe()}")
        if old_parent.components != new_parent.components:
            await directories.keep(old_parent, old_name)
        if source.kind.is_dir:
            await directories.rename_dir(source, target, dst)
            return
        if target is not None and target.kind.is_dir:
            raise refuse(errno.EISDIR, f"{target.describe()} is a directory")
        journaled = self._moves_in_journal(source, target)
        if not journaled and self.writeback is not None:
            await self.quiesce(source, target)  # the publisher took one while a marker was kept
        with tree.view.read() as v:
            durable = tree.view.entry(v, incarnation, src) is not None
            target_entry = tree.view.entry(v, incarnation, dst)
        if journaled and durable:  # something outside this mount made the path meanwhile
            await self.quiesce(source, target)
        expected = None if target_entry is None else target_entry.artifact_revision_id
        if journaled and not durable:
            # Accepted at close, not published: the journal moves it (one synced record), so
            # tools that save through a temporary (git, pip, rsync, editors) do not wait for
            # the publisher; it publishes the bytes at their new name.
            await self.writeback.journal_rename(
                source,
                dst,
                expected,
                target,
                lambda: self._renamed(source, target, src, dst, durable=False, expected=expected),
            )
            return
        moved = None
        if durable:
            tree.begin_change(incarnation, src, dst)
            try:
                moved = await self.workers.bounded(
                    f"rename of {source.describe()}",
                    self.workers.run,
                    lambda: namespace.rename(
                        self.root, source.workbench_id, "/".join(src), "/".join(dst), replace=replace
                    ),
                )
                tree.own(ChangeEventKind.PathRenamed, moved.artifact_revision_id)
            except GenerationConflict:
                raise refuse(errno.EEXIST, f"{new_parent.describe()}/{new_name} exists") from None
            finally:
                tree.end_change(incarnation, src, dst)
            source.learn(moved)
            if source.bound is not None:
                source.bound = moved
            tree.overlay.published(incarnation, dst)
        self._renamed(source, target, src, dst, durable=durable, expected=expected, moved=moved)

    def _renamed(self, source: Node, target, src: tuple, dst: tuple, *, durable: bool, expected, moved=None) -> None:
        """The mount's side of a file rename (no awaits: it happens at once): the inode, the
        spool, the overlay and the parents' times."""
        tree = self.tree
        incarnation = source.incarnation
        if not durable:
            # A file created here and not yet published: it will be published at its new name,
            # replacing what the mount saw there.
            tree.overlay.remove_file(incarnation, src)
            if source.spool is not None:
                source.spool.expected_revision = expected
        if target is not None and target is not source:
            if target.spool is not None:
                target.spool.orphan()
            if tree.overlay.pending(incarnation, dst) is target:
                tree.overlay.remove_file(incarnation, dst)
        tree.inodes.move(source, dst)
        if source.spool is not None:
            if durable and source.spool.base is not None:
                source.spool.base = moved
            source.spool.moved(dst)
        if not durable:
            tree.overlay.add_file(incarnation, dst, source)
        tree.overlay.add_dir(incarnation, src[:-1])
        now = time.time_ns()
        tree.directory_changed(incarnation, src[:-1], now)
        tree.directory_changed(incarnation, dst[:-1], now)

    # --- links -------------------------------------------------------------------------------------

    async def symlink(self, parent: Node, name: str, target: bytes, uid: int, gid: int) -> Node:
        tree = self.tree
        tree.check_writable(f"symlink {name}", parent)
        names.check_entry_parent(parent, f"symlink {name}")
        components = parent.components + (name,)
        names.check_publishable(self.root, parent, components)
        if len(target) > attributes.MAX_LINK_TARGET:
            raise refuse(
                errno.ENAMETOOLONG, f"a link target of {len(target)} bytes is longer than {attributes.MAX_LINK_TARGET}"
            )
        try:
            text = target.decode("utf-8")
        except UnicodeDecodeError:
            raise refuse(errno.EINVAL, f"link target {target!r} is not UTF-8") from None
        if tree.lookup(parent, name) is not None:
            raise refuse(errno.EEXIST, f"{parent.describe()}/{name} exists")
        now = attributes.now_ns()
        stored = attributes.Attributes(
            mode=attributes.LINK_MODE, uid=uid, gid=gid, mtime_ns=now, atime_ns=now, ctime_ns=now
        )
        tree.begin_change(parent.incarnation, components)
        try:
            entry = await self.workers.bounded(
                f"symlink {parent.describe()}/{name}",
                self.workers.run,
                lambda: namespace.symlink(
                    self.root, parent.workbench_id, "/".join(components), text, attributes=stored, expected_generation=0
                ),
            )
            tree.own(ChangeEventKind.PathPut, entry.artifact_revision_id)
        except GenerationConflict:
            raise refuse(errno.EEXIST, f"{parent.describe()}/{name} exists") from None
        finally:
            tree.end_change(parent.incarnation, components)
        tree.overlay.published(parent.incarnation, components)
        tree.directory_changed(parent.incarnation, parent.components, now)
        return tree.path_node(parent, name, entry)

    async def readlink(self, node: Node) -> bytes:
        if node.kind is not Kind.LINK:
            raise refuse(errno.EINVAL, f"{node.describe()} is not a symbolic link")
        entry = node.bound or self.tree.current_entry(node)
        if entry is None:
            raise refuse(errno.ENOENT, f"{node.describe()} no longer exists")
        target = await self.workers.bounded(
            f"readlink of {node.describe()}", self.fetcher.read, entry, 0, entry.logical_size
        )
        return bytes(target)

    # --- the end of the mount ----------------------------------------------------------------------

    def keep_open_spools(self, spools) -> None:
        """At unmount: unpublished bytes of files still open are kept; clean spools removed."""
        for spool in spools:
            if spool.dirty and not spool.orphaned:
                spool.keep("the mount ended while the file was open for writing")
                log.warning("%s was still open for writing: its bytes are kept in %s", spool.describe(), spool.path)
            else:
                spool.close(remove=True)


def changes_of(attr, fields, now_ns: int) -> dict:
    """The attribute changes a SETATTR asks for (mode, owner, times) as set_attributes keywords."""
    changes = {}
    if fields.update_mode:
        changes["mode"] = attr.st_mode & 0o7777
    if fields.update_uid:
        changes["uid"] = attr.st_uid
    if fields.update_gid:
        changes["gid"] = attr.st_gid
    if fields.update_mtime:
        changes["mtime_ns"] = attr.st_mtime_ns
    if fields.update_atime:
        changes["atime_ns"] = attr.st_atime_ns
    return changes


def changed_facts(facts, changes: dict):
    """A detached node's Facts with a SETATTR's changes (None: nothing known to change)."""
    if facts is None:
        return None
    return facts._replace(**changes, ctime_ns=time.time_ns())


def now_ns() -> int:
    return time.time_ns()


def _now(fn, *args):
    """An async function that calls fn(*args): a step that needs the spool's lock and no I/O."""

    async def call():
        return fn(*args)

    return call


def _attributes_to_spool(spool: Spool, changes: dict) -> bool:
    """(spool locked) Keep attribute changes with the spool's unpublished bytes (True), unless it
    was published meanwhile. An unlinked or replaced file's attributes vanish with it, as its
    bytes do (the kernel's writeback cache sets its times at close)."""
    if spool.dirty or spool.base is None or spool.orphaned:
        spool.attributes = {**(spool.attributes or {}), **changes}
        return True
    return False


async def _settled() -> None:
    """(spool locked) Nothing: holding the lock is the wait for a publication under way."""
