"""Global options before or after the command, with the same meaning, on every command.

The commands are enumerated from the parser itself (`command_parsers`), so a command added
later is covered without touching this file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys

import pytest

from nokvfs.cli.main import GLOBAL_OPTIONS_TITLE, build_parser, command_parsers, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBALS = [
    "--data-dir",
    "/srv/d",
    "--store",
    "s3://b/p",
    "--endpoint-url",
    "http://127.0.0.1:9",
    "--debug",
    "--progress",
]
GLOBAL_VALUES = {
    "data_dir": "/srv/d",
    "store": "s3://b/p",
    "endpoint_url": "http://127.0.0.1:9",
    "debug": True,
    "progress": True,
}


def _subparsers(parser):
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _dummy(action) -> str:
    """A value the action accepts: "x", or "0" for a typed one that refuses it (chmod's MODE)."""
    if action.type is None:
        return "x"
    try:
        action.type("x")
    except Exception:
        return "0"
    return "x"


def _operands(parser) -> list[str]:
    """Dummy values for a parser's required positionals and required options (not its subcommand)."""
    out = []
    for action in parser._actions:
        if (
            isinstance(action, argparse._SubParsersAction)
            or action.default == argparse.SUPPRESS
            and action.option_strings
        ):
            continue
        if not action.option_strings and action.nargs not in ("?", "*"):
            out.append(_dummy(action))
        elif action.option_strings and action.required:
            out += [action.option_strings[0], _dummy(action)]
    return out


def leaf_commands():
    """(words, levels) of every runnable command: `levels` is the argv segment of each parser level
    from the top (command word plus its operands), so options can be placed between levels."""
    parser = build_parser()
    parsers = dict(command_parsers(parser))
    leaves = []
    for words, sub in parsers.items():
        if _subparsers(sub):
            continue
        levels = [[words[0]] + _operands(parsers[words[:1]])]
        for depth in range(2, len(words) + 1):
            levels.append([words[depth - 1]] + _operands(parsers[words[:depth]]))
        leaves.append((words, levels))
    return leaves


LEAVES = leaf_commands()


@functools.cache
def whole_parser():
    """The whole parser, built once (some 90 ms each): parsing leaves no state in it."""
    return build_parser()


def parse(argv):
    return vars(whole_parser().parse_args(argv))


def test_the_enumeration_finds_every_command():
    names = {" ".join(words) for words, _ in LEAVES}
    # a sample of each kind: plain, nested twice, a positional before the nested verb, FUSE
    assert {
        "init",
        "put",
        "get",
        "ls",
        "gc",
        "fsck",
        "restore",
        "snapshot mint",
        "shard push",
        "shard restore",
        "tag set",
        "as-of ls",
        "mount",
        "umount",
        "changes",
        "search",
    } <= names
    assert len(names) >= 35


@pytest.mark.parametrize("words,levels", LEAVES, ids=[" ".join(w) for w, _ in LEAVES])
def test_global_options_before_after_and_between_mean_the_same(words, levels):
    command = [arg for level in levels for arg in level]
    before = parse(GLOBALS + command)
    after = parse(command + GLOBALS)
    assert before == after
    for key, value in GLOBAL_VALUES.items():
        assert before[key] == value, (words, key)
    # between the levels of a nested command (`snapshot --data-dir D mint WB`)
    for cut in range(1, len(levels)):
        head = [arg for level in levels[:cut] for arg in level]
        tail = [arg for level in levels[cut:] for arg in level]
        assert parse(head + GLOBALS + tail) == before
    # absent: the top level's defaults, whatever the command
    plain = parse(command)
    assert (plain["store"], plain["endpoint_url"], plain["debug"], plain["progress"]) == (None, None, False, False)
    assert plain["data_dir"] == parse(["ls"])["data_dir"]
    # the last one given wins, wherever it is
    assert parse(["--data-dir", "/first"] + command + ["--data-dir", "/second"])["data_dir"] == "/second"


@pytest.mark.parametrize("words,levels", LEAVES, ids=[" ".join(w) for w, _ in LEAVES])
def test_every_command_help_lists_the_global_options(words, levels):
    parsers = dict(command_parsers(whole_parser()))
    text = parsers[words].format_help()
    assert GLOBAL_OPTIONS_TITLE in text
    for option in ("--data-dir", "--store", "--endpoint-url", "--debug", "--progress"):
        assert option in text, (words, option)


@pytest.mark.parametrize("words,levels", LEAVES, ids=[" ".join(w) for w, _ in LEAVES])
def test_the_parser_built_for_one_command_parses_and_helps_as_the_whole_one(words, levels):
    """`nokvfs CMD ...` builds only CMD's parser (main passes argv to build_parser): it must
    answer every argv naming CMD exactly as the whole parser does."""
    command = [arg for level in levels for arg in level]
    for argv in (command, GLOBALS + command, command + GLOBALS, ["--data-dir=/d", "--debug"] + command):
        one = build_parser(argv=argv)
        assert {w[0] for w in dict(command_parsers(one))} == {words[0]}  # only CMD was built
        assert vars(one.parse_args(argv)) == parse(argv)
    helps = dict(command_parsers(build_parser(argv=command)))
    assert helps[words].format_help() == dict(command_parsers(whole_parser()))[words].format_help()


@pytest.mark.parametrize(
    "argv",
    [["lss"], ["--data", "/d", "ls"], ["-h"], ["--help", "ls"], ["--", "ls"], [], ["--data-dir"]],
    ids=["unknown", "abbreviated", "-h", "--help", "--", "nothing", "no value"],
)
def test_an_argv_naming_no_known_command_gets_the_whole_parser(argv):
    """Help, an unknown command (argparse lists the choices), an abbreviated global option."""
    whole = {w for w in dict(command_parsers(whole_parser()))}
    assert {w for w in dict(command_parsers(build_parser(argv=argv)))} == whole


def test_a_command_cannot_give_a_global_option_another_meaning():
    class Clashing:
        @staticmethod
        def register(subparsers):
            p = subparsers.add_parser("clash")
            p.add_argument("--store", help="something else")

    with pytest.raises(AssertionError, match="clash.*--store"):
        build_parser(modules=[Clashing])


def run(*argv, env=None):
    environment = dict(os.environ, PYTHONPATH=REPO)
    environment.pop("NOKVFS_DATA_DIR", None)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=120,
    )


