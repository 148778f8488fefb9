"""Whole-body SHA-256 states of revisions this process published, so an append continues its
base's hash instead of reading the whole base again.

The seed's body digest covers every byte of a revision, so an append (nokvfs.workspace.append)
must hash the base before the new bytes: without a state, `echo line >> log` reads the whole log
back from the store each time (2 s for a 1 GiB base here), and a log appended once a second costs
in proportion to its length. A publication that hashed its body keeps the hasher here, under its
revision id (a revision's bytes never change), once the hasher's digest is the one the revision
records; an append that finds its base here copies the state and hashes only its new bytes.
Process-local and bounded (least recently used out): a miss only means reading the base.
"""

from __future__ import annotations

import collections
import threading

LIMIT = 4096  # states kept (a SHA-256 state is a few hundred bytes)


class HashStates:
    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._states: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def remember(self, revision_id: bytes, size: int, hasher, digest_uri: str) -> None:
        """Keep `hasher` (its state after exactly the revision's `size` bytes) for `revision_id`,
        if its digest is the revision's `digest_uri`; anything else is not kept."""
        if hasher is None or digest_uri != "sha256:" + hasher.hexdigest():
            return
        with self._lock:
            self._states[revision_id] = (size, hasher.copy())
            self._states.move_to_end(revision_id)
            while len(self._states) > self.limit:
                self._states.popitem(last=False)

    def resume(self, revision_id: bytes, size: int):
        """A copy of the state kept for `revision_id` after `size` bytes, or None."""
        with self._lock:
            kept = self._states.get(revision_id)
            if kept is None or kept[0] != size:
                return None
            self._states.move_to_end(revision_id)
            return kept[1].copy()

    def clear(self) -> None:
        with self._lock:
            self._states.clear()

    def __len__(self) -> int:
        return len(self._states)


STATES = HashStates()
