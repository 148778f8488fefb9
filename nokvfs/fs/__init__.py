"""The FUSE mount of a nokvfs root (pyfuse3 + trio).

Thin by design: it translates syscalls into facade calls and owns no durable state. The rules
live in modules named after them, under a filesystem core that tests drive without a kernel.

    operations.py   the pyfuse3.Operations subclass: protocol translation only
    filesystem.py   the core: one method per request, the handle table, lookup counts
    tree.py         names to nodes, and what each node shows (one revision per inode)
    names.py        what a name may be and where a change is refused (the errno rules)
    listing.py      directory listings, paged from an anchor
    files.py        open, read, write, flush, release, setattr, unlink, rename, links
    spools.py       the one write state of a file in the mount, sidecars, kept spools
    directories.py  mkdir, rmdir, directory attributes, `.snapshots/` mint and retire
    changes.py      what another process's change means for the kernel's caches
    freshness.py    the change-feed follower and the kernel cache invalidator
    views.py        the live root and the read-only views of snapshots, commits and tags
    inodes.py       deterministic xxh3 inode numbers, the collision table, lookup counts, forget
    overlay.py      in-memory directories (mkdir) and created-not-yet-published files
    prefetch.py     whole verified blocks in memory, fetched ahead of sequential readers
    attrs.py        the one EntryAttributes builder and the kernel timeouts per kind
    xattrs.py       index fields as `user.nokv.<name>` xattrs, and the `user.nokvfs.*` facts
    errors.py       the one nokvfs-error -> errno mapping
    threads.py      bounded worker threads, and the deadline of every syscall
    daemon.py       a mount's life: options, daemonising, readiness, signals, pid files
    mountinfo.py    the kernel's mount table, stale mounts, unmounting
    replication.py  `--replicate` and `--follow`: the shard and the bucket while mounted
"""
