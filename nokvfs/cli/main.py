"""`nokvfs`: the entry point, the command registry and the one error -> exit code table.

    nokvfs [GLOBAL OPTIONS] <command> ... [GLOBAL OPTIONS]

The global options -- `--data-dir DIR`, `--store URL`, `--endpoint-url URL`, `--debug`, `--verify`,
`--progress` -- are accepted before the command or anywhere after it (after a subcommand too:
`nokvfs snapshot mint WB --data-dir D`), with the same meaning; given twice, the last one wins.
Every command's `--help` lists them. `--data-dir` defaults to `$NOKVFS_DATA_DIR`, else
`$XDG_DATA_HOME/nokvfs` (~/.local/share/nokvfs). `--store` / `--endpoint-url` name the object
store for `init` and override the one recorded in the data directory for every other command.
`--progress` shows the progress of long commands on stderr when it is not a terminal.

Commands come from the modules in `COMMAND_MODULES`; each exposes `register(subparsers)` and adds
its subcommands with `set_defaults(func=handler)`, `handler(args) -> int | None` (see
nokvfs.cli.common). A listed module that does not exist is skipped (only a ModuleNotFoundError for
exactly that module's name); any other import failure is a bug and is raised, so a command
module must import optional dependencies (pyfuse3, trio) inside its handlers.

Exit codes. Every failure is mapped here, by `EXIT_CODES` (first matching row wins), and reported
as one line `nokvfs: <kind>: <message>` on stderr, where <kind> is the error class in words
("path invalid", "generation conflict", "integrity error", "io error" for OSError) and the
message is escaped like every human-readable output (nokvfs.cli.render.safe: a name in it cannot
drive the terminal); `--debug` adds the traceback.

    code  meaning              raised as (nokvfs.errors unless noted)
    0     ok
    1     internal error       anything not below (a bug: rerun with --debug)
    2     usage / bad input    UsageError (nokvfs.cli.common; also argparse errors), InvalidInput
                               and its subclasses (PathInvalid, NameInvalid, IdInvalid,
                               ReservedPath, NotADirectory, IsADirectory, ...), CommandTooLarge
    3     not found            NotFound, HistoryNotRetained
    4     conflict             AlreadyExists, PredicateFailed (GenerationConflict),
                               RequestMismatch, ReadVersionStale
    5     integrity / format   IntegrityError, FormatError (SchemaMismatch, OutboxCorrupt,
                               CorruptRecord, UnknownVersion, UnknownDiscriminant)
    6     store / I/O          StoreError (StoreFull, ObjectMissing, AmbiguousResult,
                               PreconditionFailed), OSError
    7     fenced               FenceError (OwnerFenced)
    130   interrupted          KeyboardInterrupt
    141   broken pipe          BrokenPipeError on stdout (`nokvfs get ... | head`): silent
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback

from nokvfs import errors
from nokvfs.cli.common import UsageError
from nokvfs.cli.render import safe

COMMAND_MODULES = [
    "nokvfs.cli.commands",
    "nokvfs.cli.attribute_commands",
    "nokvfs.cli.history_commands",
    "nokvfs.cli.commit_commands",
    "nokvfs.cli.maintenance_commands",
    "nokvfs.cli.mount_commands",
    "nokvfs.cli.shard_commands",
    "nokvfs.cli.status_commands",
]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_INTEGRITY = 5
EXIT_STORE = 6
EXIT_FENCED = 7
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

# The one table: error class -> exit code. The first row that matches wins, so a subclass with a
# code of its own must precede its base (BrokenPipeError before OSError).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (KeyboardInterrupt, EXIT_INTERRUPTED),
    (errors.FenceError, EXIT_FENCED),
    (errors.InvalidInput, EXIT_USAGE),
    (errors.CommandTooLarge, EXIT_USAGE),
    (errors.NotFound, EXIT_NOT_FOUND),
    (errors.HistoryNotRetained, EXIT_NOT_FOUND),
    (errors.AlreadyExists, EXIT_CONFLICT),
    (errors.PredicateFailed, EXIT_CONFLICT),
    (errors.RequestMismatch, EXIT_CONFLICT),
    (errors.ReadVersionStale, EXIT_CONFLICT),
    (errors.IntegrityError, EXIT_INTEGRITY),
    (errors.FormatError, EXIT_INTEGRITY),
    (errors.StoreError, EXIT_STORE),
    (BrokenPipeError, EXIT_BROKEN_PIPE),
    (OSError, EXIT_STORE),
)


def exit_code(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_INTERNAL


_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def error_kind(exc: BaseException) -> str:
    if isinstance(exc, UsageError):
        return "usage"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, OSError):
        return "io error"
    if not isinstance(exc, errors.NokvError):
        return "internal error"
    return _WORD_BOUNDARY.sub(" ", type(exc).__name__).lower()  # IsADirectory -> "is a directory"


def error_message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = " ".join(repr(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where}: {exc.strerror}" if where else exc.strerror
    text = str(exc) or type(exc).__name__
    if exit_code(exc) == EXIT_INTERNAL:
        text = f"{type(exc).__name__}: {text} (rerun with --debug for the traceback)"
    return text


def report(exc: BaseException, *, debug: bool) -> int:
    """Print the one-line message (and with --debug the traceback); return the exit code."""
    code = exit_code(exc)
    if code == EXIT_BROKEN_PIPE:
        # The reader went away: say nothing, and keep the interpreter's final flush quiet.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return code
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    usage = getattr(exc, "usage", None)
    if usage:
        sys.stderr.write(usage if usage.endswith("\n") else usage + "\n")
    print(f"nokvfs: {error_kind(exc)}: {safe(error_message(exc))}", file=sys.stderr)
    return code


# --- the parser -----------------------------------------------------------------------------


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is raised (and mapped by the table), never printed and exited."""

    def error(self, message):
        raise UsageError(message, usage=self.format_usage())


