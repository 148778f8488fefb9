"""The versioned, order-preserving, self-delimiting secondary-index value codec.

The seed: "A secondary index never concatenates an unescaped value: each index declares a versioned,
order-preserving codec for null, boolean, signed/unsigned integer, finite float, timestamp, bytes,
and string values." An encoded value sits in the middle of a SecondaryIndex key
(root_id | index_id | encoded_value | workspace_incarnation_id | ordered(path)), so it must

* order exactly like the values it encodes (byte order of encodings == kind-then-value order), and
* be self-delimiting, so the key bytes after it can be split off and never change that order.

Layout of one encoded value, codec version 1:

    u8 CODEC_VERSION (= 1) | u8 tag (= IndexKind value) | payload

    Null       no payload
    Bool       0x00 (false) or 0x01 (true)
    Int        signed 64-bit, sign bit flipped, 8 bytes big-endian
    UInt       unsigned 64-bit, 8 bytes big-endian
    Float      IEEE-754 binary64 with the order transform (negative: invert every bit;
               non-negative: flip the sign bit), 8 bytes big-endian. NaN and +-infinity are
               rejected. -0.0 is normalised to 0.0, so both have one encoding (that of 0.0) and
               decode to 0.0; the encoding of -0.0 is not canonical and fails to decode.
    Timestamp  signed 64-bit nanoseconds since the Unix epoch, encoded like Int
    Bytes      the bytes with every 0x00 escaped as 0x00 0xff, then the terminator 0x00 0x00
    String     its UTF-8 bytes, escaped and terminated like Bytes

Values of different kinds order by tag (the IndexKind order below); within a kind they order
naturally (bytes lexicographically, strings by UTF-8 bytes, which is code-point order). The
terminator 0x00 0x00 sorts below both an escaped NUL (0x00 0xff) and every other byte, so a
shorter byte string sorts before its extensions whatever follows it in the key.
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from nokvfs.errors import CorruptRecord, IndexValueInvalid, UnknownVersion

CODEC_VERSION = 1

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1

_SIGN_BIT = 1 << 63
_ALL_ONES = U64_MAX
_ESCAPED_NUL = b"\x00\xff"
_TERMINATOR = b"\x00\x00"
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_ONE_MICROSECOND = _dt.timedelta(microseconds=1)


class IndexKind(IntEnum):
    """The value kinds, in their cross-kind sort order. The discriminant is the encoded tag."""

    Null = 1
    Bool = 2
    Int = 3
    UInt = 4
    Float = 5
    Timestamp = 6
    Bytes = 7
    String = 8


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class IndexValue:
    """One typed index value. Construction validates, so every IndexValue is encodable."""

    kind: IndexKind
    value: Any = None

    def __post_init__(self) -> None:
        try:
            kind = IndexKind(self.kind)
        except ValueError:
            raise IndexValueInvalid(f"unknown index value kind {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        v = self.value
        if kind is IndexKind.Null:
            if v is not None:
                raise IndexValueInvalid(f"Null index value carries {v!r}")
        elif kind is IndexKind.Bool:
            if not isinstance(v, bool):
                raise IndexValueInvalid(f"Bool index value must be a bool, got {type(v).__name__}")
        elif kind in (IndexKind.Int, IndexKind.Timestamp):
            if not _is_int(v):
                raise IndexValueInvalid(f"{kind.name} index value must be an int, got {v!r}")
            if not I64_MIN <= v <= I64_MAX:
                raise IndexValueInvalid(f"{kind.name} index value {v} is outside signed 64-bit")
            object.__setattr__(self, "value", int(v))
        elif kind is IndexKind.UInt:
            if not _is_int(v):
                raise IndexValueInvalid(f"UInt index value must be an int, got {v!r}")
            if not 0 <= v <= U64_MAX:
                raise IndexValueInvalid(f"UInt index value {v} is outside unsigned 64-bit")
            object.__setattr__(self, "value", int(v))
        elif kind is IndexKind.Float:
            if not isinstance(v, float):
                raise IndexValueInvalid(f"Float index value must be a float, got {v!r}")
            if not math.isfinite(v):
                raise IndexValueInvalid(f"Float index value must be finite, got {v!r}")
            # -0.0 == 0.0 numerically; give both one encoding (see the module docstring).
            object.__setattr__(self, "value", 0.0 if v == 0.0 else float(v))
        elif kind is IndexKind.Bytes:
            if not isinstance(v, bytes):
                raise IndexValueInvalid(f"Bytes index value must be bytes, got {type(v).__name__}")
            object.__setattr__(self, "value", bytes(v))
        else:  # String
            if not isinstance(v, str):
                raise IndexValueInvalid(f"String index value must be a str, got {type(v).__name__}")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise IndexValueInvalid(
                    f"String index value is not encodable as UTF-8 at character {exc.start}"
                ) from None


# --- constructors -----------------------------------------------------------------------------


def null() -> IndexValue:
    return IndexValue(IndexKind.Null, None)


def boolean(b: bool) -> IndexValue:
    return IndexValue(IndexKind.Bool, b)


def int_(i: int) -> IndexValue:
    return IndexValue(IndexKind.Int, i)


def uint(u: int) -> IndexValue:
    return IndexValue(IndexKind.UInt, u)


def float_(f: float) -> IndexValue:
    if _is_int(f):
        f = float(f)
    return IndexValue(IndexKind.Float, f)


def timestamp_ns(ns: int) -> IndexValue:
    return IndexValue(IndexKind.Timestamp, ns)


def bytes_(b: bytes | bytearray | memoryview) -> IndexValue:
    if isinstance(b, (bytearray, memoryview)):
        b = bytes(b)
    return IndexValue(IndexKind.Bytes, b)


def string(s: str) -> IndexValue:
    return IndexValue(IndexKind.String, s)


def timestamp_from_datetime(value: _dt.datetime) -> IndexValue:
    """An aware datetime as exact nanoseconds since the epoch (datetimes have microseconds)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise IndexValueInvalid("a naive datetime has no defined instant; attach a timezone")
    return timestamp_ns(((value - _EPOCH) // _ONE_MICROSECOND) * 1000)


def from_python(x: Any) -> IndexValue:
    """Map a plain Python value to its natural kind.

    None -> Null, bool -> Bool, int -> Int (UInt when 2**63 <= x < 2**64), float -> Float,
    bytes-like -> Bytes, str -> String, aware datetime -> Timestamp. An IndexValue passes through.
    """
    if isinstance(x, IndexValue):
        return x
    if x is None:
        return null()
    if isinstance(x, bool):
        return boolean(x)
    if isinstance(x, int):
        if x > I64_MAX:
            return uint(x)  # range-checked by the constructor
        return int_(x)
    if isinstance(x, float):
        return float_(x)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes_(x)
    if isinstance(x, str):
        return string(x)
    if isinstance(x, _dt.datetime):
        return timestamp_from_datetime(x)
    raise IndexValueInvalid(f"no index value kind for {type(x).__name__}")


# --- encoding ---------------------------------------------------------------------------------


def _float_to_ordered(f: float) -> int:
    bits = struct.unpack(">Q", struct.pack(">d", f))[0]
    return bits ^ _ALL_ONES if bits & _SIGN_BIT else bits | _SIGN_BIT


def _ordered_to_float(bits: int) -> float:
    raw = bits & ~_SIGN_BIT if bits & _SIGN_BIT else bits ^ _ALL_ONES
    return struct.unpack(">d", struct.pack(">Q", raw))[0]


def _escape(data: bytes) -> bytes:
    return data.replace(b"\x00", _ESCAPED_NUL) + _TERMINATOR


def encode(v: IndexValue) -> bytes:
    """The codec-version byte, the kind tag, then the order-preserving payload."""
    if not isinstance(v, IndexValue):
        raise IndexValueInvalid(f"encode takes an IndexValue, got {type(v).__name__}")
    head = bytes((CODEC_VERSION, v.kind))
    kind = v.kind
    if kind is IndexKind.Null:
        return head
    if kind is IndexKind.Bool:
        return head + (b"\x01" if v.value else b"\x00")
    if kind in (IndexKind.Int, IndexKind.Timestamp):
        return head + (v.value + _SIGN_BIT).to_bytes(8, "big")
    if kind is IndexKind.UInt:
        return head + v.value.to_bytes(8, "big")
    if kind is IndexKind.Float:
        return head + _float_to_ordered(v.value).to_bytes(8, "big")
    if kind is IndexKind.Bytes:
        return head + _escape(v.value)
    return head + _escape(v.value.encode("utf-8"))


# --- decoding ---------------------------------------------------------------------------------


def _fixed8(data: bytes, pos: int, kind: IndexKind) -> int:
    end = pos + 8
    if end > len(data):
        raise CorruptRecord(f"{kind.name} index value truncated at byte {pos}")
    return int.from_bytes(data[pos:end], "big")


def _unescape(data: bytes, pos: int, kind: IndexKind) -> tuple[bytes, int]:
    out = bytearray()
    while True:
        nul = data.find(b"\x00", pos)
        if nul < 0 or nul + 1 >= len(data):
            raise CorruptRecord(f"{kind.name} index value is not terminated")
        out += data[pos:nul]
        marker = data[nul + 1]
        if marker == 0x00:
            return bytes(out), nul + 2
        if marker != 0xFF:
            raise CorruptRecord(f"{kind.name} index value has bad escape 0x00 0x{marker:02x}")
        out.append(0)
        pos = nul + 2


def decode_prefix(data: bytes, pos: int = 0) -> tuple[IndexValue, int]:
    """Decode one value starting at `pos`; return it and the offset just past it."""
    data = bytes(data)
    if pos < 0 or pos >= len(data):
        raise CorruptRecord(f"index value truncated: no codec version byte at {pos}")
    if data[pos] != CODEC_VERSION:
        raise UnknownVersion(f"index value codec version {data[pos]} is not {CODEC_VERSION}")
    if pos + 1 >= len(data):
        raise CorruptRecord("index value truncated: no type tag")
    tag = data[pos + 1]
    try:
        kind = IndexKind(tag)
    except ValueError:
        raise CorruptRecord(f"index value has unknown type tag 0x{tag:02x}") from None
    pos += 2
    if kind is IndexKind.Null:
        return null(), pos
    if kind is IndexKind.Bool:
        if pos >= len(data):
            raise CorruptRecord("Bool index value truncated")
        if data[pos] > 1:
            raise CorruptRecord(f"Bool index value byte 0x{data[pos]:02x} is not 0 or 1")
        return boolean(data[pos] == 1), pos + 1
    if kind in (IndexKind.Int, IndexKind.Timestamp):
        return IndexValue(kind, _fixed8(data, pos, kind) - _SIGN_BIT), pos + 8
    if kind is IndexKind.UInt:
        return uint(_fixed8(data, pos, kind)), pos + 8
    if kind is IndexKind.Float:
        f = _ordered_to_float(_fixed8(data, pos, kind))
        if not math.isfinite(f):
            raise CorruptRecord(f"Float index value decodes to non-finite {f!r}")
        if f == 0.0 and math.copysign(1.0, f) < 0:
            raise CorruptRecord("Float index value is the non-canonical encoding of -0.0")
        return float_(f), pos + 8
    raw, pos = _unescape(data, pos, kind)
    if kind is IndexKind.Bytes:
        return bytes_(raw), pos
    try:
        return string(raw.decode("utf-8")), pos
    except UnicodeDecodeError:
        raise CorruptRecord("String index value is not valid UTF-8") from None


def decode(data: bytes) -> IndexValue:
    """Decode exactly one value; trailing bytes are corrupt."""
    value, end = decode_prefix(data, 0)
    if end != len(data):
        raise CorruptRecord(f"index value followed by {len(data) - end} trailing bytes")
    return value
