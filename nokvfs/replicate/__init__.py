"""A logical shard's durability in a bucket (the storage model of seed 004, for LMDB shards).

manifest.py    the strict `current` manifest (version 1), its chain validation, the key layout
packs.py       checkpoint packs (a compacted LMDB copy) and increment packs (outbox ranges)
remote.py      one shard's keys: conditional replacement of `current`, pack upload/fetch with
               SHA-256 and size, cleanup
datadir_record.py  the strict `datadir` record: configuration and the root's placement
replicator.py  Replicator: push_once, checkpoint_once, run_forever, claim_ownership, status,
               wait_shipped; keeps the datadir record current; records its own fencing
restore.py     restore(bucket_url, shard_path): checkpoint install + replay through the engine;
               restore_data_dir and take_ownership: a whole data directory, and its takeover
follower.py    Follower: a read-only data directory kept current from the bucket
errors.py      the typed errors (ManifestError family, PackCorrupt, ReplayFailed, ...)
"""

from nokvfs.replicate.manifest import Manifest
from nokvfs.replicate.remote import ShardBucket, open_remote
from nokvfs.replicate.replicator import CheckpointResult, PushResult, Replicator
from nokvfs.replicate.restore import RestoreResult, restore

__all__ = [
    "CheckpointResult",
    "Manifest",
    "PushResult",
    "Replicator",
    "RestoreResult",
    "ShardBucket",
    "open_remote",
    "restore",
]
