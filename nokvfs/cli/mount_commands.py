"""`nokvfs mount` and `nokvfs umount`: the FUSE mount of a data directory's workbenches.

    nokvfs mount DATA_DIR MOUNTPOINT [--foreground] [--read-only] [--allow-other]
                 [--replicate s3://bucket/prefix [--replicate-endpoint-url URL]
                  [--replicate-interval SECONDS]]
    nokvfs --data-dir DATA_DIR mount MOUNTPOINT
    nokvfs umount MOUNTPOINT [--lazy]

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


def mount(args) -> int:
    from nokvfs.fs import daemon

    return daemon.mount(args)


def umount(args) -> int:
    from nokvfs.fs import daemon

    return daemon.umount(args)
