"""The core commands: init, workbench, put, get, ls, stat, rm, mv, append.

Each handler parses its operands, makes one or a few facade calls and formats the result; the
facade (nokvfs.workspace) owns every rule. Targets are `WB:PATH`; a trailing '/' on a put or mv
target means "into this directory".

put   `put WB:PATH [SRC ...]`. One SRC: a file (or `-`/absent: stdin) is published at PATH,
      or at PATH/<basename> if PATH already is a directory (as cp does); a directory's files are
      published at PATH/<path below SRC> (`put WB: tree` lays out a tree whose top level holds
      sections). Several SRCs, or a target ending in '/': each lands at PATH/<basename of SRC>.
      Directory walks include hidden files and skip (with a warning) anything that is not a
      regular file or a symlink; a symlink is stored as a link with `-l`, read by content with
      `-L`, and otherwise read by content only if it is a link to a file inside the tree (links
      out of the tree, to directories and dangling ones are skipped with a warning).
      Local mode and times are stored with each file and directory (like `cp -p`; the owner too
      with `--owner`; nothing with `--no-preserve`): a directory's attributes are stored after
      everything below it. Every target path is validated before the first byte is uploaded;
      the files are then published one by one (names sorted, a directory's files before its
      subdirectories) and the first failure stops the run. The content type is guessed from
      the artifact path's extension (Python's built-in table, not the machine's) unless
      `--content-type` is given. A put from stdin over a path with stored attributes keeps its
      mode and owner (mtime now), as `cat > file` does.
get   `get WB:PATH [DEST]` streams the body block by block to stdout, or to DEST through a temp
      file in DEST's directory and a rename (DEST an existing directory: DEST/<basename>); the
      stored mode and times are set on it (`--no-preserve`: not; `--owner`, as root: the owner
      too; a path with none stored keeps DEST's mode, or the umask's). `get -r WB:PATH DEST`
      (`-R` is the same) writes every file below PATH, listed at one read version, at
      DEST/<path below PATH> (DEST created if missing; nothing is written through a symlink
      below DEST), then the stored directory attributes, deepest first; the first failure stops
      it. A link is recreated with `-l` (refused without it; skipped with a warning by -r).
      On stdout a failure after the first block leaves what was already written; the exit code
      says so.
ls    `ls` lists workbenches; `ls WB[:PATH]` the children of a directory (a file: itself);
      `-R` every file below, named by its path below PATH. Pages of at most 1000 entries at one
      read version, written as they arrive (JSON too: one array element per line; a JSON row
      carries every field of the entry, with or without -l). `-l` shows mode, owner ('-' when
      none is stored), size, generation, mtime and name (`name -> target` for a link).
stat  kind (file, link, dir), mode, owner and times, and every field of the entry.
"""

from __future__ import annotations

import argparse
import contextlib
import mimetypes
import os
import stat as stat_module
from dataclasses import dataclass

from nokvfs.cli import local_files, render, trees
from nokvfs.cli.common import (
    Target,
    UsageError,
    add_json_option,
    count_arg,
    is_regular_file,
    open_root,
    parse_size,
    parse_target,
    stdin_binary,
    stdout_binary,
    warn,
)
from nokvfs.cli.progress import BIG_BODY, Progress
from nokvfs.errors import InvalidInput, IsADirectory, NotFound
from nokvfs.schema.paths import join, normalize_path

STDIN = "-"
PAGE_LIMIT = trees.PAGE_LIMIT
_MIME = None


def register(subparsers) -> None:
    _register_init(subparsers)
    _register_workbench(subparsers)
    _register_put(subparsers)
    _register_get(subparsers)
    _register_ls(subparsers)
    _register_stat(subparsers)
    _register_rm(subparsers)
    _register_mv(subparsers)
    _register_append(subparsers)


# --- argument helpers -----------------------------------------------------------------------


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _generation_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid generation {text!r}: a non-negative integer") from None
    if value < 0 or value >= 1 << 64:
        raise argparse.ArgumentTypeError(f"invalid generation {text!r}: a non-negative integer")
    return value


def _add_if_generation(parser, what: str) -> None:
    parser.add_argument(
        "--if-generation",
        metavar="N",
        type=_generation_arg,
        help=f"{what} only if the path is at generation N (0: absent)",
    )


