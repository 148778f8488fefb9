"""Retention: how much of the engine-written logs a data directory keeps, and the passes that
remove the rest (README "Retention"; the engine's contracts are nokvfs.engine.retention's).

Settings live in nokvfs.json under "retention" (absent: the defaults), set by `nokvfs init
--retain-versions N ...` and later by `nokvfs retention set ...`:

    versions          commit versions of ChangeEvent rows kept (a change-feed position older than
                      the current version minus this is CursorExpired) and the version floor of
                      CommandDedupe rows
    request_seconds   a request's dedupe row is kept while its UUIDv7 request id is younger than
                      this by the persisted lease clock (an exact replay within it is answered
                      from the row; after it, RequestExpired)
    outbox_records    the local horizon of a shard that is not replicated: the newest this many
                      recovery-outbox records are kept. A replicated shard (one with a recorded
                      durable horizon, nokvfs.engine.horizon) truncates behind the bucket's
                      checkpoint instead.

Terminal publish Operation rows follow their request's dedupe row: a Published or Cleaned
publication whose request id the engine now answers with RequestExpired (older than the request
horizon, committed at or below the request floor) can never be replayed, so its row goes too.
Other operations' terminal rows (commit builds, restores, retirements) are kept: the seed's exact
replay of those reads them.

`slices(root, settings)` is the pass as bounded steps (one write transaction each): the mount's
maintenance runs one step at a time between requests; `run` runs them all (`nokvfs gc`).
"""

from __future__ import annotations

import dataclasses
import time

from nokvfs.engine import horizon
from nokvfs.engine.command import Delete, ValueEquals
from nokvfs.engine.retention import request_expired
from nokvfs.engine.scan import scan_prefix
from nokvfs.errors import InvalidInput
from nokvfs.schema import keys
from nokvfs.schema.enums import OperationKind, PublishPhase, RetainedFamily
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import PublishOperation
from nokvfs.workspace.root import Built, intent_digest

DEFAULT_VERSIONS = 100_000
DEFAULT_REQUEST_SECONDS = 7 * 24 * 3600
DEFAULT_OUTBOX_RECORDS = 10_000
CONFIG_KEY = "retention"
# Rows one step removes at most: a step is one write transaction, so this bounds how long a
# writer (a FUSE request's publish) can wait behind it.
SLICE_ROWS = 1024
SLICE_RECORDS = 512


@dataclasses.dataclass(frozen=True)
class RetentionSettings:
    versions: int = DEFAULT_VERSIONS
    request_seconds: int = DEFAULT_REQUEST_SECONDS
    outbox_records: int = DEFAULT_OUTBOX_RECORDS

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
                raise InvalidInput(f"retention {field.name} must be a whole number >= 0, not {value!r}")

    def to_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> "RetentionSettings":
        raw = config.get(CONFIG_KEY)
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise InvalidInput(f"nokvfs.json {CONFIG_KEY!r} must be an object, not {raw!r}")
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise InvalidInput(f"unknown retention setting(s) {unknown} in nokvfs.json")
        return cls(**raw)


@dataclasses.dataclass
class RetentionReport:
    events_removed: int = 0
    requests_removed: int = 0
    outbox_removed: int = 0
    operations_removed: int = 0
    event_floor: int = 0
    request_horizon_ms: int = 0
    outbox_floor_lsn: int = 0
    steps: int = 0


def targets(root, settings: RetentionSettings) -> tuple[int, int, int]:
    """(event and dedupe floor version, request horizon ms, outbox through LSN) the settings
    allow now."""
    shard = root.shard
    floor = max(0, shard.commit_version - settings.versions)
    request_horizon = max(0, shard.lease_clock_ms - settings.request_seconds * 1000)
    durable = horizon.read(shard.path, shard.logical_shard_id)
    tail = shard.recovery_tail.applied_lsn
    through = max(0, tail - settings.outbox_records) if durable is None else min(durable, tail)
    return floor, request_horizon, through


