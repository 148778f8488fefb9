"""Freshness: follow the root's change feed and tell the kernel what another process changed.

Every ~200 ms the follower reads the shard's commit clock (one System point read). When it has
moved, it scans the ChangeEvent rows written after the last version it saw (key
`root | u64 commit_version | u32 seq`, bounded pages of 255) and hands each event to the change
handler (nokvfs.fs.changes), which decides which kernel entries and inodes are stale: paths (PathPut/Appended/Removed/
Renamed, and the run manifest a CommitPublished writes), the workbench list, and the names in
`/<wb>/.snapshots/`, `.commits/` and `.tags/` (SnapshotMinted/Retired, CommitPublished,
TagSet/Deleted). Changes this mount made itself are skipped (the kernel already knows them), so a
local `cp -r` does not invalidate what it created.

Invalidations never run inside a request: entries go through pyfuse3's notify thread
(`invalidate_entry_async`), inodes through a single worker thread here, because invalidating an
inode's pages waits for page locks that an in-flight read may hold.
"""

from __future__ import annotations

import errno
import logging
import math

import pyfuse3
import trio

from nokvfs.errors import CursorExpired, NokvError
from nokvfs.workspace import changes as feed

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.2


class Invalidator:
    def __init__(self):
        self._send, self._receive = trio.open_memory_channel(math.inf)
        self._limiter = trio.CapacityLimiter(1)
        self.enabled = True  # off in unit tests that run the tree without a kernel
        self.entries = 0
        self.inodes = 0

    def entry(self, parent_ino: int, name: str, deleted: int = 0) -> None:
        if not self.enabled:
            return
        self.entries += 1
        log.debug("invalidate entry %d/%s (deleted %d)", parent_ino, name, deleted)
        pyfuse3.invalidate_entry_async(parent_ino, name.encode("utf-8"), deleted=deleted, ignore_enoent=True)

    def inode(self, ino: int, *, attr_only: bool = False) -> None:
        if not self.enabled:
            return
        self.inodes += 1
        log.debug("invalidate inode %d (attributes only: %s)", ino, attr_only)
        self._send.send_nowait((ino, attr_only))

    async def run(self) -> None:
        async with self._receive:
            async for ino, attr_only in self._receive:
                await trio.to_thread.run_sync(_invalidate_inode, ino, attr_only, limiter=self._limiter)


def _invalidate_inode(ino: int, attr_only: bool) -> None:
    try:
        pyfuse3.invalidate_inode(ino, attr_only)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.debug("invalidate_inode(%d) failed: %s", ino, exc)


class ChangeFollower:
    def __init__(self, root, changes, *, interval: float = POLL_INTERVAL):
        self.root = root
        self.changes = changes
        self.interval = interval
        self.last_version = root.shard.commit_version
        self.events_seen = 0
        self.resyncs = 0

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval)
            try:
                self.poll()
            except NokvError as exc:
                log.warning("change feed: %s", exc)
            except Exception:
                log.exception("change feed: unexpected failure")

    def poll(self) -> int:
        """Apply every event committed since the last poll; returns how many there were."""
        if self.root.shard.commit_version == self.last_version:
            return 0
        count = 0
        with self.root.read() as view:
            try:
                for version, event in feed.events_after(view, self.root, self.last_version):
                    self.changes.changed(version, event)
                    count += 1
            except CursorExpired as exc:
                # Retention removed events this mount had not read: everything it may cache is
                # checked against the state at view.version, and the feed goes on from there.
                log.warning("change feed: %s; resynchronising the mount's caches", exc)
                self.resyncs += 1
                self.changes.resync()
            self.last_version = view.version
        self.events_seen += count
        return count
