"""nokvfs.engine.collector: the cyclic collector's young threshold is raised while commands and groups
run and restored after the last one, however they nest or overlap."""

from __future__ import annotations

import gc
import threading

import pytest

from nokvfs.engine import collector
from nokvfs.engine.command import Put


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_raised_inside_and_restored_after_nested_blocks(thresholds):
    with collector.deferred():
        assert gc.get_threshold() == (collector.GROUP_THRESHOLD, 10, 10)
        with collector.deferred():
            assert gc.get_threshold()[0] == collector.GROUP_THRESHOLD
        assert gc.get_threshold()[0] == collector.GROUP_THRESHOLD  # the outer block still runs
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_after_an_exception_and_after_overlapping_threads(thresholds):
    with pytest.raises(RuntimeError):
        with collector.deferred():
            raise RuntimeError("refused")
    assert gc.get_threshold() == (700, 10, 10)
    entered, release = threading.Barrier(3), threading.Event()

    def group():
        with collector.deferred():
            entered.wait()
            release.wait()

    threads = [threading.Thread(target=group) for _ in range(2)]
    for thread in threads:
        thread.start()
    entered.wait()
    assert gc.get_threshold()[0] == collector.GROUP_THRESHOLD
    release.set()
    for thread in threads:
        thread.join()
    assert gc.get_threshold() == (700, 10, 10)


def test_a_disabled_threshold_stays_disabled(thresholds):
    gc.set_threshold(0, 10, 10)
    with collector.deferred():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold() == (0, 10, 10)


def test_a_write_group_runs_deferred_and_restores_the_thresholds(shard_env, thresholds):
    seen = []

    def command(view):
        seen.append(gc.get_threshold()[0])
        key = shard_env.root_id + b"\x05" * 4
        return shard_env.command(mutations=[Put("path_current", key, b"\x02v")], read_version=view.version)

    results = shard_env.shard.apply_group([command])
    assert not isinstance(results[0], Exception)
    assert seen == [collector.GROUP_THRESHOLD] and gc.get_threshold() == (700, 10, 10)


def test_a_single_command_runs_deferred_too(shard_env, thresholds, monkeypatch):
    from nokvfs.engine.shard import Shard

    seen = []
    real_apply = Shard._apply

    def recording(self, txn, command):
        seen.append(gc.get_threshold()[0])
        return real_apply(self, txn, command)

    monkeypatch.setattr(Shard, "_apply", recording)
    shard_env.apply(mutations=[Put("path_current", shard_env.root_id + b"\x06" * 4, b"\x02v")])
    assert seen == [collector.GROUP_THRESHOLD] and gc.get_threshold() == (700, 10, 10)
