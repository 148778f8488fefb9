#!/usr/bin/env python3
"""POSIX conformance of a mount: pjdfstest, run per group, each failure classed.

    python3 scripts/bench_posix.py --pjdfstest DIR [--groups chmod,rename,...] [--keep] [--write-back]

DIR is a pjdfstest source checkout (github.com/pjd/pjdfstest; not shipped with nokvfs). The
script builds its `pjdfstest` binary there with gcc if it is missing (a config.h for Linux/glibc
is written when the checkout has none, instead of autotools), mounts a fresh data directory with
`--allow-other` (pjdfstest switches to other uids), runs `prove -v DIR/tests/<group>` from inside
a section, and prints per group: test files, assertions, passes and failures, each failure classed

    by design   what nokvfs does not store, as the README documents: special files (mkfifo,
                mknod, sockets) and hard links. To see every consequence of that -- a test then
                chmods the symlink to the fifo it could not make -- the same test files run on a
                local directory of this machine with those calls refused by an LD_PRELOAD shim
                (EPERM, as nokvfs answers); an assertion that fails there too is by design. Paths
                longer than the shard's keys hold (ENAMETOOLONG) are by design too.
    open        anything else: it fails only on nokvfs (listed with its TAP line)

Figures print; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

LINUX_CONFIG = """\
#define HAVE_FCHMODAT 1
#define HAVE_FCHOWNAT 1
#define HAVE_FSTATAT 1
#define HAVE_LINKAT 1
#define HAVE_MKDIRAT 1
#define HAVE_MKFIFOAT 1
#define HAVE_MKNODAT 1
#define HAVE_OPENAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_RENAMEAT 1
#define HAVE_SYMLINKAT 1
#define HAVE_UNLINKAT 1
#define HAVE_UTIMENSAT 1
#define HAVE_STRUCT_STAT_ST_ATIM 1
#define HAVE_STRUCT_STAT_ST_CTIM 1
#define HAVE_STRUCT_STAT_ST_MTIM 1
#define HAVE_SYS_SYSMACROS_H 1
"""
UNSTORED_CALLS = ("mkfifo", "mknod", "bind", "link")
SHIM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <sys/types.h>
#include <sys/socket.h>
static int refuse(void) { errno = EPERM; return -1; }
int mknod(const char *p, mode_t m, dev_t d) { return refuse(); }
int mknodat(int f, const char *p, mode_t m, dev_t d) { return refuse(); }
int mkfifo(const char *p, mode_t m) { return refuse(); }
int mkfifoat(int f, const char *p, mode_t m) { return refuse(); }
int link(const char *a, const char *b) { return refuse(); }
int linkat(int f, const char *a, int g, const char *b, int flags) { return refuse(); }
int bind(int s, const struct sockaddr *a, socklen_t l) {
    return a && a->sa_family == AF_UNIX ? refuse() : (errno = EPERM, -1);
}
"""
TRIED = re.compile(r"tried '([^']*)', expected (\S+), got (\S+)")
PATH_LIMIT = 440  # bytes of a path below a section the shard's keys hold (README, Known limits)


def _call(tried: str) -> tuple[str | None, list[str]]:
    """(syscall, its arguments) of pjdfstest's `tried '...'` text, without its -u/-g/-- options."""
    words = tried.split()
    while words and words[0] in ("-u", "-g", "-U"):
        words = words[2:]
    if words and words[0] == "--":
        words = words[1:]
    return (words[0], words[1:]) if words else (None, [])


def build_shim(directory: str) -> str:
    """A shared library refusing mknod/mkfifo/link/bind with EPERM, as nokvfs does."""
    source = os.path.join(directory, "refuse.c")
    with open(source, "w") as f:
        f.write(SHIM)
    library = os.path.join(directory, "refuse.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", library, source], check=True)
    return library


def run_file(path: str, cwd: str, env=None) -> str:
    return subprocess.run(["prove", "-v", path], cwd=cwd, capture_output=True, text=True, timeout=600, env=env).stdout


def failing(tap: str) -> set[int]:
    out = set()
    for line in tap.splitlines():
        if line.startswith("not ok "):
            out.add(int(line.split()[2]))
    return out


