"""`nokvfs shard push|status|restore|checkpoint`: the logical shard's durability in a bucket.

    nokvfs shard push       [--to URL] [--shard-path DIR] [--all]
    nokvfs shard status     [--to URL] [--shard-path DIR] [--json]
    nokvfs shard checkpoint [--to URL] [--shard-path DIR]
    nokvfs shard restore    --from URL [--shard HEX] [--take-ownership] DATA_DIR_SHARD

URL is `s3://bucket/prefix` (the shard's keys are `prefix/shards/<logical shard hex>/...`); it
defaults to `$NOKVFS_REPLICATE_URL`. The global `--endpoint-url` selects an S3-compatible
endpoint. `--shard-path` defaults to the data directory's `shard/`.

push ships the local outbox records after the bucket's head as one increment (`--all`: until
there is no lag); status prints the bucket's generation, owner epoch, checkpoint through-LSN and
increment count beside the local applied LSN and the lag; checkpoint forces one; restore
rebuilds the shard into an absent or empty directory (nothing is left behind on failure) and,
with `--take-ownership`, then makes it the owner (the old owner's pushes and commands are fenced).
"""

from __future__ import annotations

import os

from nokvfs.cli.common import UsageError
from nokvfs.cli.progress import Progress
from nokvfs.cli.render import safe

URL_ENV = "NOKVFS_REPLICATE_URL"


def register(subparsers) -> None:
    parser = subparsers.add_parser("shard", help="replicate the logical shard to a bucket and restore it")
    commands = parser.add_subparsers(dest="shard_command", metavar="<subcommand>", required=True)

    def target(p):
        p.add_argument("--to", dest="url", metavar="URL", help=f"s3://bucket/prefix (default: ${URL_ENV})")
        p.add_argument("--shard-path", metavar="DIR", help="the shard's LMDB directory (default: DATA_DIR/shard)")

    p = commands.add_parser("push", help="ship new outbox records as one increment")
    target(p)
    p.add_argument("--all", action="store_true", help="push increments until the bucket has every local record")
    p.set_defaults(func=cmd_push)

    p = commands.add_parser("status", help="the bucket's generation, epoch, checkpoint, increments and the lag")
    target(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)

    p = commands.add_parser("checkpoint", help="build and swap in a checkpoint now")
    target(p)
    p.set_defaults(func=cmd_checkpoint)

    p = commands.add_parser("restore", help="rebuild the shard from the bucket into an empty directory")
    p.add_argument("--from", dest="url", metavar="URL", required=True, help="s3://bucket/prefix")
    p.add_argument("--shard", metavar="HEX", help="the logical shard id (needed when the prefix holds several)")
    p.add_argument("--take-ownership", action="store_true", help="then advance the owner epoch and publish it")
    p.add_argument("path", metavar="DATA_DIR_SHARD", help="an absent or empty directory")
    p.set_defaults(func=cmd_restore)


# --- helpers --------------------------------------------------------------------------------


def _url(args) -> str:
    url = getattr(args, "url", None) or os.environ.get(URL_ENV)
    if not url:
        raise UsageError(f"name the bucket with --to s3://bucket/prefix (or set ${URL_ENV})")
    return url


def _shard_path(args) -> str:
    return getattr(args, "shard_path", None) or os.path.join(args.data_dir, "shard")


class _Opened:
    """The local shard and its Replicator, closed on exit."""

    def __init__(self, args):
        from nokvfs.engine.shard import Shard
        from nokvfs.replicate import Replicator

        url = _url(args)
        self.shard = Shard.open(_shard_path(args), verify=False)
        try:
            self.replicator = Replicator.from_url(self.shard, url, endpoint_url=getattr(args, "endpoint_url", None))
        except BaseException:
            self.shard.close()
            raise

    def __enter__(self):
        return self.replicator

    def __exit__(self, *exc):
        self.replicator.bucket.store.close()
        self.shard.close()


def _describe_push(result) -> str:
    if result.kind == "none":
        return f"up to date at generation {result.generation}"
    what = "checkpoint" if result.kind == "checkpoint" else "increment"
    return (
        f"published {what} of LSNs {result.first_lsn}..{result.last_lsn} as generation {result.generation}"
        f" ({safe(result.key)}); lag {result.lag}"
    )


# --- handlers -------------------------------------------------------------------------------


def cmd_push(args) -> int:
    progress = Progress.for_args(args, "shard push", unit="records")
    shipped = 0
    with _Opened(args) as replicator, progress:
        while True:
            result = replicator.push_once()
            shipped += result.records
            progress.report(None, shipped, shipped + result.lag)
            progress.above(_describe_push(result))
            if not args.all or result.kind == "none" or not result.lag:
                progress.finish(f"pushed {shipped:,} records, lag {result.lag:,}")
                return 0


def cmd_status(args) -> int:
    with _Opened(args) as replicator:
        status = replicator.status()
    if getattr(args, "json", False):
        from nokvfs.schema import canonical_json

        print(canonical_json.dumps(status).decode())
        return 0
    if not status["generation"]:
        print(f"bucket:              {safe(status['bucket'])} (empty: nothing pushed yet)")
    else:
        print(f"bucket:              {safe(status['bucket'])}")
        print(f"generation:          {status['generation']}")
        print(f"owner epoch:         {status['owner_epoch']} (owner {status['owner_id']})")
        print(f"checkpoint through:  LSN {status['checkpoint_through_lsn']} (generation {status['checkpoint_through_generation']})")
        print(f"increments:          {status['increments']}")
        print(f"head:                LSN {status['head_lsn']} (commit version {status['head_commit_version']})")
    print(f"local applied LSN:   {status['local_applied_lsn']} (owner epoch {status['local_owner_epoch']})")
    print(f"lag:                 {status['lag']} records")
    if status["fenced"]:
        print("FENCED: another owner publishes this shard; this one stops writing (restore to follow it)")
    if status["last_error"]:
        print(f"last error:          {safe(status['last_error'])}")
    return 0


def cmd_checkpoint(args) -> int:
    with _Opened(args) as replicator:
        result = replicator.checkpoint_once(force=True)
    if result is None:
        print("nothing to compact: the active checkpoint is at the bucket's head")
        return 0
    print(
        f"checkpoint through LSN {result.through_lsn} (generation {result.through_generation}) published as "
        f"generation {result.generation}, replacing {result.compacted} increments ({safe(result.key)})"
    )
    if result.cleanup is not None:
        print(f"cleanup: {len(result.cleanup.deleted)} deleted, {len(result.cleanup.errors)} to retry")
    return 0


def cmd_restore(args) -> int:
    from nokvfs.replicate import restore

    with Progress.for_args(args, "shard restore", unit="records replayed") as progress:
        result = restore(args.url, args.path, logical_shard_id=args.shard, endpoint_url=getattr(args, "endpoint_url", None),
                         progress=progress.report)
    print(
        f"restored shard {result.logical_shard_id.hex()} into {safe(result.path)}: generation {result.generation}, "
        f"LSN {result.applied_lsn}, commit version {result.commit_version}, owner epoch {result.owner_epoch}"
    )
    if args.take_ownership:
        args.shard_path = result.path
        with _Opened(args) as replicator:
            replicator.claim_ownership()
            print(f"took ownership at owner epoch {replicator.shard.owner_epoch}")
    return 0
