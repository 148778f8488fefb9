"""Python's cyclic garbage collector, deferred while a command or a write group applies.

A large command (GC's batches: 250 revisions, about 1,750 row writes) or a group of commands
allocates far more container objects than it frees until it ends. With the default thresholds
(700, 10, 10) a 10,000-revision GC ran about 550 collections, full ones among them walking the
whole heap: 0.3 s of CPU, finding little, since those objects die when the command ends (0.14 s
with commands deferred; the rest runs in the GC workflow's builders, outside the engine).
Within `deferred()` the first generation is collected only after GROUP_THRESHOLD net
allocations instead; the thresholds are restored when the last concurrent block ends.
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
