"""The mount's parts without a kernel: inode numbers, errnos, the overlay, listings, the block
fetcher and the change-feed follower."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import stat
import tempfile

import pyfuse3
import pytest
import trio

from nokvfs import errors as E
from nokvfs.fs import errors as fs_errors
from nokvfs.fs import inodes, spools
from nokvfs.fs.filesystem import FileSystem
from nokvfs.fs.freshness import ChangeFollower
from nokvfs.fs.inodes import InodeTable, Kind
from nokvfs.fs.listing import DirHandle
from nokvfs.fs.overlay import Overlay
from nokvfs.fs.prefetch import BlockFetcher, Stream
from nokvfs.fs.threads import Workers
from nokvfs.fs.views import LiveView
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.workspace import namespace, workbench
from tests.workspace_helpers import opened_root

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INC = bytes(range(16))


# --- inode numbers ------------------------------------------------------------------------------


def test_inode_numbers_are_a_pure_function_of_view_incarnation_and_path():
    a, b = InodeTable(), InodeTable()
    first = a.node(Kind.FILE, "live", "wb", INC, ("outputs", "x")).ino
    assert first == b.node(Kind.FILE, "live", "wb", INC, ("outputs", "x")).ino
    assert first == inodes.hashed_inode("live", INC, ("outputs", "x"))
    assert first != a.node(Kind.FILE, "live", "wb", bytes(16), ("outputs", "x")).ino
    assert first != a.node(Kind.FILE, "snapshot:1", "wb", INC, ("outputs", "x")).ino


def test_a_colliding_path_gets_the_next_seed_and_keeps_it(monkeypatch):
    real = inodes.hashed_inode

    def collide(view, incarnation, components, seed=0):
        if seed == 0:
            return 12345  # every path collides on the primary hash
        return real(view, incarnation, components, seed)

    monkeypatch.setattr(inodes, "hashed_inode", collide)
    table = InodeTable()
    one = table.node(Kind.FILE, "live", "wb", INC, ("outputs", "a"))
    two = table.node(Kind.FILE, "live", "wb", INC, ("outputs", "b"))
    assert one.ino == 12345 and two.ino != 12345 and table.collisions == 1
    table.remember(two)
    table.forget(two.ino, 1)  # gone from the kernel ...
    assert table.get(two.ino) is None
    again = table.node(Kind.FILE, "live", "wb", INC, ("outputs", "b"))
    assert again.ino == two.ino  # ... and back with the number the collision table kept


def test_reserved_numbers_are_never_handed_out(monkeypatch):
    calls = iter([0, 1, 7, 99999])
    monkeypatch.setattr(inodes, "hashed_inode", lambda *a, **k: next(calls))
    assert InodeTable().node(Kind.FILE, "live", "wb", INC, ("outputs", "a")).ino == 99999


def test_forget_drops_a_node_only_when_nothing_holds_it():
    table = InodeTable()
    node = table.node(Kind.FILE, "live", "wb", INC, ("outputs", "a"))
    table.remember(node, 3)
    node.open_count = 1
    table.forget(node.ino, 3)
    assert table.get(node.ino) is node  # an open handle keeps it
    table.closed(node)
    assert table.get(node.ino) is None
    table.forget(inodes.ROOT_INODE, 10**9)
    assert table.get(inodes.ROOT_INODE) is table.root


def test_a_detached_node_keeps_its_number_and_the_path_gets_another():
    table = InodeTable()
    old = table.node(Kind.FILE, "live", "wb", INC, ("outputs", "a"))
    table.remember(old)
    table.detach(old)
    new = table.node(Kind.FILE, "live", "wb", INC, ("outputs", "a"))
    assert new is not old and new.ino != old.ino and table.get(old.ino) is old
    table.move(new, ("outputs", "b"))
    assert table.find("live", INC, ("outputs", "b")) is new and table.find("live", INC, ("outputs", "a")) is None


# --- errnos ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, number",
    [
        (E.NotFound("x"), errno.ENOENT),
        (E.AlreadyExists("x"), errno.EEXIST),
        (E.GenerationConflict("x"), errno.EBUSY),
        (E.ReservedPath("x"), errno.EPERM),
        (E.PathInvalid("x"), errno.EINVAL),
        (E.StoreFull("x"), errno.ENOSPC),
        (E.ObjectMissing("x"), errno.EIO),
        (E.IntegrityError("x"), errno.EIO),
        (E.AmbiguousResult("x"), errno.EIO),
        (E.OwnerFenced("x"), errno.EROFS),
        (E.IsADirectory("x"), errno.EISDIR),
        (E.NotADirectory("x"), errno.ENOTDIR),
        (OSError(errno.ENOSPC, "full"), errno.ENOSPC),
        (RuntimeError("bug"), errno.EIO),
    ],
)
def test_every_error_has_one_errno(exc, number):
    assert fs_errors.errno_of(exc) == number


def test_a_lost_creation_race_is_eexist_and_nothing_escapes_translation():
    assert fs_errors.errno_of(E.GenerationConflict("x"), creating=True) == errno.EEXIST
    import pyfuse3

    for exc in (E.StoreFull("x"), ValueError("bug"), OSError(errno.EACCES, "no")):
        with pytest.raises(pyfuse3.FUSEError):
            with fs_errors.translated("test"):
                raise exc


# --- the overlay and directory handles ---------------------------------------------------------


def test_overlay_directories_vanish_once_a_file_below_them_is_published():
    overlay = Overlay()
    overlay.add_dir(INC, ("outputs", "a", "b"))
    assert overlay.is_dir(INC, ("outputs", "a")) and overlay.children(INC, ("outputs",)) == [("a", "dir")]
    overlay.add_file(INC, ("outputs", "a", "b", "f"), object())
    assert overlay.children(INC, ("outputs", "a", "b")) == [("f", "file")]
    overlay.published(INC, ("outputs", "a", "b", "f"))
    assert not overlay.is_dir(INC, ("outputs", "a")) and not overlay.has_children(INC, ("outputs",))


def test_a_directory_handle_remembers_a_bounded_history_of_positions():
    handle = DirHandle(1, None)
    for pos in range(1, 3000):
        handle.pos = pos
        handle.anchor = str(pos).encode()
        handle.remember("scan")
    assert len(handle.history) == DirHandle.HISTORY
    assert handle.restore(2999) and handle.anchor == b"2999"
    assert not handle.restore(5)


def test_work_that_outlives_its_syscall_keeps_the_lock_until_it_ends():
    """A close(2) whose publication outlives the deadline answers EIO (SyscallTimeout); the
    publication keeps the spool's lock until it ends, so a write meanwhile gives up too instead
    of landing in a spool the publication then marks published, and runs once it is over."""
    events = []

    async def scenario():
        workers = Workers(syscall_timeout=0.05)
        lock = trio.Semaphore(1)
        finish = trio.Event()

        async def publication():
            events.append("publishing")
            await finish.wait()
            events.append("published")

        async def write():
            events.append("written")

        async with trio.open_nursery() as nursery:
            workers.start(nursery)
            with pytest.raises(E.SyscallTimeout):
                await workers.bounded_holding("publication at close", lock, publication)
            with pytest.raises(E.SyscallTimeout):
                await workers.bounded_holding("write", lock, write, inline=True)
            assert lock.value == 0 and events == ["publishing"]
            finish.set()
            await workers.bounded_holding("write", lock, write, inline=True)
            assert lock.value == 1
        return workers.timeouts

    assert trio.run(scenario) == 2
    assert events == ["publishing", "published", "written"]


def test_a_syscall_waits_as_long_as_its_work_progresses_and_gives_up_when_it_stops():
    """The deadline counts time without progress: a publication that stores a block every 0.1 s
    for 1 s finishes under a 0.5 s deadline, and so does a write queued behind it on the same
    lock; one that stops progressing halfway fails at the deadline after its last step, and a
    write behind it gives up too (SyscallTimeout), leaving the lock to the work. (With 40 ms
    steps and a 0.15 s deadline, one step on a loaded CI machine's test worker took longer.)"""
    pause, deadline = 0.1, 0.5

    async def scenario():
        workers = Workers(syscall_timeout=deadline)
        lock = trio.Semaphore(1)
        steps = {"done": 0}
        stall = trio.Event()

        async def publication(count, stop_at=None):
            for step in range(count):
                if step == stop_at:
                    await stall.wait()
                await trio.sleep(pause)
                steps["done"] += 1
            return "published"

        async def write():
            return "written"

        def progress():
            return steps["done"]

        async with trio.open_nursery() as nursery:
            workers.start(nursery)
            started = trio.current_time()
            results = {}

            async def closing():
                results["close"] = await workers.bounded_holding("close", lock, publication, 10, progress=progress)

            nursery.start_soon(closing)
            await trio.sleep(0.01)
            assert await workers.bounded_holding("write", lock, write, inline=True, progress=progress) == "written"
            assert trio.current_time() - started >= 10 * pause  # it waited for the whole publication
            with trio.fail_after(10):
                while "close" not in results:
                    await trio.sleep(0.01)
            assert results["close"] == "published"

            # It stops after 3 steps: the close gives up one deadline after the last step.
            steps["done"] = 0
            started = trio.current_time()
            with pytest.raises(E.SyscallTimeout, match="no progress"):
                await workers.bounded_holding("close", lock, publication, 6, 3, progress=progress)
            waited = trio.current_time() - started
            assert 3 * pause + deadline <= waited < 3 * pause + deadline + 5.0, waited
            with pytest.raises(E.SyscallTimeout, match="made no progress"):
                await workers.bounded_holding("write", lock, write, inline=True, progress=progress)
            assert lock.value == 0
            stall.set()
            assert await workers.bounded_holding("write", lock, write, inline=True, progress=progress) == "written"
        return workers.timeouts

    assert trio.run(scenario) == 2


def test_worker_threads_return_raise_stay_within_their_limit_and_finish_a_cancelled_call():
    """Workers.run and speculate run blocking calls in threads: the value or the exception comes
    back to the caller; no more calls run at once than the limiter allows (threads are reused,
    never more than ran at once); a caller cancelled while its call runs still waits for it and
    gets its value, as with trio.to_thread.run_sync, so no work outlives the task that owns it."""
    import threading
    import time

    running, peak, finished = [0], [0], []
    guard = threading.Lock()

    def blocking(n):
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with guard:
            running[0] -= 1
        finished.append(n)
        return n * n

    def failing():
        raise E.StoreError("the disk said no")

    async def scenario():
        workers = Workers(foreground=3, background=1)
        results = {}

        async def call(n):
            results[n] = await workers.run(blocking, n)

        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(call, n)
            nursery.start_soon(workers.speculate, blocking, 100)
        assert results == {n: n * n for n in range(12)}
        assert peak[0] <= 4  # 3 foreground + 1 background
        with pytest.raises(E.StoreError, match="the disk said no"):
            await workers.run(failing)
        assert await workers.run(lambda *, x: x + 1, x=41) == 42
        with trio.move_on_after(0.001) as scope:
            value = await workers.run(blocking, 200)
        assert scope.cancel_called and value == 40000 and 200 in finished  # waited for, not abandoned

    before = threading.active_count()
    trio.run(scenario)
    assert threading.active_count() - before <= 5


# --- with a real root (no kernel) ----------------------------------------------------------------


@pytest.fixture
def root(tmp_path):
    with opened_root(tmp_path, workbenches=("wb",), block_size=64 * 1024) as r:
        yield r


def write_back_filesystem(root, *, syscall_timeout: float):
    """A write-back mount's FileSystem without a kernel: (fs, workers, publisher, wb/outputs)."""
    from nokvfs.fs import writeback

    workers = Workers(syscall_timeout=syscall_timeout)
    fs = FileSystem(root, LiveView(root), workers, RecordingInvalidator(), BlockFetcher(root, workers))
    publisher = fs.files.writeback = fs.directories.writeback = writeback.Publisher(fs.files, quiet=0)
    section = fs.tree.lookup(fs.tree.lookup(fs.tree.inodes.root, "wb"), "outputs")
    fs.tree.inodes.remember(section)
    return fs, workers, publisher, section


def test_a_write_back_acceptance_outliving_its_close_keeps_the_file_until_it_is_recorded(root, monkeypatch):
    """close(2) on a write-back mount whose acceptance (the journal's fdatasync) outlives the
    deadline answers EIO; the acceptance keeps the file to itself until its record is durable and
    then queues the file, so a write through another descriptor meanwhile gives up too (instead
    of landing while the record is taken, or racing the journal's reset), the journal and the
    queue agree, and the later write is published over the accepted bytes."""
    import os
    import threading

    from nokvfs.fs import writeback

    disk = threading.Event()
    append = writeback.Journal.append

    def slow_append(self, record, *, sync):  # a local disk whose flush outlasts the deadline
        disk.wait(10)
        append(self, record, sync=sync)

    monkeypatch.setattr(writeback.Journal, "append", slow_append)

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=0.2)
        async with trio.open_nursery() as nursery:
            workers.start(nursery)
            fh, attr = await fs.create(section.ino, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
            await fs.write(fh, 0, b"accepted")
            other, _ = await fs.open(attr.st_ino, os.O_WRONLY)
            spool = fs.tree.node(attr.st_ino).spool
            with pytest.raises(E.SyscallTimeout):
                await fs.flush(fh)
            with pytest.raises(E.SyscallTimeout):
                await fs.write(other, 0, b"LATER")
            assert not publisher.holds(spool)
            disk.set()
            with trio.fail_after(10):
                while not publisher.holds(spool):
                    await trio.sleep(0.01)
            await fs.release(fh)
            await fs.write(other, 0, b"LATER")
            await fs.flush(other)
            await fs.release(other)
            await publisher.drain()
            nursery.cancel_scope.cancel()
        return publisher

    publisher = trio.run(scenario)
    assert (publisher.accepted, publisher.published, publisher.failed) == (1, 1, 0)
    from nokvfs.workspace import listing, reading

    with root.read() as view:
        entry = listing.stat(view, root, "wb", "outputs/f").entry
    assert reading.read(root, entry) == b"LATERted"


def test_files_the_write_back_publisher_published_are_opened_without_a_shard_read(root, monkeypatch):
    """After the publisher's group commit, an open(2) of each file it published reads nothing
    from the shard while no commit since wrote its path (the group's own, the next group's); a
    commit of another process in between makes the open read again, and see the replacement."""
    import subprocess
    import sys

    reads = []

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=10)
        entry = fs.tree.view.entry
        monkeypatch.setattr(
            fs.tree.view, "entry", lambda v, inc, comps: reads.append(comps[-1]) or entry(v, inc, comps)
        )
        async with trio.open_nursery() as nursery:
            workers.start(nursery)
            inodes_ = {}
            for name in ("a", "b", "c", "d"):
                fh, attr = await fs.create(section.ino, name.encode(), 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
                await fs.write(fh, 0, name.encode() * 3)
                await fs.flush(fh)
                await fs.release(fh)
                inodes_[name] = attr.st_ino
                if name == "b":
                    await publisher.drain()  # a, b in one group, c and d in the next
            await publisher.drain()
            reads.clear()
            for ino in inodes_.values():
                fh, _ = await fs.open(ino, os.O_RDONLY)
                await fs.release(fh)
            assert reads == []
            code = (
                "import sys; from nokvfs.workspace import datadir, namespace; "
                "root = datadir.open_root(sys.argv[1], verify=False); "
                "namespace.put(root, 'wb', 'outputs/a', b'theirs'); root.close()"
            )
            subprocess.run([sys.executable, "-c", code, root.data_dir], check=True, timeout=60, cwd=REPO)
            with pytest.raises(pyfuse3.FUSEError) as refused:
                await fs.open(inodes_["a"], os.O_RDONLY)
            assert refused.value.errno == errno.ESTALE
            assert "a" in reads
            nursery.cancel_scope.cancel()

    trio.run(scenario)


def _log_and_a_hung_store(root, monkeypatch):
    """wb:outputs/log holding "one" and a newline, and a store in which publications wait until
    the returned Event is set (10 s at most)."""
    import threading

    from nokvfs.fs import spools

    store = threading.Event()
    publish_blocking = spools.Spool.publish_blocking

    def hung(self, attributes=None):
        store.wait(10)
        return publish_blocking(self, attributes)

    monkeypatch.setattr(spools.Spool, "publish_blocking", hung)
    namespace.put(root, "wb", "outputs/log", b"one\n")
    return store


@contextlib.asynccontextmanager
async def _publishing(workers, publisher):
    """A daemon's nursery, with the write-back publisher running in it."""
    async with trio.open_nursery() as nursery:
        workers.start(nursery)
        nursery.start_soon(publisher.run)
        yield nursery


def test_the_write_back_publisher_leaves_a_file_written_after_its_acceptance_until_its_next_close(root):
    """A close of one descriptor accepts a file another descriptor of it goes on writing (dd's
    first close, a shell's `> F`): the publisher publishes the files accepted after it meanwhile,
    but not its bytes (no close made them) until its writer closes, unless fsync(2) waits for it."""
    from nokvfs.workspace import listing, reading

    def published(name):
        with root.read() as view:
            try:
                return reading.read(root, listing.stat(view, root, "wb", f"outputs/{name}").entry)
            except E.NotFound:
                return None

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=10)
        async with _publishing(workers, publisher) as nursery:
            fh, attr = await fs.create(section.ino, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
            await fs.flush(fh)  # accepted empty; fh stays open, as dd's moved descriptor
            await fs.write(fh, 0, b"torn")
            other, _ = await fs.create(section.ino, b"g", 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
            await fs.write(other, 0, b"whole")
            await fs.flush(other)
            await fs.release(other)
            with trio.fail_after(10):
                while published("g") is None:
                    await trio.sleep(0.01)
            await trio.sleep(0.3)
            assert published("f") in (None, b"")
            await fs.write(fh, 4, b" then whole")
            await fs.fsync(fh)  # fsync waits for it: what is written now is published
            assert published("f") == b"torn then whole"
            await fs.write(fh, 15, b"!")
            await fs.flush(fh)
            await fs.release(fh)
            with trio.fail_after(10):
                while published("f") != b"torn then whole!":
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        return publisher

    publisher = trio.run(scenario)
    assert publisher.failed == 0


def test_the_unmount_drain_removes_the_journal_only_after_the_publisher_task_s_turn_ends(root, monkeypatch):
    """At unmount the drain runs beside the publisher task, whose turn ends by resetting the
    journal in a worker thread: the drain waits for that turn before it removes (and closes) the
    journal, so the reset never works on a closed (or reused) descriptor. Seen failing in CI."""
    import threading
    import time

    from nokvfs.fs import writeback

    resetting, resets = threading.Event(), []
    reset = writeback.Journal.reset

    def slow_reset(self):  # a flush of the journal the drain would otherwise overtake
        resetting.set()
        time.sleep(0.3)
        try:
            reset(self)
        except OSError as exc:
            resets.append(exc)
            raise
        resets.append(None)

    monkeypatch.setattr(writeback.Journal, "reset", slow_reset)

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=10)
        async with _publishing(workers, publisher) as nursery:
            fh, _ = await fs.create(section.ino, b"f", 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
            await fs.write(fh, 0, b"accepted")
            await fs.flush(fh)
            await fs.release(fh)
            journal = publisher._journal.path
            with trio.fail_after(10):
                while not resetting.is_set():
                    await trio.sleep(0.01)
            await publisher.drain()
            nursery.cancel_scope.cancel()
        return publisher, journal

    publisher, journal = trio.run(scenario)
    assert resets == [None] and publisher.published == 1
    assert not os.path.exists(journal)


async def _append_two(fs, section) -> int:
    """Open outputs/log with O_APPEND and write a second line: the handle. Its publication is an
    append, which is not a plain put: published alone."""
    import os

    node = fs.tree.lookup(section, "log")
    fs.tree.inodes.remember(node)
    fh, _ = await fs.open(node.ino, os.O_WRONLY | os.O_APPEND)
    await fs.write(fh, 4, b"two\n")
    return fh


@contextlib.contextmanager
def _journal_restored(raw: bytes):
    """A data directory holding only the write-back journal `raw`, restored as the next mount
    would (what a replay publishes had the daemon died): (its path, the directory changes)."""
    from nokvfs.fs import spools, writeback

    with tempfile.TemporaryDirectory() as other:
        directory = spools.spool_dir(other)
        os.makedirs(directory)
        with open(os.path.join(directory, "writeback-00.journal"), "wb") as f:
            f.write(raw)
        _, changes, _ = writeback.restore_journals(other)
        yield other, changes


async def _accept_two(fs, section) -> None:
    """`_append_two`, then close it: accepted, and its publication (an append) starts."""
    fh = await _append_two(fs, section)
    await fs.flush(fh)
    await fs.release(fh)


def test_a_write_back_publication_outliving_fsync_is_reported_by_its_own_outcome(root, monkeypatch):
    """fsync(2) on a write-back mount waits for the file's publication within the deadline and
    answers EIO when it is slower; the publication itself has no deadline (no syscall runs it),
    so when it lands the file counts as published, not failed, and the next fsync succeeds."""
    from nokvfs.workspace import listing, reading

    store = _log_and_a_hung_store(root, monkeypatch)  # a store slower than the syscall deadline

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=0.2)
        async with _publishing(workers, publisher) as nursery:
            fh = await _append_two(fs, section)
            with pytest.raises(E.SyscallTimeout):
                await fs.fsync(fh)
            store.set()
            with trio.fail_after(10):
                while publisher.published + publisher.failed == 0:
                    await trio.sleep(0.01)
            await fs.fsync(fh)
            await fs.flush(fh)
            await fs.release(fh)
            await publisher.drain()
            nursery.cancel_scope.cancel()
        return publisher

    publisher = trio.run(scenario)
    assert (publisher.published, publisher.failed) == (1, 0)
    with root.read() as view:
        entry = listing.stat(view, root, "wb", "outputs/log").entry
    assert reading.read(root, entry) == b"one\ntwo\n"


def test_a_rename_or_unlink_waiting_on_a_stalled_write_back_publication_gives_up_at_the_deadline(root, monkeypatch):
    """rename(2) and unlink(2) of an accepted file wait for its publication (they apply to what
    is published). While publications keep finishing they wait as long as it takes; when none
    finishes for a whole syscall deadline (a store that hangs) they answer EIO (SyscallTimeout)
    and change nothing, where they used to wait forever. Once the store answers, both work. So
    does the rename of a directory to another parent (which waits for every accepted
    publication): before the wait it used to accept a marker keeping its old parent, so its EIO
    left a change behind."""
    from nokvfs.workspace import listing

    store = _log_and_a_hung_store(root, monkeypatch)
    namespace.put(root, "wb", "outputs/a/x/f", b"1")
    namespace.put(root, "wb", "outputs/b/g", b"2")

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=0.3)
        async with _publishing(workers, publisher) as nursery:
            await _accept_two(fs, section)  # its publication hangs in the store
            a, b = fs.tree.lookup(section, "a"), fs.tree.lookup(section, "b")
            fs.tree.inodes.remember(a)
            fs.tree.inodes.remember(b)
            with trio.fail_after(5):  # it used to wait for ever
                with pytest.raises(E.SyscallTimeout):
                    await fs.rename(section.ino, b"log", section.ino, b"renamed", 0)
                with pytest.raises(E.SyscallTimeout):
                    await fs.unlink(section.ino, b"log")
                with pytest.raises(E.SyscallTimeout):
                    await fs.rename(a.ino, b"x", b.ino, b"x", 0)
            assert fs.directories._marker(a) is None  # nothing stored to keep outputs/a
            store.set()
            with trio.fail_after(10):
                await fs.rename(section.ino, b"log", section.ino, b"renamed", 0)
            await publisher.drain()
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    with root.read() as view:
        assert listing.stat(view, root, "wb", "outputs/renamed").entry is not None
        with pytest.raises(E.NotFound):
            listing.stat(view, root, "wb", "outputs/log")


