"""The MetadataCommand: the one bounded write path for every metadata family.

A command names its trees by the seed's exact tree names. Values are bytes or records (encoded on
construction of the logical outbox record). The engine adds, in the same LMDB write transaction,
the History row of every mutated key, the ChangeEvent rows, the CommandDedupe row and the recovery
outbox rows; callers never write those themselves.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from nokvfs.errors import CommandTooLarge, InvalidInput
from nokvfs.schema.ids import check_id16

SCHEMA_ID = "nokv_workspace"
FORMAT_VERSION = 8
# 2: every stored row is sealed in the row envelope (nokvfs.engine.rows); 1 had bare values.
VALUE_FORMAT_VERSION = 2

MAX_PREDICATES = 4_096
MAX_MUTATIONS = 16_384
MAX_EVENTS = 1_024
MAX_RESULT_BYTES = 1 << 20


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if hasattr(value, "__codec_fields__") and getattr(value, "VERSION", None) is not None:
        return value.encode()
    raise InvalidInput(f"a stored value must be bytes or a versioned record, got {type(value).__name__}")


def _set_fields(row, tree: str, key: bytes, value: bytes) -> None:
    """The fields of a frozen ValueEquals or Put, set as the dataclass's own __init__ would set
    them (and its __post_init__ the value), without its four object.__setattr__ calls: a
    command's builder makes several per row (a GC batch, thousands)."""
    fields = row.__dict__
    fields["tree"] = tree
    fields["key"] = key
    fields["value"] = value


# --- predicates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exists:
    tree: str
    key: bytes


@dataclass(frozen=True)
class Absent:
    tree: str
    key: bytes


@dataclass(frozen=True)
class ValueEquals:
    tree: str
    key: bytes
    value: bytes

    def __init__(self, tree: str, key: bytes, value: Any):
        _set_fields(self, tree, key, _as_bytes(value))


@dataclass(frozen=True)
class FieldEquals:
    """The row exists, decodes as `record` and its `field` equals `expected`."""

    tree: str
    key: bytes
    record: type
    field: str
    expected: Any

    def __post_init__(self):
        names = [name for name, _ in self.record.__codec_fields__]
        if self.field not in names:
            raise InvalidInput(f"{self.record.__name__} has no field {self.field!r}")

    def expected_bytes(self) -> bytes:
        codec = dict(self.record.__codec_fields__)[self.field]
        out = bytearray()
        codec.encode(self.expected, out)
        return bytes(out)


@dataclass(frozen=True)
class Generation(FieldEquals):
    """A generation CAS (path, alias, head, tag, workspace revision): failure is a conflict."""


@dataclass(frozen=True)
class State(FieldEquals):
    """A state/phase CAS (revision state, operation phase, snapshot lifecycle)."""


Predicate = Exists | Absent | ValueEquals | FieldEquals


# --- mutations and events --------------------------------------------------------------------


@dataclass(frozen=True)
class Put:
    tree: str
    key: bytes
    value: bytes

    def __init__(self, tree: str, key: bytes, value: Any):
        _set_fields(self, tree, key, _as_bytes(value))


@dataclass(frozen=True)
class Delete:
    tree: str
    key: bytes


Mutation = Put | Delete


@dataclass(frozen=True)
class MetadataCommand:
    root_id: bytes
    logical_shard_id: bytes
    placement_generation: int
    owner_epoch: int
    request_id: bytes
    read_version: int
    predicates: tuple = ()
    mutations: tuple = ()
    # Encoded ChangeEvent values; the engine keys them root | commit_version | event_sequence.
    events: tuple = ()
    result: bytes = b""
    # The caller's digest of its intent. Two builds of the same request at different read
    # versions must have the same digest, so facades pass one derived from the request; the
    # default covers the mutations themselves.
    command_digest: bytes | None = None
    schema_id: str = SCHEMA_ID
    # Only RootFence installation is admitted without an Active fence.
    fence_install: bool = False

    def __post_init__(self):
        check_id16(self.root_id, "root id")
        check_id16(self.logical_shard_id, "logical shard id")
        check_id16(self.request_id, "request id")
        object.__setattr__(self, "predicates", tuple(self.predicates))
        object.__setattr__(self, "mutations", tuple(self.mutations))
        object.__setattr__(self, "events", tuple(_as_bytes(e) for e in self.events))
        object.__setattr__(self, "result", bytes(self.result))
        if len(self.predicates) > MAX_PREDICATES:
            raise CommandTooLarge(f"{len(self.predicates)} predicates, at most {MAX_PREDICATES}")
        if len(self.mutations) > MAX_MUTATIONS:
            raise CommandTooLarge(f"{len(self.mutations)} mutations, at most {MAX_MUTATIONS}")
        if len(self.events) > MAX_EVENTS:
            raise CommandTooLarge(f"{len(self.events)} events, at most {MAX_EVENTS}")
        if len(self.result) > MAX_RESULT_BYTES:
            raise CommandTooLarge(f"result of {len(self.result)} bytes, at most {MAX_RESULT_BYTES}")
        for m in self.mutations:
            if not isinstance(m, (Put, Delete)):
                raise InvalidInput(f"not a mutation: {m!r}")
        for p in self.predicates:
            if not isinstance(p, (Exists, Absent, ValueEquals, FieldEquals)):
                raise InvalidInput(f"not a predicate: {p!r}")
        if self.command_digest is None:
            object.__setattr__(self, "command_digest", default_command_digest(self))
        elif len(self.command_digest) != 32:
            raise InvalidInput("command digest must be 32 bytes")


def default_command_digest(command: MetadataCommand) -> bytes:
    h = hashlib.sha256(b"nokv.metadata_command.v1\0")
    h.update(command.root_id + command.logical_shard_id)
    for m in command.mutations:
        value = m.value if isinstance(m, Put) else b""
        h.update(b"P" if isinstance(m, Put) else b"D")
        for part in (m.tree.encode(), m.key, value):
            h.update(len(part).to_bytes(4, "big") + part)
    for e in command.events:
        h.update(len(e).to_bytes(4, "big") + e)
    h.update(len(command.result).to_bytes(4, "big") + command.result)
    return h.digest()


@dataclass(frozen=True)
class CommandOutcome:
    commit_version: int
    recovery_lsn: int
    result: bytes
    replayed: bool = False
    # (tree, key) of every row the command mutated, for cache invalidation by callers.
    mutated: tuple = field(default=(), compare=False)
