"""Fences first: the RootFence and the owner epoch, before replay, for commands and reads alike;
and a fence installation that installs the fence and nothing else."""

from __future__ import annotations

import pytest

from nokvfs.engine.command import Absent, Exists, MetadataCommand, Put, ValueEquals
from nokvfs.engine.placement import move_root_fence
from nokvfs.errors import FenceError, OwnerFenced, PredicateFailed, ReadVersionStale
from nokvfs.schema import keys
from nokvfs.schema.enums import RootActivationState
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import RootFence
from nokvfs.workspace import datadir, listing, namespace, reading, workbench
from nokvfs.workspace.root import Root

K1 = b"\x01" * 16 + b"one"


def test_a_replay_after_the_owner_epoch_advanced_is_fenced(shard_env):
    """Seed, Metadata Command: "Before any mutation, the shard validates: exact schema marker and
    active local RootFence; current owner lease and monotonic epoch; read_version exactly equals
    the current shard commit clock ...; request-id replay or mismatch; ..." -- so a replay is
    answered only to a caller that still passes the owner-epoch fence."""
    command = shard_env.command(mutations=[Put("path_current", K1, b"\x02v")], result=b"done")
    first = shard_env.shard.apply(command)
    assert shard_env.shard.apply(command).replayed  # the same owner: the stored result
    shard_env.shard.advance_owner_epoch(command.owner_epoch + 1)
    with pytest.raises(OwnerFenced):
        shard_env.shard.apply(command)
    # The new owner's rebuild of the same request replays the stored result.
    rebuilt = shard_env.command(
        mutations=[Put("path_current", K1, b"\x02v")],
        result=b"done",
        request_id=command.request_id,
        command_digest=command.command_digest,
    )
    again = shard_env.shard.apply(rebuilt)
    assert again.replayed and (again.commit_version, again.result) == (first.commit_version, b"done")


def test_a_replay_on_a_fenced_root_is_refused(shard_env):
    """Seed: "exact schema marker and active local RootFence" comes first of all, before the
    request-id replay."""
    command = shard_env.command(mutations=[Put("path_current", K1, b"\x02v")])
    shard_env.shard.apply(command)
    move_root_fence(shard_env.shard, shard_env.root_id, RootActivationState.Fenced)
    with pytest.raises(FenceError, match="fence is Fenced"):
        shard_env.shard.apply(command)


def test_the_root_fence_precedes_the_owner_epoch_which_precedes_the_read_version(shard_env):
    """Seed: the RootFence, then "current owner lease and monotonic epoch", then "read_version
    exactly equals the current shard commit clock", then the predicates."""
    stale_everything = shard_env.command(
        placement_generation=shard_env.placement_generation + 1,
        owner_epoch=shard_env.shard.owner_epoch + 5,
        read_version=0,
        predicates=[Exists("path_current", K1)],
        mutations=[Put("path_current", K1, b"\x02v")],
    )
    with pytest.raises(FenceError) as info:
        shard_env.shard.apply(stale_everything)
    assert not isinstance(info.value, OwnerFenced)
    with pytest.raises(OwnerFenced):
        shard_env.apply(
            owner_epoch=shard_env.shard.owner_epoch + 5, read_version=0, predicates=[Exists("path_current", K1)]
        )
    with pytest.raises(ReadVersionStale):
        shard_env.apply(read_version=0, predicates=[Exists("path_current", K1)])
    with pytest.raises(PredicateFailed):
        shard_env.apply(predicates=[Exists("path_current", K1)])


def test_reads_pass_the_root_fence_and_the_owner_epoch(shard_env):
    """Seed, cold lookup: "A client/router may cache the incarnation because Visible is
    immutable; every request still passes the active RootFence and owner-epoch fence."""
    from nokvfs.engine.fences import ReadFence

    shard_env.apply(mutations=[Put("path_current", K1, b"\x02v")])
    epoch = shard_env.shard.owner_epoch
    fence = ReadFence(shard_env.root_id, shard_env.placement_generation, epoch)
    with shard_env.shard.read(fence=fence) as view:
        assert view.get("path_current", K1) == b"\x02v"
    with pytest.raises(FenceError, match="placement generation"):
        with shard_env.shard.read(fence=ReadFence(shard_env.root_id, shard_env.placement_generation + 1, epoch)):
            pass
    with pytest.raises(FenceError, match="no fence"):
        with shard_env.shard.read(fence=ReadFence(new_id16(), shard_env.placement_generation, epoch)):
            pass
    shard_env.shard.advance_owner_epoch(epoch + 1)
    with pytest.raises(OwnerFenced):
        with shard_env.shard.read(fence=fence):
            pass
    move_root_fence(shard_env.shard, shard_env.root_id, RootActivationState.Fenced)
    with pytest.raises(FenceError, match="fence is Fenced"):
        with shard_env.shard.read(fence=ReadFence(shard_env.root_id, shard_env.placement_generation, epoch + 1)):
            pass


@pytest.fixture
def data_root(tmp_path):
    data = str(tmp_path / "data")
    datadir.init(data, block_size=4096)
    root = datadir.open_root(data)
    workbench.create(root, "w")
    namespace.put(root, "w", "outputs/a", b"alpha")
    yield root
    root.close()


def test_stat_list_and_get_on_a_fenced_root_are_fence_errors(data_root):
    """Seed, cold lookup: "every request still passes the active RootFence and owner-epoch
    fence" -- stat, list and get of a Fenced root are refused, not served."""
    with data_root.read() as view:
        entry = listing.stat(view, data_root, "w", "outputs/a").entry
    move_root_fence(data_root.shard, data_root.root_id, RootActivationState.Draining)
    for read in (
        lambda view: listing.stat(view, data_root, "w", "outputs/a"),
        lambda view: listing.list_dir(view, data_root, "w", "outputs"),
        lambda view: reading.read(data_root, entry, view=view),
    ):
        with pytest.raises(FenceError, match="fence is Draining"):
            with data_root.read() as view:
                read(view)