def test_files_accepted_behind_a_stalled_publication_are_renamed_and_unlinked_without_waiting(root, monkeypatch):
    """Saving through a temporary (write, close, rename over the file: git, pip, rsync, editors)
    and removing a temporary on a write-back mount waited for the file's publication, behind
    everything accepted before it: each rename cost a publication, and behind a store that hangs
    it answered EIO. A file created in this mount whose publication has not started is now moved
    or removed in the journal (one synced record): both return at once, a replay of the journal
    then publishes the bytes at their new names and nothing else, and so does the publisher."""
    import glob
    import os

    from nokvfs.fs import spools
    from nokvfs.workspace import listing, reading

    store = _log_and_a_hung_store(root, monkeypatch)
    namespace.put(root, "wb", "outputs/config", b"config v1")

    async def create(fs, section, name: bytes, body: bytes) -> None:
        fh, _ = await fs.create(section.ino, name, os.O_WRONLY, 0o644, 0, 0)
        await fs.write(fh, 0, body)
        await fs.flush(fh)
        await fs.release(fh)

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=0.3)
        async with _publishing(workers, publisher) as nursery:
            await _accept_two(fs, section)  # its publication hangs in the store
            with trio.fail_after(5):
                while not publisher._publishing:
                    await trio.sleep(0.01)
            await create(fs, section, b"saved", b"saved v1")
            await create(fs, section, b"saved.tmp", b"saved v2")
            await create(fs, section, b"config.tmp", b"config v2")
            await create(fs, section, b"scratch", b"removed")
            with trio.fail_after(1):  # each waited for the hung publication, then gave up (EIO)
                await fs.rename(section.ino, b"saved.tmp", section.ino, b"saved", 0)  # over an accepted file
                await fs.rename(section.ino, b"config.tmp", section.ino, b"config", 0)  # over a published one
                await fs.unlink(section.ino, b"scratch")
            assert [fs.tree.lookup(section, n) is None for n in ("saved.tmp", "config.tmp", "scratch")] == [True] * 3
            assert publisher.published == 0  # nothing published: the renames did not wait
            (journal,) = glob.glob(os.path.join(root.data_dir, "spool", "mount", "writeback-*.journal"))
            with open(journal, "rb") as f:
                raw = f.read()
            store.set()
            with trio.fail_after(10):
                await publisher.drain()
            nursery.cancel_scope.cancel()
        return raw, publisher

    raw, publisher = trio.run(scenario)
    assert publisher.failed == 0
    with root.read() as view:
        published = {
            path: reading.read(root, listing.stat(view, root, "wb", f"outputs/{path}").entry)
            for path in ("saved", "config", "log")
        }
        for gone in ("saved.tmp", "config.tmp", "scratch"):
            with pytest.raises(E.NotFound):
                listing.stat(view, root, "wb", f"outputs/{gone}")
    assert published == {"saved": b"saved v2", "config": b"config v2", "log": b"one\ntwo\n"}
    # What a replay would have published had the daemon died before the store answered.
    with _journal_restored(raw) as (other, _):
        pending = sorted(
            (s.record["path"], s.record["expected_revision"] is None, open(s.path, "rb").read())
            for s in spools.scan(other)
            if s.record.get("state") == spools.PENDING and not s.record.get("append_only")
        )
    assert pending == [("outputs/config", False, b"config v2"), ("outputs/saved", True, b"saved v2")]


