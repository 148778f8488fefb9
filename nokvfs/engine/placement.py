"""Root placement (control plane) and RootFence installation on the selected shard.

RootPlacement is not a shard-local family: it lives in its own small LMDB store, owned by the
control plane. The selected logical shard installs a RootFence carrying the placement generation;
every metadata command is then validated against that fence at the commit boundary.
"""

from __future__ import annotations

import lmdb

from nokvfs import filemodes
from nokvfs.engine.command import Absent, MetadataCommand, Put, ValueEquals
from nokvfs.errors import AlreadyExists, FenceError, GenerationConflict, NotFound, StoreError
from nokvfs.schema.enums import RootActivationState, RootPlacementLifecycle
from nokvfs.schema.ids import check_id16, new_id16
from nokvfs.schema.keys import RootFenceKey
from nokvfs.schema.records import RootFence, RootPlacement


class PlacementStore:
    """The control plane's RootPlacement records: root_id -> logical shard, generation, lifecycle."""

    def __init__(self, path: str):
        filemodes.makedirs(path)
        try:
            self._env = lmdb.open(path, map_size=1 << 26, max_dbs=2, subdir=True, sync=True, mode=filemodes.DIR_MODE)
        except lmdb.Error as exc:
            raise StoreError(f"cannot open placement store {path}: {exc}") from None
        self._db = self._env.open_db(b"root_placement", create=True)

    def close(self) -> None:
        self._env.close()

    def get(self, root_id: bytes) -> RootPlacement | None:
        with self._env.begin() as txn:
            raw = txn.get(check_id16(root_id, "root id"), db=self._db)
        return None if raw is None else RootPlacement.decode(raw)

    def create(self, root_id: bytes, logical_shard_id: bytes) -> RootPlacement:
        """Place a new root on a logical shard: Provisioning at generation 1."""
        check_id16(root_id, "root id")
        check_id16(logical_shard_id, "logical shard id")
        placement = RootPlacement(logical_shard_id, 1, RootPlacementLifecycle.Provisioning)
        with self._env.begin(write=True) as txn:
            if not txn.put(root_id, placement.encode(), db=self._db, overwrite=False):
                raise AlreadyExists(f"root {root_id.hex()} is already placed")
        return placement

    def transition(
        self, root_id: bytes, lifecycle: RootPlacementLifecycle, *, expected_generation: int
    ) -> RootPlacement:
        """Change lifecycle with a generation CAS; the generation advances by one."""
        with self._env.begin(write=True) as txn:
            raw = txn.get(root_id, db=self._db)
            if raw is None:
                raise NotFound(f"root {root_id.hex()} has no placement")
            current = RootPlacement.decode(raw)
            if current.placement_generation != expected_generation:
                raise GenerationConflict(
                    f"placement generation is {current.placement_generation}, expected {expected_generation}"
                )
            if current.lifecycle == RootPlacementLifecycle.Retired:
                raise FenceError(f"root {root_id.hex()} placement is Retired")
            updated = RootPlacement(current.logical_shard_id, expected_generation + 1, lifecycle)
            txn.put(root_id, updated.encode(), db=self._db)
        return updated


def install_root_fence(shard, root_id: bytes, placement: RootPlacement) -> RootFence:
    """Install the RootFence for an Active placement on this shard: Installing, then Active."""
    if placement.lifecycle != RootPlacementLifecycle.Active:
        raise FenceError(f"placement is {placement.lifecycle.name}, not Active")
    if placement.logical_shard_id != shard.logical_shard_id:
        raise FenceError("the placement names another logical shard")
    key = RootFenceKey(root_id).encode()
    generation = placement.placement_generation
    raw, fence = _read_fence(shard, key)
    if fence is not None:
        if fence.logical_shard_id != shard.logical_shard_id:
            raise FenceError("a populated root never changes logical shard")
        if fence.placement_generation > generation:
            raise FenceError(
                f"fence generation {fence.placement_generation} is newer than the placement's {generation}"
            )
        if fence.placement_generation == generation and fence.activation_state == RootActivationState.Active:
            return fence
    installing = RootFence(shard.logical_shard_id, generation, RootActivationState.Installing)
    if fence != installing:
        raw = _write_fence(shard, root_id, key, raw, installing, generation)
    active = RootFence(shard.logical_shard_id, generation, RootActivationState.Active)
    _write_fence(shard, root_id, key, raw, active, generation)
    return active


def _read_fence(shard, key: bytes):
    with shard.read() as view:
        raw = view.get("root_fence", key)
    return raw, None if raw is None else RootFence.decode(raw)


def _write_fence(shard, root_id: bytes, key: bytes, raw: bytes | None, new: RootFence, generation: int) -> bytes:
    shard.apply(
        MetadataCommand(
            root_id=root_id,
            logical_shard_id=shard.logical_shard_id,
            placement_generation=generation,
            owner_epoch=shard.owner_epoch,
            request_id=new_id16(),
            read_version=shard.commit_version,
            predicates=(Absent("root_fence", key) if raw is None else ValueEquals("root_fence", key, raw),),
            mutations=(Put("root_fence", key, new),),
            fence_install=True,
        )
    )
    return new.encode()


def move_root_fence(shard, root_id: bytes, state: RootActivationState) -> RootFence:
    """Move the root's installed fence forward to `state` within its placement generation
    (Active -> Draining -> Fenced): from Draining on, the shard takes no command of the root and
    serves no read of it. A fence only moves forward (nokvfs.engine.fences)."""
    key = RootFenceKey(root_id).encode()
    raw, fence = _read_fence(shard, key)
    if fence is None:
        raise NotFound(f"root {root_id.hex()} has no fence on this shard")
    moved = RootFence(fence.logical_shard_id, fence.placement_generation, state)
    _write_fence(shard, root_id, key, raw, moved, fence.placement_generation)
    return moved
