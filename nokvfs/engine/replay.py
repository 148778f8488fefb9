"""Replay of recovery-outbox records through the shard's own write entrypoints.

One record kind, one entrypoint: a MetadataCommand through `Shard.apply` (rebuilt exactly from
its logical record), a lease-clock observation, an owner-epoch advance, and the retention steps
-- History pruning, outbox truncation, ChangeEvent / CommandDedupe retention -- through their
`replay_*` entrypoints, which remove exactly the rows (or records) the record names. After each
record the shard must have appended exactly it (same LSN, same chain digest). There is no second
apply path: a restore from a bucket, a follower and a compaction's catch-up all replay here.
"""

from __future__ import annotations

from nokvfs.engine.records import (
    CommandRecord,
    HistoryPruneRecord,
    LeaseClockRecord,
    OutboxTruncateRecord,
    OwnerEpochRecord,
    RecoveryTail,
    RetentionPruneRecord,
)
from nokvfs.errors import IntegrityError, NokvError
from nokvfs.schema.enums import OutboxRecordKind


class ReplayFailed(IntegrityError):
    """A record did not replay to the chain digest it carries."""


def replay(shard, entry) -> None:
    """Replay one outbox entry through the shard's own entrypoint; it must append exactly it."""
    from nokvfs.engine.shard import command_from_record

    header = entry.header
    tail = shard.recovery_tail
    if tail.applied_lsn + 1 != entry.lsn or tail.chain_digest != header.previous_chain_digest:
        raise ReplayFailed(f"record {entry.lsn} does not follow the shard's tail at LSN {tail.applied_lsn}")
    kind = header.record_kind
    outcome = None
    try:
        if kind == OutboxRecordKind.MetadataCommand:
            outcome = shard.apply(command_from_record(CommandRecord.decode(entry.payload)))
        elif kind == OutboxRecordKind.LeaseClockObservation:
            shard.observe_lease_clock(LeaseClockRecord.decode(entry.payload).observed_unix_ms)
        elif kind == OutboxRecordKind.OwnerEpochAdvance:
            shard.advance_owner_epoch(OwnerEpochRecord.decode(entry.payload).owner_epoch)
        elif kind == OutboxRecordKind.HistoryPrune:
            shard.replay_history_prune(HistoryPruneRecord.decode(entry.payload))
        elif kind == OutboxRecordKind.OutboxTruncate:
            shard.replay_outbox_truncate(OutboxTruncateRecord.decode(entry.payload))
        else:  # RetentionPrune: the enum codec refuses unknown kinds
            shard.replay_retention_prune(RetentionPruneRecord.decode(entry.payload))
    except NokvError as exc:
        raise ReplayFailed(f"record {entry.lsn} ({kind.name}) does not replay: {type(exc).__name__}: {exc}") from exc
    if outcome is not None and (
        outcome.replayed or outcome.recovery_lsn != entry.lsn or outcome.commit_version != header.commit_version
    ):
        raise ReplayFailed(
            f"record {entry.lsn} replayed as LSN {outcome.recovery_lsn} at version {outcome.commit_version}"
        )
    if shard.recovery_tail != RecoveryTail(entry.lsn, header.chain_digest):
        raise ReplayFailed(f"record {entry.lsn} ({kind.name}) replayed to another chain digest")
