"""The integrity alarm: once a shard is known to be corrupt, it takes no more writes.

Whatever finds the shard's bytes damaged -- a row that fails its envelope check on any read path,
corruption LMDB reports, a state digest that does not recompute (`fsck`, `open --verify`) --
records it in the file `integrity-alarm` next to the LMDB environment (outside LMDB, since LMDB
may be what is damaged). Every write entrypoint checks for that file first (one stat(2), against
a commit's fsync), in every process, so nothing is written on top of damage, including by a
process that opened the shard before another one found it. Reads go on: each row is still
verified, so what is intact is served and what is not is refused.

The file holds one JSON object: {"detected_unix_ms", "pid", "error", "detail"}; the first finding
is kept. Only `fsck --repair` removes it, after a full verification of every row and state
digest comes out clean (a damaged shard is otherwise replaced, e.g. by `nokvfs shard restore`).
"""

from __future__ import annotations

import json
import logging
import os
import time

from nokvfs import filemodes
from nokvfs.errors import ShardCorrupt

log = logging.getLogger(__name__)

ALARM_NAME = "integrity-alarm"


class IntegrityAlarm:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, ALARM_NAME)
        self._known: str | None = None  # a finding this process could not write down

    def record(self, exc: BaseException) -> None:
        """Write the finding down (the first one is kept). Never raises: the caller's error is
        the one to report."""
        self._known = self._known or str(exc)
        if os.path.exists(self.path):
            return
        finding = {
            "detected_unix_ms": time.time_ns() // 1_000_000,
            "pid": os.getpid(),
            "error": type(exc).__name__,
            "detail": str(exc),
        }
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", opener=filemodes.opener) as f:
                json.dump(finding, f, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as error:
            log.error("shard corrupt (%s), and the integrity alarm could not be written: %s", exc, error)
            return
        log.error("shard corrupt: %s (writes are refused from now on; run `nokvfs fsck`)", exc)

    def finding(self) -> dict | None:
        """The recorded finding, or None when the shard is not known to be corrupt."""
        try:
            with open(self.path) as f:
                raw = f.read()
        except FileNotFoundError:
            return None if self._known is None else {"detail": self._known}
        except OSError as exc:
            return {"detail": f"the integrity alarm {self.path} exists but cannot be read: {exc}"}
        try:
            finding = json.loads(raw)
        except ValueError:
            finding = None
        return finding if isinstance(finding, dict) else {"detail": f"an unreadable integrity alarm at {self.path}"}

    def refuse_writes(self) -> None:
        """ShardCorrupt if the shard is known to be corrupt; the caller was about to write."""
        if self._known is None and not os.path.exists(self.path):
            return
        finding = self.finding()
        if finding is None:
            return
        raise ShardCorrupt(
            f"writes are refused: the shard is known to be corrupt ({finding.get('detail')}); "
            "`nokvfs fsck` reports what is damaged, `nokvfs shard restore` replaces the shard"
        )

    def clear(self) -> bool:
        """Remove the alarm (after a clean full verification). True if there was one."""
        had = self._known is not None or os.path.exists(self.path)
        self._known = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        return had
