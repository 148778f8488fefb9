"""The state-machine kit: what publish, commit builds and retirements, restores and GC share.

Every durable operation is one Operation row (seed: `operation`, keyed root | kind | id) whose
phase moves by compare-and-set, plus the rows it owns. This module holds the machinery each of
them needs, once:

* `crash_point(name)`: fault injection for the crash tests (SIGKILL when NOKVFS_CRASH_AT names
  the point). The names are each state machine's, listed in its own docstring.
* `OperationLock` and `driving`: one lock discipline. Whoever drives an operation -- its
  caller, a recovery, a reconciliation -- holds the lock on the operation's byte of
  `run/ops/operations.lock` (an open-file-description record lock, F_OFD_SETLK, at an offset
  derived from the operation id) for the whole drive; an operation whose lock is held belongs to
  a live process and is left alone. The kernel drops the lock with the process, so a crash
  leaves nothing to clean, and taking it creates no file (a publish pays no directory entry for
  it). The engine's compare-and-set keeps two drivers correct anyway; the lock keeps a live one
  from being taken over.
* `Rows`: the operation rows of one kind -- key, read, require a phase, and the one-command
  steps every machine is made of (`step`: read the exact row, build, CAS it; `set_phase`).
* `drive_to_terminal`: the one drive loop of the multi-step machines (commit builds, restores):
  advance step by step, clean what cleanup owns, abort and re-raise on a typed failure.
* `drive_each`: the one loop over operations of a kind -- recovery (every operation not yet
  terminal) and reconciliation (every Quarantined one) -- taking each operation's lock, never
  waiting for it.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import signal
import struct

from nokvfs import filemodes
from nokvfs.engine.command import Put, ValueEquals
from nokvfs.engine.scan import iter_prefix
from nokvfs.errors import NokvError, NotFound, PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.codec import decode_field
from nokvfs.schema.enums import HistoryHoldKind, OperationKind
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import OPERATION_RECORDS
from nokvfs.workspace.root import Built, intent_digest

log = logging.getLogger(__name__)

CRASH_ENV = "NOKVFS_CRASH_AT"


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: die by SIGKILL here when NOKVFS_CRASH_AT == name."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


LOCK_FILE = "operations.lock"
_OFFSET_BITS = 62  # an offset below 2**62 fits every off_t
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid
_made_directories: set[str] = set()


class OperationLock:
    """A record lock on the operation's byte of run/ops/operations.lock: held while a process
    drives that operation.

    Open-file-description locks (unlike POSIX record locks) belong to the descriptor, so two
    threads of one process exclude each other as two processes do, and closing one descriptor
    never drops another's lock. The byte is a 62-bit hash of the operation id: two operations
    sharing one (odds 2**-62) only make a recovery leave the second for later."""

    def __init__(self, run_dir: str, operation_id: bytes):
        self.path = _lock_path(run_dir)
        self.offset = _lock_offset(operation_id)
        self._fd = None

    def try_acquire(self) -> bool:
        fd = _open_lock_file(self.path)
        if not _try_lock(fd, self.offset):
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self, *, remove: bool = True) -> None:
        """Drop the lock (closing the descriptor drops it; `remove` is kept for callers of the
        file-per-operation locks this replaced: there is no file to remove)."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None


class OperationLocks:
    """The locks of several operations held through one descriptor, exactly as one
    OperationLock each would hold them (a batch of GC claims takes one per revision): taken one
    by one, all let go at once by `release`, which closes the descriptor."""

    def __init__(self, run_dir: str):
        self.path = _lock_path(run_dir)
        self._fd = None

    def try_acquire(self, operation_id: bytes) -> bool:
        if self._fd is None:
            self._fd = _open_lock_file(self.path)
        return _try_lock(self._fd, _lock_offset(operation_id))

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock_path(run_dir: str) -> str:
    directory = os.path.join(run_dir, "ops")
    if directory not in _made_directories:
        filemodes.makedirs(directory)
        _made_directories.add(directory)
    return os.path.join(directory, LOCK_FILE)


def _lock_offset(operation_id: bytes) -> int:
    digest = hashlib.blake2b(operation_id, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _OFFSET_BITS)


def _open_lock_file(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, filemodes.FILE_MODE)


