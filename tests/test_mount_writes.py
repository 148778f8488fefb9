"""Writes through the mount: spool, publish at close, append, truncate, mkdir/rmdir, rename, unlink,
conflicts that close(2) reports, and whole trees written with tar."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.mount_fixtures import Mount, env, mount, needs_fuse  # noqa: F401

pytestmark = needs_fuse


def durable(m: Mount, path: str, workbench: str = "wb") -> dict | None:
    """What another process sees at `path`: generation, size, digest, bytes (hex), or None."""
    done = m.facade(
        f"""
        import json, hashlib
        from nokvfs.errors import NotFound
        with root.read() as v:
            try:
                s = listing.stat(v, root, {workbench!r}, {path!r})
            except NotFound:
                s = None
        if s is None or s.entry is None:
            print("null")
        else:
            e = s.entry
            body = reading.read(root, e)
            print(json.dumps(dict(generation=e.generation, size=e.logical_size, dependencies=e.dependency_count,
                                  sha=hashlib.sha256(body).hexdigest(), head=body[:64].hex())))
        """
    )
    return json.loads(done.stdout)


def sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_close_publishes_what_was_written(mount):
    path = mount.path("wb", "outputs", "hello.txt")
    with open(path, "w") as f:
        f.write("hello, world\n")
    seen = durable(mount, "outputs/hello.txt")
    assert seen["generation"] == 1 and seen["sha"] == sha(b"hello, world\n")
    with open(path, "rb") as f:
        assert f.read() == b"hello, world\n"
    # An empty new file is a file too.
    open(mount.path("wb", "outputs", "empty"), "wb").close()
    assert durable(mount, "outputs/empty")["size"] == 0
    subprocess.run(["touch", mount.path("wb", "outputs", "touched")], check=True)
    assert durable(mount, "outputs/touched")["size"] == 0


def test_shell_redirect_publishes_one_revision(mount):
    path = mount.path("wb", "logs", "run.log")
    subprocess.run(["sh", "-c", f"echo first > '{path}'"], check=True)
    assert durable(mount, "logs/run.log")["generation"] == 1
    subprocess.run(["sh", "-c", f"echo second >> '{path}'"], check=True)
    seen = durable(mount, "logs/run.log")
    assert seen["generation"] == 2 and seen["sha"] == sha(b"first\nsecond\n")


def test_rewrite_in_place_keeps_the_bytes_it_did_not_touch(mount):
    body = random.Random(1).randbytes(6 * 1024 * 1024)
    path = mount.path("wb", "outputs", "in-place.bin")
    with open(path, "wb") as f:
        f.write(body)
    with open(path, "r+b") as f:  # no O_TRUNC: the spool starts as the current body
        f.seek(5 * 1024 * 1024)
        f.write(b"PATCH")
    expected = body[: 5 * 1024 * 1024] + b"PATCH" + body[5 * 1024 * 1024 + 5 :]
    assert durable(mount, "outputs/in-place.bin")["sha"] == sha(expected)
    with open(path, "rb") as f:
        assert f.read() == expected
    with open(path, "wb") as f:  # O_TRUNC replaces everything
        f.write(b"short")
    assert durable(mount, "outputs/in-place.bin")["sha"] == sha(b"short")
    with open(path, "r+b") as f:  # opened for writing, nothing written: nothing published
        assert f.read() == b"short"
    assert durable(mount, "outputs/in-place.bin")["generation"] == 3


def test_o_append_goes_through_the_append_pipeline(mount):
    base = random.Random(2).randbytes(4 * 1024 * 1024 + 10)
    path = mount.path("wb", "logs", "growing.log")
    with open(path, "wb") as f:
        f.write(base)
    with open(path, "ab") as f:
        f.write(b"tail-1\n")
    with open(path, "ab") as f:
        f.write(b"tail-2\n")
    seen = durable(mount, "logs/growing.log")
    assert seen["sha"] == sha(base + b"tail-1\ntail-2\n")
    assert seen["dependencies"] == 2  # the last append reuses the blocks of both earlier revisions
    with open(path, "rb") as f:
        assert f.read() == base + b"tail-1\ntail-2\n"
    with open(path, "a+b") as f:  # reading through an append handle fills it first
        f.write(b"tail-3\n")
        f.seek(0)
        assert f.read() == base + b"tail-1\ntail-2\ntail-3\n"
    assert durable(mount, "logs/growing.log")["sha"] == sha(base + b"tail-1\ntail-2\ntail-3\n")


def test_truncate_by_path_and_by_descriptor(mount):
    path = mount.path("wb", "outputs", "t.bin")
    with open(path, "wb") as f:
        f.write(b"0123456789")
    os.truncate(path, 4)
    assert durable(mount, "outputs/t.bin")["sha"] == sha(b"0123")
    with open(path, "r+b") as f:
        f.truncate(8)
    assert durable(mount, "outputs/t.bin")["sha"] == sha(b"0123\0\0\0\0")
    assert os.stat(path).st_size == 8


def test_mkdir_stores_the_directory_and_rmdir_removes_it(mount):
    directory = mount.path("wb", "outputs", "new", "deeper")
    os.makedirs(directory)
    assert os.path.isdir(directory)
    assert "new" in os.listdir(mount.path("wb", "outputs"))
    assert durable(mount, "outputs/new/deeper") is None  # a directory, not a file
    # Stored at mkdir (its marker), so another process lists it.
    ls = [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", mount.data_dir, "ls", "wb:outputs/new"]
    assert "deeper" in subprocess.run(ls, capture_output=True, text=True, env=env(), check=True).stdout
    with open(os.path.join(directory, "f.txt"), "w") as f:
        f.write("x")
    assert durable(mount, "outputs/new/deeper/f.txt")["size"] == 1
    with pytest.raises(OSError) as exc:
        os.rmdir(directory)
    assert exc.value.errno == errno.ENOTEMPTY
    os.unlink(os.path.join(directory, "f.txt"))
    assert os.path.isdir(directory)  # the shell standing in it does not lose it
    os.rmdir(directory)
    os.rmdir(mount.path("wb", "outputs", "new"))
    assert os.listdir(mount.path("wb", "outputs")) == []
    with pytest.raises(FileExistsError):
        os.mkdir(mount.path("wb", "outputs"))


def test_rename_inside_a_workbench_is_one_command(mount):
    src = mount.path("wb", "outputs", "a.txt")
    dst = mount.path("wb", "outputs", "sub", "b.txt")
    with open(src, "w") as f:
        f.write("moving")
    os.mkdir(mount.path("wb", "outputs", "sub"))
    ino = os.stat(src).st_ino
    os.rename(src, dst)
    assert not os.path.exists(src)
    assert os.stat(dst).st_ino == ino  # the kernel keeps the inode of a renamed file
    assert durable(mount, "outputs/a.txt") is None
    assert durable(mount, "outputs/sub/b.txt")["sha"] == sha(b"moving")
    # Replacing: the editor's save (write a temporary file, rename it over the original).
    with open(mount.path("wb", "outputs", "sub", ".b.txt.swp"), "w") as f:
        f.write("saved")
    os.replace(mount.path("wb", "outputs", "sub", ".b.txt.swp"), dst)
    assert durable(mount, "outputs/sub/b.txt")["sha"] == sha(b"saved")
    assert sorted(os.listdir(mount.path("wb", "outputs", "sub"))) == ["b.txt"]
    # A file still open for writing can be renamed: it is published under its new name.
    fd = os.open(mount.path("wb", "outputs", "pending"), os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"late")
    os.rename(mount.path("wb", "outputs", "pending"), mount.path("wb", "outputs", "landed"))
    os.close(fd)
    assert durable(mount, "outputs/landed")["sha"] == sha(b"late")
    assert durable(mount, "outputs/pending") is None
    # A directory holding files moves by copy (EXDEV from rename(2), which mv handles).
    subprocess.run(["mv", mount.path("wb", "outputs", "sub"), mount.path("wb", "outputs", "moved")], check=True)
    assert durable(mount, "outputs/moved/b.txt")["sha"] == sha(b"saved")
    assert not os.path.exists(mount.path("wb", "outputs", "sub"))


def test_unlink_removes_the_path(mount):
    path = mount.path("wb", "scripts", "gone.sh")
    with open(path, "w") as f:
        f.write("echo")
    os.unlink(path)
    assert not os.path.exists(path)
    assert durable(mount, "scripts/gone.sh") is None
    with pytest.raises(FileNotFoundError):
        os.unlink(path)
    # Writes to a file unlinked while open vanish with it (as on any POSIX filesystem).
    fd = os.open(mount.path("wb", "scripts", "tmp"), os.O_RDWR | os.O_CREAT)
    os.unlink(mount.path("wb", "scripts", "tmp"))
    os.write(fd, b"scratch")
    os.close(fd)
    assert durable(mount, "scripts/tmp") is None


def test_two_creators_of_one_new_name_the_second_close_fails_with_eexist(mount):
    path = mount.path("wb", "outputs", "new.txt")
    other = mount.facade_waiting("namespace.put(root, 'wb', 'outputs/new.txt', b'another process won')")
    first = os.open(path, os.O_WRONLY | os.O_CREAT)
    os.write(first, b"one")
    _, err = other.communicate(b"go\n", timeout=60)
    assert other.returncode == 0, err
    with pytest.raises(OSError) as exc:
        os.close(first)
    assert exc.value.errno == errno.EEXIST
    assert durable(mount, "outputs/new.txt")["sha"] == sha(b"another process won")


def test_a_tree_extracted_with_tar_round_trips(mount, tmp_path):
    rng = random.Random(3)
    source = tmp_path / "source"
    for index in range(60):
        depth = rng.randrange(0, 4)
        directory = source.joinpath(*[f"d{rng.randrange(3)}" for _ in range(depth)])
        directory.mkdir(parents=True, exist_ok=True)
        size = rng.choice([0, 1, 100, 4096, 65536, 300_000])
        (directory / f"file{index}.dat").write_bytes(rng.randbytes(size))
    (source / "big.bin").write_bytes(rng.randbytes(9 * 1024 * 1024))
    archive = tmp_path / "tree.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(source, arcname="tree")
    target = mount.path("wb", "outputs")
    subprocess.run(["tar", "-xf", str(archive), "-C", target], check=True)
    assert subprocess.run(["diff", "-r", str(source), os.path.join(target, "tree")]).returncode == 0
    copy = tmp_path / "back"
    shutil.copytree(os.path.join(target, "tree"), copy)
    assert subprocess.run(["diff", "-r", str(source), str(copy)]).returncode == 0
    if shutil.which("rsync"):
        subprocess.run(["rsync", "-a", str(source) + "/", mount.path("wb", "input", "synced") + "/"], check=True)
        assert subprocess.run(["diff", "-r", str(source), mount.path("wb", "input", "synced")]).returncode == 0
        (source / "file0.dat").write_bytes(b"changed since the first sync")
        (source / "big.bin").unlink()
        subprocess.run(
            ["rsync", "-a", "--delete", str(source) + "/", mount.path("wb", "input", "synced") + "/"], check=True
        )
        assert subprocess.run(["diff", "-r", str(source), mount.path("wb", "input", "synced")]).returncode == 0
    # cp -r into the mount too
    subprocess.run(["cp", "-r", str(source), mount.path("wb", "scripts", "copied")], check=True)
    assert subprocess.run(["diff", "-r", str(source), mount.path("wb", "scripts", "copied")]).returncode == 0


def test_python_open_modes(mount):
    path = mount.path("wb", "metadata", "notes.json")
    with open(path, "x") as f:
        json.dump({"a": 1}, f)
    with pytest.raises(FileExistsError):
        open(path, "x")
    with open(path, "r+") as f:
        data = json.load(f)
        data["b"] = 2
        f.seek(0)
        f.truncate()
        json.dump(data, f)
    with open(path) as f:
        assert json.load(f) == {"a": 1, "b": 2}
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"\n")
        f.flush()
        os.fsync(f.fileno())  # fsync publishes
        assert durable(mount, "metadata/notes.json")["sha"] == sha(b'{"a": 1, "b": 2}\n')


def test_editors_save_through_the_mount(mount):
    path = mount.path("wb", "scripts", "conf.txt")
    with open(path, "w") as f:
        f.write("alpha\nbeta\n")
    subprocess.run(["sed", "-i", "s/beta/gamma/", path], check=True)  # temp file + rename over
    assert durable(mount, "scripts/conf.txt")["sha"] == sha(b"alpha\ngamma\n")
    if shutil.which("vim"):
        subprocess.run(
            ["vim", "-u", "NONE", "-N", "-es", "-c", "%s/alpha/delta/", "-c", "wq", path], check=True, timeout=60
        )
        assert durable(mount, "scripts/conf.txt")["sha"] == sha(b"delta\ngamma\n")
    assert os.listdir(mount.path("wb", "scripts")) == ["conf.txt"]  # no temporary or swap files left


# --- blocks hashed while written ----------------------------------------------------------------


def _sha256_of(path: str) -> str:
    done = subprocess.run(["sha256sum", path], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split()[0]


@pytest.mark.parametrize("extra_args", [(), ("--write-back",)], ids=["durable", "write-back"])
def test_dd_in_chunks_then_a_middle_chunk_overwritten_reads_back_after_remount(tmp_path, extra_args):
    """20 MiB written with dd in 1 MiB chunks (hashed as it arrives), then one middle chunk
    overwritten in place by dd conv=notrunc (a write back over hashed blocks, inside the third
    4 MiB block): after a remount the file is byte for byte the local copy's."""
    from tests.mount_fixtures import mounted

    local = tmp_path / "local.bin"
    patch = tmp_path / "patch.bin"
    subprocess.run(["dd", "if=/dev/urandom", f"of={local}", "bs=1M", "count=20", "status=none"], check=True)
    patch.write_bytes(os.urandom(1024 * 1024))
    base = str(tmp_path / "m")
    os.makedirs(base)
    with mounted(base, extra_args=extra_args) as m:
        target = m.path("wb", "outputs", "dd.bin")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        subprocess.run(["dd", f"if={local}", f"of={target}", "bs=1M", "status=none"], check=True, timeout=120)
        for path in (str(local), target):
            subprocess.run(
                ["dd", f"if={patch}", f"of={path}", "bs=1M", "seek=9", "count=1", "conv=notrunc", "status=none"],
                check=True,
                timeout=120,
            )
        assert _sha256_of(target) == _sha256_of(str(local))
    with mounted(base, init=False, extra_args=extra_args) as m:
        target = m.path("wb", "outputs", "dd.bin")
        assert os.path.getsize(target) == 20 * 1024 * 1024
        assert _sha256_of(target) == _sha256_of(str(local))
        assert durable(m, "outputs/dd.bin")["sha"] == _sha256_of(str(local))