# --- init -----------------------------------------------------------------------------------


def _register_init(subparsers) -> None:
    p = subparsers.add_parser(
        "init",
        help="create a data directory (a shard, a root, the store configuration)",
        description="Create a data directory. The global --store names its object store (default: DATA_DIR/objects), "
        "--endpoint-url an S3-compatible endpoint for an s3:// store.",
    )
    p.add_argument("--region", metavar="REGION", help="signing region for an s3:// store")
    p.add_argument(
        "--block-size", metavar="SIZE", type=_size_arg, help="artifact block size (default 4MiB; 4KiB..1GiB)"
    )
    p.add_argument(
        "--cache-size",
        metavar="SIZE",
        type=_size_arg,
        help="bound of the block cache of blocks read from the store (default 512MiB for an s3:// store; "
        "none for a local store, which is read directly)",
    )
    p.add_argument(
        "--history-retention",
        metavar="N",
        type=count_arg("version count"),
        help="commit versions of History that gc keeps beyond the holds, for diagnostics (default 0)",
    )
    from nokvfs.cli.maintenance_commands import add_retention_options

    add_retention_options(p)
    add_json_option(p)
    p.set_defaults(func=cmd_init)


def cmd_init(args) -> int:
    from nokvfs.workspace import datadir

    options = {}
    if args.block_size is not None:
        options["block_size"] = args.block_size
    if args.cache_size is not None:
        options["cache_bytes"] = args.cache_size
    if args.history_retention is not None:
        options["history_retention"] = args.history_retention
    from nokvfs.cli.maintenance_commands import retention_changes
    from nokvfs.workspace.retention import RetentionSettings

    options["retention"] = RetentionSettings(**retention_changes(args))
    config = datadir.init(
        args.data_dir,
        store=args.store,
        endpoint_url=args.endpoint_url,
        region=args.region,
        **options,
    )
    if args.json:
        render.print_json(dict(config, data_dir=os.path.abspath(args.data_dir)))
    else:
        print(
            f"initialised {render.safe(os.path.abspath(args.data_dir))}: root {config['root_id']}, store "
            f"{render.safe(config['store'])}, block size {config['block_size']}"
        )
    return 0


# --- workbench ------------------------------------------------------------------------------


def _register_workbench(subparsers) -> None:
    p = subparsers.add_parser("workbench", help="create, list and show workbenches")
    sub = p.add_subparsers(dest="workbench_command", metavar="<create|list|show>", required=True)
    create = sub.add_parser("create", help="create a workbench")
    create.add_argument("workbench", metavar="WB")
    add_json_option(create)
    create.set_defaults(func=cmd_workbench_create)
    listing = sub.add_parser("list", help="list the visible workbenches")
    add_json_option(listing)
    listing.set_defaults(func=cmd_workbench_list)
    show = sub.add_parser("show", help="show one workbench")
    show.add_argument("workbench", metavar="WB")
    add_json_option(show)
    show.set_defaults(func=cmd_workbench_show)


def cmd_workbench_create(args) -> int:
    from nokvfs.workspace import workbench

    with open_root(args, write=True) as root:
        created = workbench.create(root, args.workbench)
    if args.json:
        render.print_json(render.workbench_json(created))
    else:
        print(f"created workbench {created.workbench_id} incarnation={created.incarnation_id.hex()}")
    return 0


def cmd_workbench_list(args) -> int:
    return _print_workbenches(args, lambda w: w.workbench_id)


def _print_workbenches(args, line) -> int:
    """The visible workbenches, as JSON or one `line(workbench)` each."""
    from nokvfs.workspace import workbench

    with open_root(args, write=False) as root, root.read() as view:
        benches = workbench.list_visible(view, root.root_id)
    if args.json:
        render.print_json([render.workbench_json(w) for w in benches])
    else:
        for w in benches:
            print(line(w))
    return 0


def cmd_workbench_show(args) -> int:
    from nokvfs.workspace import workbench

    with open_root(args, write=False) as root:
        shown = workbench.get(root, args.workbench)
    fields = render.workbench_json(shown)
    if args.json:
        render.print_json(fields)
    else:
        width = max(len(k) for k in fields)
        for key in sorted(fields):
            print(f"{key + ':':<{width + 1}} {render.safe(fields[key])}")
    return 0


