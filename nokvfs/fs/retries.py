"""The kernel's one retry of an open(2) refused with ESTALE, and what that retry may read.

An open that reaches an inode whose path now holds another revision answers ESTALE
(nokvfs.fs.files): the inode may have come from the kernel's dentry cache, long before the
replacement, and a new open must see the new revision. The kernel then walks the path once more
with LOOKUP_REVAL, so its lookup reaches this daemon, and opens the inode that lookup handed out;
a second ESTALE reaches the caller. When the path is replaced again between that lookup and that
open (a path rewritten several times a second), the lookup still ran inside the caller's
open(2): reading the revision it showed is what a local disk does, which resolves the path once
and opens what it found. So a caller (the kernel's task id, the same for every request of one
system call) refused an open is remembered, the entry its next lookup of a file showed is kept,
and its next open of that inode, for reading, reads it. Any open by that caller uses the grace up.

The retry follows the refusal at once, inside the same system call, and a task makes one system
call at a time, so nothing but that retry's lookups comes from the caller in between. Should the
retry not come (its lookup found nothing, the task was killed), the grace must not outlive it:
a lookup that finds nothing ends it, it lapses after `WINDOW` seconds (a task id can be reused),
and at most `LIMIT` callers are remembered.
"""

from __future__ import annotations

import collections
import time

LIMIT = 1024
WINDOW = 1.0


class OpenRetries:
    def __init__(self, clock=time.monotonic):
        # pid -> (refused at, None or (ino, PathEntry its retry's lookup showed))
        self._callers: collections.OrderedDict = collections.OrderedDict()
        self._clock = clock

    def refused(self, pid: int | None) -> None:
        """An open by `pid` was answered ESTALE: the kernel retries it once."""
        if pid is None:
            return
        self._callers[pid] = (self._clock(), None)
        self._callers.move_to_end(pid)
        while len(self._callers) > LIMIT:
            self._callers.popitem(last=False)

    def _current(self, pid: int | None):
        if pid is None or pid not in self._callers:
            return None
        refused_at, held = self._callers[pid]
        if self._clock() - refused_at > WINDOW:
            del self._callers[pid]
            return None
        return refused_at, held

    def looked_up(self, pid: int | None, ino: int | None, entry=None) -> None:
        """A lookup by `pid` handed out `ino`, showing `entry` (the path's PathEntry; ino None:
        it found nothing, and the retry is over): kept when `pid` is retrying an open."""
        current = self._current(pid)
        if current is None:
            return
        if ino is None:
            del self._callers[pid]
        else:
            self._callers[pid] = (current[0], (ino, entry))

    def take(self, pid: int | None, ino: int):
        """The entry an open by `pid` of `ino` may read though the path moved on (None: none).
        Any open by the caller ends its retry, whatever it opens."""
        current = self._current(pid)
        if current is None:
            return None
        del self._callers[pid]
        held = current[1]
        if held is None or held[0] != ino:
            return None
        return held[1]
