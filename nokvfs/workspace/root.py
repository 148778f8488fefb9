"""A root on its logical shard, with the object store that holds its artifact bytes.

`Root.apply` is the one command builder every state machine uses: it reads at the current
version, lets the caller build predicates and mutations from that view, and applies the command at
read_version + 1, rebuilding on an unrelated intervening commit. The command digest is derived from
the request's intent, not from the built rows, so a rebuilt retry of an applied request replays
its stored result instead of applying twice.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from dataclasses import dataclass, field

from nokvfs import filemodes
from nokvfs.engine.command import MetadataCommand
from nokvfs.engine.fences import ReadFence
from nokvfs.errors import ReadVersionStale
from nokvfs.schema.ids import new_id16

OPTIMISTIC_BUILDS = 4  # stale builds before one inside the write transaction


@dataclass
class Built:
    """What a command builder returns: the rows of one command and what to hand back."""

    predicates: list = field(default_factory=list)
    mutations: list = field(default_factory=list)
    events: list = field(default_factory=list)
    result: bytes = b""
    value: object = None  # returned to the facade caller (not durable)


def intent_digest(operation: str, *parts: bytes | str | int) -> bytes:
    h = hashlib.sha256(b"nokv.facade.intent.v1\0" + operation.encode() + b"\0")
    for part in parts:
        if isinstance(part, str):
            part = part.encode("utf-8")
        elif isinstance(part, int):
            part = part.to_bytes(16, "big", signed=True)
        elif part is None:
            part = b"\xff"
        h.update(len(part).to_bytes(4, "big") + part)
    return h.digest()


class Root:
    def __init__(
        self,
        shard,
        root_id: bytes,
        placement_generation: int,
        store,
        blocks,
        *,
        block_size: int,
        data_dir: str,
        owner_epoch: int | None = None,
        history_retention: int = 0,
    ):
        from nokvfs.workspace.reading import ManifestCache

        self.shard = shard
        self.data_dir = data_dir
        self.run_dir = os.path.join(data_dir, "run")
        self.spool_dir = os.path.join(data_dir, "spool")
        filemodes.makedirs(self.run_dir)
        filemodes.makedirs(self.spool_dir)
        self.manifests = ManifestCache()
        # Threads of one process build and apply one command at a time: LMDB serializes writers
        # anyway, and otherwise they would only keep making each other's built commands stale.
        self._writer = threading.RLock()
        self.root_id = root_id
        self.logical_shard_id = shard.logical_shard_id
        self.placement_generation = placement_generation
        self.store = store
        self.blocks = blocks
        self.block_size = block_size
        # The diagnostic history floor: GC prunes History only below this many versions back
        # (and below every HistoryHold).
        self.history_retention = history_retention
        # Commands carry the epoch this process opened with: if another owner advances it,
        # this process's writes are fenced rather than silently continuing.
        self.owner_epoch = shard.owner_epoch if owner_epoch is None else owner_epoch

    def close(self) -> None:
        # The block cache holds an flock on its directory until closed: without this a reopen of
        # the same data dir (in this process or another) is refused as "in use".
        cache = getattr(self.blocks, "cache", None)
        if cache is not None:
            cache.close()
        self.store.close()
        self.shard.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def read(self, version: int | None = None, *, fenced: bool = True):
        """A view of the shard at `version` (default: current). Like every request, a read first
        passes the root's RootFence: Active, on this shard, at this process's placement
        generation (FenceError otherwise). Only maintenance that must inspect a fenced root
        (fsck) reads unfenced.

        The owner epoch is not asked of reads here: a process whose epoch the shard has moved
        past is an old owner that another took over from, and nokvfs serves its reads read-only
        (README, "Durability in a bucket"; its writes are OwnerFenced at the engine), as it
        serves a follower's. `Shard.read(fence=ReadFence(..., owner_epoch))` enforces the
        seed's owner-epoch fence for a reader that must be the owner to read.
        """
        if not fenced:
            return self.shard.read(version)
        return self.shard.read(version, fence=ReadFence(self.root_id, self.placement_generation, None))

    def apply(self, build, *, digest: bytes, request_id: bytes | None = None, durable: bool = True):
        """Build against the current version and apply; returns (CommandOutcome, Built). With
        `durable=False` a power loss may undo the command until the next durable one (Shard.apply):
        only for a command whose loss recovery resolves by itself.

        Optimistic first: the build reads outside the write transaction, so other writers are not
        held up by it. A process that commits continuously (a script putting in a loop) can make
        every such build stale, so after `OPTIMISTIC_BUILDS` the build runs inside the write
        transaction, where nothing else commits: a busy neighbour delays a command, never fails it."""
        request_id = request_id or new_id16()
        for attempt in range(OPTIMISTIC_BUILDS):
            with self._writer:
                with self.shard.read() as view:
                    built = build(view)
                    read_version = view.version
                command = self._command(built, read_version, request_id, digest)
                try:
                    return self.shard.apply(command, durable=durable), built
                except ReadVersionStale:
                    pass
            # Another process committed in between. Back off a little, at random, so two busy
            # processes do not keep invalidating each other's rebuilt commands.
            time.sleep(random.random() * 0.002 * (attempt + 1))
        ((outcome, built),) = self.apply_group([(build, digest, request_id)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, built

    def _command(self, built: Built, read_version: int, request_id: bytes, digest: bytes) -> MetadataCommand:
        return MetadataCommand(
            root_id=self.root_id,
            logical_shard_id=self.logical_shard_id,
            placement_generation=self.placement_generation,
            owner_epoch=self.owner_epoch,
            request_id=request_id,
            read_version=read_version,
            predicates=tuple(built.predicates),
            mutations=tuple(built.mutations),
            events=tuple(built.events),
            result=built.result,
            command_digest=digest,
        )

    def apply_group(self, items) -> list:
        """Group commit of several commands (nokvfs.engine.shard.Shard.apply_group): one write
        transaction, one sync. `items` are (build, digest, request_id or None); each build runs
        on the state the earlier ones left. Returns, per item, (CommandOutcome, Built) or
        (the typed error that excluded it, None); the others are applied all the same."""
        builts: list = [None] * len(items)

        def engine_build(index, build, digest, request_id):
            def command(view):
                builts[index] = build(view)
                return self._command(builts[index], view.version, request_id, digest)

            return command

        commands = [
            engine_build(index, build, digest, request_id or new_id16())
            for index, (build, digest, request_id) in enumerate(items)
        ]
        with self._writer:
            results = self.shard.apply_group(commands)
        return [
            (result, None) if isinstance(result, Exception) else (result, builts[index])
            for index, result in enumerate(results)
        ]