# --- put ------------------------------------------------------------------------------------


def _register_put(subparsers) -> None:
    p = subparsers.add_parser("put", help="publish local files, directories or stdin as artifacts")
    p.add_argument("target", metavar="WB:PATH")
    p.add_argument("sources", metavar="SRC", nargs="*", help="files, directories, or '-' for stdin (the default)")
    p.add_argument(
        "--content-type",
        metavar="TYPE",
        help="content type (default: guessed from the path, else application/octet-stream)",
    )
    p.add_argument("--producer", metavar="TEXT", default="", help="producer recorded on the revision")
    p.add_argument(
        "--index",
        metavar="FIELD=VALUE",
        action="append",
        default=[],
        help="a typed index field for `nokvfs search` (repeatable; values as in search)",
    )
    cond = p.add_mutually_exclusive_group()
    cond.add_argument("--if-absent", action="store_true", help="publish only if the path does not exist")
    cond.add_argument(
        "--if-generation",
        metavar="N",
        type=_generation_arg,
        help="publish only if the path is at generation N (one file only)",
    )
    p.add_argument(
        "--no-preserve",
        dest="preserve",
        action="store_false",
        help="do not keep local files' and directories' mode and times (kept by default, like cp -p)",
    )
    p.add_argument("--owner", action="store_true", help="keep the owner (uid, gid) too")
    links = p.add_mutually_exclusive_group()
    links.add_argument("-l", "--links", action="store_true", help="store symlinks as links (like rsync -l)")
    links.add_argument(
        "-L",
        "--copy-links",
        action="store_true",
        help="read symlinks to files by content even when they point outside the tree",
    )
    add_json_option(p)
    p.set_defaults(func=cmd_put)


@dataclass(frozen=True)
class Upload:
    source: str  # a local path, or STDIN
    target: Target
    kind: str = local_files.FILE  # FILE (a body), LINK (a symlink's target) or DIRECTORY (its attributes)


def _basename(local: str) -> str:
    name = os.path.basename(os.path.normpath(os.path.abspath(local)))
    if not name:
        raise UsageError(f"{local!r} has no name to put it under; give the target path")
    return name


def plan_put(
    target: Target,
    sources: list[str],
    *,
    is_directory=lambda target: False,
    links: bool = False,
    copy_links: bool = False,
    directories: bool = False,
) -> list[Upload]:
    """Every (source, target, kind) of a put, validated before anything is uploaded.

    is_directory(target) says whether a target already is a directory in the workbench: a single
    file put at an existing directory lands inside it (`put WB:outputs results.csv`), as cp does.
    links/copy_links: what a symlink becomes (nokvfs.cli.local_files). directories: the walked
    directories' attributes are planned too (after everything below them).
    """
    from nokvfs.workspace import attributes, publish

    if len(sources) > 1 and STDIN in sources:
        raise UsageError("'-' (stdin) must be the only source")
    into = target.into or len(sources) > 1
    plan = []
    for source in sources:
        if source == STDIN:
            if into or not target.components:
                raise UsageError("stdin needs a file path as its target (WB:PATH), not a directory")
            plan.append(Upload(STDIN, target))
            continue
        if links and os.path.islink(source):
            kind = local_files.LINK  # a named link operand is stored as a link too
            info = os.lstat(source)
        else:
            kind = local_files.FILE
            info = os.stat(source)  # a missing source fails here, before any upload
        if kind == local_files.FILE and stat_module.S_ISDIR(info.st_mode):
            base = target.child(_basename(source)) if into else target
            for local in local_files.walk(source, links=links, copy_links=copy_links, directories=directories):
                if local.kind == local_files.DIRECTORY and not base.child(*local.below).components:
                    continue  # the workbench itself stores no attributes
                plan.append(Upload(local.path, base.child(*local.below), local.kind))
        else:
            dest = target.child(_basename(source)) if into or (target.components and is_directory(target)) else target
            if not dest.components:
                raise UsageError(f"a file needs a path to be put at: {target.workbench_id}:PATH")
            plan.append(Upload(source, dest, kind))
    seen, dirs = {}, {}
    for upload in plan:
        components = normalize_path(join(upload.target.components))
        if upload.kind == local_files.DIRECTORY:
            publish.check_publishable(components + (attributes.DIRECTORY_MARKER,), directory_marker=True)
            dirs.setdefault(components, upload.source)
            continue
        publish.check_publishable(components)
        if components in seen:
            raise UsageError(f"{seen[components]!r} and {upload.source!r} would both be put at {upload.target}")
        seen[components] = upload.source
    for components, source in dirs.items():
        if components in seen:
            raise UsageError(
                f"{seen[components]!r} and the directory {source!r} would both be put at {join(components)}"
            )
    return plan


