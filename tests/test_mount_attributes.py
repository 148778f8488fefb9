"""Attributes, links and permissions through the mount (issue 12), with the tools that rely on them:
chmod +x then execute, touch -d and utime that survive a remount, rsync -a and tar that see no
difference the second time, symbolic links (venvs, git, build trees), permissions enforced for
other users under --allow-other, and directory times that move when their contents change."""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time

import pytest

from tests.mount_fixtures import mount, mounted, needs_fuse  # noqa: F401

pytestmark = needs_fuse


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


def remount(tmp_path):
    """The same data directory mounted again (a fresh daemon: nothing cached in memory)."""
    return mounted(str(tmp_path), init=False)


def make_tree(base, files: int = 300) -> None:
    """A source tree with modes, times and links of every kind a project has."""
    for index in range(files):
        directory = os.path.join(base, f"d{index % 7}", f"e{index % 3}")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"f{index:04d}.txt")
        with open(path, "w") as f:
            f.write(f"file {index}\n" * (index % 11))
        os.chmod(path, 0o755 if index % 5 == 0 else 0o640 if index % 5 == 1 else 0o644)
        os.utime(
            path, ns=(1_600_000_000_000_000_000 + index * 1_000_003, 1_500_000_000_000_000_000 + index * 7_000_000_011)
        )
    os.symlink("d0/e0/f0000.txt", os.path.join(base, "link-to-file"))
    os.symlink("../d1", os.path.join(base, "d0", "link-to-dir"))
    os.symlink("nowhere", os.path.join(base, "dangling"))
    os.makedirs(os.path.join(base, "empty"))
    os.chmod(os.path.join(base, "d2"), 0o750)
    for directory, _, _ in os.walk(base):
        os.utime(directory, ns=(1_400_000_000_000_000_000, 1_450_000_000_000_000_000))


def test_chmod_plus_x_then_execute(mount):
    script = mount.path("wb", "scripts", "run.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho ran with $1\n")
    assert run(["bash", "-c", f"{script} x"]).returncode == 126  # 0644: not executable, as on a local disk
    assert run(["chmod", "+x", script]).returncode == 0
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755
    done = run([script, "now"])
    assert done.returncode == 0 and done.stdout == "ran with now\n"
    with open(script, "a") as f:  # a write keeps the mode
        f.write("echo again\n")
    assert run([script, "x"]).stdout == "ran with x\nagain\n"


def test_times_and_modes_survive_a_remount(tmp_path):
    with mounted(str(tmp_path)) as m:
        path = m.path("wb", "outputs", "dated.txt")
        with open(path, "w") as f:
            f.write("old news")
        assert run(["touch", "-d", "2001-02-03 04:05:06 UTC", path]).returncode == 0
        other = m.path("wb", "outputs", "utimed.bin")
        with open(other, "wb") as f:
            f.write(b"x")
        os.utime(other, ns=(1_111_111_111_222_333_444, 1_234_567_890_123_456_789))
        os.chmod(other, 0o600)
        created = m.path("wb", "outputs", "touched-new")
        assert run(["touch", "-d", "1999-12-31 23:59:59 UTC", created]).returncode == 0  # created by touch itself
    with remount(tmp_path) as m:
        assert os.stat(m.path("wb", "outputs", "dated.txt")).st_mtime == 981173106
        st = os.stat(m.path("wb", "outputs", "utimed.bin"))
        assert (st.st_mtime_ns, st.st_atime_ns) == (1_234_567_890_123_456_789, 1_111_111_111_222_333_444)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert os.stat(m.path("wb", "outputs", "touched-new")).st_mtime == 946684799


def test_a_second_rsync_of_an_unchanged_tree_changes_nothing(mount, tmp_path):
    source = tmp_path / "source"
    make_tree(str(source))
    target = mount.path("wb", "outputs", "copy")
    first = run(["rsync", "-a", f"{source}/", f"{target}/"])
    assert first.returncode == 0, first.stderr
    second = run(["rsync", "-a", "-i", f"{source}/", f"{target}/"])
    assert second.returncode == 0, second.stderr
    assert second.stdout == "", second.stdout  # itemizes no change: modes, times, links, sizes equal
    diff = run(["diff", "-r", "--no-dereference", str(source), target])
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_tar_extract_then_compare_reports_no_difference(mount, tmp_path):
    source = tmp_path / "source"
    make_tree(str(source), files=200)
    archive = tmp_path / "tree.tar"
    assert run(["tar", "-cf", str(archive), "-C", str(tmp_path), "source"]).returncode == 0
    outputs = mount.path("wb", "outputs")
    extracted = run(["tar", "-xpf", str(archive), "-C", outputs])
    assert extracted.returncode == 0, extracted.stderr
    compared = run(["tar", "-df", str(archive), "-C", outputs])
    assert compared.returncode == 0, compared.stdout + compared.stderr  # no mode, mtime or size difference
    assert os.readlink(os.path.join(outputs, "source", "d0", "link-to-dir")) == "../d1"
    assert stat.S_IMODE(os.stat(os.path.join(outputs, "source", "d2")).st_mode) == 0o750


