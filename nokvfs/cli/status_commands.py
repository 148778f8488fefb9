"""`nokvfs status [MOUNTPOINT] [--json]`: ask running mounts how they are doing.

Without MOUNTPOINT every nokvfs mount in the mount table is asked. Each daemon answers over its
owner-only socket (nokvfs.fs.status); the data directory comes from the mount table (the mount's
source is `nokvfs:<data_dir>`), else from --data-dir. Exit 3 when a mount cannot be asked.
"""

from __future__ import annotations

import os
import sys

from nokvfs.cli.common import add_json_option


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "status",
        help="what a running mount is doing: publications, reads, store calls, spools, cache, lag, memory",
        description="Ask running nokvfs mounts (all, or the one at MOUNTPOINT) for their counters and latencies.",
    )
    p.add_argument("mountpoint", nargs="?", metavar="MOUNTPOINT", help="one mount (default: every nokvfs mount)")
    add_json_option(p, "one JSON document (an array without MOUNTPOINT)")
    p.set_defaults(func=status)


def _targets(args) -> list[tuple[str, str]]:
    from nokvfs.errors import MountUnavailable
    from nokvfs.fs.mountinfo import nokvfs_mounts

    fallback = os.path.abspath(args.data_dir)
    mounts = [(mountpoint, data_dir or fallback) for mountpoint, data_dir in nokvfs_mounts()]
    if args.mountpoint is None:
        return mounts
    wanted = os.path.abspath(args.mountpoint)
    for mountpoint, data_dir in mounts:
        if mountpoint == wanted:
            return [(mountpoint, data_dir)]
    raise MountUnavailable(f"{args.mountpoint} is not a nokvfs mount")


def status(args) -> int:
    from nokvfs.cli.render import print_json
    from nokvfs.errors import MountUnavailable
    from nokvfs.fs.status import query

    targets = _targets(args)
    documents, failures = [], []
    for mountpoint, data_dir in targets:
        try:
            documents.append(query(data_dir, mountpoint))
        except MountUnavailable as exc:
            if args.mountpoint is not None:
                raise
            failures.append(str(exc))
    if args.json:
        print_json(documents[0] if args.mountpoint is not None else documents)
    else:
        if not documents and not failures:
            print("no nokvfs mounts")
        for document in documents:
            print(render(document))
    for failure in failures:
        print(f"nokvfs: {failure}", file=sys.stderr)
    return 3 if failures else 0


def _meter(meter: dict) -> str:
    failed = meter["failed"]
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(meter["failures"].items()))
    text = f"{meter['count']} (mean {meter['mean_ms']:.2f} ms, max {meter['max_ms']:.1f} ms)"
    return text + (f", {failed} failed ({kinds})" if failed else "")


def render(s: dict) -> str:
    from nokvfs.cli.common import human_size
    from nokvfs.cli.render import safe

    lines = [
        f"{safe(s['mountpoint'])}",
        f"  data directory:  {safe(s['data_dir'])}",
        f"  mode:            {s['mode']}" + (f" ({safe(s['read_only_reason'])})" if s.get("read_only_reason") else ""),
        f"  daemon:          pid {s['pid']}, up {_duration(s['uptime_s'])}, resident {human_size(s['rss_bytes'])}"
        + (
            f" ({human_size(s['rss_anon_bytes'])} heap, {human_size(s['rss_file_bytes'])} mapped files)"
            if "rss_anon_bytes" in s
            else ""
        ),
        f"  publications:    {_meter(s['publications'])}",
        f"  reads:           {_meter(s['reads'])}",
        f"  writes:          {_meter(s['writes'])}",
    ]
    for call, meter in sorted(s["store"].items()):
        lines.append(f"  store {call + ':':<11}{_meter(meter)}")
    lines.append(f"  syscall timeouts: {s['syscall_timeouts']}")
    spools = s["spools"]
    kept = ", ".join(f"{safe(k)} {n}" for k, n in sorted(spools["kept_by_reason"].items()))
    lines.append(
        f"  spools:          {spools['open']} open, {spools['kept']} kept ({human_size(spools['kept_bytes'])})"
        + (f": {kept}" if kept else "")
    )
    write_back = s.get("write_back")
    if write_back is not None:
        lines.append(
            f"  write-back:      {write_back['backlog']} waiting to publish; {write_back['accepted']} accepted, "
            f"{write_back['published']} published, {write_back['failed']} failed"
        )
    shard = s.get("shard")
    if shard is not None:
        lines.append(
            f"  shard:           {human_size(shard['file_bytes'])} file, {human_size(shard['used_bytes'])} in use"
        )
    maintenance = s.get("maintenance")
    if maintenance is None:
        lines.append("  maintenance:     off")
    else:
        lines.append(
            f"  maintenance:     every {maintenance['interval_s']:g} s; {maintenance['passes']} pass(es), "
            f"{maintenance['freed_revisions']} revision(s) freed, {maintenance['compactions']} compaction(s) "
            f"({human_size(maintenance['compacted_bytes'])} given back)"
        )
    cache = s["block_cache"]
    if cache is None:
        # None configured (a local store by default), or another process holds it: either way,
        # reads go to the store, every block verified.
        lines.append("  block cache:     none (reads go to the store)")
    else:
        rate = "n/a" if cache["hit_rate"] is None else f"{cache['hit_rate'] * 100:.1f}%"
        lines.append(
            f"  block cache:     {human_size(cache['bytes'])} of {human_size(cache['max_bytes'])}, hit rate {rate} "
            f"({cache['hits']} hits, {cache['misses']} misses)"
        )
    memory = s["memory_blocks"]
    lines.append(
        f"  memory blocks:   {human_size(memory['bytes'])} of {human_size(memory['max_bytes'])} ({memory['fetched']} "
        f"fetched, {memory['prefetched']} prefetched, {memory['hits']} hits)"
    )
    feed = s["change_feed"]
    lines.append(
        f"  change feed:     commit version {feed['shard_commit_version']}, {feed['versions_behind']} behind, "
        f"{feed['events_followed']} events followed"
    )
    replication = s["replication"]
    if replication is not None:
        if replication["role"] == "owner":
            if not replication["started"]:
                lines.append(f"  replication:     to {safe(replication['bucket'])}, not started yet")
            else:
                since = replication["seconds_since_push"]
                lines.append(
                    f"  replication:     to {safe(replication['bucket'])}, {replication['records_behind']} record(s) "
                    "unshipped, "
                    + ("no push yet" if since is None else f"last push {since:.1f} s ago")
                    + (", FENCED" if replication["fenced"] else "")
                    + (f", last error {safe(replication['last_error'])}" if replication["last_error"] else "")
                )
        elif replication.get("started"):
            lines.append(
                f"  following:       {safe(replication['bucket'])}, {replication['versions_behind']} version(s) and "
                f"{replication['behind_ms'] / 1000:.1f} s behind"
                + (f", last error {safe(replication['last_error'])}" if replication.get("last_error") else "")
            )
        else:
            lines.append("  following:       not started yet")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