def guess_content_type(path: str) -> str | None:
    global _MIME
    if _MIME is None:
        _MIME = mimetypes.MimeTypes()  # the built-in table only: the same on every machine
    kind, encoding = _MIME.guess_type(path, strict=True)
    return None if encoding else kind


def _index_fields(pairs: list[str]) -> tuple:
    from nokvfs.cli.maintenance_commands import parse_value
    from nokvfs.workspace import index

    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--index takes FIELD=VALUE, not {pair!r}")
        values[name] = parse_value(value)
    return index.fields(values)


def cmd_put(args) -> int:
    target = parse_target(args.target, allow_root=True, allow_into=True)
    args.index_fields = _index_fields(args.index)
    with open_root(args, write=True) as root:
        plan = plan_put(
            target,
            args.sources or [STDIN],
            is_directory=lambda t: _is_directory(root, t),
            links=args.links,
            copy_links=args.copy_links,
            directories=args.preserve,
        )
        if not plan:
            warn("nothing to put")
            return 0
        if args.if_generation is not None and len([u for u in plan if u.kind != local_files.DIRECTORY]) != 1:
            raise UsageError("--if-generation names one file's generation; this put has several files")
        _put_all(root, args, plan, expected=0 if args.if_absent else args.if_generation)
    return 0


def _local_attributes(args, path: str, *, follow: bool = True):
    """What a put stores of a local path: its mode, times (and owner with --owner), or None
    with --no-preserve."""
    from nokvfs.workspace import attributes

    if not args.preserve:
        return None
    return attributes.from_stat(os.stat(path) if follow else os.lstat(path), keep_owner=args.owner)


def _carried_attributes(root, args, target: Target):
    """Stdin has no mode of its own: a put from it over a path with stored attributes keeps them,
    with mtime and ctime now, as `cat > file` keeps a file's mode (None with --no-preserve)."""
    from nokvfs.workspace import attributes, listing

    if not args.preserve:
        return None
    try:
        with root.read() as view:
            existing = listing.stat(view, root, target.workbench_id, target.path).entry
    except NotFound:
        return None
    stored = None if existing is None or attributes.is_symlink(existing) else attributes.of(existing)
    if stored is None:
        return None
    now = attributes.now_ns()
    return stored.replace(mtime_ns=now, ctime_ns=now)


def _local_size(upload) -> int | None:
    """The bytes a put reads for one file: a regular file's size, none for a stored link; None
    for stdin and streams (known once spooled)."""
    if upload.kind == local_files.LINK:
        return 0
    source = upload.source
    return os.stat(source).st_size if source != STDIN and is_regular_file(source) else None


