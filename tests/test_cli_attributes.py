"""Modes, times, owners and links through the command line: put keeps them (like cp -p), get
restores them, stat and ls show them, chmod/setattr change them alone, and snapshots, commits,
tags and restore carry them."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.test_cli import Cli, data, write  # noqa: F401 - the data fixture

MTIME = 1_234_567_890_123_456_789  # 2009, with nanoseconds
ATIME = 1_300_000_000_000_000_000
OLD_DIR = 1_000_000_000_000_000_000


@pytest.fixture
def cli(data, capsysbinary):
    return Cli(data, capsysbinary)


def object_files(data_dir: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(os.path.join(data_dir, "objects")):
        out += [os.path.join(dirpath, n) for n in names]
    return sorted(out)


def make_tree(top) -> dict:
    """A small tree with a script, a private file, an empty directory, a private directory and
    links; returns what it made (relative path -> (mode, mtime_ns)) for files and directories."""
    write(top / "run.sh", b"#!/bin/sh\necho executed\n")
    write(top / "data" / "secret.csv", b"a,b\n")
    write(top / "data" / "deep" / "x.txt", b"x")
    os.makedirs(top / "empty")
    os.symlink("data/secret.csv", top / "latest")
    os.symlink("/etc/hostname", top / "outside")
    os.symlink("data", top / "data-link")
    modes = {
        "run.sh": 0o755,
        "data/secret.csv": 0o600,
        "data/deep/x.txt": 0o644,
        "data/deep": 0o750,
        "data": 0o700,
        "empty": 0o1777,
    }
    for rel, mode in modes.items():
        os.chmod(top / rel, mode)
    for i, rel in enumerate(["run.sh", "data/secret.csv", "data/deep/x.txt", "data/deep", "empty", "data"]):
        os.utime(top / rel, ns=(ATIME, MTIME - i * 1_000_000_007))
    os.utime(top, ns=(ATIME, OLD_DIR))
    return {rel: (os.stat(top / rel).st_mode & 0o7777, os.stat(top / rel).st_mtime_ns) for rel in modes}


def local_state(top) -> dict:
    """relative path -> (kind, mode, mtime_ns, link target) of everything below top."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, top)
            if os.path.islink(path):
                out[rel] = ("link", None, st.st_mtime_ns, os.readlink(path))
            else:
                out[rel] = ("dir" if os.path.isdir(path) else "file", st.st_mode & 0o7777, st.st_mtime_ns, None)
    return out


# --- put, stat, get -----------------------------------------------------------------------------


def test_a_script_put_then_got_stays_executable_with_its_mtime(cli, tmp_path):
    script = write(tmp_path / "run.sh", b"#!/bin/sh\necho from-nokvfs\n")
    os.chmod(script, 0o755)
    os.utime(script, ns=(ATIME, MTIME))
    cli.ok("put", "wb1:scripts/run.sh", script)
    info = cli.json("stat", "wb1:scripts/run.sh")
    assert (info["mode"], info["mode_text"], info["mtime_ns"], info["atime_ns"]) == (0o755, "-rwxr-xr-x", MTIME, ATIME)
    assert info["attributes_stored"] is True and info["uid"] is None and info["kind"] == "file"
    assert info["typed_index_projection"] == []  # the reserved field shows as the attribute keys
    text = cli.text("stat", "wb1:scripts/run.sh")
    assert "mode_text:" in text and "-rwxr-xr-x" in text
    back = tmp_path / "back.sh"
    cli.ok("get", "wb1:scripts/run.sh", str(back))
    st = os.stat(back)
    assert (st.st_mode & 0o7777, st.st_mtime_ns, st.st_atime_ns) == (0o755, MTIME, ATIME)
    assert subprocess.run([str(back)], capture_output=True, check=True).stdout == b"from-nokvfs\n"
    line = cli.text("ls", "-l", "wb1:scripts").split()
    assert line[0] == "-rwxr-xr-x" and line[4] == "2009-02-13T23:31:30Z" and line[5] == "run.sh"


def test_no_preserve_stores_nothing_and_get_keeps_the_destination_mode(cli, tmp_path):
    script = write(tmp_path / "run.sh", b"#!/bin/sh\n")
    os.chmod(script, 0o755)
    cli.ok("put", "--no-preserve", "wb1:scripts/run.sh", script)
    info = cli.json("stat", "wb1:scripts/run.sh")
    assert info["attributes_stored"] is False and info["mode"] == 0o644
    cli.ok("put", "wb1:scripts/kept.sh", script)
    existing = write(tmp_path / "dest", b"old")
    os.chmod(existing, 0o600)
    cli.ok("get", "wb1:scripts/run.sh", existing)
    assert os.stat(existing).st_mode & 0o7777 == 0o600  # nothing stored: the destination's mode
    cli.ok("get", "--no-preserve", "wb1:scripts/kept.sh", existing)
    assert os.stat(existing).st_mode & 0o7777 == 0o600
    cli.ok("get", "wb1:scripts/kept.sh", existing)
    assert os.stat(existing).st_mode & 0o7777 == 0o755


