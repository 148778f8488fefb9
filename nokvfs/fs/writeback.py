"""Write-back mode (`nokvfs mount --write-back`): close(2) returns once the file's bytes are
durable on this machine; a background publisher publishes them afterwards, in order.

Acceptance. At close (flush) the file's spool is fsync'd and its sidecar rewritten, durably, in
state `pending` with the attributes its publication will store (nokvfs.fs.spools.Spool
.make_durable). From then on nothing accepted is lost: the publisher publishes it, or -- after a
crash -- the next mount does (`replay`), or it becomes a kept spool for `nokvfs spool
list|retry|discard`.

Publishing. One task drains the accepted spools in the order they were accepted (a spool accepted
again while still queued keeps its place and publishes its latest bytes), each through the same
publication the default mode runs at close (nokvfs.fs.files.Files.publish), so expectations,
conflicts and attributes follow the same rules. A publication that fails leaves the spool's bytes
in place; once the file's last descriptor is gone the spool is kept with its sidecar and a log
line says where (a conflict: something outside this mount changed the path).

fsync(2) on a file waits until the publisher has published it (and everything accepted before
it) and reports that publication's error. Unmounting (`nokvfs umount`, a signal) drains the queue
before the daemon exits; files still open then are kept as in the default mode.
"""

from __future__ import annotations

import logging

import trio

from nokvfs.errors import GenerationConflict
from nokvfs.fs import spools

log = logging.getLogger(__name__)


# A burst of closes (tar x, a build) runs first and its publications after it: the publisher
# starts once no file was accepted for QUIET seconds, or at once when someone waits (fsync(2),
# unmount) or the backlog reaches MAX_BACKLOG // 2. Each accepted spool holds a descriptor and a
# flock until it is published, so acceptance waits while MAX_BACKLOG are queued.
QUIET = 0.05
MAX_BACKLOG = 512


class Publisher:
    """The accepted, not yet published spools of a write-back mount, and the task publishing them."""

    def __init__(self, files, *, quiet: float = QUIET, max_backlog: int = MAX_BACKLOG):
        self.files = files
        self.quiet = quiet
        self.max_backlog = max_backlog
        self._queue: dict = {}  # spool -> node, in acceptance order (dicts keep insertion order)
        self._done: dict = {}  # spool -> trio.Event set once its queued publication ran
        self._outcome: dict = {}  # spool -> the exception its last publication raised (None: published)
        self._wakeup = trio.Event()
        self._urgent = 0  # tasks waiting for a publication (fsync, drain)
        self._room = trio.Event()  # set when the backlog falls below MAX_BACKLOG
        self._last_accept = 0.0
        self.accepted = 0
        self.published = 0
        self.failed = 0

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
        while len(self._queue) >= self.max_backlog and spool not in self._queue:
            self._wakeup.set()
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()
        async with spool.locked():
            if not spool.dirty and not spool.attributes:
                return
            stored = files.attributes_to_publish(node, spool)
            await files.workers.bounded(f"acceptance of {spool.describe()}", files.workers.run, spool.make_durable, stored)
        if spool not in self._queue:
            self._queue[spool] = node
            self._done[spool] = trio.Event()
            self.accepted += 1
        self._last_accept = trio.current_time()
        self._wakeup.set()

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
        done = self._done.get(spool)
        if done is not None:
            self._urgent += 1
            self._wakeup.set()
            try:
                await done.wait()
            finally:
                self._urgent -= 1
        error = self._outcome.get(spool)
        if error is not None:
            raise error

    # --- publishing ----------------------------------------------------------------------------

    async def run(self) -> None:
        """The publisher task: publish accepted spools in order, for as long as the mount lives."""
        while True:
            if not self._queue:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            if not self._urgent and len(self._queue) < self.max_backlog // 2:
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
            await self._publish_next()

    async def _publish_next(self) -> None:
        spool, node = next(iter(self._queue.items()))
        files = self.files
        error = None
        try:
            # The last writer gone: the spool file goes with the publication. An empty new file
            # is published all the same (the default mode's release rule, here at once).
            closing = spool.writers == 0 and (spool.written or spool.base is not None)
            await files.publish(node, why="write-back publication", closing=closing)
        except Exception as exc:  # noqa: BLE001 - Files logged it with the spool's path; fsync reports it
            error = exc
        finally:
            self._queue.pop(spool, None)
            done = self._done.pop(spool, None)
            if len(self._queue) < self.max_backlog:
                self._room.set()
        if error is None:
            self.published += 1
            self._outcome.pop(spool, None)
        else:
            self.failed += 1
            self._outcome[spool] = error
        if node.handles == 0 and node.spool is spool:
            await files.settle(node, spool)  # kept (with a log line) when its publication failed
            self._outcome.pop(spool, None)
            if node.handles == 0:
                node.bound = None
                files.tree.inodes.settled(node)
        if done is not None:
            done.set()


# --- after a crash ------------------------------------------------------------------------------


def replay(root, data_dir: str) -> tuple[int, int]:
    """At mount start: publish the pending spools a write-back daemon accepted and did not
    publish before it ended, oldest first. One that cannot be published (its path changed since,
    say) becomes a kept spool with the reason in its sidecar and a log line. Returns (published,
    kept)."""
    pending = [s for s in spools.scan(data_dir) if not s.live and s.record.get("state") == spools.PENDING]
    pending.sort(key=lambda s: (s.record.get("accepted_unix_ns") or 0, s.record.get("created_unix_ms") or 0))
    published = kept = 0
    for spool in pending:
        record = spool.record
        try:
            spools.retry(root, spool)
            published += 1
            log.info("write-back: published %s:%s (%d bytes) accepted before the last daemon ended", record.get("workbench"), record.get("path"), spool.size)
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
    return published, kept


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
            raw = view.get("path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, normalize_path(record["path"])))
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
        spool.id, record.get("workbench"), record.get("path"), spool.size, reason, spool.id,
    )