def _disk_bytes(directory: str) -> int:
    return sum(
        os.lstat(os.path.join(top, name)).st_blocks * 512 for top, _, names in os.walk(directory) for name in names
    )


def test_a_sparse_file_made_by_truncate_and_dd_seek_takes_no_room_in_the_store(tmp_path):
    """`truncate -s 256M` then a few bytes put in the middle and at the end with dd: the file
    reads back byte for byte after a remount, and the data directory holds the written bytes,
    not 256 MiB of zeros (before 2026-12-05 every zero was written to the store)."""
    from tests.mount_fixtures import mounted

    size = 256 * 1024 * 1024
    local = tmp_path / "local.bin"
    base = str(tmp_path / "m")
    os.makedirs(base)
    with mounted(base) as m:
        target = m.path("wb", "outputs", "disk.img")
        before = _disk_bytes(m.data_dir)
        for path in (str(local), target):
            subprocess.run(["truncate", "-s", str(size), path], check=True, timeout=120)
            for seek in (100 * 1024 * 1024, size - 5):
                subprocess.run(
                    ["dd", "of=" + path, "bs=1", f"seek={seek}", "conv=notrunc", "status=none"],
                    input=b"data\n",
                    check=True,
                    timeout=120,
                )
        assert _sha256_of(target) == _sha256_of(str(local))
        added = _disk_bytes(m.data_dir) - before
        assert added < 32 * 1024 * 1024, f"the data directory grew by {added} bytes for a sparse file"
    with mounted(base, init=False) as m:
        target = m.path("wb", "outputs", "disk.img")
        assert os.path.getsize(target) == size
        with open(target, "rb") as f:
            f.seek(100 * 1024 * 1024)
            assert f.read(5) == b"data\n"
        assert _sha256_of(target) == _sha256_of(str(local))
    fsck = [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, "fsck"]
    assert subprocess.run(fsck, capture_output=True, env=env()).returncode == 0


