"""`nokvfs mount --write-back` on a real mount: close(2) returns once the bytes are durable here,
a background publisher publishes them in order, fsync(2) waits for a file's publication and
reports its error, `nokvfs umount` drains before it returns, and a crash is replayed at the next
mount (nokvfs.fs.writeback)."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from nokvfs.fs import spools, writeback
from tests.mount_fixtures import REPO, env, init_data_dir, mounted, needs_fuse, start_daemon, unmount, wait_mounted

pytestmark = needs_fuse

WB = ("--write-back",)


def _cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", *args],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=timeout,
    )


def _tree(base: str, files: int = 240) -> str:
    """A source tree of small files in nested directories, with modes and a symlink."""
    src = os.path.join(base, "src", "tree")
    for i in range(files):
        d = os.path.join(src, f"d{i % 6}", f"e{i % 4}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"f{i:04d}.txt")
        with open(path, "wb") as f:
            f.write(f"file {i}\n".encode() * (1 + i % 50))
        os.chmod(path, 0o600 if i % 3 else 0o755)
    os.symlink("d0/e0/f0000.txt", os.path.join(src, "link"))
    return src


def _published(data_dir: str, path: str) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", data_dir, "get", f"wb:{path}"],
        capture_output=True,
        env=env(),
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@contextlib.contextmanager
def _daemon_environment(name: str, value: str):
    """`name`=`value` in the environment of the daemons started inside the block."""
    old_env = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old_env is None:
            del os.environ[name]
        else:
            os.environ[name] = old_env


def _stop(proc, mnt: str) -> None:
    """Unmount and make sure the daemon is gone (a test's finally)."""
    unmount(mnt)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def _start_crashing_daemon(data: str, mnt: str, log: str, crash_at: str):
    """A write-back daemon that SIGKILLs itself at the publish crash point `crash_at`."""
    with _daemon_environment("NOKVFS_CRASH_AT", crash_at):
        return start_daemon(data, mnt, log, WB)


@pytest.mark.long
def test_tar_x_then_diff_then_umount_drains_everything(tmp_path):
    base = str(tmp_path)
    # Enough files that the publisher (group commit) is still busy when `nokvfs umount` starts.
    src = _tree(base, files=1200)
    tar_path = os.path.join(base, "tree.tar")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(src, arcname="tree")
    with mounted(base, extra_args=WB) as m:
        out = m.path("wb", "outputs")
        subprocess.run(["tar", "xf", tar_path, "-C", out], check=True, timeout=300)
        # Straight away (most files still accepted, not published): `nokvfs umount` returns once
        # the daemon has published every accepted file and exited.
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
        assert m.proc.poll() is not None, "umount returned before the daemon exited"
        assert m.proc.returncode == 0
        assert "write-back: publishing" in m.log()
        assert not glob.glob(os.path.join(m.data_dir, "spool", "mount", "*.spool")), (
            "every accepted spool was published"
        )
        assert not glob.glob(os.path.join(m.data_dir, "spool", "mount", "writeback-*.journal")), (
            "a clean unmount removes the journal"
        )
        for i in (0, 1, 119, 239):
            rel = f"d{i % 6}/e{i % 4}/f{i:04d}.txt"
            with open(os.path.join(src, rel), "rb") as f:
                assert _published(m.data_dir, "outputs/tree/" + rel) == f.read()
    # Mounted again (in either mode), the tree is the source's, modes included.
    for extra in ((), WB):
        with mounted(base, init=False, extra_args=extra) as m:
            diff = subprocess.run(
                ["diff", "-r", "--no-dereference", src, m.path("wb", "outputs", "tree")],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert diff.returncode == 0, diff.stdout + diff.stderr
            assert os.stat(m.path("wb", "outputs", "tree", "d1", "e1", "f0001.txt")).st_mode & 0o777 == 0o600
            assert os.stat(m.path("wb", "outputs", "tree", "d0", "e0", "f0000.txt")).st_mode & 0o777 == 0o755


def test_a_daemon_killed_before_publishing_is_replayed_at_the_next_mount(tmp_path):
    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    proc = _start_crashing_daemon(data, mnt, log, "after-begin")  # SIGKILL inside the first background publication
    accepted = {}
    try:
        wait_mounted(mnt, proc, log)
        for i in range(20):
            body = f"accepted {i}\n".encode() * (100 if i != 3 else 40_000)  # f03: too big to journal
            path = os.path.join(mnt, "wb", "outputs", f"f{i:02d}.txt")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o640)
                os.write(fd, body)
                os.close(fd)  # accepted: durable here, published later
            except OSError:
                break  # the daemon died meanwhile: this close was never acknowledged
            accepted[f"f{i:02d}.txt"] = body
        proc.wait(timeout=60)
        assert proc.returncode == -9
    finally:
        _stop(proc, mnt)
    assert accepted, "the first close returns before its publication starts"
    # Every accepted file has its acceptance record in the daemon's journal (small ones with
    # their bytes); a file whose close was never acknowledged has none.
    (journal,) = glob.glob(os.path.join(data, "spool", "mount", "writeback-*.journal"))
    with open(journal, "rb") as f:
        records = writeback.decode_records(f.read())
    assert sorted(m["path"] for kind, m, _ in records if kind == writeback.ACCEPTED) == sorted(
        f"outputs/{name}" for name in accepted
    )
    for _kind, meta, body in records:
        assert meta["state"] == "pending" and (body is None) == (meta["path"] == "outputs/f03.txt")
    # The next mount (default mode) publishes every accepted file, in order, with its mode.
    with mounted(base, init=False) as m:
        for name, body in accepted.items():
            path = m.path("wb", "outputs", name)
            with open(path, "rb") as f:
                assert f.read() == body, name
            assert os.stat(path).st_mode & 0o777 == 0o640
        assert "accepted before the last daemon ended" in m.log()
    assert not glob.glob(os.path.join(data, "spool", "mount", "writeback-*.journal"))
    # What is left is only the spool of a file whose close was never acknowledged: kept.
    left = [json.load(open(p + ".json")) for p in glob.glob(os.path.join(data, "spool", "mount", "*.spool"))]
    assert all(r["state"] == "kept" and r["path"].split("/")[-1] not in accepted for r in left)
    # The small files' spools were in memory (the journal held their bytes): the next mount
    # restored them from the journal and left no memory copy behind.
    memory = spools.memory_spool_path(data)
    assert memory is None or not glob.glob(os.path.join(memory, "*.spool"))


def test_fsync_reports_the_publication_error_and_the_conflict_is_kept(tmp_path):
    with mounted(str(tmp_path), extra_args=WB) as m:
        path = m.path("wb", "outputs", "raced.txt")
        other = m.facade_waiting("namespace.put(root, 'wb', 'outputs/raced.txt', b'theirs', expected_generation=0)")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"mine")
            other.communicate(b"go\n", timeout=60)
            assert other.returncode == 0
            with pytest.raises(OSError) as caught:
                os.fsync(fd)
            assert caught.value.errno == errno.EEXIST
        finally:
            os.close(fd)  # accepted again: its publication fails the same way, in the background
        # fsync of a file this mount publishes cleanly returns once it is published.
        good = m.path("wb", "outputs", "good.txt")
        fd = os.open(good, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"good")
        os.fsync(fd)
        assert _published(m.data_dir, "outputs/good.txt") == b"good"
        os.close(fd)
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "unpublished bytes of wb:outputs/raced.txt are kept" in m.log()
        listed = _cli("--data-dir", m.data_dir, "spool", "list", "--json")
        records = json.loads(listed.stdout)
        assert [(r["path"], r["state"]) for r in records] == [("outputs/raced.txt", "kept")]
        (spool,) = glob.glob(os.path.join(m.data_dir, "spool", "mount", "*.spool"))
        assert open(spool, "rb").read() == b"mine"
        assert _published(m.data_dir, "outputs/raced.txt") == b"theirs"