def test_a_close_waiting_for_room_in_a_full_write_back_backlog_gives_up_when_nothing_progresses(root, monkeypatch):
    """With the write-back backlog full and a store that hangs, close(2) of another file waited
    for room for ever (its FLUSH, then its RELEASE). It now waits as long as publications make
    progress and answers EIO (SyscallTimeout) after a deadline without any; nothing is accepted,
    the handle is released all the same, and once the store answers the file's next close
    accepts it and it is published."""
    import os

    from nokvfs.workspace import listing, reading

    store = _log_and_a_hung_store(root, monkeypatch)

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=0.3)
        publisher.max_backlog = 1
        async with _publishing(workers, publisher) as nursery:
            fh = await _append_two(fs, section)
            await fs.flush(fh)  # accepted: the backlog is full, its publication hangs
            await fs.release(fh)
            fh, _ = await fs.create(section.ino, b"new", os.O_WRONLY, 0o644, 0, 0)
            await fs.write(fh, 0, b"new bytes")
            node = fs.handles.get(fh).node
            with trio.fail_after(5):  # it used to wait for ever
                with pytest.raises(E.SyscallTimeout, match="backlog"):
                    await fs.flush(fh)
                with pytest.raises(E.SyscallTimeout):
                    await fs.release(fh)
            assert publisher.backlog == 1 and node.open_count == 0 and node.spool.dirty
            store.set()
            fh, _ = await fs.open(node.ino, os.O_WRONLY)
            with trio.fail_after(10):
                await fs.flush(fh)
                await fs.release(fh)
                await publisher.drain()
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    with root.read() as view:
        entry = listing.stat(view, root, "wb", "outputs/new").entry
    assert reading.read(root, entry) == b"new bytes"


