"""The kernel's view of mounts: what is mounted where, whether a FUSE mount's daemon is gone, and
how to unmount (fusermount3 -u, fusermount, or umount; lazily for a busy or dead mount)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess

log = logging.getLogger("nokvfs.fs.daemon")


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_fstype(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at `mountpoint` (last one wins), or None."""
    found = _mounted_at(mountpoint)
    return None if found is None else found[0]


def mount_data_dir(mountpoint: str) -> str | None:
    """The data directory a nokvfs mount at `mountpoint` serves, from its source
    (`nokvfs:DATA_DIR`, see nokvfs.fs.daemon.serve), or None."""
    found = _mounted_at(mountpoint)
    if found is None or not found[1].startswith("nokvfs:"):
        return None
    return found[1][len("nokvfs:") :] or None


def _mounted_at(mountpoint: str) -> tuple[str, str] | None:
    """(filesystem type, source) of what is mounted exactly at `mountpoint` (last one wins)."""
    target = os.path.abspath(mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 10:
                    continue
                dash = fields.index("-")
                if _unescape(fields[4]) == target:
                    found = (fields[dash + 1], _unescape(fields[dash + 2]))
    except OSError:
        return None
    return found


def is_stale(mountpoint: str) -> bool:
    """A FUSE mount whose daemon is gone. statfs always reaches the daemon (stat may be answered
    from the kernel's attribute cache), so a dead connection shows as ENOTCONN (or ECONNABORTED)."""
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def _run_quiet(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, (done.stderr or done.stdout).strip()


def kernel_unmount(mountpoint: str, *, lazy: bool = False) -> tuple[bool, str]:
    """fusermount3 -u (or fusermount, or umount); lazy detaches a busy or dead mount."""
    attempts = []
    for tool in ("fusermount3", "fusermount"):
        if shutil.which(tool):
            attempts.append([tool, "-u"] + (["-z"] if lazy else []) + [mountpoint])
            break
    if shutil.which("umount"):
        attempts.append(["umount"] + (["-l"] if lazy else []) + [mountpoint])
    message = "no fusermount3, fusermount or umount found"
    for argv in attempts:
        code, message = _run_quiet(argv)
        if code == 0:
            return True, ""
    return False, message


def clear_stale(mountpoint: str) -> None:
    """Lazily unmount a dead FUSE mount at `mountpoint` (left by a killed daemon)."""
    if is_stale(mountpoint):
        log.warning("%s is a dead mount (Transport endpoint is not connected): unmounting it lazily", mountpoint)
        ok, message = kernel_unmount(mountpoint, lazy=True)
        if not ok or is_stale(mountpoint):
            raise RuntimeError(f"cannot clear the dead mount at {mountpoint}: {message}")


def nokvfs_mounts() -> list[tuple[str, str | None]]:
    """(mountpoint, data directory or None) of every nokvfs mount in this mount namespace. The
    data directory is the mount's source, `nokvfs:<data_dir>` (None where the daemon could not
    put it there: a path with a comma)."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if "-" not in fields:
                    continue
                dash = fields.index("-")
                if len(fields) < dash + 3 or fields[dash + 1] != "fuse.nokvfs":
                    continue
                source = _unescape(fields[dash + 2])
                found.append((_unescape(fields[4]), source[len("nokvfs:") :] if source.startswith("nokvfs:") else None))
    except OSError:
        return []
    return found
