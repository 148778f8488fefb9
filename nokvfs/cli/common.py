"""What every command module shares: the root, `WB:PATH` targets, sizes, stdio, warnings.

A command handler is `handler(args) -> int | None` (None means 0). `args` always carries the
global options `data_dir`, `store`, `endpoint_url` and `debug`. Handlers raise typed errors
(nokvfs.errors, `UsageError`, OSError); `nokvfs.cli.main` turns them into exit codes and messages.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass

from nokvfs.cli.render import safe
from nokvfs.errors import InvalidInput
from nokvfs.schema.names import check_workbench_id
from nokvfs.schema.paths import join, normalize_path

MiB = 1024 * 1024


class UsageError(InvalidInput):
    """The command line itself is wrong (a missing operand, options that do not combine)."""

    def __init__(self, message: str, usage: str | None = None):
        super().__init__(message)
        self.usage = usage


# --- the root -------------------------------------------------------------------------------


def open_root(args, *, write: bool):
    """The data directory's root (a context manager: `with open_root(args, write=True) as root`).

    Only writing commands run publish recovery. The shard's outbox chain is always checked on open
    and every row is verified as it is read; the full per-tree state-digest scan is fsck's job, or
    every command's with the global `--verify`.
    """
    from nokvfs.workspace import datadir

    return datadir.open_root(
        args.data_dir,
        store=args.store,
        endpoint_url=args.endpoint_url,
        verify=getattr(args, "verify", False),
        recover=write,
    )


# --- WB:PATH --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    workbench_id: str
    components: tuple[str, ...]  # () for the workbench itself
    into: bool = False  # written with a trailing '/': a directory to put things into

    @property
    def path(self) -> str:
        return join(self.components) if self.components else ""

    def child(self, *names: str) -> Target:
        return Target(self.workbench_id, self.components + tuple(names))

    def __str__(self) -> str:
        return f"{self.workbench_id}:{self.path}"


def parse_target(text: str, *, need_path: bool = True, allow_root: bool = False, allow_into: bool = False) -> Target:
    """Parse `WB:PATH` (workbench ids never contain ':', paths may).

    need_path: `WB` alone (no ':') is a usage error. allow_root: `WB:` / `WB` names the workbench
    itself. allow_into: one trailing '/' marks a directory (`WB:outputs/`). The path goes through
    the one normalizer, which validates and never repairs (`a//b`, `a/../b` are PathInvalid).
    """
    workbench_id, sep, path = text.partition(":")
    if not sep and need_path:
        raise UsageError(f"expected WB:PATH, got {text!r}")
    check_workbench_id(workbench_id)
    into = False
    if allow_into and path.endswith("/"):
        path, into = path[:-1], True
    if path in ("", "."):
        if not allow_root:
            raise UsageError(f"{text!r} names the workbench itself; a path is needed (WB:PATH)")
        return Target(workbench_id, (), into)
    return Target(workbench_id, normalize_path(path), into)


# --- sizes ----------------------------------------------------------------------------------

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def add_json_option(parser, help: str = "machine-readable output (sorted keys, hex ids)") -> None:
    """`--json`, the same on every command that has it."""
    parser.add_argument("--json", action="store_true", help=help)


def parse_size(text: str) -> int:
    """`65536`, `64K`, `64KiB`, `4M`, `4MiB`, `1G`: binary units, a plain number is bytes."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise UsageError(f"invalid size {text!r} (examples: 65536, 64KiB, 4MiB, 1GiB)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def count_arg(what: str):
    """An argparse type: a whole number in [0, 2**63) (for versions, generations)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 0 <= value < 1 << 63:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: a non-negative integer")
        return value

    return parse


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


# --- stdio ----------------------------------------------------------------------------------


def stdout_binary():
    """The binary stdout (flushing pending text first, so the two never interleave)."""
    sys.stdout.flush()
    return sys.stdout.buffer


def stdin_binary():
    return sys.stdin.buffer


def warn(message: str) -> None:
    print(f"nokvfs: warning: {safe(message)}", file=sys.stderr)


def is_regular_file(path: str) -> bool:
    """A regular file, or a symlink to one (read by content)."""
    try:
        import stat

        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False
