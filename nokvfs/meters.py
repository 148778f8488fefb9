"""Counters and latencies of one kind of call, for `nokvfs status` and the metrics endpoint.

A Meter counts calls, sums their seconds, keeps the slowest, sorts each into fixed latency buckets
(the Prometheus histogram convention: a bucket counts the calls at or under its bound) and counts
failures by exception class name. It is cheap enough for every read of a mount (one lock, a few
additions) and safe from any thread. `Meters` names a group of them, created on first use.
"""

from __future__ import annotations

import bisect
import threading
import time
from contextlib import contextmanager

# Upper bounds in seconds; the last, implicit bucket is +Inf.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Meter:
    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0
        self.slowest = 0.0
        self._in_bucket = [0] * (len(BUCKETS) + 1)
        self.failures: dict[str, int] = {}

    def record(self, seconds: float, failure: BaseException | None = None) -> None:
        index = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            self.count += 1
            self.seconds += seconds
            if seconds > self.slowest:
                self.slowest = seconds
            self._in_bucket[index] += 1
            if failure is not None:
                kind = type(failure).__name__
                self.failures[kind] = self.failures.get(kind, 0) + 1

    @contextmanager
    def timing(self):
        """Time the block; an Exception leaving it is counted as a failure of its class (a
        cancellation is not a failure of the call and is not counted at all)."""
        started = time.monotonic()
        try:
            yield
        except Exception as exc:
            self.record(time.monotonic() - started, exc)
            raise
        else:
            self.record(time.monotonic() - started)

    def snapshot(self) -> dict:
        """count, failed, failures by kind, total/mean/max milliseconds, and the cumulative bucket
        counts as [[upper bound in seconds or "+Inf", count], ...]."""
        with self._lock:
            count, seconds, slowest = self.count, self.seconds, self.slowest
            in_bucket, failures = list(self._in_bucket), dict(self.failures)
        cumulative, total = [], 0
        for bound, n in zip(list(BUCKETS) + ["+Inf"], in_bucket):
            total += n
            cumulative.append([bound, total])
        return {
            "count": count,
            "failed": sum(failures.values()),
            "failures": failures,
            "total_ms": round(seconds * 1000, 3),
            "mean_ms": round(seconds * 1000 / count, 3) if count else 0.0,
            "max_ms": round(slowest * 1000, 3),
            "buckets": cumulative,
        }


class Meters:
    """Named meters, created on first use."""

    def __init__(self):
        self._lock = threading.Lock()
        self._meters: dict[str, Meter] = {}

    def __getitem__(self, name: str) -> Meter:
        meter = self._meters.get(name)
        if meter is None:
            with self._lock:
                meter = self._meters.setdefault(name, Meter())
        return meter

    def snapshot(self) -> dict:
        return {name: meter.snapshot() for name, meter in sorted(self._meters.items())}
