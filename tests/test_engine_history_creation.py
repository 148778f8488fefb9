"""History of the families whose rows carry their created_version (ArtifactRevision, RevisionRef):
creating a row at exactly that version writes no History row, and reads at every older version
still see exactly what was there. GcCandidate rows, like operations, are read at the current
version only."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.engine.command import Delete, Put
from nokvfs.engine.scan import scan_prefix
from nokvfs.errors import HistoryNotRetained
from nokvfs.schema import keys
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import RevisionRef
from tests.conftest import stored_rows


def _history_rows(shard, tree: str) -> int:
    tag = keys.FAMILY_BY_NAME[tree].tag
    with shard._env.begin() as txn:
        return sum(1 for key, _ in stored_rows(txn, shard, "history") if key[0] == tag)


def _ref(created: int, epoch: int = 1) -> bytes:
    return RevisionRef(reference_epoch_at_add=epoch, created_version=created).encode()


def test_a_creation_at_its_created_version_writes_no_history_and_older_reads_do_not_see_it(shard_env):
    key = shard_env.root_id + new_id16()
    before = shard_env.shard.commit_version
    created = before + 1
    shard_env.apply(mutations=[Put("revision_ref", key, _ref(created))])
    assert _history_rows(shard_env.shard, "revision_ref") == 0
    shard_env.apply(mutations=[Put("revision_ref", key, _ref(created, epoch=2))])  # an update keeps it
    shard_env.apply(mutations=[Delete("revision_ref", key)])
    recreated = shard_env.shard.commit_version + 2
    shard_env.apply(mutations=[Put("path_current", b"\x01" * 20, b"\x02x")])  # an unrelated version
    shard_env.apply(mutations=[Put("revision_ref", key, _ref(recreated, epoch=3))])
    assert _history_rows(shard_env.shard, "revision_ref") == 2  # the update and the deletion
    expected = {
        before: None,
        created: _ref(created),
        created + 1: _ref(created, epoch=2),
        created + 2: None,  # deleted
        created + 3: None,  # deleted, before the creation again
        recreated: _ref(recreated, epoch=3),
    }
    for version, value in expected.items():
        with shard_env.shard.read(version) as view:
            assert view.get("revision_ref", key) == value, version
            items = scan_prefix(view, "revision_ref", shard_env.root_id).items
            assert items == (((key, value),) if value else ())


def test_a_creation_at_another_version_than_its_created_version_keeps_its_history(shard_env):
    key = shard_env.root_id + new_id16()
    shard_env.apply(mutations=[Put("path_current", b"\x01" * 20, b"\x02x")])
    stated = shard_env.shard.commit_version  # one version before the command that creates it
    shard_env.apply(mutations=[Put("revision_ref", key, _ref(stated))])
    assert _history_rows(shard_env.shard, "revision_ref") == 1
    with shard_env.shard.read(stated) as view:
        assert view.get("revision_ref", key) is None


def test_created_and_changed_in_one_command_is_absent_before_it(shard_env):
    key = shard_env.root_id + new_id16()
    before = shard_env.shard.commit_version
    shard_env.apply(
        mutations=[Put("revision_ref", key, _ref(before + 1)), Put("revision_ref", key, _ref(before + 1, epoch=5))]
    )
    assert _history_rows(shard_env.shard, "revision_ref") == 0
    with shard_env.shard.read(before) as view:
        assert view.get("revision_ref", key) is None
    with shard_env.shard.read() as view:
        assert view.get("revision_ref", key) == _ref(before + 1, epoch=5)


def test_gc_candidates_are_read_at_the_current_version_only(shard_env):
    key = shard_env.root_id + new_id16() + (1).to_bytes(8, "big")
    shard_env.apply(mutations=[Put("gc_candidate", key, b"\x01candidate")])
    shard_env.apply(mutations=[Put("gc_candidate", key, b"\x01claimed")])
    assert _history_rows(shard_env.shard, "gc_candidate") == 0
    with shard_env.shard.read(shard_env.shard.commit_version - 1) as view:
        with pytest.raises(HistoryNotRetained, match="gc_candidate rows are read at the current version only"):
            view.get("gc_candidate", key)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=30), seed=st.integers(0, 9))
def test_revision_refs_at_every_version_equal_a_replayed_model(shard_env, ops, seed):
    """Creations (at their created_version, or stating an older one), updates and deletions of a
    few keys: at every version, point reads and scans equal a dict model of that version."""
    base = shard_env.shard.commit_version
    prefix = shard_env.root_id + new_id16()
    rng = random.Random(seed)
    model, states = {}, {}
    for action, n in ops:
        key = prefix + bytes([n]) * 8
        version = shard_env.shard.commit_version + 1
        if action == 0 and key in model:
            model.pop(key)
            mutation = Delete("revision_ref", key)
        elif key in model:  # an update keeps the created_version
            created = RevisionRef.decode(model[key]).created_version
            model[key] = _ref(created, epoch=rng.randrange(1 << 32))
            mutation = Put("revision_ref", key, model[key])
        else:
            stated = version if action != 1 else max(1, version - rng.randrange(1, 3))
            model[key] = _ref(stated, epoch=rng.randrange(1 << 32))
            mutation = Put("revision_ref", key, model[key])
        assert shard_env.apply(mutations=[mutation]).commit_version == version
        states[version] = dict(model)
    states[base] = {}
    for version, expected in states.items():
        with shard_env.shard.read(version) as view:
            for n in range(5):
                key = prefix + bytes([n]) * 8
                assert view.get("revision_ref", key) == expected.get(key), (version, n)
            assert dict(scan_prefix(view, "revision_ref", prefix).items) == expected
