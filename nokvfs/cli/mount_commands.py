"""`nokvfs mount` and `nokvfs umount`: the FUSE mount of a data directory's workbenches.

    nokvfs mount DATA_DIR MOUNTPOINT [--foreground] [--read-only] [--allow-other]
                 [--replicate s3://bucket/prefix [--replicate-endpoint-url URL]
                  [--replicate-interval SECONDS]]
    nokvfs --data-dir DATA_DIR mount MOUNTPOINT
    nokvfs umount MOUNTPOINT [--lazy]
    nokvfs spool list [--json]                  writes a mount could not publish, and why
    nokvfs spool retry ID [--force]             publish one (expecting what it expected)
    nokvfs spool discard ID                     drop one

Without --foreground, `mount` returns (exit 0) once the mount is live and the daemon runs
detached (log and pid file under DATA_DIR/run/). With --replicate the daemon ships the shard to
the bucket while mounted and pushes once more at unmount (`nokvfs shard restore` brings it back);
replication failures are logged, never fatal. Each workbench directory also holds the read-only
views `.snapshots/`, `.commits/` and `.tags/` (`ls -a`; `mkdir .snapshots/NAME` mints a
snapshot, `rmdir` retires it), and files expose their index fields as `user.nokv.*` xattrs. The
work is in nokvfs.fs.daemon; pyfuse3 and trio are imported only when a handler runs.
"""

from __future__ import annotations


def register(subparsers) -> None:
    from nokvfs.fs.daemon import add_mount_arguments, add_umount_arguments

    p = subparsers.add_parser(
        "mount",
        help="mount the Visible workbenches at a directory (FUSE)",
        description="Mount the data directory's Visible workbenches. With two operands the first is the data directory.",
    )
    add_mount_arguments(p, debug_option=False)
    p.set_defaults(func=mount)

    p = subparsers.add_parser("umount", help="unmount a nokvfs mount and wait for its daemon to exit")
    add_umount_arguments(p)
    p.set_defaults(func=umount)

    p = subparsers.add_parser("spool", help="list, republish or drop the writes a mount kept unpublished")
    sub = p.add_subparsers(dest="spool_command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", help="every spool: kept ones with their reason, live ones with their daemon")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=spool_list)
    retry = sub.add_parser("retry", help="publish a kept spool at its path")
    retry.add_argument("id", metavar="ID", help="the spool's id (or a unique tail of it)")
    retry.add_argument("--force", action="store_true", help="replace whatever the path holds now (default: only what the spool expected)")
    retry.set_defaults(func=spool_retry)
    discard = sub.add_parser("discard", help="delete a kept spool and its sidecar")
    discard.add_argument("id", metavar="ID")
    discard.set_defaults(func=spool_discard)


def mount(args) -> int:
    from nokvfs.fs import daemon

    return daemon.mount(args)


def umount(args) -> int:
    from nokvfs.fs import daemon

    return daemon.umount(args)


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
        state = f"live (pid {record.get('pid')})" if spool.live else "kept"
        where = f"{record.get('workbench', '?')}:{record.get('path', '?')}"
        reason = "" if spool.live else f"  {record.get('reason') or 'no reason recorded'}"
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
    print(f"published {safe(record.get('workbench'))}:{safe(record.get('path'))} generation {entry.generation} ({entry.logical_size} bytes)")
    return 0


def spool_discard(args) -> int:
    from nokvfs.cli.render import safe
    from nokvfs.fs import spools

    spool = spools.find(args.data_dir, args.id)
    spools.discard(spool)
    print(f"discarded {safe(spool.id)}")
    return 0
