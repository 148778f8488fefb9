"""A random read/write/truncate exerciser with a model (tests/exerciser.py, in the manner of
xfstests' fsx) driven through the mount: zero miscompares over 10,000 operations."""

from __future__ import annotations

import subprocess
import sys

from tests.mount_fixtures import REPO, env, fsck_clean, mount, needs_fuse  # noqa: F401

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


def test_ten_thousand_random_operations_match_the_model(mount):
    out = exercise(mount.path("wb", "outputs", "fsx.bin"), ops=10_000, seed=20261203, max_size=1 << 20)
    assert "0 miscompares" in out
    fsck_clean(mount.data_dir)


def test_a_file_larger_than_a_block_under_random_operations(mount):
    """Bodies across block boundaries (4 MiB blocks): fills, appends and truncates that cross them."""
    out = exercise(mount.path("wb", "outputs", "fsx-large.bin"), ops=1_500, seed=7, max_size=9 * 1024 * 1024)
    assert "0 miscompares" in out
    fsck_clean(mount.data_dir)
