"""The daemon's life: detach after the mount is live, umount, signals, systemd readiness, and a
killed daemon that the next mount recovers from."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from nokvfs.fs import spools
from tests.mount_fixtures import (
    REPO,
    WORKBENCH_LISTING,
    env,
    init_data_dir,
    mounted,
    needs_fuse,
    start_daemon,
    stop,
    unmount,
    wait_mounted,
)

pytestmark = needs_fuse


def nokvfs(*args, extra_env=None, timeout=60):
    environment = env()
    environment.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_mount_detaches_once_live_and_umount_waits_for_the_daemon(tmp_path):
    data, mnt = str(tmp_path / "data"), str(tmp_path / "mnt")
    os.makedirs(mnt)
    init_data_dir(data)
    try:
        done = nokvfs("mount", data, mnt)
        assert done.returncode == 0, done.stderr
        assert os.path.ismount(mnt)  # live the moment the parent exits 0
        assert sorted(os.listdir(os.path.join(mnt, "wb"))) == WORKBENCH_LISTING
        [pid_path] = glob.glob(os.path.join(data, "run", "mount-*.json"))
        with open(pid_path) as f:
            record = json.load(f)
        assert record["mountpoint"] == mnt and alive(record["pid"])
        with open(os.path.join(mnt, "wb", "outputs", "f"), "w") as f:
            f.write("x")
        done = nokvfs("--data-dir", data, "umount", mnt)
        assert done.returncode == 0, done.stderr
        assert not os.path.ismount(mnt)
        assert not alive(record["pid"])
        assert not os.path.exists(pid_path)
        # The global --data-dir form, and a failing mount reported with exit 1.
        done = nokvfs("--data-dir", data, "mount", mnt)
        assert done.returncode == 0, done.stderr
        assert os.path.ismount(mnt)
        done = nokvfs("--data-dir", data, "mount", mnt)
        assert done.returncode == 1 and "already mounted" in done.stderr
        assert nokvfs("umount", mnt, "--timeout", "30", extra_env={"NOKVFS_DATA_DIR": data}).returncode == 0
        done = nokvfs("mount", str(tmp_path / "no-such-data"), mnt)
        assert done.returncode != 0 and not os.path.ismount(mnt)
    finally:
        unmount(mnt)
    assert not os.path.ismount(mnt)


def test_sigterm_and_sigint_unmount_cleanly(tmp_path):
    for number in (signal.SIGTERM, signal.SIGINT):
        base = tmp_path / number.name
        base.mkdir()
        with mounted(str(base)) as m:
            with open(m.path("wb", "outputs", "f"), "w") as f:
                f.write("x")
            m.proc.send_signal(number)
            assert m.proc.wait(timeout=30) == 0
            assert not os.path.ismount(m.mountpoint)
            assert "unmounted" in m.log()


def test_readiness_is_sent_to_systemd(tmp_path):
    data, mnt = str(tmp_path / "data"), str(tmp_path / "mnt")
    os.makedirs(mnt)
    init_data_dir(data)
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(30)
    environment = env()
    environment["NOTIFY_SOCKET"] = address
    log = str(tmp_path / "daemon.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nokvfs.cli.main", "mount", data, mnt, "--foreground"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=REPO,
        )
    try:
        message = sock.recv(4096).decode()
        assert "READY=1" in message and f"MAINPID={proc.pid}" in message
        assert os.path.ismount(mnt)  # READY means live
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode()
        assert proc.wait(timeout=30) == 0
    finally:
        unmount(mnt)
        stop(proc)
        sock.close()
    assert not os.path.ismount(mnt)


def test_a_killed_daemon_leaves_nothing_the_next_mount_cannot_recover(tmp_path):
    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    proc = start_daemon(data, mnt, log)
    try:
        wait_mounted(mnt, proc, log)
        with open(os.path.join(mnt, "wb", "outputs", "kept.txt"), "w") as f:
            f.write("published before the kill")
        fd = os.open(os.path.join(mnt, "wb", "outputs", "unfinished.bin"), os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"written, never closed")
        proc.kill()
        proc.wait(timeout=30)
        with pytest.raises(OSError):
            os.close(fd)  # the connection is gone
        with pytest.raises(OSError):
            os.statvfs(mnt)  # Transport endpoint is not connected
    except BaseException:
        unmount(mnt)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    # The next mount clears the dead mountpoint, recovers, and keeps the unfinished spool.
    with mounted(base, init=False) as m:
        with open(m.path("wb", "outputs", "kept.txt")) as f:
            assert f.read() == "published before the kill"
        assert not os.path.exists(m.path("wb", "outputs", "unfinished.bin"))
        assert "dead mount" in m.log()
        assert f"(pid {proc.pid}) ended before publishing it" in m.log() and "wb:outputs/unfinished.bin" in m.log()
    # The spool of the file that was never closed is kept and described by its sidecar.
    (spool,) = [
        p
        for p in glob.glob(os.path.join(data, "spool", "mount", "*.spool"))
        if open(p, "rb").read() == b"written, never closed"
    ]
    with open(spool + ".json") as f:
        record = json.load(f)
    assert record["state"] == "kept" and record["path"] == "outputs/unfinished.bin" and record["workbench"] == "wb"
    assert record["expected_revision"] is None and record["pid"] == proc.pid
    # The published file's spool is gone: a spool whose bytes were published is deleted.
    assert len(glob.glob(os.path.join(data, "spool", "mount", "*.spool"))) == 1
    # The unclosed file's spool was in memory (a small file's): adopted, it moved to disk.
    memory = spools.memory_spool_path(data)
    assert memory is None or not glob.glob(os.path.join(memory, "*.spool"))


def test_umount_of_a_busy_mount_fails_and_lazy_detaches(tmp_path):
    with mounted(str(tmp_path)) as m:
        os.makedirs(m.path("wb", "outputs", "d"))
        busy = subprocess.Popen(["sleep", "30"], cwd=m.path("wb", "outputs", "d"))
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the child really sits in the mount
                try:
                    if os.readlink(f"/proc/{busy.pid}/cwd") == m.path("wb", "outputs", "d"):
                        break
                except OSError:
                    pass
                time.sleep(0.02)
            done = nokvfs("umount", m.mountpoint, extra_env={"NOKVFS_DATA_DIR": m.data_dir})
            assert done.returncode == 1 and os.path.ismount(m.mountpoint)
            done = nokvfs("umount", "--lazy", m.mountpoint, extra_env={"NOKVFS_DATA_DIR": m.data_dir})
            assert done.returncode == 0 or not os.path.ismount(m.mountpoint)
            assert not os.path.ismount(m.mountpoint)
        finally:
            busy.kill()
            busy.wait()
