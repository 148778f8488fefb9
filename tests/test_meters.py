"""nokvfs.meters: counts, failures by kind and cumulative latency buckets (what status and the
metrics endpoint report), and nokvfs.objects.metered timing a real local store."""

from __future__ import annotations

import pytest

from nokvfs.errors import ObjectMissing
from nokvfs.meters import BUCKETS, Meter, Meters
from nokvfs.objects.metered import MeteredStore
from nokvfs.objects.store import open_store


def test_buckets_are_cumulative_and_failures_counted_by_kind():
    meter = Meter()
    for seconds in (0.0001, 0.0007, 0.003, 0.003, 2.0, 100.0):
        meter.record(seconds)
    meter.record(0.02, ValueError("x"))
    snapshot = meter.snapshot()
    assert snapshot["count"] == 7 and snapshot["failed"] == 1 and snapshot["failures"] == {"ValueError": 1}
    bounds = dict((str(bound), count) for bound, count in snapshot["buckets"])
    assert bounds["0.0005"] == 1 and bounds["0.001"] == 2 and bounds["0.005"] == 4 and bounds["0.025"] == 5
    assert bounds["2.5"] == 6 and bounds["30.0"] == 6 and bounds["+Inf"] == 7
    assert len(snapshot["buckets"]) == len(BUCKETS) + 1
    assert snapshot["max_ms"] == 100000.0 and snapshot["total_ms"] == pytest.approx(102026.8, abs=0.01)


def test_timing_counts_exceptions_but_not_cancellations():
    meter = Meter()
    with meter.timing():
        pass
    with pytest.raises(KeyError), meter.timing():
        raise KeyError("k")
    with pytest.raises(KeyboardInterrupt), meter.timing():
        raise KeyboardInterrupt
    assert meter.snapshot()["count"] == 2 and meter.snapshot()["failures"] == {"KeyError": 1}


def test_a_metered_store_times_each_call_of_a_real_store(tmp_path):
    meters = Meters()
    store = MeteredStore(open_store("file://" + str(tmp_path / "objects")), meters)
    store.put("a/b", b"bytes")
    assert store.get("a/b") == b"bytes" and store.head("a/b").size == 5
    with pytest.raises(ObjectMissing):
        store.get("a/missing")
    store.delete("a/b")
    snapshot = meters.snapshot()
    assert snapshot["put"]["count"] == 1 and snapshot["head"]["count"] == 1 and snapshot["delete"]["count"] == 1
    assert snapshot["get"]["count"] == 2 and snapshot["get"]["failures"] == {"ObjectMissing": 1}
    store.close()


def test_a_metered_put_many_is_the_inner_stores_batch_timed_once(tmp_path):
    meters = Meters()
    store = MeteredStore(open_store("file://" + str(tmp_path / "objects")), meters)
    results = store.put_many([("m/a", b"alpha"), ("m/b", b"beta")])
    assert len(results) == 2 and not any(isinstance(r, Exception) for r in results)
    assert store.get("m/a") == b"alpha" and store.get("m/b") == b"beta"
    snapshot = meters.snapshot()
    assert snapshot["put_many"]["count"] == 1 and "put" not in snapshot  # one batch, not two puts
    store.close()
