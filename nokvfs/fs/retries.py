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

Bounded: a caller refused and never retrying (killed, or its second attempt failed) is dropped
after `LIMIT` newer ones.
"""

from __future__ import annotations

import collections

LIMIT = 1024


class OpenRetries:
    def __init__(self):
        # pid -> None (refused, not looked up since) or (ino, PathEntry its retry's lookup showed)
        self._callers: collections.OrderedDict = collections.OrderedDict()

    def refused(self, pid: int | None) -> None:
        """An open by `pid` was answered ESTALE: the kernel retries it once."""
        if pid is None:
            return
        self._callers[pid] = None
        self._callers.move_to_end(pid)
        while len(self._callers) > LIMIT:
            self._callers.popitem(last=False)

    def looked_up(self, pid: int | None, ino: int, entry) -> None:
        """A lookup by `pid` handed out `ino`, showing `entry` (the path's PathEntry): kept when
        `pid` is retrying an open."""
        if pid is not None and pid in self._callers:
            self._callers[pid] = (ino, entry)

    def take(self, pid: int | None, ino: int):
        """The entry an open by `pid` of `ino` may read though the path moved on (None: none).
        Any open by the caller ends its retry, whatever it opens."""
        if pid is None:
            return None
        held = self._callers.pop(pid, None)
        if held is None or held[0] != ino:
            return None
        return held[1]
