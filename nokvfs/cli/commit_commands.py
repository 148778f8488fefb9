"""History commands: commit, log, tag, commit-retire, restore and as-of reads.

    nokvfs commit WB [--parent REF ...|--no-parents] [--tag NAME ...] [--producer TEXT]
                  [--lineage TEXT] [--no-replace] [--json]
    nokvfs log WB [--limit N] [--json]
    nokvfs tag set WB NAME COMMIT [--if-generation N] [--json]
    nokvfs tag delete WB NAME [--if-generation N] [--json]
    nokvfs tag list WB [--json]
    nokvfs commit-retire WB COMMIT [--json]
    nokvfs restore WB --from snapshot:ID|snapshot:ALIAS|commit:PREFIX|tag:NAME --to NEW_WB [--json]
    nokvfs as-of REF ls [PATH] [-l] [-R] [--json]
    nokvfs as-of REF get PATH [DEST] [-r] [-l] [--no-preserve] [--owner]
    nokvfs as-of REF stat [PATH] [--json]

References. A commit operand (COMMIT, `--parent`) is a lowercase hex prefix of a commit id of the
workbench's current incarnation (`3fa2`, up to all 64 digits), `commit:PREFIX`, or `tag:NAME`
(the commit the tag names). An as-of REF is `WB@snapshot:ID`, `WB@snapshot:ALIAS` (digits are
an id, anything else an alias), `WB@commit:PREFIX` or `WB@tag:NAME`; the kind is always spelled
out, since a snapshot id is also valid hex. A reference resolves to exactly one thing or fails:
a prefix naming several commits is an AmbiguousReference (exit 2) whose message lists every
match in full; no match is NotFound (exit 3); a malformed reference is exit 2.

commit   builds a commit of WB's current tree (nokvfs.workspace.commit.build). Parents default to
         the head (none for the first commit); `--parent` names them explicitly (repeatable, in
         order); `--no-parents` makes a root commit. `--tag` sets tags on the new commit after
         it is built (each tag is its own command: a failure there leaves the commit made).
         `--no-replace` refuses to commit while metadata/run_manifest.json exists. Prints
         `commit <64 hex> tree=<tree digest> workbench=WB members=N head_generation=G`.
log      the head and its first-parent ancestors, newest first, one line each:
         `<64 hex>  <committed at, UTC>  members=N  producer=P  tags=A,B` ('-' when empty).
tag      set (create or move; `--if-generation 0`: only if absent, N: only at generation N),
         delete, list (`<64 hex>  generation=N  NAME`, by name).
commit-retire
         retires a commit nothing consumes (commit.retire). A commit still consumed by the
         head, a tag, a restore/fork lease or a child commit is refused with exit 4 ("commit in
         use"), the message naming the consumers. A child commit consumes its parent, so the
         commits of a first-parent chain are retired from the newest non-head commit down.
restore  creates NEW_WB from a snapshot or commit of WB (restore.restore; an exact retry
         resumes or returns the same result). Prints `restored NEW_WB incarnation=<hex> from
         WB@KIND:SOURCE members=N`.
as-of    ls / get / stat of WB as of the reference, formatted and written exactly like the live
         commands (nokvfs.cli.trees), read through the workspace's as-of model
         (nokvfs.workspace.asof: a snapshot through its MVCC view at the held read version, a
         commit through its sealed members, like the mount's views), modes, times and links of
         then included. Only these read verbs exist under as-of.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from nokvfs.cli import render, trees
from nokvfs.cli.commands import (
    _generation_arg,
    add_get_options,
    list_tree,
    plan_get,
    run_get,
    show_stat,
)
from nokvfs.cli.common import (
    UsageError,
    add_json_option,
    open_root,
    parse_target,
)
from nokvfs.cli.progress import Progress, sampled
from nokvfs.errors import NotFound
from nokvfs.schema.names import check_tag_name, check_workbench_id

REF_KINDS = ("snapshot", "commit", "tag")
_UNLIMITED = 1 << 62
_SHOWN_CONSUMERS = 10


def register(subparsers) -> None:
    _register_commit(subparsers)
    _register_log(subparsers)
    _register_tag(subparsers)
    _register_retire(subparsers)
    _register_restore(subparsers)
    _register_as_of(subparsers)


def _limit_arg(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: a non-negative integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: a non-negative integer")
    return value


# --- references -----------------------------------------------------------------------------


def _split_kind(text: str, what: str) -> tuple[str, str]:
    kind, sep, selector = text.partition(":")
    if not sep or kind not in REF_KINDS:
        raise UsageError(f"{what} is snapshot:ID|ALIAS, commit:PREFIX or tag:NAME, not {text!r}")
    if not selector:
        raise UsageError(f"{what} {text!r} names no {kind}")
    return kind, selector


def _snapshot_selector(text: str) -> int | str:
    return int(text) if text.isascii() and text.isdigit() else text


def resolve_commit_in(view, root, workbench, text: str) -> bytes:
    """A commit operand (`PREFIX`, `commit:PREFIX` or `tag:NAME`) -> the 32-byte commit id."""
    from nokvfs.workspace import commit

    kind, sep, selector = text.partition(":")
    if not sep:
        return commit.resolve_in(view, root, workbench, text)
    if kind == "commit":
        return commit.resolve_in(view, root, workbench, selector)
    if kind == "tag":
        from nokvfs.workspace import tag

        return tag.resolve_in(view, root, workbench, selector).commit_id
    raise UsageError(f"a commit is a hex prefix, commit:PREFIX or tag:NAME, not {text!r}")


def resolve_commits(root, workbench_id: str, texts) -> list[bytes]:
    """Every commit operand resolved in one read view of the workbench."""
    from nokvfs.workspace import workbench as wb

    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        return [resolve_commit_in(view, root, workbench, t) for t in texts]


@dataclass(frozen=True)
class AsOfRef:
    workbench_id: str
    kind: str  # "snapshot" | "commit" | "tag"
    selector: str

    def __str__(self) -> str:
        return f"{self.workbench_id}@{self.kind}:{self.selector}"


def parse_as_of(text: str) -> AsOfRef:
    """`WB@snapshot:ID|ALIAS`, `WB@commit:PREFIX`, `WB@tag:NAME` (workbench ids never hold '@')."""
    workbench_id, sep, rest = text.partition("@")
    if not sep:
        raise UsageError(f"an as-of reference is WB@snapshot:ID|ALIAS, WB@commit:PREFIX or WB@tag:NAME, not {text!r}")
    check_workbench_id(workbench_id)
    kind, selector = _split_kind(rest, "an as-of reference")
    return AsOfRef(workbench_id, kind, selector)


# --- commit ---------------------------------------------------------------------------------


def _register_commit(subparsers) -> None:
    p = subparsers.add_parser("commit", help="commit a workbench's current tree (sealed, immutable, the new head)")
    p.add_argument("workbench", metavar="WB")
    parents = p.add_mutually_exclusive_group()
    parents.add_argument(
        "--parent",
        metavar="COMMIT",
        action="append",
        default=[],
        help="a parent: hex prefix, commit:PREFIX or tag:NAME (repeatable, in order; default: the head)",
    )
    parents.add_argument(
        "--no-parents", action="store_true", help="a root commit: no parents, even when there is a head"
    )
    p.add_argument(
        "--tag", metavar="NAME", action="append", default=[], help="set this tag on the new commit (repeatable)"
    )
    p.add_argument("--producer", metavar="TEXT", default="", help="producer recorded in the run manifest")
    p.add_argument("--lineage", metavar="TEXT", default="", help="lineage recorded in the run manifest")
    p.add_argument(
        "--no-replace", action="store_true", help="refuse (conflict) while metadata/run_manifest.json exists"
    )
    add_json_option(p)
    p.set_defaults(func=cmd_commit)


def cmd_commit(args) -> int:
    from nokvfs.workspace import commit, tag

    check_workbench_id(args.workbench)
    for name in args.tag:  # before the commit is made, so a bad name costs nothing
        check_tag_name(name)
    with open_root(args, write=True) as root:
        if args.no_parents:
            parents = []
        elif args.parent:
            parents = resolve_commits(root, args.workbench, args.parent)
            if len(set(parents)) != len(parents):
                raise UsageError("the same commit is named as a parent twice")
        else:
            parents = None
        result = commit.build(
            root,
            args.workbench,
            parents=parents,
            producer=args.producer,
            lineage=args.lineage,
            replace=not args.no_replace,
        )
        tags = [tag.set(root, args.workbench, name, result.commit_id) for name in dict.fromkeys(args.tag)]
    if args.json:
        out = render.jsonable(result)
        out["committed_at"] = render.iso_ms(result.committed_at_unix_seconds * 1000, seconds=True)
        out["tags"] = [{"name": t.name, "generation": t.generation} for t in tags]
        render.print_json(out)
    else:
        line = (
            f"commit {result.hex} tree={result.tree_digest_uri} workbench={result.workbench_id} "
            f"members={result.member_count} head_generation={result.head_generation}"
        )
        if tags:
            line += " tags=" + ",".join(render.safe(t.name) for t in tags)
        print(line)
    return 0


# --- log ------------------------------------------------------------------------------------


def _register_log(subparsers) -> None:
    p = subparsers.add_parser("log", help="the head commit and its first-parent ancestors, newest first")
    p.add_argument("workbench", metavar="WB")
    p.add_argument("--limit", "-n", metavar="N", type=_limit_arg, help="at most N commits (default: all)")
    add_json_option(p)
    p.set_defaults(func=cmd_log)


def _tags_by_commit(root, workbench_id: str) -> dict[bytes, list[str]]:
    from nokvfs.workspace import tag

    out: dict[bytes, list[str]] = {}
    for info in tag.list_tags(root, workbench_id):
        out.setdefault(info.commit_id, []).append(info.name)
    return out


def _log_json(info, tags: list[str], is_head: bool) -> dict:
    c = info.commit
    return {
        "commit_id": info.hex,
        "committed_at_unix_seconds": c.committed_at_unix_seconds,
        "committed_at": render.iso_ms(c.committed_at_unix_seconds * 1000, seconds=True),
        "members": c.member_count,
        "producer": c.producer,
        "lineage": c.lineage,
        "parents": [p.hex() for p in c.parents],
        "tags": tags,
        "state": c.state.name,
        "tree_digest_uri": c.tree_digest_uri,
        "head": is_head,
    }


def _log_line(info, tags: list[str]) -> str:
    c = info.commit
    when = render.iso_ms(c.committed_at_unix_seconds * 1000, seconds=True)
    shown_tags = ",".join(map(render.safe, tags)) or "-"
    return f"{info.hex}  {when}  members={c.member_count}  producer={render.safe(c.producer or '-')}  tags={shown_tags}"


def cmd_log(args) -> int:
    from nokvfs.workspace import commit

    limit = _UNLIMITED if args.limit is None else args.limit
    with open_root(args, write=False) as root:
        entries = commit.log(root, args.workbench, limit=limit) if limit else []
        tags = _tags_by_commit(root, args.workbench) if entries else {}
    if args.json:
        render.print_json([_log_json(info, tags.get(info.commit_id, []), i == 0) for i, info in enumerate(entries)])
    else:
        for info in entries:
            print(_log_line(info, tags.get(info.commit_id, [])))
    return 0


# --- tag ------------------------------------------------------------------------------------


def _register_tag(subparsers) -> None:
    p = subparsers.add_parser("tag", help="named, movable references to commits")
    verbs = p.add_subparsers(dest="tag_command", metavar="<set|delete|list>", required=True)
    s = verbs.add_parser("set", help="create or move a tag")
    s.add_argument("workbench", metavar="WB")
    s.add_argument("name", metavar="NAME")
    s.add_argument("commit", metavar="COMMIT", help="hex prefix, commit:PREFIX or tag:NAME")
    s.add_argument(
        "--if-generation", metavar="N", type=_generation_arg, help="only if the tag is at generation N (0: absent)"
    )
    add_json_option(s)
    s.set_defaults(func=cmd_tag_set)
    d = verbs.add_parser("delete", help="delete a tag (the commit stays)")
    d.add_argument("workbench", metavar="WB")
    d.add_argument("name", metavar="NAME")
    d.add_argument("--if-generation", metavar="N", type=_generation_arg, help="only if the tag is at generation N")
    add_json_option(d)
    d.set_defaults(func=cmd_tag_delete)
    ls = verbs.add_parser("list", help="a workbench's tags, by name")
    ls.add_argument("workbench", metavar="WB")
    add_json_option(ls)
    ls.set_defaults(func=cmd_tag_list)


def _tag_json(info) -> dict:
    return {
        "name": info.name,
        "commit_id": info.commit_id.hex(),
        "generation": info.generation,
        "workbench": info.workbench.workbench_id,
    }


def cmd_tag_set(args) -> int:
    from nokvfs.workspace import tag

    check_tag_name(args.name)
    with open_root(args, write=True) as root:
        (commit_id,) = resolve_commits(root, args.workbench, [args.commit])
        info = tag.set(root, args.workbench, args.name, commit_id, expected_generation=args.if_generation)
    if args.json:
        render.print_json(_tag_json(info))
    else:
        print(f"tag {render.safe(info.name)} -> {info.commit_id.hex()} generation={info.generation}")
    return 0


def cmd_tag_delete(args) -> int:
    from nokvfs.workspace import tag

    with open_root(args, write=True) as root:
        info = tag.delete(root, args.workbench, args.name, expected_generation=args.if_generation)
    if args.json:
        render.print_json(_tag_json(info))
    else:
        print(f"deleted tag {render.safe(info.name)} (was {info.commit_id.hex()} generation={info.generation})")
    return 0


def cmd_tag_list(args) -> int:
    from nokvfs.workspace import tag

    with open_root(args, write=False) as root:
        tags = tag.list_tags(root, args.workbench)
    if args.json:
        render.print_json([_tag_json(t) for t in tags])
    else:
        for t in tags:
            print(f"{t.commit_id.hex()}  generation={t.generation:<4} {render.safe(t.name)}")
    return 0


# --- commit-retire --------------------------------------------------------------------------


def _register_retire(subparsers) -> None:
    p = subparsers.add_parser("commit-retire", help="retire a commit nothing consumes (no head, tag, lease or child)")
    p.add_argument("workbench", metavar="WB")
    p.add_argument("commit", metavar="COMMIT", help="hex prefix, commit:PREFIX or tag:NAME")
    add_json_option(p)
    p.set_defaults(func=cmd_commit_retire)


def describe_consumers(root, commit_id: bytes) -> list[str]:
    """What consumes a commit, in words (`the head of wb1`, `tag 'v1' of wb1`, `child commit ..`)."""
    from nokvfs.engine.scan import scan_prefix
    from nokvfs.schema import keys
    from nokvfs.schema.enums import CommitConsumerKind
    from nokvfs.workspace.consumers import read_commit

    with root.read() as view:
        _, commit = read_commit(view, root.root_id, commit_id)
        current = None
        if commit is not None:
            from nokvfs.workspace import workbench as wb

            _, marker = wb.read_current(view, root.root_id, commit.source_workbench_id)
            if marker is not None and marker.workspace_incarnation_id == commit.source_workspace_incarnation_id:
                current = commit.source_workbench_id
        prefix = keys.commit_consumer_prefix(root.root_id, commit_id)
        out, marker_key = [], None
        while True:
            page = scan_prefix(view, "commit_consumer", prefix, start_after=marker_key)
            for key, _ in page.items:
                k = keys.CommitConsumerKey.decode(key)
                owner = k.owner()
                if k.consumer_kind == CommitConsumerKind.WorkbenchHead:
                    out.append(
                        f"the head of {current}"
                        if current and commit and owner == commit.source_workspace_incarnation_id
                        else f"a workbench head (incarnation {bytes(owner).hex()})"
                    )
                elif k.consumer_kind == CommitConsumerKind.Tag:
                    out.append(
                        f"tag {owner.tag_name!r}"
                        + (
                            f" of {current}"
                            if current and owner.workspace_incarnation_id == commit.source_workspace_incarnation_id
                            else ""
                        )
                    )
                elif k.consumer_kind == CommitConsumerKind.Lease:
                    out.append(f"a restore/fork lease (operation {bytes(owner).hex()})")
                else:
                    out.append(f"child commit {bytes(owner).hex()}")
            if page.next_marker is None:
                return out
            marker_key = page.next_marker


def cmd_commit_retire(args) -> int:
    from nokvfs.workspace import commit

    with open_root(args, write=True) as root:
        (commit_id,) = resolve_commits(root, args.workbench, [args.commit])
        try:
            op = commit.retire(root, commit_id)
        except commit.CommitInUse as exc:
            users = describe_consumers(root, commit_id)
            if not users:
                raise
            shown = ", ".join(users[:_SHOWN_CONSUMERS]) + (
                f" and {len(users) - _SHOWN_CONSUMERS} more" if len(users) > _SHOWN_CONSUMERS else ""
            )
            raise commit.CommitInUse(
                f"commit {commit_id.hex()} is still consumed by {shown}; it can be retired once nothing consumes it"
            ) from exc
    if args.json:
        render.print_json(
            {
                "commit_id": commit_id.hex(),
                "phase": op.phase.name,
                "released_members": op.released_member_count,
                "released_revisions": op.released_revision_count,
                "released_parents": op.released_parent_count,
            }
        )
    else:
        print(
            f"retired commit {commit_id.hex()} members={op.released_member_count} "
            f"revisions={op.released_revision_count} parents={op.released_parent_count}"
        )
    return 0


# --- restore --------------------------------------------------------------------------------


def _register_restore(subparsers) -> None:
    p = subparsers.add_parser("restore", help="create a new workbench from a snapshot or commit of WB")
    p.add_argument("workbench", metavar="WB", help="the source workbench")
    p.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        required=True,
        help="snapshot:ID, snapshot:ALIAS, commit:PREFIX or tag:NAME",
    )
    p.add_argument("--to", dest="dest", metavar="NEW_WB", required=True, help="the workbench to create")
    add_json_option(p)
    p.set_defaults(func=cmd_restore)


def cmd_restore(args) -> int:
    from nokvfs.workspace import restore

    check_workbench_id(args.workbench)
    check_workbench_id(args.dest)
    kind, selector = _split_kind(args.source, "--from")
    progress = Progress.for_args(args, f"restore {args.dest}", unit="members")
    with open_root(args, write=True) as root, progress:
        if kind == "snapshot":
            source = ("snapshot", _snapshot_selector(selector))
        elif kind == "commit":
            source = ("commit", selector)
        else:
            (commit_id,) = resolve_commits(root, args.workbench, [args.source])
            source = ("commit", commit_id)
        with sampled(progress, lambda: _restore_figures(root, args.dest)):
            result = restore.restore(root, args.workbench, source, args.dest)
        progress.finish(f"restored {result.member_count:,} members")
    kind_name = result.source_kind.name.lower()
    shown = int.from_bytes(result.source_selector, "big") if kind_name == "snapshot" else result.source_selector.hex()
    if args.json:
        render.print_json(
            {
                "operation_id": result.operation_id.hex(),
                "workbench": result.destination_workbench_id,
                "incarnation": result.destination_incarnation.hex(),
                "source_workbench": args.workbench,
                "source_kind": kind_name,
                "source": shown,
                "member_count": result.member_count,
                "commit_version": result.commit_version,
            }
        )
    else:
        print(
            f"restored {result.destination_workbench_id} incarnation={result.destination_incarnation.hex()} from "
            f"{args.workbench}@{kind_name}:{shown} members={result.member_count}"
        )
    return 0


def _restore_figures(root, destination: str):
    """Progress figures of the restore creating `destination`, read from its operation row:
    (phase, members copied, members of the source when it is a commit)."""
    from nokvfs.schema.enums import OperationKind, RestoreSourceKind
    from nokvfs.workspace import restore
    from nokvfs.workspace import workbench as wb
    from nokvfs.workspace.consumers import read_commit

    with root.read() as view:
        _, marker = wb.read_current(view, root.root_id, destination)
    owner = None if marker is None else marker.owning_operation
    if owner is None or owner.operation_kind != OperationKind.Restore:
        return None
    op = restore.operation(root, owner.operation_id)
    total = None
    if op.source_kind == RestoreSourceKind.Commit:
        with root.read() as view:
            _, commit = read_commit(view, root.root_id, bytes(op.source_selector))
        total = None if commit is None else commit.member_count
    return op.phase.name, op.member_count, total, None, None


# --- as-of ----------------------------------------------------------------------------------


def _register_as_of(subparsers) -> None:
    p = subparsers.add_parser("as-of", help="read-only ls/get/stat of a workbench as of a snapshot, commit or tag")
    p.add_argument("ref", metavar="REF", help="WB@snapshot:ID|ALIAS, WB@commit:PREFIX or WB@tag:NAME")
    verbs = p.add_subparsers(dest="as_of_command", metavar="<ls|get|stat>", required=True)
    ls = verbs.add_parser("ls", help="a directory's children (or the file itself), or every file below with -R")
    ls.add_argument("path", metavar="PATH", nargs="?", default="", help="a path in the workbench (default: its top)")
    ls.add_argument(
        "-l", dest="long", action="store_true", help="long format: mode, owner, size, generation, mtime (UTC), name"
    )
    ls.add_argument("-R", dest="recursive", action="store_true", help="every file below PATH, by its path below PATH")
    add_json_option(ls)
    ls.set_defaults(func=cmd_as_of_ls)
    get = verbs.add_parser(
        "get", help="write a file's bytes as of REF to stdout or a local file, or a tree into a directory"
    )
    get.add_argument("path", metavar="PATH", nargs="?", default="")
    get.add_argument(
        "dest",
        metavar="DEST",
        nargs="?",
        help="local file (written atomically) or '-' for stdout (the default); with -r a directory",
    )
    add_get_options(get)
    get.set_defaults(func=cmd_as_of_get)
    stat = verbs.add_parser("stat", help="a path's entry as of REF")
    stat.add_argument("path", metavar="PATH", nargs="?", default="")
    add_json_option(stat)
    stat.set_defaults(func=cmd_as_of_stat)


@contextlib.contextmanager
def as_of_tree(root, ref: AsOfRef):
    """(tree, view) of the reference: the workspace's as-of tree (nokvfs.workspace.asof, the
    model the mount's views read too) inside one read view held for the whole command."""
    from nokvfs.workspace import asof
    from nokvfs.workspace import workbench as wb

    selector = _snapshot_selector(ref.selector) if ref.kind == "snapshot" else ref.selector
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, ref.workbench_id)
        point = asof.locate(view, root, workbench, ref.kind, selector)
        tree = asof.open(view, root, ref.workbench_id, workbench.incarnation_id, point)
        yield trees.AsOfTree(root, tree), tree.view


