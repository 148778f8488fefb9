"""The row envelope: every value the engine stores is sealed, and verified whenever it is read.

    stored value = u8 envelope version (1) | u64 checksum (big-endian) | value
                 | u8 envelope version (2) | u64 checksum | u32 len(value) | u8 len(tail)
                   | zlib stream of the value but its tail | tail (the value's last bytes, raw)
    checksum     = xxh3-64, seed 0, of  u8 len(tree name) | tree name | u32 len(key) | key | body
                   (body: everything after the checksum)

Version 2 holds the value deflated with the preset dictionary of nokvfs.engine.compression: it is
written only for the trees of DEFLATED_TREES and only when it is smaller. Readers get the value
itself either way; the checksum is verified before anything is inflated.

The checksum binds the value to its tree and key, so a changed byte anywhere in the value, a
value moved under another key or tree, and a key changed under its value all fail the check. It
costs one xxh3 pass over the row (O(1) per row read, a few hundred nanoseconds for a typical
row), which is why every read path -- point gets, scans, MVCC reads through History, the recovery
outbox, System rows -- verifies the rows it uses before decoding them: damage is a typed
RowCorrupt, never wrong bytes served. xxh3-64 is not a cryptographic digest and need not be: it
guards against damage, not against an adversary who can write the file (the outbox chain and the
object store's SHA-256 digests are the integrity identities).

The store-wide schema marker gates the format: value_format_version 2 means every row is sealed.
A store written before the envelope (value_format_version 1) is refused when opened.
"""

from __future__ import annotations

import collections
import functools
import struct

import lmdb
import xxhash

from nokvfs.engine import compression
from nokvfs.errors import NokvError, RowCorrupt, ShardCorrupt, StoreError, StoreFull
from nokvfs.schema import keys as family_keys

ENVELOPE_VERSION = 1
DEFLATED_ENVELOPE_VERSION = 2
ENVELOPE_BYTES = 1 + 8
_U32 = struct.Struct(">I")
_DEFLATED_HEAD = struct.Struct(">IB")  # len(value), len(tail)
_VERSION = bytes([ENVELOPE_VERSION])
_DEFLATED = bytes([DEFLATED_ENVELOPE_VERSION])
_hash = xxhash.xxh3_64_digest

# The families whose rows are stored deflated when that is smaller -- rows a small publish adds
# for good that are not read on every lookup (PathCurrent is, and is rewritten in place, not
# added) -- each with the length of the tail kept raw. An ArtifactRevision is appended, then
# rewritten in place when its references or state change: its last 33 bytes (state, reference
# epoch and count, last-zero version, created version: fixed width) stay raw, so a rewrite keeps
# the row's size and does not split the full page its creation was appended to (a wholly
# deflated row grew by a few bytes there: more pages, not fewer). Operation rows use fixed
# Huffman codes: opening a root scans them all (compression.deflate_row).
DEFLATED_TREES = {"operation": (0, True), "artifact_manifest": (0, False), "artifact_revision": (33, False)}


