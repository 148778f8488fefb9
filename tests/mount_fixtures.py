"""Real mounts for the mount tests: a data directory, a daemon subprocess, a guaranteed unmount.

`mounted()` initialises a temporary data directory (with workbenches), starts
`python3 -m nokvfs.cli.main mount DATA MNT --foreground` as a subprocess, waits until the mountpoint is
a mount, and always -- even when the test fails -- unmounts (fusermount3 -u, falling back to
umount -l), stops the daemon and asserts nothing is left mounted. The `mount` pytest fixture
wraps it; test modules import it with `from tests.mount_fixtures import mount`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOUNT_TIMEOUT = 30.0
# What `ls -a /<wb>` lists (without . and ..): the read-only views' dot-names, then the sections.
WORKBENCH_LISTING = [".commits", ".snapshots", ".tags", "input", "logs", "metadata", "outputs", "scripts"]

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None and os.geteuid() != 0,
    reason="FUSE is not available here",
)


def env() -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = REPO + os.pathsep + out.get("PYTHONPATH", "")
    out.pop("NOTIFY_SOCKET", None)
    return out


def init_data_dir(data_dir: str, workbenches=("wb",), **options) -> None:
    from nokvfs.workspace import datadir, workbench

    datadir.init(data_dir, **options)
    root = datadir.open_root(data_dir, verify=False, recover=False)
    try:
        for name in workbenches:
            workbench.create(root, name)
    finally:
        if root.blocks.cache is not None:
            root.blocks.cache.close()  # release the cache lock: the daemon should own the cache
        root.close()


@dataclasses.dataclass
class Mount:
    data_dir: str
    mountpoint: str
    proc: subprocess.Popen
    log_path: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.mountpoint, *parts)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def facade(
        self, code: str, *, data: bytes | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run `code` in another process with `root` open on this data directory (a CLI stand-in).

        `data` arrives on stdin and is bound to the name `data`.
        """
        script = "import sys\nfrom nokvfs.workspace import datadir, namespace, workbench, listing, append, reading\n"
        script += f"root = datadir.open_root({self.data_dir!r}, verify=False)\n"
        if data is not None:
            script += "data = sys.stdin.buffer.read()\n"
        script += textwrap.dedent(code)
        done = subprocess.run(
            [sys.executable, "-c", script], input=data, capture_output=True, env=env(), timeout=timeout
        )
        done.stdout = done.stdout.decode(errors="replace")
        done.stderr = done.stderr.decode(errors="replace")
        if check and done.returncode != 0:
            raise AssertionError(f"facade process failed ({done.returncode}):\n{done.stderr}")
        return done

    def facade_waiting(self, code: str) -> subprocess.Popen:
        """Start a facade process now that runs `code` once it reads a line on stdin.

        A process forked while the test holds a descriptor open for writing closes its copy at
        exec, and that close is a flush (a publication): start helpers before opening files.
        """
        script = "import sys\nfrom nokvfs.workspace import datadir, namespace, workbench, listing, append, reading\n"
        script += f"root = datadir.open_root({self.data_dir!r}, verify=False)\n"
        script += "print('ready', flush=True)\nsys.stdin.readline()\n"
        script += textwrap.dedent(code)
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env(),
        )
        assert proc.stdout.readline().strip() == b"ready"
        return proc


def wait_mounted(mountpoint: str, proc: subprocess.Popen, log_path: str) -> None:
    """Until the daemon's mount is live at `mountpoint`. statfs is asked first: a mountpoint a
    killed daemon left answers lstat from the kernel's cached root attributes, so `ismount` first
    could see that dead mount and a statfs right after it the bare directory the new daemon has
    just uncovered (it clears the dead mount before mounting), which once let a test go on before
    anything was mounted. A statfs that succeeds means no dead mount is there any more; a nokvfs
    mount seen after it is the new daemon's."""
    from nokvfs.fs.mountinfo import mount_fstype

    deadline = time.monotonic() + MOUNT_TIMEOUT
    while time.monotonic() < deadline:
        if not _stale(mountpoint) and os.path.ismount(mountpoint) and mount_fstype(mountpoint) == "fuse.nokvfs":
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    with open(log_path, errors="replace") as f:
        raise AssertionError(f"the daemon did not mount {mountpoint} (exit {proc.poll()}):\n{f.read()}")


def unmount(mountpoint: str) -> None:
    """Unmount whatever is at `mountpoint`, however it is (live, busy or dead)."""
    for argv in (
        ["fusermount3", "-u", mountpoint],
        ["fusermount3", "-u", "-z", mountpoint],
        ["umount", "-l", mountpoint],
    ):
        if not os.path.ismount(mountpoint) and not _stale(mountpoint):
            return
        subprocess.run(argv, capture_output=True, timeout=30)


