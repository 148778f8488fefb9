"""Background maintenance of a mounted data directory: retention, GC and History pruning in
bounded slices, so a mount that runs for months stays small without `nokvfs gc`.

Every `interval` seconds a pass runs on its own thread: the retention pass
(nokvfs.workspace.retention, one bounded write transaction per step), then GC
(nokvfs.workspace.gc: each revision a few short commands, History in small batches). Between two
steps the thread sleeps `pause` seconds, so FUSE requests -- which need the same single LMDB
writer and the process's command lock -- wait at most for one small step, never for a pass.
`nokvfs gc` stays for manual runs.

Last in a pass, the shard is compacted (`Shard.compact_live`: a copy while requests go on, a
swap of a few milliseconds) when free pages dominate the file: at least `compact_min_bytes` of
file and at most `1 - compact_free_ratio` of it in use. LMDB reuses free pages but never gives
them back, so without this a shard keeps the size of its busiest hour. It is skipped when another
process has the shard open (a CLI command, a follower), and retried at the next pass when writes
kept committing while it copied.

Settings: `maintenance` in nokvfs.json ({"interval_seconds": S, "compact_free_ratio": R,
"compact_min_bytes": N}; interval 0 = off; absent keys: the defaults below), the interval
overridden by `nokvfs mount --maintenance-interval S`. A read-only mount (a follower, a fenced
owner, `--read-only`) never maintains: its shard is the owner's.
"""

from __future__ import annotations

import logging
import threading
import time

from nokvfs.errors import InvalidInput, NokvError

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 300.0
DEFAULT_COMPACT_FREE_RATIO = 0.5  # compact when at least half the file is free pages ...
DEFAULT_COMPACT_MIN_BYTES = 64 << 20  # ... and the file is at least this large
CONFIG_KEY = "maintenance"
SETTINGS = ("interval_seconds", "compact_free_ratio", "compact_min_bytes")
PAUSE = 0.002  # seconds between two steps: a request waiting for the writer gets in
# Rows or records one step removes at most (one write transaction each).
SLICE_ROWS = 256


class Stopped(Exception):
    """The mount is going away: the pass stops after its current step."""


def _configured(data_dir: str) -> dict:
    from nokvfs.workspace.datadir import read_config

    raw = read_config(data_dir).get(CONFIG_KEY)
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - set(SETTINGS):
        raise InvalidInput(f"nokvfs.json {CONFIG_KEY!r} is an object with keys among {list(SETTINGS)}, not {raw!r}")
    return raw


def configured_interval(data_dir: str, override: float | None) -> float:
    """The interval in force: the command line's, else the data directory's, else the default."""
    if override is not None:
        return _check(override)
    return _check(_configured(data_dir).get("interval_seconds", DEFAULT_INTERVAL))


def compaction_settings(data_dir: str) -> tuple[float, int]:
    """(free ratio, minimum file bytes) above which a pass compacts the shard."""
    raw = _configured(data_dir)
    ratio = raw.get("compact_free_ratio", DEFAULT_COMPACT_FREE_RATIO)
    least = raw.get("compact_min_bytes", DEFAULT_COMPACT_MIN_BYTES)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise InvalidInput(f"compact_free_ratio is a fraction in (0, 1] (1: never compact), not {ratio!r}")
    if isinstance(least, bool) or not isinstance(least, int) or least < 0:
        raise InvalidInput(f"compact_min_bytes is a number of bytes >= 0, not {least!r}")
    return float(ratio), least


