"""Group commit (`Shard.apply_group`): several commands in one LMDB write transaction, each one
exactly as if applied alone -- versions, dedupe rows, ChangeEvents, History and recovery-outbox
records byte for byte -- and a refused command excluded without losing the others."""

from __future__ import annotations

import os

import pytest

from nokvfs.engine import replay
from nokvfs.engine.command import Absent, Delete, MetadataCommand, Put, ValueEquals
from nokvfs.engine.shard import Shard
from nokvfs.errors import GenerationConflict, IntegrityError, PredicateFailed, RequestMismatch
from nokvfs.schema import keys
from nokvfs.schema.ids import new_id16
from tests.conftest import stored_rows

K1 = b"\x01" * 16 + b"one"
K2 = b"\x01" * 16 + b"two"
K3 = b"\x01" * 16 + b"three"


def _clone(shard_env, tmp_path, name: str) -> Shard:
    """A second shard holding exactly what the first holds now (a checkpoint copy)."""
    path = str(tmp_path / name)
    os.makedirs(path)
    shard_env.shard.copy_to(path)
    return Shard.open(path)


def _builder(shard_env, request_id, predicates_of, mutations_of, events=(), result=b""):
    """A command built from what the shard holds at the version it is applied at."""

    def build(view):
        return MetadataCommand(
            root_id=shard_env.root_id,
            logical_shard_id=shard_env.shard.logical_shard_id,
            placement_generation=shard_env.placement_generation,
            owner_epoch=1,
            request_id=request_id,
            read_version=view.version,
            predicates=tuple(predicates_of(view)),
            mutations=tuple(mutations_of(view)),
            events=tuple(events),
            result=result,
        )

    return build


def _workload(shard_env):
    """Five commands: creates, an update of a key an earlier one wrote (read inside the group),
    one whose predicate fails, and a delete; events and results on some."""
    ids = [new_id16() for _ in range(5)]
    return [
        _builder(
            shard_env,
            ids[0],
            lambda v: [Absent("path_current", K1)],
            lambda v: [Put("path_current", K1, b"\x02a")],
            events=[b"\x02event-one"],
            result=b"r1",
        ),
        _builder(shard_env, ids[1], lambda v: [], lambda v: [Put("path_current", K2, b"\x02b")]),
        # Depends on the first: it CASes the value the first wrote, read at its own version.
        _builder(
            shard_env,
            ids[2],
            lambda v: [ValueEquals("path_current", K1, v.get("path_current", K1))],
            lambda v: [Put("path_current", K1, v.get("path_current", K1) + b"+")],
            events=[b"\x02event-two", b"\x02event-three"],
            result=b"r3",
        ),
        # Refused: K2 exists.
        _builder(
            shard_env, ids[3], lambda v: [Absent("path_current", K2)], lambda v: [Put("path_current", K3, b"\x02c")]
        ),
        _builder(
            shard_env, ids[4], lambda v: [], lambda v: [Delete("path_current", K2), Put("path_current", K3, b"\x02d")]
        ),
    ]


def _one_by_one(shard: Shard, builders) -> list:
    results = []
    for build in builders:
        with shard.read() as view:
            command = build(view)
        try:
            results.append(shard.apply(command))
        except PredicateFailed as exc:
            results.append(exc)
    return results


def _all_rows(shard: Shard) -> dict:
    with shard._env.begin() as txn:
        return {tree: stored_rows(txn, shard, tree) for tree in shard._dbs}


def test_a_group_is_byte_identical_to_its_commands_applied_one_by_one(shard_env, tmp_path):
    grouped = _clone(shard_env, tmp_path, "grouped")
    try:
        workload = _workload(shard_env)
        alone = _one_by_one(shard_env.shard, workload)
        together = grouped.apply_group(workload)
        assert [type(r) for r in together] == [type(r) for r in alone]
        assert isinstance(together[3], PredicateFailed)  # excluded, reported on its own
        for a, g in zip(alone, together):
            if not isinstance(a, Exception):
                assert (g.commit_version, g.recovery_lsn, g.result) == (a.commit_version, a.recovery_lsn, a.result)
        # Four commands: four versions and four outbox records, as one by one.
        assert grouped.commit_version == shard_env.shard.commit_version == together[-1].commit_version
        assert grouped.recovery_tail == shard_env.shard.recovery_tail
        # Every row of every tree -- families, dedupe, events, History, outbox, System -- is the same.
        assert _all_rows(grouped) == _all_rows(shard_env.shard)
        with grouped.read() as view:
            assert view.get("path_current", K1) == b"\x02a+"
            dedupe = keys.CommandDedupeKey(shard_env.root_id, b"\x00" * 16).encode()
            assert view.get("command_dedupe", dedupe) is None
    finally:
        grouped.close()
    reopened = Shard.open(grouped.path, verify=True)  # outbox chain, tail and state digests check out
    reopened.close()


def test_a_replica_replaying_a_groups_outbox_equals_the_group(shard_env, tmp_path):
    replica = _clone(shard_env, tmp_path, "replica")
    try:
        start = shard_env.shard.recovery_tail.applied_lsn
        shard_env.shard.apply_group(_workload(shard_env))
        for entry in shard_env.shard.outbox_entries():
            if entry.lsn > start:
                replay.replay(replica, entry)
        assert _all_rows(replica) == _all_rows(shard_env.shard)
    finally:
        replica.close()


def test_a_refused_command_leaves_no_trace_and_the_others_commit(shard_env):
    taken = new_id16()
    shard_env.apply(mutations=[Put("path_current", K1, b"\x02a")], request_id=taken)
    before = shard_env.shard.commit_version
    results = shard_env.shard.apply_group(
        [
            shard_env.command(mutations=[Put("path_current", K2, b"\x02b")], read_version=before),
            # Same request id, other inputs: a mismatch, excluded.
            lambda view: shard_env.command(
                mutations=[Put("path_current", K3, b"x")], request_id=taken, read_version=view.version
            ),
            # A generation conflict raised while building: excluded too.
            lambda view: (_ for _ in ()).throw(GenerationConflict("the path moved")),
            lambda view: shard_env.command(mutations=[Put("path_current", K3, b"\x02c")], read_version=view.version),
        ]
    )
    assert isinstance(results[1], RequestMismatch) and isinstance(results[2], GenerationConflict)
    assert [r.commit_version for r in (results[0], results[3])] == [before + 1, before + 2]
    with shard_env.shard.read() as view:
        assert view.get("path_current", K3) == b"\x02c"


def test_a_replayed_request_in_a_group_returns_its_stored_result(shard_env):
    request_id = new_id16()
    first = shard_env.apply(mutations=[Put("path_current", K1, b"\x02a")], request_id=request_id, result=b"r")
    [again] = shard_env.shard.apply_group(
        [shard_env.command(mutations=[Put("path_current", K1, b"\x02a")], request_id=request_id, result=b"r")]
    )
    assert again.replayed and (again.commit_version, again.result) == (first.commit_version, b"r")
    assert shard_env.shard.commit_version == first.commit_version


def test_damage_aborts_the_whole_group(shard_env):
    before = shard_env.shard.recovery_tail

    def damaged(view):
        raise IntegrityError("a row failed its check")

    with pytest.raises(IntegrityError):
        shard_env.shard.apply_group([shard_env.command(mutations=[Put("path_current", K1, b"\x02a")]), damaged])
    assert shard_env.shard.recovery_tail == before
    with shard_env.shard.read() as view:
        assert view.get("path_current", K1) is None