def test_fsync_behind_publications_that_all_fail_gives_up_after_one_deadline(root, monkeypatch):
    """Over a store that fails every publication after a while (its own deadline, say), fsync(2)
    of the last of ten accepted files used to count each failure as progress and wait for all
    of them (here 10 x 0.25 s; with 8,192 files and a 30 s store deadline, days). Only
    publications that succeed, and blocks stored, count now: EIO after one syscall deadline."""
    import os

    from nokvfs.fs import spools, writeback

    def failing(self, attributes=None):
        import time

        time.sleep(0.25)
        raise E.StoreError("the store failed")

    monkeypatch.setattr(spools.Spool, "publish_blocking", failing)
    monkeypatch.setattr(writeback, "_groupable", lambda spool, node: False)  # one publication at a time

    async def scenario():
        # The acceptances (a journal fdatasync each) get a deadline a loaded machine meets; the
        # fsync under test gets the short one.
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=30)
        publisher.quiet = 3600  # accepted together, then published when fsync asks
        async with _publishing(workers, publisher) as nursery:
            for n in range(10):
                fh, _ = await fs.create(section.ino, b"f%d" % n, os.O_WRONLY, 0o644, 0, 0)
                await fs.write(fh, 0, b"bytes %d" % n)
                await fs.flush(fh)
                if n < 9:
                    await fs.release(fh)
            workers.syscall_timeout = 0.4
            started = trio.current_time()
            with trio.fail_after(10), pytest.raises(E.SyscallTimeout):
                await fs.fsync(fh)
            waited = trio.current_time() - started
            nursery.cancel_scope.cancel()
        return waited

    waited = trio.run(scenario)
    assert 0.4 <= waited < 1.5, waited


