"""`nokvfs snapshot` and `nokvfs changes`: leased snapshots and the change feed.

nokvfs snapshot mint WB [--alias NAME] [--lease SECONDS] [--note TEXT] [--json]
nokvfs snapshot renew WB ID|ALIAS [--lease SECONDS]
nokvfs snapshot retire WB ID|ALIAS
nokvfs snapshot list WB [--json]
nokvfs snapshot reap [--grace-ms MS]
nokvfs changes [--workbench WB] [--after VERSION] [--follow] [--json]
"""

from __future__ import annotations

import sys
import time

from nokvfs.cli.common import add_json_option, open_root
from nokvfs.cli.render import print_json, safe


def register(subparsers) -> None:
    snap = subparsers.add_parser("snapshot", help="leased snapshots of a workbench")
    verbs = snap.add_subparsers(dest="snapshot_command", metavar="VERB", required=True)
    p = verbs.add_parser("mint", help="mint a snapshot (optionally named; reminting moves the name)")
    p.add_argument("workbench", metavar="WB")
    p.add_argument("--alias", help="a name for the snapshot")
    p.add_argument("--lease", type=float, default=3600.0, metavar="SECONDS", help="lease length (default 3600)")
    p.add_argument("--note", help="an annotation stored with the snapshot")
    add_json_option(p)
    p.set_defaults(func=cmd_mint)
    p = verbs.add_parser("renew", help="extend a snapshot's lease (never shortens it)")
    p.add_argument("workbench", metavar="WB")
    p.add_argument("selector", metavar="ID|ALIAS")
    p.add_argument("--lease", type=float, default=3600.0, metavar="SECONDS")
    p.set_defaults(func=cmd_renew)
    p = verbs.add_parser("retire", help="retire a snapshot (releases its history hold)")
    p.add_argument("workbench", metavar="WB")
    p.add_argument("selector", metavar="ID|ALIAS")
    p.set_defaults(func=cmd_retire)
    p = verbs.add_parser("list", help="list a workbench's snapshots")
    p.add_argument("workbench", metavar="WB")
    add_json_option(p)
    p.set_defaults(func=cmd_list)
    p = verbs.add_parser("reap", help="claim snapshots whose lease ran out (after the skew grace)")
    p.add_argument("--grace-ms", type=int, default=5_000)
    p.set_defaults(func=cmd_reap)

    p = subparsers.add_parser("changes", help="the change feed of the root or one workbench")
    p.add_argument("--workbench", metavar="WB")
    p.add_argument("--after", type=int, metavar="VERSION", help="only changes after this commit version")
    p.add_argument("--follow", action="store_true", help="keep printing new changes")
    add_json_option(p, "one JSON object per line")
    p.set_defaults(func=cmd_changes)


def _selector(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _snapshot_json(s) -> dict:
    return {
        "snapshot_id": s.snapshot_id,
        "workbench": s.workbench.workbench_id,
        "alias": s.ref.alias,
        "state": s.ref.state.name,
        "expired": s.expired,
        "read_version": s.ref.read_version,
        "lease_deadline_ms": s.ref.lease_deadline,
        "consumers": s.ref.consumer_count,
        "annotation": s.ref.annotation,
    }


def _line(s) -> str:
    state = "expired" if s.expired else s.ref.state.name.lower()
    return f"{s.snapshot_id:>10}  {state:<11} v{s.ref.read_version:<8} {safe(s.ref.alias or '-')}"


def cmd_mint(args) -> int:
    from nokvfs.workspace import snapshot

    with open_root(args, write=True) as root:
        s = snapshot.mint(root, args.workbench, alias=args.alias, lease_seconds=args.lease, annotation=args.note)
    print_json(_snapshot_json(s)) if args.json else print(
        f"snapshot {s.snapshot_id}" + (f" ({safe(s.ref.alias)})" if s.ref.alias else "")
    )
    return 0


def cmd_renew(args) -> int:
    from nokvfs.workspace import snapshot

    with open_root(args, write=True) as root:
        s = snapshot.renew(root, args.workbench, _selector(args.selector), lease_seconds=args.lease)
    print(f"snapshot {s.snapshot_id} leased until {s.ref.lease_deadline} ms")
    return 0


def cmd_retire(args) -> int:
    from nokvfs.workspace import snapshot

    with open_root(args, write=True) as root:
        print(f"snapshot {snapshot.retire(root, args.workbench, _selector(args.selector))} retired")
    return 0


def cmd_list(args) -> int:
    from nokvfs.workspace import snapshot

    with open_root(args, write=False) as root:
        snaps = snapshot.list_snapshots(root, args.workbench)
    if args.json:
        print_json([_snapshot_json(s) for s in snaps])
    else:
        for s in snaps:
            print(_line(s))
    return 0


def cmd_reap(args) -> int:
    from nokvfs.workspace import snapshot

    with open_root(args, write=True) as root:
        reaped = snapshot.reap(root, skew_grace_ms=args.grace_ms)
    print(f"reaped {len(reaped)} snapshot(s)" + (": " + " ".join(map(str, reaped)) if reaped else ""))
    return 0


def _change_json(c) -> dict:
    return {
        "commit_version": c.commit_version,
        "sequence": c.event_sequence,
        "workbench": c.workbench_id,
        "incarnation": c.incarnation_id.hex(),
        "kind": c.kind.name,
        "path": c.path,
        "before": None if c.before is None else c.before.hex(),
        "after": None if c.after is None else c.after.hex(),
    }


def cmd_changes(args) -> int:
    import json

    from nokvfs.cli.main import EXIT_NOT_FOUND
    from nokvfs.errors import CursorExpired
    from nokvfs.workspace import changes

    with open_root(args, write=False) as root:
        cursor, after = None, args.after
        while True:
            try:
                page = changes.read_changes(
                    root, workbench_id=args.workbench, cursor=cursor, after_commit_version=after, limit=1000
                )
            except CursorExpired as exc:
                # Events this feed had not printed yet were removed by retention: say how to resync.
                print(
                    f"nokvfs: changes after version {exc.position} are no longer kept (retention keeps those after "
                    f"version {exc.floor}). Resynchronise: read the current state (version {exc.current}, e.g. "
                    f"`nokvfs ls -R`), then run `nokvfs changes --after {exc.current} --follow`.",
                    file=sys.stderr,
                )
                return EXIT_NOT_FOUND  # the code of HistoryNotRetained, which CursorExpired is
            after = None
            for c in page.changes:
                if args.json:
                    print(json.dumps(_change_json(c), sort_keys=True))
                else:
                    print(f"v{c.commit_version:<8} {c.workbench_id:<20} {c.kind.name:<18} {safe(c.path or '')}")
            sys.stdout.flush()
            cursor = page.cursor
            if page.more:
                continue
            if not args.follow:
                return 0
            time.sleep(0.5)