def _put_all(root, args, plan: list[Upload], *, expected: int | None) -> None:
    from nokvfs.workspace import body, namespace, publish

    files = [upload for upload in plan if upload.kind != local_files.DIRECTORY]  # what the progress counts
    sizes = [_local_size(upload) for upload in files]
    label = f"put {files[0].target}" if len(files) == 1 else f"put {len(files)} files"
    progress = Progress.for_args(args, label, unit="files", quiet_below_bytes=BIG_BODY)
    progress.set_totals(len(files), None if None in sizes else sum(sizes))
    out = render.JsonArray() if args.json else contextlib.nullcontext()
    with out, progress:  # the progress line ends before the array does
        for upload in plan:
            path = upload.target.path
            if upload.kind == local_files.DIRECTORY:
                kept = _local_attributes(args, upload.source)
                namespace.set_directory_attributes(
                    root,
                    upload.target.workbench_id,
                    path,
                    mode=kept.mode,
                    uid=kept.uid,
                    gid=kept.gid,
                    mtime_ns=kept.mtime_ns,
                    atime_ns=kept.atime_ns,
                )
                with progress.paused():
                    if args.json:
                        out.add(
                            dict(
                                render.attributes_json(kept, stored=True, kind="dir"),
                                workbench=upload.target.workbench_id,
                                path=path,
                                kind="dir",
                            )
                        )
                    else:
                        print(f"put {render.safe(upload.target)}/ directory mode={kept.mode:04o}")
                continue
            link_target = None
            if upload.kind == local_files.LINK:
                link_target = os.readlink(upload.source)
                entry = namespace.symlink(
                    root,
                    upload.target.workbench_id,
                    path,
                    link_target,
                    attributes=_local_attributes(args, upload.source, follow=False),
                    expected_generation=expected,
                )
            else:
                content_type = args.content_type or guess_content_type(path) or publish.DEFAULT_CONTENT_TYPE
                with contextlib.ExitStack() as stack:
                    kept = None
                    if upload.source == STDIN:
                        source = stdin_binary()
                        kept = _carried_attributes(root, args, upload.target)
                    elif is_regular_file(upload.source):
                        kept = _local_attributes(args, upload.source)  # before the body is read
                        source = body.from_file(upload.source, root.block_size)
                    else:  # a pipe, a fifo, a character device: read as a stream
                        source = stack.enter_context(open(upload.source, "rb"))
                    entry = namespace.put(
                        root,
                        upload.target.workbench_id,
                        path,
                        source,
                        expected_generation=expected,
                        content_type=content_type,
                        producer=args.producer,
                        index_fields=args.index_fields,
                        progress=progress.body_callback(),
                        attributes=kept,
                    )
            progress.advance(1)
            with progress.paused():
                if args.json:
                    out.add(
                        dict(
                            render.write_json(upload.target.workbench_id, path, entry),
                            **({"link_target": link_target} if link_target else {}),
                        )
                    )
                else:
                    line = render.write_result("put", upload.target.workbench_id, path, entry)
                    print(line if link_target is None else f"{line} -> {render.safe(link_target)}")


# --- get ------------------------------------------------------------------------------------


def _register_get(subparsers) -> None:
    p = subparsers.add_parser(
        "get", help="write an artifact's bytes to stdout or a local file, or a tree into a directory (-r)"
    )
    p.add_argument("source", metavar="WB:PATH")
    p.add_argument(
        "dest",
        metavar="DEST",
        nargs="?",
        help="local file (written atomically) or '-' for stdout (the default); with -r a directory",
    )
    add_get_options(p)
    p.set_defaults(func=cmd_get)


def add_get_options(p) -> None:
    """The options get and `as-of REF get` share."""
    p.add_argument(
        "-r",
        "-R",
        "--recursive",
        dest="recursive",
        action="store_true",
        help="write every file below PATH into the directory DEST (created if missing)",
    )
    p.add_argument(
        "--no-preserve",
        dest="preserve",
        action="store_false",
        help="do not restore stored modes and times (restored by default)",
    )
    p.add_argument("--owner", action="store_true", help="restore stored owners too (needs root)")
    p.add_argument(
        "-l",
        "--links",
        action="store_true",
        help="recreate links as symlinks (without it a link is refused, or skipped by -r)",
    )


@dataclass(frozen=True)
class Download:
    dest: str  # the local path
    kind: str  # local_files.FILE, LINK or DIRECTORY
    entry: object  # the PathEntry (FILE, LINK); None for a directory
    attributes: object  # what to restore: stored attributes, or None
    below: tuple | None = None  # get -r: the path's components below DEST (created as needed)