def test_a_write_back_spool_sends_its_bytes_to_the_disk_as_it_grows(root, monkeypatch):
    """A write-back close fdatasyncs a big file's spool: its bytes are sent to the disk while it
    is written (sync_file_range, one request per WINDOW of growth, each on a duplicate of the
    spool's descriptor), so that fsync has little left. Requests follow the file as it grows,
    restart below a truncate, and never cover a byte not written; a memory spool and a default
    mount's spool (never synced) make none. The bytes are published whole all the same."""
    from nokvfs.fs import writebehind
    from nokvfs.workspace import listing, reading

    mib = 1 << 20
    requests = []
    real = writebehind.start_writeback

    def recording(fd, offset, length):
        requests.append((os.fstat(fd).st_ino, offset, length))
        real(fd, offset, length)  # the real call: it must be accepted on this file system

    monkeypatch.setattr(writebehind, "start_writeback", recording)
    monkeypatch.setattr(writebehind, "WINDOW", 4 * mib)
    chunk = bytes(range(256)) * 4096  # 1 MiB

    async def write_file(fs, section, name: bytes, mib_count: int, truncate_at: int | None = None):
        fh, _ = await fs.create(section.ino, name, 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
        spool = fs.handles.get(fh).node.spool
        for i in range(mib_count):
            await fs.write(fh, i * mib, chunk)
        if truncate_at is not None:
            await fs.files.truncate(fs.handles.get(fh).node, truncate_at, fs.handles.get(fh))
            for i in range(mib_count):
                await fs.write(fh, truncate_at + i * mib, chunk)
        assert writebehind.wait_idle()
        inode = os.fstat(spool.fd).st_ino if spool.fd >= 0 else None
        await fs.flush(fh)
        await fs.release(fh)
        return inode

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=10)
        async with _publishing(workers, publisher) as nursery:
            big = await write_file(fs, section, b"big", 10)
            mine = [(offset, length) for inode, offset, length in requests if inode == big]
            assert mine == [(0, 4 * mib), (4 * mib, 4 * mib)]  # 10 MiB: two windows sent, 2 MiB left
            requests.clear()
            cut = await write_file(fs, section, b"cut", 9, truncate_at=3 * mib)
            mine = [(offset, length) for inode, offset, length in requests if inode == cut]
            # 9 MiB: 0-8 MiB sent; truncated to 3 MiB, then 9 MiB more from there (to 12 MiB).
            assert mine == [(0, 4 * mib), (4 * mib, 4 * mib), (3 * mib, 4 * mib), (7 * mib, 4 * mib)]
            requests.clear()
            with monkeypatch.context() as patch:  # a memory spool as big as one may be: none
                patch.setattr(writebehind, "WINDOW", 64 * 1024)
                fh, _ = await fs.create(section.ino, b"tiny", 0o100644, os.O_WRONLY | os.O_CREAT, 0, 0)
                for i in range(spools.MEMORY_SPOOL_MAX // 4096):
                    await fs.write(fh, i * 4096, chunk[:4096])
                assert fs.handles.get(fh).node.spool.in_memory
                await fs.flush(fh)
                await fs.release(fh)
            assert requests == []
            await publisher.drain()
            # A default mount's spool is never synced: it sends nothing.
            default = FileSystem(root, LiveView(root), workers, RecordingInvalidator(), BlockFetcher(root, workers))
            outputs = default.tree.lookup(default.tree.lookup(default.tree.inodes.root, "wb"), "outputs")
            default.tree.inodes.remember(outputs)
            await write_file(default, outputs, b"default", 10)
            assert requests == []
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    with root.read() as view:
        for name, expected in (
            ("big", chunk * 10),
            ("cut", chunk * 12),
            ("tiny", chunk[:4096] * 64),
            ("default", chunk * 10),
        ):
            assert reading.read(root, listing.stat(view, root, "wb", f"outputs/{name}").entry) == expected


def test_random_reads_fetch_only_their_blocks_and_sequential_reads_prefetch(root):
    body = random.Random(5).randbytes(40 * 64 * 1024 + 17)  # 41 blocks
    entry = namespace.put(root, "wb", "input/blob", body)

    async def main():
        async with trio.open_nursery() as nursery:
            fetcher = BlockFetcher(root, Workers(), window=4)
            fetcher.start(nursery)
            stream = Stream()
            rng = random.Random(1)
            touched = set()
            for _ in range(20):
                offset = rng.randrange(len(body))
                if offset == stream.next_offset:
                    continue
                data = await fetcher.read(entry, offset, 100, stream)
                assert data == body[offset : offset + 100]
                touched |= {offset // 65536, (offset + 99) // 65536} if offset + 99 < len(body) else {offset // 65536}
            assert fetcher.prefetched == 0 and fetcher.fetched == len(touched)
            sequential = BlockFetcher(root, Workers(), window=4, memory_bytes=64 << 20)
            sequential.start(nursery)
            stream = Stream()
            out = bytearray()
            while len(out) < len(body):
                out += await sequential.read(entry, len(out), 32 * 1024, stream)
                await trio.sleep(0)
            assert bytes(out) == body
            await trio.sleep(0.2)
            assert sequential.prefetched > 0 and sequential.fetched + sequential.prefetched == 41
            nursery.cancel_scope.cancel()

    trio.run(main)


class RecordingInvalidator:
    def __init__(self):
        self.calls = []

    def entry(self, parent_ino, name, deleted=0):
        self.calls.append(("entry", parent_ino, name, deleted))

    def inode(self, ino, *, attr_only=False):
        self.calls.append(("inode", ino, attr_only))


def test_the_follower_invalidates_foreign_changes_and_skips_this_mounts_own(root):
    invalidator = RecordingInvalidator()
    fs = FileSystem(root, LiveView(root), Workers(), invalidator, None)
    tree = fs.tree
    follower = ChangeFollower(root, fs.changes)
    wbnode = tree.lookup(tree.inodes.root, "wb")
    section = tree.lookup(wbnode, "outputs")
    for node in (wbnode, section):
        tree.inodes.remember(node)
    namespace.put(root, "wb", "outputs/f", b"1")
    assert tree.lookup(section, "missing") is None
    file_node = tree.lookup(section, "f")
    tree.inodes.remember(file_node)
    follower.poll()
    invalidator.calls.clear()

    namespace.put(root, "wb", "outputs/f", b"22")  # another process replaces it
    namespace.put(root, "wb", "outputs/missing", b"now")  # and creates a name looked up before
    follower.poll()
    # The inode stays the old revision's; the path gets a fresh one at its next lookup.
    assert ("entry", section.ino, "f", 0) in invalidator.calls and file_node.detached
    assert ("entry", section.ino, "missing", 0) in invalidator.calls
    file_node = tree.lookup(section, "f")
    assert tree.attributes(file_node).st_size == 2
    tree.inodes.remember(file_node)

    invalidator.calls.clear()
    mine = namespace.put(root, "wb", "outputs/f", b"333")
    tree.own(ChangeEventKind.PathPut, mine.artifact_revision_id)
    follower.poll()
    assert invalidator.calls == []

    tree.begin_change(file_node.incarnation, ("outputs", "f"))  # a change of ours in flight ...
    mine = namespace.put(root, "wb", "outputs/f", b"4444")
    follower.poll()
    assert invalidator.calls == []  # ... defers its event until we know it is ours
    tree.own(ChangeEventKind.PathPut, mine.artifact_revision_id)
    tree.end_change(file_node.incarnation, ("outputs", "f"))
    assert invalidator.calls == []

    namespace.remove(root, "wb", "outputs/f")
    follower.poll()
    assert ("entry", section.ino, "f", file_node.ino) in invalidator.calls
    assert tree.inodes.find("live", file_node.incarnation, ("outputs", "f")) is None

    invalidator.calls.clear()
    workbench.create(root, "fresh")
    follower.poll()
    assert ("entry", inodes.ROOT_INODE, "fresh", 0) in invalidator.calls
    assert "fresh" in [w.workbench_id for w in tree.refresh_workbenches()]


def test_a_getattr_before_the_feed_keeps_an_open_readers_inode_its_file(root):
    """The path is replaced by another process and the kernel asks for the old inode's attributes
    before the follower has seen the change (after a read, atime is stale, so stat(2) asks): the
    inode stays the file its readers opened, size included, and the path is handed a fresh one."""
    invalidator = RecordingInvalidator()
    fs = FileSystem(root, LiveView(root), Workers(), invalidator, None)
    tree = fs.tree
    section = tree.lookup(tree.lookup(tree.inodes.root, "wb"), "outputs")
    tree.inodes.remember(section)
    namespace.put(root, "wb", "outputs/r", b"A" * 1000)
    node = tree.lookup(section, "r")
    tree.inodes.remember(node)
    trio.run(fs.files.open, 10, node, 0)  # O_RDONLY
    namespace.put(root, "wb", "outputs/r", b"B" * 50)  # no follower ran
    assert tree.attributes(node).st_size == 1000
    assert node.detached and ("entry", section.ino, "r", 0) in invalidator.calls
    fresh = tree.lookup(section, "r")
    assert fresh is not node and fresh.ino != node.ino and tree.attributes(fresh).st_size == 50
    assert tree.attributes(node).st_size == 1000 and node.bound.logical_size == 1000
    # With no reader open it is the same: the inode keeps the revision the kernel was told of,
    # and the path's next lookup brings the new one on a fresh inode.
    namespace.put(root, "wb", "outputs/r", b"C" * 7)
    assert tree.attributes(fresh).st_size == 50 and fresh.detached
    newest = tree.lookup(section, "r")
    assert newest is not fresh and tree.attributes(newest).st_size == 7


def test_rmdir_of_a_snapshot_drops_its_other_name_at_once(root):
    from nokvfs.workspace import snapshot

    invalidator = RecordingInvalidator()
    fs = FileSystem(root, LiveView(root), Workers(), invalidator, None)
    tree = fs.tree
    history = tree.lookup(tree.lookup(tree.inodes.root, "wb"), ".snapshots")
    tree.inodes.remember(history)
    trio.run(fs.directories.mkdir, history, "s1", 0o755, 0, 0)
    snapshot_id = snapshot.get(root, "wb", "s1").snapshot_id
    by_alias, by_id = tree.lookup(history, "s1"), tree.lookup(history, str(snapshot_id))
    for node in (by_alias, by_id):
        tree.inodes.remember(node)
    trio.run(fs.directories.rmdir, history, "s1")
    # The kernel drops "s1" itself; the numeric name is invalidated now, not at the next feed poll.
    assert invalidator.calls == [("entry", history.ino, str(snapshot_id), by_id.ino)]
    assert by_id.detached and by_alias.detached
    assert tree.lookup(history, str(snapshot_id)) is None


def test_a_file_renamed_there_and_back_is_two_changes_of_this_mount(root):
    """Both events of a rename there and back name the same revision; each is this mount's own
    and invalidates nothing (one was taken for another process's, and its "gone" path detached
    the file the mount had just moved back there: a new inode number under a stat)."""
    from nokvfs.workspace import namespace as ns

    invalidator = RecordingInvalidator()
    fs = FileSystem(root, LiveView(root), Workers(), invalidator, None)
    follower = ChangeFollower(root, fs.changes)
    follower.poll()
    entry = ns.put(root, "wb", "outputs/a", b"x")
    follower.poll()
    section = fs.tree.lookup(fs.tree.lookup(fs.tree.inodes.root, "wb"), "outputs")
    node = fs.tree.lookup(section, "a")
    for held in (section, node):
        fs.tree.inodes.remember(held)
    for source, target in (("outputs/a", "outputs/b"), ("outputs/b", "outputs/a")):
        moved = ns.rename(root, "wb", source, target)
        fs.tree.own(ChangeEventKind.PathRenamed, moved.artifact_revision_id)
    assert moved.artifact_revision_id == entry.artifact_revision_id
    invalidator.calls.clear()
    follower.poll()
    assert invalidator.calls == [] and not node.detached


# --- memory spools ---------------------------------------------------------------------------------


def _new_file(fs, name: str):
    section = fs.tree.lookup(fs.tree.lookup(fs.tree.inodes.root, "wb"), "outputs")
    fs.tree.inodes.remember(section)
    fh, attr = trio.run(fs.create, section.ino, name.encode(), 0o100644, os.O_RDWR | os.O_CREAT, 0, 0)
    return fh, fs.tree.node(attr.st_ino).spool


def _kernel_less(root):
    workers = Workers()
    return FileSystem(root, LiveView(root), workers, RecordingInvalidator(), BlockFetcher(root, workers))


@pytest.mark.skipif(spools.memory_spool_path("/") is None, reason="no tmpfs at /dev/shm")
def test_a_small_files_spool_lives_in_memory_and_moves_to_disk_before_it_outgrows_it(root):
    fs = _kernel_less(root)
    fh, spool = _new_file(fs, "grows")
    memory = spools.memory_spool_path(root.data_dir)
    assert spool.in_memory and os.path.dirname(spool.path) == memory and os.path.exists(spool.sidecar)
    assert [s.path for s in spools.scan(root.data_dir)] == [spool.path]  # `nokvfs spool list` sees it
    head = b"h" * 1000
    trio.run(fs.write, fh, 0, head)
    name = os.path.basename(spool.path)
    trio.run(fs.write, fh, spools.MEMORY_SPOOL_MAX, b"tail")  # past the memory limit
    assert not spool.in_memory and spool.path == os.path.join(spools.spool_dir(root.data_dir), name)
    assert os.path.exists(spool.sidecar) and not os.listdir(memory)
    with open(spool.path, "rb") as f:
        assert f.read() == head + bytes(spools.MEMORY_SPOOL_MAX - len(head)) + b"tail"
    trio.run(fs.flush, fh)
    trio.run(fs.release, fh)
    from nokvfs.workspace import listing, reading

    with root.read() as view:
        entry = listing.stat(view, root, "wb", "outputs/grows").entry
    assert reading.read(root, entry) == head + bytes(spools.MEMORY_SPOOL_MAX - len(head)) + b"tail"
    assert spools.scan(root.data_dir) == []


@pytest.mark.skipif(spools.memory_spool_path("/") is None, reason="no tmpfs at /dev/shm")
def test_a_kept_memory_spool_is_moved_to_disk_and_the_budget_sends_spools_there(root, monkeypatch):
    fs = _kernel_less(root)
    _, kept = _new_file(fs, "kept")
    trio.run(fs.write, _, 0, b"unpublished")
    kept.keep("a test keeps it")
    (found,) = spools.scan(root.data_dir)
    assert os.path.dirname(found.path) == spools.spool_dir(root.data_dir) and not found.live
    assert found.record["state"] == spools.KEPT and open(found.path, "rb").read() == b"unpublished"
    # Beyond the process's memory budget a growing spool goes to disk.
    monkeypatch.setattr(spools, "MEMORY_SPOOL_BUDGET", spools._memory_held + 100)
    fh_a, a = _new_file(fs, "a")
    fh_b, b = _new_file(fs, "b")
    trio.run(fs.write, fh_a, 0, b"x" * 60)
    trio.run(fs.write, fh_b, 0, b"y" * 60)
    assert a.in_memory and not b.in_memory
    for fh in (fh_a, fh_b):
        trio.run(fs.flush, fh)
        trio.run(fs.release, fh)


def test_memory_spools_stay_off_unless_their_directory_is_private(root, monkeypatch, tmp_path):
    """Another user could make the directory first in the shared /dev/shm: a directory that is
    not this user's alone (or no tmpfs at all) keeps spools on disk."""
    shm = spools.memory_spool_path("/") and "/dev/shm"
    if shm is None:
        pytest.skip("no tmpfs at /dev/shm")
    base = tempfile.mkdtemp(dir=shm)
    try:
        monkeypatch.setenv(spools.MEMORY_SPOOL_ENV, base)
        spools._memory_dirs.clear()
        os.mkdir(os.path.dirname(spools.memory_spool_path(root.data_dir)), 0o777)
        os.chmod(os.path.dirname(spools.memory_spool_path(root.data_dir)), 0o777)
        fh, spool = _new_file(_kernel_less(root), "shared")
        assert not spool.in_memory and os.path.dirname(spool.path) == spools.spool_dir(root.data_dir)
        monkeypatch.setenv(spools.MEMORY_SPOOL_ENV, str(tmp_path))  # not a tmpfs
        spools._memory_dirs.clear()
        assert spools.memory_spool_path(root.data_dir) is None
        monkeypatch.setenv(spools.MEMORY_SPOOL_ENV, "")  # turned off
        assert spools.memory_spool_path(root.data_dir) is None
    finally:
        spools._memory_dirs.clear()
        shutil.rmtree(base, ignore_errors=True)


def test_a_directory_change_accepted_while_the_one_it_replaces_is_stored_survives_in_the_journal(root, monkeypatch):
    """chmod of a directory whose mkdir the publisher takes while the chmod's record is being
    synced, and stores after it: the chmod is its own journal entry (a new name, ending the one it replaces in the same
    write), so the mkdir's published record does not end it, and a replay would store 0o755."""
    import glob
    import threading

    from nokvfs.fs import writeback
    from nokvfs.workspace import attributes, namespace

    disk = threading.Event()
    append = writeback.Journal.append

    def slow_chmod(self, record, *, sync):  # the chmod's flush is slow; the publisher's is not
        if b'"mode":493' in record:
            disk.wait(10)
        append(self, record, sync=sync)

    monkeypatch.setattr(writeback.Journal, "append", slow_chmod)
    storing = threading.Event()
    store = namespace.set_directories_attributes

    def slow_store(root, items):  # the publisher stores the mkdir slowly too
        storing.wait(10)
        return store(root, items)

    monkeypatch.setattr(namespace, "set_directories_attributes", slow_store)

    async def scenario():
        fs, workers, publisher, section = write_back_filesystem(root, syscall_timeout=5)
        async with trio.open_nursery() as nursery:
            workers.start(nursery)
            node = await fs.directories.mkdir(section, "d", 0o700, fs.tree.uid, fs.tree.gid)
            fs.tree.inodes.remember(node)
            nursery.start_soon(fs.directories.set_attributes, node, {"mode": 0o755})
            await trio.sleep(0.2)  # the chmod waits for its flush
            (mkdir,) = [c for c in publisher._done if isinstance(c, writeback.DirectoryChange)]
            stored = publisher._done[mkdir]
            nursery.start_soon(publisher._publish_next)  # takes the mkdir meanwhile
            await trio.sleep(0.2)
            disk.set()  # the chmod is recorded while the mkdir is being stored
            with trio.fail_after(10):
                while publisher._directories[(node.incarnation, node.components)] is mkdir:
                    await trio.sleep(0.01)
            storing.set()  # then the mkdir is stored, and its published record written
            with trio.fail_after(10):
                while mkdir in publisher._storing or publisher._journal_lock.locked():
                    await trio.sleep(0.01)
                await trio.sleep(0.1)  # its published record written
            assert publisher.backlog == 1 and not stored.is_set()  # waiters wait for the chmod
            (journal,) = glob.glob(os.path.join(root.data_dir, "spool", "mount", "writeback-*.journal"))
            with open(journal, "rb") as f:
                raw = f.read()
            assert fs.tree.attributes(node).st_mode & 0o7777 == 0o755  # shown before it is stored
            await publisher.drain()
            nursery.cancel_scope.cancel()
        return node, raw

    node, raw = trio.run(scenario)
    with _journal_restored(raw) as (_, changes):
        assert [(c["path"], c["changes"]) for c in changes] == [("outputs/d", {"mode": 0o755})]
    with root.read() as view:
        stored = namespace.directory_attributes(view, root, node.incarnation, node.components)
    assert stored.mode == 0o755 and isinstance(stored, attributes.Attributes)


def test_worker_threads_serve_a_forked_child_whose_parent_used_them():
    """A daemon forks after its parent process may have run worker calls: the child starts its
    own threads instead of queueing its calls for the parent's, which it does not have."""
    import signal

    async def square(n):
        return await Workers().run(lambda: n * n)

    assert trio.run(square, 3) == 9  # the parent's thread, idle now
    pid = os.fork()
    if pid == 0:  # the child: a call that never returns is killed by the alarm
        signal.alarm(10)
        try:
            os._exit(0 if trio.run(square, 4) == 16 else 1)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --- what a spool's sidecar says, and what the next mount does with it ---------------------------


def _sidecar(spool) -> dict:
    import json

    with open(spool.sidecar) as f:
        return json.load(f)


def _published_opened_read_write(root):
    """outputs/f published, then opened O_RDWR on a kernel-less mount: (fs, outputs, fh, spool)."""
    namespace.put(root, "wb", "outputs/f", b"published")
    fs = _kernel_less(root)
    section = fs.tree.lookup(fs.tree.lookup(fs.tree.inodes.root, "wb"), "outputs")
    fs.tree.inodes.remember(section)
    node = fs.tree.lookup(section, "f")
    fs.tree.inodes.remember(node)
    fh, _ = trio.run(fs.open, node.ino, os.O_RDWR)
    return fs, section, fh, node.spool


def test_a_spools_sidecar_says_dirty_before_the_write_returns_and_orphaned_once_its_file_is_removed(root):
    """The next mount removes a spool whose sidecar says it held nothing unpublished or whose file
    was removed: so the sidecar must say `dirty` before the write that makes it so is answered,
    and `orphaned` once unlink(2) (or a rename over the file) has removed the name."""
    fs, section, fh, spool = _published_opened_read_write(root)
    assert _sidecar(spool)["state"] == spools.LIVE and _sidecar(spool)["dirty"] is False
    trio.run(fs.write, fh, 0, b"P")
    assert _sidecar(spool)["dirty"] is True
    trio.run(fs.flush, fh)  # published: nothing unpublished any more, while the descriptor stays open
    assert not os.path.exists(spool.sidecar or "") or _sidecar(spool)["dirty"] is False
    trio.run(fs.write, fh, 1, b"U")
    assert _sidecar(spool)["dirty"] is True
    trio.run(fs.unlink, section.ino, b"f")
    assert _sidecar(spool)["state"] == spools.ORPHANED
    path = spool.path
    trio.run(fs.release, fh)  # the last descriptor: the bytes go
    assert not os.path.exists(path) and spools.scan(root.data_dir) == []


@pytest.mark.parametrize(
    "record, removed",
    [
        ({"state": "orphaned", "dirty": True}, True),
        ({"state": "live", "dirty": False}, True),
        ({"state": "live", "dirty": True}, False),
        ({"state": "live"}, False),  # written by a build before `dirty`: kept, as then
        ({"state": "a-later-state", "dirty": False}, False),  # a state this build does not know: kept
        ({"state": "kept", "dirty": False}, False),  # already the operator's
        (None, False),  # no sidecar
    ],
)
def test_the_next_mount_removes_only_spools_whose_sidecar_says_they_hold_nothing_to_keep(tmp_path, record, removed):
    data = str(tmp_path)
    directory = spools._made(spools.spool_dir(data))
    path = os.path.join(directory, "wb--f--0001.spool")
    with open(path, "wb") as f:
        f.write(b"bytes")
    if record is not None:
        spools._atomic_json(path + ".json", {"format": 1, "workbench": "wb", "path": "outputs/f", "pid": 1, **record})
    (found,) = spools.scan(data)
    if removed:  # before the next mount: `nokvfs spool retry` refuses it (it would bring a removed file back)
        with pytest.raises(E.InvalidInput, match="nothing to publish"):
            spools.retry(None, found, force=True)
    kept = spools.adopt_orphans(data, os.getpid())
    # A spool kept is described as kept (one without a sidecar gets one saying why).
    assert os.path.exists(path) is not removed and os.path.exists(path + ".json") is not removed
    assert [(k.path, k.record["state"]) for k in kept] == ([] if removed else [(path, "kept")])


@pytest.mark.skipif(spools.memory_spool_path("/") is None, reason="no tmpfs at /dev/shm")
def test_a_removed_files_spool_that_outgrows_memory_moves_to_disk_still_orphaned(root):
    """A temporary file removed while open and then written past the memory spool limit: the
    disk copy's sidecar still says orphaned, so a daemon that ends leaves nothing to keep."""
    fs = _kernel_less(root)
    fh, spool = _new_file(fs, "scratch")
    trio.run(fs.write, fh, 0, b"s" * 1000)
    section = fs.tree.lookup(fs.tree.lookup(fs.tree.inodes.root, "wb"), "outputs")
    trio.run(fs.unlink, section.ino, b"scratch")
    assert spool.in_memory and _sidecar(spool)["state"] == spools.ORPHANED
    trio.run(fs.write, fh, spools.MEMORY_SPOOL_MAX, b"tail")  # past the memory limit
    assert not spool.in_memory and _sidecar(spool)["state"] == spools.ORPHANED
    assert all(spools.holds_nothing_to_keep(s.record) for s in spools.scan(root.data_dir))
    trio.run(fs.release, fh)
    assert spools.scan(root.data_dir) == []


def test_a_sidecar_that_cannot_say_dirty_is_removed_so_the_spool_is_kept(root, monkeypatch):
    """The disk is full when the first write makes a clean spool dirty: the sidecar that says
    "nothing unpublished" must not outlive that write, or the next mount would remove the bytes.
    Without a sidecar, the spool is kept."""
    import errno as errno_

    fs, section, fh, spool = _published_opened_read_write(root)
    assert _sidecar(spool)["dirty"] is False

    def full(path, record, *, durable=False):
        raise OSError(errno_.ENOSPC, "No space left on device")

    monkeypatch.setattr(spools, "_atomic_json", full)
    trio.run(fs.write, fh, 0, b"P")
    assert not os.path.exists(spool.sidecar)
    monkeypatch.undo()
    spool.close(remove=False)  # as a daemon that ends leaves it (its flock gone)
    (kept,) = spools.adopt_orphans(root.data_dir, os.getpid())  # moved to disk if it was in memory
    assert os.path.basename(kept.path) == os.path.basename(spool.path) and kept.record["state"] == spools.KEPT
    with open(kept.path, "rb") as f:
        assert f.read() == b"Published"


def test_the_sidecar_format_1_bytes(root, monkeypatch):
    """Golden bytes of a sidecar (README, durable format): one line of compact JSON, keys sorted,
    `state` and `dirty` as the next mount reads them. Ids and times are fixed here; the owner
    fields (`pid`, `host`, ...) are what the daemon passes in."""
    fs, section, fh, spool = _published_opened_read_write(root)
    monkeypatch.setattr(spools.time, "time_ns", lambda: 1_700_000_000_123_456_789)
    spool.incarnation, spool.created_unix_ms = bytes(range(16)), 1_700_000_000_000
    spool.base, spool.expected_revision = None, bytes(16)
    spool._owner = {}
    expected = (
        b'{"append_only": false, "base_revision": null, "base_size": null, "created_unix_ms": 1700000000000, '
        b'"dirty": false, "expected_revision": "00000000000000000000000000000000", "filled": false, '
        b'"format": 1, "incarnation": "000102030405060708090a0b0c0d0e0f", "path": "outputs/f", "reason": null, '
        b'"size": 9, "state": "live", "updated_unix_ms": 1700000000123, "workbench": "wb"}\n'
    )
    assert spools._sidecar_bytes(spool.record(spools.LIVE)) == expected
    spool.orphaned, spool.dirty = True, True
    orphaned = spools._sidecar_bytes(spool.record(spools.LIVE))
    assert orphaned == expected.replace(b'"dirty": false', b'"dirty": true').replace(b'"live"', b'"orphaned"')
    trio.run(fs.release, fh)


def test_a_files_mtime_moves_by_the_clocks_tick_unless_a_stat_showed_it(monkeypatch):
    """spools.modified_ns: a modification keeps the mtime while the coarse clock (the kernel's
    tick) has not passed it and no stat(2) showed it; otherwise it is the time now. Never an
    mtime from the future, never one older than a shown one."""
    clock = {"fine": 10_000_000, "coarse": 8_000_000}
    monkeypatch.setattr(spools.time, "time_ns", lambda: clock["fine"])
    monkeypatch.setattr(spools.time, "clock_gettime_ns", lambda _: clock["coarse"])
    mtime = 9_000_000  # stamped within the tick that began at 8 ms
    assert spools.modified_ns(mtime, shown=False) == mtime
    assert spools.modified_ns(mtime, shown=True) == 10_000_000  # a stat saw it: it moves
    clock.update(fine=13_000_000, coarse=12_000_000)  # the next tick
    assert spools.modified_ns(mtime, shown=False) == 13_000_000
    clock.update(fine=5_000_000, coarse=4_000_000)  # the clock went back: no mtime from the future
    assert spools.modified_ns(mtime, shown=False) == 5_000_000


def test_a_spools_mtime_moves_at_a_write_after_a_getattr_showed_it(root):
    """FileSystem.getattr marks the spool's mtime shown: the next write moves it, however soon."""
    fs = _kernel_less(root)
    fh, spool = _new_file(fs, "stamped")
    trio.run(fs.write, fh, 0, b"a")
    shown = fs.getattr(_ino_of(fs, "stamped")).st_mtime_ns
    trio.run(fs.write, fh, 1, b"b")
    assert spool.mtime_ns > shown and not spool.mtime_shown
    trio.run(fs.flush, fh)
    trio.run(fs.release, fh)


def _ino_of(fs, name: str) -> int:
    section = fs.tree.lookup(fs.tree.lookup(fs.tree.inodes.root, "wb"), "outputs")
    return fs.tree.lookup(section, name).ino


def test_a_directorys_attributes_are_read_again_once_any_process_has_committed(root, monkeypatch):
    """Tree.directory_attributes keeps a directory's stored attributes while nothing is committed
    (a stat of the directory, or a create in it, reads no marker) or only commits of this process
    that did not write the marker, and reads them again after one that did, or after any commit of
    another process, so a chmod from anywhere shows at once."""
    import subprocess
    import sys

    from tests.mount_fixtures import env

    fs = _kernel_less(root)
    tree = fs.tree
    namespace.set_directory_attributes(root, "wb", "outputs/d", mode=0o750)
    section = tree.lookup(tree.lookup(tree.inodes.root, "wb"), "outputs")
    node = tree.lookup(section, "d")
    tree.inodes.remember(node)
    tree.subdirectories(node)  # the scan of its children a stat makes once (kept on the node)
    reads = []
    real = tree.view.read
    monkeypatch.setattr(tree.view, "read", lambda: (reads.append(1), real())[1])
    first = tree.directory_attributes(node)
    assert first.mode & 0o7777 == 0o750 and len(reads) == 1
    assert tree.directory_attributes(node) is first and len(reads) == 1
    assert stat.S_IMODE(tree.attributes(node).st_mode) == 0o750 and len(reads) == 1
    namespace.put(root, "wb", "outputs/elsewhere", b"1")  # a commit of this process, elsewhere
    assert tree.directory_attributes(node) is first and len(reads) == 1
    namespace.put(root, "wb", "outputs/d/inside", b"1")  # in the directory, not its marker
    assert tree.directory_attributes(node) is first and len(reads) == 1
    namespace.set_directory_attributes(root, "wb", "outputs/d", mode=0o710)  # this process, the marker
    assert tree.directory_attributes(node).mode & 0o7777 == 0o710 and len(reads) == 2
    script = (
        "from nokvfs.workspace import datadir, namespace\n"
        f"root = datadir.open_root({root.data_dir!r}, verify=False)\n"
        "namespace.set_directory_attributes(root, 'wb', 'outputs/d', mode=0o700)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env(), timeout=60)
    assert tree.directory_attributes(node).mode & 0o7777 == 0o700 and len(reads) == 3
    assert stat.S_IMODE(tree.attributes(node).st_mode) == 0o700


def test_a_live_entry_is_read_again_once_any_process_has_committed(root, monkeypatch):
    """Tree.current_entry keeps a path's entry while nothing is committed (open(2) and stat(2)
    of an unchanged file read nothing) or only commits of this process that did not write the
    path, and reads it again after one that did, or after any commit of another process (LMDB's
    last transaction id, read from the shared meta page, is not one this process recorded)."""
    import subprocess
    import sys

    from tests.mount_fixtures import env

    fs = _kernel_less(root)
    tree = fs.tree
    namespace.put(root, "wb", "outputs/kept", b"1")
    section = tree.lookup(tree.lookup(tree.inodes.root, "wb"), "outputs")
    node = tree.lookup(section, "kept")
    tree.inodes.remember(node)
    reads = []
    real = tree.view.read
    monkeypatch.setattr(tree.view, "read", lambda: (reads.append(1), real())[1])
    first = tree.current_entry(node)
    assert tree.current_entry(node) is first and tree.attributes(node).st_size == 1 and len(reads) == 1
    namespace.put(root, "wb", "outputs/other", b"2")  # a commit of this process, elsewhere
    assert tree.current_entry(node) is first and len(reads) == 1
    namespace.put(root, "wb", "outputs/kept", b"333")  # this process, the path
    mine = tree.current_entry(node)
    assert len(reads) == 2 and mine.logical_size == 3
    assert tree.current_entry(node) is mine and len(reads) == 2
    first = mine
    script = (
        "from nokvfs.workspace import datadir, namespace\n"
        f"root = datadir.open_root({root.data_dir!r}, verify=False)\n"
        "namespace.put(root, 'wb', 'outputs/kept', b'22')\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env(), timeout=60)
    replaced = tree.current_entry(node)
    assert len(reads) == 3 and replaced.artifact_revision_id != first.artifact_revision_id
    assert replaced.logical_size == 2
