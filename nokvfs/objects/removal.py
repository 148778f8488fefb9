"""Removing many object files of the local store, and the directories that leaves empty, durably.

`remove(root, paths)` unlinks each file, removes the directories that leaves empty (deepest
first, never `root`), then fsyncs once each directory where a removal ends, and answers per
path: None once the file is gone durably (or was absent: its directory is pruned too when
empty), else why not. The local store's
`delete_many` (nokvfs.objects.local) runs it under its lock.

Where it runs. Each unlink and rmdir waits on the filesystem's journal, so a few threads issue
them side by side. In a process whose main thread is busy -- GC builds and applies the next
batch's commands while the previous batch's objects are deleted -- every one of those calls then
also waits to take the interpreter lock back, up to the switch interval (5 ms): measured, 5,000
revisions' files took over ten times as long to remove. So a call with many paths is sent to a
helper process (`Remover`: this file run as a script, standard library only), whose threads have
no busy interpreter to wait for; a call with few paths, which would not pay for the round trip,
runs in the calling process. Both run the same `remove`.

The helper is started on first use (it must say it is ready), serves one call at a time over
its stdin/stdout (one JSON line each way) and exits when its stdin closes: when `Remover.close`
is called or the parent dies. A helper that cannot be started leaves its calls to this process;
one that dies during a call leaves every path of it ambiguous (the removals may have happened),
as a lost answer from any store is.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import subprocess
import sys
import threading

# unlink's answers for a path that is absent already (EISDIR: the key names a directory, which
# holds no object).
ABSENT_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR)
# Fewer paths than this are removed in the calling process (see the module docstring).
HELPER_PATHS = 128
READY = b"nokvfs removal helper 1\n"


class Syscalls:
    """Runs one system call over many paths: on a few threads when there are enough paths for
    that to pay (the calls release the GIL while the kernel waits), else in this thread."""

    THREADS = 8
    WORTH_THREADS = 16

    def __init__(self, count: int):
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(self.THREADS, thread_name_prefix="store-delete")
            if count >= self.WORTH_THREADS
            else None
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self._pool is not None:
            self._pool.shutdown()

    def each(self, call, paths: list) -> list:
        """Per path, None or the OSError `call(path)` raised."""

        def one(path):
            try:
                call(path)
            except OSError as exc:
                return exc
            return None

        def run(chunk):
            return [one(path) for path in chunk]

        if self._pool is None or len(paths) < self.WORTH_THREADS:
            return run(paths)
        # One task per thread, each a contiguous slice: a task per path cost more interpreter
        # time (futures, queue, locks) than the system call it wrapped.
        size = -(-len(paths) // self.THREADS)
        chunks = self._pool.map(run, [paths[start : start + size] for start in range(0, len(paths), size)])
        return [result for chunk in chunks for result in chunk]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(root: str, paths: list) -> tuple[list, list]:
    """(per path None or (action, path, errno, strerror) -- the call that failed, on which path
    --, the directories fsynced). Directories are pruned up to, never including, `root`."""
    results: list = [None] * len(paths)
    synced: list = []
    with Syscalls(len(paths)) as syscalls:
        unlinked = []  # (position, the directory that held the file)
        emptied = set()  # directories that may hold nothing now
        for position, error in enumerate(syscalls.each(os.unlink, paths)):
            if error is None:
                unlinked.append((position, os.path.dirname(paths[position])))
            elif error.errno not in ABSENT_ERRNOS:
                results[position] = ("delete", paths[position], error.errno, error.strerror)
            elif error.errno == errno.ENOENT:
                # Absent already: nothing to make durable, but a write may have made its key's
                # directory for a temp and never linked the object (nokvfs.objects.local).
                emptied.add(os.path.dirname(paths[position]))
        emptied.update(directory for _, directory in unlinked)
        removed = _prune_empty(root, emptied, syscalls)
    # A removal is durable once the nearest directory that stays is fsynced.
    durable_at: dict[str, list[int]] = {}
    for position, directory in unlinked:
        while directory in removed:
            directory = os.path.dirname(directory)
        durable_at.setdefault(directory, []).append(position)
    for directory, positions in durable_at.items():
        try:
            fsync_dir(directory)
            synced.append(directory)
        except OSError as exc:
            for position in positions:
                results[position] = ("fsync directory", directory, exc.errno, exc.strerror)
    return results, synced


def _prune_empty(root: str, directories: set, syscalls: Syscalls) -> set:
    """Remove those of `directories` that are empty, and then their parents that this leaves
    empty, deepest first (never the root); rmdir refuses a non-empty one (including one holding
    a concurrent writer's temp file), which keeps it and its ancestors. Each level's directories
    are distinct, so they go at once. Returns the directories removed."""
    removed: set[str] = set()
    by_depth: dict[int, set] = {}
    for directory in directories:
        if directory != root:
            by_depth.setdefault(directory.count(os.sep), set()).add(directory)
    while by_depth:
        depth = max(by_depth)
        level = sorted(by_depth.pop(depth))
        for directory, error in zip(level, syscalls.each(os.rmdir, level), strict=True):
            if error is None:
                removed.add(directory)
                parent = os.path.dirname(directory)
                if parent != root:
                    by_depth.setdefault(depth - 1, set()).add(parent)
    return removed


class HelperLost(Exception):
    """The helper process died or answered nonsense during a call: its removals may have happened."""


class Remover:
    """`remove` for a store: in a helper process for calls of HELPER_PATHS paths or more (see
    the module docstring), else here. One call at a time goes to the helper."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._unavailable = False  # a helper could not be started: every call runs here

    def remove(self, root: str, paths: list) -> tuple[list, list]:
        """As `remove`; HelperLost if the helper died during the call."""
        if len(paths) < HELPER_PATHS:
            return remove(root, paths)
        with self._lock:
            process = self._helper()
            if process is None:
                return remove(root, paths)
            try:
                process.stdin.write(json.dumps({"root": root, "paths": paths}).encode() + b"\n")
                process.stdin.flush()
                line = process.stdout.readline()
                answer = json.loads(line)
                results = [None if r is None else tuple(r) for r in answer["results"]]
                if len(results) != len(paths):
                    raise ValueError(f"{len(results)} answers for {len(paths)} paths")
                return results, answer["synced"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._stop()
                raise HelperLost(f"the removal helper process was lost during the call ({exc})") from None

    def _helper(self) -> subprocess.Popen | None:
        if self._pid != os.getpid():  # a forked child does not share its parent's helper
            self._process, self._pid = None, os.getpid()
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._process = None
        if self._unavailable:
            return None
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
            if self._process.stdout.readline() != READY:
                raise OSError("the removal helper did not start")
        except OSError:
            # Nothing was asked of it: this process removes instead, from now on.
            self._stop()
            self._unavailable = True
            return None
        return self._process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Let the helper exit (it finishes the call it is serving, if any, first)."""
        with self._lock:
            if self._pid == os.getpid():
                self._stop()


def serve(requests, answers) -> None:
    """The helper's loop: READY once, then one JSON request line in, one JSON answer line out,
    until EOF."""
    answers.write(READY)
    answers.flush()
    for line in requests:
        request = json.loads(line)
        results, synced = remove(request["root"], request["paths"])
        answers.write(json.dumps({"results": results, "synced": synced}).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