def test_random_operations_match_the_model_with_the_kernel_caching_writes(tmp_path):
    """Write-back mounts let the kernel cache writes (writeback cache): the fsx-style exerciser
    finds no miscompare, and what it left is what the next mount publishes and shows."""
    from tests.test_mount_fsx import exercise

    with mounted(str(tmp_path), extra_args=WB) as m:
        path = m.path("wb", "outputs", "fsx.bin")
        out = exercise(path, ops=3_000, seed=20261204, max_size=1 << 20)
        assert "0 miscompares" in out
        with open(path, "rb") as f:
            seen = f.read()
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
        assert _published(m.data_dir, "outputs/fsx.bin") == seen


@pytest.mark.parametrize("publisher", ["running", "held"])
def test_rename_and_unlink_after_close_survive_a_kill(tmp_path, publisher):
    """An editor's save (write a temporary, close, rename it over the file), an unlink of a file
    just closed and a staging directory renamed into place are what the next mount shows after
    SIGKILL: a replay never brings back the temporary, the removed file or the old directory.
    With the publisher held back nothing is published before the kill: the renames and the
    unlink of files accepted and not yet published are in the journal alone (they no longer wait
    for publications), and the replay publishes each file at its last name."""
    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    with _daemon_environment(writeback.QUIET_ENV, "600" if publisher == "held" else str(writeback.QUIET)):
        proc = start_daemon(data, mnt, log, WB)
    try:
        wait_mounted(mnt, proc, log)
        out = os.path.join(mnt, "wb", "outputs")
        for name, body in (("doc.txt", b"version 1"), ("gone.txt", b"removed soon"), ("doc.txt.tmp", b"version 2")):
            with open(os.path.join(out, name), "wb") as f:
                f.write(body)
        os.rename(os.path.join(out, "doc.txt.tmp"), os.path.join(out, "doc.txt"))
        os.unlink(os.path.join(out, "gone.txt"))
        os.mkdir(os.path.join(out, "build.tmp"))  # the atomic-install idiom
        with open(os.path.join(out, "build.tmp", "a.txt"), "wb") as f:
            f.write(b"built")
        os.rename(os.path.join(out, "build.tmp"), os.path.join(out, "build"))
        with open(os.path.join(out, "later.txt"), "wb") as f:
            f.write(b"accepted, not published")
        # The same with the tools: a save through a temporary into another directory, twice (the
        # second over the first, unpublished), and a temporary removed.
        shell = (
            "set -e; mkdir -p notes; printf 'first' > .n.tmp; mv .n.tmp notes/n.txt;"
            " printf 'second' > .n.tmp; mv -f .n.tmp notes/n.txt; printf 'x' > junk; rm junk"
        )
        done = subprocess.run(["sh", "-c", shell], cwd=out, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        if publisher == "held":
            # The directory rename waited for everything before it; nothing after it did.
            for path in ("notes/n.txt", "later.txt"):
                assert _cli("--data-dir", data, "get", f"wb:outputs/{path}").returncode != 0, path
        proc.kill()
        proc.wait(timeout=30)
    finally:
        _stop(proc, mnt)
    with mounted(base, init=False) as m:
        assert sorted(os.listdir(m.path("wb", "outputs"))) == ["build", "doc.txt", "later.txt", "notes"]
        assert os.listdir(m.path("wb", "outputs", "notes")) == ["n.txt"]
        with open(m.path("wb", "outputs", "notes", "n.txt"), "rb") as f:
            assert f.read() == b"second"
        assert json.loads(_cli("--data-dir", m.data_dir, "spool", "list", "--json").stdout) == []
        with open(m.path("wb", "outputs", "build", "a.txt"), "rb") as f:
            assert f.read() == b"built"
        with open(m.path("wb", "outputs", "doc.txt"), "rb") as f:
            assert f.read() == b"version 2"
        with open(m.path("wb", "outputs", "later.txt"), "rb") as f:
            assert f.read() == b"accepted, not published"


def _files_shown(out: str) -> dict:
    """{"dir/name": bytes} of every file in the directories of `out` (one level)."""
    shown = {}
    for d in os.listdir(out):
        for entry in os.listdir(os.path.join(out, d)):
            with open(os.path.join(out, d, entry), "rb") as f:
                shown[f"{d}/{entry}"] = f.read()
    return shown


def _random_file_work(out: str, rng, steps: int) -> dict:
    """`steps` random saves, appends, saves through a temporary, renames, removals and fsyncs of
    files in two directories of `out`, some through a descriptor held open across a rename of
    its file; checks the mount against the model as it goes. The model: {relative path: bytes}."""
    import random

    assert isinstance(rng, random.Random)
    names = [f"d{d}/{c}" for d in range(2) for c in "abcde"]
    model: dict = {}
    held = None  # (descriptor, the name its file has now in the model) or None

    def path(name: str) -> str:
        return os.path.join(out, *name.split("/"))

    def save(name: str, body: bytes) -> None:
        with open(path(name), "wb") as f:
            f.write(body)

    for step in range(steps):
        name, other = rng.sample(names, 2)
        body = b"%d:%s;" % (step, rng.randbytes(rng.choice((1, 40, 5000))).hex().encode())
        action = rng.choice(("save", "save", "append", "through-temp", "rename", "rename", "unlink", "fsync", "hold"))
        if action == "save":
            save(name, body)
            model[name] = body
        elif action == "append" and name in model:
            with open(path(name), "ab") as f:
                f.write(body)
            model[name] += body
        elif action == "through-temp":  # an editor's or git's save
            save(name + ".tmp", body)
            os.rename(path(name + ".tmp"), path(name))
            model[name] = body
            if held is not None and held[1] == name:  # its file was replaced: writes vanish
                held = (held[0], None)
        elif action == "rename" and name in model:
            os.rename(path(name), path(other))
            model[other] = model.pop(name)
            if held is not None and held[1] == name:
                held = (held[0], other)
            elif held is not None and held[1] == other:  # its file was replaced: writes vanish
                held = (held[0], None)
        elif action == "unlink" and name in model:
            os.unlink(path(name))
            del model[name]
            if held is not None and held[1] == name:
                held = (held[0], None)
        elif action == "fsync" and name in model:
            with open(path(name), "rb") as f:
                os.fsync(f.fileno())
        elif action == "hold":
            if held is None and name in model:  # opened now; renamed or not, written at its release
                held = (os.open(path(name), os.O_WRONLY | os.O_APPEND), name)
            elif held is not None:
                fd, now = held
                os.write(fd, body)
                os.close(fd)
                if now is not None:
                    model[now] += body
                held = None
    if held is not None:
        fd, now = held
        os.close(fd)
    assert _files_shown(out) == model, "the mount does not show what was written"
    return model


@pytest.mark.parametrize("publisher", ["running", "held", "none (default mode)"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_saves_renames_and_removals_survive_a_kill(tmp_path, publisher, seed):
    """Random sequences of what tools do to files -- save, append, save through a temporary and
    rename it over the file, rename, remove, fsync, write through a descriptor held open while
    its file is renamed or removed -- then SIGKILL of the daemon. On a write-back mount what was
    closed is accepted, and renames and removals of accepted files are in the journal alone,
    whether their publication had started (publisher running) or nothing was published (held);
    in the default mode close published it. The mount must show the model before the kill, and
    the next mount exactly the model, with no spool left that holds anything else. With the
    publisher running this found a close during the file's publication being lost (a232497)."""
    import random

    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    with _daemon_environment(writeback.QUIET_ENV, "600" if publisher == "held" else "0"):
        proc = start_daemon(data, mnt, log, () if publisher.startswith("none") else WB)
    try:
        wait_mounted(mnt, proc, log)
        out = os.path.join(mnt, "wb", "outputs")
        for d in ("d0", "d1"):
            os.mkdir(os.path.join(out, d))
        model = _random_file_work(out, random.Random(seed), 500)
        # close(2) returns before the kernel's RELEASE of the file reaches the daemon, and a file
        # renamed over or removed while open goes at its RELEASE: let the last one arrive.
        time.sleep(0.5)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        _stop(proc, mnt)
    with mounted(base, init=False) as m:
        out = m.path("wb", "outputs")
        assert _files_shown(out) == model
        # Every descriptor was closed before the kill: nothing is kept. (A file opened without a
        # write, its RELEASE still on its way at the kill, was kept until its sidecar said it
        # was not dirty.)
        assert json.loads(_cli("--data-dir", m.data_dir, "spool", "list", "--json").stdout) == []
    for path, body in model.items():
        assert _published(data, f"outputs/{path}") == body, path


@pytest.mark.parametrize("publisher", ["held", "none (default mode)"])
def test_files_open_at_a_kill_leave_no_spool_unless_they_hold_unpublished_bytes(tmp_path, publisher):
    """Descriptors are open when the daemon is SIGKILLed: a temporary file removed while open
    (the `tmpfile()` pattern), a file renamed over while open, a published file opened
    read-write and never written, and a published file written through its descriptor (never
    closed, so never published). As on a local disk after a crash, the removed and the replaced
    file's bytes are gone, and nothing that was never changed is left behind: the next mount
    keeps one spool at most, the written file's, for the operator. Before the sidecar said
    "orphaned" and "dirty", all four were kept, and `nokvfs spool retry` would have brought the
    removed file back."""
    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    with _daemon_environment(writeback.QUIET_ENV, "600"):
        proc = start_daemon(data, mnt, log, () if publisher.startswith("none") else WB)
    held = []
    try:
        wait_mounted(mnt, proc, log)
        out = os.path.join(mnt, "wb", "outputs", "d")
        os.mkdir(out)
        subprocess.run(
            "echo published > old; echo published > edited; sync old edited", shell=True, cwd=out, check=True
        )

        def opened(name: str, flags: int) -> int:
            held.append(os.open(os.path.join(out, name), flags, 0o644))
            return held[-1]

        # No shell here: a shell's `>&N` closes a duplicate of N afterwards, and that flush
        # publishes (or accepts) the file, as it should.
        os.write(opened("tmp", os.O_WRONLY | os.O_CREAT), b"scratch\n")
        os.unlink(os.path.join(out, "tmp"))
        os.write(opened("new", os.O_WRONLY | os.O_CREAT), b"mine\n")
        subprocess.run("echo theirs > keep && mv keep new", shell=True, cwd=out, check=True)
        opened("old", os.O_RDWR)
        os.pwrite(opened("edited", os.O_RDWR), b"changed\n", 0)
        time.sleep(0.5)  # the last requests reach the daemon
        proc.kill()
        proc.wait(timeout=30)
    finally:
        for fd in held:
            with contextlib.suppress(OSError):
                os.close(fd)  # ENOTCONN once the daemon is gone
        _stop(proc, mnt)
    # Before the next mount, the operator sees what is left and cannot publish the removed file.
    listed = {line.split()[0]: line for line in _cli("--data-dir", data, "spool", "list").stdout.splitlines()}
    removed = [ident for ident, line in listed.items() if "outputs/d/tmp" in line]
    assert len(removed) == 1 and "left" in listed[removed[0]] and "removed or renamed over" in listed[removed[0]]
    refused = _cli("--data-dir", data, "spool", "retry", removed[0], "--force")
    assert refused.returncode == 2 and "nothing to publish" in refused.stderr, refused.stderr
    with mounted(base, init=False) as m:
        out = m.path("wb", "outputs")
        assert _files_shown(out) == {"d/old": b"published\n", "d/edited": b"published\n", "d/new": b"theirs\n"}
        kept = json.loads(_cli("--data-dir", m.data_dir, "spool", "list", "--json").stdout)
        if publisher == "held" and not kept:
            # A write-back mount lets the kernel cache writes (FUSE's writeback cache): an
            # unflushed write may never have reached the daemon, and dies with the connection.
            assert "wb:outputs/d/edited left by a daemon that ended: it holds nothing unpublished" in m.log()
        else:
            assert [(k["path"], k["state"]) for k in kept] == [("outputs/d/edited", "kept")], kept
            with open(kept[0]["spool"], "rb") as f:
                assert f.read() == b"changed\nd\n"
    leftovers = glob.glob(os.path.join(data, "spool", "mount", "*.spool*"))
    assert len(leftovers) == 2 * len(kept), leftovers


def test_tar_x_with_a_conflict_in_a_group_publishes_the_others_and_keeps_the_conflicted_one(tmp_path):
    """A file accepted at the head of the queue conflicts (another process created its path),
    a tar's files are accepted right behind it: they are published in the same group, the
    conflicted one is refused alone and kept with its sidecar."""
    base = str(tmp_path)
    src = _tree(base, files=120)
    tar_path = os.path.join(base, "tree.tar")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(src, arcname="tree")
    # The publisher waits for quiet far longer than the test takes, so it starts at umount with
    # every file queued: the conflicted one at the head of the first group, whatever the load.
    with _daemon_environment(writeback.QUIET_ENV, "600"), mounted(base, extra_args=WB) as m:
        other = m.facade_waiting("namespace.put(root, 'wb', 'outputs/clash.txt', b'theirs', expected_generation=0)")
        out = m.path("wb", "outputs")
        fd = os.open(os.path.join(out, "clash.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"mine")
            other.communicate(b"go\n", timeout=60)
            assert other.returncode == 0
        finally:
            os.close(fd)  # accepted: its publication will conflict
        # The tar's files queue behind the conflicted one.
        with tarfile.open(tar_path) as tar:
            tar.extractall(out, filter="tar")
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
        log = m.log()
        assert "published 63 file(s) as one group, 1 refused" in log, log[-3000:]
        assert "unpublished bytes of wb:outputs/clash.txt are kept" in log
        records = json.loads(_cli("--data-dir", m.data_dir, "spool", "list", "--json").stdout)
        assert [(r["path"], r["state"]) for r in records] == [("outputs/clash.txt", "kept")]
        (spool,) = glob.glob(os.path.join(m.data_dir, "spool", "mount", "*.spool"))
        assert open(spool, "rb").read() == b"mine"
        assert _published(m.data_dir, "outputs/clash.txt") == b"theirs"
    with mounted(base, init=False) as m:
        diff = subprocess.run(
            ["diff", "-r", "--no-dereference", src, m.path("wb", "outputs", "tree")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert diff.returncode == 0, diff.stdout + diff.stderr


@pytest.mark.parametrize("crash_at", ["after-upload-0", "after-finalize", "after-publish-command"])
def test_sigkill_during_a_group_publication_loses_nothing_accepted(tmp_path, crash_at):
    """The daemon dies inside a group publication (uploading, finalized, or published but not
    yet recorded): the next mount recovers the operations and replays the journal, every accepted
    file shows its bytes once, and after gc no object is left that nothing owns."""
    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    proc = _start_crashing_daemon(data, mnt, log, crash_at)
    accepted = {}
    try:
        wait_mounted(mnt, proc, log)
        for i in range(40):
            body = f"group {i}\n".encode() * (10 + i)
            path = os.path.join(mnt, "wb", "outputs", f"g{i:02d}.txt")
            try:
                with open(path, "wb") as f:
                    f.write(body)
            except OSError:
                break  # the daemon died meanwhile: this close was never acknowledged
            accepted[f"g{i:02d}.txt"] = body
        proc.wait(timeout=60)
        assert proc.returncode == -9
    finally:
        _stop(proc, mnt)
    assert len(accepted) > 1
    with mounted(base, init=False) as m:
        for name, body in accepted.items():
            with open(m.path("wb", "outputs", name), "rb") as f:
                assert f.read() == body, name
    done = _cli("--data-dir", data, "gc")
    assert done.returncode == 0, done.stderr
    from tests.conftest import fsck_data_dir

    report = fsck_data_dir(data)
    assert report.ok, [(f.code, f.subject, f.detail) for f in report.findings]
    assert not any(f.code == "ORPHAN_OBJECT" for f in report.findings)


def test_dd_of_several_blocks_in_order_is_written_and_published(tmp_path):
    # A file written in order completes whole blocks while it is written; write-back does not
    # stage them (its groups upload from the spool), and a completed block must not fail the
    # write (it did: EIO from the block-hashed callback of a spool made without a stager).
    base = str(tmp_path)
    src = os.path.join(base, "src.bin")
    with open(src, "wb") as f:
        f.write(os.urandom(13 * 1024 * 1024 + 5))
    with mounted(base, extra_args=WB) as m:
        target = m.path("wb", "outputs", "big.bin")
        subprocess.run(["dd", f"if={src}", f"of={target}", "bs=1M", "status=none"], check=True, timeout=120)
        assert subprocess.run(["cmp", src, target], timeout=60).returncode == 0
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
    with open(src, "rb") as f:
        assert _published(m.data_dir, "outputs/big.bin") == f.read()
    with mounted(base, init=False) as m:
        assert subprocess.run(["cmp", src, m.path("wb", "outputs", "big.bin")], timeout=60).returncode == 0


def _revisions_with_blocks(data_dir: str) -> dict[str, int]:
    """Each artifact revision in the local store: how many blocks it holds."""
    found: dict[str, int] = {}
    for block in glob.glob(os.path.join(data_dir, "**", "blocks", "*"), recursive=True):
        revision = os.path.basename(os.path.dirname(os.path.dirname(block)))
        found[revision] = found.get(revision, 0) + 1
    return found


@pytest.mark.parametrize("reader_fsync", [False, True], ids=["closed", "fsync-while-written"])
def test_dd_still_writing_after_closing_its_first_descriptor_publishes_only_what_a_close_accepted(
    tmp_path, reader_fsync
):
    """dd of=F (like a shell's `> F`) opens F, moves the descriptor to 1 and closes the first:
    that close accepts the empty file. The publisher must not publish what dd writes after it
    while dd still writes (a state no close made: a torn prefix in the file's history and its
    blocks in the store, as CI saw under load); dd's last close publishes the whole file, once.
    An fsync(2) through another descriptor meanwhile publishes at once what is written."""
    base = str(tmp_path)
    first, rest = os.urandom((1 << 20) + (64 << 10)), os.urandom((2 << 20) + 5)  # first: whole dd blocks
    for name, data in (("first", first), ("rest", rest)):
        with open(os.path.join(base, name), "wb") as f:
            f.write(data)
    # A publisher that waits 2 s after an acceptance: dd's first bytes reach the daemon before it
    # looks at the accepted empty file.
    with _daemon_environment(writeback.QUIET_ENV, "2"), mounted(base, extra_args=WB, block_size=1 << 20) as m:
        target = m.path("wb", "outputs", "big.bin")
        gate = os.path.join(base, "gate")
        os.mkfifo(gate)
        feed = f"{{ cat {base}/first; cat {gate}; cat {base}/rest; }}"
        script = f"{feed} | dd of={target} bs=64k iflag=fullblock status=none"
        dd = subprocess.Popen(["sh", "-c", script])
        try:
            deadline = time.monotonic() + 60
            while (not os.path.exists(target) or os.stat(target).st_size < len(first)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.stat(target).st_size == len(first)
            if reader_fsync:
                fd = os.open(target, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                assert _published(m.data_dir, "outputs/big.bin") == first
            else:
                # The kernel caches dd's writes: sync(2) hands them to the daemon, then the
                # publisher's quiet time ends while dd still waits for the rest.
                subprocess.run(["sync"], check=True, timeout=60)
                time.sleep(3)
                shown = subprocess.run(
                    [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, "get", "wb:outputs/big.bin"],
                    capture_output=True,
                    env=env(),
                    cwd=REPO,
                    timeout=60,
                )
                torn = shown.returncode == 0 and shown.stdout != b""
                assert not torn, f"{len(shown.stdout)} bytes no close made were published"
        finally:
            with open(gate, "wb"):
                pass  # dd reads the rest, writes it and closes
            assert dd.wait(timeout=60) == 0
        assert subprocess.run(["cmp", target, "-"], input=first + rest, timeout=60).returncode == 0
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
    assert _published(m.data_dir, "outputs/big.bin") == first + rest
    revisions = _revisions_with_blocks(m.data_dir)
    if reader_fsync:
        assert sorted(revisions.values()) == [2, 4], revisions  # what fsync saw, then the whole file
    else:
        assert list(revisions.values()) == [4], revisions  # one revision with blocks: the whole file


def _directories(base: str) -> list[str]:
    """Each directory below `base`: its relative path, mode, link count and mtime (ns)."""
    found = []
    for top, dirs, _ in os.walk(base):
        for name in dirs:
            path = os.path.join(top, name)
            st = os.lstat(path)
            found.append(f"{os.path.relpath(path, base)} {st.st_mode & 0o7777:o} {st.st_nlink} {st.st_mtime_ns}")
    return sorted(found)


def test_tar_x_directories_keep_their_modes_and_times_before_and_after_publication(tmp_path):
    # mkdir and a directory's chmod/chown/utime are accepted into the journal and stored by the
    # publisher; tar sets a directory's mode and times after its files, so what it restores must
    # not be overtaken when the files are published.
    base = str(tmp_path)
    src = _tree(base, files=300)
    for i, (top, _, _) in enumerate(sorted(os.walk(src))):
        os.chmod(top, (0o750, 0o700, 0o755, 0o711)[i % 4])
    for i, (top, _, _) in enumerate(sorted(os.walk(src), reverse=True)):
        os.utime(top, ns=(1_600_000_000_123_456_789 + i * 10**9,) * 2)
    tar_path = os.path.join(base, "tree.tar")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(src, arcname="tree")
    local = os.path.join(base, "local")
    os.makedirs(local)
    subprocess.run(["tar", "xpf", tar_path, "-C", local], check=True, timeout=120)
    expected = _directories(local)
    assert len(expected) == 19
    with mounted(base, extra_args=WB) as m:
        out = m.path("wb", "outputs")
        subprocess.run(["tar", "xpf", tar_path, "-C", out], check=True, timeout=300)
        assert _directories(out) == expected  # accepted, shown before they are stored
        subprocess.run(["sync", "-f", os.path.join(out, "tree", "link")], check=True, timeout=300)
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "could not be stored" not in m.log()
    for extra in ((), WB):
        with mounted(base, init=False, extra_args=extra) as m:
            assert _directories(m.path("wb", "outputs")) == expected


def test_directory_changes_accepted_before_a_kill_are_stored_at_the_next_mount(tmp_path):
    base = str(tmp_path)
    data, mnt, log = os.path.join(base, "data"), os.path.join(base, "mnt"), os.path.join(base, "daemon.log")
    os.makedirs(mnt)
    init_data_dir(data)
    with _daemon_environment(writeback.QUIET_ENV, "600"):  # nothing is published before the kill
        proc = start_daemon(data, mnt, log, WB)
    try:
        wait_mounted(mnt, proc, log)
        out = os.path.join(mnt, "wb", "outputs")
        script = (
            "mkdir -p a/b/c empty gone moved && chmod 700 a/b && chmod 1777 empty && touch -d @1500000000 a/b/c"
            " && rmdir gone && mv moved renamed && touch -d @1400000000 renamed"
        )
        subprocess.run(["sh", "-c", script], cwd=out, check=True, timeout=120)
        shown = _directories(out)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        _stop(proc, mnt)
    (journal,) = glob.glob(os.path.join(data, "spool", "mount", "writeback-*.journal"))
    with open(journal, "rb") as f:
        kinds = [kind for kind, _, _ in writeback.decode_records(f.read())]
    assert writeback.DIRECTORY in kinds
    with mounted(base, init=False) as m:
        assert _directories(m.path("wb", "outputs")) == shown
        assert not os.path.exists(m.path("wb", "outputs", "gone"))
        assert "accepted before the last daemon ended" in m.log()
    assert not glob.glob(os.path.join(data, "spool", "mount", "writeback-*.journal"))
    with mounted(base, init=False) as m:
        assert _directories(m.path("wb", "outputs")) == shown
        assert [line.split()[:2] for line in shown] == [
            ["a", "755"],
            ["a/b", "700"],
            ["a/b/c", "755"],
            ["empty", "1777"],
            ["renamed", "755"],
        ]


@pytest.mark.long
@pytest.mark.parametrize("call", ["sync FILE", "mkdir + rmdir", "mv DIR", "mv FILE + sync"])
def test_calls_after_tar_x_wait_for_a_backlog_longer_than_the_syscall_deadline(tmp_path, call):
    """`tar x` of a few thousand files, then a call that must wait for the publications ahead of
    it: `sync` of the last file (fsync(2) waits for its publication), `rmdir` of a directory made
    after the extract (its mkdir is stored in order, behind the files), `mv` of a directory of
    the extract (a directory rename applies to what is published), `mv` of the last file and
    `sync` of it at its new name (the rename itself moves the file's acceptance in the journal
    at once, the sync waits). On a loopback S3 store the backlog took longer than the syscall
    deadline (30 s), and fsync and rmdir answered EIO although nothing had failed, which an
    application takes for lost data. The deadline now bounds a wait without progress only: a
    1 s deadline here, a backlog that takes several seconds, and the call succeeds."""
    import time

    base = str(tmp_path)
    src = os.path.join(base, "src", "many")
    for i in range(1500):
        d = os.path.join(src, f"d{i % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:04d}"), "wb") as f:
            f.write(b"%d\n" % i)
    tar_path = os.path.join(base, "many.tar")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(src, arcname="many")
    # Nothing is published before the call asks (the quiet time outlasts the test), so the
    # whole backlog stands between the call and its file, whatever the machine's speed.
    with (
        _daemon_environment(writeback.QUIET_ENV, "600"),
        mounted(base, extra_args=(*WB, "--syscall-timeout", "1")) as m,
    ):
        out = m.path("wb", "outputs")
        subprocess.run(["tar", "xf", tar_path, "-C", out], check=True, timeout=300)
        last = os.path.join(out, "many", "d9", "f1499")
        if call == "mkdir + rmdir":
            os.mkdir(os.path.join(out, "scratch"))  # accepted behind the extract's files
            argv, published = ["rmdir", os.path.join(out, "scratch")], "outputs/many/d9/f1499"
        elif call == "mv DIR":
            argv, published = ["mv", os.path.join(out, "many", "d9"), os.path.join(out, "d9")], "outputs/d9/f1499"
        elif call == "mv FILE + sync":
            moving = time.monotonic()
            subprocess.run(["mv", last, os.path.join(out, "moved")], check=True, timeout=300)
            assert time.monotonic() - moving < 1.0, "mv of an accepted file waited for the backlog"
            argv, published = ["sync", os.path.join(out, "moved")], "outputs/moved"
        else:
            argv, published = ["sync", last], "outputs/many/d9/f1499"
        start = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        waited = time.monotonic() - start
        assert done.returncode == 0, (done.stderr, m.log()[-2000:])
        assert waited > 1.0, f"the backlog took {waited:.2f} s: shorter than the deadline, nothing tested"
        assert _published(m.data_dir, published) == b"1499\n"
        assert "SyscallTimeout" not in m.log()
        assert not os.path.exists(os.path.join(out, "scratch"))
        assert os.path.exists(last) == (not call.startswith("mv"))


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_a_large_file_is_published_without_holding_it_in_memory(tmp_path):
    """Write a 384 MiB file with `dd` into a write-back mount and `sync` it. The publisher used
    to read every block of a group into memory before storing them (one put_many), a large file
    included: the daemon's peak RSS grew by the file's size (512 MiB gave a 567 MB peak), so a
    file larger than the machine's memory would have killed the daemon. A large file is now
    published alone, its blocks streamed a few at a time: the peak grows by far less than the
    file, and the bytes published are the file's."""
    import hashlib

    base = str(tmp_path)
    source = os.path.join(base, "source.bin")
    with open(source, "wb") as f:
        for _ in range(384):
            f.write(os.urandom(1024 * 1024))
    with mounted(base, extra_args=WB) as m:
        before = _peak_rss_kib(m.proc.pid)
        target = m.path("wb", "outputs", "large.bin")
        subprocess.run(["dd", f"if={source}", f"of={target}", "bs=1M", "status=none"], check=True, timeout=300)
        subprocess.run(["sync", target], check=True, timeout=300)
        grown_mib = (_peak_rss_kib(m.proc.pid) - before) / 1024
        published = _published(m.data_dir, "outputs/large.bin")
    with open(source, "rb") as f:
        assert hashlib.sha256(published).digest() == hashlib.sha256(f.read()).digest()
    assert grown_mib < 192, f"the daemon's peak RSS grew by {grown_mib:.0f} MiB publishing a 384 MiB file"


def test_dd_of_a_big_file_is_written_behind_and_published_whole(tmp_path):
    """`dd` of 24 MiB onto a write-back mount: the spool's bytes go to the disk while dd writes
    (nokvfs.fs.writebehind), so close(2)'s fdatasync has little left; the file is published
    whole, byte for byte, once `nokvfs umount` has drained."""
    import hashlib

    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(24 << 20))
    with mounted(str(tmp_path / "m"), extra_args=WB) as m:
        target = m.path("wb", "outputs", "big.bin")
        done = subprocess.run(
            ["dd", f"if={source}", f"of={target}", "bs=1M", "status=none"], capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        with open(target, "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(source.read_bytes()).digest()
        done = _cli("umount", m.mountpoint, timeout=300)
        assert done.returncode == 0, done.stderr
        written_behind = [line for line in m.log().splitlines() if "MiB of spools written behind" in line]
        assert written_behind, m.log()[-2000:]
        mib = int(written_behind[-1].split(" MiB of spools written behind")[0].rsplit(" ", 1)[-1])
        assert mib >= 16, written_behind[-1]
    assert _published(m.data_dir, "outputs/big.bin") == source.read_bytes()
