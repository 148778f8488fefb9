"""A random read/write/truncate exerciser with a model (tests/exerciser.py, in the manner of
xfstests' fsx) driven through the mount: zero miscompares over 10,000 operations."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.mount_fixtures import REPO, env, fsck_clean, mount, mounted, needs_fuse  # noqa: F401

pytestmark = needs_fuse


def exercise(path: str, *, ops: int, seed: int, max_size: int) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.exerciser",
            path,
            "--ops",
            str(ops),
            "--seed",
            str(seed),
            "--max-size",
            str(max_size),
        ],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.long
def test_ten_thousand_random_operations_match_the_model(mount):
    out = exercise(mount.path("wb", "outputs", "fsx.bin"), ops=10_000, seed=20261203, max_size=1 << 20)
    assert "0 miscompares" in out
    fsck_clean(mount.data_dir)


@pytest.mark.long
def test_a_file_larger_than_a_block_under_random_operations(mount):
    """Bodies across block boundaries (4 MiB blocks): fills, appends and truncates that cross them."""
    out = exercise(mount.path("wb", "outputs", "fsx-large.bin"), ops=1_500, seed=7, max_size=9 * 1024 * 1024)
    assert "0 miscompares" in out
    fsck_clean(mount.data_dir)


@pytest.mark.long
def test_random_operations_on_small_blocks_staged_while_written(tmp_path):
    """4 KiB blocks: appends complete blocks in order, which are staged in the store while the
    file is written (nokvfs.workspace.prestage); writes behind them, truncates, fsyncs, second
    descriptors and replacements then change what was staged. Every read matches the model, and
    after a remount so does every byte (a stale staged block linked would show here)."""
    with mounted(str(tmp_path), block_size=4096) as m:
        path = m.path("wb", "outputs", "fsx-small-blocks.bin")
        out = exercise(path, ops=1_500, seed=11, max_size=256 * 1024)  # up to 64 blocks
        assert "0 miscompares" in out
        with open(path, "rb") as f:
            before = f.read()
    with mounted(str(tmp_path), init=False) as m:
        with open(m.path("wb", "outputs", "fsx-small-blocks.bin"), "rb") as f:
            assert f.read() == before
        fsck_clean(m.data_dir)
    # Staging ahead did happen in the first mount, and its publications linked staged blocks.
    log = open(os.path.join(str(tmp_path), "daemon.log")).read()
    staged, linked = (int(n) for n in re.findall(r"(\d+) staged while written of which (\d+) linked", log)[0])
    assert staged > 0 and linked > 0, log[-2000:]
