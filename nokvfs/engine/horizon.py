"""The durable horizon of a replicated shard: how far its recovery outbox may be truncated.

A shard's outbox is what replication ships. Once a checkpoint holding everything up to LSN L is
named by the bucket's `current`, no consumer needs the local records at or below L: a restore or
a follower starts from that checkpoint, and the owner ships only what follows its bucket head.
The replicator records L here, beside data.mdb, after each checkpoint `current` accepts (the
first publication included); retention (nokvfs.workspace.retention) truncates behind it.

    outbox-horizon   canonical JSON {"logicalShardId": hex, "throughLsn": int, "chainDigest": hex}
                     written by temporary file, fsync and rename; it only moves forward

Its presence also says the shard is replicated: a shard without it has never been published,
and its outbox is truncated behind the local horizon instead (README "Retention"). The file is
not replicated (a restored shard starts without one, until its own first checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import threading

from nokvfs import filemodes

log = logging.getLogger(__name__)

HORIZON_NAME = "outbox-horizon"
# Held while the file is written; a live compaction holds it while it copies the file into the
# shard directory that replaces this one, so no record lands in the directory being replaced.
RECORDING = threading.Lock()


def read(shard_path: str, logical_shard_id: bytes) -> int | None:
    """The recorded through LSN, or None when the shard was never published (or the file is
    unreadable or another shard's: then nothing may be truncated on its word -- logged)."""
    path = os.path.join(shard_path, HORIZON_NAME)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s unreadable (%s): the outbox is kept whole", path, exc)
        return 0
    if (
        not isinstance(data, dict)
        or set(data) != {"logicalShardId", "throughLsn", "chainDigest"}
        or data["logicalShardId"] != logical_shard_id.hex()
        or not isinstance(data["throughLsn"], int)
        or isinstance(data["throughLsn"], bool)
        or data["throughLsn"] < 0
    ):
        log.warning("%s is not this shard's horizon: the outbox is kept whole", path)
        return 0
    return data["throughLsn"]


def record(shard_path: str, logical_shard_id: bytes, through_lsn: int, chain_digest: bytes) -> None:
    """Record that the bucket holds everything up to `through_lsn` (never moves back)."""
    with RECORDING:
        _record(shard_path, logical_shard_id, through_lsn, chain_digest)


def _record(shard_path: str, logical_shard_id: bytes, through_lsn: int, chain_digest: bytes) -> None:
    current = read(shard_path, logical_shard_id)
    if current is not None and current >= through_lsn:
        return
    path = os.path.join(shard_path, HORIZON_NAME)
    body = {"chainDigest": chain_digest.hex(), "logicalShardId": logical_shard_id.hex(), "throughLsn": through_lsn}
    with open(path + ".tmp", "w", opener=filemodes.opener) as f:
        json.dump(body, f, sort_keys=True, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
