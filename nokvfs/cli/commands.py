"""The core commands: init, workbench, put, get, ls, stat, rm, mv, append.

Each handler parses its operands, makes one or a few facade calls and formats the result; the
facade (nokvfs.workspace) owns every rule. Targets are `WB:PATH`; a trailing '/' on a put or mv
target means "into this directory".

put   `put WB:PATH [SRC ...]`. One SRC: a file (or `-`/absent: stdin) is published at PATH,
      or at PATH/<basename> if PATH already is a directory (as cp does); a directory's files are
      published at PATH/<path below SRC> (`put WB: tree` lays out a tree whose top level holds
      sections). Several SRCs, or a target ending in '/': each lands at PATH/<basename of SRC>.
      Directory walks include hidden files, read symlinks to files by content, do not follow
      symlinks to directories, and skip (with a warning) anything that is not a regular file.
      Every target path is validated before the first byte is uploaded; the files are then
      published one by one (names sorted, a directory's files before its subdirectories) and
      the first failure stops the run. The content type is guessed from the artifact path's
      extension (Python's built-in table, not the machine's) unless `--content-type` is given.
get   `get WB:PATH [DEST]` streams the body block by block to stdout, or to DEST through a temp
      file in DEST's directory and a rename (DEST an existing directory: DEST/<basename>). On
      stdout a failure after the first block leaves what was already written; the exit code
      says so. `get -R WB:PATH DEST` writes every file below PATH (listed at one read version)
      to DEST/<path below PATH>, each atomically, as `cp -r` does (DEST an existing directory:
      DEST/<name of PATH>/...); the first failure stops it.
ls    `ls` lists workbenches; `ls WB[:PATH]` the children of a directory (a file: itself);
      `-R` every file below, named by its path below PATH. Pages of at most 1000 entries at one
      read version, written as they arrive (JSON too: one array element per line; a JSON row
      carries every field of the entry, with or without -l).
"""

from __future__ import annotations

import argparse
import contextlib
import mimetypes
import os
import stat as stat_module
import tempfile
from dataclasses import dataclass

