"""Links and metadata-only changes: ln -s, readlink, chmod, setattr.

    nokvfs ln -s TARGET WB:PATH [-f] [--json]
    nokvfs readlink WB:PATH
    nokvfs chmod MODE WB:PATH [--json]
    nokvfs setattr WB:PATH [--mode MODE] [--uid N] [--gid N] [--mtime WHEN] [--atime WHEN] [--json]

ln -s     stores a symbolic link: an artifact whose body is TARGET (never resolved; 1..4095 bytes).
          A PATH that is a directory or ends in '/' gets the link at PATH/<basename of TARGET>, as
          ln does. An existing path is a conflict (exit 4) unless -f replaces it. Hard links are
          not stored (exit 2).
readlink  prints a link's target (escaped as all human output is: nokvfs.cli.render.safe).
chmod     sets the permission bits (octal, 0..7777) of a file, link or directory: one
          metadata-only command (no upload, no new revision, the generation kept); a directory's
          attributes live on its marker, created the first time.
setattr   the same for any of mode, owner (uid, gid) and times. WHEN is `now`, `@SECONDS[.FRACTION]`
          (since the epoch, negative allowed) or an ISO-8601 time (UTC unless it names a zone).
"""

from __future__ import annotations

import datetime
import decimal
import os

from nokvfs.cli import render
from nokvfs.cli.commands import _is_directory
from nokvfs.cli.common import UsageError, add_json_option, open_root, parse_target
from nokvfs.errors import IsADirectory

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def register(subparsers) -> None:
    p = subparsers.add_parser("ln", help="make a symbolic link (ln -s TARGET WB:PATH)")
    p.add_argument("-s", "--symbolic", action="store_true", help="a symbolic link (hard links are not stored)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing path")
    p.add_argument("target", metavar="TARGET")
    p.add_argument("path", metavar="WB:PATH")
    add_json_option(p)
    p.set_defaults(func=cmd_ln)

    p = subparsers.add_parser("readlink", help="print a link's target")
    p.add_argument("path", metavar="WB:PATH")
    p.set_defaults(func=cmd_readlink)

    p = subparsers.add_parser("chmod", help="set the mode of a file, link or directory (metadata only)")
    p.add_argument("mode", metavar="MODE", type=_mode_arg, help="octal permission bits, e.g. 755 or 0640")
    p.add_argument("path", metavar="WB:PATH")
    add_json_option(p)
    p.set_defaults(func=cmd_setattr, uid=None, gid=None, mtime=None, atime=None)

    p = subparsers.add_parser("setattr", help="set mode, owner or times of a file, link or directory (metadata only)")
    p.add_argument("path", metavar="WB:PATH")
    p.add_argument("--mode", type=_mode_arg, help="octal permission bits")
    p.add_argument("--uid", type=_id_arg, help="owner user id")
    p.add_argument("--gid", type=_id_arg, help="owner group id")
    p.add_argument("--mtime", type=time_arg, metavar="WHEN", help="modification time: now, @SECONDS or ISO-8601")
    p.add_argument("--atime", type=time_arg, metavar="WHEN", help="access time: now, @SECONDS or ISO-8601")
    add_json_option(p)
    p.set_defaults(func=cmd_setattr)


def _mode_arg(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise UsageError(f"invalid mode {text!r}: octal permission bits (e.g. 755)") from None
    if not 0 <= value <= 0o7777 or text.startswith(("-", "+")):
        raise UsageError(f"invalid mode {text!r}: octal permission bits 0..7777")
    return value


def _id_arg(text: str) -> int:
    if not text.isdigit():
        raise UsageError(f"invalid id {text!r}: a non-negative integer")
    return int(text)


def time_arg(text: str) -> int:
    """Nanoseconds since the epoch, exactly (no binary float in between)."""
    from nokvfs.workspace import attributes

    if text == "now":
        return attributes.now_ns()
    if text.startswith("@"):
        try:
            seconds = decimal.Decimal(text[1:])
        except decimal.InvalidOperation:
            raise UsageError(f"invalid time {text!r}: @SECONDS[.FRACTION]") from None
        if not seconds.is_finite():
            raise UsageError(f"invalid time {text!r}")
        return int((seconds * 1_000_000_000).to_integral_value(rounding=decimal.ROUND_FLOOR))
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise UsageError(f"invalid time {text!r}: now, @SECONDS or ISO-8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return (moment - _EPOCH) // datetime.timedelta(microseconds=1) * 1000


def cmd_ln(args) -> int:
    from nokvfs.workspace import namespace

    if not args.symbolic:
        raise UsageError("hard links are not stored: `nokvfs ln -s TARGET WB:PATH` makes a symbolic link")
    dest = parse_target(args.path, allow_into=True)
    with open_root(args, write=True) as root:
        if dest.into or _is_directory(root, dest):
            name = os.path.basename(args.target.rstrip("/"))
            if not name:
                raise UsageError(f"{args.target!r} has no name to make the link under; give WB:PATH")
            dest = dest.child(name)
        entry = namespace.symlink(
            root, dest.workbench_id, dest.path, args.target, expected_generation=None if args.force else 0
        )
    if args.json:
        render.print_json(dict(render.write_json(dest.workbench_id, dest.path, entry), link_target=args.target))
    else:
        print(f"{render.write_result('ln', dest.workbench_id, dest.path, entry)} -> {render.safe(args.target)}")
    return 0


def cmd_readlink(args) -> int:
    from nokvfs.workspace import listing, namespace

    target = parse_target(args.path)
    with open_root(args, write=False) as root:
        with root.read() as view:
            info = listing.stat(view, root, target.workbench_id, target.path)
        if info.entry is None:
            raise IsADirectory(f"{target} is a directory, not a link")
        print(render.safe(namespace.read_link(root, info.entry)))
    return 0


def cmd_setattr(args) -> int:
    from nokvfs.workspace import attributes, namespace

    target = parse_target(args.path, need_path=True)
    changes = dict(mode=args.mode, uid=args.uid, gid=args.gid, mtime_ns=args.mtime, atime_ns=args.atime)
    if all(value is None for value in changes.values()):
        raise UsageError("nothing to set: give --mode, --uid, --gid, --mtime or --atime")
    with open_root(args, write=True) as root:
        if _is_directory(root, target):
            entry = namespace.set_directory_attributes(root, target.workbench_id, target.path, **changes)
            kind = "dir"
        else:
            entry = namespace.set_attributes(root, target.workbench_id, target.path, **changes)
            kind = render.entry_kind(entry)
    shown = attributes.shown(entry)
    if args.json:
        render.print_json(
            dict(
                render.attributes_json(shown, stored=True, kind=kind),
                workbench=target.workbench_id,
                path=target.path,
                kind=kind,
            )
        )
    else:
        print(
            f"{args.command} {render.safe(target)} {render.mode_text(kind, shown.mode)} "
            f"owner={render.owner_text(shown)} "
            f"mtime={render.iso_ms(shown.mtime_ns // 1_000_000)}"
        )
    return 0
