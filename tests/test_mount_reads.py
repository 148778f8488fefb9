"""The mount as readers see it: the layout, truthful attributes, stable inodes, bytes, listings."""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
import subprocess
import time

import pytest

from nokvfs.schema.ids import uuid7_unix_ms
from tests.mount_fixtures import (  # noqa: F401
    WORKBENCH_LISTING,
    Mount,
    init_data_dir,
    mount,
    mounted,
    needs_fuse,
    populate_many,
)

pytestmark = needs_fuse

SECTIONS = ["input", "logs", "metadata", "outputs", "scripts"]


def facade_entry(m: Mount, workbench: str, path: str) -> dict:
    done = m.facade(
        f"""
        import json
        with root.read() as v:
            s = listing.stat(v, root, {workbench!r}, {path!r})
        e = s.entry
        print(json.dumps(dict(generation=e.generation, revision=e.artifact_revision_id.hex(), size=e.logical_size)))
        """
    )
    import json

    return json.loads(done.stdout)


def test_root_lists_visible_workbenches_and_never_staging_ones(tmp_path):
    with mounted(str(tmp_path), workbenches=("alpha", "beta")) as m:
        # A create that dies after staging leaves a Staging row: it must never appear.
        m.facade(
            """
            real = root.apply
            calls = []
            def apply(build, **kw):
                calls.append(1)
                if len(calls) == 2:
                    raise SystemExit(0)  # the process dies between staging and publication
                return real(build, **kw)
            root.apply = apply
            workbench.create(root, "staged")
            """
        )
        assert sorted(os.listdir(m.mountpoint)) == ["alpha", "beta"]
        assert not os.path.exists(m.path("staged"))
        os.mkdir(m.path("gamma"))  # mkdir at the root creates a workbench
        assert sorted(os.listdir(m.mountpoint)) == ["alpha", "beta", "gamma"]
        assert sorted(os.listdir(m.path("gamma"))) == WORKBENCH_LISTING
        done = m.facade(
            """
            with root.read() as v:
                print(sorted(w.workbench_id for w in workbench.list_visible(v, root.root_id)))
            """
        )
        assert done.stdout.strip() == "['alpha', 'beta', 'gamma']"


def test_a_workbench_always_shows_its_five_sections(mount):
    assert sorted(os.listdir(mount.path("wb"))) == WORKBENCH_LISTING
    for section in SECTIONS:
        st = os.stat(mount.path("wb", section))
        assert stat.S_ISDIR(st.st_mode)
        assert os.listdir(mount.path("wb", section)) == []
    assert not os.path.exists(mount.path("wb", "elsewhere"))


def test_attributes_are_truthful(mount):
    body = os.urandom(5 * 1024 * 1024 + 123)
    mount.facade("namespace.put(root, 'wb', 'outputs/data/blob.bin', data)", data=body)
    entry = facade_entry(mount, "wb", "outputs/data/blob.bin")
    st = os.stat(mount.path("wb", "outputs", "data", "blob.bin"))
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
    assert st.st_size == len(body) == entry["size"]
    assert st.st_blocks == (len(body) + 511) // 512
    created_ms = uuid7_unix_ms(bytes.fromhex(entry["revision"]))
    assert st.st_mtime_ns == created_ms * 1_000_000
    directory = os.stat(mount.path("wb", "outputs", "data"))
    assert stat.S_ISDIR(directory.st_mode) and directory.st_size == 0
    assert os.getxattr(mount.path("wb", "outputs", "data", "blob.bin"), "user.nokvfs.generation") == b"1"
    assert (
        os.getxattr(mount.path("wb", "outputs", "data", "blob.bin"), "user.nokvfs.revision").decode()
        == entry["revision"]
    )
    assert os.listxattr(mount.path("wb", "outputs", "data", "blob.bin")) == []
    stats = os.statvfs(mount.mountpoint)
    assert stats.f_blocks > 0 and stats.f_bavail <= stats.f_blocks and stats.f_namemax == 255


def test_inode_numbers_are_stable_across_remounts(tmp_path):
    base = str(tmp_path)
    paths = [("wb",), ("wb", "outputs"), ("wb", "outputs", "a"), ("wb", "outputs", "a", "f.txt"), ("wb", "logs")]
    with mounted(base) as m:
        os.makedirs(m.path("wb", "outputs", "a"))
        with open(m.path("wb", "outputs", "a", "f.txt"), "w") as f:
            f.write("x")
        first = {p: os.stat(m.path(*p)).st_ino for p in paths}
    assert len(set(first.values())) == len(paths)
    with mounted(base, init=False) as m:
        second = {p: os.stat(m.path(*p)).st_ino for p in paths}
        listed = {e.name: e.inode() for e in os.scandir(m.path("wb", "outputs", "a"))}
    assert first == second
    assert listed == {"f.txt": first[("wb", "outputs", "a", "f.txt")]}


