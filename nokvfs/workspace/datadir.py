"""The data directory: one root on one logical shard, with its object store and local state.

    <data_dir>/nokvfs.json   root id, logical shard id, object store URL, block size, cache size,
                             history retention (versions of History GC keeps beyond the holds),
                             log retention ("retention": nokvfs.workspace.retention),
                             and for an S3 store its call deadlines ("store_options":
                             connect_timeout, read_timeout, max_attempts, deadline; absent: the
                             defaults, so that every store call returns within 30 s)
    <data_dir>/control/      the control plane's RootPlacement store
    <data_dir>/shard/        the logical shard's LMDB environment
    <data_dir>/objects/      the local object store (the embedded default)
    <data_dir>/cache/        the block cache
    <data_dir>/spool/        spooled streams and mount write spools
    <data_dir>/run/          lock files of live operations
    <data_dir>/replica.json  only in a directory rebuilt from a bucket: its replica role
                             (nokvfs.workspace.replica; a follower or fenced one never writes)

Every directory here is created 0700 and every file 0600 (nokvfs.filemodes): the bytes and
metadata of every artifact are for the owner only, whatever the caller's umask.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from nokvfs import filemodes
from nokvfs.engine.placement import PlacementStore, install_root_fence
from nokvfs.engine.shard import Shard
from nokvfs.errors import AlreadyExists, FenceError, InvalidInput, NotFound, StoreError
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.ids import id16_from_hex, new_id16
from nokvfs.schema.records import RootPlacement
from nokvfs.workspace import replica
from nokvfs.workspace.body import DEFAULT_BLOCK_SIZE
from nokvfs.workspace.retention import CONFIG_KEY as RETENTION_KEY
from nokvfs.workspace.retention import RetentionSettings
from nokvfs.workspace.root import Root

log = logging.getLogger(__name__)

CONFIG_NAME = "nokvfs.json"
CONFIG_FORMAT = 1
# The block cache keeps verified copies of blocks read from a remote (S3) store. A local store
# is read directly: a cache would be a second copy of the same bytes on the same machine, written
# again at every first read (`nokvfs init --cache-size` still asks for one).
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
DEFAULT_LOCAL_CACHE_BYTES = 0
# Nothing reads History beyond the holds (snapshots, commit builds, restores) and the change
# feed's visibility, which pruning keeps; a longer retention is for diagnostics only.
DEFAULT_HISTORY_RETENTION = 0


def default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "nokvfs")


def _config_path(data_dir: str) -> str:
    return os.path.join(data_dir, CONFIG_NAME)


def init(
    data_dir: str,
    *,
    store: str | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_bytes: int | None = None,
    history_retention: int = DEFAULT_HISTORY_RETENTION,
    store_options: dict | None = None,
    retention: RetentionSettings | None = None,
) -> dict:
    """Create a data directory: a shard, a placed and fenced root, and the store configuration."""
    data_dir = os.path.abspath(data_dir)
    if os.path.exists(_config_path(data_dir)):
        raise AlreadyExists(f"{data_dir} is already a nokvfs data directory")
    if block_size < 4096 or block_size > 1 << 30:
        raise InvalidInput("block size must be between 4 KiB and 1 GiB")
    _check_retention(history_retention)
    filemodes.makedirs(data_dir)
    store = store or "file://" + os.path.join(data_dir, "objects")
    if cache_bytes is None:
        cache_bytes = DEFAULT_CACHE_BYTES if store.startswith("s3://") else DEFAULT_LOCAL_CACHE_BYTES
    if cache_bytes < 0:
        raise InvalidInput("the block cache size must not be negative")
    store_options = _check_store_options(store, store_options)
    os.makedirs(data_dir, exist_ok=True)
    from nokvfs.objects.store import open_store

    open_store(store, endpoint_url=endpoint_url, region=region, **store_options).close()  # fail early on a bad URL
    shard = Shard.create(os.path.join(data_dir, "shard"), new_id16())
    placements = PlacementStore(os.path.join(data_dir, "control"))
    try:
        root_id = new_id16()
        placements.create(root_id, shard.logical_shard_id)
        placement = placements.transition(root_id, RootPlacementLifecycle.Active, expected_generation=1)
        install_root_fence(shard, root_id, placement)
    finally:
        placements.close()
        shard.close()
    config = {
        "format": CONFIG_FORMAT,
        "root_id": root_id.hex(),
        "logical_shard_id": shard.logical_shard_id.hex(),
        "store": store,
        "endpoint_url": endpoint_url,
        "region": region,
        "block_size": block_size,
        "cache_bytes": cache_bytes,
        "history_retention_versions": history_retention,
    }
    if store_options:
        config["store_options"] = store_options
    if retention is not None:
        config[RETENTION_KEY] = retention.to_config()
    _write_config(data_dir, config)
    return config


def set_retention(data_dir: str, **changes) -> RetentionSettings:
    """Change some retention settings of a data directory (the others stay); the new settings.
    They take effect at the next retention pass (`nokvfs gc`, a mount's maintenance)."""
    data_dir = os.path.abspath(data_dir)
    config = read_config(data_dir)
    settings = dataclasses.replace(RetentionSettings.from_config(config), **changes)
    _write_config(data_dir, {**config, RETENTION_KEY: settings.to_config()})
    return settings


def retention_settings(data_dir: str) -> RetentionSettings:
    return RetentionSettings.from_config(read_config(data_dir))


def _write_config(data_dir: str, config: dict) -> None:
    tmp = _config_path(data_dir) + ".tmp"
    with open(tmp, "w", opener=filemodes.opener) as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, _config_path(data_dir))


