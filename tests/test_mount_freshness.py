"""Freshness: what another process changes is visible in the mount within a second."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.mount_fixtures import (  # noqa: F401
    REPO,
    WORKBENCH_LISTING,
    env,
    init_data_dir,
    mount,
    mounted,
    needs_fuse,
    start_daemon,
    stop,
    unmount,
    wait_mounted,
)

pytestmark = needs_fuse

DEADLINE = 1.0


def cli(m, *args, input=None):
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, *args],
        input=input,
        capture_output=True,
        env=env(),
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done


def within(predicate, deadline: float = DEADLINE, what: str = "not visible") -> float:
    """Seconds until predicate() held; fails past the deadline."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > deadline:
            raise AssertionError(f"{what}: not within {deadline} s")
        time.sleep(0.01)


def read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def test_a_cli_put_is_visible_in_the_mount_within_a_second(mount):
    existing = mount.path("wb", "outputs", "existing.txt")
    with open(existing, "w") as f:
        f.write("old")
    assert read(existing) == b"old"  # the kernel has its data and attributes cached now
    fresh = mount.path("wb", "outputs", "new", "file.txt")
    assert not os.path.exists(fresh)  # and a negative entry for the new name
    assert not os.path.exists(mount.path("wb", "outputs", "new"))

    cli(mount, "put", "wb:outputs/new/file.txt", "-", input=b"from the CLI\n")
    within(lambda: read(fresh) == b"from the CLI\n")
    assert "new" in os.listdir(mount.path("wb", "outputs"))

    cli(mount, "put", "wb:outputs/existing.txt", "-", input=b"replaced by another process")
    within(lambda: read(existing) == b"replaced by another process")
    assert os.stat(existing).st_size == len(b"replaced by another process")

    cli(mount, "rm", "wb:outputs/new/file.txt")
    within(lambda: not os.path.exists(fresh))
    within(lambda: not os.path.exists(mount.path("wb", "outputs", "new")))

    cli(mount, "mv", "wb:outputs/existing.txt", "wb:outputs/moved.txt")
    within(
        lambda: (
            not os.path.exists(existing)
            and read(mount.path("wb", "outputs", "moved.txt")) == b"replaced by another process"
        )
    )

    cli(mount, "workbench", "create", "later")
    within(lambda: "later" in os.listdir(mount.mountpoint))
    assert sorted(os.listdir(mount.path("later"))) == WORKBENCH_LISTING


def test_a_shell_creating_a_name_another_process_just_published_sees_it_exists(mount):
    """While the kernel still holds the negative entry of a name another process just published
    (the mount's change follower drops it within a second), the shell's open(O_CREAT) reaches the
    mount as a CREATE without a LOOKUP: `set -C` (O_EXCL) must fail and keep their bytes, a plain
    `>` must replace them (no EEXIST at close). Each name is looked up last right before."""
    outputs = mount.path("wb", "outputs")
    for round in range(3):
        f, g = f"f{round}", f"g{round}"
        assert not os.path.exists(os.path.join(outputs, f))  # the negative entry, the mount's last lookup
        cli(mount, "put", f"wb:outputs/{f}", "-", input=b"theirs")
        noclobber = subprocess.run(["bash", "-c", f"set -C; echo mine > {f}"], cwd=outputs, capture_output=True)
        assert noclobber.returncode != 0 and b"cannot overwrite" in noclobber.stderr
        assert read(os.path.join(outputs, f)) == b"theirs"

        assert not os.path.exists(os.path.join(outputs, g))
        cli(mount, "put", f"wb:outputs/{g}", "-", input=b"theirs")
        subprocess.run(["bash", "-c", f"echo mine > {g}"], cwd=outputs, check=True)
        assert read(os.path.join(outputs, g)) == b"mine\n"
        assert cli(mount, "get", f"wb:outputs/{g}").stdout == b"mine\n"


def test_an_append_from_another_process_is_seen_by_a_reader_that_reopens(mount):
    path = mount.path("wb", "logs", "stream.log")
    with open(path, "w") as f:
        f.write("line 1\n")
    assert read(path) == b"line 1\n"
    mount.facade("append.append(root, 'wb', 'logs/stream.log', b'line 2\\n')")
    within(lambda: read(path) == b"line 1\nline 2\n")


