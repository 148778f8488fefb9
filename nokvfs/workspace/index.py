"""Typed index fields and search over them.

Publication takes `index_fields` (name -> typed value), validates and encodes them with the
order-preserving index codec, and the final publish command writes them into PathEntry's typed
projection and the SecondaryIndex rows (root | index id | encoded value | incarnation | ordered
path) together. Search seeks that keyspace by encoded value, so equality and range queries cost
the matching rows, never a scan of the namespace; hits are rechecked against the workbench's
incarnation and the path's generation at the read version. Search cursors are frozen: they bind
the query digest, the read version and the last key, and a continuation at another version is a
typed ReadVersionStale.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

from nokvfs.errors import IndexValueInvalid, InvalidInput, ReadVersionStale
from nokvfs.schema import index_codec, keys
from nokvfs.schema.paths import join
from nokvfs.schema.records import IndexField, PathEntry, SecondaryIndex
from nokvfs.workspace import attributes
from nokvfs.workspace import workbench as wb

MAX_FIELDS = 32


def fields(values: dict) -> tuple:
    """name -> value (None, bool, int, float, str, bytes, aware datetime, or an IndexValue)."""
    if len(values) > MAX_FIELDS:
        raise IndexValueInvalid(f"at most {MAX_FIELDS} index fields per artifact")
    out = []
    for name in sorted(values):
        value = values[name]
        typed = value if isinstance(value, index_codec.IndexValue) else index_codec.from_python(value)
        _check_name(name)
        out.append(IndexField(name=name, encoded_value=index_codec.encode(typed)))
    return tuple(out)


MAX_NAME_BYTES = 255


def _check_name(name) -> str:
    if not isinstance(name, str):
        raise IndexValueInvalid(f"index field names are strings, not {type(name).__name__}")
    raw = name.encode("utf-8", "surrogatepass")
    if not raw or len(raw) > MAX_NAME_BYTES or b"\x00" in raw or not name.isprintable():
        raise IndexValueInvalid(f"index field name {name!r} must be 1-{MAX_NAME_BYTES} printable UTF-8 bytes")
    if attributes.is_reserved_field(name):
        raise IndexValueInvalid(
            f"index field names starting {attributes.RESERVED_FIELD_PREFIX!r} are reserved: {name!r}"
        )
    return name


def decoded(entry: PathEntry) -> dict:
    """The user fields of a PathEntry's typed projection as name -> IndexValue (reserved fields,
    such as the POSIX attributes, are not index fields a user set)."""
    return {f.name: index_codec.decode(f.encoded_value) for f in attributes.user_fields(entry.typed_index_projection)}


@dataclass(frozen=True)
class Hit:
    path: str
    entry: PathEntry
    value: index_codec.IndexValue


@dataclass(frozen=True)
class SearchPage:
    hits: tuple
    read_version: int
    cursor: str | None


def _encode(value) -> bytes:
    typed = value if isinstance(value, index_codec.IndexValue) else index_codec.from_python(value)
    return index_codec.encode(typed)


def search(
    root,
    workbench_id: str,
    field: str,
    *,
    equals=None,
    lower=None,
    upper=None,
    include_lower: bool = True,
    include_upper: bool = False,
    cursor: str | None = None,
    limit: int = 100,
) -> SearchPage:
    """Paths whose `field` equals a value, or lies in a range (default [lower, upper))."""
    if not 1 <= limit <= 10_000:
        raise InvalidInput("limit must be between 1 and 10000")
    if equals is not None and (lower is not None or upper is not None):
        raise InvalidInput("give equals or a range, not both")
    base = keys.secondary_index_prefix(root.root_id, _check_name(field))
    if equals is not None:
        low, low_inclusive, high, high_inclusive = _encode(equals), True, _encode(equals), True
    else:
        low = None if lower is None else _encode(lower)
        high = None if upper is None else _encode(upper)
        low_inclusive, high_inclusive = include_lower, include_upper
    query = hashlib.sha256(
        b"nokv.search.v1\0"
        + workbench_id.encode()
        + b"\0"
        + base
        + b"\0"
        + repr((low, low_inclusive, high, high_inclusive)).encode()
    ).digest()[:16]
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        if cursor is not None:
            position = _decode_cursor(cursor, query, view.version) + b"\x00"
        elif low is None:
            position = base
        elif low_inclusive:
            position = base + low
        else:
            position = _after_prefix(base + low)
        hits = []
        last = None
        while len(hits) < limit:
            found = view.seek("secondary_index", position, within=base)
            if found is None:
                last = None
                break
            key, value = found
            decoded_key = keys.SecondaryIndexKey.decode(key)
            encoded = decoded_key.encoded_value
            if high is not None and (encoded > high or (encoded == high and not high_inclusive)):
                last = None
                break
            last = key
            position = key + b"\x00"
            if decoded_key.workspace_incarnation_id != workbench.incarnation_id:
                continue
            raw = view.get(
                "path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, decoded_key.path)
            )
            if raw is None:
                continue
            entry = PathEntry.decode(raw)
            if entry.generation != SecondaryIndex.decode(value).path_generation:
                continue
            hits.append(Hit(join(decoded_key.path), entry, index_codec.decode(encoded)))
        next_cursor = None if last is None else _encode_cursor(query, view.version, last)
        return SearchPage(tuple(hits), view.version, next_cursor)


def _after_prefix(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (FoundationDB's strinc).

    Encoded values are self-delimiting, so the rows of one value are exactly the keys with
    prefix base | encoded value, and any greater value's rows sort at or after this.
    """
    bumped = bytearray(prefix)
    while bumped and bumped[-1] == 0xFF:
        bumped.pop()
    if not bumped:
        raise InvalidInput("no key follows an all-0xff prefix")
    bumped[-1] += 1
    return bytes(bumped)


def _encode_cursor(query: bytes, version: int, key: bytes) -> str:
    return base64.urlsafe_b64encode(query + struct.pack(">Q", version) + key).decode().rstrip("=")


def _decode_cursor(cursor: str, query: bytes, version: int) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, TypeError):
        raise InvalidInput("malformed search cursor") from None
    if len(raw) < 24 or raw[:16] != query:
        raise InvalidInput("the cursor belongs to another search")
    frozen = struct.unpack_from(">Q", raw, 16)[0]
    if frozen != version:
        raise ReadVersionStale(
            f"the search cursor is frozen at version {frozen}; the root is at {version}",
            expected=frozen,
            current=version,
        )
    return raw[24:]
