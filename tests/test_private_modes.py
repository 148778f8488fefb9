"""A fresh data directory is private: directories 0700 and files 0600, whatever the umask."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys

import pytest

from nokvfs.cli.main import main
from nokvfs.filemodes import DIR_MODE, FILE_MODE
from tests.mount_fixtures import REPO, env, init_data_dir, needs_fuse, unmount


def modes(top: str) -> dict[str, int]:
    """st_mode of the directory (".") and of everything below it, by relative path."""
    out = {".": os.lstat(top).st_mode}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, top)] = os.lstat(path).st_mode
    return out


def assert_private(top: str) -> dict[str, int]:
    found = modes(top)
    wrong = {
        p: oct(stat.S_IMODE(m))
        for p, m in found.items()
        if stat.S_IMODE(m) != (DIR_MODE if stat.S_ISDIR(m) else FILE_MODE)
    }
    assert not wrong, wrong
    return found


@pytest.fixture
def open_umask():
    old = os.umask(0)  # the widest a caller can have: nothing may depend on it
    yield
    os.umask(old)


def test_init_put_get_and_gc_leave_only_private_entries(tmp_path, open_umask, capsysbinary, monkeypatch):
    data = str(tmp_path / "data")
    assert main(["init", "--cache-size", "64MiB", "--data-dir", data]) == 0  # a local store caches only when asked
    created = assert_private(data)
    assert {"nokvfs.json", "shard/data.mdb", "shard/lock.mdb", "control/data.mdb", "objects"} <= set(created)
    assert main(["workbench", "create", "wb", "--data-dir", data]) == 0
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(9 * 1024 * 1024))  # three blocks: object directories and files
    assert main(["put", "wb:outputs/big.bin", str(src), "--data-dir", data]) == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from a stream")))
    assert main(["put", "wb:logs/stream.txt", "--data-dir", data]) == 0  # spooled first
    assert main(["append", "wb:logs/stream.txt", str(src), "--data-dir", data]) == 0
    assert main(["get", "wb:outputs/big.bin", str(tmp_path / "back.bin"), "--data-dir", data]) == 0  # fills the cache
    assert main(["rm", "wb:logs/stream.txt", "--data-dir", data]) == 0
    assert main(["gc", "--data-dir", data]) == 0
    found = assert_private(data)
    cached = [p for p in found if p.startswith("cache" + os.sep) and stat.S_ISREG(found[p])]
    blocks = [p for p in found if os.sep + "blocks" + os.sep in p]
    assert len(cached) >= 3 and len(blocks) >= 3
    # what nokvfs hands the user is theirs to decide: a got file follows the caller's umask
    assert stat.S_IMODE(os.stat(tmp_path / "back.bin").st_mode) == 0o666


def test_a_replicated_shard_restores_private(tmp_path, open_umask, s3_endpoint, s3_bucket):
    data = str(tmp_path / "data")
    assert main(["init", "--data-dir", data]) == 0
    assert main(["workbench", "create", "wb", "--data-dir", data]) == 0
    url = f"s3://{s3_bucket}/p"
    assert main(["shard", "push", "--to", url, "--endpoint-url", s3_endpoint, "--data-dir", data]) == 0
    assert_private(data)  # the owner record beside the shard
    fresh = tmp_path / "fresh"
    assert main(["shard", "restore", "--from", url, str(fresh / "shard"), "--endpoint-url", s3_endpoint]) == 0
    assert_private(str(fresh))


@needs_fuse
def test_a_mount_keeps_its_spools_sidecars_log_and_pid_file_private(tmp_path, open_umask):
    """The mount's own files -- a write's spool and its sidecar, the daemon's log and pid file,
    the operation locks of its publications -- are as private as the rest, whatever the umask."""
    data, mnt = str(tmp_path / "data"), str(tmp_path / "mnt")
    os.makedirs(mnt)
    init_data_dir(data)

    def nokvfs(*argv):
        done = subprocess.run(
            [sys.executable, "-m", "nokvfs.cli.main", *argv],
            capture_output=True,
            text=True,
            env=env(),
            cwd=REPO,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done

    try:
        nokvfs("mount", data, mnt)  # daemonised: its log and pid file go under run/
        with open(os.path.join(mnt, "wb", "outputs", "f"), "wb") as f:
            f.write(b"x" * 100)
            f.flush()
            found = assert_private(data)  # the open file's spool and sidecar, the pid file
            names = [os.path.basename(p) for p in found]
            assert any(n.endswith(".spool") for n in names) and any(n.endswith(".spool.json") for n in names), names
            assert any(n.startswith("mount-") and n.endswith(".json") for n in names), names
        assert_private(data)  # published: the operation lock's directory
        nokvfs("umount", mnt, "--data-dir", data)
    finally:
        unmount(mnt)
    found = assert_private(data)
    assert any(p.endswith(".log") for p in found) and os.path.isdir(os.path.join(data, "run", "ops"))


pytest_plugins = ["tests.s3_fixtures"]
