"""Progress of long commands: on stderr when it is a terminal (a real pseudo-terminal here) or
with --progress, driven by the work done, rate-limited, ended by a one-line summary, and never
in stdout (so --json output stays parseable)."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
import threading
import time

import pytest

from nokvfs.cli.progress import INTERVAL, Progress

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = 120
DIRECTORIES = 5  # run1 and its d0..d3: a put stores each one's attributes (a directory marker)


# --- the helper itself, on a fake clock ---------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_updates_are_drawn_at_most_once_an_interval_with_the_latest_figures():
    clock, out = Clock(), Tty()
    progress = Progress("copy", enabled=True, unit="files", stream=out, clock=clock)
    progress.set_totals(1000, 1000 * 10)
    for _n in range(1000):  # 1000 updates within 0.1 s: one line (the first)
        clock.now += 0.0001
        progress.advance(1, 10)
    assert progress.lines == 1
    for _ in range(3):  # one more per interval, showing the figures of that moment
        clock.now += INTERVAL
        progress.advance(0, 0)
    assert progress.lines == 4
    clock.now += 2
    progress.finish()
    text = out.getvalue()
    assert text.count("\x1b[K") == 5 and text.endswith(
        "copy: 1,000/1,000 files, 9.8 KiB / 9.8 KiB (100%) in 2.9 s\x1b[K\n"
    )
    assert "copy: 1/1,000 files, 10 B / 9.8 KiB (0%), 0 s\x1b[K" in text


def test_without_a_terminal_each_update_is_a_line_and_a_disabled_line_says_nothing():
    clock, out = Clock(), io.StringIO()
    progress = Progress("fsck", enabled=True, stream=out, clock=clock, units={"blocks": "objects"})
    progress.report("blocks", 1, 3, 100, 300)
    clock.now += INTERVAL
    progress.report("blocks", 3, 3, 300, 300)
    progress.finish("3 objects checked")
    assert out.getvalue().splitlines() == [
        "fsck: blocks: 1/3 objects, 100 B / 300 B (33%), 0 s",
        "fsck: blocks: 3/3 objects, 300 B / 300 B (100%), 0 s",
        "fsck: 3 objects checked in 0.2 s",
    ]
    quiet = io.StringIO()
    off = Progress("gc", enabled=False, stream=quiet, clock=clock)
    off.advance(5)
    off.finish()
    assert quiet.getvalue() == ""


def test_a_small_single_item_stays_quiet_and_a_big_one_is_shown():
    out = io.StringIO()
    small = Progress("put a", enabled=True, stream=out, quiet_below_bytes=1000)
    small.set_totals(1, 999)
    small.advance(1, 999)
    small.finish()
    assert out.getvalue() == ""
    big = Progress("put b", enabled=True, stream=out, quiet_below_bytes=1000)
    big.set_totals(1, None)
    callback = big.body_callback()
    callback(500, 5000)  # a stream's total is known once it is spooled
    big.finish()
    assert out.getvalue().startswith("put b: 0/1 items, 500 B / 4.9 KiB (10%)")


def test_output_lines_clear_the_terminal_line_and_a_failure_leaves_no_half_line(capsys):
    clock, out = Clock(), Tty()
    progress = Progress("put", enabled=True, stream=out, clock=clock)
    progress.advance(1)
    progress.above("put wb:outputs/a generation=1")
    assert out.getvalue().endswith("\r\x1b[K") and capsys.readouterr().out == "put wb:outputs/a generation=1\n"
    clock.now += INTERVAL
    progress.advance(1)
    progress.abandon()
    assert out.getvalue().endswith("\r\x1b[K")
    progress.finish()  # after a failure: no summary
    assert out.getvalue().endswith("\r\x1b[K")


def test_labels_and_stages_are_escaped():
    out = io.StringIO()
    progress = Progress("put wb:outputs/\x1b[2Jx", enabled=True, stream=out)
    progress.report("st\u202eage", 1)
    assert "\x1b" not in out.getvalue() and "\u202e" not in out.getvalue()
    assert "put wb:outputs/\\x1b[2Jx: st\\u{202e}age: 1 items" in out.getvalue()


# --- real commands: stderr a pseudo-terminal, or redirected with --progress ---------------------


def env():
    out = dict(os.environ, PYTHONPATH=REPO)
    out.pop("NOKVFS_DATA_DIR", None)
    return out


def run_on_terminal(*argv, stdin=None):
    """The CLI with stderr on a pseudo-terminal and stdout a pipe: (code, stdout, stderr text, seconds)."""
    master, slave = pty.openpty()
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nokvfs.cli.main", *argv],
            stdout=subprocess.PIPE,
            stderr=slave,
            input=stdin,
            cwd=REPO,
            env=env(),
            timeout=300,
        )
    finally:
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    return proc.returncode, proc.stdout, b"".join(chunks).decode(), time.monotonic() - started


def run_redirected(*argv, stdin=None):
    proc = subprocess.run(
        [sys.executable, "-m", "nokvfs.cli.main", *argv],
        capture_output=True,
        input=stdin,
        cwd=REPO,
        env=env(),
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr.decode()


def terminal_frames(err: str):
    """What the terminal was told: (drawn progress lines, the final summary line)."""
    text = err.replace("\r\n", "\n")  # the terminal's output processing turns \n into \r\n
    drawn, summary = [], None
    for segment in text.split("\r"):
        if not segment or segment == "\x1b[K":
            continue  # a clear before the command's own output or an error
        assert segment.endswith("\x1b[K") or segment.endswith("\x1b[K\n"), repr(segment)
        if segment.endswith("\n"):
            assert summary is None, "two summaries"
            summary = segment[: -len("\x1b[K\n")]
        else:
            drawn.append(segment[: -len("\x1b[K")])
    return drawn, summary


@pytest.fixture
def tree(tmp_path):
    """A data directory with workbench wb, and a local tree of FILES files of known sizes."""
    data = str(tmp_path / "data")
    assert run_redirected("init", "--data-dir", data, "--block-size", "4KiB")[0] == 0
    assert run_redirected("workbench", "create", "wb", "--data-dir", data)[0] == 0
    top = tmp_path / "run1"
    sizes = {}
    for n in range(FILES):
        path = top / f"d{n % 4}" / f"f{n:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1000 + 37 * n))
        sizes[f"d{n % 4}/f{n:03d}.bin"] = 1000 + 37 * n
    return data, top, sizes


def test_recursive_put_and_get_on_a_terminal(tree, tmp_path):
    data, top, sizes = tree
    total = sum(sizes.values())
    code, out, err, seconds = run_on_terminal("put", "wb:outputs/run1", str(top), "--data-dir", data)
    assert code == 0, err
    assert b"\x1b" not in out  # stdout is the command's own: a line per file and per directory
    lines = out.decode().splitlines()
    assert (
        len(lines) == FILES + DIRECTORIES
        and sum(line.endswith(" directory mode=0755") for line in lines) == DIRECTORIES
    )
    drawn, summary = terminal_frames(err)
    assert len(drawn) <= seconds / INTERVAL + 2  # rate-limited
    assert re.fullmatch(
        rf"put {FILES} files: {FILES}/{FILES} files, [\d.]+ KiB / [\d.]+ KiB \(100%\) in [\d.]+ s", summary
    ), summary
    assert f"{total / 1024:.1f} KiB / {total / 1024:.1f} KiB" in summary  # the bytes actually put
    for line in drawn:  # every frame shows figures no larger than the totals
        done = int(re.search(r": ([\d,]+)/", line).group(1).replace(",", ""))
        assert 0 <= done <= FILES

    dest = tmp_path / "back"
    code, out, err, _ = run_on_terminal("get", "-R", "wb:outputs/run1", str(dest), "--data-dir", data)
    assert code == 0 and out == b"", err
    _, summary = terminal_frames(err)
    assert summary.startswith(
        f"get wb:outputs/run1: {FILES}/{FILES} files, {total / 1024:.1f} KiB / {total / 1024:.1f} KiB (100%)"
    )
    for below, _size in sizes.items():
        assert (dest / below).read_bytes() == (top / below).read_bytes()

    # the same get as of a snapshot: one code path, -r and -R alike, redirected with --progress
    assert run_redirected("snapshot", "mint", "wb", "--alias", "s", "--data-dir", data)[0] == 0
    dest = tmp_path / "as-of"
    code, out, err = run_redirected(
        "as-of", "wb@snapshot:s", "get", "-r", "outputs/run1", str(dest), "--progress", "--data-dir", data
    )
    assert code == 0 and out == b"", err
    assert err.splitlines()[-1].startswith(
        f"get wb@snapshot:s:outputs/run1: {FILES}/{FILES} files, {total / 1024:.1f} KiB / {total / 1024:.1f} KiB "
        "(100%) in "
    )
    assert all((dest / below).read_bytes() == (top / below).read_bytes() for below in sizes)


@pytest.mark.long
def test_gc_fsck_and_restore_report_what_they_did(tree, tmp_path):
    data, top, sizes = tree
    assert run_redirected("put", "wb:outputs/run1", str(top), "--data-dir", data)[0] == 0
    assert run_redirected("snapshot", "mint", "wb", "--alias", "before", "--data-dir", data)[0] == 0

    code, out, err, _ = run_on_terminal(
        "restore", "wb", "--from", "snapshot:before", "--to", "copy", "--data-dir", data
    )
    assert code == 0, err
    assert terminal_frames(err)[1].startswith(
        f"restore copy: restored {FILES + DIRECTORIES} members in "
    )  # markers too

    removed = sorted(sizes)[:10]
    for below in removed:
        for wb in ("wb", "copy"):
            assert run_redirected("rm", f"{wb}:outputs/run1/{below}", "--data-dir", data)[0] == 0
    assert run_redirected("snapshot", "retire", "wb", "before", "--data-dir", data)[0] == 0
    code, out, err, _ = run_on_terminal("gc", "--data-dir", data)
    assert code == 0, err
    freed = sum(sizes[b] for b in removed)
    _, summary = terminal_frames(err)
    assert summary.startswith(f"gc: freed 10 revisions ({freed / 1024:.1f} KiB), pruned "), summary
    assert out.decode().startswith(f"freed 10 revision(s), {freed / 1024:.1f} KiB ({freed} bytes)")

    code, out, err, _ = run_on_terminal("fsck", "--data-dir", data)
    assert code == 0, err + out.decode()
    checked = json.loads(run_redirected("fsck", "--json", "--data-dir", data)[1])["checked"]
    _, summary = terminal_frames(err)
    assert summary.startswith("fsck: 0 finding(s); checked ") and f"{checked['objects']} objects" in summary


def test_progress_redirected_is_plain_lines_and_json_stays_parseable(tree):
    data, top, sizes = tree
    code, out, err = run_redirected("put", "--json", "--progress", "wb:outputs/run1", str(top), "--data-dir", data)
    assert code == 0, err
    rows = json.loads(out)
    assert sorted(r["path"] for r in rows if r.get("kind") != "dir") == sorted(f"outputs/run1/{b}" for b in sizes)
    assert len(rows) == FILES + DIRECTORIES
    lines = err.splitlines()
    assert "\r" not in err and "\x1b" not in err
    assert all(line.startswith(f"put {FILES} files: ") for line in lines)
    assert re.fullmatch(rf"put {FILES} files: {FILES}/{FILES} files, .* \(100%\) in [\d.]+ s", lines[-1])
    for command in (["gc", "--json"], ["fsck", "--json"]):
        code, out, err = run_redirected(*command, "--progress", "--data-dir", data)
        assert code == 0, err
        assert isinstance(json.loads(out), dict)
        assert err and "\x1b" not in err and err.splitlines()[-1].startswith(f"{command[0]}: ")
    # without a terminal and without --progress: nothing on stderr
    assert run_redirected("fsck", "--data-dir", data)[2] == ""


pytest_plugins = ["tests.s3_fixtures"]


def test_shard_push_all_and_shard_restore(tree, s3_endpoint, s3_bucket, tmp_path):
    data, top, _ = tree
    assert run_redirected("put", "wb:outputs/run1", str(top), "--data-dir", data)[0] == 0
    url = f"s3://{s3_bucket}/p"
    code, out, err, _ = run_on_terminal(
        "shard", "push", "--all", "--to", url, "--endpoint-url", s3_endpoint, "--data-dir", data
    )
    assert code == 0, err
    records = sum(int(a) - int(b) + 1 for b, a in re.findall(r"of LSNs (\d+)\.\.(\d+)", out.decode()))
    _, summary = terminal_frames(err)
    assert summary.startswith(f"shard push: pushed {records:,} records, lag 0 in "), summary
    code, out, err = run_redirected(
        "shard", "restore", "--from", url, str(tmp_path / "restored"), "--endpoint-url", s3_endpoint, "--progress"
    )
    assert code == 0, err
    assert re.fullmatch(
        r"shard restore: restore: \d+/\d+ records replayed, .* \(100%\) in [\d.]+ s", err.splitlines()[-1]
    )