def plan_get(tree, components: tuple[str, ...], dest: str | None, args, label: str) -> list[Download] | None:
    """What a get writes, decided before anything is written; None: the body goes to stdout."""
    from nokvfs.workspace import attributes, listing

    if args.owner and os.geteuid() != 0:
        raise UsageError("--owner restores owners, which needs root")
    try:
        info = tree.stat(components)
    except NotFound:
        raise NotFound(f"{label} does not exist") from None
    if info.kind == listing.DIRECTORY:
        if not args.recursive:
            raise IsADirectory(f"{label} is a directory (get -r writes a tree)")
        if dest in (None, STDIN):
            raise UsageError("get -r writes into a local directory: give DEST")
        return _plan_tree(tree, info.path, dest, args)
    entry = info.entry
    if attributes.is_symlink(entry) and not args.links:
        raise InvalidInput(f"{label} is a symbolic link to {tree.read_link(entry)!r}; --links recreates it")
    if dest in (None, STDIN):
        if attributes.is_symlink(entry):
            raise UsageError(f"{label} is a symbolic link; it cannot be written to stdout")
        return None
    if os.path.isdir(dest):
        dest = os.path.join(dest, components[-1])
    kind = local_files.LINK if attributes.is_symlink(entry) else local_files.FILE
    return [Download(dest, kind, entry, attributes.of(entry) if args.preserve else None)]


def _plan_tree(tree, base: str, dest: str, args) -> list[Download]:
    from nokvfs.workspace import attributes

    files, directories = [], []
    for below, entry in tree.files(base, with_markers=True):
        parts = tuple(below.split("/"))
        if attributes.is_directory_marker(parts):
            kept = attributes.shown(entry) if args.preserve else None
            directories.append(Download(os.path.join(dest, *parts[:-1]), local_files.DIRECTORY, None, kept, parts[:-1]))
        elif attributes.is_symlink(entry) and not args.links:
            warn(f"skipping the symbolic link {join(parts)!r} (--links recreates it)")
        else:
            kind = local_files.LINK if attributes.is_symlink(entry) else local_files.FILE
            files.append(
                Download(
                    os.path.join(dest, *parts), kind, entry, attributes.of(entry) if args.preserve else None, parts
                )
            )
    # Directory attributes last, deepest first: writing into a directory would move its mtime.
    return files + sorted(directories, key=lambda d: len(d.below), reverse=True)


def run_get(tree, plan: list[Download] | None, entry, args, label: str) -> None:
    """Write the plan (or `entry`'s body to stdout when the plan is None), with one progress
    line counting the files and links written and their bytes."""
    if plan is None:
        count, size = 1, entry.logical_size
    else:
        written = [item for item in plan if item.kind != local_files.DIRECTORY]
        count, size = len(written), sum(item.entry.logical_size for item in written if item.kind == local_files.FILE)
    progress = Progress.for_args(args, f"get {label}", unit="files", quiet_below_bytes=BIG_BODY)
    progress.set_totals(count, size)
    with progress:
        if plan is None:
            out = stdout_binary()
            for chunk in tree.chunks(entry, progress.body_callback()):
                out.write(chunk)
            out.flush()
            progress.advance(1)
            return
        if args.recursive and all(item.below is not None for item in plan):  # a tree (`get -r` of a file is a get)
            os.makedirs(args.dest, exist_ok=True)
        for item in plan:
            if item.kind == local_files.DIRECTORY:
                path = local_files.ensure_directory(args.dest, item.below)
                if item.attributes is not None:
                    local_files.set_directory(path, item.attributes, owner=args.owner)
                continue
            if item.below is not None:
                local_files.ensure_directory(args.dest, item.below[:-1])
            if item.kind == local_files.LINK:
                local_files.write_link(
                    item.dest, tree.read_link(item.entry), attributes=item.attributes, owner=args.owner
                )
            else:
                local_files.write_atomically(
                    item.dest,
                    tree.chunks(item.entry, progress.body_callback()),
                    attributes=item.attributes,
                    owner=args.owner,
                )
            progress.advance(1)


def write_atomically(dest: str, chunks) -> None:
    """Write `chunks` to `dest` through a temp file and a rename (local_files.write_atomically)."""
    local_files.write_atomically(dest, chunks)


def cmd_get(args) -> int:
    target = parse_target(args.source, need_path=not args.recursive, allow_root=args.recursive)
    with open_root(args, write=False) as root:
        with root.read() as view:
            tree = trees.ViewTree(view, root, target.workbench_id)
            plan = plan_get(tree, target.components, args.dest, args, str(target))
            entry = None if plan is not None else tree.stat(target.components).entry
        run_get(tree, plan, entry, args, str(target))  # bodies are read outside the listing's view
    return 0


