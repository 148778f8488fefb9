"""systemd/nokvfs@.service: it parses, its exposure stays low, it has no setting that would hide
the mount from the host, and the daemon mounts, serves and unmounts inside its sandbox."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.mount_fixtures import REPO, env, needs_fuse, stop, unmount
from tests.unit_sandbox import service_settings

UNIT = os.path.join(REPO, "systemd", "nokvfs@.service")
MAX_EXPOSURE = 3.8  # `systemd-analyze security --offline=yes`: 9.6 before the hardening
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (scripts/setup.sh installs it)"
)
# Each of these runs the service in its own mount namespace, whose propagation to the host is
# cut (systemd.exec(5), MountFlags=): the FUSE mount would be invisible outside the service.
NAMESPACING = {
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "BindPaths",
    "BindReadOnlyPaths",
    "TemporaryFileSystem",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "PrivateIPC",
    "MountFlags",
    "RootDirectory",
    "RootImage",
    "LogNamespace",
    "PrivateUsers",
    "PrivateNetwork",
}

pytest_plugins = ["tests.s3_fixtures"]


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in service_settings(UNIT):
        out.setdefault(key, []).append(value)
    return out


@needs_analyze
def test_the_unit_parses():
    done = subprocess.run(["systemd-analyze", "verify", UNIT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


@needs_analyze
def test_the_exposure_stays_low():
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}", UNIT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    exposure = float(re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout).group(1))
    assert done.returncode == 0 and exposure <= MAX_EXPOSURE, done.stdout


def test_nothing_in_the_unit_would_hide_the_mount_from_the_host():
    found = settings()
    assert not NAMESPACING & set(found), sorted(NAMESPACING & set(found))
    # and what a FUSE daemon needs is granted, nothing more
    assert found["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    assert found["DeviceAllow"] == ["/dev/fuse rw"] and found["DevicePolicy"] == ["closed"]
    assert found["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert found["UMask"] == ["0077"] and found["NoNewPrivileges"] == ["yes"]


@needs_fuse
@needs_analyze
def test_the_daemon_mounts_serves_and_unmounts_inside_the_units_sandbox(tmp_path, s3_endpoint, s3_bucket):
    """As the unit runs it: `nokvfs mount --foreground DATA MNT` (an S3 store: the network too),
    readiness over NOTIFY_SOCKET, then ExecStop's `nokvfs umount`, each under the sandbox."""
    data, mnt = str(tmp_path / "data"), str(tmp_path / "mnt")
    os.makedirs(mnt)
    nokvfs = [sys.executable, "-m", "nokvfs.cli.main"]
    sandboxed = [sys.executable, "-m", "tests.unit_sandbox", UNIT, "--"]
    init = subprocess.run(
        [*nokvfs, "init", "--data-dir", data, "--store", f"s3://{s3_bucket}/unit", "--endpoint-url", s3_endpoint],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=120,
    )
    assert init.returncode == 0, init.stderr
    assert (
        subprocess.run(
            [*nokvfs, "workbench", "create", "wb", "--data-dir", data], env=env(), cwd=REPO, timeout=120
        ).returncode
        == 0
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(60)
    environment = dict(env(), NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
    log = open(tmp_path / "daemon.log", "ab")
    proc = subprocess.Popen(
        [*sandboxed, *nokvfs, "mount", "--foreground", data, mnt],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        cwd=REPO,
    )
    try:
        try:
            ready = notify.recv(4096).decode()
        except TimeoutError:
            raise AssertionError((tmp_path / "daemon.log").read_text()) from None
        assert "READY=1" in ready and os.path.ismount(mnt)
        with open(f"/proc/{proc.pid}/status") as f:
            status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
        assert int(status["CapBnd"], 16) == 1 << 21  # CAP_SYS_ADMIN only
        # the work of a mount: write (upload to S3), read back, rename, a snapshot, a removal
        path = os.path.join(mnt, "wb", "outputs", "a.txt")
        with open(path, "w") as f:
            f.write("through the sandbox")
        with open(path) as f:
            assert f.read() == "through the sandbox"
        os.rename(path, os.path.join(mnt, "wb", "outputs", "b.txt"))
        os.mkdir(os.path.join(mnt, "wb", ".snapshots", "s1"))
        with open(os.path.join(mnt, "wb", ".snapshots", "s1", "outputs", "b.txt")) as f:
            assert f.read() == "through the sandbox"
        os.unlink(os.path.join(mnt, "wb", "outputs", "b.txt"))
        assert os.listdir(os.path.join(mnt, "wb", "outputs")) == []
        # ExecStop, sandboxed too: a clean unmount after which the daemon exits 0
        done = subprocess.run(
            [*sandboxed, *nokvfs, "umount", mnt, "--data-dir", data],
            capture_output=True,
            text=True,
            env=env(),
            cwd=REPO,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert proc.wait(timeout=60) == 0, (tmp_path / "daemon.log").read_text()
        assert not os.path.ismount(mnt)
        assert "Operation not permitted" not in (tmp_path / "daemon.log").read_text()
    finally:
        unmount(mnt)
        stop(proc)
        log.close()
        notify.close()
    # the same sandbox refuses what the unit forbids (the filter is real)
    probe = (
        "import os, socket\ntry:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
        "except PermissionError:\n    print('refused')"
    )
    done = subprocess.run(
        [*sandboxed, sys.executable, "-c", probe], capture_output=True, text=True, env=env(), cwd=REPO, timeout=60
    )
    assert done.stdout == "refused\n", done.stderr