from nokvfs.cli import render
from nokvfs.cli.common import (
    Target,
    UsageError,
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
from nokvfs.errors import IsADirectory, NotFound
from nokvfs.schema.paths import join, normalize_path

STDIN = "-"
PAGE_LIMIT = 1000
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


def _add_json(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output (sorted keys, hex ids)")


def _add_if_generation(parser, what: str) -> None:
    parser.add_argument("--if-generation", metavar="N", type=_generation_arg, help=f"{what} only if the path is at generation N (0: absent)")


# --- init -----------------------------------------------------------------------------------


def _register_init(subparsers) -> None:
    p = subparsers.add_parser(
        "init",
        help="create a data directory (a shard, a root, the store configuration)",
        description="Create a data directory. The global --store names its object store (default: DATA_DIR/objects), "
        "--endpoint-url an S3-compatible endpoint for an s3:// store.",
    )
    p.add_argument("--region", metavar="REGION", help="signing region for an s3:// store")
    p.add_argument("--block-size", metavar="SIZE", type=_size_arg, help="artifact block size (default 4MiB; 4KiB..1GiB)")
    p.add_argument("--cache-size", metavar="SIZE", type=_size_arg, help="block cache bound (default 512MiB)")
    p.add_argument("--history-retention", metavar="N", type=count_arg("version count"),
                   help="commit versions of History that gc keeps beyond the holds, for diagnostics (default 0)")
    _add_json(p)
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
        print(f"initialised {render.safe(os.path.abspath(args.data_dir))}: root {config['root_id']}, store {render.safe(config['store'])}, block size {config['block_size']}")
    return 0


# --- workbench ------------------------------------------------------------------------------


def _register_workbench(subparsers) -> None:
    p = subparsers.add_parser("workbench", help="create, list and show workbenches")
    sub = p.add_subparsers(dest="workbench_command", metavar="<create|list|show>", required=True)
    create = sub.add_parser("create", help="create a workbench")
    create.add_argument("workbench", metavar="WB")
    _add_json(create)
    create.set_defaults(func=cmd_workbench_create)
    listing = sub.add_parser("list", help="list the visible workbenches")
    _add_json(listing)
    listing.set_defaults(func=cmd_workbench_list)
    show = sub.add_parser("show", help="show one workbench")
    show.add_argument("workbench", metavar="WB")
    _add_json(show)
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
    from nokvfs.workspace import workbench

    with open_root(args, write=False) as root, root.read() as view:
        benches = workbench.list_visible(view, root.root_id)
    if args.json:
        render.print_json([render.workbench_json(w) for w in benches])
    else:
        for w in benches:
            print(w.workbench_id)
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
    p.add_argument("--content-type", metavar="TYPE", help="content type (default: guessed from the path, else application/octet-stream)")
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
    cond.add_argument("--if-generation", metavar="N", type=_generation_arg, help="publish only if the path is at generation N (one file only)")
    _add_json(p)
    p.set_defaults(func=cmd_put)


@dataclass(frozen=True)
class Upload:
    source: str  # a local path, or STDIN
    target: Target


def _basename(local: str) -> str:
    name = os.path.basename(os.path.normpath(os.path.abspath(local)))
    if not name:
        raise UsageError(f"{local!r} has no name to put it under; give the target path")
    return name


def _walk(top: str):
    """(local path, components below top) of every regular file below `top`, in name order."""

    def fail(exc):
        raise exc

    for dirpath, dirnames, filenames in os.walk(top, onerror=fail):
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                warn(f"skipping {os.path.join(dirpath, name)!r}: a symlink to a directory is not followed")
                dirnames.remove(name)
        dirnames.sort()
        for name in sorted(filenames):
            local = os.path.join(dirpath, name)
            if not is_regular_file(local):
                warn(f"skipping {local!r}: not a regular file")
                continue
            yield local, tuple(os.path.relpath(local, top).split(os.sep))


def plan_put(target: Target, sources: list[str], *, is_directory=lambda target: False) -> list[Upload]:
    """Every (source, target) of a put, validated before anything is uploaded.

    is_directory(target) says whether a target already is a directory in the workbench: a single
    file put at an existing directory lands inside it (`put WB:outputs results.csv`), as cp does.
    """
    from nokvfs.workspace import publish

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
        info = os.stat(source)  # a missing source fails here, before any upload
        if stat_module.S_ISDIR(info.st_mode):
            base = target.child(_basename(source)) if into else target
            plan += [Upload(local, base.child(*below)) for local, below in _walk(source)]
        else:
            dest = target.child(_basename(source)) if into or (target.components and is_directory(target)) else target
            if not dest.components:
                raise UsageError(f"a file needs a path to be put at: {target.workbench_id}:PATH")
            plan.append(Upload(source, dest))
    seen = {}
    for upload in plan:
        components = normalize_path(join(upload.target.components))
        publish.check_publishable(components)
        if components in seen:
            raise UsageError(f"{seen[components]!r} and {upload.source!r} would both be put at {upload.target}")
        seen[components] = upload.source
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
        plan = plan_put(target, args.sources or [STDIN], is_directory=lambda t: _is_directory(root, t))
        if not plan:
            warn("nothing to put")
            return 0
        if args.if_generation is not None and len(plan) != 1:
            raise UsageError("--if-generation names one file's generation; this put has several files")
        _put_all(root, args, plan, expected=0 if args.if_absent else args.if_generation)
    return 0


def _local_size(source: str) -> int | None:
    """The byte count of a regular file to put; None for stdin and streams (known once spooled)."""
    return os.stat(source).st_size if source != STDIN and is_regular_file(source) else None


def _put_all(root, args, plan: list[Upload], *, expected: int | None) -> None:
    from nokvfs.workspace import body, namespace, publish

    sizes = [_local_size(upload.source) for upload in plan]
    label = f"put {plan[0].target}" if len(plan) == 1 else f"put {len(plan)} files"
    progress = Progress.for_args(args, label, unit="files", quiet_below_bytes=BIG_BODY)
    progress.set_totals(len(plan), None if None in sizes else sum(sizes))
    out = render.JsonArray() if args.json else contextlib.nullcontext()
    with out, progress:  # the progress line ends before the array does
        for upload in plan:
            path = upload.target.path
            content_type = args.content_type or guess_content_type(path) or publish.DEFAULT_CONTENT_TYPE
            with contextlib.ExitStack() as stack:
                if upload.source == STDIN:
                    source = stdin_binary()
                elif is_regular_file(upload.source):
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
                )
            progress.advance(1)
            with progress.paused():
                if args.json:
                    out.add(render.write_json(upload.target.workbench_id, path, entry))
                else:
                    print(render.write_result("put", upload.target.workbench_id, path, entry))


# --- get ------------------------------------------------------------------------------------


def _register_get(subparsers) -> None:
    p = subparsers.add_parser("get", help="write an artifact's bytes to stdout or a local file; -R: a directory's files")
    p.add_argument("source", metavar="WB:PATH")
    p.add_argument("dest", metavar="DEST", nargs="?", help="local file (written atomically) or '-' for stdout (the default); with -R a local directory")
    p.add_argument("-R", "-r", dest="recursive", action="store_true",
                   help="every file below PATH, written to DEST/<path below PATH> (DEST an existing directory: DEST/<name of PATH>/...)")
    p.set_defaults(func=cmd_get)


def _file_entry(view, root, target: Target):
    from nokvfs.workspace import listing

    info = listing.stat(view, root, target.workbench_id, target.path)
    if info.kind != listing.FILE:
        raise IsADirectory(f"{target} is a directory")
    return info.entry


def _body_chunks(root, entry, progress):
    from nokvfs.workspace import reading

    done = 0
    for chunk in reading.iter_body(root, entry, chunk=root.block_size):
        done += len(chunk)
        progress(done, entry.logical_size)
        yield chunk


def write_atomically(dest: str, chunks) -> None:
    """Write `chunks` to a temp file beside `dest`, fsync it, rename it over `dest`."""
    directory = os.path.dirname(os.path.abspath(dest))
    try:
        mode = stat_module.S_IMODE(os.stat(dest).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(dest) + ".", suffix=".nokvfs-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dirfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def deliver(dest: str | None, name: str, chunks) -> None:
    """A body to stdout (DEST absent or '-') or atomically to a local file (DEST an existing
    directory: DEST/name)."""
    if dest in (None, STDIN):
        out = stdout_binary()
        for chunk in chunks:
            out.write(chunk)
        out.flush()
        return
    if os.path.isdir(dest):
        dest = os.path.join(dest, name)
    write_atomically(dest, chunks)


def cmd_get(args) -> int:
    target = parse_target(args.source, allow_root=args.recursive)
    with open_root(args, write=False) as root:
        if args.recursive:
            return _get_tree(root, args, target)
        with root.read() as view:
            entry = _file_entry(view, root, target)
        progress = Progress.for_args(args, f"get {target}", unit="files", quiet_below_bytes=BIG_BODY)
        progress.set_totals(1, entry.logical_size)
        with progress:
            deliver(args.dest, target.components[-1], _body_chunks(root, entry, progress.body_callback()))
            progress.advance(1)
    return 0


def _get_tree(root, args, target: Target) -> int:
    """`get -R`: every file below the target, each written atomically below DEST (like cp -r)."""
    from nokvfs.workspace import listing

    if args.dest in (None, STDIN):
        raise UsageError("get -R writes files: give a local directory as DEST")
    dest = args.dest
    if os.path.isdir(dest):
        dest = os.path.join(dest, target.components[-1] if target.components else target.workbench_id)
    files = []  # (components below the target, entry): listed at one read version, then read
    with root.read() as view:
        info = listing.stat(view, root, target.workbench_id, target.path)
        if info.kind == listing.FILE:
            files.append(((), info.entry))
        cursor = None
        while info.kind != listing.FILE:
            page = listing.list_recursive(view, root, target.workbench_id, target.path, cursor=cursor, limit=PAGE_LIMIT)
            files += [(normalize_path(child.name), child.entry) for child in page.children]
            cursor = page.cursor
            if cursor is None:
                break
    progress = Progress.for_args(args, f"get {target}", unit="files", quiet_below_bytes=BIG_BODY)
    progress.set_totals(len(files), sum(entry.logical_size for _, entry in files))
    with progress:
        for below, entry in files:
            local = os.path.join(dest, *below)
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            write_atomically(local, _body_chunks(root, entry, progress.body_callback()))
            progress.advance(1)
    return 0


# --- ls -------------------------------------------------------------------------------------


def _register_ls(subparsers) -> None:
    p = subparsers.add_parser("ls", help="list workbenches, a directory's children, or every file below it")
    p.add_argument("target", metavar="WB[:PATH]", nargs="?", help="omit to list workbenches")
    p.add_argument("-l", dest="long", action="store_true", help="long format: kind, size, generation, mtime (UTC), name")
    p.add_argument("-R", dest="recursive", action="store_true", help="every file below PATH, by its path below PATH")
    _add_json(p)
    p.set_defaults(func=cmd_ls)


class _Listing:
    """Writes listing rows as they arrive: names, `-l` lines, or one JSON array."""

    def __init__(self, args):
        self.json = render.JsonArray() if args.json else None
        self.long = args.long

    def __enter__(self):
        if self.json:
            self.json.__enter__()
        return self

    def __exit__(self, *exc):
        if self.json:
            self.json.__exit__(*exc)

    def row(self, name: str, path: str, kind: str, entry) -> None:
        from nokvfs.workspace import listing

        if self.json:
            self.json.add(render.listing_json(name, path, kind, entry))
            return
        shown = name + "/" if kind == listing.DIRECTORY else name
        print(render.long_line(shown, kind, entry) if self.long else render.safe(shown))


def cmd_ls(args) -> int:
    from nokvfs.workspace import listing

    if args.target is None:
        return _ls_workbenches(args)
    target = parse_target(args.target, need_path=False, allow_root=True, allow_into=True)
    wb_id, base = target.workbench_id, target.path
    with open_root(args, write=False) as root, root.read() as view, _Listing(args) as out:
        info = listing.stat(view, root, wb_id, base)
        if info.kind == listing.FILE:
            out.row(base, base, listing.FILE, info.entry)
            return 0
        pager = listing.list_recursive if args.recursive else listing.list_dir
        cursor = None
        while True:
            page = pager(view, root, wb_id, base, cursor=cursor, limit=PAGE_LIMIT)
            for child in page.children:
                out.row(child.name, f"{base}/{child.name}" if base else child.name, child.kind, child.entry)
            cursor = page.cursor
            if cursor is None:
                return 0


def _ls_workbenches(args) -> int:
    from nokvfs.workspace import workbench

    with open_root(args, write=False) as root, root.read() as view:
        benches = workbench.list_visible(view, root.root_id)
    if args.json:
        render.print_json([render.workbench_json(w) for w in benches])
    else:
        for w in benches:
            name = w.workbench_id + "/"
            print(render.long_line(name, "dir", None) if args.long else name)
    return 0


# --- stat -----------------------------------------------------------------------------------


def _register_stat(subparsers) -> None:
    p = subparsers.add_parser("stat", help="show a path's entry: generation, revision, digests, ...")
    p.add_argument("target", metavar="WB:PATH")
    _add_json(p)
    p.set_defaults(func=cmd_stat)


def cmd_stat(args) -> int:
    from nokvfs.workspace import listing

    target = parse_target(args.target, need_path=False, allow_root=True)
    with open_root(args, write=False) as root, root.read() as view:
        info = listing.stat(view, root, target.workbench_id, target.path)
    if args.json:
        render.print_json(render.stat_json(info, target.workbench_id))
    else:
        print(render.stat_text(info, target.workbench_id))
    return 0


# --- rm, mv ---------------------------------------------------------------------------------


def _register_rm(subparsers) -> None:
    p = subparsers.add_parser("rm", help="remove a file")
    p.add_argument("target", metavar="WB:PATH")
    _add_if_generation(p, "remove")
    _add_json(p)
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
    _add_json(p)
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
        print(f"mv {render.safe(source)} -> {render.safe(dest)} generation={entry.generation} revision={entry.artifact_revision_id.hex()} size={entry.logical_size}")
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
    _add_json(p)
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

