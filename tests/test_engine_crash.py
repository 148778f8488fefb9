"""A killed writer leaves all or nothing of a command; two processes never commit one version."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from nokvfs.engine.command import MetadataCommand, Put
from nokvfs.engine.shard import Shard
from nokvfs.errors import ReadVersionStale
from nokvfs.schema.ids import new_id16
from tests.conftest import sigkill_once_ready

MUTATIONS_PER_COMMAND = 2_000


def _writer(path, root_id, generation, marker, ready):
    """Apply big commands forever; each writes MUTATIONS_PER_COMMAND rows tagged with its number."""
    shard = Shard.open(path, verify=False)
    n = 0
    while True:
        n += 1
        value = b"\x02" + n.to_bytes(8, "big") + os.urandom(200)
        shard.apply(
            MetadataCommand(
                root_id=root_id,
                logical_shard_id=shard.logical_shard_id,
                placement_generation=generation,
                owner_epoch=shard.owner_epoch,
                request_id=new_id16(),
                read_version=shard.commit_version,
                mutations=tuple(
                    Put("path_current", marker + i.to_bytes(4, "big"), value) for i in range(MUTATIONS_PER_COMMAND)
                ),
            )
        )
        ready.set()


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_sigkill_mid_command_leaves_all_or_nothing(shard_env, delay):
    marker = b"\x0c" * 32
    shard_env.shard.close()
    sigkill_once_ready(
        _writer, (shard_env.path, shard_env.root_id, shard_env.placement_generation, marker), delay=delay
    )
    shard_env.shard = Shard.open(shard_env.path)  # full verification: outbox chain and digests
    with shard_env.shard.read() as view:
        values = {view.get("path_current", marker + i.to_bytes(4, "big")) for i in range(MUTATIONS_PER_COMMAND)}
    assert len(values) == 1, "a killed command left a partial write"
    (value,) = values
    number = int.from_bytes(value[1:9], "big")
    # Every committed command is in the outbox exactly once, in order.
    commands = [e for e in shard_env.shard.outbox_entries() if e.header.commit_version > 2]
    assert len(commands) == number


def _racer(path, root_id, generation, ready, start, results, index):
    shard = Shard.open(path, verify=False)
    read_version = shard.commit_version
    command = MetadataCommand(
        root_id=root_id,
        logical_shard_id=shard.logical_shard_id,
        placement_generation=generation,
        owner_epoch=shard.owner_epoch,
        request_id=new_id16(),
        read_version=read_version,
        mutations=(Put("path_current", b"\x0d" * 32 + bytes([index]), b"\x02"),),
    )
    ready.set()  # built at read_version: only now may the race start
    start.wait()
    try:
        outcome = shard.apply(command)
        results.put((index, "committed", outcome.commit_version))
    except ReadVersionStale:
        results.put((index, "stale", read_version))
    shard.close()


def test_two_processes_never_commit_at_the_same_version(shard_env):
    shard_env.shard.close()
    ctx = multiprocessing.get_context("spawn")
    for _round in range(5):
        start, results = ctx.Event(), ctx.Queue()
        ready = [ctx.Event() for _ in range(2)]
        procs = [
            ctx.Process(
                target=_racer,
                args=(shard_env.path, shard_env.root_id, shard_env.placement_generation, ready[i], start, results, i),
            )
            for i in range(2)
        ]
        for p in procs:
            p.start()
        for event in ready:  # both commands are built at the same read version
            assert event.wait(60), "a racer never built its command"
        start.set()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        committed = [o for o in outcomes if o[1] == "committed"]
        assert len(committed) == 1, outcomes
    shard_env.shard = Shard.open(shard_env.path)
    versions = [e.header.commit_version for e in shard_env.shard.outbox_entries()]
    assert versions == sorted(versions)
