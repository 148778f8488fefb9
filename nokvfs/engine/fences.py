"""The RootFence and owner-epoch fences, for commands and reads alike.

Seed, "Metadata Command": before any mutation the shard validates "exact schema marker and active
local RootFence; current owner lease and monotonic epoch; read_version ...; request-id replay or
mismatch; ..." -- in that order, so a replay of an applied request is answered only to a caller
that still passes both fences. Seed, cold lookup: "every request still passes the active
RootFence and owner-epoch fence", so reads check them too (`Shard.read(fence=ReadFence(...))`):
the RootFence always, the owner epoch when the reader gives one. The workspace's reads give none:
in nokvfs an owner that another took over from goes on serving reads read-only, as a follower
does (its writes stay OwnerFenced).

The one exception is installing the fence itself. A `fence_install` command may carry exactly
one mutation -- a Put of its own root's RootFence -- and only predicates on that row, and the
fence it writes must name this logical shard and the command's placement generation. It moves a
fence only forward (nokvfs extension; the seed names the states, not the moves): a newer
placement generation starts at Installing; within one generation the state only advances,
Installing -> Active -> Draining -> Fenced (a step may be skipped). So a Fenced root takes no
writes but a newer generation's installation, and no installer can write any other tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from nokvfs.errors import FenceError, FormatError, OwnerFenced
from nokvfs.schema.enums import RootActivationState
from nokvfs.schema.keys import RootFenceKey
from nokvfs.schema.records import RootFence

ROOT_FENCE_TREE = "root_fence"


@dataclass(frozen=True)
class ReadFence:
    """What a reader of a root presents: the placement generation and owner epoch it holds.
    owner_epoch None: a read-only replica's read, which passes the RootFence only."""

    root_id: bytes
    placement_generation: int
    owner_epoch: int | None


def fence_key(root_id: bytes) -> bytes:
    return RootFenceKey(root_id).encode()


def decode_fence(raw: bytes | None) -> RootFence | None:
    return None if raw is None else RootFence.decode(raw)


def require_active(fence: RootFence | None, root_id: bytes, logical_shard_id: bytes, placement_generation: int) -> None:
    """FenceError unless the root's fence on this shard is Active at `placement_generation`."""
    if fence is None:
        raise FenceError(f"root {root_id.hex()} has no fence on this shard")
    if fence.activation_state != RootActivationState.Active:
        raise FenceError(f"root {root_id.hex()} fence is {fence.activation_state.name}")
    if fence.logical_shard_id != logical_shard_id:
        raise FenceError(f"root {root_id.hex()} is fenced to another logical shard")
    if fence.placement_generation != placement_generation:
        raise FenceError(f"placement generation {placement_generation} is not the fence's {fence.placement_generation}")


def require_owner(presented: int, current: int) -> None:
    if presented != current:
        raise OwnerFenced(f"owner epoch {presented} is not the shard's current {current}")


def check_installation(command, current: RootFence | None, logical_shard_id: bytes) -> None:
    """FenceError unless `command` (fence_install) only moves its root's fence forward."""
    key = fence_key(command.root_id)
    where = f"fence_install for root {command.root_id.hex()}"
    mutations = command.mutations
    if (
        len(mutations) != 1
        or getattr(mutations[0], "value", None) is None
        or mutations[0].tree != ROOT_FENCE_TREE
        or mutations[0].key != key
    ):
        raise FenceError(f"{where}: an installation writes the root's RootFence and nothing else")
    if command.events:
        raise FenceError(f"{where}: an installation emits no change events")
    for predicate in command.predicates:
        if predicate.tree != ROOT_FENCE_TREE or predicate.key != key:
            raise FenceError(f"{where}: an installation's predicates concern its RootFence only")
    try:
        new = RootFence.decode(mutations[0].value)
    except FormatError as exc:
        raise FenceError(f"{where}: the fence written does not decode: {exc}") from None
    if new.logical_shard_id != logical_shard_id:
        raise FenceError(f"{where}: the fence names another logical shard")
    if new.placement_generation != command.placement_generation:
        raise FenceError(
            f"{where}: the fence's placement generation {new.placement_generation} is not the command's "
            f"{command.placement_generation}"
        )
    if current is None:
        if new.activation_state != RootActivationState.Installing:
            raise FenceError(f"{where}: a new fence starts Installing, not {new.activation_state.name}")
        return
    if current.logical_shard_id != logical_shard_id:
        raise FenceError(f"{where}: a populated root never changes logical shard")
    if new.placement_generation < current.placement_generation:
        raise FenceError(
            f"{where}: generation {new.placement_generation} is older than the installed {current.placement_generation}"
        )
    if new.placement_generation > current.placement_generation:
        if new.activation_state != RootActivationState.Installing:
            raise FenceError(f"{where}: a newer generation starts Installing, not {new.activation_state.name}")
        return
    if new.activation_state <= current.activation_state:
        raise FenceError(
            f"{where}: the fence is {current.activation_state.name} at generation {current.placement_generation}; "
            f"{new.activation_state.name} does not move it forward"
        )