def _tree_prefix(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes([len(raw)]) + raw


# Every tree of the registry (families and the three reserved trees).
_PREFIXES = {name: _tree_prefix(name) for name in family_keys.TREE_NAMES}


def checksum(tree: str, key: bytes, value: bytes) -> bytes:
    """The row's checksum: bound to its tree and key, so a value moved elsewhere does not verify."""
    return _hash(_PREFIXES[tree] + _U32.pack(len(key)) + key + value)


def seal(tree: str, key: bytes, value: bytes, *, previous: tuple[bytes, bytes] | None = None) -> bytes:
    """The stored form of `value` at `key` in `tree` (deflated for DEFLATED_TREES when smaller).
    `previous`: (value, stored form) of the row this one replaces; when the new value differs from
    it only in the raw tail, its deflated head is reused rather than deflated again (the same
    bytes: deflating is deterministic)."""
    spec = DEFLATED_TREES.get(tree)
    if spec is not None and len(value) > spec[0]:
        tail, fixed = spec
        head = value[: len(value) - tail]
        reused = _reused_head(head, tail, previous)
        if reused is not None:
            body = reused + value[len(head) :]
            _remember(body, value)
            return _DEFLATED + checksum(tree, key, body) + body
        deflated = compression.deflate_row(head, fixed=fixed)
        if deflated is not None and len(deflated) + _DEFLATED_HEAD.size < len(head):
            body = _DEFLATED_HEAD.pack(len(value), tail) + deflated + value[len(head) :]
            _remember(body, value)
            return _DEFLATED + checksum(tree, key, body) + body
    return _VERSION + checksum(tree, key, value) + value


def _reused_head(head: bytes, tail: int, previous: tuple[bytes, bytes] | None) -> bytes | None:
    """The deflated body of `previous` without its raw tail (its length header and stream), if
    `previous` is a verified deflated row of the same length, tail length and head."""
    if previous is None:
        return None
    old_value, old_stored = previous
    if old_stored[0] != DEFLATED_ENVELOPE_VERSION or len(old_value) != len(head) + tail:
        return None
    if old_stored[ENVELOPE_BYTES + _DEFLATED_HEAD.size - 1] != tail or not old_value.startswith(head):
        return None
    return old_stored[ENVELOPE_BYTES : len(old_stored) - tail]


def unseal(tree: str, key: bytes, stored: bytes | None) -> bytes | None:
    """The value sealed in `stored` (None stays None), or RowCorrupt if it fails its check."""
    if stored is None:
        return None
    # Every row read passes here: a sound row of either version is checked and returned in one
    # frame (the checks of _checked_body, in its order); anything else goes through it, which
    # says what is wrong.
    if len(stored) >= ENVELOPE_BYTES:
        version = stored[0]
        body = stored[ENVELOPE_BYTES:]
        if _hash(_PREFIXES[tree] + _U32.pack(len(key)) + key + body) == stored[1:ENVELOPE_BYTES]:
            if version == ENVELOPE_VERSION:
                return body
            if version == DEFLATED_ENVELOPE_VERSION:
                # Only bodies that passed _checked_body's checks of the deflated header are
                # remembered (sealed here, or inflated by inflate_body).
                value = _INFLATED.get(body)
                if value is not None:
                    return value
    body = _checked_body(tree, key, stored)
    if stored[0] == ENVELOPE_VERSION:
        return body
    try:
        return inflate_body(body)
    except ValueError as exc:
        raise _corrupt(tree, key, f"a deflated value that does not inflate: {exc}") from None


def inflate_body(body: bytes) -> bytes:
    """The value a deflated envelope's body (what follows its checksum) holds, or ValueError."""
    value = _INFLATED.get(body)
    if value is not None:
        return value
    if len(body) < _DEFLATED_HEAD.size:
        raise ValueError("a deflated value shorter than its length")
    length, tail = _DEFLATED_HEAD.unpack_from(body)
    if tail > min(length, len(body) - _DEFLATED_HEAD.size):
        raise ValueError("a deflated value whose raw tail is longer than it")
    head = compression.inflate(
        body[_DEFLATED_HEAD.size : len(body) - tail], length - tail, window_bits=compression.ROW_WINDOW_BITS
    )
    value = head + body[len(body) - tail :]
    _remember(body, value)
    return value


def deflated_body(stored: bytes) -> bytes | None:
    """The body of `stored` (a row already verified) if it is deflated, raw tail included: what a
    History value may keep as it is (nokvfs.engine.history), else None."""
    if stored[0] != DEFLATED_ENVELOPE_VERSION:
        return None
    return stored[ENVELOPE_BYTES:]


# The values of the deflated bodies most recently written or inflated: a row is often read again
# soon after it was written or read (a command's predicate reads the row its builder read; the
# next command reads what the last one wrote), and a lookup costs a tenth of inflating. A body
# maps to exactly one value (it is inflated with fixed parameters, its length bound in it) and
# is only looked up once its checksum verified, so the tree and key need not be part of the key.
# Bounded: at most _INFLATED_ROWS values of at most _INFLATED_VALUE_BYTES each (a few MB). An
# OrderedDict, whose every use here is one call under the GIL, so threads may share it.
_INFLATED: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
_INFLATED_ROWS = 4096
_INFLATED_VALUE_BYTES = 2048


def _remember(body: bytes, value: bytes) -> None:
    if len(value) > _INFLATED_VALUE_BYTES:
        return
    if len(_INFLATED) >= _INFLATED_ROWS:
        try:
            _INFLATED.popitem(last=False)  # the oldest entry
        except KeyError:  # another thread emptied it
            pass
    _INFLATED[body] = value


def verify(tree: str, key: bytes, stored: bytes) -> None:
    """RowCorrupt unless `stored` is a sound envelope whose checksum matches its tree and key:
    `unseal` without inflating a deflated value (for rows checked, not used: the neighbours of
    a lookup's landing point)."""
    # Every miss verifies two rows: a sound row passes in one frame (the checks of
    # _checked_body); anything else goes through it, which says what is wrong.
    if len(stored) >= ENVELOPE_BYTES:
        body = stored[ENVELOPE_BYTES:]
        if _hash(_PREFIXES[tree] + _U32.pack(len(key)) + key + body) == stored[1:ENVELOPE_BYTES]:
            version = stored[0]
            if version == ENVELOPE_VERSION:
                return
            if version == DEFLATED_ENVELOPE_VERSION and len(body) >= _DEFLATED_HEAD.size:
                length, tail = _DEFLATED_HEAD.unpack_from(body)
                if tail <= min(length, len(body) - _DEFLATED_HEAD.size):
                    return
    _checked_body(tree, key, stored)


def _checked_body(tree: str, key: bytes, stored: bytes) -> bytes:
    """What follows the checksum of `stored`, its envelope and checksum verified."""
    version = stored[0] if stored else None
    if len(stored) < ENVELOPE_BYTES or version not in (ENVELOPE_VERSION, DEFLATED_ENVELOPE_VERSION):
        if version is not None and version not in (ENVELOPE_VERSION, DEFLATED_ENVELOPE_VERSION):
            why = f"an unknown row envelope version {version}"
        else:
            why = f"{len(stored)} bytes, shorter than the row envelope"
        raise _corrupt(tree, key, why)
    body = stored[ENVELOPE_BYTES:]
    if checksum(tree, key, body) != stored[1:ENVELOPE_BYTES]:
        raise _corrupt(tree, key, "a checksum that does not match its tree, key and value")
    if version == DEFLATED_ENVELOPE_VERSION:
        if len(body) < _DEFLATED_HEAD.size:
            raise _corrupt(tree, key, "a deflated value shorter than its length")
        length, tail = _DEFLATED_HEAD.unpack_from(body)
        if tail > min(length, len(body) - _DEFLATED_HEAD.size):
            raise _corrupt(tree, key, "a deflated value whose raw tail is longer than it")
    return body


def _corrupt(tree: str, key: bytes, why: str) -> RowCorrupt:
    shown = key.hex() if len(key) <= 48 else key[:48].hex() + "..."
    return RowCorrupt(f"row {shown} of tree {tree} has {why}: it was changed outside the engine", tree=tree, key=key)


def get(txn, db, tree: str, key: bytes) -> bytes | None:
    """The verified value at `key`, or None. A miss also verifies the rows on both sides of where
    the key would be, so a row whose key bytes were damaged (and so no longer matches its own
    lookup) is RowCorrupt rather than silently absent."""
    found = get_stored(txn, db, tree, key)
    return None if found is None else found[0]


def get_stored(txn, db, tree: str, key: bytes) -> tuple[bytes, bytes] | None:
    """(the verified value, its stored form) at `key`, or None, verified as `get` verifies: what
    a write replacing the row passes to `put` as `previous`."""
    raw = txn.get(key, db=db)
    if raw is not None:
        return unseal(tree, key, raw), raw
    verify_neighbours(txn.cursor(db), tree, key)
    return None


def verify_neighbours(cursor, tree: str, key: bytes) -> None:
    """Verify the first row at or after `key` and the row before it (moves `cursor`)."""
    found = cursor.set_range(key)
    if found:
        verify(tree, *cursor.item())
    if cursor.prev() if found else cursor.last():
        verify(tree, *cursor.item())


def put(
    txn,
    db,
    tree: str,
    key: bytes,
    value: bytes,
    *,
    overwrite: bool = True,
    append: bool = False,
    previous: tuple[bytes, bytes] | None = None,
) -> bool:
    """Store `value` sealed. `append`: the key sorts after every key of the tree (LMDB then
    fills pages instead of splitting them in half); False is returned if it does not.
    `previous`: the replaced row as `get_stored` returned it (see `seal`)."""
    return txn.put(key, seal(tree, key, value, previous=previous), db=db, overwrite=overwrite, append=append)


def put_new(txn, db, tree: str, key: bytes, value: bytes) -> None:
    """Store `value` sealed at `key`, which the tree does not hold: appended when the key sorts
    after every key of the tree (LMDB then fills pages instead of splitting them in half), else
    put in its place; sealed once either way (sealing a deflated tree's row deflates it)."""
    stored = seal(tree, key, value)
    if not txn.put(key, stored, db=db, append=True):
        txn.put(key, stored, db=db)


def iterate(cursor, tree: str, start: bytes | None = None):
    """(key, verified value) from `start` (the first row when None) to the end of the tree."""
    found = cursor.first() if start is None else cursor.set_range(start)
    while found:
        key = cursor.key()
        yield key, unseal(tree, key, cursor.value())
        found = cursor.next()


# What LMDB reports when its own file is damaged (a bad meta page, a page number past the end,
# a page of the wrong kind, ...): the shard is corrupt, not merely unavailable.
_LMDB_CORRUPTION = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.PanicError,
    lmdb.BadChecksumError,
    lmdb.IncompatibleError,
    lmdb.CursorFullError,
    lmdb.ProblemError,
)


def translate_lmdb_error(exc: lmdb.Error) -> NokvError:
    """The typed error for an LMDB failure: damage is ShardCorrupt, a full map or disk StoreFull."""
    if isinstance(exc, _LMDB_CORRUPTION):
        return ShardCorrupt(f"LMDB reports the shard's file damaged: {exc}")
    if isinstance(exc, (lmdb.MapFullError, lmdb.DiskError)) or "No space left" in str(exc):
        return StoreFull(f"the shard's LMDB map or disk is full: {exc}")
    return StoreError(f"LMDB failed: {exc}")


def lmdb_errors_translated(func):
    """Raise LMDB's own failures as typed nokvfs errors (translate_lmdb_error)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except lmdb.Error as exc:
            raise translate_lmdb_error(exc) from None

    return wrapper