def test_two_mounts_of_one_data_directory_see_each_other(tmp_path):
    base = str(tmp_path)
    # A block cache asked for at init (a local store has none otherwise): one directory, one owner.
    init_data_dir(os.path.join(base, "data"), cache_bytes=64 * 1024 * 1024)
    with mounted(base, init=False) as first:
        second_mnt = os.path.join(base, "mnt2")
        os.makedirs(second_mnt)
        log = os.path.join(base, "daemon2.log")
        proc = start_daemon(first.data_dir, second_mnt, log)
        try:
            wait_mounted(second_mnt, proc, log)
            a = first.path("wb", "outputs", "shared.txt")
            b = os.path.join(second_mnt, "wb", "outputs", "shared.txt")
            assert read(b) is None
            with open(a, "w") as f:
                f.write("written by the first mount")
            within(lambda: read(b) == b"written by the first mount")
            with open(b, "w") as f:
                f.write("rewritten by the second")
            within(lambda: read(a) == b"rewritten by the second")
            with open(log) as f:
                assert "reads uncached" in f.read()  # one cache directory, one owner
        finally:
            unmount(second_mnt)
            stop(proc)
        assert not os.path.ismount(second_mnt)


def test_a_directory_another_process_makes_or_removes_is_counted_in_its_parents_links(mount):
    outputs = mount.path("wb", "outputs")
    os.makedirs(os.path.join(outputs, "top"))
    top = os.path.join(outputs, "top")
    assert (os.stat(outputs).st_nlink, os.stat(top).st_nlink) == (3, 2)  # cached by the kernel now
    cli(mount, "put", "wb:outputs/top/new/deeper/file.txt", "-", input=b"x")
    within(lambda: os.stat(top).st_nlink == 3, what="top's link count after a put below a new directory")
    assert os.stat(os.path.join(top, "new")).st_nlink == 3
    cli(mount, "rm", "wb:outputs/top/new/deeper/file.txt")
    within(lambda: os.stat(top).st_nlink == 2, what="top's link count after its implicit directory went")
    assert os.stat(outputs).st_nlink == 3


