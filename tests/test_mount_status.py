"""Operating a mount (issue 18): `nokvfs status` against a live mount under load, its owner-only
channel, a conflict counted and its spool shown, and the Prometheus endpoint scraped and parsed by
the client library's own parser."""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from tests.mount_fixtures import (  # noqa: F401
    REPO,
    close_after_a_replacement,
    env,
    mount,
    mounted,
    needs_fuse,
)

pytestmark = needs_fuse


def nokvfs(*argv, timeout: float = 60, user_uid: int | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "nokvfs.cli.main", *argv]
    if user_uid is not None:
        command = ["setpriv", f"--reuid={user_uid}", f"--regid={user_uid}", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env(), cwd=REPO)


def status(m, *extra) -> dict:
    done = nokvfs("status", m.mountpoint, "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_of_a_mount_under_load(mount):
    """Writers and readers keep the mount busy while `nokvfs status` is asked again and again: the
    counters only grow, every publication is counted, nothing failed, and both option orders work."""
    outputs = mount.path("wb", "outputs")
    stop = threading.Event()
    written = []

    def writer():
        index = 0
        while not stop.is_set():
            path = os.path.join(outputs, f"load-{index % 20}.txt")
            subprocess.run(["sh", "-c", f"echo line {index} > {path}"], check=True)
            written.append(path)
            index += 1

    def reader():
        while not stop.is_set():
            for path in list(written[-5:]):
                subprocess.run(["cat", path], capture_output=True)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    seen = []
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            seen.append(status(mount))
            time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert len(seen) >= 3
    counts = [s["publications"]["count"] for s in seen]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    final = status(mount, "--data-dir", mount.data_dir)  # a global option after the subcommand
    same = nokvfs("--data-dir", mount.data_dir, "status", mount.mountpoint, "--json")  # and before it
    assert same.returncode == 0 and json.loads(same.stdout)["mountpoint"] == mount.mountpoint
    assert final["publications"]["count"] == len(written)  # every `echo >` published exactly once
    assert final["publications"]["failed"] == 0 and final["reads"]["failed"] == 0
    assert final["reads"]["count"] > 0 and final["writes"]["count"] >= len(written)
    assert final["store"]["put"]["count"] >= 1 and final["store"]["put"]["failed"] == 0
    assert final["mode"] == "owner" and final["data_dir"] == mount.data_dir
    assert final["mountpoint"] == mount.mountpoint and final["pid"] == mount.proc.pid
    assert 10 << 20 < final["rss_bytes"] < 2 << 30
    assert (
        final["rss_anon_bytes"] + final["rss_file_bytes"] + final["rss_shmem_bytes"] == final["rss_bytes"]
        and final["rss_anon_bytes"] > 0
    )
    assert final["spools"] == {"open": 0, "live": 0, "kept": 0, "kept_bytes": 0, "kept_by_reason": {}}
    assert final["change_feed"]["versions_behind"] >= 0 and final["replication"] is None and final["write_back"] is None
    assert final["publications"]["buckets"][-1] == ["+Inf", final["publications"]["count"]]
    text = nokvfs("status")  # every mount, for people (other mounts on this machine may not answer: exit 3)
    assert text.returncode in (0, 3) and mount.mountpoint not in text.stderr
    assert f"{mount.mountpoint}\n  data directory:  {mount.data_dir}\n  mode:            owner\n" in text.stdout
    assert f"publications:    {len(written)} " in text.stdout


def test_a_conflict_is_counted_and_its_spool_shown(mount):
    assert (
        close_after_a_replacement(mount, "outputs/contended.txt", b"this mount", b"another process").errno
        == errno.EBUSY
    )
    deadline = time.monotonic() + 10
    while (s := status(mount))["spools"]["kept"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s["spools"]["kept"] == 1 and s["spools"]["kept_bytes"] == len(b"this mount")
    assert s["spools"]["kept_by_reason"] == {"GenerationConflict": 1}
    assert s["publications"]["failures"] == {"GenerationConflict": 1}
    assert "1 kept (10 B): GenerationConflict 1" in nokvfs("status", mount.mountpoint).stdout


# A stdlib-only client (another user cannot import root's site-packages): what the socket answers.
ASK = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("refused", exc.errno)
    raise SystemExit
print("answered", s.recv(1 << 20).decode().strip())
"""


def ask_as(uid: int, path: str) -> str:
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-S", "-c", ASK, path],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or not os.path.exists("/usr/bin/python3"),
    reason="needs root to make a second user",
)
def test_only_the_owner_and_root_may_ask():
    from nokvfs.fs.status import StatusServer

    user = f"nokvs{os.getpid() % 100000}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True, capture_output=True
    )
    base = tempfile.mkdtemp(prefix="nokvfs-status-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        uid = pwd.getpwnam(user).pw_uid
        with mounted(base) as m:
            run_dir = os.path.join(m.data_dir, "run")
            sockets = [n for n in os.listdir(run_dir) if n.endswith(".sock")]
            assert len(sockets) == 1
            path = os.path.join(run_dir, sockets[0])
            assert os.stat(path).st_mode & 0o777 == 0o600
            assert os.stat(run_dir).st_mode & 0o777 == 0o700
            assert ask_as(uid, path) == f"refused {errno.EACCES}"  # the private data directory keeps others out
            assert status(m)["mode"] == "owner"  # root is answered
            assert json.loads(ask_as(0, path).split(" ", 1)[1])["pid"] == m.proc.pid
        # Behind the file modes, the daemon checks the peer's credentials itself: a socket others
        # could reach (a directory made wide by hand) still answers only its owner and root.
        wide = os.path.join(base, "wide.sock")
        server = StatusServer(wide, lambda: {"secret": 42})
        server.start()
        try:
            os.chmod(wide, 0o666)
            refused = json.loads(ask_as(uid, wide).split(" ", 1)[1])
            assert "permission denied" in refused["error"] and "secret" not in refused
            assert json.loads(ask_as(0, wide).split(" ", 1)[1]) == {"secret": 42}
        finally:
            server.stop()
        assert not os.path.exists(wide)
    finally:
        subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_stopping_the_status_channel_ends_its_thread_at_once(tmp_path):
    """An unmount stops the status channel: its thread, blocked in accept(2), is woken and ends
    (it used to poll for the stop every half second, which every unmount then waited for)."""
    from nokvfs.fs.status import StatusServer

    path = str(tmp_path / "status.sock")
    server = StatusServer(path, lambda: {"answered": True})
    server.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        assert json.loads(sock.makefile().readline()) == {"answered": True}
    thread = server._thread
    server.stop()  # joins the thread for up to 2 s: one still blocked in accept(2) is alive after
    assert not thread.is_alive() and not os.path.exists(path)


def test_status_of_what_is_not_a_live_mount(tmp_path):
    done = nokvfs("status", str(tmp_path), "--json")
    assert done.returncode == 3 and "not a nokvfs mount" in done.stderr
    with mounted(str(tmp_path)) as m:
        assert status(m)["mode"] == "owner"
    gone = nokvfs("status", m.mountpoint)
    assert gone.returncode == 3 and "not a nokvfs mount" in gone.stderr
    assert not [n for n in os.listdir(os.path.join(m.data_dir, "run")) if n.endswith(".sock")]  # removed at unmount


def test_read_only_mount_says_so(tmp_path):
    with mounted(str(tmp_path), extra_args=("--read-only",)) as m:
        s = status(m)
    assert s["mode"] == "read-only"


def test_metrics_endpoint_parsed_by_the_client_library(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    with mounted(str(tmp_path), extra_args=("--metrics", str(port))) as m:
        for index in range(5):
            with open(m.path("wb", "outputs", f"m{index}.txt"), "w") as f:
                f.write("metric me\n" * index)
        for index in range(5):
            with open(m.path("wb", "outputs", f"m{index}.txt")) as f:
                f.read()
        time.sleep(0.2)  # the last release publishes after close(2) returned
        s = status(m)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        address = _non_loopback_address()  # this machine's own other address, if it has one
        if address is not None:
            with pytest.raises(OSError):  # loopback only by default
                socket.create_connection((address, port), timeout=2).close()
    with pytest.raises(ConnectionRefusedError):  # the unmount closed the listener
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    info = families["nokvfs_mount_info"].samples[0]
    assert info.labels["data_dir"] == m.data_dir and info.labels["mode"] == "owner"

    def value(family, sample_name, **labels):
        for sample in families[family].samples:
            if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
        raise AssertionError(f"no {sample_name} {labels} in {family}")

    assert value("nokvfs_publication_seconds", "nokvfs_publication_seconds_count") == s["publications"]["count"] == 5
    assert value("nokvfs_publication_seconds", "nokvfs_publication_seconds_bucket", le="+Inf") == 5
    assert value("nokvfs_read_seconds", "nokvfs_read_seconds_count") >= 4
    assert value("nokvfs_store_call_seconds", "nokvfs_store_call_seconds_count", call="put") >= 1
    assert value("nokvfs_syscall_timeouts", "nokvfs_syscall_timeouts_total") == 0
    assert value("nokvfs_spools_kept", "nokvfs_spools_kept") == 0
    assert value("nokvfs_resident_memory_bytes", "nokvfs_resident_memory_bytes") > 10 << 20
    assert (
        value("nokvfs_shard_commit_version", "nokvfs_shard_commit_version") >= s["change_feed"]["shard_commit_version"]
    )


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing address
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_metrics_option_is_checked_before_mounting(tmp_path):
    for bad in ("localhost:9100", "127.0.0.1:0", "127.0.0.1:http", "99999"):
        done = nokvfs("mount", str(tmp_path / "data"), str(tmp_path), "--metrics", bad)
        assert done.returncode == 2 and "--metrics" in done.stderr, (bad, done.stderr)


def test_a_write_back_mount_shows_its_backlog_draining(tmp_path):
    """`--write-back`: status counts the files accepted at close and says when they are published."""
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    with mounted(str(tmp_path), extra_args=("--write-back", "--metrics", str(port))) as m:
        for index in range(20):
            with open(m.path("wb", "outputs", f"wb{index}.txt"), "w") as f:
                f.write(f"accepted {index}\n")
        deadline = time.monotonic() + 60
        while (s := status(m))["write_back"]["published"] < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s["write_back"] == {"backlog": 0, "accepted": 20, "published": 20, "failed": 0}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
        assert families["nokvfs_writeback_published"].samples[0].value == 20
        assert families["nokvfs_writeback_backlog"].samples[0].value == 0
        assert (
            "write-back:      0 waiting to publish; 20 accepted, 20 published, 0 failed"
            in nokvfs("status", m.mountpoint).stdout
        )