def describe(data_dir: str) -> tuple[dict, RootPlacement]:
    """(configuration, the root's placement): what rebuilds this directory besides its shard."""
    config = read_config(data_dir)
    placements = PlacementStore(os.path.join(data_dir, "control"))
    try:
        placement = placements.get(id16_from_hex(config["root_id"], "root id"))
    finally:
        placements.close()
    if placement is None:
        raise NotFound(f"root {config['root_id']} has no placement in {data_dir}")
    return config, placement


def adopt(data_dir: str, config: dict, placement: RootPlacement) -> None:
    """Make `data_dir`, whose `shard/` was just restored, a data directory: the root's placement
    in its control plane, then the configuration (last: its presence makes it a data directory).

    The placement is rebuilt through the control plane's own entrypoints: created at generation
    1, then moved to its lifecycle until it reaches its generation.
    """
    data_dir = os.path.abspath(data_dir)
    if os.path.exists(_config_path(data_dir)):
        raise AlreadyExists(f"{data_dir} is already a nokvfs data directory")
    if placement.placement_generation < 1:
        raise InvalidInput("a placement generation starts at 1")
    _check_retention(config.get("history_retention_versions", DEFAULT_HISTORY_RETENTION))
    root_id = id16_from_hex(config["root_id"], "root id")
    placements = PlacementStore(os.path.join(data_dir, "control"))
    try:
        existing = placements.get(root_id)
        if existing is None:
            existing = placements.create(root_id, placement.logical_shard_id)
        while existing.placement_generation < placement.placement_generation:
            existing = placements.transition(
                root_id, placement.lifecycle, expected_generation=existing.placement_generation
            )
        if existing != placement:
            raise AlreadyExists(f"{data_dir}/control places root {root_id.hex()} otherwise: {existing}")
    finally:
        placements.close()
    _write_config(data_dir, {**config, "format": CONFIG_FORMAT})