def test_a_chmod_of_a_directory_by_another_process_shows_after_this_mount_chmoded_it(mount):
    """`mkdir d; chmod 750 d; stat d` here, then `nokvfs chmod 700 wb:outputs/d` in another
    process: `stat d` shows 700 within the follower's deadline, not only once the kernel's
    attribute timeout (10 s) runs out. This mount's own chmod is recognised by the one event it
    causes, so it cannot also swallow the next change of the directory by someone else."""
    d = mount.path("wb", "outputs", "d")
    done = subprocess.run(
        f"mkdir {d} && chmod 750 {d} && touch {d}/a && stat -c %a {d}", shell=True, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "750", done.stderr
    cli(mount, "chmod", "700", "wb:outputs/d")
    within(lambda: oct(os.stat(d).st_mode & 0o7777) == "0o700", what="another process's chmod of the directory")
    for mode in ("755", "711"):  # and again, each time one change of this mount then one of another
        assert subprocess.run(["chmod", mode, d]).returncode == 0 and oct(os.stat(d).st_mode & 0o777) == f"0o{mode}"
        cli(mount, "chmod", "700", "wb:outputs/d")
        within(lambda: oct(os.stat(d).st_mode & 0o7777) == "0o700", what="another process's chmod, again")


def ls(path: str) -> list[str]:
    done = subprocess.run(["ls", "-1", "-f", path], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return sorted(set(done.stdout.split()) - {".", ".."})


def test_ls_right_after_another_process_changed_a_big_directory_shows_the_change(mount):
    # More children than one engine page (255), so the listing pages; `ls` twice first, so the
    # pages this mount keeps of an unchanged directory are there to be (wrongly) reused.
    names = [f"f{i:04d}" for i in range(600)]
    mount.facade(f"for name in {names!r}:\n    namespace.put(root, 'wb', 'outputs/big/' + name, b'x')\n")
    big = mount.path("wb", "outputs", "big")
    within(lambda: os.path.isdir(big) and len(ls(big)) == 600, deadline=10)
    assert ls(big) == names
    assert ls(big) == names

    # Another process adds one name in the middle of a page and removes one from another: the
    # very next `ls` (readdir is never cached by the kernel here) shows both.
    cli(mount, "put", "wb:outputs/big/f0300a", "-", input=b"new")
    assert ls(big) == sorted(names + ["f0300a"])
    cli(mount, "rm", "wb:outputs/big/f0100")
    assert ls(big) == sorted(set(names + ["f0300a"]) - {"f0100"})

    # And this mount's own change, through the mount.
    with open(os.path.join(big, "f0500b"), "w") as f:
        f.write("mine")
    os.unlink(os.path.join(big, "f0200"))
    assert ls(big) == sorted(set(names + ["f0300a", "f0500b"]) - {"f0100", "f0200"})
    assert os.stat(os.path.join(big, "f0500b")).st_size == 4


def test_ls_while_another_process_adds_and_removes_names_lists_each_name_once(mount):
    # 300 names that stay, over two engine pages, while another process keeps committing: every
    # listing shows each of them exactly once, and nothing else but the names being churned.
    stable = [f"s{i:03d}" for i in range(300)]
    mount.facade(f"for name in {stable!r}:\n    namespace.put(root, 'wb', 'outputs/d/' + name, b'x')\n")
    d = mount.path("wb", "outputs", "d")
    within(lambda: os.path.isdir(d) and len(ls(d)) == 300, deadline=10)
    churn = mount.facade_waiting(
        """
        import time
        end = time.monotonic() + 4
        n = 0
        while time.monotonic() < end:
            namespace.put(root, 'wb', f'outputs/d/t{n % 40:03d}', b'y')
            if n >= 20:
                namespace.remove(root, 'wb', f'outputs/d/t{(n - 20) % 40:03d}')
            n += 1
        print(n, flush=True)
        """
    )
    churn.stdin.write(b"go\n")
    churn.stdin.flush()
    listings = 0
    while churn.poll() is None:
        done = subprocess.run(["ls", "-1", "-f", d], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        names = [n for n in done.stdout.split() if n not in (".", "..")]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        assert set(stable) <= set(names)
        assert all(n in stable or (n.startswith("t") and len(n) == 4) for n in names), names
        listings += 1
    out, err = churn.communicate(timeout=60)
    assert churn.returncode == 0, err.decode()
    assert int(out.split()[-1]) > 20 and listings > 5


@pytest.mark.parametrize("mode", [(), ("--write-back",)], ids=["durable", "write-back"])
def test_a_file_this_mount_wrote_is_read_anew_right_after_another_process_replaces_it(tmp_path, mode):
    """What the mount read of a path stays valid across its own later commits (nokvfs.engine
    .owncommits: publications of other files through it), never across another process's. So
    `cat` right after `nokvfs put` has returned shows the new bytes, although the mount was
    publishing other files before and after that commit, and an open(2) of the file it had just
    published read nothing from the shard."""
    with mounted(str(tmp_path), extra_args=mode) as m:
        outputs = m.path("wb", "outputs")
        f = os.path.join(outputs, "f")
        for round in range(4):
            script = f"echo mine{round} > f && cat f > /dev/null && for i in 1 2 3; do echo x > o{round}$i; done"
            subprocess.run(["bash", "-c", script], cwd=outputs, check=True)
            subprocess.run(["sync", "f"], cwd=outputs, check=True)  # write-back: published before theirs
            assert read(f) == f"mine{round}\n".encode()
            cli(m, "put", "wb:outputs/f", "-", input=f"theirs{round}".encode())
            if round % 2:
                # An own commit right after theirs, before the change follower has seen it.
                subprocess.run(["bash", "-c", f"echo y > p{round} && sync p{round}"], cwd=outputs, check=True)
            assert read(f) == f"theirs{round}".encode()  # no waiting for the change follower


def test_write_back_o_excl_refuses_a_name_another_process_published_while_the_publisher_ran(tmp_path):
    """In write-back mode the publisher commits between the kernel's LOOKUP of a name and the
    CREATE that follows it, beside another process's commit of that name: the create finds it
    (`set -C` fails, their bytes stay), whoever committed last."""
    with mounted(str(tmp_path), extra_args=("--write-back",)) as m:
        outputs = m.path("wb", "outputs")
        for round in range(3):
            f = f"f{round}"
            others = f"for i in $(seq 20); do echo x > w{round}_$i; done"
            subprocess.run(["bash", "-c", others], cwd=outputs, check=True)
            assert not os.path.exists(os.path.join(outputs, f))  # the lookup whose miss the create uses
            cli(m, "put", f"wb:outputs/{f}", "-", input=b"theirs")
            noclobber = subprocess.run(["bash", "-c", f"set -C; echo mine > {f}"], cwd=outputs, capture_output=True)
            assert noclobber.returncode != 0 and b"cannot overwrite" in noclobber.stderr
            assert read(os.path.join(outputs, f)) == b"theirs"
