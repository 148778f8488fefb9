"""The `nokvfs` command line, driven in-process through `main([...])` on real data directories.

Every test gets a fresh data directory with the local object store and one workbench `wb1`.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from nokvfs import errors
from nokvfs.cli import commands
from nokvfs.cli import main as cli_main
from nokvfs.cli.common import UsageError, parse_size
from nokvfs.cli.main import main
from nokvfs.schema.ids import uuid7_unix_ms

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1024 * 1024


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.delenv("NOKVFS_DATA_DIR", raising=False)
    directory = str(tmp_path / "data")
    assert main(["--data-dir", directory, "init"]) == 0
    assert main(["--data-dir", directory, "workbench", "create", "wb1"]) == 0
    return directory


class Cli:
    """Runs `nokvfs --data-dir DATA ...` in-process and captures stdout (bytes) and stderr."""

    def __init__(self, data_dir: str, capture):
        self.data_dir = data_dir
        self.capture = capture

    def __call__(self, *argv, stdin: bytes | None = None, monkeypatch=None):
        self.capture.readouterr()
        if stdin is not None:
            saved = sys.stdin
            sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
        try:
            code = main(["--data-dir", self.data_dir, *argv])
        finally:
            if stdin is not None:
                sys.stdin = saved
        captured = self.capture.readouterr()
        out, err = captured.out, captured.err
        if isinstance(out, str):
            out = out.encode()
        if isinstance(err, bytes):
            err = err.decode()
        return code, out, err

    def ok(self, *argv, stdin: bytes | None = None) -> bytes:
        code, out, err = self(*argv, stdin=stdin)
        assert code == 0, (argv, code, err)
        return out

    def text(self, *argv, stdin: bytes | None = None) -> str:
        return self.ok(*argv, stdin=stdin).decode()

    def json(self, *argv):
        return json.loads(self.text(*argv, "--json"))


@pytest.fixture
def cli(data, capsysbinary):
    return Cli(data, capsysbinary)


def write(path, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def block_files(data_dir: str, revision_hex: str) -> list[str]:
    base = os.path.join(data_dir, "objects", "nokv", "artifacts")
    found = []
    for dirpath, _, filenames in os.walk(base):
        if os.path.basename(os.path.dirname(dirpath)) == revision_hex and os.path.basename(dirpath) == "blocks":
            found += [os.path.join(dirpath, n) for n in filenames]
    return sorted(found)


# --- init and workbenches -------------------------------------------------------------------


def test_init_records_the_store_and_refuses_an_existing_data_dir(tmp_path, capsys):
    directory = str(tmp_path / "d")
    assert main(["--data-dir", directory, "init", "--block-size", "64KiB", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["block_size"] == 64 * 1024
    assert config["store"] == "file://" + os.path.join(directory, "objects")
    assert len(config["root_id"]) == 32
    assert main(["--data-dir", directory, "init"]) == 4
    assert capsys.readouterr().err.startswith("nokvfs: already exists: ")


def test_init_rejects_a_block_size_out_of_range(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path / "d"), "init", "--block-size", "1K"]) == 2
    assert main(["--data-dir", str(tmp_path / "d"), "init", "--block-size", "lots"]) == 2
    assert "invalid size" in capsys.readouterr().err


def test_data_dir_defaults_to_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NOKVFS_DATA_DIR", str(tmp_path / "env"))
    assert main(["init"]) == 0
    assert os.path.exists(tmp_path / "env" / "nokvfs.json")


def test_a_command_on_an_uninitialised_data_dir_is_not_found(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path / "none"), "ls"]) == 3
    assert "run `nokvfs init` first" in capsys.readouterr().err


def test_workbench_create_list_show(cli):
    assert cli.text("workbench", "create", "wb2").startswith("created workbench wb2 incarnation=")
    assert cli.text("workbench", "list") == "wb1\nwb2\n"
    listed = cli.json("workbench", "list")
    assert [w["workbench_id"] for w in listed] == ["wb1", "wb2"]
    shown = cli.json("workbench", "show", "wb2")
    assert shown == listed[1]
    assert shown["state"] == "Visible" and len(shown["incarnation_id"]) == 32
    assert sorted(shown) == [
        "created_version",
        "incarnation_id",
        "modified_version",
        "revision",
        "state",
        "workbench_id",
    ]
    assert "incarnation_id:" in cli.text("workbench", "show", "wb2")
    assert cli.text("ls") == "wb1/\nwb2/\n"


def test_workbench_errors_map_to_exit_codes(cli):
    assert cli("workbench", "create", "wb1")[0] == 4
    assert cli("workbench", "show", "nope")[0] == 3
    code, _, err = cli("workbench", "create", "bad:name")
    assert code == 2 and err.startswith("nokvfs: name invalid: ")


# --- put and get ----------------------------------------------------------------------------


def test_put_file_prints_generation_and_revision_and_get_returns_it(cli, tmp_path):
    src = write(tmp_path / "a.txt", b"hello\n")
    line = cli.text("put", "wb1:outputs/a.txt", src).strip()
    fields = dict(part.split("=") for part in line.split()[2:])
    assert line.startswith("put wb1:outputs/a.txt ")
    assert fields["generation"] == "1" and fields["size"] == "6" and len(fields["revision"]) == 32
    assert cli.ok("get", "wb1:outputs/a.txt") == b"hello\n"
    again = cli.json("put", "wb1:outputs/a.txt", src)
    assert again[0]["generation"] == 2 and again[0]["path"] == "outputs/a.txt"
    assert cli.json("stat", "wb1:outputs/a.txt")["content_type"] == "text/plain"


def test_put_from_stdin_and_get_to_stdout(cli):
    body = bytes(range(256)) * 1000
    assert "generation=1" in cli.text("put", "wb1:outputs/raw.bin", stdin=body)
    assert "generation=2" in cli.text("put", "wb1:outputs/raw.bin", "-", stdin=body + b"x")
    assert cli.ok("get", "wb1:outputs/raw.bin") == body + b"x"
    assert cli.ok("get", "wb1:outputs/raw.bin", "-") == body + b"x"


def test_put_of_a_directory_tree_round_trips_every_file(cli, tmp_path):
    tree = tmp_path / "tree"
    files = {
        "top.txt": b"top",
        ".hidden": b"dot files are included",
        "empty": b"",
        "a/one.json": b'{"one": 1}',
        "a/b/two.bin": os.urandom(70_000),
        "a/b/c/d/deep.txt": b"deep" * 1000,
        "z/last": b"z",
    }
    for rel, content in files.items():
        write(tree / rel, content)
    out = cli.text("put", "wb1:outputs/run1", str(tree))
    # One line per file, then one per directory whose mode and times were kept (deepest first).
    file_lines = [line for line in out.splitlines() if not line.endswith(" directory mode=0755")]
    assert len(file_lines) == len(files)
    directories = [line.split()[1] for line in out.splitlines()[len(files) :]]
    assert directories[-1] == "wb1:outputs/run1/" and len(directories) == 6  # run1, a, a/b, a/b/c, a/b/c/d, z
    for rel, content in files.items():
        assert cli.ok("get", f"wb1:outputs/run1/{rel}") == content, rel
    listed = cli.text("ls", "-R", "wb1:outputs/run1").splitlines()
    assert sorted(listed) == sorted(files)
    assert cli.text("ls", "wb1:outputs/run1") == ".hidden\na/\nempty\ntop.txt\nz/\n"
    dest = tmp_path / "back"
    os.mkdir(dest)
    for rel, content in files.items():
        target = dest / rel.replace("/", "_")
        cli.ok("get", f"wb1:outputs/run1/{rel}", str(target))
        assert target.read_bytes() == content


def test_put_of_a_tree_at_the_workbench_lays_out_sections(cli, tmp_path):
    write(tmp_path / "ws" / "input" / "data.csv", b"a,b\n")
    write(tmp_path / "ws" / "scripts" / "run.sh", b"echo\n")
    cli.ok("put", "wb1:", str(tmp_path / "ws"))
    assert cli.text("ls", "-R", "wb1:") == "input/data.csv\nscripts/run.sh\n"


def test_put_of_several_sources_or_a_trailing_slash_puts_into_a_directory(cli, tmp_path):
    one = write(tmp_path / "one.txt", b"1")
    two = write(tmp_path / "two.txt", b"2")
    write(tmp_path / "dir" / "three.txt", b"3")
    cli.ok("put", "wb1:outputs/many", one, two, str(tmp_path / "dir"))
    cli.ok("put", "wb1:logs/", one)
    assert (
        cli.text("ls", "-R", "wb1:")
        == "logs/one.txt\noutputs/many/dir/three.txt\noutputs/many/one.txt\noutputs/many/two.txt\n"
    )


def test_put_of_a_file_at_an_existing_directory_lands_inside_it(cli, tmp_path):
    one = write(tmp_path / "one.txt", b"1")
    cli.ok("put", "wb1:scripts", one)
    cli.ok("put", "wb1:outputs/run/x", stdin=b"x")
    assert cli.text("put", "wb1:outputs/run", one).startswith("put wb1:outputs/run/one.txt ")
    assert cli.text("ls", "-R", "wb1:") == "outputs/run/one.txt\noutputs/run/x\nscripts/one.txt\n"


def test_put_validates_every_path_before_uploading_anything(cli, tmp_path):
    write(tmp_path / "t" / "a_good", b"fine")
    write(tmp_path / "t" / "back\\slash", b"a name the normalizer refuses")
    code, out, err = cli("put", "wb1:outputs/t", str(tmp_path / "t"))
    assert code == 2 and out == b"" and "backslash" in err
    assert cli.text("ls", "-R", "wb1:") == ""
    assert not os.path.exists(os.path.join(cli.data_dir, "objects", "nokv"))  # nothing was uploaded


def test_put_refuses_stdin_among_several_sources_and_a_missing_source(cli, tmp_path):
    one = write(tmp_path / "one", b"1")
    assert cli("put", "wb1:outputs/x", "-", one)[0] == 2
    assert cli("put", "wb1:outputs/", stdin=b"x")[0] == 2
    code, _, err = cli("put", "wb1:outputs/x", one, str(tmp_path / "missing"))
    assert code == 6 and "No such file" in err
    assert cli.text("ls", "-R", "wb1:") == ""  # the missing source failed the plan


def test_put_if_absent_and_if_generation(cli):
    cli.ok("put", "--if-absent", "wb1:outputs/x", stdin=b"1")
    code, out, err = cli("put", "--if-absent", "wb1:outputs/x", stdin=b"2")
    assert code == 4 and out == b"" and err.startswith("nokvfs: generation conflict: ")
    assert cli("put", "--if-generation", "7", "wb1:outputs/x", stdin=b"2")[0] == 4
    assert "generation=2" in cli.text("put", "--if-generation", "1", "wb1:outputs/x", stdin=b"2")
    assert cli.ok("get", "wb1:outputs/x") == b"2"
    assert cli("put", "--if-absent", "--if-generation", "1", "wb1:outputs/x", stdin=b"3")[0] == 2


def test_put_content_type_and_producer(cli):
    cli.ok("put", "--content-type", "text/csv", "--producer", "job-42", "wb1:outputs/x.dat", stdin=b"a")
    info = cli.json("stat", "wb1:outputs/x.dat")
    assert (info["content_type"], info["producer"]) == ("text/csv", "job-42")
    cli.ok("put", "wb1:outputs/y.unknownext", stdin=b"a")
    assert cli.json("stat", "wb1:outputs/y.unknownext")["content_type"] == "application/octet-stream"


def test_a_20_mib_file_is_several_blocks_and_round_trips(cli, tmp_path):
    content = os.urandom(20 * MiB + 123)
    src = write(tmp_path / "big.bin", content)
    code, _, err = cli("put", "--progress", "wb1:outputs/big.bin", src)
    assert code == 0, err
    assert "(100%)" in err and "20.0 MiB" in err
    info = cli.json("stat", "wb1:outputs/big.bin")
    assert info["size"] == len(content)
    assert len(block_files(cli.data_dir, info["artifact_revision_id"])) == 6  # 4 MiB blocks
    dest = tmp_path / "big.out"
    cli.ok("get", "wb1:outputs/big.bin", str(dest))
    assert dest.read_bytes() == content
    assert cli.ok("get", "wb1:outputs/big.bin") == content


def test_small_bodies_show_no_progress(cli, tmp_path):
    code, _, err = cli("put", "--progress", "wb1:outputs/s", stdin=b"small")
    assert code == 0 and err == ""


def test_get_streams_block_by_block(cli, monkeypatch):
    from nokvfs.workspace import reading

    cli.ok("put", "wb1:outputs/x", stdin=b"x" * (9 * MiB))
    sizes = []
    real = reading.read

    def spy(root, entry, offset=0, size=None, **kw):
        data = real(root, entry, offset, size, **kw)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(reading, "read", spy)
    assert len(cli.ok("get", "wb1:outputs/x")) == 9 * MiB
    assert sizes == [4 * MiB, 4 * MiB, 1 * MiB]


def test_get_to_a_file_is_atomic_and_into_a_directory(cli, tmp_path):
    cli.ok("put", "wb1:outputs/sub/name.txt", stdin=b"new")
    existing = write(tmp_path / "dest.txt", b"old")
    os.chmod(existing, 0o640)
    cli.ok("get", "wb1:outputs/sub/name.txt", existing)
    assert (tmp_path / "dest.txt").read_bytes() == b"new" and os.stat(existing).st_mode & 0o777 == 0o640
    cli.ok("get", "wb1:outputs/sub/name.txt", str(tmp_path))
    assert (tmp_path / "name.txt").read_bytes() == b"new"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".nokvfs-tmp")]


def test_get_of_a_directory_is_invalid_input(cli):
    cli.ok("put", "wb1:outputs/d/f", stdin=b"1")
    code, _, err = cli("get", "wb1:outputs/d")
    assert code == 2 and err.startswith("nokvfs: is a directory: ")


# --- ls and stat ----------------------------------------------------------------------------


def test_ls_shows_sections_and_children(cli):
    assert cli.text("ls", "wb1") == "input/\nlogs/\nmetadata/\noutputs/\nscripts/\n"
    assert cli.text("ls", "wb1:") == cli.text("ls", "wb1")
    cli.ok("put", "wb1:outputs/b.txt", stdin=b"bb")
    cli.ok("put", "wb1:outputs/a/deep/x", stdin=b"x")
    assert cli.text("ls", "wb1:outputs") == "a/\nb.txt\n"
    assert cli.text("ls", "wb1:outputs/") == "a/\nb.txt\n"
    assert cli.text("ls", "wb1:outputs/b.txt") == "outputs/b.txt\n"
    assert cli.text("ls", "wb1:input") == ""


def test_ls_long_shows_mode_owner_size_generation_mtime_name(cli):
    cli.ok("put", "wb1:outputs/b.txt", stdin=b"bb")
    cli.ok("put", "wb1:outputs/b.txt", stdin=b"bbb")
    cli.ok("put", "wb1:outputs/a/x", stdin=b"x")
    lines = cli.text("ls", "-l", "wb1:outputs").splitlines()
    # The mode column replaced the kind column (d, -, l); nothing stored: the defaults, no owner.
    assert lines[0].split() == ["drwxr-xr-x", "-", "-", "-", "-", "a/"]
    mode, owner, size, generation, mtime, name = lines[1].split()
    assert (mode, owner, size, generation, name) == ("-rw-r--r--", "-", "3", "2", "b.txt")
    revision = cli.json("stat", "wb1:outputs/b.txt")["artifact_revision_id"]
    import datetime

    expected = datetime.datetime.fromtimestamp(uuid7_unix_ms(bytes.fromhex(revision)) // 1000, tz=datetime.UTC)
    assert mtime == expected.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_ls_long_recursive_json(cli):
    cli.ok("put", "wb1:outputs/r/a.txt", stdin=b"a")
    cli.ok("put", "wb1:outputs/r/s/t/b.txt", stdin=b"bb")
    cli.ok("put", "wb1:logs/l", stdin=b"l")
    rows = json.loads(cli.text("ls", "-l", "-R", "--json", "wb1:outputs"))
    assert [(r["name"], r["path"], r["kind"], r["size"]) for r in rows] == [
        ("r/a.txt", "outputs/r/a.txt", "file", 1),
        ("r/s/t/b.txt", "outputs/r/s/t/b.txt", "file", 2),
    ]
    for row in rows:
        assert row["mtime_ms"] == uuid7_unix_ms(bytes.fromhex(row["artifact_revision_id"]))
        assert row["mtime"].endswith("Z") and row["generation"] == 1
        assert row["body_digest_uri"].startswith("sha256:")
    top = json.loads(cli.text("ls", "--json", "wb1:outputs"))
    assert top == [{"kind": "dir", "name": "r", "path": "outputs/r"}]
    assert json.loads(cli.text("ls", "--json", "wb1:scripts")) == []
    assert [w["workbench_id"] for w in json.loads(cli.text("ls", "--json"))] == ["wb1"]


def test_ls_pages_through_cursors_one_page_per_call(cli, monkeypatch):
    from nokvfs.workspace import listing

    for i in range(7):
        cli.ok("put", f"wb1:outputs/f{i}", stdin=b"%d" % i)
    monkeypatch.setattr(commands, "PAGE_LIMIT", 3)
    calls = []
    for name in ("list_dir", "list_recursive"):
        real = getattr(listing, name)

        def spy(*a, _real=real, _name=name, **kw):
            page = _real(*a, **kw)
            calls.append((_name, kw["cursor"] is not None, kw["limit"], len(page.children)))
            return page

        monkeypatch.setattr(listing, name, spy)
    assert cli.text("ls", "wb1:outputs").split() == [f"f{i}" for i in range(7)]
    assert calls == [("list_dir", False, 3, 3), ("list_dir", True, 3, 3), ("list_dir", True, 3, 1)]
    calls.clear()
    assert len(json.loads(cli.text("ls", "-R", "--json", "wb1:"))) == 7
    assert [c[:2] for c in calls] == [("list_recursive", False), ("list_recursive", True), ("list_recursive", True)]


def test_stat_file_shows_every_entry_field_with_hex_ids(cli):
    import dataclasses

    from nokvfs.schema.records import PathEntry

    cli.ok("put", "wb1:outputs/s.txt", stdin=b"stat me")
    info = cli.json("stat", "wb1:outputs/s.txt")
    for field in dataclasses.fields(PathEntry):
        assert field.name in info
    assert info["kind"] == "file" and info["size"] == 7 and info["generation"] == 1
    assert info["workbench"] == "wb1" and info["path"] == "outputs/s.txt"
    for key in ("artifact_revision_id", "manifest_id"):
        assert len(info[key]) == 32 and info[key] == info[key].lower()
        bytes.fromhex(info[key])
    assert info["body_digest_uri"].startswith("sha256:") and info["manifest_digest_uri"].startswith("sha256:")
    lines = dict(line.split(":", 1) for line in cli.text("stat", "wb1:outputs/s.txt").splitlines())
    assert lines["artifact_revision_id"].strip() == info["artifact_revision_id"]
    assert lines["kind"].strip() == "file" and lines["size"].strip() == "7"


def test_stat_directory_shows_kind_and_generation(cli):
    cli.ok("put", "wb1:outputs/d/f", stdin=b"1")
    for target in ("wb1:outputs/d", "wb1:outputs", "wb1:", "wb1"):
        info = cli.json("stat", target)
        assert info["kind"] == "dir" and isinstance(info["generation"], int)
        assert "artifact_revision_id" not in info


# --- rm, mv, append -------------------------------------------------------------------------


def test_rm_removes_a_file_with_an_optional_generation_check(cli):
    cli.ok("put", "wb1:outputs/x", stdin=b"1")
    cli.ok("put", "wb1:outputs/x", stdin=b"2")
    assert cli("rm", "--if-generation", "1", "wb1:outputs/x")[0] == 4
    assert cli.text("rm", "--if-generation", "2", "wb1:outputs/x").startswith("rm wb1:outputs/x generation=2 ")
    assert cli("get", "wb1:outputs/x")[0] == 3
    assert cli("rm", "wb1:outputs/x")[0] == 3


def test_rm_refuses_directories_and_sections(cli):
    cli.ok("put", "wb1:outputs/d/f", stdin=b"1")
    code, _, err = cli("rm", "wb1:outputs/d")
    assert code == 2 and err.startswith("nokvfs: is a directory: ")
    assert cli("rm", "wb1:outputs")[0] == 2


def test_mv_renames_inside_a_workbench(cli):
    cli.ok("put", "wb1:outputs/a", stdin=b"A")
    revision = cli.json("stat", "wb1:outputs/a")["artifact_revision_id"]
    assert cli.text("mv", "wb1:outputs/a", "wb1:outputs/b").startswith(
        "mv wb1:outputs/a -> wb1:outputs/b generation=1 "
    )
    assert cli("get", "wb1:outputs/a")[0] == 3
    assert cli.ok("get", "wb1:outputs/b") == b"A"
    assert cli.json("stat", "wb1:outputs/b")["artifact_revision_id"] == revision  # mtime kept
    cli.ok("mv", "wb1:outputs/b", "wb1:logs")  # an existing directory: into it
    cli.ok("mv", "wb1:logs/b", "wb1:logs/new/")  # a trailing '/': into it
    assert cli.text("ls", "-R", "wb1:") == "logs/new/b\n"


def test_mv_no_replace_conflicts_and_replace_overwrites(cli):
    cli.ok("put", "wb1:outputs/a", stdin=b"A")
    cli.ok("put", "wb1:outputs/b", stdin=b"B")
    code, _, err = cli("mv", "--no-replace", "wb1:outputs/a", "wb1:outputs/b")
    assert code == 4 and "conflict" in err
    moved = cli.json("mv", "wb1:outputs/a", "wb1:outputs/b")
    assert moved["generation"] == 2 and moved["source"] == "outputs/a"
    assert cli.ok("get", "wb1:outputs/b") == b"A"


def test_mv_errors(cli):
    cli.ok("workbench", "create", "wb2")
    cli.ok("put", "wb1:outputs/a", stdin=b"A")
    code, _, err = cli("mv", "wb1:outputs/a", "wb2:outputs/a")
    assert code == 2 and err.startswith("nokvfs: usage: ") and "one workbench" in err
    assert cli("mv", "wb1:outputs/missing", "wb1:outputs/z")[0] == 3
    cli.ok("put", "wb1:outputs/d/f", stdin=b"1")
    assert cli("mv", "wb1:outputs/d", "wb1:outputs/e")[0] == 2


def test_append_from_a_file_and_stdin(cli, tmp_path):
    cli.ok("put", "wb1:logs/run.log", stdin=b"line 1\n")
    src = write(tmp_path / "more", b"line 2\n")
    assert "generation=2" in cli.text("append", "wb1:logs/run.log", src)
    assert "generation=3" in cli.text("append", "wb1:logs/run.log", stdin=b"line 3\n")
    assert "generation=4" in cli.text("append", "--if-generation", "3", "wb1:logs/run.log", "-", stdin=b"line 4\n")
    assert cli("append", "--if-generation", "3", "wb1:logs/run.log", stdin=b"lost\n")[0] == 4
    assert cli.ok("get", "wb1:logs/run.log") == b"line 1\nline 2\nline 3\nline 4\n"
    info = cli.json("stat", "wb1:logs/run.log")
    assert info["size"] == 28 and info["dependency_count"] >= 1
    assert not os.listdir(os.path.join(cli.data_dir, "spool"))  # the stdin spools are gone


def test_append_to_a_missing_path_is_not_found(cli):
    code, _, err = cli("append", "wb1:logs/none", stdin=b"x")
    assert code == 3 and err.startswith("nokvfs: not found: ")


# --- exit codes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["get", "wb1:outputs/../x"],
        ["get", "wb1:outputs//x"],
        ["get", "wb1:/outputs/x"],
        ["put", "wb1:outputs/../x", "-"],
        ["put", "wb1:outputs//x", "-"],
        ["put", "wb1:x", "-"],
        ["put", "wb1:outputs", "-"],
        ["stat", "wb1:outputs/./x"],
        ["rm", "wb1:outputs//x"],
        ["ls", "wb1:outputs//x"],
        ["get", "wb1"],
        ["get", "Bad!wb:outputs/x"],
    ],
)
def test_bad_paths_exit_2(cli, argv):
    code, out, err = cli(*argv, stdin=b"data")
    assert code == 2, err
    assert out == b""
    assert err.startswith("nokvfs: ") and "Traceback" not in err


@pytest.mark.parametrize("path", ["metadata/run_manifest.json", "metadata/restore_manifest.json"])
def test_reserved_manifest_paths_exit_2(cli, path):
    code, _, err = cli("put", f"wb1:{path}", stdin=b"{}")
    assert code == 2 and err.startswith("nokvfs: reserved path: ")
    assert cli("rm", f"wb1:{path}")[0] == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["get", "wb1:outputs/missing"],
        ["stat", "wb1:outputs/missing"],
        ["ls", "wb1:outputs/missing"],
        ["rm", "wb1:outputs/missing"],
        ["ls", "nowb"],
        ["get", "nowb:outputs/x"],
        ["put", "nowb:outputs/x", "-"],
    ],
)
def test_missing_exits_3(cli, argv):
    code, out, err = cli(*argv, stdin=b"x")
    assert (code, out) == (3, b"")
    assert err.startswith("nokvfs: not found: ")


def test_if_absent_on_an_existing_path_exits_4(cli):
    cli.ok("put", "wb1:outputs/x", stdin=b"1")
    assert cli("put", "--if-absent", "wb1:outputs/x", stdin=b"2")[0] == 4
    assert cli.ok("get", "wb1:outputs/x") == b"1"


@pytest.mark.damages_store("corrupts a block")
def test_a_corrupted_block_exits_5_and_prints_nothing(cli, tmp_path):
    cli.ok("put", "wb1:outputs/c.bin", stdin=b"precious bytes" * 100)
    revision = cli.json("stat", "wb1:outputs/c.bin")["artifact_revision_id"]
    (block,) = block_files(cli.data_dir, revision)
    with open(block, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0x01]))
    code, out, err = cli("get", "wb1:outputs/c.bin")
    assert (code, out) == (5, b"")
    assert err.startswith("nokvfs: integrity error: ") and "Traceback" not in err
    dest = tmp_path / "never"
    assert cli("get", "wb1:outputs/c.bin", str(dest))[0] == 5
    assert not dest.exists() and not [n for n in os.listdir(tmp_path) if "nokvfs-tmp" in n]


@pytest.mark.damages_store("deletes a block")
def test_a_missing_block_exits_6(cli):
    cli.ok("put", "wb1:outputs/m.bin", stdin=b"m" * 10)
    revision = cli.json("stat", "wb1:outputs/m.bin")["artifact_revision_id"]
    os.unlink(block_files(cli.data_dir, revision)[0])
    code, out, err = cli("get", "wb1:outputs/m.bin")
    assert (code, out) == (6, b"")
    assert err.startswith("nokvfs: object missing: ")


def test_a_moved_placement_fences_writes_with_exit_7(cli):
    from nokvfs.engine.placement import PlacementStore
    from nokvfs.schema.enums import RootPlacementLifecycle
    from nokvfs.workspace import datadir

    root_id = bytes.fromhex(datadir.read_config(cli.data_dir)["root_id"])
    placements = PlacementStore(os.path.join(cli.data_dir, "control"))
    try:
        current = placements.get(root_id)
        placements.transition(
            root_id, RootPlacementLifecycle.Draining, expected_generation=current.placement_generation
        )
    finally:
        placements.close()
    code, _, err = cli("put", "wb1:outputs/x", stdin=b"x")
    assert code == 7 and err.startswith("nokvfs: fence error: ")
    # Reads pass the same fence (seed: "every request still passes the active RootFence and
    # owner-epoch fence"): served by no command while this process's placement is not the fence's.
    for command in (("ls", "wb1:"), ("stat", "wb1:outputs"), ("get", "wb1:outputs/x")):
        code, out, err = cli(*command)
        assert (code, out) == (7, b"") and err.startswith("nokvfs: fence error: "), command


def _all_error_classes():
    return [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.NokvError)]


EXPECTED_CODES = {
    2: (errors.InvalidInput, errors.CommandTooLarge),
    3: (errors.NotFound, errors.HistoryNotRetained),
    4: (errors.AlreadyExists, errors.PredicateFailed, errors.RequestMismatch, errors.ReadVersionStale),
    5: (errors.IntegrityError, errors.FormatError),
    6: (errors.StoreError,),
    7: (errors.FenceError,),
}


@pytest.mark.parametrize("cls", _all_error_classes(), ids=lambda c: c.__name__)
def test_every_error_class_has_its_exit_code(cls):
    expected = next((code for code, bases in EXPECTED_CODES.items() if issubclass(cls, bases)), 1)
    assert cli_main.exit_code(cls.__new__(cls)) == expected


def test_exit_code_table_specifics():
    assert cli_main.exit_code(errors.PathInvalid("x")) == 2
    assert cli_main.exit_code(errors.ReservedPath("x")) == 2
    assert cli_main.exit_code(errors.NotADirectory("x")) == 2
    assert cli_main.exit_code(errors.IsADirectory("x")) == 2
    assert cli_main.exit_code(errors.GenerationConflict("x")) == 4
    assert cli_main.exit_code(errors.ReadVersionStale("x", expected=1, current=2)) == 4
    assert cli_main.exit_code(errors.SchemaMismatch("x")) == 5
    assert cli_main.exit_code(errors.OutboxCorrupt("x")) == 5
    assert cli_main.exit_code(errors.OwnerFenced("x")) == 7
    assert cli_main.exit_code(FileNotFoundError(2, "No such file")) == 6
    assert cli_main.exit_code(UsageError("x")) == 2
    assert cli_main.exit_code(RuntimeError("bug")) == 1
    assert cli_main.error_kind(errors.IsADirectory("x")) == "is a directory"
    assert cli_main.error_kind(errors.GenerationConflict("x")) == "generation conflict"


def test_an_unexpected_exception_exits_1_and_debug_shows_the_traceback(cli, monkeypatch):
    from nokvfs.workspace import workbench

    def boom(view, root_id):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(workbench, "list_visible", boom)
    code, _, err = cli("workbench", "list")
    assert code == 1 and "Traceback" not in err
    assert err.startswith("nokvfs: internal error: RuntimeError: kaboom")
    code, _, err = cli("workbench", "list", "--debug")
    assert code == 1 and "Traceback (most recent call last)" in err and "kaboom" in err
    code, _, err = cli("--debug", "get", "wb1:outputs/none")
    assert code == 3 and "Traceback" in err and err.rstrip().endswith("does not exist")


def test_usage_errors_exit_2_with_the_one_message_format(cli):
    code, _, err = cli()
    assert code == 2 and "nokvfs: usage: " in err
    code, _, err = cli("frobnicate")
    assert code == 2 and "nokvfs: usage: " in err and "invalid choice" in err
    code, _, err = cli("ls", "--no-such-option")
    assert code == 2 and err.splitlines()[-1].startswith("nokvfs: usage: ")
    assert cli("rm", "--if-generation", "-1", "wb1:outputs/x")[0] == 2
    code, out, _ = cli("--help")
    assert code == 0 and b"usage: nokvfs" in out


def test_parse_size():
    assert parse_size("65536") == 65536
    assert parse_size("64K") == parse_size("64KiB") == parse_size("64kb") == 65536
    assert parse_size("4MiB") == 4 * MiB and parse_size("1G") == 1 << 30
    with pytest.raises(UsageError):
        parse_size("4.5M")


# --- command modules ------------------------------------------------------------------------


def test_a_missing_command_module_is_skipped(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ["nokvfs.cli.commands", "nokvfs.cli.no_such_module"])
    assert main(["--data-dir", str(tmp_path / "d"), "init"]) == 0


def test_load_command_modules_raises_for_a_missing_dependency(monkeypatch, tmp_path):
    (tmp_path / "nokvfs_test_needs_dep.py").write_text("import nokvfs_test_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        cli_main.load_command_modules(["nokvfs_test_needs_dep"])
    assert info.value.name == "nokvfs_test_absent_dependency"
    assert cli_main.load_command_modules(["nokvfs_test_not_there"]) == []


def test_a_command_module_registers_its_own_commands(monkeypatch, tmp_path, capsys):
    (tmp_path / "nokvfs_test_extra.py").write_text(
        "def register(subparsers):\n"
        "    p = subparsers.add_parser('hello')\n"
        "    p.add_argument('who')\n"
        "    p.set_defaults(func=lambda args: print('hello', args.who, args.data_dir) or 9)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ["nokvfs.cli.commands", "nokvfs_test_extra"])
    assert main(["--data-dir", "/d", "hello", "world"]) == 9
    assert capsys.readouterr().out == "hello world /d\n"


# --- a real process -------------------------------------------------------------------------


def _run(data_dir, *argv, stdin: bytes = b""):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", data_dir, *argv],
        check=False,
        input=stdin,
        capture_output=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def test_the_module_runs_as_a_real_process(tmp_path):
    data_dir = str(tmp_path / "data")
    assert _run(data_dir, "init").returncode == 0
    assert _run(data_dir, "workbench", "create", "wb").returncode == 0
    body = os.urandom(300_000)
    put = _run(data_dir, "put", "wb:outputs/p.bin", stdin=body)
    assert put.returncode == 0 and put.stdout.startswith(b"put wb:outputs/p.bin generation=1 ")
    got = _run(data_dir, "get", "wb:outputs/p.bin")
    assert got.returncode == 0 and got.stdout == body
    listed = json.loads(_run(data_dir, "ls", "-l", "-R", "--json", "wb:").stdout)
    assert [(r["path"], r["size"]) for r in listed] == [("outputs/p.bin", len(body))]
    missing = _run(data_dir, "get", "wb:outputs/none")
    assert missing.returncode == 3 and missing.stdout == b""
    assert missing.stderr.decode() == "nokvfs: not found: wb:outputs/none does not exist\n"
    bad = _run(data_dir, "put", "wb:outputs/../x", stdin=b"x")
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr


def test_a_closed_stdout_pipe_is_quiet(tmp_path):
    data_dir = str(tmp_path / "data")
    _run(data_dir, "init")
    _run(data_dir, "workbench", "create", "wb")
    _run(data_dir, "put", "wb:outputs/big", stdin=b"z" * (8 * MiB))
    env = dict(os.environ, PYTHONPATH=REPO)
    shell = (
        f"{sys.executable} -m nokvfs.cli.main --data-dir {data_dir} get wb:outputs/big | head -c 5; "
        "exit ${PIPESTATUS[0]}"
    )
    done = subprocess.run(["bash", "-c", shell], check=False, capture_output=True, cwd=REPO, env=env, timeout=120)
    assert done.stdout == b"zzzzz"
    assert done.returncode == 141 and done.stderr == b""


def test_spool_list_names_what_a_dead_daemon_left_kept_or_left(cli):
    """Before the next mount adopts them: a spool whose daemon ended and whose sidecar still says
    `live` is listed as kept (nobody holds it), one that holds nothing to keep as left."""
    from nokvfs.fs import spools

    directory = spools._made(spools.spool_dir(cli.data_dir))  # private, as a daemon makes it
    for ident, record in (
        ("wb--f--01", {"state": "live", "dirty": True, "path": "outputs/f"}),
        ("wb--g--02", {"state": "orphaned", "dirty": True, "path": "outputs/g"}),
    ):
        path = os.path.join(directory, ident + ".spool")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        spools._atomic_json(path + ".json", {"format": 1, "workbench": "wb", **record})
    listed = {line.split()[0]: line.split()[1] for line in cli.text("spool", "list").splitlines()}
    assert listed == {"wb--f--01": "kept", "wb--g--02": "left"}
