"""The progress line of long commands: one helper for all of them, driven by the work done.

A command that can run long (recursive put, get of a large body, gc, fsck, restore, shard push
--all, shard restore) makes one `Progress` and reports what it has actually done -- counts and
bytes, with totals when they are known -- as the work happens (`advance` for increments,
`report` for the absolute figures a facade callback hands over). The line goes to stderr, and
only when stderr is a terminal or `--progress` was given, so it never mixes with stdout (nor
with `--json` output there). It is drawn at most once per `INTERVAL`: redrawn in place on a
terminal, one line per update otherwise. `finish` ends it with a one-line summary (the final
figures and the elapsed time); a failure clears the line so the error message stands alone.

    put wb:outputs/run1: 120/3,000 files, 1.2 GiB / 9.8 GiB (12%), 14 s
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time

from nokvfs.cli.common import human_size
from nokvfs.cli.render import safe

log = logging.getLogger(__name__)

INTERVAL = 0.25  # seconds between two drawn updates: at most four a second
BIG_BODY = 16 * 1024 * 1024  # a single body larger than this is worth a progress line


def wanted(args) -> bool:
    """Whether this command run shows progress: `--progress`, or stderr is a terminal."""
    return bool(getattr(args, "progress", False)) or _isatty(sys.stderr)


class Progress:
    """unit: what `done` counts ("files"); units: the unit of each stage that has its own.
    quiet_below_bytes: stay silent (no line, no summary) unless the work turns out big: more
    than one item, or more than this many bytes (for commands that are usually quick)."""

    def __init__(
        self,
        label: str,
        *,
        enabled: bool,
        unit: str = "items",
        units: dict | None = None,
        quiet_below_bytes: int | None = None,
        stream=None,
        clock=time.monotonic,
        interval: float = INTERVAL,
    ):
        self.label = safe(label)
        self.enabled = enabled
        self.units = units or {}
        self.quiet_below_bytes = quiet_below_bytes
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream)
        self.clock = clock
        self.interval = interval
        self.started = clock()
        self.stage: str | None = None
        self.done = 0
        self.total: int | None = None
        self.done_bytes = 0
        self.total_bytes: int | None = None
        self.lines = 0  # updates drawn so far
        self._last_drawn: float | None = None
        self._open = False  # a terminal line is drawn and not ended yet
        self._finished = False
        self._lock = threading.Lock()  # a sampler thread may report while the command prints

    @classmethod
    def for_args(cls, args, label: str, **options) -> Progress:
        return cls(label, enabled=wanted(args), **options)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.finish()
        else:
            self.abandon()

    # --- the work done ---------------------------------------------------------------------------

    def set_totals(self, total: int | None = None, total_bytes: int | None = None) -> None:
        self.total, self.total_bytes = total, total_bytes

    def advance(self, count: int = 0, nbytes: int = 0) -> None:
        self.done += count
        self.done_bytes += nbytes
        self._tick()

    def report(
        self,
        stage: str | None = None,
        done: int | None = None,
        total: int | None = None,
        done_bytes: int | None = None,
        total_bytes: int | None = None,
    ) -> None:
        """Absolute figures; a new stage starts its own counts."""
        if stage != self.stage:
            self.stage = stage
            self.done, self.total, self.done_bytes, self.total_bytes = 0, None, 0, None
        if done is not None:
            self.done = done
        if done_bytes is not None:
            self.done_bytes = done_bytes
        if total is not None:
            self.total = total
        if total_bytes is not None:
            self.total_bytes = total_bytes
        self._tick()

    # --- drawing ---------------------------------------------------------------------------------

    def figures(self) -> str:
        unit = self.units.get(self.stage, self.unit)
        counts = f"{self.done:,}" + ("" if self.total is None else f"/{self.total:,}") + f" {unit}"
        parts = [counts]
        if self.done_bytes or self.total_bytes:
            parts.append(
                human_size(self.done_bytes) + ("" if self.total_bytes is None else f" / {human_size(self.total_bytes)}")
            )
        if self.total_bytes:
            parts[-1] += f" ({min(100, 100 * self.done_bytes // self.total_bytes)}%)"
        elif self.total:
            parts[0] += f" ({min(100, 100 * self.done // self.total)}%)"
        stage = f"{safe(self.stage)}: " if self.stage else ""
        return f"{self.label}: {stage}" + ", ".join(parts)

    def line(self) -> str:
        return f"{self.figures()}, {self.clock() - self.started:.0f} s"

    def summary(self, text: str | None = None) -> str:
        head = self.figures() if text is None else f"{self.label}: {safe(text)}"
        return f"{head} in {self.clock() - self.started:.1f} s"

    def _shown(self) -> bool:
        if not self.enabled:
            return False
        if self.quiet_below_bytes is None or self.lines:
            return True
        return (self.total or 0) > 1 or max(self.total_bytes or 0, self.done_bytes) > self.quiet_below_bytes

    def _tick(self) -> None:
        with self._lock:
            if self._finished or not self._shown():
                return
            now = self.clock()
            if self._last_drawn is not None and now - self._last_drawn < self.interval:
                return
            self._last_drawn = now
            self.lines += 1
            self._write(self.line(), end=False)

    @contextlib.contextmanager
    def paused(self):
        """Around the command's own writes to stdout (whole lines): the progress line is cleared
        first, so the two never share a terminal line; the next update draws it again."""
        with self._lock:
            if self._open:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._open = False
            try:
                yield
            finally:
                sys.stdout.flush()

    def above(self, text: str) -> None:
        """Print one line of the command's output on stdout, above the progress line."""
        with self.paused():
            print(text)

    def _write(self, text: str, *, end: bool) -> None:
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K" + ("\n" if end else ""))
            self._open = not end
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, summary: str | None = None) -> None:
        """End with a one-line summary: `label: <summary, default the final figures> in N s`."""
        with self._lock:
            if not self._finished and self._shown():
                self._write(self.summary(summary), end=True)
            self._finished = True

    def abandon(self) -> None:
        """The command failed: clear the terminal line (the error message follows), no summary."""
        with self._lock:
            if self._open:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._open = False
            self._finished = True

    def body_callback(self):
        """`progress(done, total)` for one body (namespace.put, a download), added onto what
        this line had done before it."""
        base = self.done_bytes

        def callback(done: int, total: int) -> None:
            if self.total_bytes is None and (self.total or 1) == 1:
                self.total_bytes = base + total  # a stream's size is known once it is spooled
            self.done_bytes = base + done
            self._tick()

        return callback


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def sampled(progress: Progress, sample, *, interval: float = INTERVAL):
    """Report `sample()` -- the figures (stage, done, total, done_bytes, total_bytes) read from
    durable state, or None -- every `interval` while the block runs, for work whose facade call
    has no callback (a restore: the member count its operation row records)."""
    if not progress.enabled:
        yield
        return
    stop = threading.Event()

    def report():
        try:
            figures = sample()
        except Exception:
            log.debug("progress sample failed", exc_info=True)
            return
        if figures is not None:
            progress.report(*figures)

    def run():
        while not stop.wait(interval):
            report()

    thread = threading.Thread(target=run, name="nokvfs-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        report()