def test_a_put_from_stdin_over_an_executable_keeps_it_executable(cli, tmp_path):
    script = write(tmp_path / "run.sh", b"#!/bin/sh\necho one\n")
    os.chmod(script, 0o750)
    os.utime(script, ns=(ATIME, MTIME))
    cli.ok("put", "wb1:scripts/run.sh", script)
    cli.ok("put", "wb1:scripts/run.sh", stdin=b"#!/bin/sh\necho two\n")
    info = cli.json("stat", "wb1:scripts/run.sh")
    assert info["mode"] == 0o750 and info["mtime_ns"] > MTIME and info["generation"] == 2
    cli.ok("put", "--no-preserve", "wb1:scripts/run.sh", stdin=b"three")
    assert cli.json("stat", "wb1:scripts/run.sh")["attributes_stored"] is False
    cli.ok("put", "wb1:outputs/new", stdin=b"x")
    assert cli.json("stat", "wb1:outputs/new")["attributes_stored"] is False


def test_owner_is_stored_only_when_asked_and_restored_only_when_asked(cli, tmp_path):
    src = write(tmp_path / "f", b"owned")
    os.chown(src, 4321, 8765)
    cli.ok("put", "wb1:outputs/plain", src)
    cli.ok("put", "--owner", "wb1:outputs/owned", src)
    assert cli.json("stat", "wb1:outputs/plain")["uid"] is None
    owned = cli.json("stat", "wb1:outputs/owned")
    assert (owned["uid"], owned["gid"]) == (4321, 8765)
    assert cli.text("ls", "-l", "wb1:outputs/owned").split()[1] == "4321:8765"
    cli.ok("get", "wb1:outputs/owned", str(tmp_path / "a"))
    assert os.stat(tmp_path / "a").st_uid == os.geteuid()
    if os.geteuid() == 0:
        cli.ok("get", "--owner", "wb1:outputs/owned", str(tmp_path / "b"))
        assert (os.stat(tmp_path / "b").st_uid, os.stat(tmp_path / "b").st_gid) == (4321, 8765)


def test_a_tree_round_trips_modes_times_empty_directories_and_links(cli, tmp_path):
    made = make_tree(tmp_path / "src")
    cli.ok("put", "-l", "wb1:outputs/t", str(tmp_path / "src"))
    cli.ok("get", "-r", "-l", "wb1:outputs/t", str(tmp_path / "back"))
    want, got = local_state(tmp_path / "src"), local_state(tmp_path / "back")
    assert got == want
    for rel, (mode, mtime) in made.items():
        assert got[rel][1:3] == (mode, mtime), rel
    assert os.stat(tmp_path / "back").st_mtime_ns == OLD_DIR  # the top directory's own times
    assert got["latest"] == ("link", None, os.lstat(tmp_path / "src" / "latest").st_mtime_ns, "data/secret.csv")
    # The markers that carry directory attributes never show in a listing.
    listed = (
        cli.text("ls", "-R", "wb1:outputs") + cli.text("ls", "wb1:outputs/t") + cli.text("ls", "wb1:outputs/t/empty")
    )
    assert ".nokvfs-directory" not in listed
    assert "empty/" in cli.text("ls", "wb1:outputs/t")
    long = dict(
        line.rsplit(" ", 1)[::-1] for line in cli.text("ls", "-l", "wb1:outputs/t").splitlines() if " -> " not in line
    )
    assert long["empty/"].split()[0] == "drwxrwxrwt" and long["data/"].split()[0] == "drwx------"
    assert "latest -> data/secret.csv" in cli.text("ls", "-l", "wb1:outputs/t")


def test_a_second_get_into_the_same_directory_changes_nothing(cli, tmp_path):
    make_tree(tmp_path / "src")
    cli.ok("put", "-l", "wb1:outputs/t", str(tmp_path / "src"))
    cli.ok("get", "-r", "-l", "wb1:outputs/t", str(tmp_path / "back"))
    first = local_state(tmp_path / "back")
    cli.ok("get", "-r", "-l", "wb1:outputs/t", str(tmp_path / "back"))
    assert local_state(tmp_path / "back") == first


