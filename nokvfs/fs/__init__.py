"""The FUSE mount of a nokvfs root (pyfuse3 + trio).

Thin by design: it translates syscalls into facade calls and owns no durable state.

    operations.py  the pyfuse3.Operations subclass (translation only)
    tree.py        names to nodes, and what may be created, removed or renamed where
    views.py       what a part of the mount reads from: the live root, or a read-only view of a
                   snapshot, a commit or a tag (`/<wb>/.snapshots|.commits|.tags/<name>/`)
    inodes.py      deterministic xxh3 inode numbers, the collision table, lookup counts, forget
    overlay.py     in-memory directories (mkdir) and created-not-yet-published files
    handles.py     open file/directory handles and the write spools behind them
    prefetch.py    whole verified blocks in memory, fetched ahead of sequential readers
    attrs.py       the one EntryAttributes builder and the kernel timeouts per kind
    xattrs.py      index fields as `user.nokv.<name>` xattrs, and the `user.nokvfs.*` facts
    errors.py      the one nokvfs-error -> errno mapping
    freshness.py   the change-feed follower and kernel cache invalidation
    threads.py     bounded worker threads for blocking work
    daemon.py      mount/umount, daemonising, readiness, signals, pid files, stale mounts
    replication.py `--replicate`: the shard shipped to a bucket while mounted, a last push at unmount
"""
