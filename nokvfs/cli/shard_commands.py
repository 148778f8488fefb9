"""`nokvfs shard push|status|restore|checkpoint`: the logical shard's durability in a bucket.

    nokvfs shard push       [--to URL] [--shard-path DIR] [--all]
    nokvfs shard status     [--to URL] [--shard-path DIR] [--json]
    nokvfs shard checkpoint [--to URL] [--shard-path DIR]
    nokvfs [--data-dir NEW] shard restore --from URL [--shard HEX] [--take-ownership]
    nokvfs shard restore    --from URL [--shard HEX] [--take-ownership] DATA_DIR_SHARD

URL is `s3://bucket/prefix` (the shard's keys are `prefix/shards/<logical shard hex>/...`); it
defaults to the bucket a restored data directory records (replica.json), else to
`$NOKVFS_REPLICATE_URL`. The global `--endpoint-url` selects an S3-compatible endpoint.
`--shard-path` defaults to the data directory's `shard/`.

push ships the local outbox records after the bucket's head as one increment (`--all`: until
there is no lag) and, from a data directory, keeps the bucket's data directory record
(configuration and the root's placement) equal to the local one; status prints the bucket's
generation, owner epoch, checkpoint through-LSN and increment count beside the local applied
LSN and the lag (and, once fenced, the LSNs the bucket never received); checkpoint forces one.

restore without DATA_DIR_SHARD rebuilds a complete data directory at `--data-dir` (absent or
empty): shard, control plane placement and configuration. It is a read-only follower of the
bucket (`get`, `ls`, `mount` work at once; `mount` follows the bucket); `--take-ownership` makes
it the owner, which fences the old one: its pushes and commands fail with OwnerFenced and its
mount turns read-only. The global `--store` names another copy of the object store. With
DATA_DIR_SHARD only the LMDB shard is rebuilt there. Nothing is left behind on failure.
"""

from __future__ import annotations

import os

from nokvfs.cli.common import UsageError, add_json_option
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
    add_json_option(p, "print one JSON object")
    p.set_defaults(func=cmd_status)

    p = commands.add_parser("checkpoint", help="build and swap in a checkpoint now")
    target(p)
    p.set_defaults(func=cmd_checkpoint)

    p = commands.add_parser("restore", help="rebuild the shard from the bucket into an empty directory")
    p.add_argument("--from", dest="url", metavar="URL", required=True, help="s3://bucket/prefix")
    p.add_argument("--shard", metavar="HEX", help="the logical shard id (needed when the prefix holds several)")
    p.add_argument("--take-ownership", action="store_true", help="then become the owner (the old owner is fenced)")
    p.add_argument(
        "path",
        metavar="DATA_DIR_SHARD",
        nargs="?",
        help="rebuild only the LMDB shard into this absent or empty directory (default: a whole data directory at "
        "--data-dir)",
    )
    p.set_defaults(func=cmd_restore)


# --- helpers --------------------------------------------------------------------------------


def _role(args):
    """The data directory's replica role (None: made by `init`, or shard commands on a bare shard)."""
    from nokvfs.workspace import replica

    return None if getattr(args, "shard_path", None) else replica.read_role(args.data_dir)


def _url(args) -> tuple[str, str | None]:
    """(bucket URL, its endpoint): --to, else the bucket a restored data directory records, else
    $NOKVFS_REPLICATE_URL."""
    endpoint = getattr(args, "endpoint_url", None)
    url = getattr(args, "url", None)
    role = None if url else _role(args)
    if role is not None:
        return role.bucket, endpoint or role.endpoint_url
    url = url or os.environ.get(URL_ENV)
    if not url:
        raise UsageError(f"name the bucket with --to s3://bucket/prefix (or set ${URL_ENV})")
    return url, endpoint


def _shard_path(args) -> str:
    return getattr(args, "shard_path", None) or os.path.join(args.data_dir, "shard")


class _Opened:
    """The local shard and its Replicator (of the data directory, unless --shard-path names a
    bare shard), closed on exit. A replica that is not the owner may read its status only."""

    def __init__(self, args, *, write: bool = True):
        from nokvfs.engine.shard import Shard
        from nokvfs.replicate import Replicator

        role = _role(args)
        if write and role is not None and not role.writable:
            raise role.refusal()
        url, endpoint = _url(args)
        data_dir = (
            None
            if getattr(args, "shard_path", None) or not os.path.exists(os.path.join(args.data_dir, "nokvfs.json"))
            else args.data_dir
        )
        self.shard = Shard.open(_shard_path(args), verify=getattr(args, "verify", False))
        try:
            self.replicator = Replicator.from_url(self.shard, url, endpoint_url=endpoint, data_dir=data_dir)
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
    with _Opened(args, write=False) as replicator:
        status = replicator.status()
    role = _role(args)
    status["role"] = "owner" if role is None else role.role
    if role is not None and role.role == "fenced":
        status["unshipped"] = None if role.unshipped is None else list(role.unshipped)  # as recorded when fenced
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
        print(
            f"checkpoint through:  LSN {status['checkpoint_through_lsn']} (generation "
            f"{status['checkpoint_through_generation']})"
        )
        print(f"increments:          {status['increments']}")
        print(f"head:                LSN {status['head_lsn']} (commit version {status['head_commit_version']})")
        generation = status["datadir_generation"]
        record = f"record generation {generation}" if generation else "no record yet (the next push publishes it)"
        print(f"data directory:      {record}")
    print(f"local applied LSN:   {status['local_applied_lsn']} (owner epoch {status['local_owner_epoch']})")
    print(f"lag:                 {status['lag']} records")
    if status["role"] == "follower":
        print("FOLLOWER: this data directory is a read-only replica of the bucket")
    elif status["fenced"]:
        print("FENCED: another owner publishes this shard; this one stops writing (restore to follow it)")
        unshipped = status.get("unshipped")
        if unshipped:
            first, last = unshipped
            print(
                f"never shipped:       LSNs {first or '?'}..{last} (not in the bucket; the new owner does not have "
                "them)"
            )
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

    endpoint = getattr(args, "endpoint_url", None)
    if args.path is None:
        return _restore_data_dir(args, endpoint)
    with Progress.for_args(args, "shard restore", unit="records replayed") as progress:
        result = restore(
            args.url, args.path, logical_shard_id=args.shard, endpoint_url=endpoint, progress=progress.report
        )
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


def _restore_data_dir(args, endpoint: str | None) -> int:
    import sys

    from nokvfs.replicate.restore import restore_data_dir, take_ownership

    result = restore_data_dir(
        args.url,
        args.data_dir,
        logical_shard_id=args.shard,
        endpoint_url=endpoint,
        store=getattr(args, "store", None),
        store_endpoint_url=endpoint if getattr(args, "store", None) else None,
    )
    shard = result.shard
    print(
        f"restored data directory {result.data_dir}: root {result.record.root_id.hex()}, shard "
        f"{shard.logical_shard_id.hex()} at generation {shard.generation}, LSN {shard.applied_lsn}, commit version "
        f"{shard.commit_version}; artifact bytes in {result.config['store']}"
    )
    for warning in result.warnings:
        print(f"nokvfs: warning: {warning}", file=sys.stderr)
    if args.take_ownership:
        _, epoch = take_ownership(result.data_dir, args.url, endpoint_url=endpoint)
        print(f"took ownership at owner epoch {epoch}: this data directory is the writer now")
    else:
        print("a read-only follower of the bucket (`nokvfs mount` follows it; --take-ownership makes it the writer)")
    return 0