def test_a_stale_owner_process_reads_read_only_and_cannot_write(data_root):
    """The RootFence is asked of every read, the owner epoch of every write: an owner another
    took over from goes on serving reads read-only (nokvfs's failover design), and its writes
    are OwnerFenced; a reader that must be the owner asks the engine for the epoch too."""
    from nokvfs.engine.fences import ReadFence

    data_root.shard.advance_owner_epoch(data_root.owner_epoch + 1)
    with data_root.read() as view:
        assert listing.stat(view, data_root, "w", "outputs/a").size == 5
    with pytest.raises(OwnerFenced):
        namespace.put(data_root, "w", "outputs/b", b"refused")
    with pytest.raises(OwnerFenced):
        with data_root.shard.read(
            fence=ReadFence(data_root.root_id, data_root.placement_generation, data_root.owner_epoch)
        ):
            pass
    fresh = Root(
        data_root.shard,
        data_root.root_id,
        data_root.placement_generation,
        data_root.store,
        data_root.blocks,
        block_size=data_root.block_size,
        data_dir=data_root.data_dir,
    )
    namespace.put(fresh, "w", "outputs/b", b"the new owner writes")


# --- fence installation ---------------------------------------------------------------------


def install(shard_env, fence: RootFence | None, *, root_id=None, extra=(), predicates=None, events=(), generation=None):
    root_id = root_id or shard_env.root_id
    key = keys.RootFenceKey(root_id).encode()
    with shard_env.shard.read() as view:
        raw = view.get("root_fence", key)
    mutations = ([] if fence is None else [Put("root_fence", key, fence)]) + list(extra)
    return shard_env.shard.apply(
        MetadataCommand(
            root_id=root_id,
            logical_shard_id=shard_env.shard.logical_shard_id,
            placement_generation=shard_env.placement_generation if generation is None else generation,
            owner_epoch=shard_env.shard.owner_epoch,
            request_id=new_id16(),
            read_version=shard_env.shard.commit_version,
            predicates=tuple(
                predicates
                if predicates is not None
                else ([Absent("root_fence", key)] if raw is None else [ValueEquals("root_fence", key, raw)])
            ),
            mutations=tuple(mutations),
            events=tuple(events),
            fence_install=True,
        )
    )


def fence(shard_env, state, generation=None):
    generation = shard_env.placement_generation if generation is None else generation
    return RootFence(shard_env.shard.logical_shard_id, generation, state)


def test_a_fence_installation_writes_the_fence_and_nothing_else(shard_env):
    """nokvfs rule for `fence_install` (the seed admits only RootFence installation without an
    Active fence): one Put of the command's own RootFence, predicates on it only, no events."""
    version = shard_env.shard.commit_version
    other_root = new_id16()
    cases = [
        dict(fence=fence(shard_env, RootActivationState.Draining), extra=[Put("path_current", K1, b"\x02smuggled")]),
        dict(fence=None, extra=[Put("path_current", K1, b"\x02smuggled")]),
        dict(fence=fence(shard_env, RootActivationState.Draining), events=[b"\x02event"]),
        dict(fence=fence(shard_env, RootActivationState.Draining), predicates=[Absent("path_current", K1)]),
        dict(
            fence=fence(shard_env, RootActivationState.Installing),
            root_id=other_root,
            extra=[
                Put(
                    "root_fence",
                    keys.RootFenceKey(shard_env.root_id).encode(),
                    fence(shard_env, RootActivationState.Fenced),
                )
            ],
        ),
    ]
    for case in cases:
        with pytest.raises(FenceError, match="fence_install"):
            install(shard_env, **case)
    assert shard_env.shard.commit_version == version
    with shard_env.shard.read() as view:
        assert view.get("path_current", K1) is None


def test_a_fence_only_moves_forward(shard_env):
    """The fence of one placement generation moves Installing -> Active -> Draining -> Fenced; a
    newer generation starts again at Installing; nothing moves back, to another shard or to an
    older generation -- so a Fenced root is written again only by a newer installation."""
    gen = shard_env.placement_generation
    refused = [
        fence(shard_env, RootActivationState.Active),  # Active -> Active moves nothing
        fence(shard_env, RootActivationState.Installing),  # backwards
        fence(shard_env, RootActivationState.Active, gen + 1),  # a newer generation starts Installing
        RootFence(new_id16(), gen, RootActivationState.Draining),  # another logical shard
    ]
    for candidate in refused:
        with pytest.raises(FenceError):
            install(shard_env, candidate, generation=candidate.placement_generation)
    install(shard_env, fence(shard_env, RootActivationState.Fenced))
    with pytest.raises(FenceError):
        install(shard_env, fence(shard_env, RootActivationState.Active))  # a Fenced root stays fenced
    with pytest.raises(FenceError):
        shard_env.apply(mutations=[Put("path_current", K1, b"\x02v")])
    install(shard_env, fence(shard_env, RootActivationState.Installing, gen + 1), generation=gen + 1)
    install(shard_env, fence(shard_env, RootActivationState.Active, gen + 1), generation=gen + 1)
    with pytest.raises(FenceError):
        install(shard_env, fence(shard_env, RootActivationState.Installing, gen), generation=gen)  # older generation
    shard_env.placement_generation = gen + 1
    assert shard_env.apply(mutations=[Put("path_current", K1, b"\x02v")]).commit_version > 0