def test_symbolic_links_are_stored_listed_read_and_kept_by_snapshots(mount):
    outputs = mount.path("wb", "outputs")
    with open(os.path.join(outputs, "v3.csv"), "w") as f:
        f.write("a,b\n")
    assert run(["ln", "-s", "v3.csv", os.path.join(outputs, "latest")]).returncode == 0
    assert run(["ln", "-s", "/usr/bin/env", os.path.join(outputs, "absolute")]).returncode == 0
    link = os.path.join(outputs, "latest")
    assert os.readlink(link) == "v3.csv" and os.path.islink(link)
    with open(link) as f:  # followed by the kernel
        assert f.read() == "a,b\n"
    assert stat.S_ISLNK(os.lstat(link).st_mode) and os.lstat(link).st_size == len("v3.csv")
    listing = run(["ls", "-l", outputs]).stdout
    assert "latest -> v3.csv" in listing and "absolute -> /usr/bin/env" in listing
    os.mkdir(mount.path("wb", ".snapshots", "with-links"))
    os.unlink(link)
    os.symlink("elsewhere", link)
    assert os.readlink(mount.path("wb", ".snapshots", "with-links", "outputs", "latest")) == "v3.csv"
    assert os.readlink(link) == "elsewhere"
    with pytest.raises(OSError) as exc:
        os.link(os.path.join(outputs, "v3.csv"), os.path.join(outputs, "hard"))
    assert exc.value.errno == errno.EPERM  # hard links are not stored (README, SEMANTICS)


