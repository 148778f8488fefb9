"""A file's typed index fields are read-only xattrs `user.nokv.<name>` with textual values."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from nokvfs.fs import xattrs
from nokvfs.schema import index_codec
from tests.mount_fixtures import REPO, env, mount, mounted, needs_fuse  # noqa: F401

FIELDS = """
import datetime
from nokvfs.schema import index_codec
from nokvfs.workspace import index
utc = datetime.timezone.utc
fields = index.fields({
    "count": -42,
    "big": 2**64 - 1,
    "ratio": 0.1,
    "huge": 1e300,
    "ok": True,
    "no": False,
    "nothing": None,
    "blob": b"\\x00\\xffab",
    "label": "h\\u00e9llo \\u2603",
    "when": datetime.datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=utc),
    "exact": index_codec.timestamp_ns(1714564800_123456789),
    "epoch": index_codec.timestamp_ns(0),
    "before": index_codec.timestamp_ns(-1),
})
namespace.put(root, "wb", "outputs/run/result.json", b'{"loss": 0.1}', index_fields=fields)
"""

EXPECTED = {
    "count": b"-42",
    "big": b"18446744073709551615",
    "ratio": b"0.1",
    "huge": b"1e+300",
    "ok": b"true",
    "no": b"false",
    "nothing": b"",
    "blob": b"00ff6162",
    "label": "héllo ☃".encode(),
    "when": b"2024-05-01T12:00:00.250Z",
    "exact": b"2024-05-01T12:00:00.123456789Z",
    "epoch": b"1970-01-01T00:00:00Z",
    "before": b"1969-12-31T23:59:59.999999999Z",
}


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as exc:
        call(*args)
    return exc.value.errno


@needs_fuse
def test_index_fields_are_listed_and_read_as_textual_xattrs(mount):
    mount.facade(FIELDS)
    path = mount.path("wb", "outputs", "run", "result.json")
    names = os.listxattr(path)
    assert sorted(names) == sorted(f"user.nokv.{name}" for name in EXPECTED)
    for name, value in EXPECTED.items():
        assert os.getxattr(path, f"user.nokv.{name}") == value, name
    # The facts stay readable and unlisted.
    assert os.getxattr(path, "user.nokvfs.generation") == b"1"
    assert len(os.getxattr(path, "user.nokvfs.revision")) == 32
    assert errno_of(os.getxattr, path, "user.nokv.missing") == errno.ENODATA
    assert errno_of(os.getxattr, path, "user.nokvfs.missing") == errno.ENODATA
    for name in ("security.selinux", "system.posix_acl_access", "trusted.x"):  # what ls -l asks
        assert errno_of(os.getxattr, path, name) == errno.ENODATA
        assert errno_of(os.getxattr, os.path.dirname(path), name) == errno.ENODATA
    # Read-only: nothing is stored through the mount.
    assert errno_of(os.setxattr, path, "user.nokv.count", b"1") == errno.ENOTSUP
    assert errno_of(os.setxattr, path, "user.other", b"1") == errno.ENOTSUP
    assert errno_of(os.removexattr, path, "user.nokv.count") == errno.ENOTSUP
    assert os.getxattr(path, "user.nokv.count") == b"-42"
    # Directories and files without fields list nothing.
    assert os.listxattr(mount.path("wb", "outputs", "run")) == []
    assert os.getxattr(mount.path("wb", "outputs"), "user.nokvfs.generation").isdigit()
    with open(mount.path("wb", "outputs", "plain.txt"), "w") as f:
        f.write("no fields")
    assert os.listxattr(mount.path("wb", "outputs", "plain.txt")) == []
    assert os.getxattr(mount.path("wb", "outputs", "plain.txt"), "user.nokvfs.generation") == b"1"


@needs_fuse
def test_a_views_file_keeps_the_index_fields_it_had_and_refuses_changes_with_erofs(mount):
    mount.facade(FIELDS)
    live = mount.path("wb", "outputs", "run", "result.json")
    os.mkdir(mount.path("wb", ".snapshots", "with-fields"))
    commit_id = mount.facade(
        "from nokvfs.workspace import commit\nprint(commit.build(root, 'wb').commit_id.hex())"
    ).stdout.strip()
    # Rewritten through the mount (a publication without index fields): the live file has none now.
    with open(live, "wb") as f:
        f.write(b"rewritten")
    assert os.listxattr(live) == []
    assert os.getxattr(live, "user.nokvfs.generation") == b"2"
    for view in (mount.path("wb", ".snapshots", "with-fields"), mount.path("wb", ".commits", commit_id)):
        past = os.path.join(view, "outputs", "run", "result.json")
        assert sorted(os.listxattr(past)) == sorted(f"user.nokv.{name}" for name in EXPECTED)
        assert os.getxattr(past, "user.nokv.when") == EXPECTED["when"]
        assert os.getxattr(past, "user.nokvfs.generation") == b"1"
        assert errno_of(os.setxattr, past, "user.nokv.count", b"1") == errno.EROFS
        assert errno_of(os.removexattr, past, "user.nokv.count") == errno.EROFS
        assert errno_of(os.setxattr, view, "user.x", b"1") == errno.EROFS
    assert os.getxattr(mount.path("wb", ".commits", commit_id), "user.nokvfs.commit").decode() == commit_id


def xattr_calls(m) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "status", m.mountpoint, "--json"],
        capture_output=True,
        env=env(),
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["xattrs"]


@needs_fuse
def test_a_mount_without_xattrs_leaves_every_xattr_call_to_the_kernel(tmp_path):
    """--no-xattrs: getxattr, listxattr and setxattr fail with ENOTSUP as on a file system without
    extended attributes, after at most one request of each kind reached the daemon, so `ls -l` and
    writes make no xattr round trips; tools that copy xattrs (cp -a, rsync -X, tar --xattrs) go on
    without them, and the index fields stay readable with `nokvfs stat`."""
    source = tmp_path / "src"
    source.mkdir()
    for i in range(20):
        (source / f"f{i}").write_bytes(b"x" * i)
    os.setxattr(source / "f1", "user.note", b"local")
    with mounted(str(tmp_path / "m"), extra_args=("--no-xattrs",)) as m:
        m.facade(FIELDS)
        path = m.path("wb", "outputs", "run", "result.json")
        outputs = m.path("wb", "outputs")
        assert xattr_calls(m) == {"offered": False, "calls": 0}
        for call, args in (
            (os.getxattr, (path, "user.nokv.count")),
            (os.getxattr, (path, "security.selinux")),
            (os.getxattr, (outputs, "user.nokvfs.generation")),
            (os.listxattr, (path,)),
            (os.setxattr, (path, "user.x", b"1")),
            (os.removexattr, (path, "user.x")),
        ):
            assert errno_of(call, *args) == errno.ENOTSUP, call
        subprocess.run(["cp", "-a", str(source), os.path.join(outputs, "copied")], check=True)
        subprocess.run(["rsync", "-aX", f"{source}/", os.path.join(outputs, "synced")], capture_output=True)
        listing = subprocess.run(["ls", "-lR", outputs], capture_output=True, text=True, check=True).stdout
        assert "f19" in listing and "result.json" in listing
        for copy in ("copied", "synced"):
            assert sorted(os.listdir(os.path.join(outputs, copy))) == sorted(f"f{i}" for i in range(20))
            with open(os.path.join(outputs, copy, "f7"), "rb") as f:
                assert f.read() == b"x" * 7
        calls = xattr_calls(m)
        assert calls["offered"] is False and calls["calls"] <= 4, calls  # get, list, set, remove: once each
        shown = subprocess.run(
            [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", m.data_dir, "stat", "wb:outputs/run/result.json"],
            capture_output=True,
            text=True,
            env=env(),
            cwd=REPO,
            check=True,
        ).stdout
        assert "count=" in shown and "when=" in shown
    with mounted(str(tmp_path / "m"), init=False) as m:  # the default offers them again
        assert os.getxattr(m.path("wb", "outputs", "run", "result.json"), "user.nokv.count") == b"-42"
        assert xattr_calls(m)["offered"] is True


# --- the textual forms, without a kernel ---------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (index_codec.null(), b""),
        (index_codec.boolean(True), b"true"),
        (index_codec.int_(-(2**63)), b"-9223372036854775808"),
        (index_codec.uint(2**63), b"9223372036854775808"),
        (index_codec.float_(-0.0), b"0.0"),
        (index_codec.float_(1.5), b"1.5"),
        (index_codec.float_(1e-7), b"1e-07"),
        (index_codec.timestamp_ns(1_000_000), b"1970-01-01T00:00:00.001Z"),
        (index_codec.timestamp_ns(1_000), b"1970-01-01T00:00:00.000001Z"),
        (index_codec.timestamp_ns(-(2**63)), b"1677-09-21T00:12:43.145224192Z"),
        (index_codec.timestamp_ns(2**63 - 1), b"2262-04-11T23:47:16.854775807Z"),
        (index_codec.bytes_(b""), b""),
        (index_codec.string(""), b""),
    ],
)
def test_textual_values(value, text):
    assert xattrs.text(value) == text


def test_a_field_name_too_long_for_an_xattr_is_not_listed():
    from nokvfs.workspace import index

    class Entry:
        typed_index_projection = index.fields({"a": 1, "b" * 250: 2})

    assert xattrs.index_names(Entry()) == [b"user.nokv.a"]
    assert xattrs.index_value(Entry(), b"user.nokv.a") == b"1"
    assert xattrs.index_value(Entry(), b"user.nokv.zz") is None