def _check_retention(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise InvalidInput(f"history retention must be a whole number of versions, not {value!r}")
    return value


def _check_store_options(store_url: str, options) -> dict:
    """The store options a data directory may record: the S3 call deadlines, for s3:// only."""
    if not options:
        return {}
    if not isinstance(options, dict):
        raise InvalidInput(f"store_options must be an object, not {options!r}")
    from nokvfs.objects.s3 import TIMEOUT_OPTIONS

    unknown = sorted(set(options) - set(TIMEOUT_OPTIONS))
    if unknown:
        raise InvalidInput(f"unknown store option(s) {unknown}; known: {list(TIMEOUT_OPTIONS)}")
    if not str(store_url).startswith("s3://"):
        raise InvalidInput("store_options (call deadlines) apply to s3:// stores only")
    return dict(options)


def read_config(data_dir: str) -> dict:
    try:
        with open(_config_path(data_dir)) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise NotFound(f"{data_dir} is not a nokvfs data directory (run `nokvfs init` first)") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{_config_path(data_dir)} is not valid JSON: {exc}") from None
    if config.get("format") != CONFIG_FORMAT:
        raise InvalidInput(f"{_config_path(data_dir)} has format {config.get('format')!r}, expected {CONFIG_FORMAT}")
    return config


def open_root(
    data_dir: str,
    *,
    store: str | None = None,
    endpoint_url: str | None = None,
    verify: bool = False,
    recover: bool = True,
    store_wrapper=None,
) -> Root:
    """Open the data directory's root; with recover, resume or clean the publishes, commit
    builds and restores whose owning process is gone.

    A replica that is not the owner (a follower, a fenced old owner: nokvfs.workspace.replica)
    opens with its shard and store behind read-only guards and its commands built at an epoch
    that is not the shard's, and is never recovered: its writes fail with the role's typed error.

    Opening is cheap and safe by default: every row is verified when it is read. `verify`
    also reads every row and recomputes every state digest first (`Shard.open(verify=True)`).
    """
    from nokvfs.objects.blocks import BlockReader
    from nokvfs.objects.cache import BlockCache
    from nokvfs.objects.store import open_store

    data_dir = os.path.abspath(data_dir)
    config = read_config(data_dir)
    role = replica.read_role(data_dir)
    read_only = role is not None and not role.writable
    # A follower's shard is a cache the follower replays into: its commits are not flushed one by
    # one, the follower syncs once per poll (nokvfs.replicate.follower).
    options = {"sync": False} if role is not None and role.role == replica.FOLLOWER else {}
    shard = Shard.open(os.path.join(data_dir, "shard"), verify=verify, **options)
    if read_only:
        shard = replica.ReplicaShard(shard, role)
    try:
        placements = PlacementStore(os.path.join(data_dir, "control"))
        try:
            root_id = id16_from_hex(config["root_id"], "root id")
            placement = placements.get(root_id)
        finally:
            placements.close()
        if placement is None:
            raise NotFound(f"root {config['root_id']} has no placement in {data_dir}")
        store_url = store or config["store"]
        # The configured deadlines hold for whichever S3 store is used (also one given by --store).
        options = _check_store_options(store_url, config.get("store_options")) if store_url.startswith("s3://") else {}
        if store_url.startswith("s3://"):
            # The bucket was checked by init; checked again at the first 404, never at open, so
            # opening (a mount's start) does not wait on the endpoint.
            options["verify_bucket"] = False
        object_store = open_store(
            store_url, endpoint_url=endpoint_url or config.get("endpoint_url"), region=config.get("region"), **options
        )
        if read_only:
            object_store = replica.ReadOnlyStore(object_store, role)
        if store_wrapper is not None:  # a mount times its store calls (nokvfs.objects.metered)
            object_store = store_wrapper(object_store)
        cache_bytes = int(config.get("cache_bytes", DEFAULT_CACHE_BYTES))
        try:
            cache = BlockCache(os.path.join(data_dir, "cache"), max_bytes=cache_bytes) if cache_bytes else None
        except StoreError as exc:
            # One process owns the cache directory at a time (a live mount usually does): a second
            # process (a CLI put/get next to the mount) reads through the store uncached instead
            # of failing. Every block read is still SHA-256-verified by BlockReader.
            log.info("reading uncached: %s", exc)
            cache = None
        root = Root(
            shard,
            root_id,
            placement.placement_generation,
            object_store,
            BlockReader(object_store, cache),
            block_size=int(config["block_size"]),
            data_dir=data_dir,
            # Absent in data directories made before it existed: the default then.
            history_retention=_check_retention(config.get("history_retention_versions", DEFAULT_HISTORY_RETENTION)),
            # A follower's commands carry epoch 0, a fenced owner's the epoch it lost: neither is
            # the shard's, so the engine refuses them too, should one reach it past the guard.
            owner_epoch=None if not read_only else role.owned_epoch,
        )
    except BaseException:
        shard.close()
        raise
    if recover and read_only:
        log.debug("%s is a %s replica: its operations are the owner's to recover", data_dir, role.role)
    elif recover:
        from nokvfs.workspace import commit, publish, restore

        try:
            publish.recover(root)
            commit.recover(root)
            restore.recover(root)
        except FenceError as exc:
            # A fenced root takes no command, so nothing can be resumed or cleaned now; the
            # operations wait, and whatever this process tries to write is refused the same way.
            log.warning("recovery skipped: %s", exc)
        except BaseException:
            root.close()
            raise
    return root