def test_a_venv_made_in_the_mount_runs(mount):
    venv = mount.path("wb", "outputs", "venv")
    made = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    assert os.path.islink(os.path.join(venv, "bin", "python"))
    done = run([os.path.join(venv, "bin", "python"), "-c", "import sys; print(sys.prefix)"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == venv


GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def git(*argv, cwd=None) -> str:
    done = run(["git", *argv], cwd=cwd, env=GIT_ENV)
    assert done.returncode == 0, f"git {' '.join(argv)}: {done.stderr}"
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git is installed by scripts/setup.sh")
def test_a_git_repository_survives_gc_and_a_remount(tmp_path):
    """git init, commits on two branches, a merge, gc (which packs the refs and leaves
    .git/refs/heads empty), clones out of and into the mount, then a remount: the repository is
    still one (`git status`, `git fsck --full`, the same log), as on a local disk."""
    with mounted(str(tmp_path)) as m:
        repo = m.path("wb", "outputs", "repo")
        git("init", "-q", "-b", "main", repo)
        with open(os.path.join(repo, "a.txt"), "w") as f:
            f.write("one\n")
        os.makedirs(os.path.join(repo, "src"))
        with open(os.path.join(repo, "src", "run.sh"), "w") as f:
            f.write("#!/bin/sh\necho ran\n")
        os.chmod(os.path.join(repo, "src", "run.sh"), 0o755)
        git("add", ".", cwd=repo)
        git("commit", "-qm", "first", cwd=repo)
        with open(os.path.join(repo, "a.txt"), "a") as f:
            f.write("two\n")
        git("commit", "-qam", "second", cwd=repo)
        git("checkout", "-qb", "feature", cwd=repo)
        with open(os.path.join(repo, "f.txt"), "w") as f:
            f.write("feature\n")
        git("add", "f.txt", cwd=repo)
        git("commit", "-qm", "feature", cwd=repo)
        git("checkout", "-q", "main", cwd=repo)
        git("merge", "-q", "--no-edit", "feature", cwd=repo)
        git("gc", "-q", cwd=repo)
        assert os.listdir(os.path.join(repo, ".git", "refs", "heads")) == []  # packed
        log = git("log", "--format=%H %s", cwd=repo)
        assert len(log.splitlines()) == 3
        git("clone", "-q", repo, str(tmp_path / "out"))  # hard links refused: git copies
        git("clone", "-q", str(tmp_path / "out"), m.path("wb", "outputs", "back"))
    with remount(tmp_path) as m:
        repo = m.path("wb", "outputs", "repo")
        assert git("status", "--porcelain", cwd=repo) == ""
        git("fsck", "--full", cwd=repo)
        assert git("log", "--format=%H %s", cwd=repo) == log
        assert git("branch", "--format=%(refname:short)", cwd=repo).split() == ["feature", "main"]
        assert run([os.path.join(repo, "src", "run.sh")]).stdout == "ran\n"
        back = m.path("wb", "outputs", "back")
        git("fsck", "--full", cwd=back)
        assert git("log", "--format=%H %s", cwd=back) == log
        with open(os.path.join(repo, "a.txt"), "w") as f:
            f.write("changed\n")
        git("commit", "-qam", "after the remount", cwd=repo)
        assert git("status", "--porcelain", cwd=repo) == ""


def test_empty_directories_made_by_the_shell_survive_a_remount(tmp_path):
    """mkdir, mkdir -p, mkdir -m, and directories emptied by rm, mv and rmdir: all still there
    after a remount, with the mode they were made with."""
    with mounted(str(tmp_path)) as m:
        out = m.path("wb", "outputs")
        script = (
            "set -e; cd " + out + "; mkdir plain; mkdir -p deep/er/est; mkdir -m 700 private; "
            "mkdir full; echo x > full/f; rm full/f; mkdir moved; echo y > moved/f; mv moved/f .; "
            "mkdir -p parent/child; rmdir parent/child"
        )
        done = run(["sh", "-c", script])
        assert done.returncode == 0, done.stderr
    with remount(tmp_path) as m:
        out = m.path("wb", "outputs")
        for name in ("plain", "deep/er/est", "private", "full", "moved", "parent"):
            path = os.path.join(out, name)
            assert os.path.isdir(path), name
        for name in ("plain", "deep/er/est", "full", "moved", "parent"):
            assert os.listdir(os.path.join(out, name)) == [], name
        assert sorted(os.listdir(out)) == ["deep", "f", "full", "moved", "parent", "plain", "private"]
        assert stat.S_IMODE(os.stat(os.path.join(out, "private")).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.join(out, "plain")).st_mode) == 0o755


def test_directory_times_move_when_their_contents_change(mount):
    directory = mount.path("wb", "outputs", "watched")
    os.mkdir(directory)
    with open(os.path.join(directory, "first"), "w") as f:
        f.write("1")
    before = os.stat(directory).st_mtime_ns
    time.sleep(0.05)
    with open(os.path.join(directory, "second"), "w") as f:
        f.write("2")
    after = os.stat(directory).st_mtime_ns
    assert after > before
    # The time is derived from what the shard records: a fresh daemon shows the same.
    assert after == os.stat(os.path.join(directory, "second")).st_ctime_ns
    os.utime(directory, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    assert os.stat(directory).st_mtime_ns == 1_000_000_000_000_000_000
    time.sleep(0.05)
    with open(os.path.join(directory, "third"), "w") as f:
        f.write("3")
    assert os.stat(directory).st_mtime_ns > after  # a change after the utime moves it again


def _second_user():
    name = f"nokvt{os.getpid() % 100000}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True
    )
    return name


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root to make a second user")
def test_permissions_are_enforced_for_other_users_with_allow_other():
    import tempfile

    user = _second_user()
    base = tempfile.mkdtemp(prefix="nokvfs-other-", dir="/tmp")  # every ancestor traversable by the other user
    try:
        os.chmod(base, 0o755)
        uid = pwd.getpwnam(user).pw_uid
        with mounted(base, extra_args=("--allow-other",)) as m:
            secret = m.path("wb", "outputs", "secret.txt")
            public = m.path("wb", "outputs", "public.txt")
            for path, mode in ((secret, 0o600), (public, 0o644)):
                with open(path, "w") as f:
                    f.write("only for root" if mode == 0o600 else "for everyone")
                os.chmod(path, mode)

            def as_user(path):
                return run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat", path])

            refused = as_user(secret)
            assert refused.returncode != 0 and "Permission denied" in refused.stderr
            allowed = as_user(public)
            assert allowed.returncode == 0 and allowed.stdout == "for everyone"
            written = run(
                [
                    "setpriv",
                    f"--reuid={uid}",
                    f"--regid={uid}",
                    "--clear-groups",
                    "sh",
                    "-c",
                    f"echo x > {m.path('wb', 'outputs', 'intruder')}",
                ]
            )
            assert written.returncode != 0  # the section is 0755 root's: no entry for others
    finally:
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
