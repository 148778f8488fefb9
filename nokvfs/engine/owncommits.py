"""What this process committed to a shard, so that a reader's cache survives its own commits.

A reader that keeps what it read (the mount's entries, directory attributes, lookups that found
nothing) tags it with the shard's change stamp (`Shard.change_stamp`: the environment's
generation and LMDB's last transaction id) and reads again once the stamp moves: a commit by any
process may have changed the row. When every commit since was this process's own, the stamp's
move says less than that: only the rows those commits wrote changed. `OwnCommits` records them.

It keeps one run of consecutive transaction ids, all committed through `Shard.apply` or
`Shard.apply_group` here, with the rows of the watched trees each one wrote (the trees some
reader asked for with `watch`). A transaction id that does not follow the run's last (another
process's commit, a write this class is not told of, a reopened environment, or two of this
process's commits recorded out of order) starts a new run, and a reader whose stamp is older
than the run's start reads again. So the answer is never "unchanged" for a row a commit it was
not told of may have written: that is the whole contract, and why recording is only done after
a commit that advanced the id (LMDB does not advance it for a write transaction that changed
nothing, and then another process's commit gets that id).

Bounded: the run is dropped (a new one starts) when it holds ROWS_KEPT rows; the last
LOG_KEPT transactions are kept with their rows for range questions (`rows_between`).
"""

from __future__ import annotations

import collections
import threading

ROWS_KEPT = 32_768
LOG_KEPT = 1_024


class OwnCommits:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: frozenset = frozenset()
        self._opened = None  # the environment generation of the run
        self._start = 0  # first transaction id of the run (0: no run)
        self._last = 0  # last transaction id recorded in the run
        self._written: dict = {}  # (tree, key) -> last transaction id of the run that wrote it
        self._log: collections.deque = collections.deque(maxlen=LOG_KEPT)  # (txnid, rows)
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
            if opened != self._opened or txnid != self._last + 1 or not self._start:
                self._reset()
                self._opened, self._start = opened, txnid
            watched = self._watched
            kept = [row for row in rows if row[0] in watched]
            if len(self._written) + len(kept) > ROWS_KEPT:
                self._reset()
                self._opened, self._start = opened, txnid
            written = self._written
            for row in kept:
                written[row] = txnid
            self._log.append((txnid, kept))
            self._last = txnid  # last: a reader that sees it finds the rows above recorded

    def _reset(self) -> None:
        self._opened, self._start, self._last = None, 0, 0
        self._written = {}
        self._log.clear()

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

    def rows_between(self, since, now) -> list | None:
        """The watched rows written by the commits after stamp `since` up to stamp `now`, or
        None when they were not all recorded here (or are older than the log)."""
        if since is not None and since == now:
            return []
        with self._lock:
            if not self._spans(since, now):
                return None
            log = self._log
            if not log or log[0][0] > since[1] + 1:
                return None
            return [row for txnid, rows in log if since[1] < txnid <= now[1] for row in rows]
