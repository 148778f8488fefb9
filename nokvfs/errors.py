"""Every typed error nokvfs raises, in one place.

The filesystem maps these to errnos in one place (nokvfs.fs) and the CLI maps them to exit codes in
one place (nokvfs.cli). Each class says what went wrong; the message says where.
"""

from __future__ import annotations


class NokvError(Exception):
    """Base of every nokvfs error."""


# --- user input -----------------------------------------------------------------------------


class InvalidInput(NokvError):
    """The caller supplied a malformed value (path, name, id, option)."""


class PathInvalid(InvalidInput):
    """A path breaks a rule of the one shared normalizer."""


class NameInvalid(InvalidInput):
    """A workbench id, tag name or snapshot alias breaks its naming rule."""


class IdInvalid(InvalidInput):
    """An id has the wrong width or a malformed hex form."""


class IndexValueInvalid(InvalidInput):
    """A secondary-index value cannot be encoded (NaN, infinity, out of range, wrong type)."""


class CanonicalJsonError(InvalidInput):
    """A value cannot be represented in canonical JSON (RFC 8785 with exact integers)."""


# --- durable format -------------------------------------------------------------------------


class FormatError(NokvError):
    """Durable bytes do not decode under this contract. Fails closed."""


class CorruptRecord(FormatError):
    """A record's bytes are truncated, over-long or otherwise malformed."""


class UnknownVersion(FormatError):
    """A record carries a value version this build does not know."""


class UnknownDiscriminant(FormatError):
    """An enum field carries a discriminant outside the registry."""


class SchemaMismatch(FormatError):
    """The store's schema marker or tree registry differs from this contract."""


class IntegrityError(NokvError):
    """Stored bytes do not match their recorded digest (state digest, block SHA-256, pack)."""


class ShardCorrupt(IntegrityError):
    """The metadata shard's own bytes are damaged: a row that fails its checksum, a state digest
    that does not recompute, or corruption LMDB itself reports (MDB_CORRUPTED, MDB_INVALID,
    MDB_PAGE_NOTFOUND, ...). The shard records it and refuses writes from then on."""


class OutboxCorrupt(FormatError, ShardCorrupt):
    """The recovery outbox is broken: a gap, a bad chain digest, a missing or orphan chunk. Both a
    format error and shard damage (the shard refuses writes once it is found)."""


class RowCorrupt(ShardCorrupt):
    """One row's stored value fails its envelope check (checksum over tree, key and value)."""

    def __init__(self, message: str, *, tree: str, key: bytes):
        super().__init__(message)
        self.tree = tree
        self.key = key


# --- commands -------------------------------------------------------------------------------


class CommandRejected(NokvError):
    """A metadata command was refused before any mutation was applied."""


class FenceError(CommandRejected):
    """The root fence, placement generation or logical shard does not admit this command."""


class OwnerFenced(FenceError):
    """The command's owner epoch is not the shard's current owner epoch."""


class ReadOnlyReplica(FenceError):
    """The data directory is a follower of a bucket: only the owner's replayed increments write it."""


class ReadVersionStale(CommandRejected):
    """The command or cursor was built at a read version the shard has moved past."""

    def __init__(self, message: str, *, expected: int, current: int):
        super().__init__(message)
        self.expected = expected
        self.current = current


class RequestMismatch(CommandRejected):
    """A request id was reused with different inputs."""


class RequestExpired(RequestMismatch):
    """An exact replay of a request older than the replay retention window: its stored result
    is gone, so it is refused rather than executed again."""


class PredicateFailed(CommandRejected):
    """A command predicate did not hold; nothing was applied."""

    def __init__(self, message: str, *, index: int | None = None):
        super().__init__(message)
        self.index = index


class GenerationConflict(PredicateFailed):
    """An expected generation (path, alias, head, tag) did not match: somebody else won."""


class CommandTooLarge(CommandRejected):
    """A command exceeds the engine's bound on predicates, mutations or events."""


class HistoryNotRetained(NokvError):
    """A read asked for a version older than the retained history floor."""


class CursorExpired(HistoryNotRetained):
    """A change-feed position older than the ChangeEvent retention floor: the events after it
    may be gone, so the consumer must resynchronise (read the current state, then follow from
    `current`, the version that state was read at)."""

    def __init__(self, message: str, *, position: int, floor: int, current: int):
        super().__init__(message)
        self.position = position
        self.floor = floor
        self.current = current


class ShardBusy(PredicateFailed):
    """The shard's exclusive lock is needed (compaction) but another process has it open."""


# --- namespace ------------------------------------------------------------------------------


class NotFound(NokvError):
    """The named workbench, path, snapshot, commit or tag does not exist."""


class AlreadyExists(NokvError):
    """The name is taken."""


class ReservedPath(InvalidInput):
    """The path is reserved (a section, a run/restore manifest) and refuses this operation."""


# --- storage --------------------------------------------------------------------------------


class StoreError(NokvError):
    """The object store or the local disk failed."""


class StoreFull(StoreError):
    """No space left in the object store or on the local disk."""


class ObjectMissing(StoreError):
    """An object the metadata names is absent from the store."""


class AmbiguousResult(StoreError):
    """A request was sent and its outcome is unknown (timeout, reset): recorded, never guessed."""


class StoreTimeout(StoreError):
    """The object store did not answer within the call's deadline (connect and read timeouts,
    bounded retries). For a read or a request that was never sent, nothing happened."""


class AmbiguousTimeout(AmbiguousResult, StoreTimeout):
    """A mutation ran out of its deadline after a request was sent: its outcome is unknown, so
    callers keep treating it as AmbiguousResult (recorded, never guessed)."""


class PreconditionFailed(StoreError):
    """A conditional write lost its race (HTTP 412): If-None-Match or If-Match did not hold."""


class NotADirectory(InvalidInput):
    """A directory operation named a file."""


class IsADirectory(InvalidInput):
    """A file operation named a directory."""


class KeyTooLong(InvalidInput):
    """A key (usually a long path) exceeds what the storage engine can hold."""


class SyscallTimeout(StoreError):
    """A syscall on the mount waited its whole deadline (the work goes on in the background)."""


class MountUnavailable(NotFound):
    """No running mount answered a status query: not a nokvfs mount, its daemon gone or hung, or
    the caller is neither the daemon's user nor root."""