def test_get_r_writes_nothing_through_a_symlink_below_dest(cli, tmp_path):
    cli.ok("put", "wb1:outputs/t/sub/f", stdin=b"f")
    dest = tmp_path / "dest"
    os.makedirs(dest)
    os.makedirs(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", dest / "sub")
    code, _, err = cli("get", "-r", "wb1:outputs/t", str(dest))
    assert code == 2 and "symbolic link" in err
    assert os.listdir(tmp_path / "elsewhere") == []


# --- links ----------------------------------------------------------------------------------------


def test_put_without_links_never_reads_outside_the_tree(cli, tmp_path):
    secret = write(tmp_path / "secret", b"not for the workbench")
    write(tmp_path / "src" / "data.txt", b"inside")
    os.symlink("data.txt", tmp_path / "src" / "alias.txt")
    os.symlink(secret, tmp_path / "src" / "leak")
    os.symlink("/nonexistent/target", tmp_path / "src" / "dangling")
    os.makedirs(tmp_path / "src" / "d")
    os.symlink(tmp_path, tmp_path / "src" / "d" / "loop")
    code, _, err = cli("put", "wb1:outputs/t", str(tmp_path / "src"))
    assert code == 0
    assert "points outside" in err and "dangling" in err and "not followed" in err
    assert cli.text("ls", "-R", "wb1:outputs/t") == "alias.txt\ndata.txt\n"
    assert cli.ok("get", "wb1:outputs/t/alias.txt") == b"inside"  # a link inside the tree: by content
    # -L copies what links to files point at, wherever; directories are still not followed.
    cli.ok("put", "-L", "wb1:outputs/copied", str(tmp_path / "src"))
    assert cli.ok("get", "wb1:outputs/copied/leak") == b"not for the workbench"
    assert "loop" not in cli.text("ls", "-R", "wb1:outputs/copied")
    # -l stores every link as a link, reading nothing it points to.
    cli.ok("put", "-l", "wb1:outputs/links", str(tmp_path / "src"))
    rows = {r["name"]: r for r in cli.json("ls", "wb1:outputs/links")}
    assert rows["leak"]["kind"] == "link" and rows["leak"]["link_target"] == secret
    assert rows["dangling"]["link_target"] == "/nonexistent/target"
    assert cli.text("readlink", "wb1:outputs/links/d/loop").strip() == str(tmp_path)


def test_a_link_is_refused_by_get_unless_asked(cli, tmp_path):
    cli.ok("ln", "-s", "../data/x.csv", "wb1:outputs/latest")
    code, _, err = cli("get", "wb1:outputs/latest")
    assert code == 2 and "symbolic link to '../data/x.csv'" in err
    assert cli("get", "-l", "wb1:outputs/latest")[0] == 2  # not to stdout
    cli.ok("get", "-l", "wb1:outputs/latest", str(tmp_path / "l"))
    assert os.readlink(tmp_path / "l") == "../data/x.csv"
    cli.ok("put", "wb1:outputs/run/file", stdin=b"f")
    code, _, err = cli("get", "-r", "wb1:outputs", str(tmp_path / "tree"))
    assert code == 0 and "skipping the symbolic link 'latest'" in err
    assert sorted(os.listdir(tmp_path / "tree")) == ["run"]


def test_ln(cli):
    assert "ln wb1:outputs/l " in cli.text("ln", "-s", "target one", "wb1:outputs/l")
    assert cli.text("readlink", "wb1:outputs/l") == "target one\n"
    code, _, err = cli("ln", "-s", "other", "wb1:outputs/l")
    assert code == 4
    cli.ok("ln", "-s", "-f", "other", "wb1:outputs/l")
    assert cli.text("readlink", "wb1:outputs/l") == "other\n"
    code, _, err = cli("ln", "target", "wb1:outputs/hard")
    assert code == 2 and "hard links" in err
    cli.ok("put", "wb1:outputs/dir/f", stdin=b"f")
    cli.ok("ln", "-s", "/opt/tool/bin/python3", "wb1:outputs/dir")  # into a directory, as ln does
    assert cli.text("readlink", "wb1:outputs/dir/python3") == "/opt/tool/bin/python3\n"
    assert cli("ln", "-s", "x" * 4096, "wb1:outputs/long")[0] == 2
    assert cli("readlink", "wb1:outputs/dir/f")[0] == 2
    assert cli.json("stat", "wb1:outputs/l")["link_target"] == "other"


# --- metadata-only changes --------------------------------------------------------------------------


def test_chmod_and_setattr_upload_nothing_and_keep_the_revision(cli, tmp_path):
    cli.ok("put", "wb1:scripts/run.sh", write(tmp_path / "run.sh", b"#!/bin/sh\n"))
    before = cli.json("stat", "wb1:scripts/run.sh")
    objects = object_files(cli.data_dir)
    cli.ok("chmod", "750", "wb1:scripts/run.sh")
    cli.ok("setattr", "wb1:scripts/run.sh", "--mtime", "2001-02-03T04:05:06.5Z", "--uid", "7")
    after = cli.json("stat", "wb1:scripts/run.sh")
    assert object_files(cli.data_dir) == objects
    for key in ("artifact_revision_id", "generation", "body_digest_uri", "size"):
        assert after[key] == before[key], key
    assert (after["mode"], after["uid"], after["mtime"]) == (0o750, 7, "2001-02-03T04:05:06.500Z")
    cli.ok("setattr", "wb1:scripts/run.sh", "--atime", "@-1.25")
    assert cli.json("stat", "wb1:scripts/run.sh")["atime_ns"] == -1_250_000_000
    # A directory: the first change creates its (hidden) marker, the next ones change it.
    cli.ok("chmod", "700", "wb1:scripts")
    assert cli.json("stat", "wb1:scripts")["mode_text"] == "drwx------"
    assert cli.text("ls", "wb1:scripts") == "run.sh\n"
    assert cli("chmod", "9", "wb1:scripts/run.sh")[0] == 2
    assert cli("chmod", "u+x", "wb1:scripts/run.sh")[0] == 2
    assert cli("setattr", "wb1:scripts/run.sh")[0] == 2
    assert cli("chmod", "700", "wb1:scripts/missing")[0] == 3


def test_the_marker_and_reserved_fields_are_not_for_users(cli, tmp_path):
    code, _, err = cli("put", "wb1:outputs/d/.nokvfs-directory", stdin=b"")
    assert code == 2 and "reserved" in err
    assert cli("put", "wb1:outputs/x", "--index", "nokvfs:posix=1", stdin=b"x")[0] == 2
    assert cli("put", "wb1:outputs/x", "--content-type", "inode/symlink", stdin=b"x")[0] == 2
    cli.ok("put", "wb1:outputs/x", write(tmp_path / "x", b"x"), "--index", "kind=csv")
    assert cli("search", "wb1", "nokvfs:posix=1")[0] == 2
    assert [h["path"] for h in cli.json("search", "wb1", "kind=csv")] == ["outputs/x"]


# --- history ------------------------------------------------------------------------------------------


def _listing(cli, ref=None) -> str:
    if ref is None:
        return cli.text("ls", "-l", "-R", "wb1:outputs") + cli.text("ls", "-l", "wb1:outputs/t")
    return cli.text("as-of", ref, "ls", "-l", "-R", "outputs") + cli.text("as-of", ref, "ls", "-l", "outputs/t")


@pytest.mark.parametrize("kind", ["snapshot", "commit", "tag"])
def test_as_of_views_show_the_modes_times_and_links_of_then(cli, tmp_path, kind):
    make_tree(tmp_path / "src")
    cli.ok("put", "-l", "wb1:outputs/t", str(tmp_path / "src"))
    then = _listing(cli)
    if kind == "snapshot":
        cli.ok("snapshot", "mint", "wb1", "--alias", "then")
        ref = "wb1@snapshot:then"
    else:
        made = cli.json("commit", "wb1")
        cli.ok("tag", "set", "wb1", "v1", made["commit_id"])
        ref = "wb1@tag:v1" if kind == "tag" else f"wb1@commit:{made['commit_id'][:12]}"
    cli.ok("chmod", "644", "wb1:outputs/t/run.sh")
    cli.ok("chmod", "755", "wb1:outputs/t/data")
    cli.ok("ln", "-s", "-f", "elsewhere", "wb1:outputs/t/latest")
    assert _listing(cli) != then
    assert _listing(cli, ref) == then
    assert cli.json("as-of", ref, "stat", "outputs/t/latest")["link_target"] == "data/secret.csv"
    assert cli.json("as-of", ref, "stat", "outputs/t/data")["mode"] == 0o700
    assert ".nokvfs-directory" not in cli.text("as-of", ref, "ls", "-R")
    cli.ok("as-of", ref, "get", "-r", "-l", "outputs/t", str(tmp_path / "then"))
    assert local_state(tmp_path / "then") == local_state(tmp_path / "src")


@pytest.mark.parametrize("source", ["snapshot", "commit"])
def test_a_restored_workbench_shows_the_same_modes_times_and_links(cli, tmp_path, source):
    make_tree(tmp_path / "src")
    cli.ok("put", "-l", "wb1:outputs/t", str(tmp_path / "src"))
    if source == "snapshot":
        cli.ok("snapshot", "mint", "wb1", "--alias", "s")
        selector = "snapshot:s"
    else:
        selector = "commit:" + cli.json("commit", "wb1")["commit_id"][:12]
    before = _listing(cli)
    cli.ok("chmod", "600", "wb1:outputs/t/run.sh")
    cli.ok("restore", "wb1", "--from", selector, "--to", "copy")
    restored = cli.text("ls", "-l", "-R", "copy:outputs") + cli.text("ls", "-l", "copy:outputs/t")
    assert restored == before
    cli.ok("get", "-r", "-l", "copy:outputs/t", str(tmp_path / "back"))
    assert local_state(tmp_path / "back") == local_state(tmp_path / "src")