def _try_lock(fd: int, offset: int) -> bool:
    """Take the write lock on byte `offset` through `fd`; False when another descriptor holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class driving:
    """Hold an operation's lock for a `with` block; PredicateFailed when a live process holds it."""

    def __init__(self, root, operation_id: bytes, what: str):
        self._lock = OperationLock(root.run_dir, operation_id)
        self._what = f"{what} {operation_id.hex()}"

    def __enter__(self):
        if not self._lock.try_acquire():
            raise PredicateFailed(f"{self._what} is driven by a live process")
        return self

    def __exit__(self, *exc):
        self._lock.release(remove=True)


class Done(Exception):
    """A batched stage found nothing left to do (see Rows.batch)."""


def _subject(name: str, operation_id: bytes, operation) -> str:
    return f"{name} {operation_id.hex()}"


class Rows:
    """The Operation rows of one kind and the one-command steps made of them.

    `name` is how messages name the machine ("publish", "build-commit", ...); `subject(op id,
    op)` how they name one operation (default: name and id); `terminal` its terminal phases.
    """

    def __init__(self, kind: OperationKind, name: str, terminal: tuple, *, subject=None):
        self.kind = kind
        self.name = name
        self.record = OPERATION_RECORDS[kind]
        self.terminal = terminal
        # The phases that are not terminal: those recovery looks for.
        phase_type = dict(self.record.__codec_fields__)["phase"].enum_type
        self.live = frozenset(phase_type) - frozenset(terminal)
        self._subject = subject or (lambda operation_id, operation: _subject(name, operation_id, operation))

    def key(self, root, operation_id: bytes) -> bytes:
        return keys.OperationKey(root.root_id, self.kind, operation_id).encode()

    def hold_key(self, root, operation_id: bytes) -> bytes:
        """The operation's HistoryHold (commit builds and restores hold the version they read)."""
        return keys.HistoryHoldKey(root.root_id, HistoryHoldKind[self.kind.name], operation_id).encode()

    def read(self, view, root, operation_id: bytes):
        """(raw row, decoded operation); NotFound when there is none."""
        raw = view.get("operation", self.key(root, operation_id))
        if raw is None:
            raise NotFound(f"no {self.name} operation {operation_id.hex()}")
        return raw, self.record.decode(raw)

    def get(self, root, operation_id: bytes):
        """The operation as of now (its own read)."""
        with root.read() as view:
            return self.read(view, root, operation_id)[1]

    def find(self, root, operation_id: bytes):
        """The operation as of now, or None."""
        with root.read() as view:
            raw = view.get("operation", self.key(root, operation_id))
        return None if raw is None else self.record.decode(raw)

    def require(self, operation_id: bytes, operation, *phases) -> None:
        if operation.phase not in phases:
            wanted = "/".join(p.name for p in phases)
            raise PredicateFailed(f"{self._subject(operation_id, operation)} is {operation.phase.name}, not {wanted}")

    def pending(self, view, root) -> list:
        """(operation id, record) of every operation of this kind not in a terminal phase."""
        return self.matching(view, root, phases=self.live)

    def matching(self, view, root, wanted=None, *, phases=None) -> list:
        """(operation id, record) of every operation of this kind in one of `phases` (any, if
        None) for which `wanted(op)` holds (if given). A row in another phase is passed over
        after decoding its phase alone (every open scans every operation the retention window
        keeps, almost all of them terminal)."""
        out = []
        for key, value in iter_prefix(view, "operation", keys.operation_prefix(root.root_id, self.kind)):
            if phases is not None and decode_field(self.record, value, "phase") not in phases:
                continue
            operation = self.record.decode(value)
            if wanted is None or wanted(operation):
                out.append((keys.OperationKey.decode(key).operation_id, operation))
        return out

    def apply(
        self,
        root,
        label: str,
        operation_id: bytes,
        build,
        *,
        digest: bytes | None = None,
        request_id: bytes | None = None,
    ):
        """root.apply with the machine's intent digest: `digest`, or one naming the label, the
        operation and the request (a fresh request id unless one is given)."""
        if digest is None:
            request_id = request_id or new_id16()
            digest = intent_digest(label, operation_id, request_id)
        return root.apply(build, digest=digest, request_id=request_id)

    def step(
        self,
        root,
        operation_id: bytes,
        label: str,
        change,
        *,
        digest: bytes | None = None,
        request_id: bytes | None = None,
    ):
        """One command on the exact operation row: `change(view, op)` returns (predicates,
        mutations, updated op or None) or raises to refuse; the command predicates the row it
        read and writes the updated one."""
        key = self.key(root, operation_id)

        def build(view):
            raw, operation = self.read(view, root, operation_id)
            predicates, mutations, updated = change(view, operation)
            predicates = [*predicates, ValueEquals("operation", key, raw)]
            if updated is not None:
                mutations = [*mutations, Put("operation", key, updated)]
            return Built(predicates=predicates, mutations=mutations)

        return self.apply(root, label, operation_id, build, digest=digest, request_id=request_id)

    def batch(self, root, operation_id: bytes, label: str, change) -> bool:
        """One `step` of a batched stage; False, and nothing applied, when `change` raises
        Done (the stage has nothing left)."""
        try:
            self.step(root, operation_id, label, change)
        except Done:
            return False
        return True

    def start_cleaning(self, root, operation_id: bytes, *, aborting, cleaning, label: str, crash: str) -> bool:
        """The cleanup prologue: False when the operation is terminal already; an Aborting one
        moves to Cleaning (crash point `crash` after it); it must then be Cleaning."""
        operation = self.get(root, operation_id)
        if operation.phase in self.terminal:
            return False
        if operation.phase == aborting:
            self.set_phase(root, operation_id, aborting, cleaning, label=label)
            crash_point(crash)
        self.require(operation_id, self.get(root, operation_id), cleaning)
        return True

    def set_phase(
        self, root, operation_id: bytes, expected, new, *, label: str, extra=None, digest: bytes | None = None, **fields
    ) -> None:
        """One command: `expected` -> `new` (and `fields`) on the exact row, with the (predicates,
        mutations) `extra(view, op)` adds, if given."""

        def change(view, operation):
            self.require(operation_id, operation, expected)
            predicates, mutations = ([], []) if extra is None else extra(view, operation)
            return predicates, mutations, dataclasses.replace(operation, phase=new, **fields)

        self.step(root, operation_id, label, change, digest=digest)


