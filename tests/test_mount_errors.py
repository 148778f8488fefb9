"""Every refused operation answers its errno -- and the daemon keeps serving afterwards."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import time

import pytest

from tests.mount_fixtures import WORKBENCH_LISTING, mount, mounted, needs_fuse  # noqa: F401

pytestmark = needs_fuse


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as exc:
        call(*args)
    return exc.value.errno


@pytest.fixture
def two(tmp_path):
    with mounted(str(tmp_path), workbenches=("wb", "other")) as m:
        with open(m.path("wb", "outputs", "f.txt"), "w") as f:
            f.write("x")
        yield m


def test_unsupported_calls_are_refused_with_their_documented_errno(two):
    """Hard links and special files are not artifacts (EPERM, as link(2) and mknod(2) answer on a
    filesystem that cannot make them); extended attributes other than the index fields are not
    stored (ENOTSUP)."""
    f = two.path("wb", "outputs", "f.txt")
    assert errno_of(os.link, f, two.path("wb", "outputs", "hard")) == errno.EPERM
    assert errno_of(os.mkfifo, two.path("wb", "outputs", "fifo")) == errno.EPERM
    assert errno_of(os.mknod, two.path("wb", "outputs", "dev"), stat.S_IFCHR | 0o600, os.makedev(1, 3)) == errno.EPERM
    assert errno_of(os.setxattr, f, "user.note", b"v") == errno.ENOTSUP
    assert errno_of(os.removexattr, f, "user.note") == errno.ENOTSUP
    assert errno_of(os.getxattr, f, "user.missing") == errno.ENODATA
    assert sorted(os.listdir(two.path("wb", "outputs"))) == ["f.txt"]


def test_rename_across_workbenches_is_exdev(two):
    assert errno_of(os.rename, two.path("wb", "outputs", "f.txt"), two.path("other", "outputs", "f.txt")) == errno.EXDEV
    # mv copes with EXDEV by copying.
    subprocess.run(["mv", two.path("wb", "outputs", "f.txt"), two.path("other", "outputs", "f.txt")], check=True)
    with open(two.path("other", "outputs", "f.txt")) as f:
        assert f.read() == "x"
    assert not os.path.exists(two.path("wb", "outputs", "f.txt"))


def test_sections_and_workbenches_cannot_be_removed_renamed_or_shadowed(two):
    section = two.path("wb", "outputs")
    assert errno_of(os.rmdir, section) == errno.EPERM
    assert errno_of(os.rename, section, two.path("wb", "outputs2")) == errno.EPERM
    # Replacing a section by a file: the kernel itself answers EISDIR before asking the daemon.
    assert errno_of(os.rename, two.path("wb", "outputs", "f.txt"), two.path("wb", "logs")) in (
        errno.EISDIR,
        errno.EPERM,
    )
    os.mkdir(two.path("wb", "outputs", "empty"))
    assert errno_of(os.rename, two.path("wb", "outputs", "empty"), two.path("wb", "logs")) == errno.EPERM
    assert errno_of(os.rmdir, two.path("wb")) == errno.EPERM
    assert errno_of(os.rename, two.path("wb"), two.path("renamed")) == errno.EPERM
    assert errno_of(os.mkdir, two.path("wb", "outputs")) == errno.EEXIST
    assert errno_of(os.mkdir, two.path("wb", "elsewhere")) == errno.EPERM
    assert errno_of(open, two.path("wb", "loose.txt"), "w") == errno.EPERM
    assert errno_of(open, two.path("at-the-root.txt"), "w") == errno.EPERM
    assert errno_of(os.unlink, two.path("wb", "outputs")) in (errno.EISDIR, errno.EPERM)
    assert sorted(os.listdir(two.path("wb"))) == WORKBENCH_LISTING


def test_reserved_manifests_accept_no_direct_writes(two):
    for name in ("run_manifest.json", "restore_manifest.json"):
        path = two.path("wb", "metadata", name)
        assert errno_of(open, path, "w") == errno.EPERM
        assert errno_of(os.mkdir, path) == errno.EPERM
        assert errno_of(os.rename, two.path("wb", "outputs", "f.txt"), path) == errno.EPERM
    with open(two.path("wb", "metadata", "other.json"), "w") as f:  # the rest of metadata/ is open
        f.write("{}")


def test_missing_and_wrong_kind(two):
    assert errno_of(os.unlink, two.path("wb", "outputs", "missing")) == errno.ENOENT
    assert errno_of(os.rmdir, two.path("wb", "outputs", "missing")) == errno.ENOENT
    assert errno_of(os.rename, two.path("wb", "outputs", "missing"), two.path("wb", "outputs", "b")) == errno.ENOENT
    assert errno_of(os.rmdir, two.path("wb", "outputs", "f.txt")) == errno.ENOTDIR
    assert errno_of(os.listdir, two.path("wb", "outputs", "f.txt")) == errno.ENOTDIR
    assert errno_of(open, two.path("wb", "outputs", "f.txt", "below"), "w") == errno.ENOTDIR
    assert errno_of(os.mkdir, two.path("nope", "x")) == errno.ENOENT
    os.mkdir(two.path("wb", "outputs", "d"))
    assert errno_of(open, two.path("wb", "outputs", "d"), "w") == errno.EISDIR
    assert errno_of(os.rename, two.path("wb", "outputs", "f.txt"), two.path("wb", "outputs", "d")) == errno.EISDIR
    assert errno_of(os.mkdir, two.path("not a valid workbench")) == errno.EINVAL
    assert errno_of(open, two.path("wb", "outputs", "back\\slash"), "w") == errno.EINVAL
    # ... and the daemon is still serving.
    with open(two.path("wb", "outputs", "f.txt")) as f:
        assert f.read() == "x"


def test_a_read_only_mount_refuses_every_change(tmp_path):
    base = str(tmp_path)
    with mounted(base) as m:
        with open(m.path("wb", "outputs", "f.txt"), "w") as f:
            f.write("x")
    with mounted(base, init=False, extra_args=("--read-only",)) as m:
        f = m.path("wb", "outputs", "f.txt")
        with open(f) as handle:
            assert handle.read() == "x"
        assert errno_of(open, f, "w") == errno.EROFS
        assert errno_of(open, f, "a") == errno.EROFS
        assert errno_of(open, m.path("wb", "outputs", "new"), "w") == errno.EROFS
        assert errno_of(os.unlink, f) == errno.EROFS
        assert errno_of(os.mkdir, m.path("wb", "outputs", "d")) == errno.EROFS
        assert errno_of(os.rename, f, m.path("wb", "outputs", "g")) == errno.EROFS
        assert errno_of(os.truncate, f, 0) == errno.EROFS
        assert errno_of(os.mkdir, m.path("newwb")) == errno.EROFS
        assert os.stat(f).st_mode & 0o777 == 0o444


def _object_files(data_dir: str) -> list[str]:
    found = []
    for top, _, names in os.walk(os.path.join(data_dir, "objects", "nokv")):
        found += [os.path.join(top, n) for n in names]
    return found


@pytest.mark.damages_store("corrupts a block")
def test_a_corrupted_block_reads_as_eio(tmp_path):
    with mounted(str(tmp_path)) as m:
        m.facade("namespace.put(root, 'wb', 'input/fragile.bin', b'intact bytes' * 1000)")
        [block] = _object_files(m.data_dir)
        with open(block, "r+b") as f:
            f.write(b"X")  # the store now holds bytes their SHA-256 does not describe
        with pytest.raises(OSError) as exc:
            with open(m.path("wb", "input", "fragile.bin"), "rb") as f:
                f.read()
        assert exc.value.errno == errno.EIO
        assert "IntegrityError" in m.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
@pytest.mark.damages_store("its store is a tmpfs unmounted afterwards")
def test_a_full_store_fails_close_with_enospc_and_keeps_the_spool(tmp_path):
    import glob
    import subprocess as sp

    store = tmp_path / "store"
    store.mkdir()
    if sp.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(store)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        from nokvfs.workspace import datadir, workbench

        data = str(tmp_path / "data")
        datadir.init(data, store="file://" + str(store))
        root = datadir.open_root(data, verify=False)
        workbench.create(root, "wb")
        root.close()  # closes its block cache too
        with mounted(str(tmp_path), init=False) as m:
            body = os.urandom(5 * 1024 * 1024)
            f = open(m.path("wb", "outputs", "big.bin"), "wb")
            f.write(body)
            with pytest.raises(OSError) as exc:
                f.close()
            assert exc.value.errno == errno.ENOSPC
            # The name of a file created and never published goes with its last descriptor (the
            # release, which the kernel sends right after close(2) returns).
            deadline = time.monotonic() + 5
            while os.path.exists(m.path("wb", "outputs", "big.bin")) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not os.path.exists(m.path("wb", "outputs", "big.bin"))
            [spool] = glob.glob(os.path.join(data, "spool", "mount", "*.spool"))
            with open(spool, "rb") as kept:
                assert kept.read() == body
            with open(m.path("wb", "outputs", "small.txt"), "w") as small:  # still serving
                small.write("fits")
    finally:
        sp.run(["umount", "-l", str(store)])


@pytest.mark.damages_store("puts one block's object in another's place and flips a byte of a third")
def test_after_a_remount_files_written_with_dd_read_back_and_a_swapped_or_damaged_block_is_eio(tmp_path):
    """Blocks written through the mount carry the SHA-256 they were checked against, so a read
    after a remount need not hash them again; what it must still refuse: another whole, valid
    object file copied over a block (its recorded digest is not the manifest's) and a flipped byte
    (the body no longer matches the etag the store computed)."""
    import hashlib
    import shutil

    sources = {name: os.urandom(size) for name, size in (("a.bin", 9 << 20), ("b.bin", (4 << 20) + 1))}
    for name, data in sources.items():
        with open(tmp_path / name, "wb") as f:
            f.write(data)
    with mounted(str(tmp_path)) as m:
        for name in sources:
            subprocess.run(
                ["dd", f"if={tmp_path / name}", f"of={m.path('wb', 'outputs', name)}", "bs=1M", "status=none"],
                check=True,
            )
    with mounted(str(tmp_path), init=False) as m:
        for name, data in sources.items():
            out = subprocess.run(["cat", m.path("wb", "outputs", name)], capture_output=True, check=True).stdout
            assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest(), name
    revisions = {}
    for path in _object_files(m.data_dir):
        revisions.setdefault(os.path.dirname(path), []).append(path)
    by_count = {len(paths): sorted(paths) for paths in revisions.values()}
    a_blocks, b_blocks = by_count[3], by_count[2]
    shutil.copyfile(a_blocks[0], a_blocks[1])  # a.bin's block 1 is now a valid copy of its block 0
    with open(b_blocks[1], "r+b") as f:
        f.write(bytes([sources["b.bin"][4 << 20] ^ 1]))  # b.bin's last byte, flipped
    with mounted(str(tmp_path), init=False) as m:
        for name, start in (("a.bin", 4 << 20), ("b.bin", 4 << 20)):
            with open(m.path("wb", "outputs", name), "rb") as f:
                assert f.read(1 << 20) == sources[name][: 1 << 20]  # block 0 is intact
                f.seek(start)
                with pytest.raises(OSError) as exc:
                    f.read(1)
                assert exc.value.errno == errno.EIO, name
        assert m.log().count("IntegrityError") >= 2
