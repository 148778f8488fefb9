"""`nokvfs mount` and `nokvfs umount`: the FUSE mount of a data directory's workbenches.

    nokvfs mount DATA_DIR MOUNTPOINT [--foreground] [--read-only] [--allow-other] [--write-back] [--no-xattrs]
                 [--replicate s3://bucket/prefix [--replicate-endpoint-url URL]
                  [--replicate-interval SECONDS]] [--metrics [ADDRESS:]PORT]
    nokvfs --data-dir DATA_DIR mount MOUNTPOINT
    nokvfs umount MOUNTPOINT [--lazy]
    nokvfs status [MOUNTPOINT] [--json]         (nokvfs.cli.status_commands) counters of live mounts
    nokvfs spool list [--json]                  writes a mount could not publish, and why
    nokvfs spool retry ID [--force]             publish one (expecting what it expected)
    nokvfs spool discard ID                     drop one

Without --foreground, `mount` returns (exit 0) once the mount is live and the daemon runs
detached (log and pid file under DATA_DIR/run/). With --replicate the daemon ships the shard to
the bucket while mounted and pushes once more at unmount (`nokvfs shard restore` brings it back);
replication failures are logged, never fatal. Each workbench directory also holds the read-only
views `.snapshots/`, `.commits/` and `.tags/` (`ls -a`; `mkdir .snapshots/NAME` mints a
snapshot, `rmdir` retires it), and files expose their index fields as `user.nokv.*` xattrs (not
with --no-xattrs, which leaves every xattr call to the kernel: ENOTSUP, no round trip). The work
is in nokvfs.fs.daemon; pyfuse3 and trio are imported only when a handler runs.
"""

from __future__ import annotations

import argparse
import os

from nokvfs.cli.common import add_json_option
from nokvfs.fs.daemon import (
    DEFAULT_FOLLOW_INTERVAL,
    DEFAULT_FOLLOW_LAG_WARNING,
    DEFAULT_MEMORY_MB,
    DEFAULT_READ_AHEAD_KB,
    DEFAULT_REPLICATE_INTERVAL,
    DEFAULT_SYSCALL_TIMEOUT,
    DEFAULT_WORKERS,
    MountOptions,
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "mount",
        help="mount the Visible workbenches at a directory (FUSE)",
        description="Mount the data directory's Visible workbenches. "
        "With two operands the first is the data directory.",
    )
    add_mount_arguments(p)
    p.set_defaults(func=mount)

    p = subparsers.add_parser("umount", help="unmount a nokvfs mount and wait for its daemon to exit")
    add_umount_arguments(p)
    p.set_defaults(func=umount)

    p = subparsers.add_parser("spool", help="list, republish or drop the writes a mount kept unpublished")
    sub = p.add_subparsers(dest="spool_command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", help="every spool: kept ones with their reason, live ones with their daemon")
    add_json_option(listing)
    listing.set_defaults(func=spool_list)
    retry = sub.add_parser("retry", help="publish a kept spool at its path")
    retry.add_argument("id", metavar="ID", help="the spool's id (or a unique tail of it)")
    retry.add_argument(
        "--force",
        action="store_true",
        help="replace whatever the path holds now (default: only what the spool expected)",
    )
    retry.set_defaults(func=spool_retry)
    discard = sub.add_parser("discard", help="delete a kept spool and its sidecar")
    discard.add_argument("id", metavar="ID")
    discard.set_defaults(func=spool_discard)


def mount(args) -> int:
    from nokvfs.fs import daemon

    return daemon.mount(mount_options(args))


def mount_options(args) -> MountOptions:
    """The MountOptions `nokvfs mount`'s command line asks for."""
    data_dir, mountpoint = split_mount_paths(args)
    return MountOptions(
        data_dir=data_dir,
        mountpoint=mountpoint,
        foreground=args.foreground,
        read_only=args.read_only,
        allow_other=args.allow_other,
        debug=bool(getattr(args, "debug", False)),
        workers=args.workers,
        memory_bytes=args.memory_cache_mb * 1024 * 1024,
        read_ahead_kb=args.read_ahead_kb,
        syscall_timeout=args.syscall_timeout,
        store=getattr(args, "store", None),
        endpoint_url=getattr(args, "endpoint_url", None),
        replicate=args.replicate,
        replicate_endpoint_url=args.replicate_endpoint_url,
        replicate_interval=args.replicate_interval,
        sync=args.sync,
        write_back=args.write_back,
        xattrs=not args.no_xattrs,
        follow=args.follow,
        follow_endpoint_url=_follow_endpoint(args),
        follow_interval=args.follow_interval,
        follow_lag_warning=args.follow_lag_warning,
        maintenance_interval=args.maintenance_interval,
        metrics=args.metrics,
    )


