"""Names cannot rewrite the terminal: human-readable output escapes control and bidirectional
characters (and the backslash, so an escape cannot be forged); --json keeps exact names."""

from __future__ import annotations

import json

import pytest

from nokvfs.cli.main import main
from nokvfs.cli.render import dumps, safe, unescape

ESC = "outputs/\x1b]0;pwned\x07\x1b[2J\x1b[31mred"  # set the title, clear the screen, colour
RLO = "outputs/invoice\u202eexe.txt"  # shows as invoicetxt.exe
NEWLINE = "outputs/two\nlines"
INVISIBLE = "outputs/a\u200bb\u2066c\u2069\ufeff\x7f\x9b"  # zero-width space, isolates, BOM, DEL, CSI (C1)
NAMES = [ESC, RLO, NEWLINE, INVISIBLE]


def terminal_safe(text: str) -> bool:
    """No character a terminal acts on or that reorders text, except line breaks and tabs."""
    return all(c in "\n\t\\" or safe(c) == c for c in text)


@pytest.mark.parametrize(
    "text,shown",
    [
        ("plain name.txt", "plain name.txt"),
        ("a\\b", "a\\\\b"),
        ("\x1b[31m", "\\x1b[31m"),
        ("line\nbreak\ttab\rcr", "line\\nbreak\\ttab\\rcr"),
        ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),
        (
            "ab\u202ecd\u2066\u2069\u200e\u200f\u061c\ufeff",
            "ab\\u{202e}cd\\u{2066}\\u{2069}\\u{200e}\\u{200f}\\u{61c}\\u{feff}",
        ),
        ("\u2028\u2029\U000e0041", "\\u{2028}\\u{2029}\\u{e0041}"),
        ("café 日本語 🙂", "café 日本語 🙂"),
        ("\\x1b is not ESC", "\\\\x1b is not ESC"),  # a forged escape stays distinguishable
    ],
)
def test_the_escaping_is_unambiguous_and_reversible(text, shown):
    assert safe(text) == shown
    assert unescape(safe(text)) == text
    assert terminal_safe(safe(text))


def test_json_keeps_exact_names_as_inert_escapes():
    for name in NAMES:
        text = dumps({"path": name})
        assert json.loads(text)["path"] == name
        assert all(c == "\n" or c.isascii() and c.isprintable() or safe(c) == c for c in text), repr(text)


@pytest.fixture
def cli(tmp_path, capsysbinary, monkeypatch):
    monkeypatch.delenv("NOKVFS_DATA_DIR", raising=False)
    data = str(tmp_path / "data")

    def run(*argv, stdin=None):
        import io
        import sys

        capsysbinary.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = main([*argv, "--data-dir", data])
        captured = capsysbinary.readouterr()
        return code, captured.out.decode(), captured.err.decode()

    assert run("init")[0] == 0 and run("workbench", "create", "wb")[0] == 0
    return run


def test_names_are_printed_escaped_and_json_keeps_them(cli):
    for name in NAMES:
        code, out, err = cli("put", f"wb:{name}", "--producer", "job\\1\x1b[8m", "--index", "k=v\u202e1", stdin=b"x")
        assert code == 0, err
        assert out == f"put wb:{safe(name)} generation=1 " + out.split(" generation=1 ")[1]
        assert terminal_safe(out) and out.count("\n") == 1
    code, out, _ = cli("ls", "wb:outputs")
    assert code == 0 and terminal_safe(out)
    assert sorted(out.splitlines()) == sorted(safe(n.split("/")[1]) for n in NAMES)
    assert [unescape(line) for line in out.splitlines()] == sorted(n.split("/")[1] for n in NAMES)
    for flags in (["-l"], ["-R"], ["-l", "-R"]):
        code, out, _ = cli("ls", *flags, "wb:outputs")
        assert code == 0 and terminal_safe(out) and len(out.splitlines()) == len(NAMES)
    code, out, _ = cli("ls", "--json", "wb:outputs")
    assert sorted(row["path"] for row in json.loads(out)) == sorted(NAMES)
    code, out, _ = cli("stat", f"wb:{RLO}")
    assert code == 0 and terminal_safe(out) and "invoice\\u{202e}exe.txt" in out and "job\\\\1\\x1b[8m" in out
    assert json.loads(cli("stat", "--json", f"wb:{RLO}")[1])["producer"] == "job\\1\x1b[8m"
    code, out, _ = cli("changes")
    assert code == 0 and terminal_safe(out) and safe(ESC) in out
    assert {json.loads(line)["path"] for line in cli("changes", "--json")[1].splitlines()} >= set(NAMES)
    code, out, _ = cli("search", "wb", "k=v\u202e1")
    assert code == 0 and terminal_safe(out) and len(out.splitlines()) == len(NAMES)
    assert out.splitlines()[0].endswith("\t'v\\u{202e}1'")


def test_labels_history_and_errors_are_escaped(cli):
    assert cli("put", "wb:outputs/a", stdin=b"a")[0] == 0
    alias, tag = "snap\x1b[1A\\", "v1\u202e\n"
    assert cli("snapshot", "mint", "wb", "--alias", alias)[0] == 0
    code, out, _ = cli("snapshot", "list", "wb")
    assert terminal_safe(out) and out.rstrip("\n").endswith(safe(alias))
    assert json.loads(cli("snapshot", "list", "wb", "--json")[1])[0]["alias"] == alias
    assert cli("commit", "wb", "--producer", "p\x1b[0m", "--tag", tag)[0] == 0
    for argv in (["log", "wb"], ["tag", "list", "wb"]):
        code, out, _ = cli(*argv)
        assert code == 0 and terminal_safe(out) and out.count("\n") == 1, out
    assert safe(tag) in cli("tag", "list", "wb")[1] and "p\\x1b[0m" in cli("log", "wb")[1]
    code, out, err = cli("get", f"wb:{ESC}")
    assert code == 3 and out == "" and terminal_safe(err) and err.count("\n") == 1
    code, _, err = cli("put", "wb:outputs/x\x1b[2J/../y", stdin=b"y")
    assert code == 2 and terminal_safe(err) and err.count("\n") == 1


def test_link_targets_and_attribute_lines_are_escaped_and_json_keeps_them(cli):
    target = "../x\x1b[2J\u202etxt.exe"
    name = "outputs/l\x1b[31m"
    code, out, err = cli("ln", "-s", target, f"wb:{name}")
    assert code == 0, err
    assert terminal_safe(out) and out.rstrip("\n").endswith(f" -> {safe(target)}") and out.count("\n") == 1
    code, out, _ = cli("readlink", f"wb:{name}")
    assert (code, out) == (0, safe(target) + "\n") and unescape(out[:-1]) == target
    code, out, _ = cli("ls", "-l", "wb:outputs")
    assert (
        code == 0
        and terminal_safe(out)
        and out.rstrip("\n").endswith(f"{safe('l' + chr(27) + '[31m')} -> {safe(target)}")
    )
    code, out, _ = cli("stat", f"wb:{name}")
    assert code == 0 and terminal_safe(out) and safe(target) in out
    assert json.loads(cli("stat", "--json", f"wb:{name}")[1])["link_target"] == target
    assert json.loads(cli("ls", "--json", "wb:outputs")[1])[0]["link_target"] == target
    code, out, _ = cli("chmod", "700", f"wb:{name}")
    assert code == 0 and terminal_safe(out) and safe(name) in out
