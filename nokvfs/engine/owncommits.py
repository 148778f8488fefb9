"""What this process committed to a shard, so that a reader's cache survives its own commits.

A reader that keeps what it read (the mount's file entries and directory attributes) tags it
with the shard's change stamp (`Shard.change_stamp`: the environment's generation and LMDB's last
transaction id) and reads again once the stamp moves: a commit by any process may have changed
the row. When every commit since was this process's own, the stamp's move says less than that:
only the rows those commits wrote changed. `OwnCommits` records them.

It keeps one run of consecutive transaction ids, all committed by this process through the
Shard's write methods (`apply`, `apply_group`, and the maintenance writes that record), with the
rows of the watched trees each one wrote (the trees some reader asked for with `watch`). A
transaction id that does not follow the run's last (another process's commit, a write this
class is not told of, a reopened environment, or two of this process's commits recorded out of
order) starts a new run, and a reader whose stamp is older than the run's start reads again. So
the answer is never "unchanged" for a row a commit it was not told of may have written: that is
the whole contract, and why recording is only done after a commit that advanced the id (LMDB
does not advance it for a write transaction that changed nothing, and then another process's
commit gets that id).

Bounded: the run is dropped (a new one starts) when it holds ROWS_KEPT rows.
"""

from __future__ import annotations

import threading

ROWS_KEPT = 32_768


class OwnCommits:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: frozenset = frozenset()
        self._opened = None  # the environment generation of the run
        self._start = 0  # first transaction id of the run (0: no run)
        self._last = 0  # last transaction id recorded in the run
        self._written: dict = {}  # (tree, key) -> last transaction id of the run that wrote it
        self._local = threading.local()

    def watch(self, trees) -> None:
        """Record the rows of these trees (as well as those watched already). A run started
        before does not know their rows: it ends here."""
        with self._lock:
            self._watched = self._watched | frozenset(trees)
            self._reset()

    def record(self, opened: int, txnid: int, rows, *, unknown: str | None = None) -> None:
        """After a commit that advanced the shard to transaction `txnid` (environment generation
        `opened`), made by this process, writing `rows` ((tree, key) pairs), and rows of the tree
        `unknown` it does not list."""
        self._local.stamp = (opened, txnid)
        with self._lock:
            if unknown is not None and unknown in self._watched:
                # Rows a reader keeps values of, not listed: a run may only start after it.
                self._reset()
                self._opened, self._start, self._last = opened, txnid + 1, txnid
                return
            watched = self._watched
            kept = [row for row in rows if row[0] in watched]
            if (
                opened != self._opened
                or txnid != self._last + 1
                or not self._start
                or len(self._written) + len(kept) > ROWS_KEPT
            ):
                self._reset()
                self._opened, self._start = opened, txnid
            written = self._written
            for row in kept:
                written[row] = txnid
            self._last = txnid  # last: a reader that sees it finds the rows above recorded

    def _reset(self) -> None:
        self._opened, self._start, self._last = None, 0, 0
        self._written = {}

    def committing(self, call, *args):
        """(call(*args), the change stamp after the last commit the calling thread recorded
        during it, or None): the stamp of a commit made by that call, never an earlier one."""
        self._local.stamp = None
        return call(*args), self.take_thread_stamp()

    def take_thread_stamp(self):
        """The change stamp after the last commit the calling thread recorded since it last
        asked (None: none)."""
        stamp = getattr(self._local, "stamp", None)
        self._local.stamp = None
        return stamp

    def unchanged(self, since, now, tree: str, key: bytes) -> bool:
        """Whether the row (tree, key), of a watched tree, is as it was at stamp `since` at
        stamp `now`: every commit between was recorded here and none of them wrote it. Only a
        row's last write is kept, so a row written after `now` is not known to be (False)."""
        if since == now and since is not None:
            return True
        with self._lock:
            if tree not in self._watched or not self._spans(since, now):
                return False
            return self._written.get((tree, key), 0) <= since[1]

    def _spans(self, since, now) -> bool:
        """(lock held) Whether the run holds every commit after stamp `since` up to `now`."""
        return (
            since is not None
            and now is not None
            and since[0] == now[0] == self._opened
            and self._start <= since[1] + 1
            and since[1] <= now[1] <= self._last
        )

    def wrote(self, stamp, tree: str, key: bytes) -> bool:
        """Whether the commit that made stamp `stamp` is the last recorded one to write the row."""
        with self._lock:
            return (
                stamp is not None
                and stamp[0] == self._opened
                and tree in self._watched
                and self._written.get((tree, key)) == stamp[1]
            )