def slices(
    root,
    settings: RetentionSettings,
    report: RetentionReport | None = None,
    *,
    max_rows: int = SLICE_ROWS,
    max_records: int = SLICE_RECORDS,
    observe_clock: bool = True,
):
    """The retention pass as a generator: each step is at most one write transaction; the
    report (given or new) is updated as it goes and is the generator's return value."""
    report = report if report is not None else RetentionReport()
    shard = root.shard
    if observe_clock:
        # The request horizon follows the persisted lease clock: bring it up to now first.
        shard.observe_lease_clock(time.time_ns() // 1_000_000)
        report.steps += 1
        yield report
    floor, request_horizon, through = targets(root, settings)
    for family, horizon_ms in ((RetainedFamily.ChangeEvent, 0), (RetainedFamily.CommandDedupe, request_horizon)):
        start = b""
        while True:
            outcome = shard.prune_retained(
                owner_epoch=root.owner_epoch,
                family=family,
                floor_version=floor,
                horizon_ms=horizon_ms,
                start_key=start,
                max_rows=max_rows,
            )
            if family == RetainedFamily.ChangeEvent:
                report.events_removed += outcome.pruned_rows
            else:
                report.requests_removed += outcome.pruned_rows
            report.steps += 1
            yield report
            if outcome.next_key is None:
                break
            start = outcome.next_key
    marker = None
    while True:
        removed, marker = _prune_publish_operations(root, marker, max_rows)
        report.operations_removed += removed
        report.steps += 1
        yield report
        if marker is None:
            break
    while True:
        outcome = shard.truncate_outbox(owner_epoch=root.owner_epoch, through_lsn=through, max_records=max_records)
        report.outbox_removed += outcome.removed_records
        report.steps += 1
        yield report
        if outcome.removed_records == 0 or outcome.floor_lsn >= through:
            break
    floors = shard.retention_floors
    report.event_floor, report.request_horizon_ms, report.outbox_floor_lsn = (
        floors.event_floor_version,
        floors.request_horizon_ms,
        floors.outbox_floor_lsn,
    )
    return report


_FINISHED_PUBLISHES = (PublishPhase.Published, PublishPhase.Cleaned)


def _prune_publish_operations(root, marker: bytes | None, limit: int) -> tuple[int, bytes | None]:
    """One command removing up to `limit` terminal publish Operation rows past replay, from
    after `marker`; (rows removed, where the next step starts, None at the end)."""
    prefix = keys.operation_prefix(root.root_id, OperationKind.Publish)
    floors = root.shard.retention_floors

    def build(view):
        predicates, mutations, position = [], [], marker
        visited = 0
        while len(mutations) < limit and visited < limit * 8:
            page = scan_prefix(view, "operation", prefix, start_after=position)
            for key, value in page.items:
                visited += 1
                position = key
                operation = PublishOperation.decode(value)
                if (
                    operation.phase in _FINISHED_PUBLISHES
                    and operation.created_version <= floors.request_floor_version
                    and request_expired(operation.request_id, floors.request_horizon_ms)
                ):
                    predicates.append(ValueEquals("operation", key, value))
                    mutations.append(Delete("operation", key))
                    if len(mutations) == limit:
                        break
            else:
                if page.next_marker is None:
                    return Built(predicates=predicates, mutations=mutations, value=None)
                continue
            break
        return Built(predicates=predicates, mutations=mutations, value=position)

    with root.read() as view:
        planned = build(view)
    if not planned.mutations:
        return 0, planned.value
    _, built = root.apply(build, digest=intent_digest("retention.publish-operations", new_id16()))
    return len(built.mutations), built.value


def run(root, settings: RetentionSettings | None = None) -> RetentionReport:
    """The whole retention pass (the data directory's settings by default)."""
    if settings is None:
        from nokvfs.workspace.datadir import read_config

        settings = RetentionSettings.from_config(read_config(root.data_dir))
    report = RetentionReport()
    for _ in slices(root, settings, report):
        pass
    return report