def umount(args) -> int:
    from nokvfs.fs import daemon
    from nokvfs.fs.mountinfo import mount_data_dir

    # The mount names its data directory (its source), so the daemon is found and waited for
    # (a write-back daemon publishes before it exits) without --data-dir.
    served = mount_data_dir(args.mountpoint)
    data_dirs = (
        ([served] if served else [])
        + [os.path.abspath(args.data_dir)]
        + ([os.path.abspath(os.environ["NOKVFS_DATA_DIR"])] if os.environ.get("NOKVFS_DATA_DIR") else [])
    )
    return daemon.umount(args.mountpoint, data_dirs=data_dirs, lazy=args.lazy, timeout=args.timeout)


# --- options --------------------------------------------------------------------------------


def add_mount_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "mount_first",
        metavar="DATA_DIR",
        help="the data directory; alone, the mountpoint (the data directory is then --data-dir)",
    )
    parser.add_argument("mount_second", nargs="?", metavar="MOUNTPOINT", help="the mountpoint")
    parser.add_argument(
        "-f",
        "--foreground",
        action="store_true",
        help="stay in the foreground (default: detach once the mount is live)",
    )
    parser.add_argument("--read-only", action="store_true", help="refuse every change (EROFS)")
    parser.add_argument(
        "--allow-other",
        action="store_true",
        help="let other users access the mount (needs user_allow_other in /etc/fuse.conf for non-root)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help=f"worker threads for uploads, downloads and commits (default {DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--memory-cache-mb",
        type=int,
        default=DEFAULT_MEMORY_MB,
        help=f"verified blocks kept in memory for reads (default {DEFAULT_MEMORY_MB})",
    )
    parser.add_argument(
        "--read-ahead-kb",
        type=int,
        default=DEFAULT_READ_AHEAD_KB,
        help=f"kernel readahead of the mount, 0 keeps the kernel's (default {DEFAULT_READ_AHEAD_KB}; needs root)",
    )
    parser.add_argument(
        "--syscall-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_SYSCALL_TIMEOUT,
        help="longest a syscall on the mount waits for the store or a publication before it fails with EIO (default "
        f"{DEFAULT_SYSCALL_TIMEOUT:g})",
    )
    parser.add_argument(
        "--write-back",
        action="store_true",
        help="close(2) returns once the bytes are durable on this machine; they are published in the background, in "
        "order (fsync(2) waits for the publication; `nokvfs umount` drains; a crash is replayed at the next mount)",
    )
    parser.add_argument(
        "--no-xattrs",
        action="store_true",
        help="offer no extended attributes: the kernel answers every xattr call ENOTSUP itself, sparing `ls -l` two "
        "daemon round trips per file and a first write one (index fields stay readable with `nokvfs stat`)",
    )
    parser.add_argument(
        "--replicate",
        metavar="URL",
        default=None,
        help="while mounted, ship the shard to this bucket (s3://bucket/prefix); a last push at unmount",
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="with --replicate: close(2) and fsync(2) return only once the bucket holds the write (no accepted write "
        "is lost with the machine)",
    )
    parser.add_argument(
        "--replicate-endpoint-url",
        metavar="URL",
        default=None,
        help="S3 endpoint of the --replicate bucket (default: AWS)",
    )
    parser.add_argument(
        "--replicate-interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_REPLICATE_INTERVAL,
        help=f"seconds between pushes (default {DEFAULT_REPLICATE_INTERVAL:g})",
    )
    parser.add_argument(
        "--follow",
        metavar="URL",
        default=None,
        help="mount the root a bucket (s3://bucket/prefix) holds, read-only, following its owner",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="the follower's data directory (default: under $XDG_CACHE_HOME/nokvfs/follow/)",
    )
    parser.add_argument(
        "--follow-endpoint-url",
        metavar="URL",
        default=None,
        help="S3 endpoint of the --follow bucket (default: --endpoint-url, else AWS)",
    )
    parser.add_argument(
        "--follow-interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_FOLLOW_INTERVAL,
        help=f"seconds between polls of the bucket (default {DEFAULT_FOLLOW_INTERVAL:g})",
    )
    parser.add_argument(
        "--maintenance-interval",
        metavar="SECONDS",
        type=_maintenance_seconds,
        default=None,
        help="seconds between background GC/retention passes (0: off; default: the data directory's "
        "`maintenance` setting, else 300)",
    )
    parser.add_argument(
        "--metrics",
        metavar="[ADDRESS:]PORT",
        type=_listen,
        default=None,
        help="serve Prometheus metrics at http://ADDRESS:PORT/metrics (ADDRESS defaults to 127.0.0.1)",
    )
    parser.add_argument(
        "--follow-lag-warning",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_FOLLOW_LAG_WARNING,
        help=f"log the lag once it exceeds this (default {DEFAULT_FOLLOW_LAG_WARNING:g})",
    )


def _listen(text: str) -> tuple[str, int]:
    from nokvfs.errors import InvalidInput
    from nokvfs.fs.metrics import parse_listen

    try:
        return parse_listen(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 86400 * 365:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def _maintenance_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < 86400 * 365:
        raise argparse.ArgumentTypeError(f"{text} must be 0 (off) or a positive number of seconds")
    return value


def add_umount_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    parser.add_argument("--lazy", action="store_true", help="detach now even if busy (umount -l)")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the daemon to exit (default 30)"
    )


def split_mount_paths(args) -> tuple[str, str]:
    """(data dir, mountpoint): `mount DATA_DIR MOUNTPOINT` (the positional wins) or `mount MOUNTPOINT`."""
    paths = [p for p in (args.mount_first, args.mount_second) if p is not None]
    if len(paths) == 2:
        return os.path.abspath(paths[0]), os.path.abspath(paths[1])
    if getattr(args, "follow", None):
        if args.cache_dir:
            return os.path.abspath(args.cache_dir), os.path.abspath(paths[0])
        from nokvfs.replicate.follower import default_cache_dir

        return default_cache_dir(args.follow, _follow_endpoint(args)), os.path.abspath(paths[0])
    return os.path.abspath(args.data_dir), os.path.abspath(paths[0])


def _follow_endpoint(args) -> str | None:
    return getattr(args, "follow_endpoint_url", None) or getattr(args, "endpoint_url", None)


def spool_list(args) -> int:
    from nokvfs.cli.common import human_size
    from nokvfs.cli.render import print_json, safe
    from nokvfs.fs import spools

    found = spools.scan(args.data_dir)
    if args.json:
        print_json([spool.as_json() for spool in found])
        return 0
    for spool in found:
        record = spool.record
        where = f"{record.get('workbench', '?')}:{record.get('path', '?')}"
        if spool.live:
            state, reason = f"live (pid {record.get('pid')})", ""
        elif spools.holds_nothing_to_keep(record):
            state, reason = (
                "left",
                f"  its daemon ended; it {spools.why_nothing_to_keep(record)} (the next mount removes it)",
            )
        else:
            state, reason = "kept", f"  {record.get('reason') or 'no reason recorded'}"
        print(f"{safe(spool.id)}  {state:<16} {human_size(spool.size):>9}  {safe(where)}{safe(reason)}")
    return 0


def spool_retry(args) -> int:
    from nokvfs.cli.common import open_root
    from nokvfs.cli.render import safe
    from nokvfs.fs import spools

    spool = spools.find(args.data_dir, args.id)
    with open_root(args, write=True) as root:
        entry = spools.retry(root, spool, force=args.force)
    record = spool.record
    print(
        f"published {safe(record.get('workbench'))}:{safe(record.get('path'))} generation {entry.generation} "
        f"({entry.logical_size} bytes)"
    )
    return 0


def spool_discard(args) -> int:
    from nokvfs.cli.render import safe
    from nokvfs.fs import spools

    spool = spools.find(args.data_dir, args.id)
    spools.discard(spool)
    print(f"discarded {safe(spool.id)}")
    return 0