def test_reads_return_exact_bytes_for_whole_and_random_ranges(mount):
    body = random.Random(7).randbytes(9 * 1024 * 1024 + 4321)  # three 4 MiB blocks
    mount.facade("namespace.put(root, 'wb', 'input/big.bin', data)", data=body)
    path = mount.path("wb", "input", "big.bin")
    with open(path, "rb") as f:
        assert f.read() == body
    rng = random.Random(11)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(200):
            offset = rng.randrange(0, len(body))
            size = rng.choice([1, 17, 4096, 65536, 1 << 20, 5 << 20])
            assert os.pread(fd, size, offset) == body[offset : offset + size]
        assert os.pread(fd, 10, len(body)) == b""
    finally:
        os.close(fd)


def test_an_open_reader_keeps_its_revision(mount):
    mount.facade("namespace.put(root, 'wb', 'outputs/r.txt', b'A' * 100000)")
    path = mount.path("wb", "outputs", "r.txt")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 0) == b"A" * 10
        mount.facade("namespace.put(root, 'wb', 'outputs/r.txt', b'B' * 50)")
        deadline = time.monotonic() + 10
        while os.stat(path).st_size != 50 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the change feed has been followed (well under a second idle)
        assert os.fstat(fd).st_size == 100000
        assert os.pread(fd, 10, 50000) == b"A" * 10
        with open(path, "rb") as f:
            assert f.read() == b"B" * 50
    finally:
        os.close(fd)
    assert os.stat(path).st_size == 50


def test_a_directory_of_many_children_lists_completely_in_pages(tmp_path):
    base = str(tmp_path)
    init_data_dir(os.path.join(base, "data"))
    from nokvfs.workspace import datadir

    root = datadir.open_root(os.path.join(base, "data"), verify=False)
    try:
        names = populate_many(root, "wb", "outputs/many", 20000)
        populate_many(root, "wb", "outputs/many/sub", 3, prefix="g")
    finally:
        root.close()  # closes its block cache too
    with mounted(base, init=False) as m:
        rss_before = _rss_kib(m.proc.pid)
        listed = [e.name for e in os.scandir(m.path("wb", "outputs", "many"))]
        rss_after = _rss_kib(m.proc.pid)
        assert sorted(listed) == sorted(names + ["sub"])
        assert len(listed) == len(set(listed))
        assert sorted(os.listdir(m.path("wb", "outputs", "many", "sub"))) == ["g000000", "g000001", "g000002"]
        # Bounded: the daemon keeps only what the kernel references (a few hundred bytes a child).
        assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)
        # A listing restarted in the middle (seekdir/telldir through Python's os.scandir is not
        # exposed, so use ls twice) gives the same set again.
        out = subprocess.run(["ls", "-f", m.path("wb", "outputs", "many")], capture_output=True, text=True, check=True)
        assert len([n for n in out.stdout.split() if n not in (".", "..")]) == 20001


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_ordinary_tools_read_the_mount(mount, tmp_path):
    tree = {
        "scripts/run.sh": b"#!/bin/sh\necho needle\n",
        "scripts/lib/util.py": b"def f():\n    return 'needle'\n",
        "logs/a.log": b"nothing here\n",
        "logs/deep/er/b.log": b"a needle in a haystack\n",
        "input/empty": b"",
    }
    code = "\n".join(f"namespace.put(root, 'wb', {p!r}, {b!r})" for p, b in tree.items())
    mount.facade(code)
    out = subprocess.run(["grep", "-rl", "needle", mount.path("wb")], capture_output=True, text=True)
    assert sorted(os.path.relpath(p, mount.path("wb")) for p in out.stdout.split()) == [
        "logs/deep/er/b.log",
        "scripts/lib/util.py",
        "scripts/run.sh",
    ]
    copy = str(tmp_path / "copy")
    shutil.copytree(mount.path("wb"), copy)
    for path, body in tree.items():
        with open(os.path.join(copy, path), "rb") as f:
            assert f.read() == body
    assert subprocess.run(["diff", "-r", mount.path("wb"), copy]).returncode == 0
    listing = subprocess.run(["ls", "-lR", mount.path("wb")], capture_output=True, text=True, check=True).stdout
    assert "run.sh" in listing and "b.log" in listing