# --- ls -------------------------------------------------------------------------------------


def _register_ls(subparsers) -> None:
    p = subparsers.add_parser("ls", help="list workbenches, a directory's children, or every file below it")
    p.add_argument("target", metavar="WB[:PATH]", nargs="?", help="omit to list workbenches")
    p.add_argument(
        "-l", dest="long", action="store_true", help="long format: mode, owner, size, generation, mtime (UTC), name"
    )
    p.add_argument("-R", dest="recursive", action="store_true", help="every file below PATH, by its path below PATH")
    add_json_option(p)
    p.set_defaults(func=cmd_ls)


class _Listing:
    """Writes listing rows as they arrive: names, `-l` lines, or one JSON array. With -l or
    --json a link shows its target and a directory its stored attributes (read in `tree`)."""

    def __init__(self, args, tree=None):
        self.json = render.JsonArray() if args.json else None
        self.long = args.long
        self.tree = tree

    def __enter__(self):
        if self.json:
            self.json.__enter__()
        return self

    def __exit__(self, *exc):
        if self.json:
            self.json.__exit__(*exc)

    def row(self, name: str, path: str, kind: str, entry) -> None:
        from nokvfs.workspace import attributes, listing

        extra = {}
        if (self.json or self.long) and self.tree is not None:
            if attributes.is_symlink(entry):
                extra["link_target"] = self.tree.read_link(entry)
            elif kind == listing.DIRECTORY:
                extra["directory"] = self.tree.directory_attributes(listing.split(path))
        if self.json:
            self.json.add(render.listing_json(name, path, kind, entry, **extra))
            return
        shown = name + "/" if kind == listing.DIRECTORY else name
        print(render.long_line(shown, kind, entry, **extra) if self.long else render.safe(shown))


def list_tree(tree, base: str, args) -> None:
    """`ls` of a tree (live or as of a reference): a file itself, a directory's children, or
    every file below it with -R."""
    from nokvfs.workspace import listing

    with _Listing(args, tree) as out:
        info = tree.stat(listing.split(base))
        if info.kind == listing.FILE:
            out.row(base, base, listing.FILE, info.entry)
            return
        for name, kind, entry in tree.rows(base, args.recursive):
            out.row(name, trees.path_of(base, name), kind, entry)


def cmd_ls(args) -> int:
    if args.target is None:
        return _ls_workbenches(args)
    target = parse_target(args.target, need_path=False, allow_root=True, allow_into=True)
    with open_root(args, write=False) as root, root.read() as view:
        list_tree(trees.ViewTree(view, root, target.workbench_id, page_limit=PAGE_LIMIT), target.path, args)
    return 0


def _ls_workbenches(args) -> int:
    def line(w):
        name = w.workbench_id + "/"
        return render.long_line(name, "dir", None) if args.long else name

    return _print_workbenches(args, line)


# --- stat -----------------------------------------------------------------------------------


def _register_stat(subparsers) -> None:
    p = subparsers.add_parser(
        "stat", help="show a path's entry: kind, mode, owner, times, generation, revision, digests, ..."
    )
    p.add_argument("target", metavar="WB:PATH")
    add_json_option(p)
    p.set_defaults(func=cmd_stat)


def show_stat(tree, info, workbench_id: str, args) -> None:
    """A stat as text or JSON: a link with its target, a directory with its stored attributes."""
    from nokvfs.workspace import attributes, listing

    extra = {}
    if info.entry is not None and attributes.is_symlink(info.entry):
        extra["link_target"] = tree.read_link(info.entry)
    elif info.kind == listing.DIRECTORY:
        extra["directory"] = tree.directory_attributes(listing.split(info.path))
    if args.json:
        render.print_json(render.stat_json(info, workbench_id, **extra))
    else:
        print(render.stat_text(info, workbench_id, **extra))


def cmd_stat(args) -> int:
    target = parse_target(args.target, need_path=False, allow_root=True)
    with open_root(args, write=False) as root, root.read() as view:
        tree = trees.ViewTree(view, root, target.workbench_id)
        show_stat(tree, tree.stat(target.components), target.workbench_id, args)
    return 0


