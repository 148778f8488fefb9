"""`nokvfs compact`: the shard rewritten without its free pages under the exclusive lock, refused
while another process has it open, and safe against a crash at each step of the swap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nokvfs.cli.main import main
from nokvfs.engine import compact
from nokvfs.engine.shard import Shard
from nokvfs.errors import ShardBusy
from nokvfs.workspace import datadir, fsck, gc, listing, namespace, reading, workbench
from nokvfs.workspace.retention import RetentionSettings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(data_dir: str) -> dict:
    """A shard that once held much more than it holds: rewrites, then GC and retention."""
    datadir.init(data_dir, retention=RetentionSettings(versions=0, request_seconds=0, outbox_records=10))
    root = datadir.open_root(data_dir)
    try:
        workbench.create(root, "w")
        for n in range(400):
            namespace.put(root, "w", f"outputs/f{n % 10}", b"%d " % n * 200)
        from nokvfs.workspace import retention

        retention.run(root)
        gc.collect(root)
    finally:
        root.close()
    return {f"outputs/f{n}": b"%d " % (390 + n) * 200 for n in range(10)}


def check(data_dir: str, expected: dict) -> None:
    shard_path = os.path.join(data_dir, "shard")
    root = datadir.open_root(data_dir, verify=True)
    try:
        assert not compact.has_leftovers(shard_path)
        with root.read() as view:
            for path, body in expected.items():
                assert reading.read(root, listing.stat(view, root, "w", path).entry) == body
        assert fsck.check(root).ok
        namespace.put(root, "w", "outputs/after", b"writes go on")
    finally:
        root.close()


def test_compact_shrinks_the_shard_and_keeps_everything(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    mdb = os.path.join(data_dir, "shard", "data.mdb")
    before = os.path.getsize(mdb)
    with _opened(os.path.join(data_dir, "shard")) as shard:
        tail = shard.recovery_tail
    assert main(["--data-dir", data_dir, "compact", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"before_bytes": %d' % before in out
    after = os.path.getsize(mdb)
    assert after < before / 2, (before, after)
    with _opened(os.path.join(data_dir, "shard")) as shard:
        assert shard.recovery_tail == tail
    check(data_dir, expected)


class _opened:
    def __init__(self, path):
        self.shard = Shard.open(path)

    def __enter__(self):
        return self.shard

    def __exit__(self, *exc):
        self.shard.close()


def test_compact_is_refused_while_the_shard_is_open(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    root = datadir.open_root(data_dir)
    try:
        with pytest.raises(ShardBusy):
            compact.compact(os.path.join(data_dir, "shard"))
        assert main(["--data-dir", data_dir, "compact"]) == 4
        assert "open in another process" in capsys.readouterr().err
    finally:
        root.close()
    assert not compact.has_leftovers(os.path.join(data_dir, "shard"))
    check(data_dir, expected)


@pytest.mark.parametrize("step", ["copied", "new", "old", "swapped"])
def test_a_crash_at_each_step_of_the_swap_loses_nothing(tmp_path, step):
    data_dir = str(tmp_path / "data")
    expected = build(data_dir)
    env = dict(os.environ, PYTHONPATH=REPO, **{compact.CRASH_ENV: step})
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", data_dir, "compact"],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 137, done.stderr.decode()
    assert compact.has_leftovers(os.path.join(data_dir, "shard"))
    check(data_dir, expected)  # the next open finishes or undoes the swap