def _stat(tree, ref: AsOfRef, target):
    try:
        return tree.stat(target.components)
    except NotFound:
        raise NotFound(f"{ref}:{target.path} does not exist") from None


def cmd_as_of_ls(args) -> int:
    ref = parse_as_of(args.ref)
    target = parse_target(f"{ref.workbench_id}:{args.path}", need_path=False, allow_root=True, allow_into=True)
    with open_root(args, write=False) as root, as_of_tree(root, ref) as (tree, _):
        _stat(tree, ref, target)
        list_tree(tree, target.path, args)
    return 0


def cmd_as_of_stat(args) -> int:
    ref = parse_as_of(args.ref)
    target = parse_target(f"{ref.workbench_id}:{args.path}", need_path=False, allow_root=True)
    with open_root(args, write=False) as root, as_of_tree(root, ref) as (tree, _):
        show_stat(tree, _stat(tree, ref, target), ref.workbench_id, args)
    return 0


def cmd_as_of_get(args) -> int:
    ref = parse_as_of(args.ref)
    target = parse_target(f"{ref.workbench_id}:{args.path}", need_path=not args.recursive, allow_root=args.recursive)
    shown = f"{ref}:{target.path}"
    with open_root(args, write=False) as root, as_of_tree(root, ref) as (tree, _):
        plan = plan_get(tree, target.components, args.dest, args, shown)
        run_get(tree, plan, None if plan is not None else tree.stat(target.components).entry, args, shown)
    return 0