def test_writes_out_of_order_truncates_and_appends_in_one_open_publish_the_file(mount, tmp_path):
    """Whatever order one descriptor's writes and truncates come in, the published body is the
    file the descriptor saw: sequential blocks, a shrink into a block, a hole, a write back over
    a hashed block, and then appends through a second (O_APPEND) open."""
    path = mount.path("wb", "outputs", "mixed.bin")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mib = 1024 * 1024
    expected = bytearray()

    def put(fd, offset, data):
        os.pwrite(fd, data, offset)
        if offset > len(expected):
            expected.extend(bytes(offset - len(expected)))
        expected[offset : offset + len(data)] = data

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(9):
            put(fd, i * mib, os.urandom(mib))
        os.ftruncate(fd, 5 * mib + 3)
        del expected[5 * mib + 3 :]
        put(fd, 6 * mib, os.urandom(mib + 11))  # a hole of zeros before it
        put(fd, mib + 100, os.urandom(4096))
    finally:
        os.close(fd)
    with open(path, "ab") as f:
        tail = os.urandom(3 * mib + 5)
        f.write(tail)
        expected.extend(tail)
    with open(path, "rb") as f:
        assert f.read() == bytes(expected)
    import hashlib

    assert durable(mount, "outputs/mixed.bin")["sha"] == hashlib.sha256(expected).hexdigest()
