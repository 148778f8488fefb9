"""rename(2) of a directory through the mount, with the tools that do it (`mv`, Python's
os.rename of a staging directory): the subtree moves in one command, files still being written
inside it publish at their new paths, other processes see all of it move or none, and a tree too
big for one command is EXDEV, on which `mv` copies it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from tests.mount_fixtures import REPO, env, fsck_clean, mount, mounted, needs_fuse, populate_many  # noqa: F401

pytestmark = needs_fuse


def cli(m, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, *argv],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=120,
    )


def test_mv_of_a_directory_moves_everything_below_it_at_once(mount):
    outputs = mount.path("wb", "outputs")
    staging = os.path.join(outputs, "staging")
    os.makedirs(os.path.join(staging, "sub", "empty"))
    for name, body in (("a.txt", "alpha\n"), ("sub/b.txt", "beta\n")):
        with open(os.path.join(staging, name), "w") as f:
            f.write(body)
    os.symlink("a.txt", os.path.join(staging, "link"))
    os.chmod(os.path.join(staging, "sub"), 0o750)
    writing = open(os.path.join(staging, "sub", "open.log"), "w")  # still being written
    writing.write("first line\n")
    writing.flush()
    inode = os.stat(os.path.join(staging, "a.txt")).st_ino
    done = subprocess.run(["mv", staging, os.path.join(outputs, "final")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    writing.write("second line\n")
    writing.close()  # publishes at the path it has now
    final = os.path.join(outputs, "final")
    assert not os.path.exists(staging)
    assert sorted(os.listdir(final)) == ["a.txt", "link", "sub"]
    assert sorted(os.listdir(os.path.join(final, "sub"))) == ["b.txt", "empty", "open.log"]
    assert os.stat(os.path.join(final, "a.txt")).st_ino == inode  # the same file, not a copy
    assert os.readlink(os.path.join(final, "link")) == "a.txt"
    assert os.stat(os.path.join(final, "sub")).st_mode & 0o777 == 0o750
    with open(os.path.join(final, "sub", "open.log")) as f:
        assert f.read() == "first line\nsecond line\n"
    listed = cli(mount, "ls", "-R", "wb:outputs")  # another process sees only the new paths
    assert listed.returncode == 0 and sorted(listed.stdout.split()) == [
        "final/a.txt",
        "final/link",
        "final/sub/b.txt",
        "final/sub/open.log",
    ]
    fsck_clean(mount.data_dir)


def test_a_staging_directory_renamed_over_an_empty_one_and_not_over_a_full_one(mount):
    outputs = mount.path("wb", "outputs")
    for name in ("build.tmp", "other.tmp"):
        os.makedirs(os.path.join(outputs, name))
        with open(os.path.join(outputs, name, "result.json"), "w") as f:
            f.write(f'{{"from": "{name}"}}')
    os.mkdir(os.path.join(outputs, "build"))
    os.chmod(os.path.join(outputs, "build"), 0o700)  # an empty directory with stored attributes
    os.rename(os.path.join(outputs, "build.tmp"), os.path.join(outputs, "build"))  # the atomic-install idiom
    with open(os.path.join(outputs, "build", "result.json")) as f:
        assert f.read() == '{"from": "build.tmp"}'
    with pytest.raises(OSError) as refused:
        os.rename(os.path.join(outputs, "other.tmp"), os.path.join(outputs, "build"))
    assert refused.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as into_itself:
        os.rename(os.path.join(outputs, "build"), os.path.join(outputs, "build", "inner"))
    assert into_itself.value.errno == errno.EINVAL


def test_a_renamed_tree_survives_a_remount(tmp_path):
    with mounted(str(tmp_path)) as m:
        tree = m.path("wb", "input", "dataset")
        os.makedirs(os.path.join(tree, "part"))
        for index in range(30):
            with open(os.path.join(tree, "part", f"{index}.csv"), "w") as f:
                f.write(f"{index}\n")
        os.rename(tree, m.path("wb", "input", "dataset-v2"))
    with mounted(str(tmp_path), init=False) as m:
        assert not os.path.exists(m.path("wb", "input", "dataset"))
        part = m.path("wb", "input", "dataset-v2", "part")
        assert sorted(os.listdir(part), key=lambda n: int(n.split(".")[0])) == [f"{i}.csv" for i in range(30)]
        with open(os.path.join(part, "29.csv")) as f:
            assert f.read() == "29\n"


@pytest.mark.long
def test_a_tree_bigger_than_one_command_is_exdev_and_mv_copies_it(tmp_path):
    from nokvfs.workspace import datadir
    from tests.mount_fixtures import init_data_dir

    data_dir = str(tmp_path / "data")
    init_data_dir(data_dir)
    root = datadir.open_root(data_dir, verify=False)
    try:
        populate_many(root, "wb", "outputs/big", 1001)
    finally:
        root.close()  # closes its block cache too
    with mounted(str(tmp_path), init=False) as m:
        big = m.path("wb", "outputs", "big")
        with pytest.raises(OSError) as refused:
            os.rename(big, m.path("wb", "outputs", "moved"))
        assert refused.value.errno == errno.EXDEV
        assert len(os.listdir(big)) == 1001  # nothing moved
        done = subprocess.run(
            ["mv", big, m.path("wb", "outputs", "moved")], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        assert not os.path.exists(big) and len(os.listdir(m.path("wb", "outputs", "moved"))) == 1001


DIR_LINKS_SCRIPT = r"""
set -e
mkdir -p a/s1 a/s2/deep b
touch a/f b/g
stat -c '%n %h' . a b a/s1 a/s2
mv a/s1 b/t1              # a directory moves to another parent
stat -c '%n %h' a b
mv a/f b/f2               # a file moves: no link count changes
stat -c '%n %h' a b
mv b/t1 b/t2              # renamed within its parent
stat -c '%n %h' b
mkdir c && mv -T c a/s2/deep  # replaces an empty directory
stat -c '%n %h' a a/s2
rmdir a/s2/deep
stat -c '%n %h' a/s2
rm -r a
stat -c '%n %h' .
"""


@pytest.mark.parametrize("extra_args", [(), ("--write-back",)], ids=["default", "write-back"])
def test_a_directory_counts_its_subdirectories_in_its_link_count_as_ext4_does(tmp_path, extra_args):
    """st_nlink of a directory is 2 plus its subdirectories (`ls -ld`, `stat -c %h`, find's
    leaf optimisation and pjdfstest's rename/24 read it), through mkdir, mv, rmdir and rm -r,
    here and after a remount."""
    local = tmp_path / "local"
    local.mkdir()
    expected = subprocess.run(["sh", "-c", DIR_LINKS_SCRIPT], cwd=local, capture_output=True, text=True)
    assert expected.returncode == 0, expected.stderr
    with mounted(str(tmp_path / "m"), extra_args=extra_args) as m:
        outputs = m.path("wb", "outputs")
        got = subprocess.run(["sh", "-c", DIR_LINKS_SCRIPT], cwd=outputs, capture_output=True, text=True)
        assert got.returncode == 0, got.stderr
        assert got.stdout == expected.stdout
        os.makedirs(os.path.join(outputs, "x", "y", "z"))
        os.makedirs(os.path.join(outputs, "x", "w"))
        workbench_links = os.stat(m.path("wb")).st_nlink
        names = [e.name for e in os.scandir(m.path("wb")) if e.is_dir()]
        assert workbench_links == 2 + len(names)  # the sections and the dot-directories of views
        assert os.stat(m.path()).st_nlink == 2 + len([e for e in os.scandir(m.path()) if e.is_dir()])
    with mounted(str(tmp_path / "m"), extra_args=extra_args, init=False) as m:
        outputs = m.path("wb", "outputs")
        assert [os.stat(os.path.join(outputs, *p)).st_nlink for p in ((), ("x",), ("x", "y"), ("x", "y", "z"))] == [
            3 + 1,  # b, x
            4,
            3,
            2,
        ]