def _check(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise InvalidInput(f"a maintenance interval is a number of seconds >= 0 (0: off), not {value!r}")
    return float(value)


def compact_when_mostly_free(shard, ratio: float = DEFAULT_COMPACT_FREE_RATIO, least: int = DEFAULT_COMPACT_MIN_BYTES):
    """(due, report or None, bytes in use, file bytes): compact the open shard when it is at
    least `least` bytes and at most `1 - ratio` of it is in use; the report is None when it was
    not due, or due but not done (Shard.compact_live)."""
    used, size = shard.space()
    if size < least or used > size * (1 - ratio):
        return False, None, used, size
    return True, shard.compact_live(), used, size


class Maintenance:
    def __init__(self, root, *, interval: float, pause: float = PAUSE, slice_rows: int = SLICE_ROWS):
        self.root = root
        self.interval = interval
        self.pause = pause
        self.slice_rows = slice_rows
        self.passes = 0
        self.steps = 0
        self.freed_revisions = 0
        self.compactions = 0
        self.compacted_bytes = 0  # file bytes given back by compactions
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_mount(cls, root, data_dir: str, *, interval: float | None, read_only: bool) -> "Maintenance | None":
        """The mount's maintenance, or None when it is off or the mount cannot write."""
        every = configured_interval(data_dir, interval)
        if read_only or every == 0:
            log.info("background maintenance is off%s", " (read-only mount)" if read_only and every else "")
            return None
        return cls(root, interval=every)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nokvfs-maintenance", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.monotonic()
            try:
                report = self.run_pass()
            except Stopped:
                return
            except NokvError as exc:
                log.warning("maintenance pass failed (the next one retries): %s: %s", type(exc).__name__, exc)
                continue
            except Exception:
                log.exception("maintenance pass failed unexpectedly")
                continue
            log.info(
                "maintenance: %d step(s) in %.2f s; freed %d revision(s); removed %d change event(s), %d dedupe "
                "row(s), "
                "%d operation row(s), %d outbox record(s), %d History row(s)",
                report["steps"],
                time.monotonic() - started,
                report["freed"],
                report["events"],
                report["requests"],
                report["operations"],
                report["outbox"],
                report["history"],
            )

    def _step(self, *_) -> None:
        """Between two steps: stop if asked, else let the requests in."""
        self.steps += 1
        if self._stop.is_set():
            raise Stopped
        time.sleep(self.pause)

    def compact_if_mostly_free(self) -> tuple[int, int] | None:
        """Compact the shard when free pages dominate it: (file bytes before, after), or None."""
        started = time.monotonic()
        due, report, used, size = compact_when_mostly_free(self.root.shard, *compaction_settings(self.root.data_dir))
        if not due:
            return None
        if report is None:
            log.info(
                "maintenance: the shard is %d bytes, %d in use; not compacted now (another process has it "
                "open, or writes kept committing while it was copied)",
                size,
                used,
            )
            return None
        self.compactions += 1
        self.compacted_bytes += max(0, report.before_bytes - report.after_bytes)
        log.info(
            "maintenance: compacted the shard, %d -> %d bytes (%d in use) in %.3f s",
            report.before_bytes,
            report.after_bytes,
            used,
            time.monotonic() - started,
        )
        return report.before_bytes, report.after_bytes

    def run_pass(self) -> dict:
        """One pass, step by step (also callable directly)."""
        from nokvfs.workspace import gc, retention
        from nokvfs.workspace.datadir import retention_settings

        settings = retention_settings(self.root.data_dir)
        kept = retention.RetentionReport()
        for _ in retention.slices(self.root, settings, kept, max_rows=self.slice_rows, max_records=self.slice_rows):
            self._step()
        # A quarter of a slice's rows in revisions: each takes a few rows in each of its commands.
        collected = gc.collect(
            self.root, progress=self._step, history_batch=self.slice_rows, batch_revisions=max(1, self.slice_rows // 4)
        )
        compacted = self.compact_if_mostly_free()
        self.passes += 1
        self.freed_revisions += collected.freed_revisions
        return {
            "compacted": compacted,
            "steps": kept.steps,
            "freed": collected.freed_revisions,
            "events": kept.events_removed,
            "requests": kept.requests_removed,
            "operations": kept.operations_removed,
            "outbox": kept.outbox_removed,
            "history": collected.history_pruned,
        }