def _stale(mountpoint: str) -> bool:
    try:
        os.statvfs(mountpoint)  # always reaches the daemon; stat may be served from cache
    except OSError:
        return True
    return False


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def start_daemon(data_dir: str, mountpoint: str, log_path: str, extra_args=()) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "nokvfs.cli.main", "mount", data_dir, mountpoint, "--foreground", *extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env(),
            cwd=REPO,
        )
    finally:
        log.close()


@contextlib.contextmanager
def mounted(base: str, *, workbenches=("wb",), extra_args=(), init: bool = True, **init_options):
    data_dir = os.path.join(base, "data")
    mountpoint = os.path.join(base, "mnt")
    log_path = os.path.join(base, "daemon.log")
    os.makedirs(mountpoint, exist_ok=True)
    if init:
        init_data_dir(data_dir, workbenches, **init_options)
    proc = start_daemon(data_dir, mountpoint, log_path, extra_args)
    try:
        wait_mounted(mountpoint, proc, log_path)
        yield Mount(data_dir, mountpoint, proc, log_path)
    finally:
        unmount(mountpoint)
        stop(proc)
        if os.path.ismount(mountpoint) or _stale(mountpoint):
            unmount(mountpoint)
            raise AssertionError(f"{mountpoint} was left mounted")


def close_after_a_replacement(m: Mount, relative: str, mine: bytes, theirs: bytes) -> OSError:
    """Write `mine` over `wb:relative` through the mount while another process publishes `theirs`
    there; the error close(2) then raises (a conflict: EBUSY)."""
    path = m.path("wb", *relative.split("/"))
    with open(path, "wb") as f:
        f.write(b"v1")
    other = m.facade_waiting(f"namespace.put(root, 'wb', {relative!r}, {theirs!r})")
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, mine)
    _, err = other.communicate(b"go\n", timeout=60)
    assert other.returncode == 0, err
    try:
        os.close(fd)
    except OSError as exc:
        return exc
    raise AssertionError(f"close(2) of {path} succeeded although another process replaced it")


def fsck_clean(data_dir: str) -> None:
    """`nokvfs fsck` of the data directory finds nothing (it may run beside a live mount)."""
    done = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", "--data-dir", data_dir, "fsck"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def mount(tmp_path):
    with mounted(str(tmp_path)) as m:
        yield m


# --- populating big directories through the facade ---------------------------------------------


def populate_many(
    root, workbench_id: str, directory: str, count: int, *, batch: int = 4000, body: bytes = b"x", prefix: str = "f"
) -> list[str]:
    """`count` files `directory/<prefix>NNNNNN` sharing one revision, in commands of `batch` paths.

    One publication makes the revision; every further path is a PathCurrent row plus a Path
    reference in one MetadataCommand per batch (no ChangeEvents: populate before mounting).
    """
    import dataclasses

    from nokvfs.engine.command import Absent, Put
    from nokvfs.schema import keys
    from nokvfs.schema.enums import ReferenceKind
    from nokvfs.schema.paths import normalize_path
    from nokvfs.workspace import namespace, publish
    from nokvfs.workspace import workbench as wb
    from nokvfs.workspace.refs import References
    from nokvfs.workspace.root import Built, intent_digest

    names = [f"{prefix}{i:06d}" for i in range(count)]
    first = namespace.put(root, workbench_id, f"{directory}/{names[0]}", body)
    for start in range(1, count, batch):
        chunk = names[start : start + batch]

        def build(view, chunk=chunk):
            raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
            incarnation = workbench.incarnation_id
            version = view.version + 1
            refs = References(view, root.root_id)
            predicates, mutations = [], []
            for name in chunk:
                components = normalize_path(f"{directory}/{name}")
                key = keys.path_current_key(root.root_id, incarnation, components)
                refs.add(ReferenceKind.Path, publish.path_owner(incarnation, components), first.artifact_revision_id)
                predicates.append(Absent("path_current", key))
                mutations.append(
                    Put(
                        "path_current",
                        key,
                        dataclasses.replace(first, created_version=version, modified_version=version),
                    )
                )
            ref_predicates, ref_mutations = refs.rows()
            wb_predicate, wb_mutation = wb.advance_revision(root.root_id, workbench_id, raw_wb, version)
            return Built(
                predicates=ref_predicates + predicates + [wb_predicate],
                mutations=ref_mutations + mutations + [wb_mutation],
            )

        root.apply(build, digest=intent_digest("test.populate", workbench_id, directory, start, count))
    return names
