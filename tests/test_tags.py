"""Tags: each tag owns one CommitConsumer; setting adds it against a Sealed commit, moving
releases the old one and adds the new (tag_generation + 1), deleting releases it. Neither ever
retires a commit, and a commit claimed for retirement accepts no tag.
"""

from __future__ import annotations

import pytest

from nokvfs.errors import GenerationConflict, NameInvalid, NotFound, PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, CommitConsumerKind, CommitState
from nokvfs.schema.records import Commit, CommitConsumer
from nokvfs.workspace import changes, commit, namespace, tag
from nokvfs.workspace import workbench as wb
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    WB,
    all_rows,
    bench_fixture,
    data_dir_fixture,
    root_fixture,
)


@pytest.fixture
def two(bench):
    """A workbench with two commits, neither consumed by the head (the head is a third)."""
    root = bench
    namespace.put(root, WB, "outputs/a", b"a")
    first = commit.build(root, WB, parents=[])
    namespace.put(root, WB, "outputs/a", b"b")
    second = commit.build(root, WB, parents=[])
    commit.build(root, WB, parents=[])
    return root, first.commit_id, second.commit_id


def row(root, commit_id) -> Commit:
    with root.read() as view:
        return Commit.decode(view.get("commit", keys.CommitKey(root.root_id, commit_id).encode()))


def tag_consumers(root, commit_id) -> dict:
    prefix = keys.commit_consumer_prefix(root.root_id, commit_id, CommitConsumerKind.Tag)
    return {
        keys.CommitConsumerKey.decode(k).owner().tag_name: CommitConsumer.decode(v)
        for k, v in all_rows(root, "commit_consumer", prefix)
    }


def test_setting_a_tag_adds_one_consumer_at_the_next_epoch(two):
    root, first, _ = two
    before = row(root, first)
    info = tag.set(root, WB, "v1", first)
    assert (info.commit_id, info.generation) == (first, 1)
    after = row(root, first)
    assert (after.consumer_count, after.consumer_epoch) == (before.consumer_count + 1, before.consumer_epoch + 1)
    assert tag_consumers(root, first)["v1"].consumer_epoch_at_add == after.consumer_epoch
    assert tag.resolve(root, WB, "v1").commit_id == first


def test_moving_a_tag_releases_the_old_consumer_and_adds_the_new_one(two):
    root, first, second = two
    tag.set(root, WB, "release", first)
    moved = tag.set(root, WB, "release", second)
    assert moved.generation == 2
    assert tag_consumers(root, first) == {} and set(tag_consumers(root, second)) == {"release"}
    old = row(root, first)
    assert old.consumer_count == 0 and old.last_zero_consumer_version > 0
    assert old.state == CommitState.Sealed  # moving never retires


def test_deleting_a_tag_never_retires_its_commit(two):
    root, first, _ = two
    tag.set(root, WB, "tmp", first)
    gone = tag.delete(root, WB, "tmp")
    assert gone.commit_id == first
    assert row(root, first).state == CommitState.Sealed and row(root, first).consumer_count == 0
    with pytest.raises(NotFound):
        tag.resolve(root, WB, "tmp")
    with pytest.raises(NotFound):
        tag.delete(root, WB, "tmp")


def test_expected_generations_fence_concurrent_movers(two):
    root, first, second = two
    with pytest.raises(GenerationConflict):
        tag.set(root, WB, "t", first, expected_generation=1)
    tag.set(root, WB, "t", first, expected_generation=0)
    with pytest.raises(GenerationConflict):
        tag.set(root, WB, "t", second, expected_generation=0)
    tag.set(root, WB, "t", second, expected_generation=1)
    with pytest.raises(GenerationConflict):
        tag.delete(root, WB, "t", expected_generation=1)
    tag.delete(root, WB, "t", expected_generation=2)


def test_setting_a_tag_to_its_own_commit_changes_nothing(two):
    root, first, _ = two
    tag.set(root, WB, "same", first)
    version = root.shard.commit_version
    assert tag.set(root, WB, "same", first).generation == 1
    assert root.shard.commit_version == version


def test_a_tag_keeps_its_commit_from_retirement_until_deleted(two):
    root, first, _ = two
    tag.set(root, WB, "keep", first)
    with pytest.raises(commit.CommitInUse):
        commit.retire(root, first)
    tag.delete(root, WB, "keep")
    commit.retire(root, first)
    assert row(root, first).state == CommitState.Retired


def test_a_commit_claimed_for_retirement_accepts_no_tag(two):
    root, first, _ = two
    commit.claim_retirement(root, first)
    with pytest.raises(PredicateFailed):
        tag.set(root, WB, "late", first)
    assert tag_consumers(root, first) == {}


def test_tag_events_list_and_names(two):
    root, first, second = two
    version = root.shard.commit_version
    tag.set(root, WB, "b", first)
    tag.set(root, WB, "a-longer-name", second)
    tag.set(root, WB, "b", second)
    tag.delete(root, WB, "a-longer-name")
    assert [(t.name, t.commit_id) for t in tag.list(root, WB)] == [("b", second)]
    feed = changes.read_changes(root, workbench_id=WB, after_commit_version=version).changes
    assert [(c.kind, c.path, c.before, c.after) for c in feed] == [
        (ChangeEventKind.TagSet, "b", None, first),
        (ChangeEventKind.TagSet, "a-longer-name", None, second),
        (ChangeEventKind.TagSet, "b", first, second),
        (ChangeEventKind.TagDeleted, "a-longer-name", second, None),
    ]
    for bad in ("", "x\x00y", "z" * 129):
        with pytest.raises(NameInvalid):
            tag.set(root, WB, bad, first)
    with pytest.raises(NotFound):
        tag.set(root, WB, "ghost", bytes(32))
    wb.create(root, "other")
    assert tag.list(root, "other") == []  # tags belong to one workbench incarnation