def test_ls_a_lists_dot_and_dot_dot_as_a_local_disk_does(mount):
    outputs = mount.path("wb", "outputs")
    os.makedirs(os.path.join(outputs, "d", "sub"))
    for name in ("f", ".hidden"):
        with open(os.path.join(outputs, "d", name), "w") as f:
            f.write(name)
    for where in (mount.path(), mount.path("wb"), outputs, os.path.join(outputs, "d")):
        names = subprocess.run(["ls", "-a", where], capture_output=True, text=True, check=True).stdout.split()
        assert names[:2] == [".", ".."] and names.count(".") == 1 and names.count("..") == 1
    ls = subprocess.run(["ls", "-ai", os.path.join(outputs, "d")], capture_output=True, text=True, check=True)
    inodes = {name: int(ino) for ino, name in (line.split() for line in ls.stdout.splitlines())}
    assert inodes["."] == os.stat(os.path.join(outputs, "d")).st_ino
    assert inodes[".."] == os.stat(outputs).st_ino
    assert sorted(inodes) == [".", "..", ".hidden", "f", "sub"]
    # What lists without them still does: ls -A, os.listdir, find, and the shell's dot glob.
    assert subprocess.run(["ls", "-A", os.path.join(outputs, "d")], capture_output=True, text=True).stdout.split() == [
        ".hidden",
        "f",
        "sub",
    ]
    assert sorted(os.listdir(os.path.join(outputs, "d"))) == [".hidden", "f", "sub"]
    found = subprocess.run(["find", "."], cwd=os.path.join(outputs, "d"), capture_output=True, text=True).stdout
    assert sorted(found.split()) == [".", "./.hidden", "./f", "./sub"]
    glob = subprocess.run(["bash", "-c", "echo .*"], cwd=os.path.join(outputs, "d"), capture_output=True, text=True)
    local = os.path.join(os.path.dirname(mount.mountpoint), "local")
    os.makedirs(local)
    open(os.path.join(local, ".hidden"), "w").close()
    expected = subprocess.run(["bash", "-c", "echo .*"], cwd=local, capture_output=True, text=True)
    assert glob.stdout == expected.stdout


def test_lookup_of_missing_names(mount):
    for missing in (("nope",), ("wb", "nope"), ("wb", "outputs", "nope"), ("wb", "outputs", "a\\b")):
        with pytest.raises(FileNotFoundError):
            os.stat(mount.path(*missing))
    with pytest.raises(OSError) as exc:
        os.listdir(mount.path("wb", "outputs", "nope"))
    assert exc.value.errno == errno.ENOENT


def test_a_small_file_this_mount_just_published_is_read_back_from_memory(mount):
    """`echo > f; cat f` (the default mode drops the file's pages at the first stat after the
    write): the published bytes are kept with their revision, so the read fetches nothing from
    the block cache or the store. A file replaced by another process is fetched as usual."""
    from tests.test_mount_status import status

    path = mount.path("wb", "outputs", "fresh.txt")
    subprocess.run(["bash", "-c", f"echo 'just written' > {path}"], check=True)
    before = status(mount)["memory_blocks"]
    done = subprocess.run(["cat", path], capture_output=True, check=True)
    assert done.stdout == b"just written\n"
    after = status(mount)["memory_blocks"]
    assert after["fetched"] == before["fetched"] and after["hits"] > before["hits"]
    mount.facade("namespace.put(root, 'wb', 'outputs/fresh.txt', b'from another process')")
    done = subprocess.run(["cat", path], capture_output=True, check=True)
    assert done.stdout == b"from another process"
    assert status(mount)["memory_blocks"]["fetched"] == after["fetched"] + 1


def test_files_copied_in_are_read_back_from_the_pages_they_were_written_with(mount, tmp_path):
    """`cp` of small files, then `stat` and `cat` of them (a build writing objects a later step
    reads): the kernel keeps the pages a file was written with unless the mtime a stat(2) shows
    is new to it, and a file created and written within one tick of the clock keeps the mtime
    its creation showed (spools.modified_ns), so `fincore` finds its pages after the stat.
    Before, every stat after the write dropped them and every first read went to the daemon."""
    source = tmp_path / "objects"
    source.mkdir()
    expected = {}
    for number in range(40):
        expected[f"o{number}.bin"] = body = random.randbytes(8192)  # two whole pages
        (source / f"o{number}.bin").write_bytes(body)
    target = mount.path("wb", "outputs", "build")
    os.mkdir(target)
    subprocess.run(["cp", *sorted(str(p) for p in source.iterdir()), target], check=True)
    paths = [os.path.join(target, name) for name in sorted(expected)]
    subprocess.run(["stat", *paths], check=True, capture_output=True)
    shown = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,FILE", *paths],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    resident = [line for line in shown if line and line.split(" ", 1)[0] == "8192"]
    # A file whose creation and write straddle a tick shows a new mtime and is read from the
    # daemon: most are not, so some must be kept (none were before).
    assert resident, shown
    for name, body in expected.items():
        assert subprocess.run(["cat", os.path.join(target, name)], capture_output=True, check=True).stdout == body


def test_stat_between_two_writes_shows_the_mtime_move(mount):
    """A descriptor written, stat(1)ed, written again: each stat shows a later mtime than the
    one before (a stat that has seen an mtime makes the next write move it, within one tick of
    the clock too), and the closed file keeps the last."""
    path = mount.path("wb", "outputs", "stamped.txt")
    script = (
        f"exec 3>{path}; printf a >&3; stat -c %.9Y {path}; printf b >&3; stat -c %.9Y {path}; "
        f"printf c >&3; stat -c %.9Y {path}; exec 3>&-; stat -c %.9Y {path}"
    )
    done = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True)
    first, second, third, closed = (int(line.replace(".", "")) for line in done.stdout.split())
    assert first < second < third == closed, done.stdout
    with open(path, "rb") as f:
        assert f.read() == b"abc"