def load_command_modules(names=None) -> list:
    modules = []
    for name in COMMAND_MODULES if names is None else names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


GLOBAL_OPTIONS_TITLE = "global options (before or after the command)"


def add_global_options(parser, *, defaults: dict | None) -> None:
    """The options every command takes, before its name or after it (`nokvfs init --data-dir D`
    is `nokvfs --data-dir D init`), with the same meaning either way.

    On the top-level parser `defaults` gives their values; on a command's parser (nested ones
    too: `snapshot mint`, `shard push`) they default to SUPPRESS, so a value given after the
    command replaces the one before it and an absent one leaves it alone.
    """
    group = parser.add_argument_group(GLOBAL_OPTIONS_TITLE)

    def default(name):
        return argparse.SUPPRESS if defaults is None else defaults[name]

    group.add_argument(
        "--data-dir",
        metavar="DIR",
        default=default("data_dir"),
        help="the data directory (default: $NOKVFS_DATA_DIR, else $XDG_DATA_HOME/nokvfs or ~/.local/share/nokvfs)",
    )
    group.add_argument(
        "--store",
        metavar="URL",
        default=default("store"),
        help="object store URL (file:///abs or s3://bucket/prefix): for init the store to use, else overriding the "
        "data directory's",
    )
    group.add_argument(
        "--endpoint-url",
        metavar="URL",
        default=default("endpoint_url"),
        help="S3-compatible endpoint for an s3:// store",
    )
    group.add_argument("--debug", action="store_true", default=default("debug"), help="show tracebacks of failures")
    group.add_argument(
        "--progress",
        action="store_true",
        default=default("progress"),
        help="show progress on stderr even when it is not a terminal (it never goes to stdout)",
    )
    group.add_argument(
        "--verify",
        action="store_true",
        default=default("verify"),
        help="before the command, read every row of the shard and recompute every state digest "
        "(rows are always verified as they are read; this proves the whole shard intact first)",
    )


def _global_defaults() -> dict:
    from nokvfs.workspace.datadir import default_data_dir

    return {
        "data_dir": os.environ.get("NOKVFS_DATA_DIR") or default_data_dir(),
        "store": None,
        "endpoint_url": None,
        "debug": False,
        "progress": False,
        "verify": False,
    }


def command_parsers(parser, path=()):
    """(command words, parser) of every command and subcommand below `parser`, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,), sub
                yield from command_parsers(sub, path + (name,))


def build_parser(modules=None, argv=None) -> ArgumentParser:
    """The whole command line's parser; given `argv`, only the parser of the command it names
    (all of them together are some 1,100 argparse calls, 80 ms of each `nokvfs` run on this
    machine kind), or the whole one when it names none this build knows (for argparse's help and
    its "invalid choice" message)."""
    parser = ArgumentParser(
        prog="nokvfs",
        description="Workbenches of versioned artifacts on a NoKV metadata shard and an object store.",
        epilog="Exit codes: 0 ok, 2 usage/invalid input, 3 not found, 4 conflict, 5 integrity, 6 store/I-O, 7 fenced.",
    )
    add_global_options(parser, defaults=_global_defaults())
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    modules = load_command_modules() if modules is None else modules
    word = None if argv is None else _command_word(parser, argv)
    target = subparsers if word is None else _OneCommand(subparsers, word)
    for module in modules:
        module.register(target)
    if word is not None and not target.found:
        return build_parser(modules)
    for words, sub in command_parsers(parser):
        clash = sorted(set(sub._option_string_actions) & set(parser._option_string_actions) - {"-h", "--help"})
        if clash:  # a command may not give a global option another meaning
            raise AssertionError(f"`nokvfs {' '.join(words)}` redefines the global option(s) {', '.join(clash)}")
        add_global_options(sub, defaults=None)
    return parser


def _command_word(parser, argv) -> str | None:
    """The command `argv` names after the global options, or None where that takes argparse to
    tell (help, an abbreviated or unknown option, `--`)."""
    options = parser._option_string_actions
    words = iter(argv)
    for word in words:
        if not word.startswith("-"):
            return word
        name, equals, _ = word.partition("=")
        action = options.get(name)
        if action is None or name in ("-h", "--help"):
            return None
        if action.nargs != 0 and not equals:
            next(words, None)  # its value
    return None


class _OneCommand:
    """Stands in for the subparsers action while the command modules register: the command
    named `word` is added for real, every other one to nothing."""

    def __init__(self, subparsers, word: str):
        self.subparsers, self.word, self.found = subparsers, word, False

    def add_parser(self, name, **kwargs):
        if self.word == name or self.word in kwargs.get("aliases", ()):
            self.found = True
            return self.subparsers.add_parser(name, **kwargs)
        return _IGNORED


class _Ignored:
    """Takes any call and attribute, and does nothing: a command's parser not built."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


_IGNORED = _Ignored()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        parser = build_parser(argv=argv)
        args = parser.parse_args(argv)
        debug = args.debug
        code = args.func(args)
        sys.stdout.flush()
        return EXIT_OK if code is None else int(code)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    except BaseException as exc:  # noqa: BLE001 - this is the one place failures are mapped
        return report(exc, debug=debug)


if __name__ == "__main__":
    sys.exit(main())