def build(source: str) -> str:
    binary = os.path.join(source, "pjdfstest")
    if os.path.exists(binary):
        return binary
    config = os.path.join(source, "config.h")
    if not os.path.exists(config):
        with open(config, "w") as f:
            f.write(LINUX_CONFIG)
    subprocess.run(["gcc", "-D_GNU_SOURCE", "-O2", "-o", binary, "pjdfstest.c"], cwd=source, check=True)
    return binary


def classify(tap: str, reference_failures: set[int]) -> tuple[int, int, list[str], list[str]]:
    """(assertions, passes, by-design failures, open failures) of one test file's TAP output,
    given the assertion numbers that fail on the reference directory."""
    by_design, open_ = [], []
    total = passes = 0
    for line in tap.splitlines():
        if not line.startswith(("ok ", "not ok ")):
            continue
        total += 1
        if line.startswith("ok "):
            passes += 1
            continue
        number = int(line.split()[2])
        match = TRIED.search(line)
        call, arguments = _call(match.group(1)) if match else (None, [])
        got = match.group(3) if match else None
        if number in reference_failures or call in UNSTORED_CALLS:
            by_design.append(line)
        elif any(len(a.encode()) > PATH_LIMIT for a in arguments) or got == "ENAMETOOLONG":
            by_design.append(line)  # paths beyond what the shard's keys hold
        else:
            open_.append(line)
    return total, passes, by_design, open_


def short(line: str, width: int = 160) -> str:
    line = re.sub(r"pjdfstest_[0-9a-f]{32}", "N", line)
    line = re.sub(r"[0-9a-f]{64,}", "LONG", line)
    return line if len(line) <= width else line[: width - 3] + "..."


def main() -> int:
    parser = argparse.ArgumentParser(description="pjdfstest on a nokvfs mount, per group, each failure classed")
    parser.add_argument("--pjdfstest", required=True, metavar="DIR", help="a pjdfstest source checkout")
    parser.add_argument("--groups", default=None, help="comma-separated groups (default: every directory of DIR/tests)")
    parser.add_argument("--keep", action="store_true", help="leave the data directory for inspection")
    parser.add_argument("--write-back", action="store_true", help="mount with --write-back")
    parser.add_argument("--show", type=int, default=20, help="open failures listed (default 20)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("pjdfstest needs root (it switches uids)", file=sys.stderr)
        return 2
    source = os.path.abspath(args.pjdfstest)
    build(source)
    tests = os.path.join(source, "tests")
    groups = (
        args.groups.split(",")
        if args.groups
        else sorted(d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)))
    )

    from tests.mount_fixtures import mounted

    base = tempfile.mkdtemp(prefix="nokvfs-posix-", dir="/tmp")
    os.chmod(base, 0o755)
    reference = os.path.join(base, "reference")
    os.makedirs(reference)
    os.chmod(reference, 0o755)
    shim_env = dict(os.environ, LD_PRELOAD=build_shim(base))
    rows, opened = [], []
    started = time.monotonic()
    try:
        extra = ("--allow-other",) + (("--write-back",) if args.write_back else ())
        with mounted(base, extra_args=extra) as m:
            where = m.path("wb", "outputs")
            for group in groups:
                files = sorted(f for f in os.listdir(os.path.join(tests, group)) if f.endswith(".t"))
                assertions = passes = 0
                by_design, open_ = [], []
                for name in files:
                    test = os.path.join(tests, group, name)
                    expected = failing(run_file(test, reference, shim_env))
                    total, ok, designed, failed = classify(run_file(test, where), expected)
                    assertions += total
                    passes += ok
                    by_design += designed
                    open_ += [f"{group}/{name}: {line}" for line in failed]
                rows.append((group, len(files), assertions, passes, len(by_design), len(open_)))
                opened += open_
                print(
                    f"{group:<16} files {len(files):>3}  assertions {assertions:>5}  pass {passes:>5}  "
                    f"fail by design {len(by_design):>5}  fail open {len(open_):>4}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    totals = [sum(r[i] for r in rows) for i in range(1, 6)]
    print(
        f"{'all':<16} files {totals[0]:>3}  assertions {totals[1]:>5}  pass {totals[2]:>5}  "
        f"fail by design {totals[3]:>5}  fail open {totals[4]:>4}   ({time.monotonic() - started:.0f} s)"
    )
    for line in opened[: args.show]:
        print("  open:", short(line))
    if len(opened) > args.show:
        print(f"  ... {len(opened) - args.show} more open failures (--show N)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
