"""Many objects of the local store removed at once (nokvfs.objects.removal): by a helper process
for a large call, in this process for a small one, with the same answers either way."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from nokvfs.errors import AmbiguousResult, StoreError
from nokvfs.objects import removal
from nokvfs.objects.local import LocalStore
from tests.workspace_helpers import undeletable

MANY = removal.HELPER_PATHS + 22


def _files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def _dirs_under(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, _ in os.walk(root) for n in dirs)


@pytest.fixture
def store(tmp_path):
    with LocalStore(tmp_path / "store") as s:
        yield s


def _revisions(store, count: int, blocks: int = 2) -> list:
    keys = [f"nokv/artifacts/s/r/{n:04d}/blocks/{b:016x}" for n in range(count) for b in range(blocks)]
    store.put_many([(key, key.encode()) for key in keys] + [("nokv/artifacts/s/r/keep", b"k")])
    return keys


def test_many_keys_go_in_a_helper_process_that_prunes_and_answers_each(store):
    keys = _revisions(store, MANY // 2 + 1)
    assert len(keys) >= removal.HELPER_PATHS
    assert store.delete_many(keys + ["nokv/absent"]) == [None] * (len(keys) + 1)
    helper = store._remover._process
    assert helper is not None and helper.pid != os.getpid() and helper.poll() is None
    # Every revision directory went (blocks/ and all); the directory that holds them stays.
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/s/r/keep"]
    assert _dirs_under(store.root) == [".nokv-tmp", "nokv", "nokv/artifacts", "nokv/artifacts/s", "nokv/artifacts/s/r"]
    store.close()
    assert helper.wait(timeout=10) == 0  # its stdin closed: it exits


def test_the_helper_fsyncs_each_directory_where_removals_end_once(tmp_path):
    with LocalStore(tmp_path / "store") as store:
        keys = _revisions(store, MANY)
        paths = [os.path.join(store.root, *key.split("/")) for key in keys]
        results, synced = store._remover.remove(store.root, paths)
        assert store._remover._process is not None
    assert results == [None] * len(paths)
    assert synced == [os.path.join(store.root, "nokv", "artifacts", "s", "r")]


def test_a_small_call_stays_in_this_process(store):
    keys = _revisions(store, 3)
    assert store.delete_many(keys) == [None] * len(keys)
    assert store._remover._process is None
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/s/r/keep"]


def test_a_file_the_filesystem_will_not_delete_is_answered_alone_by_the_helper(store):
    keys = _revisions(store, MANY)
    stuck = os.path.join(store.root, *keys[5].split("/"))
    with undeletable(stuck):
        results = store.delete_many(keys)
        assert store._remover._process is not None
        assert type(results[5]) is StoreError and "Operation not permitted" in str(results[5])
        assert results[:5] + results[6:] == [None] * (len(keys) - 1)
        assert store.get(keys[5]) == keys[5].encode()
    assert store.delete_many([keys[5]]) == [None]
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/s/r/keep"]


def test_a_helper_lost_during_a_call_leaves_each_key_ambiguous_and_the_next_call_works(store, monkeypatch):
    keys = _revisions(store, MANY)
    assert store.delete_many(keys[:2] * (removal.HELPER_PATHS // 2)) == [None] * removal.HELPER_PATHS
    helper = store._remover._process
    real_write = helper.stdin.write

    def killed_first(data):  # the helper dies as the request reaches it
        os.kill(helper.pid, signal.SIGKILL)
        helper.wait()
        return real_write(data)

    monkeypatch.setattr(helper.stdin, "write", killed_first)
    results = store.delete_many(keys[2:])
    assert all(type(r) is AmbiguousResult and "helper" in str(r) for r in results)
    assert store._remover._process is None
    assert store.delete_many(keys[2:]) == [None] * (len(keys) - 2)  # a new helper
    assert store._remover._process.pid != helper.pid
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/s/r/keep"]


def test_without_a_helper_the_call_is_served_here(store, monkeypatch):
    keys = _revisions(store, MANY)
    monkeypatch.setattr(sys, "executable", os.path.join(store.root, "no-such-python"))
    assert store.delete_many(keys) == [None] * len(keys)
    assert store._remover._process is None
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/s/r/keep"]


def test_a_helper_that_cannot_run_leaves_every_call_here(store, monkeypatch, tmp_path):
    """A helper that starts but dies before saying it is ready (its file missing, say) was
    asked nothing: the call, and the later ones, are served here."""
    import subprocess

    keys = _revisions(store, MANY)
    spawned = []
    real_popen = subprocess.Popen

    def broken(args, **kw):
        spawned.append(args)
        return real_popen([args[0], "-I", "-S", str(tmp_path / "missing.py")], **kw)

    monkeypatch.setattr(removal.subprocess, "Popen", broken)
    assert store.delete_many(keys[: len(keys) // 2]) == [None] * (len(keys) // 2)
    assert store.delete_many(keys[len(keys) // 2 :]) == [None] * (len(keys) - len(keys) // 2)
    assert len(spawned) == 1 and store._remover._process is None
    assert _files_under(store.root) == [".nokv-lock", ".nokv-store", "nokv/artifacts/s/r/keep"]
