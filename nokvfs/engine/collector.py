"""Python's cyclic garbage collector, deferred while a write group runs.

A group commit builds and applies hundreds of commands in one transaction (GC's batches: 250
revisions, about 1,750 row writes, and the records its builders make), allocating far more
container objects than it frees until it ends. With the default thresholds (700, 10, 10) that
triggered about 550 collections per 10,000 GC'd revisions, full ones among them walking the
whole heap: 0.3 s of CPU, none of which found much, since those objects die when the group
ends. Within `deferred()` the first generation is collected only after GROUP_THRESHOLD net
allocations instead; the thresholds are restored when the last concurrent group ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading

GROUP_THRESHOLD = 50_000  # net container allocations between two young collections in a group

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, ...] | None = None


@contextlib.contextmanager
def deferred():
    """Raise the young generation's threshold to GROUP_THRESHOLD while the block runs (nested
    and concurrent blocks share one raise; the thresholds found before the first are restored
    after the last). Cyclic garbage is still collected, only less often: memory stays bounded."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            if _saved[0] and _saved[0] < GROUP_THRESHOLD:
                gc.set_threshold(GROUP_THRESHOLD, *_saved[1:])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                _saved = None
