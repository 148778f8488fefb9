"""Shared fixtures: a fresh shard with one placed, fenced root."""

from __future__ import annotations

import dataclasses

import pytest

from nokvfs.engine.command import MetadataCommand
from nokvfs.engine.placement import PlacementStore, install_root_fence
from nokvfs.engine.shard import Shard
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.ids import new_id16


@dataclasses.dataclass
class ShardEnv:
    shard: Shard
    path: str
    root_id: bytes
    placement_generation: int

    def command(self, *, mutations=(), predicates=(), events=(), result=b"", request_id=None, read_version=None, **kw):
        fields = dict(
            root_id=self.root_id,
            logical_shard_id=self.shard.logical_shard_id,
            placement_generation=self.placement_generation,
            owner_epoch=self.shard.owner_epoch,
            request_id=request_id or new_id16(),
            read_version=self.shard.commit_version if read_version is None else read_version,
            predicates=tuple(predicates),
            mutations=tuple(mutations),
            events=tuple(events),
            result=result,
        )
        fields.update(kw)
        return MetadataCommand(**fields)

    def apply(self, **kw):
        return self.shard.apply(self.command(**kw))

    def reopen(self, **options) -> Shard:
        self.shard.close()
        self.shard = Shard.open(self.path, **options)
        return self.shard


def make_shard_env(tmp_path) -> ShardEnv:
    path = str(tmp_path / "shard")
    shard = Shard.create(path, new_id16())
    placements = PlacementStore(str(tmp_path / "control"))
    root_id = new_id16()
    placements.create(root_id, shard.logical_shard_id)
    placement = placements.transition(root_id, RootPlacementLifecycle.Active, expected_generation=1)
    placements.close()
    install_root_fence(shard, root_id, placement)
    return ShardEnv(shard, path, root_id, placement.placement_generation)


@pytest.fixture
def shard_env(tmp_path):
    env = make_shard_env(tmp_path)
    yield env
    env.shard.close()
