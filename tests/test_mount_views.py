"""The read-only views beside the sections: `/<wb>/.snapshots/`, `/<wb>/.commits/`, `/<wb>/.tags/`.

Each shows the workbench as of that point, sections included, and never changes; mkdir/rmdir in
`.snapshots/` mint and retire; every other change inside a view is EROFS.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import textwrap
import time

import pytest

from nokvfs.fs.inodes import Kind
from nokvfs.fs.views import LiveView
from tests.mount_fixtures import WORKBENCH_LISTING, Mount, mount, needs_fuse  # noqa: F401
from tests.workspace_helpers import opened_root

SECTIONS = ["input", "logs", "metadata", "outputs", "scripts"]


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as exc:
        call(*args)
    return exc.value.errno


def within(predicate, deadline: float = 2.0) -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > deadline:
            raise AssertionError(f"not true within {deadline} s")
        time.sleep(0.02)


def tree_bytes(top: str) -> dict[str, bytes]:
    """Every file below `top` (relative path -> bytes), read with plain open/read."""
    out = {}
    for directory, _, files in os.walk(top):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, top)] = f.read()
    return out


def sizes(top: str) -> dict[str, int]:
    return {path: os.stat(os.path.join(top, path)).st_size for path in tree_bytes(top)}


def ls_lr(path: str) -> str:
    done = subprocess.run(["ls", "-lR", "--time-style=full-iso", path], capture_output=True, text=True, check=True)
    return done.stdout.replace(path, "<top>")


def write(path: str, data: bytes, mode: str = "wb") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(data)


def facade_json(m: Mount, code: str):
    return json.loads(m.facade("import json\n" + textwrap.dedent(code)).stdout.strip().splitlines()[-1])


# --- with a kernel --------------------------------------------------------------------------------


@needs_fuse
def test_ls_a_shows_the_three_view_directories_and_plain_ls_hides_them(mount):
    wbdir = mount.path("wb")
    assert sorted(os.listdir(wbdir)) == WORKBENCH_LISTING
    plain = subprocess.run(["ls", wbdir], capture_output=True, text=True, check=True).stdout.split()
    assert plain == SECTIONS
    everything = subprocess.run(["ls", "-a", wbdir], capture_output=True, text=True, check=True).stdout.split()
    assert [n for n in everything if n not in (".", "..")] == WORKBENCH_LISTING
    for name in (".snapshots", ".commits", ".tags"):
        st = os.stat(os.path.join(wbdir, name))
        assert os.path.isdir(os.path.join(wbdir, name)) and st.st_ino != os.stat(wbdir).st_ino
        assert os.listdir(os.path.join(wbdir, name)) == []
    assert os.stat(mount.path("wb", ".snapshots")).st_mode & 0o777 == 0o755  # mkdir mints
    assert os.stat(mount.path("wb", ".commits")).st_mode & 0o777 == 0o555
    assert not os.path.exists(mount.path("wb", ".snapshots", "nothing"))
    assert not os.path.exists(mount.path("wb", ".commits", "abc"))
    assert errno_of(os.rmdir, mount.path("wb", ".snapshots")) == errno.EPERM
    assert errno_of(os.rename, mount.path("wb", ".tags"), mount.path("wb", ".tags2")) == errno.EPERM


@needs_fuse
def test_a_snapshot_keeps_showing_the_past_byte_for_byte_while_the_live_view_changes(mount):
    live = mount.path("wb")
    rng = random.Random(3)
    files = {
        "outputs/a.txt": b"first version\n",
        "outputs/deep/er/model.bin": rng.randbytes(5 * 1024 * 1024 + 77),  # two blocks
        "logs/run.log": b"line 1\n",
        "input/gone.csv": b"a,b\n1,2\n",
        "scripts/run.sh": b"#!/bin/sh\n",
        "metadata/notes.json": b"{}",
    }
    for path, data in files.items():
        write(os.path.join(live, path), data)
    os.mkdir(mount.path("wb", ".snapshots", "before"))
    snap = mount.path("wb", ".snapshots", "before")
    assert sorted(os.listdir(snap)) == SECTIONS
    assert tree_bytes(snap) == files
    listing_then, sizes_then = ls_lr(snap), sizes(snap)
    assert sizes_then == {p: len(d) for p, d in files.items()}
    snapshot_id = facade_json(
        mount,
        "print(json.dumps(__import__('nokvfs.workspace.snapshot', fromlist=['x']).get(root, 'wb', "
        "'before').snapshot_id))",
    )
    assert sorted(os.listdir(mount.path("wb", ".snapshots"))) == sorted([str(snapshot_id), "before"])

    # The live view moves on: through the mount and from another process.
    write(os.path.join(live, "outputs/a.txt"), b"second version, longer\n")
    write(os.path.join(live, "logs/run.log"), b"line 2\n", "ab")
    os.unlink(os.path.join(live, "input/gone.csv"))
    os.rename(os.path.join(live, "scripts/run.sh"), os.path.join(live, "scripts/renamed.sh"))
    write(os.path.join(live, "outputs/deep/new.txt"), b"new")
    mount.facade("namespace.put(root, 'wb', 'outputs/deep/er/model.bin', b'replaced by another process')")
    within(
        lambda: os.path.getsize(os.path.join(live, "outputs/deep/er/model.bin")) == len(b"replaced by another process")
    )

    # The snapshot shows exactly what it showed: bytes, listing, sizes -- under both names, and
    # under the id, which this kernel has never looked up before the changes.
    assert tree_bytes(snap) == files
    assert ls_lr(snap) == listing_then
    assert sizes(snap) == sizes_then
    by_id = mount.path("wb", ".snapshots", str(snapshot_id))
    assert tree_bytes(by_id) == files and sizes(by_id) == sizes_then
    assert not os.path.exists(os.path.join(snap, "outputs", "deep", "new.txt"))
    assert not os.path.exists(os.path.join(snap, "scripts", "renamed.sh"))
    # Its inodes are its own (never a live inode), and ranged reads see the past too.
    assert os.stat(os.path.join(snap, "outputs/a.txt")).st_ino != os.stat(os.path.join(live, "outputs/a.txt")).st_ino
    with open(os.path.join(by_id, "outputs/deep/er/model.bin"), "rb") as f:
        f.seek(4 * 1024 * 1024 - 10)
        assert f.read(20) == files["outputs/deep/er/model.bin"][4 * 1024 * 1024 - 10 : 4 * 1024 * 1024 + 10]
    assert os.getxattr(os.path.join(snap, "outputs/a.txt"), "user.nokvfs.generation") == b"1"
    assert os.getxattr(os.path.join(live, "outputs/a.txt"), "user.nokvfs.generation") == b"2"


@needs_fuse
def test_mkdir_mints_and_rmdir_retires_in_dot_snapshots(mount):
    snapshots = mount.path("wb", ".snapshots")
    write(mount.path("wb", "outputs", "f.txt"), b"x")
    os.mkdir(os.path.join(snapshots, "s1"))
    info = facade_json(
        mount,
        """
        from nokvfs.workspace import snapshot
        s = snapshot.get(root, 'wb', 's1')
        print(json.dumps([s.snapshot_id, s.ref.state.name, s.ref.alias, s.ref.lease_deadline > s.lease_clock_ms]))
        """,
    )
    sid, state, alias, leased = info
    assert (state, alias, leased) == ("Active", "s1", True)
    assert sorted(os.listdir(snapshots)) == sorted([str(sid), "s1"])
    assert errno_of(os.mkdir, os.path.join(snapshots, "s1")) == errno.EEXIST
    assert errno_of(os.mkdir, os.path.join(snapshots, "123")) == errno.EINVAL  # a numeric name
    assert errno_of(os.mkdir, os.path.join(snapshots, "x" * 129)) == errno.EINVAL  # too long an alias
    assert errno_of(os.rmdir, os.path.join(snapshots, "never")) == errno.ENOENT

    os.rmdir(os.path.join(snapshots, "s1"))
    assert (
        facade_json(
            mount,
            "from nokvfs.workspace import snapshot\nprint(json.dumps(snapshot.get(root, 'wb', 's1').ref.state.name))",
        )
        == "Retired"
    )
    assert os.listdir(snapshots) == []
    assert not os.path.exists(os.path.join(snapshots, "s1")) and not os.path.exists(os.path.join(snapshots, str(sid)))

    # Minted and retired by another process: the kernel's entries follow within the feed's poll.
    held = facade_json(
        mount,
        "from nokvfs.workspace import snapshot\nprint(json.dumps(snapshot.mint(root, 'wb', alias='cli').snapshot_id))",
    )
    within(lambda: os.path.isdir(os.path.join(snapshots, "cli")))
    assert os.listdir(os.path.join(snapshots, "cli", "outputs")) == ["f.txt"]
    mount.facade(f"from nokvfs.workspace import snapshot\nsnapshot.retire(root, 'wb', {held})")
    within(lambda: not os.path.exists(os.path.join(snapshots, "cli")))
    assert errno_of(os.listdir, os.path.join(snapshots, str(held))) == errno.ENOENT

    # A snapshot that a restore (fork) still consumes cannot be retired.
    os.mkdir(os.path.join(snapshots, "held"))
    mount.facade(
        """
        import os
        from nokvfs.workspace import restore, workbench as wbm
        with root.read() as view:
            _, source = wbm.visible(view, root.root_id, 'wb')
            kind, selector = restore.resolve_source(view, root, source, ('snapshot', 'held'))
        request = restore.RestoreRequest('wb', source.incarnation_id, kind, selector, 'forked', os.urandom(16))
        restore.prepare(root, request)
        """
    )
    assert errno_of(os.rmdir, os.path.join(snapshots, "held")) == errno.EBUSY
    assert os.path.isdir(os.path.join(snapshots, "held", "outputs"))
    mount.facade("pass")  # opening the root recovers (finishes) the restore whose process is gone
    within(lambda: "forked" in os.listdir(mount.mountpoint))
    os.rmdir(os.path.join(snapshots, "held"))
    assert not os.path.exists(os.path.join(snapshots, "held"))


@needs_fuse
def test_commits_by_full_id_and_unique_prefix_an_ambiguous_prefix_is_enoent_and_tags(mount):
    write(mount.path("wb", "outputs", "a.txt"), b"v1")
    first = facade_json(
        mount, "from nokvfs.workspace import commit\nprint(json.dumps(commit.build(root, 'wb').commit_id.hex()))"
    )
    write(mount.path("wb", "outputs", "a.txt"), b"version two")
    write(mount.path("wb", "logs", "l.log"), b"log")
    # More commits until two share a first hex digit (at most 17 by pigeonhole).
    ids = facade_json(
        mount,
        f"""
        from nokvfs.workspace import commit
        ids = [{first!r}]
        while len({{i[0] for i in ids}}) == len(ids):
            ids.append(commit.build(root, 'wb').commit_id.hex())
        print(json.dumps(ids))
        """,
    )
    second = ids[1]
    commits = mount.path("wb", ".commits")
    assert sorted(os.listdir(commits)) == sorted(ids)  # the head's first-parent log

    old = os.path.join(commits, first)
    assert sorted(os.listdir(old)) == SECTIONS
    with open(os.path.join(old, "outputs", "a.txt"), "rb") as f:
        assert f.read() == b"v1"
    assert not os.path.exists(os.path.join(old, "logs", "l.log"))
    manifest = json.loads(open(os.path.join(old, "metadata", "run_manifest.json"), "rb").read())
    assert manifest["commit_id"] == first  # the run manifest is a member
    with open(os.path.join(commits, second, "outputs", "a.txt"), "rb") as f:
        assert f.read() == b"version two"
    assert os.getxattr(os.path.join(commits, second), "user.nokvfs.commit").decode() == second

    prefix = next(second[:n] for n in range(1, 65) if sum(i.startswith(second[:n]) for i in ids) == 1)
    with open(os.path.join(commits, prefix, "logs", "l.log"), "rb") as f:
        assert f.read() == b"log"
    assert os.stat(os.path.join(commits, prefix)).st_ino != os.stat(os.path.join(commits, second)).st_ino

    shared = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    matches = sorted(i for i in ids if i.startswith(shared))
    assert errno_of(os.stat, os.path.join(commits, shared)) == errno.ENOENT
    line = next(ln for ln in mount.log().splitlines() if "ambiguous" in ln and f"/.commits/{shared} " in ln)
    assert "WARNING" in line and all(m in line for m in matches)
    assert errno_of(os.stat, os.path.join(commits, "f" * 65)) == errno.ENOENT
    assert errno_of(os.stat, os.path.join(commits, "XYZ")) == errno.ENOENT

    # A commit made by another process appears in .commits/ and under its id.
    latest = facade_json(
        mount, "from nokvfs.workspace import commit\nprint(json.dumps(commit.build(root, 'wb').commit_id.hex()))"
    )
    within(lambda: os.path.isdir(os.path.join(commits, latest)))
    assert latest in os.listdir(commits)
    within(
        lambda: json.loads(open(mount.path("wb", "metadata", "run_manifest.json"), "rb").read())["commit_id"] == latest
    )

    # Tags: .tags/<tag>/ is the tagged commit's tree, and follows the tag when it moves.
    tags = mount.path("wb", ".tags")
    mount.facade(f"from nokvfs.workspace import tag\ntag.set(root, 'wb', 'release', bytes.fromhex({first!r}))")
    within(lambda: os.listdir(tags) == ["release"])
    with open(os.path.join(tags, "release", "outputs", "a.txt"), "rb") as f:
        assert f.read() == b"v1"
    mount.facade(f"from nokvfs.workspace import tag\ntag.set(root, 'wb', 'release', bytes.fromhex({second!r}))")
    within(lambda: open(os.path.join(tags, "release", "outputs", "a.txt"), "rb").read() == b"version two")
    mount.facade("from nokvfs.workspace import tag\ntag.delete(root, 'wb', 'release')")
    within(lambda: not os.path.exists(os.path.join(tags, "release")))
    assert os.listdir(tags) == []


@needs_fuse
def test_every_write_inside_a_view_is_erofs(mount):
    write(mount.path("wb", "outputs", "d", "f.txt"), b"frozen")
    os.mkdir(mount.path("wb", ".snapshots", "s"))
    commit_id = facade_json(
        mount,
        """
        from nokvfs.workspace import commit, tag
        c = commit.build(root, 'wb').commit_id
        tag.set(root, 'wb', 't', c)
        print(json.dumps(c.hex()))
        """,
    )
    views = [
        mount.path("wb", ".snapshots", "s"),
        mount.path("wb", ".commits", commit_id),
        mount.path("wb", ".commits", commit_id[:10]),
    ]
    within(lambda: os.path.isdir(mount.path("wb", ".tags", "t")))
    views.append(mount.path("wb", ".tags", "t"))
    live_file = mount.path("wb", "outputs", "live.txt")
    write(live_file, b"live")
    for view in views:
        f = os.path.join(view, "outputs", "d", "f.txt")
        d = os.path.join(view, "outputs", "d")
        with open(f, "rb") as handle:
            assert handle.read() == b"frozen"
        assert os.stat(f).st_mode & 0o777 == 0o444 and os.stat(d).st_mode & 0o777 == 0o555
        attempts = {
            "open for writing": lambda: open(f, "r+b"),
            "open to append": lambda: open(f, "ab"),
            "truncating open": lambda: open(f, "wb"),
            "create": lambda: open(os.path.join(d, "new.txt"), "wb"),
            "exclusive create": lambda: os.open(
                os.path.join(view, "outputs", "x"), os.O_CREAT | os.O_EXCL | os.O_WRONLY
            ),
            "unlink": lambda: os.unlink(f),
            "rename inside": lambda: os.rename(f, os.path.join(d, "g.txt")),
            "rename out": lambda: os.rename(f, mount.path("wb", "outputs", "stolen.txt")),
            "rename in": lambda: os.rename(live_file, os.path.join(d, "planted.txt")),
            "mkdir": lambda: os.mkdir(os.path.join(d, "sub")),
            "mkdir in the view's top": lambda: os.mkdir(os.path.join(view, "elsewhere")),
            "rmdir": lambda: os.rmdir(d),
            "truncate": lambda: os.truncate(f, 0),
            "chmod": lambda: os.chmod(f, 0o600),
            "utime": lambda: os.utime(f, (1, 1)),
            "utime of a directory": lambda: os.utime(d, (1, 1)),
            "setxattr": lambda: os.setxattr(f, "user.note", b"v"),
            "removexattr": lambda: os.removexattr(f, "user.note"),
            "rmdir a section": lambda: os.rmdir(os.path.join(view, "logs")),
        }
        for what, attempt in attempts.items():
            assert errno_of(attempt) == errno.EROFS, (view, what)
        with open(f, "rb") as handle:
            assert handle.read() == b"frozen"
    assert errno_of(os.mkdir, mount.path("wb", ".commits", "new")) == errno.EROFS
    assert errno_of(os.mkdir, mount.path("wb", ".tags", "new")) == errno.EROFS
    assert errno_of(os.rmdir, mount.path("wb", ".commits", commit_id)) == errno.EROFS
    assert errno_of(os.rmdir, mount.path("wb", ".tags", "t")) == errno.EROFS
    assert errno_of(open, mount.path("wb", ".snapshots", "file"), "wb") == errno.EROFS
    assert errno_of(os.rename, mount.path("wb", ".snapshots", "s"), mount.path("wb", ".snapshots", "r")) == errno.EROFS
    with open(live_file, "rb") as handle:  # the live view is untouched and still writable
        assert handle.read() == b"live"
    write(live_file, b"still writable")


# --- without a kernel: the change feed invalidates the view names -------------------------------


class RecordingInvalidator:
    def __init__(self):
        self.calls = []

    def entry(self, parent_ino, name, deleted=0):
        self.calls.append((parent_ino, name))

    def inode(self, ino, *, attr_only=False):
        pass


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("wb",)) as r:
        yield r


def test_mint_retire_commit_and_tag_events_invalidate_the_view_names(root):
    from nokvfs.fs.filesystem import FileSystem
    from nokvfs.fs.freshness import ChangeFollower
    from nokvfs.fs.threads import Workers
    from nokvfs.workspace import commit, namespace, snapshot, tag

    invalidator = RecordingInvalidator()
    fs = FileSystem(root, LiveView(root), Workers(), invalidator, None)
    tree = fs.tree
    follower = ChangeFollower(root, fs.changes)
    wbnode = tree.lookup(tree.inodes.root, "wb")
    history = {name: tree.lookup(wbnode, name) for name in (".snapshots", ".commits", ".tags")}
    for node in [wbnode, *history.values()]:
        tree.inodes.remember(node)
        assert node.kind is Kind.HISTORY or node is wbnode
    namespace.put(root, "wb", "outputs/f", b"1")
    first = commit.build(root, "wb").commit_id
    prefix_view = tree.lookup(history[".commits"], first.hex()[:2])
    tree.inodes.remember(prefix_view)
    follower.poll()
    invalidator.calls.clear()

    minted = snapshot.mint(root, "wb", alias="nightly")
    follower.poll()
    assert set(invalidator.calls) == {
        (history[".snapshots"].ino, "nightly"),
        (history[".snapshots"].ino, str(minted.snapshot_id)),
    }
    invalidator.calls.clear()
    snapshot.retire(root, "wb", "nightly")
    follower.poll()
    assert set(invalidator.calls) == {
        (history[".snapshots"].ino, "nightly"),
        (history[".snapshots"].ino, str(minted.snapshot_id)),
    }

    invalidator.calls.clear()
    second = commit.build(root, "wb").commit_id
    follower.poll()
    assert (history[".commits"].ino, second.hex()) in invalidator.calls
    assert (history[".commits"].ino, first.hex()[:2]) in invalidator.calls  # it may be ambiguous now

    invalidator.calls.clear()
    tag.set(root, "wb", "v1", second)
    tag.delete(root, "wb", "v1")
    follower.poll()
    assert invalidator.calls == [(history[".tags"].ino, "v1")] * 2


def test_view_inodes_are_hashed_with_the_view_identity(root):
    from nokvfs.fs.threads import Workers
    from nokvfs.fs.tree import Tree
    from nokvfs.workspace import namespace, snapshot

    namespace.put(root, "wb", "outputs/f", b"1")
    minted = snapshot.mint(root, "wb", alias="a")
    tree = Tree(root, LiveView(root), Workers(), RecordingInvalidator())
    wbnode = tree.lookup(tree.inodes.root, "wb")
    live = tree.lookup(tree.lookup(wbnode, "outputs"), "f")
    snaps = tree.lookup(wbnode, ".snapshots")
    by_alias = tree.lookup(tree.lookup(tree.lookup(snaps, "a"), "outputs"), "f")
    by_id = tree.lookup(tree.lookup(tree.lookup(snaps, str(minted.snapshot_id)), "outputs"), "f")
    assert len({live.ino, by_alias.ino, by_id.ino}) == 3
    assert by_alias.view == f"snapshot:{minted.snapshot_id}:a" and by_id.view == f"snapshot:{minted.snapshot_id}"
    # The same identity gives the same numbers in another daemon (a remount).
    again = Tree(root, LiveView(root), Workers(), RecordingInvalidator())
    snaps2 = again.lookup(again.lookup(again.inodes.root, "wb"), ".snapshots")
    assert again.lookup(again.lookup(again.lookup(snaps2, "a"), "outputs"), "f").ino == by_alias.ino
    # ".." of a view's directory is its history directory, and of that the workbench.
    view_root = tree.lookup(snaps, "a")
    assert tree.lookup(view_root, "..") is snaps and tree.lookup(snaps, "..") is wbnode
    assert tree.lookup(tree.lookup(view_root, "outputs"), "..") is view_root


def test_a_big_directory_of_a_view_lists_completely_in_bounded_pages(root):
    from nokvfs.fs.listing import PAGE, Listing
    from nokvfs.fs.threads import Workers
    from nokvfs.fs.tree import Tree
    from nokvfs.workspace import commit, namespace, snapshot
    from tests.mount_fixtures import populate_many

    names = populate_many(root, "wb", "outputs/many", 2 * PAGE + 90, batch=200)
    minted = snapshot.mint(root, "wb")
    made = commit.build(root, "wb").commit_id
    namespace.remove(root, "wb", "outputs/many/" + names[0])  # the live view moves on
    tree = Tree(root, LiveView(root), Workers(), RecordingInvalidator())
    wbnode = tree.lookup(tree.inodes.root, "wb")

    listing = Listing(tree)

    def listed(directory):
        handle = listing.opendir(1, directory)
        out = []
        while handle.buffer or listing.fill(handle):
            item = handle.buffer.popleft()
            out.append(item[0])
            listing.advance(handle, item)
        listing.releasedir(handle)
        return out

    for family, name in ((".snapshots", str(minted.snapshot_id)), (".commits", made.hex())):
        view_root = tree.lookup(tree.lookup(wbnode, family), name)
        many = tree.lookup(tree.lookup(view_root, "outputs"), "many")
        assert many.kind is Kind.DIR
        assert listed(many) == names  # in order, each once, the removed one included
    live = tree.lookup(tree.lookup(wbnode, "outputs"), "many")
    assert listed(live) == names[1:]