def test_init_and_work_with_the_data_dir_after_the_command(tmp_path):
    data = str(tmp_path / "data")
    done = run("init", "--data-dir", data, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data_dir"] == data
    assert run("workbench", "create", "wb", "--data-dir", data).returncode == 0
    assert run("put", "wb:outputs/a.txt", "-", "--data-dir", data).returncode == 0
    listed = run("ls", "wb:outputs", "--data-dir", data)
    assert (listed.returncode, listed.stdout) == (0, "a.txt\n")
    minted = run("snapshot", "mint", "wb", "--alias", "s1", "--data-dir", data)
    assert minted.returncode == 0 and "(s1)" in minted.stdout
    assert run("snapshot", "--data-dir", data, "list", "wb").stdout.split()[-1] == "s1"
    # the same options before the command reach the same data directory
    assert run("--data-dir", data, "ls", "wb:outputs").stdout == "a.txt\n"


def test_init_takes_its_store_from_the_global_option_in_either_place(tmp_path):
    store_a, store_b = tmp_path / "store-a", tmp_path / "store-b"
    assert main(["init", "--data-dir", str(tmp_path / "a"), "--store", f"file://{store_a}"]) == 0
    assert main(["--store", f"file://{store_b}", "--data-dir", str(tmp_path / "b"), "init"]) == 0
    for name, store in (("a", store_a), ("b", store_b)):
        with open(tmp_path / name / "nokvfs.json") as f:
            assert json.load(f)["store"] == f"file://{store}"


def test_debug_after_a_nested_command_shows_the_traceback(tmp_path):
    failed = run("snapshot", "list", "wb", "--data-dir", str(tmp_path / "none"), "--debug")
    assert failed.returncode == 3
    assert "Traceback" in failed.stderr and failed.stderr.rstrip().splitlines()[-1].startswith("nokvfs: not found: ")


def test_mount_keeps_its_two_operand_form():
    args = parse(["mount", "/data", "/mnt"])
    assert (args["mount_first"], args["mount_second"]) == ("/data", "/mnt")
    args = parse(["mount", "/mnt", "--data-dir", "/data"])
    assert (args["mount_first"], args["mount_second"], args["data_dir"]) == ("/mnt", None, "/data")