def drive_to_terminal(
    root,
    rows: Rows,
    operation_id: bytes,
    *,
    result,
    cleaning: tuple,
    clean,
    advance,
    abort,
    abort_on_failure: bool = True,
):
    """The drive loop of a multi-step machine, for a caller that holds the operation's lock.

    A terminal operation returns `result(op)` (which raises for an aborted one); a phase in
    `cleaning` runs `clean(op id)`; any other runs `advance(op id)`, one durable step. A typed
    failure of a step that nothing else moved on meanwhile aborts the operation (`abort(op id,
    reason)`, which cleans it) and is re-raised.
    """
    while True:
        operation = rows.get(root, operation_id)
        if operation.phase in rows.terminal:
            return result(operation)
        if operation.phase in cleaning:
            clean(operation_id)
            continue
        try:
            advance(operation_id)
        except NokvError as exc:
            if rows.get(root, operation_id) != operation:
                continue  # somebody else moved it on (an abort, a concurrent driver): re-read
            if not abort_on_failure:
                raise
            try:
                abort(operation_id, f"{type(exc).__name__}: {exc}")
            except NokvError as cleanup:
                log.error("%s %s: cleanup after %r failed: %s", rows.name, operation_id.hex(), exc, cleanup)
            raise


def drive_each(root, rows: Rows, drive, *, wanted=None, phases=None, found=None) -> list[tuple[str, str]]:
    """The one loop over a kind's operations: every one in `phases` for which `wanted(op)` holds,
    as Rows.matching picks them (neither given: those not terminal, i.e. recovery), or those of `found` ((op id,
    op) as `Rows.matching` read them, for a caller that has just scanned), is driven by
    `drive(op id, op)` while this process holds its lock; one a live process holds is skipped.
    Returns (op hex, outcome) in key order; a typed failure is logged and reported as
    "failed: ..." and the loop goes on."""
    if found is not None:
        candidates = found
    else:
        with root.read() as view:
            if wanted is None and phases is None:
                candidates = rows.pending(view, root)
            else:
                candidates = rows.matching(view, root, wanted, phases=phases)
    outcomes = []
    for operation_id, operation in candidates:
        lock = OperationLock(root.run_dir, operation_id)
        if not lock.try_acquire():
            continue  # a live process drives it
        try:
            outcomes.append((operation_id.hex(), drive(operation_id, operation)))
        except NokvError as exc:
            log.error("%s %s: %s", rows.name, operation_id.hex(), exc)
            outcomes.append((operation_id.hex(), f"failed: {exc}"))
        finally:
            lock.release(remove=True)
    return outcomes