# --- rm, mv ---------------------------------------------------------------------------------


def _register_rm(subparsers) -> None:
    p = subparsers.add_parser("rm", help="remove a file")
    p.add_argument("target", metavar="WB:PATH")
    _add_if_generation(p, "remove")
    add_json_option(p)
    p.set_defaults(func=cmd_rm)


def _is_directory(root, target: Target) -> bool:
    from nokvfs.workspace import listing

    try:
        with root.read() as view:
            return listing.stat(view, root, target.workbench_id, target.path).kind == listing.DIRECTORY
    except NotFound:
        return False


def cmd_rm(args) -> int:
    from nokvfs.workspace import namespace

    target = parse_target(args.target)
    with open_root(args, write=True) as root:
        try:
            entry = namespace.remove(root, target.workbench_id, target.path, expected_generation=args.if_generation)
        except NotFound:
            if _is_directory(root, target):
                raise IsADirectory(f"{target} is a directory; rm removes files") from None
            raise
    _print_write(args, "rm", target, entry)
    return 0


def _register_mv(subparsers) -> None:
    p = subparsers.add_parser("mv", help="rename a file inside one workbench (one atomic command)")
    p.add_argument("source", metavar="WB:SRC")
    p.add_argument("dest", metavar="WB:DST", help="a trailing '/' or an existing directory: move into it")
    p.add_argument("--no-replace", action="store_true", help="fail (conflict) if DST exists")
    add_json_option(p)
    p.set_defaults(func=cmd_mv)


def cmd_mv(args) -> int:
    from nokvfs.workspace import namespace

    source = parse_target(args.source)
    dest = parse_target(args.dest, allow_into=True)
    if source.workbench_id != dest.workbench_id:
        raise UsageError(f"mv works inside one workbench: {source.workbench_id!r} and {dest.workbench_id!r} differ")
    with open_root(args, write=True) as root:
        if dest.into or _is_directory(root, dest):
            dest = dest.child(source.components[-1])
        try:
            entry = namespace.rename(root, source.workbench_id, source.path, dest.path, replace=not args.no_replace)
        except NotFound:
            if _is_directory(root, source):
                raise IsADirectory(f"{source} is a directory; mv moves files") from None
            raise
    if args.json:
        render.print_json(dict(render.write_json(dest.workbench_id, dest.path, entry), source=source.path))
    else:
        print(
            f"mv {render.safe(source)} -> {render.safe(dest)} generation={entry.generation} "
            f"revision={entry.artifact_revision_id.hex()} size={entry.logical_size}"
        )
    return 0


def _print_write(args, verb: str, target: Target, entry) -> None:
    if args.json:
        render.print_json(render.write_json(target.workbench_id, target.path, entry))
    else:
        print(render.write_result(verb, target.workbench_id, target.path, entry))


# --- append ---------------------------------------------------------------------------------


def _register_append(subparsers) -> None:
    p = subparsers.add_parser("append", help="append a local file or stdin to an artifact (reuses its blocks)")
    p.add_argument("target", metavar="WB:PATH")
    p.add_argument("source", metavar="SRC", nargs="?", default=STDIN, help="local file, or '-' for stdin (the default)")
    _add_if_generation(p, "append")
    add_json_option(p)
    p.set_defaults(func=cmd_append)


def cmd_append(args) -> int:
    from nokvfs.workspace import append, body

    target = parse_target(args.target)
    with open_root(args, write=True) as root:
        if args.source == STDIN:
            data = body.from_stream(stdin_binary(), root.spool_dir, root.block_size)
        elif is_regular_file(args.source):
            data = body.from_file(args.source, root.block_size)
        elif os.path.isdir(args.source):
            raise IsADirectory(f"{args.source!r} is a local directory; append takes a file or stdin")
        else:
            with open(args.source, "rb") as stream:
                data = body.from_stream(stream, root.spool_dir, root.block_size)
        try:
            entry = append.append(root, target.workbench_id, target.path, data, expected_generation=args.if_generation)
        finally:
            data.discard()
    _print_write(args, "append", target, entry)
    return 0
