"""OwnCommits: what this process committed, so a cache survives its own commits and no other's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from nokvfs.engine import owncommits
from nokvfs.engine.command import Absent, Put
from nokvfs.errors import PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.ids import new_id16
from nokvfs.workspace import datadir, namespace
from nokvfs.workspace import workbench as wb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P = "path_current"


def test_a_row_is_unchanged_across_own_commits_that_did_not_write_it():
    own = owncommits.OwnCommits()
    own.watch([P])
    own.record(0, 5, [(P, b"a")])
    own.record(0, 6, [(P, b"b"), ("operation", b"x")])
    own.record(0, 7, [(P, b"a")])
    assert own.unchanged((0, 5), (0, 6), P, b"c")
    assert not own.unchanged((0, 5), (0, 6), P, b"b")  # commit 6 wrote it
    assert not own.unchanged((0, 5), (0, 7), P, b"a")  # commit 7 wrote it
    assert not own.unchanged((0, 5), (0, 6), P, b"a")  # only its last write is kept: not known
    assert own.unchanged((0, 4), (0, 7), P, b"c")  # the run starts at 5: everything since 4 is known
    assert not own.unchanged((0, 3), (0, 7), P, b"c")  # commit 4 is not one of them
    assert not own.unchanged((0, 5), (0, 8), P, b"c")  # commit 8 is nobody's known yet
    assert not own.unchanged((0, 5), (0, 6), "operation", b"x")  # not a watched tree
    assert not own.unchanged(None, (0, 6), P, b"c")
    assert own.unchanged((0, 9), (0, 9), P, b"a")  # nothing committed since
    assert not own.unchanged((1, 5), (1, 6), P, b"c")  # another environment generation


def test_a_commit_that_does_not_follow_the_last_one_starts_a_new_run():
    own = owncommits.OwnCommits()
    own.watch([P])
    own.record(0, 5, [(P, b"a")])
    own.record(0, 8, [(P, b"b")])  # 6 and 7: another process's, or writes nobody recorded
    assert not own.unchanged((0, 5), (0, 8), P, b"c")
    assert own.unchanged((0, 7), (0, 8), P, b"c")
    own.record(1, 9, [])  # a reopened environment
    assert not own.unchanged((0, 8), (1, 9), P, b"c")
    assert own.unchanged((1, 8), (1, 9), P, b"c")


def test_the_rows_are_bounded(monkeypatch):
    monkeypatch.setattr(owncommits, "ROWS_KEPT", 4)
    own = owncommits.OwnCommits()
    own.watch([P])
    for txnid in range(1, 4):
        own.record(0, txnid, [(P, b"%d" % txnid)])
    assert own.unchanged((0, 0), (0, 3), P, b"z")
    own.record(0, 4, [(P, b"x"), (P, b"y")])  # 5 rows: a new run from commit 4
    assert not own.unchanged((0, 0), (0, 4), P, b"z")
    assert own.unchanged((0, 3), (0, 4), P, b"z")


def test_watching_another_tree_ends_the_run_that_did_not_record_it():
    own = owncommits.OwnCommits()
    own.watch([P])
    own.record(0, 1, [("workspace_current", b"w")])
    own.watch(["workspace_current"])
    assert not own.unchanged((0, 0), (0, 1), "workspace_current", b"w")
    own.record(0, 2, [("workspace_current", b"w")])
    assert not own.unchanged((0, 1), (0, 2), "workspace_current", b"w")
    assert own.unchanged((0, 1), (0, 2), P, b"w")


def test_the_thread_stamp_is_each_threads_last_commit_and_is_taken_once():
    own = owncommits.OwnCommits()
    own.record(0, 1, [])
    seen = []
    thread = threading.Thread(target=lambda: seen.append(own.take_thread_stamp()))
    thread.start()
    thread.join()
    assert seen == [None]
    assert own.take_thread_stamp() == (0, 1)
    assert own.take_thread_stamp() is None
    own.record(0, 2, [])
    assert own.committing(lambda x: x + 1, 1) == (2, None)  # commit 2 came before the call
    assert own.committing(own.record, 0, 3, []) == (None, (0, 3))


@pytest.fixture
def root(tmp_path):
    data = str(tmp_path / "data")
    datadir.init(data)
    root = datadir.open_root(data, verify=False)
    wb.create(root, "wb")
    yield root
    root.close()


def _key(root, path):
    with root.read() as view:
        incarnation = wb.visible(view, root.root_id, "wb")[1].incarnation_id
    return keys.path_current_key(root.root_id, incarnation, tuple(path.split("/")))


def test_the_shard_records_its_commits_and_never_another_processs(root, tmp_path):
    shard = root.shard
    own = shard.own_commits
    own.watch([P])
    namespace.put(root, "wb", "outputs/a", b"1")
    before = shard.change_stamp()
    namespace.put(root, "wb", "outputs/b", b"2")  # this process: three commands
    now = shard.change_stamp()
    assert own.unchanged(before, now, P, _key(root, "outputs/a"))
    assert not own.unchanged(before, now, P, _key(root, "outputs/b"))
    # Another process publishes outputs/a: the stamp moves and nothing is known of that commit.
    code = (
        "import sys; from nokvfs.workspace import datadir, namespace; "
        "root = datadir.open_root(sys.argv[1], verify=False); "
        "namespace.put(root, 'wb', 'outputs/c', b'theirs'); root.close()"
    )
    subprocess.run([sys.executable, "-c", code, root.data_dir], check=True, cwd=REPO, timeout=60)
    later = shard.change_stamp()
    assert later != now
    assert not own.unchanged(now, later, P, _key(root, "outputs/a"))
    assert not own.unchanged(now, later, P, _key(root, "outputs/zzz"))
    # This process's next commit starts a run from there.
    namespace.put(root, "wb", "outputs/d", b"4")
    assert own.unchanged(later, shard.change_stamp(), P, _key(root, "outputs/a"))
    # ...and their commit stays unknown: a stamp from before it is never covered.
    assert not own.unchanged(now, shard.change_stamp(), P, _key(root, "outputs/a"))
    assert not own.unchanged(now, shard.change_stamp(), P, _key(root, "outputs/c"))


K1 = b"\x01" * 16 + b"one"
K2 = b"\x01" * 16 + b"two"


def test_a_group_or_a_replay_that_committed_nothing_records_nothing(shard_env):
    """LMDB does not advance the transaction id for a write that changed nothing, so another
    process's next commit gets that id: recording it would take that commit for this one's."""
    shard = shard_env.shard
    own = shard.own_commits
    own.watch([P])
    request_id = new_id16()
    shard_env.apply(mutations=[Put(P, K1, b"\x02a")], request_id=request_id)
    before = shard.change_stamp()
    own.take_thread_stamp()
    results = shard.apply_group([shard_env.command(predicates=[Absent(P, K1)], mutations=[Put(P, K2, b"\x02b")])])
    assert isinstance(results[0], PredicateFailed)
    [again] = shard.apply_group([shard_env.command(mutations=[Put(P, K1, b"\x02a")], request_id=request_id)])
    assert again.replayed
    assert shard.apply(shard_env.command(mutations=[Put(P, K1, b"\x02a")], request_id=request_id)).replayed
    assert own.take_thread_stamp() is None
    assert shard.change_stamp() == before
    shard_env.apply(mutations=[Put(P, K2, b"\x02b")])
    now = shard.change_stamp()
    assert own.take_thread_stamp() == now
    assert own.unchanged(before, now, P, K1)  # the run went on: no id was taken for a commit
    assert not own.unchanged(before, now, P, K2)


def test_a_non_durable_command_and_a_group_are_recorded(shard_env):
    shard = shard_env.shard
    own = shard.own_commits
    own.watch([P])
    before = shard.change_stamp()
    shard.apply(shard_env.command(mutations=[Put(P, K1, b"\x02a")]), durable=False)
    middle = shard.change_stamp()
    shard.apply_group([shard_env.command(mutations=[Put(P, K2, b"\x02b")])])
    now = shard.change_stamp()
    assert own.unchanged(before, now, P, b"\x01" * 16 + b"three")
    assert not own.unchanged(before, middle, P, K1) and own.unchanged(middle, now, P, K1)
    assert not own.unchanged(middle, now, P, K2)


def test_a_commit_with_unlisted_rows_of_a_watched_tree_lets_a_run_start_only_after_it():
    own = owncommits.OwnCommits()
    own.watch([P])
    own.record(0, 1, [])
    own.record(0, 2, [], unknown="change_event")  # not watched: the run goes on
    assert own.unchanged((0, 0), (0, 2), P, b"a")
    own.record(0, 3, [], unknown=P)
    assert not own.unchanged((0, 2), (0, 3), P, b"a")
    own.record(0, 4, [(P, b"b")])
    assert own.unchanged((0, 3), (0, 4), P, b"a")
    assert not own.unchanged((0, 2), (0, 4), P, b"a")


def test_a_lease_clock_observation_continues_the_run_and_one_that_changes_nothing_is_not_recorded(shard_env):
    import time

    shard = shard_env.shard
    own = shard.own_commits
    own.watch([P])
    shard_env.apply(mutations=[Put(P, K1, b"\x02a")])
    before = shard.change_stamp()
    own.take_thread_stamp()
    now_ms = time.time_ns() // 1_000_000
    shard.observe_lease_clock(now_ms)
    assert own.take_thread_stamp() == shard.change_stamp() != before
    observed = shard.change_stamp()
    shard.observe_lease_clock(now_ms - 1000)  # the clock only moves forward: nothing written
    assert own.take_thread_stamp() is None and shard.change_stamp() == observed
    shard_env.apply(mutations=[Put(P, K2, b"\x02b")])
    assert own.unchanged(before, shard.change_stamp(), P, K1)
