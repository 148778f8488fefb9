"""One logical shard: an LMDB environment holding the NoKV workspace schema.

Opening is fail-closed. An empty environment is initialised with the exact schema marker, tree
registry, commit clock, recovery tail, owner epoch and state digest; any other environment opens
only if its named databases are exactly the registry's trees, its marker and registry decode and
match, its recovery outbox verifies end to end against the System tail, and (with verify=True) the
state digest of every tree recomputes to the stored one. Each check names what differs.

The write entrypoints the recovery outbox covers are the seed's three -- `apply` (a
MetadataCommand), `observe_lease_clock` and `advance_owner_epoch` -- and `prune_history` (below
the history floor; replayed by `replay_history_prune`). Each is one LMDB write transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import struct
import threading
import time

import blake3
import lmdb

from nokvfs import filemodes
from nokvfs.engine import collector, compact, fences, history, outbox, retention, rows
from nokvfs.engine import dedupe as dedupe_rows
from nokvfs.engine.alarm import ALARM_NAME, IntegrityAlarm
from nokvfs.engine.command import (
    FORMAT_VERSION,
    SCHEMA_ID,
    VALUE_FORMAT_VERSION,
    Absent,
    CommandOutcome,
    Delete,
    Exists,
    FieldEquals,
    Generation,
    MetadataCommand,
    Put,
    State,
    ValueEquals,
)
from nokvfs.engine.environment import GatedEnv, SyncingEnv
from nokvfs.engine.meta import WITNESS_NAME, CommitWitness, check_meta_pages
from nokvfs.engine.mvcc import ReadView
from nokvfs.engine.owncommits import OwnCommits
from nokvfs.engine.records import (
    OPTIONAL_SYSTEM_KEYS,
    SYS_CLOCK,
    SYS_HISTORY_FLOOR,
    SYS_LEASE_CLOCK,
    SYS_OWNER,
    SYS_RECOVERY,
    SYS_RETENTION,
    SYS_SCHEMA,
    SYS_SHARD,
    SYS_STATE_DIGEST,
    SYS_TREES,
    SYSTEM_KEYS,
    CommandRecord,
    CommitClock,
    HistoryFloor,
    HistoryPruneRecord,
    LeaseClock,
    LeaseClockRecord,
    MutationRow,
    OutboxTruncateRecord,
    OwnerEpochRecord,
    OwnerRecord,
    PredicateRow,
    RecoveryTail,
    RetentionFloors,
    RetentionPruneRecord,
    SchemaMarker,
    ShardIdentity,
    StateDigest,
    TreeDigest,
    TreeEntry,
    TreeRegistry,
)
from nokvfs.engine.rows import lmdb_errors_translated, translate_lmdb_error
from nokvfs.errors import (
    FenceError,
    FormatError,
    GenerationConflict,
    HistoryNotRetained,
    IntegrityError,
    InvalidInput,
    KeyTooLong,
    NokvError,
    NotFound,
    OutboxCorrupt,
    OwnerFenced,
    PredicateFailed,
    ReadVersionStale,
    RequestExpired,
    RequestMismatch,
    RowCorrupt,
    SchemaMismatch,
    ShardCorrupt,
)
from nokvfs.schema import keys as family_keys
from nokvfs.schema import records as family_records
from nokvfs.schema.enums import (
    MutationKind,
    OutboxRecordKind,
    PredicateKind,
    RetainedFamily,
)
from nokvfs.schema.ids import check_id16

SYSTEM_TREE = "system"
HISTORY_TREE = "history"
OUTBOX_TREE = "recovery_outbox"
RESERVED_TREES = (SYSTEM_TREE, HISTORY_TREE, OUTBOX_TREE)

HISTORY_KEY_OVERHEAD = 1 + 4 + 8  # tag | u32 length | inverted commit version
# Opening verifies this many of the newest outbox records (and the truncation point, and the
# tail against System): a bounded cost however long the shard has lived. The whole chain is
# `verify=True`'s and fsck's.
RECENT_RECORDS_VERIFIED = 64
MAX_TRUNCATED_RECORDS = 4096  # outbox records one truncation transaction removes at most
DEFAULT_MAP_SIZE = 1 << 36  # 64 GiB of address space; the file grows only as it is used
_DIGEST_MOD = 1 << 256
_TREE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_U32 = struct.Struct(">I")
_UNCHECKED = object()  # a row no predicate of the command has read


def _expected_registry() -> TreeRegistry:
    entries = [TreeEntry(f.name, f.tag) for f in family_keys.FAMILIES]
    entries += [TreeEntry(name, 0) for name in RESERVED_TREES]
    return TreeRegistry(tuple(entries))


def _row_hash(key: bytes, value: bytes) -> int:
    return int.from_bytes(blake3.blake3(_U32.pack(len(key)) + key + value).digest(), "big")


def _lmdb_errors(func):
    """Translate LMDB failures into typed errors; on a Shard method, record corruption found."""
    translated = lmdb_errors_translated(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return translated(*args, **kwargs)
        except ShardCorrupt as exc:
            if args and isinstance(args[0], Shard):
                args[0]._alarm.record(exc)
            raise

    return wrapper


class _Digests:
    """Per-tree row count and additive multiset hash of the rows one write txn changes.

    A command changes thousands of rows: `change` only keeps each row's image (u32 len(key) |
    key | value, what _row_hash hashes), and `record` hashes them all in one loop with one
    hasher, reset after each row (creating a hasher per row was a third of the cost; a call per
    row, another), summing them unreduced and reducing modulo 2**256 once (the same digest as
    reducing after every row). Most commands change a few of the trees: only those are
    converted to integers and rebuilt, the others' entries are carried over as they are."""

    def __init__(self, record: StateDigest):
        self._record = record
        self._rows: dict = {}  # the trees changed so far: name -> (images added, images removed)

    def change(self, tree: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
        images = self._rows.get(tree)
        if images is None:
            images = self._rows[tree] = ([], [])
        head = _U32.pack(len(key)) + key
        if old is not None:
            images[1].append(head + old)
        if new is not None:
            images[0].append(head + new)

    def remove(self, tree: str, removed) -> None:
        """`change(tree, key, value, None)` for each (key, value) of `removed`."""
        images = self._rows.get(tree)
        if images is None:
            images = self._rows[tree] = ([], [])
        pack = _U32.pack
        images[1].extend([pack(len(key)) + key + value for key, value in removed])

    def record(self) -> StateDigest:
        unknown = self._rows.keys() - {stored.name for stored in self._record.trees}
        if unknown:
            raise KeyError(sorted(unknown)[0])
        hasher = blake3.blake3()  # one write transaction's: used by one thread
        update, digest, reset, from_bytes = hasher.update, hasher.digest, hasher.reset, int.from_bytes

        def total(images: list) -> int:
            total = 0
            for image in images:
                update(image)
                total += from_bytes(digest(), "big")
                reset()
            return total

        trees = []
        for stored in self._record.trees:
            images = self._rows.get(stored.name)
            if images is not None:
                added, removed = images
                count = stored.row_count + len(added) - len(removed)
                sum_ = int.from_bytes(stored.digest, "big") + total(added) - total(removed)
                stored = TreeDigest(stored.name, count, (sum_ % _DIGEST_MOD).to_bytes(32, "big"))
            trees.append(stored)
        return StateDigest(tuple(trees))


def _delete_in_order(cursor, rows_) -> None:
    """Delete the rows (key, value) of `rows_` as txn.delete would, one by one. Deleting moves
    the cursor to the next row, so a row that follows the last one deleted (pruning's rows come
    in key order, mostly in runs) is deleted without a search from the root."""
    for key, _ in rows_:
        if cursor.key() == key or cursor.set_key(key):
            cursor.delete()


def _digested_trees() -> list[str]:
    return [f.name for f in family_keys.FAMILIES] + [HISTORY_TREE]


def _schema_marker(path: str, raw: bytes | None) -> SchemaMarker:
    """The sealed schema marker, or a typed error saying why not: SchemaMismatch for a store
    written before the row envelope (a bare marker of value format 1), RowCorrupt for damage."""
    if raw is None:
        raise SchemaMismatch(f"{path}: the schema marker is missing")
    try:
        value = rows.unseal(SYSTEM_TREE, SYS_SCHEMA, raw)
    except RowCorrupt as damaged:
        try:
            bare = SchemaMarker.decode(raw)
        except FormatError:
            raise damaged from None
        if bare.value_format_version < VALUE_FORMAT_VERSION:
            raise SchemaMismatch(
                f"{path} was written by an older nokvfs (value_format_version {bare.value_format_version}: "
                f"rows without checksums); this nokvfs opens value_format_version {VALUE_FORMAT_VERSION} "
                "only; there is no migration: copy the data out with the nokvfs that wrote it"
            ) from None
        raise damaged from None
    try:
        return SchemaMarker.decode(value)
    except FormatError as exc:
        raise SchemaMismatch(f"{path}: the schema marker is malformed: {exc}") from None


class Shard:
    """The LMDB environment of one logical shard. One instance per process and path."""

    def __init__(self, path: str, env: lmdb.Environment, dbs: dict, *, witnessed: bool = True, lock=None):
        self.path = path
        self._lock = lock  # the shared ShardLock (nokvfs.engine.compact), released at close
        self._env = GatedEnv(env)
        self._opened = 0  # environments opened at this path by this instance (change_stamp)
        self.own_commits = OwnCommits()  # what this process committed (caches that survive it)
        self._options: dict = {}  # how the environment was opened (a live compaction reopens it so)
        self._bind(dbs)
        self._alarm = IntegrityAlarm(path)
        self._witness = CommitWitness(path)
        # (tree, key) -> (stored bytes, decoded record) of the system rows and root fences every
        # read view and command reads first: the same stored bytes verify and decode the same
        # way, so a row whose bytes equal the last ones seen is not verified and decoded again
        # (a third of opening a read view). Records are frozen; any other bytes are read afresh.
        self._decoded: dict = {}
        # Environments opened with sync=False witness their commits only when `sync` flushes them.
        self._witnessed = witnessed
        # Commands applied with durable=False (Shard.apply): committed since the last flush, and
        # committing now. The lock guards the two, never a transaction (a gate may hold those).
        self._unflushed = False
        self._unflushed_running = 0
        self._flushing = threading.Lock()
        # (LSN, chain digest, payload) of the last outbox records this process wrote, in LSN
        # order, which the next one is compressed against (outbox.frame); others are read back.
        self._outbox_recent: list[tuple[int, bytes, bytes]] = []
        self._tags = {f.name: f.tag for f in family_keys.FAMILIES}
        with env.begin() as txn:
            identity = self._system(txn, SYS_SHARD, ShardIdentity)
        self.logical_shard_id = identity.logical_shard_id
        self._genesis = outbox.genesis_digest(self.logical_shard_id)
        # LMDB's compiled key limit (511 in the python-lmdb build) bounds History keys, which
        # add 13 bytes to a family key; so family keys are refused above this, before any write.
        self.max_family_key_bytes = env.max_key_size() - HISTORY_KEY_OVERHEAD

    def _bind(self, dbs: dict) -> None:
        self._dbs = dbs
        self._family_dbs = {f.name: dbs[f.name] for f in family_keys.FAMILIES}
        self._family_dbs_by_tag = {f.tag: dbs[f.name] for f in family_keys.FAMILIES}

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str, logical_shard_id: bytes, **options) -> "Shard":
        """Initialise an empty store at `path` (created if missing). Refuses a non-empty store."""
        check_id16(logical_shard_id, "logical shard id")
        filemodes.makedirs(path)
        lock = compact.ShardLock.shared(path)
        try:
            return cls._create(path, logical_shard_id, lock, **options)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _create(cls, path: str, logical_shard_id: bytes, lock, **options) -> "Shard":
        env = cls._open_env(path, **options)
        try:
            with env.begin() as txn:
                if txn.cursor().first():
                    raise SchemaMismatch(f"{path} already holds a store; open it instead")
            for leftover in (ALARM_NAME, WITNESS_NAME):  # of a store that was deleted here
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(path, leftover))
            dbs = cls._initialise(env, logical_shard_id)
        except BaseException:
            env.close()
            raise
        shard = cls(path, env, dbs, witnessed=options.get("sync", True), lock=lock)
        shard._options = options
        return shard

    @classmethod
    def open(cls, path: str, *, verify: bool = False, **options) -> "Shard":
        """Open an existing store, failing closed on any difference from the contract.

        Opening checks the schema gate, the System rows and the recovery outbox against the
        System tail; every row is verified when it is read, so that is all a safe open needs.
        `verify=True` also reads every row of every tree and recomputes the state digests
        (what `fsck` does): O(shard size), for when the whole shard must be proven intact now.

        The process holds the shard's shared lock until `close` (nokvfs.engine.compact: a
        compaction waits for every holder to go); `locked=True` is the compactor's own open.
        """
        if options.pop("locked", False):
            return cls._open(path, verify, None, **options)
        if compact.has_leftovers(path):
            compact.recover(path)  # a compaction was interrupted: finish or undo it first
        if not os.path.exists(os.path.join(path, "data.mdb")):
            raise NotFound(f"no shard at {path}")
        lock = compact.ShardLock.shared(path)
        try:
            return cls._open(path, verify, lock, **options)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _open(cls, path: str, verify: bool, lock, **options) -> "Shard":
        if not os.path.exists(os.path.join(path, "data.mdb")):
            raise NotFound(f"no shard at {path}")
        try:
            check_meta_pages(path)
        except ShardCorrupt as exc:
            IntegrityAlarm(path).record(exc)
            raise
        env = cls._open_env(path, **options)
        try:
            dbs = cls._gate(env, path)
            shard = cls(path, env, dbs, witnessed=options.get("sync", True), lock=lock)
            shard._options = options
        except ShardCorrupt as exc:
            env.close()
            IntegrityAlarm(path).record(exc)
            raise
        except lmdb.Error as exc:
            env.close()
            error = translate_lmdb_error(exc)
            if isinstance(error, ShardCorrupt):
                IntegrityAlarm(path).record(error)
            raise error from None
        except BaseException:
            env.close()
            raise
        try:
            shard._verify(full=verify)
            tail = shard.recovery_tail
            try:
                shard._witness.check(tail.applied_lsn)
            except ShardCorrupt as exc:
                shard._alarm.record(exc)
                raise
        except BaseException:
            shard.close()
            raise
        return shard

    @staticmethod
    @_lmdb_errors
    def _open_env(path: str, *, map_size: int = DEFAULT_MAP_SIZE, readonly: bool = False, sync: bool = True):
        # sync=False is only for building a shard that is not live yet (a restore assembling in
        # a temporary directory): commits are not flushed one by one, `Shard.sync` flushes all.
        # A live shard is opened with LMDB's MDB_NOMETASYNC and flushes the meta page itself
        # (SyncingEnv): durable at return unless the command asked otherwise.
        env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=len(family_keys.TREE_NAMES) + 4,
            subdir=True,
            readonly=readonly,
            sync=sync,
            metasync=False,
            readahead=False,
            max_readers=256,
            mode=filemodes.DIR_MODE,  # the directory if LMDB creates it; data.mdb and lock.mdb 0600
        )
        return SyncingEnv(env, flush=sync and not readonly)

    @staticmethod
    def _initialise(env, logical_shard_id: bytes) -> dict:
        with env.begin(write=True) as txn:
            dbs = {name: env.open_db(name.encode(), txn=txn, create=True) for name in family_keys.TREE_NAMES}
            system = dbs[SYSTEM_TREE]
            marker = SchemaMarker(VALUE_FORMAT_VERSION, SCHEMA_ID, FORMAT_VERSION)
            rows_ = {
                SYS_SCHEMA: marker,
                SYS_TREES: _expected_registry(),
                SYS_SHARD: ShardIdentity(logical_shard_id, time.time_ns() // 1_000_000),
                SYS_CLOCK: CommitClock(0),
                SYS_RECOVERY: RecoveryTail(0, outbox.genesis_digest(logical_shard_id)),
                SYS_OWNER: OwnerRecord(1),
                SYS_LEASE_CLOCK: LeaseClock(0),
                SYS_HISTORY_FLOOR: HistoryFloor(0),
                SYS_STATE_DIGEST: StateDigest(tuple(TreeDigest(name, 0, bytes(32)) for name in _digested_trees())),
            }
            for key, value in rows_.items():
                rows.put(txn, system, SYSTEM_TREE, key, value.encode())
        return dbs

    @staticmethod
    def _gate(env, path: str) -> dict:
        """The schema gate: exact tree set, marker and registry, or SchemaMismatch."""
        with env.begin() as txn:
            names = set()
            cursor = txn.cursor()
            for key in cursor.iternext(keys=True, values=False):
                try:
                    names.add(key.decode("utf-8"))
                except UnicodeDecodeError:
                    names.add(repr(key))
        if not names:
            raise SchemaMismatch(f"{path} is an empty store: create it first")
        garbled = sorted(n for n in names if not _TREE_NAME.fullmatch(n))
        if garbled:
            # Neither nokvfs nor LMDB writes such a name: the main tree itself is damaged (a meta
            # page or branch page pointing at another tree's page).
            raise ShardCorrupt(f"{path}: LMDB's main tree lists names that are no tree's: {garbled[:3]}")
        expected = set(family_keys.TREE_NAMES)
        missing, extra = sorted(expected - names), sorted(names - expected)
        if missing or extra:
            raise SchemaMismatch(f"{path}: tree registry differs: missing {missing}, extra {extra}")
        dbs = {name: env.open_db(name.encode(), create=False) for name in family_keys.TREE_NAMES}
        with env.begin() as txn:
            system = dbs[SYSTEM_TREE]
            marker = _schema_marker(path, txn.get(SYS_SCHEMA, db=system))
            differences = []
            if marker.schema_id != SCHEMA_ID:
                differences.append(f"schema_id {marker.schema_id!r} != {SCHEMA_ID!r}")
            if marker.format_version != FORMAT_VERSION:
                differences.append(f"format_version {marker.format_version} != {FORMAT_VERSION}")
            if marker.value_format_version != VALUE_FORMAT_VERSION:
                differences.append(f"value_format_version {marker.value_format_version} != {VALUE_FORMAT_VERSION}")
            if differences:
                raise SchemaMismatch(f"{path}: schema marker differs: " + "; ".join(differences))
            raw = rows.unseal(SYSTEM_TREE, SYS_TREES, txn.get(SYS_TREES, db=system))
            if raw is None:
                raise SchemaMismatch(f"{path}: the tree registry record is missing")
            try:
                registry = TreeRegistry.decode(raw)
            except FormatError as exc:
                raise SchemaMismatch(f"{path}: the tree registry is malformed: {exc}") from None
            if registry != _expected_registry():
                stored = {(t.name, t.tag) for t in registry.trees}
                wanted = {(t.name, t.tag) for t in _expected_registry().trees}
                raise SchemaMismatch(
                    f"{path}: tree registry record differs: missing {sorted(wanted - stored)}, "
                    f"extra {sorted(stored - wanted)}"
                )
            for key in SYSTEM_KEYS:
                if rows.get(txn, system, SYSTEM_TREE, key) is None:
                    raise SchemaMismatch(f"{path}: System row {key.decode()} is missing")
            for key, stored in txn.cursor(system):
                if key not in SYSTEM_KEYS and key not in OPTIONAL_SYSTEM_KEYS:
                    # A row sealed under this key was written so (another format); one that is
                    # not is a damaged row.
                    rows.unseal(SYSTEM_TREE, key, stored)
                    raise SchemaMismatch(f"{path}: unknown System row {key!r}")
        return dbs

    def _verify(self, *, full: bool) -> None:
        """Outbox chain against the System tail, then (full) every row and every state digest.
        Raises the first problem found; `verify_state` lists them all."""
        problems = self.verify_state(full=full, first_only=True)
        if problems:
            raise problems[0]

    @_lmdb_errors
    def verify_state(self, *, full: bool = True, first_only: bool = False) -> list[NokvError]:
        """Every problem found, as typed errors (empty: intact). Always: the System rows, the
        recovery outbox end to end against the System tail and commit clock. With `full`, every
        row of every tree is read and verified, and each tree's state digest recomputed.
        Damage found is recorded (writes are refused from then on)."""
        problems: list[NokvError] = []
        with self._env.begin() as txn:
            try:
                tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
                clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
                digests = self._system(txn, SYS_STATE_DIGEST, StateDigest)
                for key, rec in ((SYS_OWNER, OwnerRecord), (SYS_LEASE_CLOCK, LeaseClock)):
                    self._system(txn, key, rec)
                floor = self._system(txn, SYS_HISTORY_FLOOR, HistoryFloor).floor_version
            except RowCorrupt:
                raise
            except FormatError as exc:
                raise SchemaMismatch(f"{self.path}: a System record is malformed: {exc}") from None
            try:
                floors = self._floors(txn)
            except FormatError as exc:
                raise ShardCorrupt(f"{self.path}: the System retention row is malformed: {exc}") from None
            db = self._dbs[OUTBOX_TREE]
            try:
                if floors.outbox_floor_lsn > tail.applied_lsn:
                    raise OutboxCorrupt(
                        f"the outbox truncation point {floors.outbox_floor_lsn} is beyond the recovery tail "
                        f"{tail.applied_lsn}"
                    )
                if full:
                    summary = outbox.verify(
                        txn,
                        db,
                        floors.outbox_floor_digest,
                        floor_lsn=floors.outbox_floor_lsn,
                        floor_commit_version=floors.outbox_floor_commit_version,
                    )
                else:
                    summary = outbox.verify_recent(
                        txn,
                        db,
                        floors.outbox_floor_digest,
                        floor_lsn=floors.outbox_floor_lsn,
                        tail_lsn=tail.applied_lsn,
                        records=RECENT_RECORDS_VERIFIED,
                    )
                    if summary is not None and summary.records == 0:
                        summary = dataclasses.replace(summary, last_commit_version=floors.outbox_floor_commit_version)
            except (OutboxCorrupt, RowCorrupt) as exc:
                problems.append(exc)
                summary = None
            if summary is None and not problems:
                problems.append(
                    ShardCorrupt(f"{self.path}: the recovery outbox does not reach the System tail {tail.applied_lsn}")
                )
            if summary is not None:
                if summary.last_lsn != tail.applied_lsn or summary.chain_digest != tail.chain_digest:
                    problems.append(
                        ShardCorrupt(
                            f"{self.path}: recovery outbox ends at LSN {summary.last_lsn}, System tail says "
                            f"{tail.applied_lsn}"
                            + ("" if summary.last_lsn != tail.applied_lsn else " with another chain digest")
                        )
                    )
                elif summary.last_commit_version != clock:
                    problems.append(
                        ShardCorrupt(
                            f"{self.path}: commit clock {clock} differs from the outbox's last commit "
                            f"version {summary.last_commit_version}"
                        )
                    )
            if floor > clock:
                problems.append(ShardCorrupt(f"{self.path}: history floor {floor} is beyond the commit clock {clock}"))
            if [t.name for t in digests.trees] != _digested_trees():
                raise SchemaMismatch(f"{self.path}: state digest lists other trees")
            if full and not (first_only and problems):
                problems += self._verify_rows(txn, digests, first_only=first_only)
        for problem in problems:
            if isinstance(problem, (ShardCorrupt, OutboxCorrupt)):
                self._alarm.record(problem)
                break
        return problems

    def _verify_rows(self, txn, digests: StateDigest, *, first_only: bool) -> list[NokvError]:
        problems: list[NokvError] = []
        stored = {t.name: t for t in digests.trees}
        for tree in family_keys.TREE_NAMES:
            count, total, damaged = 0, 0, 0
            cursor = txn.cursor(self._dbs[tree])
            found = cursor.first()
            while found:
                key = cursor.key()
                try:
                    value = rows.unseal(tree, key, cursor.value())
                except RowCorrupt as exc:
                    problems.append(exc)
                    if first_only:
                        return problems
                    damaged += 1
                    value = None
                count += 1
                if value is not None:
                    total = (total + _row_hash(key, value)) % _DIGEST_MOD
                found = cursor.next()
            recorded = stored.get(tree)
            if recorded is None or damaged:
                continue  # System and the outbox have no digest; a damaged row is reported already
            if count != recorded.row_count or total.to_bytes(32, "big") != recorded.digest:
                problems.append(
                    ShardCorrupt(
                        f"{self.path}: tree {tree} does not match its state digest ({count} rows, digest "
                        f"recorded for {recorded.row_count}): a row was changed outside the engine"
                    )
                )
                if first_only:
                    return problems
        return problems

    @property
    def integrity_finding(self) -> dict | None:
        """What made this shard known to be corrupt (None: nothing has)."""
        return self._alarm.finding()

    def clear_integrity_alarm(self) -> bool:
        """Lift the write refusal, only if a full verification finds nothing now. True if an
        alarm was lifted; ShardCorrupt (or the first problem) if the shard is still damaged."""
        problems = self.verify_state(full=True, first_only=True)
        if problems:
            raise problems[0]
        return self._alarm.clear()

    def close(self) -> None:
        if self._unflushed or self._unflushed_running:
            self.sync()
        self._witness.close()
        self._env.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- compaction while open (nokvfs.engine.compact.compact_open) ---------------------------

    def compact_live(self, **options) -> "compact.CompactReport | None":
        """Rewrite this open shard without its free pages; None when another process has it
        open or writes kept committing during every copy (nokvfs.engine.compact)."""
        return compact.compact_open(self, **options)

    def space(self) -> tuple[int, int]:
        """(bytes of pages in use by some tree, bytes of the file): the rest is free pages, which
        LMDB reuses but never gives back."""
        with self._env.begin() as txn:
            pages = sum(
                stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
                for stat in [txn.stat()] + [txn.stat(db) for db in self._dbs.values()]
            )
        psize = self._env.stat()["psize"]
        return pages * psize, os.path.getsize(os.path.join(self.path, "data.mdb"))

    def swap_gate(self, timeout: float):
        return self._env.exclusive(timeout)

    def writes_held(self, timeout: float):
        return self._env.hold_writes(timeout)

    def last_txn_id(self) -> int:
        return self._env.info()["last_txnid"]

    def change_stamp(self) -> tuple[int, int] | None:
        """What changes whenever anything is committed, by any process, or the environment is
        reopened (`reopen_after`): a reader that took it before a read, and finds it equal later,
        knows the read is still current. None while the environment is being replaced."""
        last = self._env.last_txnid()
        return None if last is None else (self._opened, last)

    def reopen_after(self, swap) -> None:
        """Close the environment, run `swap` (which puts another shard directory at this path),
        and open what is at the path then; inside `swap_gate` only. If the swap fails, whatever
        the interrupted swap left is put back in place and opened, and the error is raised."""
        self._witness.close()
        self._env.inner.close()
        try:
            swap()
        except BaseException:
            compact._put_back(self.path)
            self._reopen()
            raise
        self._reopen()

    def _reopen(self) -> None:
        env = self._open_env(self.path, **self._options)
        try:
            dbs = self._gate(env, self.path)
        except BaseException:
            env.close()
            raise
        self._env.inner = env
        self._opened += 1
        self._bind(dbs)
        self._witness = CommitWitness(self.path)

    @_lmdb_errors
    def sync(self) -> None:
        """Flush every committed transaction to disk (for environments opened with sync=False, and
        commands applied with `durable=False`)."""
        with self._flushing:
            self._unflushed = False  # before the flush: a commit after it sets it again
        flushed = self.recovery_tail.applied_lsn  # read first: a commit after the flush is not flushed
        self._env.sync(True)
        self._witness.record(flushed)

    def _witness_commit(self, lsn: int | None) -> None:
        if lsn is not None and self._witnessed:
            self._witness.record(lsn)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- System state --------------------------------------------------------------------------

    def _system(self, txn, key: bytes, record):
        return self._decoded_row(txn, SYSTEM_TREE, key, record.decode, missing=False)

    def _decoded_row(self, txn, tree: str, key: bytes, decode, *, missing: bool):
        """decode(the verified value at `key`), from `_decoded` when its stored bytes are the
        ones decoded last. `missing`: an absent row is None (verified as rows.get verifies a
        miss); otherwise it is handed to unseal and decode, which refuse it."""
        db = self._dbs[tree]
        raw = txn.get(key, db=db)
        if raw is None:
            if not missing:
                return decode(rows.unseal(tree, key, raw))
            rows.verify_neighbours(txn.cursor(db), tree, key)
            return None
        cached = self._decoded.get((tree, key))
        if cached is not None and cached[0] == raw:
            return cached[1]
        value = decode(rows.unseal(tree, key, raw))
        self._decoded[tree, key] = (bytes(raw), value)
        return value

    def _put_system(self, txn, key: bytes, value) -> None:
        stored = rows.seal(SYSTEM_TREE, key, value.encode())
        txn.put(key, stored, db=self._dbs[SYSTEM_TREE])
        # The next command reads what this one wrote: these bytes decode to `value` whether or
        # not the transaction commits (an entry is only used for equal bytes).
        self._decoded[SYSTEM_TREE, key] = (stored, value)

    def _floors(self, txn) -> RetentionFloors:
        """What retention has removed (nothing, until the first retention step writes the row)."""
        floors = self._decoded_row(txn, SYSTEM_TREE, SYS_RETENTION, RetentionFloors.decode, missing=True)
        if floors is None:
            return RetentionFloors(0, self._genesis, 0, 0, 0, 0)
        return floors

    def _fence(self, txn, root_id: bytes):
        """The root's RootFence on this shard (None: none)."""
        return self._decoded_row(txn, "root_fence", fences.fence_key(root_id), fences.decode_fence, missing=True)

    def _get(self, txn, tree: str, key: bytes) -> bytes | None:
        return rows.get(txn, self._dbs[tree], tree, key)

    @property
    def commit_version(self) -> int:
        with self._env.begin() as txn:
            return self._system(txn, SYS_CLOCK, CommitClock).commit_version

    @property
    def owner_epoch(self) -> int:
        with self._env.begin() as txn:
            return self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch

    @property
    def lease_clock_ms(self) -> int:
        with self._env.begin() as txn:
            return self._system(txn, SYS_LEASE_CLOCK, LeaseClock).high_water_unix_ms

    @property
    def history_floor(self) -> int:
        with self._env.begin() as txn:
            return self._system(txn, SYS_HISTORY_FLOOR, HistoryFloor).floor_version

    @property
    def recovery_tail(self) -> RecoveryTail:
        with self._env.begin() as txn:
            return self._system(txn, SYS_RECOVERY, RecoveryTail)

    @property
    def retention_floors(self) -> RetentionFloors:
        """The retention floors in force (README "Retention")."""
        with self._env.begin() as txn:
            return self._floors(txn)

    # --- reads -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def read(self, version: int | None = None, *, fence: fences.ReadFence | None = None):
        """A ReadView at `version` (default: the current commit version).

        With `fence`, the view is opened only if the root's RootFence is Active at the fence's
        placement generation and the shard's owner epoch is the fence's (FenceError,
        OwnerFenced): the seed's cold lookup, where "every request still passes the active
        RootFence and owner-epoch fence". Both are point reads in the view's own transaction.
        Damage met by any read in the view (a row failing its check, corruption LMDB reports)
        is ShardCorrupt and is recorded, so the shard refuses writes from then on.
        """
        try:
            with self._env.begin(buffers=False) as txn:
                current = self._system(txn, SYS_CLOCK, CommitClock).commit_version
                floor = self._system(txn, SYS_HISTORY_FLOOR, HistoryFloor).floor_version
                if fence is not None:
                    installed = self._fence(txn, fence.root_id)
                    fences.require_active(installed, fence.root_id, self.logical_shard_id, fence.placement_generation)
                    if fence.owner_epoch is not None:
                        fences.require_owner(fence.owner_epoch, self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch)
                view = ReadView(
                    txn,
                    self._family_dbs,
                    self._tags,
                    self._dbs[HISTORY_TREE],
                    current,
                    current,
                    floor,
                    event_floor=self._floors(txn).event_floor_version,
                )
                yield view if version is None else view.at(version)
        except ShardCorrupt as exc:
            self._alarm.record(exc)
            raise
        except lmdb.Error as exc:
            error = translate_lmdb_error(exc)
            if isinstance(error, ShardCorrupt):
                self._alarm.record(error)
            raise error from None

    def outbox_entries(self):
        """Every verified recovery-outbox entry kept (after the truncation point) in LSN order."""
        with self._durable_read() as txn:
            floors = self._floors(txn)
            yield from outbox.iterate(
                txn, self._dbs[OUTBOX_TREE], floors.outbox_floor_digest, after_lsn=floors.outbox_floor_lsn
            )

    # --- writes ----------------------------------------------------------------------------------

    @_lmdb_errors
    def apply(self, command: MetadataCommand, *, durable: bool = True) -> CommandOutcome:
        """Validate and apply one MetadataCommand atomically, or raise and apply nothing.

        Durable on return, unless `durable=False`: then a power loss may undo this command (and
        only while no later durable commit or `sync` has happened; see SyncingEnv). Nothing
        outside the shard learns of such a command before it is durable: it is not witnessed,
        and the outbox readers that ship records (`outbox_after`, `outbox_entries`, `copy_to`)
        flush it first."""
        self._check_addressed(command)
        self._alarm.refuse_writes()
        with collector.deferred():
            return self._apply_one(command, durable)

    def _apply_one(self, command: MetadataCommand, durable: bool) -> CommandOutcome:
        if not durable:
            with self._flushing:
                self._unflushed_running += 1
            try:
                with self._env.begin(write=True, durable=False) as txn:
                    outcome = self._apply(txn, command)
                    opened, txnid = self._opened, txn.id()
            finally:
                with self._flushing:
                    self._unflushed_running -= 1
                    self._unflushed = True
            if not outcome.replayed:
                self.own_commits.record(opened, txnid, outcome.mutated)
            return outcome
        with self._env.begin(write=True) as txn:
            outcome = self._apply(txn, command)
            opened, txnid = self._opened, txn.id()
        if not outcome.replayed:
            # Committed, and it wrote rows: LMDB advanced the transaction id to txnid.
            self.own_commits.record(opened, txnid, outcome.mutated)
            self._witness_commit(outcome.recovery_lsn)
        return outcome

    @contextlib.contextmanager
    def _durable_read(self):
        """A read transaction that sees only durable commits: what a reader ships to a bucket
        must survive here. Flushed after the transaction began, if a command applied with
        `durable=False` committed or is committing: every commit it sees is then flushed."""
        with self._env.begin() as txn:
            with self._flushing:
                flush = self._unflushed or self._unflushed_running
            if flush:
                self.sync()
            yield txn

    def _check_addressed(self, command: MetadataCommand) -> None:
        if command.schema_id != SCHEMA_ID:
            raise SchemaMismatch(f"command schema {command.schema_id!r} is not {SCHEMA_ID!r}")
        if command.logical_shard_id != self.logical_shard_id:
            raise FenceError("command is addressed to another logical shard")

    @_lmdb_errors
    def apply_group(self, items) -> list:
        """Group commit: several MetadataCommands in ONE LMDB write transaction and one sync.

        Each item is a MetadataCommand or a function of a ReadView returning one; the function
        is called inside the transaction, on the state the group's earlier commands left (at the
        version they reached), so a command may depend on the one before it. Each command is
        applied exactly as `apply` applies it alone -- its own commit version and LSN, fences,
        dedupe check, predicates, History, ChangeEvents, dedupe row and recovery-outbox record,
        in group order -- so neither a replica replaying the outbox nor a reader can tell a
        group from the same commands applied one by one.

        Atomicity is per command: each one runs in a nested transaction. One that is refused (a
        typed NokvError from its function or from the engine: a failed predicate, a conflict, a
        stale fence...) leaves no trace and is excluded; the others still commit, and its error
        is its result. Damage (IntegrityError) or an LMDB failure aborts the whole group: nothing
        is applied and the error is raised. Returns one result per item, in order: the
        CommandOutcome, or the exception that excluded it.
        """
        self._alarm.refuse_writes()
        results: list = []
        last_lsn = None
        mutated: list = []
        with collector.deferred(), self._env.begin(write=True) as txn:
            opened, txnid = self._opened, txn.id()
            for item in items:
                try:
                    command = item(self._write_view(txn)) if callable(item) else item
                    self._check_addressed(command)
                    # Nested in the group's transaction, which holds the gate already.
                    with self._env.inner.begin(write=True, parent=txn) as child:
                        outcome = self._apply(child, command)  # an exception aborts the child alone
                except IntegrityError:
                    raise
                except NokvError as exc:
                    results.append(exc)
                    continue
                results.append(outcome)
                if not outcome.replayed:
                    last_lsn = outcome.recovery_lsn
                    mutated.extend(outcome.mutated)
        if last_lsn is not None:  # a command was applied: the commit advanced the id to txnid
            self.own_commits.record(opened, txnid, mutated)
        self._witness_commit(last_lsn)
        return results

    def _write_view(self, txn) -> ReadView:
        """A view of the write transaction as it stands: what a group's next command reads."""
        clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
        floor = self._system(txn, SYS_HISTORY_FLOOR, HistoryFloor).floor_version
        return ReadView(
            txn,
            self._family_dbs,
            self._tags,
            self._dbs[HISTORY_TREE],
            clock,
            clock,
            floor,
            event_floor=self._floors(txn).event_floor_version,
        )

    def _apply(self, txn, command: MetadataCommand) -> CommandOutcome:
        # The seed's order: schema marker (the gate, and `apply`) and the active RootFence, then
        # the owner epoch; only then an exact request-id replay, which precedes the read-version
        # fence; then the predicates.
        self._check_fences(txn, command)
        dedupe_key = family_keys.CommandDedupeKey(command.root_id, command.request_id).encode()
        stored = self._get(txn, "command_dedupe", dedupe_key)
        if stored is not None:
            dedupe = dedupe_rows.decode(stored)
            if dedupe.command_digest != command.command_digest:
                raise RequestMismatch(f"request id {command.request_id.hex()} was used for a different command")
            return CommandOutcome(dedupe.commit_version, dedupe.recovery_lsn, dedupe.result, replayed=True)
        horizon = self._floors(txn).request_horizon_ms
        if retention.request_expired(command.request_id, horizon):
            # Its dedupe row may have been removed by retention: applying it could run it twice.
            raise RequestExpired(
                f"request {command.request_id.hex()} is older than the replay retention horizon "
                f"({horizon} ms since the epoch): its result is no longer kept, so it is not applied again"
            )
        clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
        if command.read_version != clock:
            raise ReadVersionStale(
                f"command built at version {command.read_version}, shard is at {clock}",
                expected=command.read_version,
                current=clock,
            )
        # What the predicates read, verified (value and stored form), is what the first write of
        # the same row replaces: it is not read a second time.
        checked: dict = {}
        for index, predicate in enumerate(command.predicates):
            checked[predicate.tree, predicate.key] = self._check(txn, index, predicate)
        for mutation in command.mutations:
            if len(mutation.key) > self.max_family_key_bytes:
                raise KeyTooLong(
                    f"a {mutation.tree} key of {len(mutation.key)} bytes exceeds the engine's limit of "
                    f"{self.max_family_key_bytes} bytes"
                )
        commit_version = clock + 1
        tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
        lsn = tail.applied_lsn + 1
        digests = _Digests(self._system(txn, SYS_STATE_DIGEST, StateDigest))
        written: set = set()  # (tree, key) of every row written so far
        mutated = []
        family_dbs, tags, history_db = self._family_dbs, self._tags, self._dbs[HISTORY_TREE]
        # The History key of every row is tag | u32 len(key) | key | this: built once.
        inverted = family_keys.inverted_version(commit_version)
        change = digests.change

        def write(tree: str, key: bytes, value: bytes | None) -> None:
            # The old value is read verified: nothing is written over a damaged row.
            db = family_dbs[tree]
            row = (tree, key)
            found = checked.pop(row, _UNCHECKED)
            if found is _UNCHECKED:
                found = rows.get_stored(txn, db, tree, key)
            old = None if found is None else found[0]
            if row not in written:
                written.add(row)
                if history.records_change(tree, old, value, commit_version):
                    # The first write of a key in a command records the value before the command.
                    # Its History key (at the new commit version) is new but for damage: the row
                    # found there, if any, is read (verified) and replaced.
                    history_key = family_keys.history_key_prefix(tags[tree], key) + inverted
                    hvalue = history.encode_value(old, None if found is None else found[1])
                    prior = None
                    if not rows.put(txn, history_db, HISTORY_TREE, history_key, hvalue, overwrite=False):
                        prior = self._get(txn, HISTORY_TREE, history_key)
                        rows.put(txn, history_db, HISTORY_TREE, history_key, hvalue)
                    change(HISTORY_TREE, history_key, prior, hvalue)
            if value is None:
                if old is not None:
                    txn.delete(key, db=db)
            elif old is not None:
                rows.put(txn, db, tree, key, value, previous=found)
            else:
                # A new key that sorts last (ChangeEvent, CommandDedupe of UUIDv7 requests, new
                # operations) is appended, which fills its page instead of splitting it in half.
                rows.put_new(txn, db, tree, key, value)
            change(tree, key, old, value)
            mutated.append(row)

        for mutation in command.mutations:
            if mutation.tree not in self._family_dbs:
                raise InvalidInput(f"no metadata family tree {mutation.tree!r}")
            if mutation.tree in retention.SELF_VERSIONED:
                raise InvalidInput(
                    f"{mutation.tree} rows are written by the engine only (a command's events and dedupe row)"
                )
            write(mutation.tree, mutation.key, mutation.value if isinstance(mutation, Put) else None)
        for sequence, event in enumerate(command.events):
            key = family_keys.change_event_key(command.root_id, commit_version, sequence)
            write("change_event", key, event)
        write(
            "command_dedupe",
            dedupe_key,
            dedupe_rows.encode(
                family_records.CommandDedupe(command.command_digest, command.result, commit_version, lsn)
            ),
        )
        payload = command_payload(command, commit_version)
        self._append_outbox(txn, lsn, OutboxRecordKind.MetadataCommand, commit_version, payload, tail)
        self._put_system(txn, SYS_CLOCK, CommitClock(commit_version))
        self._put_system(txn, SYS_STATE_DIGEST, digests.record())
        return CommandOutcome(commit_version, lsn, command.result, mutated=tuple(mutated))

    def _append_outbox(self, txn, lsn, kind, commit_version, payload, tail) -> bytes:
        db = self._dbs[OUTBOX_TREE]
        window = self._outbox_window(txn, db, lsn, tail)
        framed, chain = outbox.frame(lsn, kind, commit_version, payload, tail.chain_digest, window)
        for key, value in framed:
            # A record's rows sort after every row of the tree: appended, so their pages fill up
            # (sequential keys put normally leave every page half empty). Only chunks of records
            # written before header format 2 (under 0x01) sort after them, until truncated.
            stored = rows.seal(OUTBOX_TREE, key, value)
            if not txn.put(key, stored, db=db, append=True) and not txn.put(key, stored, db=db, overwrite=False):
                raise ShardCorrupt(f"recovery outbox already holds {key.hex()}")
        self._put_system(txn, SYS_RECOVERY, RecoveryTail(lsn, chain))
        # Exact whether or not this transaction commits: used only while the tail names its last
        # record (whose chain digest binds the window it was written after).
        before = [(number, None, p) for number, p in zip(range(lsn - len(window or ()), lsn), window or ())]
        self._outbox_recent = (before + [(lsn, chain, payload)])[-outbox.WINDOW_RECORDS :]
        return chain

    def _outbox_window(self, txn, db, lsn: int, tail) -> list[bytes] | None:
        """The payloads a new record `lsn` may be compressed against (outbox.frame): records
        window_start(lsn)..lsn - 1, or None when there are none or one is not kept (truncated)."""
        first = outbox.window_start(lsn)
        if first == lsn or outbox.read_header(txn, db, first) is None:
            return None
        recent = {number: payload for number, _, payload in self._outbox_recent}
        last = self._outbox_recent[-1] if self._outbox_recent else None
        # The tail's chain digest binds its payload and, through the chain, every one before it.
        if last is not None and last[0] == tail.applied_lsn and last[1] == tail.chain_digest:
            if all(number in recent for number in range(first, lsn)):
                return [recent[number] for number in range(first, lsn)]
        return outbox.payloads(txn, db, first, lsn - 1)

    def _check_fences(self, txn, command: MetadataCommand) -> None:
        fence = self._fence(txn, command.root_id)
        if command.fence_install:
            fences.check_installation(command, fence, self.logical_shard_id)
        else:
            fences.require_active(fence, command.root_id, self.logical_shard_id, command.placement_generation)
        fences.require_owner(command.owner_epoch, self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch)

    def _check(self, txn, index: int, predicate) -> tuple[bytes, bytes] | None:
        """The row the predicate holds on (verified; rows.get_stored's pair), or PredicateFailed."""
        db = self._family_dbs.get(predicate.tree)
        if db is None:
            raise InvalidInput(f"predicate {index} names no metadata family tree {predicate.tree!r}")
        found = rows.get_stored(txn, db, predicate.tree, predicate.key)
        raw = None if found is None else found[0]
        if isinstance(predicate, ValueEquals):  # the most common kind (a command's builder read the row)
            if raw != predicate.value:
                raise PredicateFailed(f"{_where(index, predicate)}: the row differs", index=index)
        elif isinstance(predicate, Exists):
            if raw is None:
                raise PredicateFailed(f"{_where(index, predicate)}: the row does not exist", index=index)
        elif isinstance(predicate, Absent):
            if raw is not None:
                raise PredicateFailed(f"{_where(index, predicate)}: the row exists", index=index)
        elif isinstance(predicate, FieldEquals):
            error = GenerationConflict if isinstance(predicate, Generation) else PredicateFailed
            if raw is None:
                raise error(f"{_where(index, predicate)}: the row does not exist", index=index)
            actual = getattr(predicate.record.decode(raw), predicate.field)
            if actual != predicate.expected:
                raise error(
                    f"{_where(index, predicate)}: {predicate.record.__name__}.{predicate.field} is {actual!r}, "
                    f"expected {predicate.expected!r}",
                    index=index,
                )
        return found

    @_lmdb_errors
    def observe_lease_clock(self, unix_ms: int) -> int:
        """Persist a lease-clock observation; the clock only moves forward. Returns the high water."""
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            current = self._system(txn, SYS_LEASE_CLOCK, LeaseClock).high_water_unix_ms
            if unix_ms <= current:
                return current
            tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
            clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
            payload = LeaseClockRecord(unix_ms).encode()
            self._append_outbox(txn, tail.applied_lsn + 1, OutboxRecordKind.LeaseClockObservation, clock, payload, tail)
            self._put_system(txn, SYS_LEASE_CLOCK, LeaseClock(unix_ms))
            opened, txnid = self._opened, txn.id()
        self.own_commits.record(opened, txnid, ())  # no family row: a mount's kept values stand
        self._witness_commit(tail.applied_lsn + 1)
        return unix_ms

    @_lmdb_errors
    def advance_owner_epoch(self, new_epoch: int) -> int:
        """Move physical ownership to `new_epoch` (strictly greater): older owners are fenced."""
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            current = self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch
            if new_epoch <= current:
                raise OwnerFenced(f"owner epoch {new_epoch} does not advance the current {current}")
            tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
            clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
            payload = OwnerEpochRecord(new_epoch).encode()
            self._append_outbox(txn, tail.applied_lsn + 1, OutboxRecordKind.OwnerEpochAdvance, clock, payload, tail)
            self._put_system(txn, SYS_OWNER, OwnerRecord(new_epoch))
        self._witness_commit(tail.applied_lsn + 1)
        return new_epoch

    @_lmdb_errors
    def prune_history(
        self,
        *,
        owner_epoch: int,
        floor_version: int,
        start_key: bytes = b"",
        max_rows: int = history.MAX_PRUNED_ROWS,
        max_visits: int = history.MAX_VISITED_ROWS,
    ) -> "PruneOutcome":
        """Advance the history floor towards `floor_version` and prune one bounded batch of History
        rows at it, from `start_key`; the outcome's next_key is where the next batch starts.

        The floor is clamped inside the transaction to the commit clock and to the oldest read
        version of every HistoryHold on the shard, and never moves back: history a hold (a
        snapshot, a commit build, a restore) still reads is never pruned, whatever the caller
        asks. Which rows go is nokvfs.engine.history's rule. A batch that changes something is one
        write transaction with one HistoryPrune outbox record, so replicas prune exactly the same
        rows; a stale owner epoch is OwnerFenced.
        """
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            outcome = self._prune(txn, owner_epoch, floor_version, start_key, limits=(max_rows, max_visits))
            opened, txnid = self._opened, txn.id()
        if outcome.recovery_lsn is not None:  # it wrote (its record): History rows only
            self.own_commits.record(opened, txnid, ())
        self._witness_commit(outcome.recovery_lsn)
        return outcome

    @_lmdb_errors
    def replay_history_prune(self, record: HistoryPruneRecord) -> "PruneOutcome":
        """Apply a recorded HistoryPrune batch: the same floor, the same range and exactly the same
        rows (count and digest), or IntegrityError and nothing applied."""
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            outcome = self._prune(txn, record.owner_epoch, record.floor_version, record.start_key, recorded=record)
        self._witness_commit(outcome.recovery_lsn)
        return outcome

    @_lmdb_errors
    def prunable_history(self, floor_version: int) -> tuple[int, int]:
        """(the floor prune_history would reach now, how many History rows would go at it): a read-only estimate."""
        with self._env.begin() as txn:
            floor = self._prune_floor(txn, floor_version)
            planned = history.plan(
                txn,
                self._dbs[HISTORY_TREE],
                self._family_dbs_by_tag,
                floor,
                b"",
                max_rows=None,
                max_visits=None,
                event_floor=self._floors(txn).event_floor_version,
            )
            return floor, len(planned.deletions)

    def _prune_floor(self, txn, floor_version: int) -> int:
        clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
        old = self._system(txn, SYS_HISTORY_FLOOR, HistoryFloor).floor_version
        floor = min(floor_version, clock)
        for _, value in rows.iterate(txn.cursor(self._family_dbs["history_hold"]), "history_hold"):
            floor = min(floor, family_records.HistoryHold.decode(value).read_version)
        return max(old, floor)

    def _prune(
        self,
        txn,
        owner_epoch: int,
        floor_version: int,
        start_key: bytes,
        *,
        limits=(None, None),
        recorded: HistoryPruneRecord | None = None,
    ) -> "PruneOutcome":
        fences.require_owner(owner_epoch, self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch)
        old = self._system(txn, SYS_HISTORY_FLOOR, HistoryFloor).floor_version
        floor = self._prune_floor(txn, floor_version)
        if recorded is not None and floor != recorded.floor_version:
            raise IntegrityError(f"the recorded history floor {recorded.floor_version} is not reachable here ({floor})")
        planned = history.plan(
            txn,
            self._dbs[HISTORY_TREE],
            self._family_dbs_by_tag,
            floor,
            start_key,
            end=None if recorded is None else recorded.end_key,
            max_rows=limits[0],
            max_visits=limits[1],
            event_floor=self._floors(txn).event_floor_version,
        )
        if recorded is None and not planned.deletions and floor == old:
            return PruneOutcome(floor, 0, planned.end_key, None)
        digests = _Digests(self._system(txn, SYS_STATE_DIGEST, StateDigest))
        db = self._dbs[HISTORY_TREE]
        _delete_in_order(txn.cursor(db), planned.deletions)
        digests.remove(HISTORY_TREE, planned.deletions)
        record = HistoryPruneRecord(
            owner_epoch, floor, start_key, planned.end_key, len(planned.deletions), planned.digest()
        )
        if recorded is not None and record != recorded:
            raise IntegrityError(
                f"the recorded prune removed {recorded.pruned_rows} History rows; replayed here it removes "
                f"{record.pruned_rows}" + ("" if record.pruned_rows != recorded.pruned_rows else " other ones")
            )
        tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
        clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
        lsn = tail.applied_lsn + 1
        self._append_outbox(txn, lsn, OutboxRecordKind.HistoryPrune, clock, record.encode(), tail)
        self._put_system(txn, SYS_HISTORY_FLOOR, HistoryFloor(floor))
        self._put_system(txn, SYS_STATE_DIGEST, digests.record())
        return PruneOutcome(floor, len(planned.deletions), planned.end_key, lsn)

    # --- retention (nokvfs.engine.retention; README "Retention") --------------------------------

    @_lmdb_errors
    def truncate_outbox(
        self, *, owner_epoch: int, through_lsn: int, max_records: int = MAX_TRUNCATED_RECORDS
    ) -> "TruncateOutcome":
        """Remove the recovery-outbox records at or below `through_lsn` (clamped to the tail), at
        most `max_records` of them in this transaction; the outcome says how far it got.

        The chain digest and commit version of the last removed record become the truncation
        point (System `retention`), from which the chain is verified from then on. The caller
        chooses a durable horizon (README "Retention": the bucket's checkpoint when the shard is
        replicated, else the local horizon); the engine only never moves the point back. One write
        transaction with one OutboxTruncate record, so replicas truncate exactly the same records.
        """
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            outcome = self._truncate(txn, owner_epoch, through_lsn, max_records)
            opened, txnid = self._opened, txn.id()
        if outcome.recovery_lsn is not None:  # it wrote: outbox rows only
            self.own_commits.record(opened, txnid, ())
        self._witness_commit(outcome.recovery_lsn)
        return outcome

    @_lmdb_errors
    def replay_outbox_truncate(self, record: OutboxTruncateRecord) -> "TruncateOutcome":
        """Apply a recorded truncation: the same point, the same chain digest and record count, or
        IntegrityError and nothing applied."""
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            outcome = self._truncate(txn, record.owner_epoch, record.through_lsn, None, recorded=record)
        self._witness_commit(outcome.recovery_lsn)
        return outcome

    def _truncate(
        self,
        txn,
        owner_epoch: int,
        through_lsn: int,
        max_records: int | None,
        *,
        recorded: OutboxTruncateRecord | None = None,
    ) -> "TruncateOutcome":
        fences.require_owner(owner_epoch, self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch)
        tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
        floors = self._floors(txn)
        old = floors.outbox_floor_lsn
        target = min(through_lsn, tail.applied_lsn)
        if max_records is not None:
            target = min(target, old + max_records)
        if recorded is not None and target != recorded.through_lsn:
            raise IntegrityError(
                f"the recorded outbox truncation through LSN {recorded.through_lsn} is not reachable here"
            )
        if target <= old:
            if recorded is not None:
                raise IntegrityError(
                    f"the outbox is truncated through LSN {old} already, not before {recorded.through_lsn}"
                )
            return TruncateOutcome(old, 0, None)
        db = self._dbs[OUTBOX_TREE]
        header = outbox.read_header(txn, db, target)
        if header is None:
            raise OutboxCorrupt(f"outbox record {target} is missing")
        # The first records kept may be stored against records removed: stored again alone.
        rewrite = []
        for lsn in range(target + 1, min(target + outbox.WINDOW_RECORDS, tail.applied_lsn) + 1):
            kept = outbox.read_header(txn, db, lsn)
            if kept is not None and outbox.needs_previous(kept) and outbox.window_start(lsn) <= target:
                (payload,) = outbox.payloads(txn, db, lsn, lsn)
                rewrite.append((lsn, kept, payload, outbox.read_header(txn, db, lsn - 1).chain_digest))
        cursor = txn.cursor(db)
        for first, last in (
            # Headers and the chunks that follow them; then chunks of version 1 headers.
            (outbox.header_key(old + 1), outbox.header_key(target + 1)),
            (outbox.legacy_chunk_key(old + 1, 0), outbox.legacy_chunk_key(target + 1, 0)),
        ):
            found = cursor.set_range(first)
            while found and first <= cursor.key() < last:
                found = cursor.delete()  # moves to the next row
        for lsn, kept, payload, previous_chain in rewrite:
            self._store_alone(txn, db, lsn, kept, payload, previous_chain)
        record = OutboxTruncateRecord(owner_epoch, target, header.chain_digest, header.commit_version, target - old)
        if recorded is not None and record != recorded:
            raise IntegrityError(f"the recorded outbox truncation differs from the chain here: {recorded} != {record}")
        self._put_system(
            txn,
            SYS_RETENTION,
            dataclasses.replace(
                floors,
                outbox_floor_lsn=target,
                outbox_floor_digest=header.chain_digest,
                outbox_floor_commit_version=header.commit_version,
            ),
        )
        clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
        lsn = tail.applied_lsn + 1
        self._append_outbox(txn, lsn, OutboxRecordKind.OutboxTruncate, clock, record.encode(), tail)
        return TruncateOutcome(target, target - old, lsn)

    def _store_alone(self, txn, db, lsn: int, stored, payload: bytes, previous_chain: bytes) -> None:
        """Store record `lsn` again without reference to the record before it (which truncation
        removes): same payload, kind, commit version and chain digest; other rows."""
        framed, chain = outbox.frame(lsn, stored.record_kind, stored.commit_version, payload, previous_chain)
        if chain != stored.chain_digest:
            raise OutboxCorrupt(f"outbox record {lsn} does not follow the truncation point's chain digest")
        for index in range(stored.chunk_count):
            txn.delete(outbox.chunk_key(lsn, index), db=db)
        for key, value in framed:
            rows.put(txn, db, OUTBOX_TREE, key, value)

    @_lmdb_errors
    def prune_retained(
        self,
        *,
        owner_epoch: int,
        family: RetainedFamily,
        floor_version: int,
        horizon_ms: int = 0,
        start_key: bytes = b"",
        max_rows: int = retention.MAX_PRUNED_ROWS,
        max_visits: int = retention.MAX_VISITED_ROWS,
    ) -> "PruneOutcome":
        """Advance a retention floor of ChangeEvent or CommandDedupe and remove one bounded batch
        of the rows it lets go, from `start_key`; the outcome's next_key is where the next starts.

        ChangeEvent: the event floor moves to `floor_version` (clamped to the commit clock).
        CommandDedupe: the request horizon moves to `horizon_ms` (clamped to the persisted lease
        clock) and the dedupe floor to `floor_version`. Floors never move back. Which rows go is
        nokvfs.engine.retention's rule. A batch that changes something is one write transaction
        with one RetentionPrune record, so replicas remove exactly the same rows.
        """
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            outcome = self._prune_retained(
                txn, owner_epoch, family, floor_version, horizon_ms, start_key, limits=(max_rows, max_visits)
            )
            opened, txnid = self._opened, txn.id()
        if outcome.recovery_lsn is not None:
            # It wrote rows of `family` only: a run of own commits goes on unless that is a
            # family some reader keeps values of (then the rows are not known: a new run).
            self.own_commits.record(opened, txnid, (), unknown=retention.TREES[RetainedFamily(family)])
        self._witness_commit(outcome.recovery_lsn)
        return outcome

    @_lmdb_errors
    def replay_retention_prune(self, record: RetentionPruneRecord) -> "PruneOutcome":
        """Apply a recorded retention batch: the same floors, range and rows, or IntegrityError."""
        self._alarm.refuse_writes()
        with self._env.begin(write=True) as txn:
            outcome = self._prune_retained(
                txn,
                record.owner_epoch,
                record.family,
                record.floor_version,
                record.horizon_ms,
                record.start_key,
                recorded=record,
            )
        self._witness_commit(outcome.recovery_lsn)
        return outcome

    def _prune_retained(
        self,
        txn,
        owner_epoch: int,
        family: RetainedFamily,
        floor_version: int,
        horizon_ms: int,
        start_key: bytes,
        *,
        limits=(None, None),
        recorded: RetentionPruneRecord | None = None,
    ) -> "PruneOutcome":
        fences.require_owner(owner_epoch, self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch)
        family = RetainedFamily(family)
        clock = self._system(txn, SYS_CLOCK, CommitClock).commit_version
        floors = self._floors(txn)
        if family == RetainedFamily.ChangeEvent:
            floor = max(floors.event_floor_version, min(floor_version, clock))
            horizon = 0
            updated = dataclasses.replace(floors, event_floor_version=floor)
        else:
            lease = self._system(txn, SYS_LEASE_CLOCK, LeaseClock).high_water_unix_ms
            floor = max(floors.request_floor_version, min(floor_version, clock))
            horizon = max(floors.request_horizon_ms, min(horizon_ms, lease))
            updated = dataclasses.replace(floors, request_floor_version=floor, request_horizon_ms=horizon)
        if recorded is not None and (floor, horizon) != (recorded.floor_version, recorded.horizon_ms):
            raise IntegrityError(
                f"the recorded {family.name} retention floor ({recorded.floor_version}, {recorded.horizon_ms}) is not "
                f"reachable here ({floor}, {horizon})"
            )
        tree = retention.TREES[family]
        db = self._dbs[tree]
        planned = retention.plan(
            txn,
            db,
            family,
            floor,
            horizon,
            start_key,
            end=None if recorded is None else recorded.end_key,
            max_rows=limits[0],
            max_visits=limits[1],
        )
        if recorded is None and not planned.deletions and updated == floors:
            return PruneOutcome(floor, 0, planned.end_key, None)
        digests = _Digests(self._system(txn, SYS_STATE_DIGEST, StateDigest))
        _delete_in_order(txn.cursor(db), planned.deletions)
        digests.remove(tree, planned.deletions)
        record = RetentionPruneRecord(
            owner_epoch, family, floor, horizon, start_key, planned.end_key, len(planned.deletions), planned.digest()
        )
        if recorded is not None and record != recorded:
            raise IntegrityError(
                f"the recorded {family.name} retention removed {recorded.pruned_rows} rows; replayed here it removes "
                f"{record.pruned_rows}" + ("" if record.pruned_rows != recorded.pruned_rows else " other ones")
            )
        tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
        lsn = tail.applied_lsn + 1
        self._append_outbox(txn, lsn, OutboxRecordKind.RetentionPrune, clock, record.encode(), tail)
        self._put_system(txn, SYS_RETENTION, updated)
        self._put_system(txn, SYS_STATE_DIGEST, digests.record())
        return PruneOutcome(floor, len(planned.deletions), planned.end_key, lsn)

    # --- replication support (nokvfs.replicate) ------------------------------------------------
    # Read-only helpers: a consistent compacted copy, and verified outbox ranges after a point.

    @_lmdb_errors
    def copy_to(self, path: str) -> CopyPoint:
        """Write a compacted copy of the environment into the empty directory `path`.

        The copy runs inside one read transaction (`Environment.copy(compact=True, txn=...)`), so
        writers are never blocked and the copy holds exactly the state that transaction saw; the
        returned CopyPoint (recovery tail, commit version, owner epoch) is read in it too.
        """
        with self._durable_read() as txn:
            tail = self._system(txn, SYS_RECOVERY, RecoveryTail)
            point = CopyPoint(
                applied_lsn=tail.applied_lsn,
                chain_digest=tail.chain_digest,
                commit_version=self._system(txn, SYS_CLOCK, CommitClock).commit_version,
                owner_epoch=self._system(txn, SYS_OWNER, OwnerRecord).owner_epoch,
                txn_id=txn.id(),
            )
            self._env.copy(path, compact=True, txn=txn)
        return point

    @_lmdb_errors
    def outbox_after(
        self, lsn: int, *, through_lsn: int | None = None, max_records: int | None = None, max_bytes: int | None = None
    ):
        """(chain digest after record `lsn`, the verified entries after it), in one read txn.

        The digest is the genesis digest for `lsn` 0, the kept chain digest for the truncation
        point, and None when `lsn` is beyond the tail (then there are no entries); an `lsn` below
        the truncation point is HistoryNotRetained. Entries stop at `through_lsn`, after `max_records`, or once their
        payloads exceed `max_bytes` (at least one entry is returned when there is one). Each entry
        is verified like `outbox.iterate` does: framing, payload length and SHA-256, and the chain
        from the digest at `lsn`; a failure is OutboxCorrupt.
        """
        db = self._dbs[OUTBOX_TREE]
        with self._durable_read() as txn:
            floors = self._floors(txn)
            if lsn < floors.outbox_floor_lsn:
                raise HistoryNotRetained(
                    f"the recovery outbox was truncated through LSN {floors.outbox_floor_lsn}: the records after "
                    f"LSN {lsn} are no longer kept"
                )
            if lsn == floors.outbox_floor_lsn:
                previous = floors.outbox_floor_digest
            else:
                header = outbox.read_header(txn, db, lsn)
                if header is None:
                    return None, []
                previous = header.chain_digest
            digest_at_lsn = previous
            entries, size, current = [], 0, lsn + 1
            while through_lsn is None or current <= through_lsn:
                if max_records is not None and len(entries) >= max_records:
                    break
                if max_bytes is not None and entries and size >= max_bytes:
                    break
                found = outbox.read_record(txn, db, current, previous)
                if found is None:
                    break
                entry, previous = found
                entries.append(entry)
                size += len(entry.payload)
                current += 1
        return digest_at_lsn, entries


# Shipped packs and outbox ranges are verified by the same function that gates opening.
verify_outbox_record = outbox.verify_record


@dataclasses.dataclass(frozen=True)
class PruneOutcome:
    """One prune_history batch: the floor now in force, the rows removed, where the next batch
    starts (None: the pass reached the end of History) and the outbox record (None: no change)."""

    floor_version: int
    pruned_rows: int
    next_key: bytes | None
    recovery_lsn: int | None


@dataclasses.dataclass(frozen=True)
class TruncateOutcome:
    """One truncate_outbox step: the truncation point now, the records removed, and the outbox
    record (None: nothing changed)."""

    floor_lsn: int
    removed_records: int
    recovery_lsn: int | None


@dataclasses.dataclass(frozen=True)
class CopyPoint:
    """What a `Shard.copy_to` copy holds: its recovery tail, commit version and owner epoch."""

    applied_lsn: int
    chain_digest: bytes
    commit_version: int
    owner_epoch: int
    txn_id: int = 0  # LMDB's id of the copy's transaction: a later write commits a higher one


def _where(index: int, predicate) -> str:
    return f"predicate {index} on {predicate.tree}"


def _command_record(command: MetadataCommand, commit_version: int, *, rows: bool = True) -> CommandRecord:
    """The command's logical outbox record; `rows=False`: without its predicates and mutations
    (the header command_payload writes the rows after)."""
    predicates = []
    for p in command.predicates if rows else ():
        if isinstance(p, Exists):
            predicates.append(PredicateRow(PredicateKind.Exists, p.tree, p.key, None, None, None, None))
        elif isinstance(p, Absent):
            predicates.append(PredicateRow(PredicateKind.Absent, p.tree, p.key, None, None, None, None))
        elif isinstance(p, ValueEquals):
            predicates.append(PredicateRow(PredicateKind.ValueEquals, p.tree, p.key, p.value, None, None, None))
        else:
            kind = (
                PredicateKind.Generation
                if isinstance(p, Generation)
                else PredicateKind.State
                if isinstance(p, State)
                else PredicateKind.FieldEquals
            )
            predicates.append(PredicateRow(kind, p.tree, p.key, None, p.record.__name__, p.field, p.expected_bytes()))
    mutations = tuple(
        MutationRow(MutationKind.Put, m.tree, m.key, m.value)
        if isinstance(m, Put)
        else MutationRow(MutationKind.Delete, m.tree, m.key, None)
        for m in (command.mutations if rows else ())
    )
    return CommandRecord(
        schema_id=command.schema_id,
        root_id=command.root_id,
        logical_shard_id=command.logical_shard_id,
        placement_generation=command.placement_generation,
        owner_epoch=command.owner_epoch,
        request_id=command.request_id,
        command_digest=command.command_digest,
        read_version=command.read_version,
        commit_version=commit_version,
        fence_install=command.fence_install,
        predicates=tuple(predicates),
        mutations=mutations,
        events=command.events,
        result=command.result,
    )


def command_payload(command: MetadataCommand, commit_version: int) -> bytes:
    """`_command_record(command, commit_version).encode()`, the command's logical outbox record,
    written row by row without a PredicateRow or MutationRow object per row: a GC batch's
    command has thousands, and building and encoding the objects was most of its record's cost.
    The header is encoded by the record's own codec; a row of any other shape than the ones
    written here (a subclass of a predicate, a key or value not of type bytes, ...) leaves it to
    the codec. tests/test_engine_command.py holds the two to the same bytes."""
    encoded = _command_record(command, commit_version, rows=False).encode()
    # version | header | u32 0 predicates | u32 0 mutations | events | result
    tail = _U32.pack(len(command.events)) + b"".join(_U32.pack(len(e)) + e for e in command.events)
    tail += _U32.pack(len(command.result)) + command.result
    head = len(encoded) - len(tail) - 8
    if head < 1 or encoded[head:] != bytes(8) + tail:
        return _command_record(command, commit_version).encode()
    parts = [encoded[:head], _U32.pack(len(command.predicates))]
    pack, trees = _U32.pack, _TREE_FIELDS
    try:
        for p in command.predicates:
            kind = type(p)
            tree = trees.get(p.tree) if p.tree.__class__ is str else None
            if tree is None or p.key.__class__ is not bytes:
                raise _NotPlain
            if kind is ValueEquals and p.value.__class__ is bytes:
                parts += (_VALUE_EQUALS, tree, pack(len(p.key)), p.key, _PRESENT, pack(len(p.value)), p.value, _NONE3)
            elif kind is Exists or kind is Absent:
                parts += (_EXISTS if kind is Exists else _ABSENT, tree, pack(len(p.key)), p.key, _NONE4)
            elif kind in _FIELD_KINDS:
                name, field, expected = p.record.__name__.encode(), p.field.encode(), p.expected_bytes()
                parts += (_FIELD_KINDS[kind], tree, pack(len(p.key)), p.key, _NONE, _PRESENT, pack(len(name)), name)
                parts += (_PRESENT, pack(len(field)), field, _PRESENT, pack(len(expected)), expected)
            else:
                raise _NotPlain
        parts.append(pack(len(command.mutations)))
        for m in command.mutations:
            kind = type(m)
            tree = trees.get(m.tree) if m.tree.__class__ is str else None
            if tree is None or m.key.__class__ is not bytes:
                raise _NotPlain
            if kind is Put and m.value.__class__ is bytes:
                parts += (_PUT, tree, pack(len(m.key)), m.key, _PRESENT, pack(len(m.value)), m.value)
            elif kind is Delete:
                parts += (_DELETE, tree, pack(len(m.key)), m.key, _NONE)
            else:
                raise _NotPlain
    except (_NotPlain, struct.error):  # struct.error: a length beyond a u32, which the codec refuses
        return _command_record(command, commit_version).encode()
    parts.append(tail)
    return b"".join(parts)


class _NotPlain(Exception):
    """A row command_payload leaves to the codec."""


# command_payload's pieces of PredicateRow (u8 kind, str tree, bytes key, then four optionals)
# and MutationRow (u8 kind, str tree, bytes key, optional value): a str or bytes field is its u32
# length and its bytes, an optional a u8 0 (absent) or 1 and its value.
_TREE_FIELDS = {name: _U32.pack(len(name.encode())) + name.encode() for name in family_keys.TREE_NAMES}
_VALUE_EQUALS = bytes([PredicateKind.ValueEquals])
_FIELD_KINDS = {
    FieldEquals: bytes([PredicateKind.FieldEquals]),
    Generation: bytes([PredicateKind.Generation]),
    State: bytes([PredicateKind.State]),
}
_EXISTS = bytes([PredicateKind.Exists])
_ABSENT = bytes([PredicateKind.Absent])
_PUT = bytes([MutationKind.Put])
_DELETE = bytes([MutationKind.Delete])
_PRESENT = b"\x01"
_NONE = b"\x00"
_NONE3 = bytes(3)
_NONE4 = bytes(4)


def command_from_record(record: CommandRecord) -> MetadataCommand:
    """Rebuild the exact MetadataCommand a logical outbox record describes (for replay)."""
    from nokvfs.schema.codec import ALL_RECORDS

    by_name = {r.__name__: r for r in ALL_RECORDS}
    predicates = []
    for row in record.predicates:
        if row.kind == PredicateKind.Exists:
            predicates.append(Exists(row.tree, row.key))
        elif row.kind == PredicateKind.Absent:
            predicates.append(Absent(row.tree, row.key))
        elif row.kind == PredicateKind.ValueEquals:
            predicates.append(ValueEquals(row.tree, row.key, row.value))
        else:
            rec = by_name.get(row.record_name)
            if rec is None:
                raise FormatError(f"outbox predicate names unknown record {row.record_name!r}")
            codec = dict(rec.__codec_fields__)[row.field]
            expected, end = codec.decode(row.expected, 0)
            if end != len(row.expected):
                raise FormatError("outbox predicate expected value has trailing bytes")
            cls = {PredicateKind.Generation: Generation, PredicateKind.State: State}.get(row.kind, FieldEquals)
            predicates.append(cls(row.tree, row.key, rec, row.field, expected))
    mutations = [
        Put(m.tree, m.key, m.value) if m.kind == MutationKind.Put else Delete(m.tree, m.key) for m in record.mutations
    ]
    return MetadataCommand(
        root_id=record.root_id,
        logical_shard_id=record.logical_shard_id,
        placement_generation=record.placement_generation,
        owner_epoch=record.owner_epoch,
        request_id=record.request_id,
        read_version=record.read_version,
        predicates=tuple(predicates),
        mutations=tuple(mutations),
        events=record.events,
        result=record.result,
        command_digest=record.command_digest,
        schema_id=record.schema_id,
        fence_install=record.fence_install,
    )
