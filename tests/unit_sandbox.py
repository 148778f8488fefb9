"""Run a command under the sandbox a systemd unit file declares, without systemd.

    python3 -m tests.unit_sandbox UNIT_FILE -- COMMAND [ARG ...]

Read from the unit's [Service] section and enforced by the kernel, then COMMAND is executed:

    UMask=                      umask(2)
    CapabilityBoundingSet=      every other capability dropped from the bounding set
    NoNewPrivileges=yes         prctl(PR_SET_NO_NEW_PRIVS)
    MemoryDenyWriteExecute=yes  prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN) (Linux 6.3+)
    SystemCallFilter=           a seccomp filter (libseccomp): the allow lists' system calls,
                                minus the `~` deny lists', groups expanded by
                                `systemd-analyze syscall-filter`; anything else fails with
                                SystemCallErrorNumber= (EPERM)
    RestrictAddressFamilies=    socket(2) only for the listed families
    SystemCallArchitectures=native   the filter is for the native architecture only

That is the part of the sandbox a FUSE daemon could trip over. DevicePolicy=/DeviceAllow= (a
cgroup device filter) and the settings systemd implements with more seccomp rules
(RestrictNamespaces=, RestrictRealtime=, ProtectClock=, ...) are not reproduced.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import subprocess
import sys

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
CAPABILITIES = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SETPCAP": 8,
    "CAP_LINUX_IMMUTABLE": 9,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_BROADCAST": 11,
    "CAP_NET_ADMIN": 12,
    "CAP_NET_RAW": 13,
    "CAP_IPC_LOCK": 14,
    "CAP_IPC_OWNER": 15,
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_CHROOT": 18,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_PACCT": 20,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_BOOT": 22,
    "CAP_SYS_NICE": 23,
    "CAP_SYS_RESOURCE": 24,
    "CAP_SYS_TIME": 25,
    "CAP_SYS_TTY_CONFIG": 26,
    "CAP_MKNOD": 27,
    "CAP_LEASE": 28,
    "CAP_AUDIT_WRITE": 29,
    "CAP_AUDIT_CONTROL": 30,
    "CAP_SETFCAP": 31,
    "CAP_MAC_OVERRIDE": 32,
    "CAP_MAC_ADMIN": 33,
    "CAP_SYSLOG": 34,
    "CAP_WAKE_ALARM": 35,
    "CAP_BLOCK_SUSPEND": 36,
    "CAP_AUDIT_READ": 37,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
    "CAP_CHECKPOINT_RESTORE": 40,
}


def service_settings(unit_path: str) -> list[tuple[str, str]]:
    """(key, value) of the [Service] section in order (repeated keys kept, continuations joined)."""
    out, section = [], None
    with open(unit_path) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def expand(name: str, seen=None) -> set[str]:
    """A system call or @group, groups expanded recursively by systemd-analyze."""
    if not name.startswith("@"):
        return {name}
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    listing = subprocess.run(
        ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True
    ).stdout
    calls = set()
    for line in listing.splitlines()[1:]:
        entry = line.strip()
        if entry and not entry.startswith("#"):
            calls |= expand(entry, seen)
    return calls


def allowed_calls(settings) -> set[str]:
    allowed: set[str] | None = None
    for key, value in settings:
        if key != "SystemCallFilter" or not value:
            continue
        deny = value.startswith("~")
        names = set().union(*(expand(n) for n in value.lstrip("~").split()))
        if deny:
            allowed = (allowed or set()) - names
        else:
            allowed = (allowed or set()) | names
    if allowed is None:
        raise SystemExit("the unit has no SystemCallFilter= allow list")
    return allowed


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def load_filter(calls: set[str], families: list[int] | None, error: int) -> None:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    ctx = lib.seccomp_init(0x00050000 | (error & 0xFFFF))  # SCMP_ACT_ERRNO(error)
    if not ctx:
        raise SystemExit("seccomp_init failed")
    for name in sorted(calls):
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a system call of this architecture
            continue
        if name == "socket" and families is not None:
            for family in families:
                rule = _ArgCmp(0, SCMP_CMP_EQ, family, 0)
                if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, number, 1, ctypes.byref(rule)) != 0:
                    raise SystemExit("seccomp_rule_add_array(socket) failed")
            continue
        if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, number, 0, None) != 0:
            raise SystemExit(f"seccomp_rule_add_array({name}) failed")
    if lib.seccomp_load(ctx) != 0:
        raise SystemExit("seccomp_load failed")


def apply(unit_path: str) -> dict:
    """Enforce the unit's sandbox on this process; what was applied."""
    settings = service_settings(unit_path)
    values = dict(settings)
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    applied = {}
    if "UMask" in values:
        os.umask(int(values["UMask"], 8))
        applied["umask"] = values["UMask"]
    if "CapabilityBoundingSet" in values:
        keep = {CAPABILITIES[c] for c in values["CapabilityBoundingSet"].split()}
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            if cap not in keep and prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise SystemExit(f"cannot drop capability {cap}: {os.strerror(ctypes.get_errno())}")
        applied["bounding"] = sorted(keep)
    if values.get("NoNewPrivileges") == "yes":
        if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SystemExit("PR_SET_NO_NEW_PRIVS failed")
        applied["no_new_privs"] = True
    if values.get("MemoryDenyWriteExecute") == "yes":
        applied["mdwe"] = prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) == 0
    families = None
    if "RestrictAddressFamilies" in values:
        families = [getattr(socket, name) for name in values["RestrictAddressFamilies"].split()]
    error = getattr(errno, values.get("SystemCallErrorNumber", "EPERM"))
    load_filter(allowed_calls(settings), families, error)
    applied["seccomp"] = True
    return applied


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit(__doc__)
    apply(argv[0])
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
