"""`nokvfs gc`, `nokvfs retention`, `nokvfs fsck` and `nokvfs search`.

    nokvfs gc [--dry-run] [--keep-versions N] [--json]   also runs the retention pass
    nokvfs retention [--retain-versions N] [--retain-request-seconds S] [--retain-outbox-records N] [--json]
                     shows the data directory's retention settings, or changes the ones given
    nokvfs compact [--json]                           rewrite the shard without its free pages
                                                      (no process may have it open: ShardBusy)
    nokvfs fsck [--repair] [--no-blocks] [--json]       exit 0 clean, 5 when anything was found
    nokvfs search WB FIELD=VALUE | FIELD>VALUE | FIELD>=VALUE | FIELD<VALUE | FIELD<=VALUE
                     | 'FIELD in [A,B)' [--limit N] [--json]

Search values: integers, decimals, true/false/null; anything else is a string (prefix `s:` to
force a string, `t:` for an ISO-8601 timestamp with a zone).
"""

from __future__ import annotations

import datetime
import re

from nokvfs.cli.common import (
    UsageError,
    add_json_option,
    count_arg,
    human_size,
    open_root,
)
from nokvfs.cli.progress import Progress
from nokvfs.cli.render import print_json, safe

EXIT_FINDINGS = 5


def register(subparsers) -> None:
    p = subparsers.add_parser("gc", help="free the objects of revisions nothing references")
    p.add_argument("--dry-run", action="store_true", help="report what would be freed, change nothing")
    p.add_argument(
        "--keep-versions",
        metavar="N",
        type=count_arg("version count"),
        help="keep N commit versions of History beyond the holds (default: the data directory's history retention)",
    )
    add_json_option(p)
    p.set_defaults(func=cmd_gc)
    p = subparsers.add_parser(
        "retention", help="show or change how much of the change feed, replay dedupe and recovery outbox is kept"
    )
    add_retention_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_retention)
    p = subparsers.add_parser("compact", help="rewrite the shard without its free pages (nothing may have it open)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compact)
    p = subparsers.add_parser("fsck", help="check metadata against itself and the object store")
    p.add_argument("--repair", action="store_true", help="remove orphan objects (only with GC's proofs)")
    p.add_argument("--no-blocks", action="store_true", help="skip reading every block")
    add_json_option(p)
    p.set_defaults(func=cmd_fsck)
    p = subparsers.add_parser("search", help="find files by a typed index field")
    p.add_argument("workbench", metavar="WB")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--limit", type=int, default=1000)
    add_json_option(p)
    p.set_defaults(func=cmd_search)


RETENTION_OPTIONS = {
    "retain_versions": "versions",
    "retain_request_seconds": "request_seconds",
    "retain_outbox_records": "outbox_records",
}


def add_retention_options(parser) -> None:
    """The retention settings (nokvfs.workspace.retention), for `init` and `retention`."""
    from nokvfs.workspace import retention

    parser.add_argument(
        "--retain-versions",
        metavar="N",
        type=count_arg("version count"),
        help=f"commit versions of change events and replay dedupe kept (default {retention.DEFAULT_VERSIONS:,})",
    )
    parser.add_argument(
        "--retain-request-seconds",
        metavar="S",
        type=count_arg("seconds"),
        help=f"seconds an exact replay of a request stays answerable (default {retention.DEFAULT_REQUEST_SECONDS:,})",
    )
    parser.add_argument(
        "--retain-outbox-records",
        metavar="N",
        type=count_arg("record count"),
        help="recovery-outbox records kept by a shard that is not replicated "
        f"(default {retention.DEFAULT_OUTBOX_RECORDS:,}; a replicated one keeps what its bucket lacks)",
    )


def retention_changes(args) -> dict:
    return {
        field: getattr(args, option) for option, field in RETENTION_OPTIONS.items() if getattr(args, option) is not None
    }


def cmd_retention(args) -> int:
    from nokvfs.workspace import datadir

    changes = retention_changes(args)
    settings = datadir.set_retention(args.data_dir, **changes) if changes else datadir.retention_settings(args.data_dir)
    if args.json:
        print_json(settings.to_config())
    else:
        print(
            f"change events and replay dedupe: {settings.versions:,} versions; exact replays: "
            f"{settings.request_seconds:,} s; unreplicated recovery outbox: {settings.outbox_records:,} records"
        )
    return 0


def cmd_compact(args) -> int:
    import os

    from nokvfs.engine import compact
    from nokvfs.workspace.datadir import read_config

    read_config(args.data_dir)  # a data directory (NotFound otherwise)
    report = compact.compact(os.path.join(os.path.abspath(args.data_dir), "shard"))
    if args.json:
        print_json(vars(report))
    else:
        print(
            f"compacted the shard: {human_size(report.before_bytes)} -> {human_size(report.after_bytes)} (through LSN "
            f"{report.applied_lsn})"
        )
    return 0


def cmd_gc(args) -> int:
    from nokvfs.workspace import gc

    progress = Progress.for_args(
        args, "gc", units={"collect": "revisions freed", "prune History": "History rows pruned"}
    )
    kept = None
    with open_root(args, write=True) as root, progress:
        if not args.dry_run:
            # First: History below the ChangeEvent floor no longer has events to interpret.
            from nokvfs.workspace import retention

            kept = retention.run(root)
        report = gc.collect(root, dry_run=args.dry_run, progress=progress.report, keep_versions=args.keep_versions)
        if args.dry_run:
            progress.finish(
                f"would free {len(report.freed):,} revisions ({human_size(report.freed_bytes)}), prune "
                f"{report.history_pruned:,} History rows"
            )
        else:
            progress.finish(
                f"freed {report.freed_revisions:,} revisions ({human_size(report.freed_bytes)}), pruned "
                f"{report.history_pruned:,} History rows"
            )
    if args.json:
        print_json(
            {k: v for k, v in vars(report).items()}
            | {"dry_run": args.dry_run, "retention": None if kept is None else vars(kept)}
        )
    else:
        verb = "would free" if args.dry_run else "freed"
        count = len(report.freed) if args.dry_run else report.freed_revisions
        print(f"{verb} {count} revision(s), {human_size(report.freed_bytes)} ({report.freed_bytes} bytes)")
        print(
            f"{'would prune' if args.dry_run else 'pruned'} {report.history_pruned} History row(s) below version "
            f"{report.history_floor}"
        )
        if kept is not None:
            print(
                f"retention: removed {kept.events_removed} change event(s), {kept.requests_removed} replay dedupe "
                "row(s), "
                f"{kept.outbox_removed} recovery-outbox record(s)"
            )
        if report.held:
            print(f"{report.held} revision(s) kept by history holds")
        if report.reconciled:
            print(f"{report.reconciled} quarantined revision(s) taken up again")
        if report.quarantined:
            print(
                f"{report.quarantined} revision(s) quarantined: a delete was not confirmed; the next gc retries once "
                "the store answers (fsck lists them)"
            )
    return 0


def cmd_fsck(args) -> int:
    from nokvfs.workspace import fsck

    progress = Progress.for_args(
        args, "fsck", units={"metadata": "checks", "blocks": "objects", "store listing": "objects listed"}
    )
    with open_root(args, write=False) as root, progress:
        report = fsck.check(root, verify_blocks=not args.no_blocks, repair=args.repair, progress=progress.report)
        checked = ", ".join(f"{n} {what}" for what, n in report.checked.items())
        progress.finish(f"{len(report.findings)} finding(s); checked {checked}")
    if args.json:
        print_json(
            {
                "ok": report.ok,
                "checked": dict(report.checked),
                "findings": [{"code": f.code, "subject": f.subject, "detail": f.detail} for f in report.findings],
                "repaired": report.repaired,
            }
        )
    else:
        for finding in report.findings:
            print(f"{finding.code:<22} {safe(finding.subject)}: {safe(finding.detail)}")
        print(
            f"fsck: {len(report.findings)} finding(s); checked {checked}"
            + (f"; repaired {len(report.repaired)}" if report.repaired else "")
        )
    return 0 if report.ok else EXIT_FINDINGS


_COMPARE = re.compile(r"^(?P<field>[^=<>\s]+)\s*(?P<op>>=|<=|=|>|<)\s*(?P<value>.*)$")
_RANGE = re.compile(r"^(?P<field>\S+)\s+in\s+(?P<lo>[\[(])(?P<a>[^,]*),(?P<b>[^\])]*)(?P<hi>[\])])$")


def parse_value(text: str):
    text = text.strip()
    if text.startswith("s:"):
        return text[2:]
    if text.startswith("t:"):
        try:
            value = datetime.datetime.fromisoformat(text[2:].replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(f"not an ISO-8601 timestamp: {text[2:]!r}") from None
        if value.tzinfo is None:
            raise UsageError("a timestamp needs a zone (e.g. Z or +00:00)")
        return value
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?|-?\d+e-?\d+", text):
        return float(text)
    return text


def parse_query(text: str) -> tuple[str, dict]:
    match = _RANGE.match(text.strip())
    if match:
        a, b = match["a"].strip(), match["b"].strip()
        return match["field"], {
            "lower": parse_value(a) if a else None,
            "upper": parse_value(b) if b else None,
            "include_lower": match["lo"] == "[",
            "include_upper": match["hi"] == "]",
        }
    match = _COMPARE.match(text.strip())
    if not match:
        raise UsageError(f"cannot read the query {text!r}: use FIELD=VALUE, FIELD>VALUE, ... or 'FIELD in [A,B)'")
    field, op, value = match["field"], match["op"], parse_value(match["value"])
    if op == "=":
        if value is None:
            raise UsageError("search for null with FIELD in [null,null]")
        return field, {"equals": value}
    return field, {
        ">": {"lower": value, "include_lower": False},
        ">=": {"lower": value, "include_lower": True},
        "<": {"upper": value, "include_upper": False},
        "<=": {"upper": value, "include_upper": True},
    }[op]


def cmd_search(args) -> int:
    from nokvfs.workspace import index

    field, query = parse_query(args.query)
    with open_root(args, write=False) as root:
        page = index.search(root, args.workbench, field, limit=max(1, min(args.limit, 10_000)), **query)
    if args.json:
        print_json(
            [
                {"path": h.path, "value": h.value.value, "kind": h.value.kind.name, "generation": h.entry.generation}
                for h in page.hits
            ]
        )
    else:
        for hit in page.hits:
            value = hit.value.value
            shown = f"'{safe(value)}'" if isinstance(value, str) else safe(repr(value))
            print(f"{args.workbench}:{safe(hit.path)}\t{shown}")
    return 0
