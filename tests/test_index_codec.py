"""The secondary-index value codec: order, self-delimitation, round trips and fail-closed decode."""

from __future__ import annotations

import datetime as dt
import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.errors import (
    CorruptRecord,
    FormatError,
    IndexValueInvalid,
    InvalidInput,
    UnknownVersion,
)
from nokvfs.schema import index_codec as ic
from nokvfs.schema.index_codec import IndexKind, IndexValue

I64_MIN, I64_MAX, U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


# --- reference order ----------------------------------------------------------------------------
# Defined from first principles, independent of the encoding: kind first (in IndexKind order), then
# the natural order of the Python value. Python compares str by code point, which is UTF-8 byte order.


def ref_key(v: IndexValue):
    return (int(v.kind), 0 if v.value is None else v.value)


def sign(x) -> int:
    return (x > 0) - (x < 0)


def ref_cmp(a: IndexValue, b: IndexValue) -> int:
    ka, kb = ref_key(a), ref_key(b)
    return sign((ka > kb) - (ka < kb))


def enc_cmp(a: IndexValue, b: IndexValue) -> int:
    ea, eb = ic.encode(a), ic.encode(b)
    return (ea > eb) - (ea < eb)


# --- strategies -----------------------------------------------------------------------------------

# Bytes biased towards the escape-relevant values 0x00, 0x01 and 0xff.
_tricky_bytes = st.lists(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0xFE, 0xFF]), max_size=6).map(bytes)
_tricky_text = st.lists(
    st.sampled_from(["\x00", "\x01", "a", "b", "\x7f", "\u00e9", "\uffff", "\U0001f600", "\U0010ffff"]),
    max_size=5,
).map("".join)

KIND_STRATEGIES = {
    IndexKind.Null: st.just(ic.null()),
    IndexKind.Bool: st.booleans().map(ic.boolean),
    IndexKind.Int: st.one_of(st.integers(I64_MIN, I64_MAX), st.sampled_from([I64_MIN, I64_MAX, -1, 0, 1])).map(ic.int_),
    IndexKind.UInt: st.one_of(st.integers(0, U64_MAX), st.sampled_from([0, 1, U64_MAX, 2**63])).map(ic.uint),
    IndexKind.Float: st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308, -1.7976931348623157e308]),
    ).map(ic.float_),
    IndexKind.Timestamp: st.integers(I64_MIN, I64_MAX).map(ic.timestamp_ns),
    IndexKind.Bytes: st.one_of(st.binary(max_size=12), _tricky_bytes).map(ic.bytes_),
    IndexKind.String: st.one_of(st.text(max_size=12), _tricky_text).map(ic.string),
}

any_value = st.one_of(*KIND_STRATEGIES.values())
same_kind_pair = st.sampled_from(list(IndexKind)).flatmap(lambda k: st.tuples(KIND_STRATEGIES[k], KIND_STRATEGIES[k]))


# --- order ------------------------------------------------------------------------------------------


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(same_kind_pair)
def test_order_within_a_kind_matches_natural_order(pair):
    a, b = pair
    assert enc_cmp(a, b) == ref_cmp(a, b)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(any_value, any_value)
def test_order_across_kinds_is_kind_then_value(a, b):
    assert enc_cmp(a, b) == ref_cmp(a, b)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_value, max_size=30))
def test_sorting_by_encoding_equals_sorting_by_reference(values):
    assert [ref_key(v) for v in sorted(values, key=ic.encode)] == sorted(ref_key(v) for v in values)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(same_kind_pair, st.binary(max_size=6), st.binary(max_size=6))
def test_order_survives_arbitrary_following_key_bytes(pair, tail_a, tail_b):
    # An encoded value is followed by more key bytes (incarnation id, path): a strict order
    # between values must hold whatever follows them.
    a, b = pair
    c = ref_cmp(a, b)
    if c != 0:
        ea, eb = ic.encode(a) + tail_a, ic.encode(b) + tail_b
        assert ((ea > eb) - (ea < eb)) == c


def test_cross_kind_order_even_where_values_compare_numerically():
    # Kind dominates: Int 5 < UInt 0, UInt max < Float -1e308, Bool true < Int min.
    assert ic.encode(ic.int_(5)) < ic.encode(ic.uint(0))
    assert ic.encode(ic.uint(U64_MAX)) < ic.encode(ic.float_(-1.7976931348623157e308))
    assert ic.encode(ic.boolean(True)) < ic.encode(ic.int_(I64_MIN))
    assert ic.encode(ic.null()) < ic.encode(ic.boolean(False))
    assert ic.encode(ic.bytes_(b"\xff" * 8)) < ic.encode(ic.string(""))


def test_bytes_edge_order():
    ordered = [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\x00\xff", b"\x01", b"a", b"a\x00", b"ab", b"\xff"]
    encodings = [ic.encode(ic.bytes_(b)) for b in ordered]
    assert encodings == sorted(encodings)
    assert len(set(encodings)) == len(encodings)


def test_string_order_is_code_point_order_not_utf16():
    # U+FFFF is a BMP code point above the surrogate block; U+10000 needs a surrogate pair in
    # UTF-16 (so UTF-16 would put it first) but is the larger code point.
    assert ic.encode(ic.string("\uffff")) < ic.encode(ic.string("\U00010000"))


def test_float_edge_order():
    values = [-1.7976931348623157e308, -1.0, -5e-324, 0.0, 5e-324, 1.0, 1.7976931348623157e308]
    encodings = [ic.encode(ic.float_(f)) for f in values]
    assert encodings == sorted(encodings)


# --- round trip and self-delimitation ----------------------------------------------------------


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(any_value)
def test_round_trip(v):
    data = ic.encode(v)
    assert data[0] == ic.CODEC_VERSION
    assert data[1] == int(v.kind)
    assert ic.decode(data) == v
    assert ic.encode(ic.decode(data)) == data


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(any_value, st.binary(max_size=10), st.binary(max_size=4))
def test_decode_prefix_with_surrounding_bytes(v, tail, head):
    data = ic.encode(v)
    assert ic.decode_prefix(data + tail, 0) == (v, len(data))
    assert ic.decode_prefix(head + data + tail, len(head)) == (v, len(head) + len(data))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(any_value, max_size=8))
def test_concatenated_values_split_back(values):
    data = b"".join(ic.encode(v) for v in values)
    pos, out = 0, []
    while pos < len(data):
        v, pos = ic.decode_prefix(data, pos)
        out.append(v)
    assert out == values


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(any_value)
def test_every_strict_prefix_is_corrupt(v):
    data = ic.encode(v)
    for cut in range(len(data)):
        with pytest.raises(CorruptRecord):
            ic.decode_prefix(data[:cut], 0)


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=14).map(lambda b: b"\x01" + b))
def test_decode_is_canonical_or_fails_closed(data):
    # Any bytes either fail with a typed FormatError or are the unique encoding of their value.
    try:
        v = ic.decode(data)
    except FormatError:
        return
    assert ic.encode(v) == data


def test_negative_zero_normalised():
    assert ic.float_(-0.0) == ic.float_(0.0)
    assert math.copysign(1.0, ic.float_(-0.0).value) == 1.0
    assert ic.encode(ic.float_(-0.0)) == ic.encode(ic.float_(0.0))
    assert math.copysign(1.0, ic.decode(ic.encode(ic.float_(-0.0))).value) == 1.0


# --- golden bytes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, hex_bytes",
    [
        (ic.null(), "0101"),
        (ic.boolean(False), "010200"),
        (ic.boolean(True), "010201"),
        (ic.int_(0), "01038000000000000000"),
        (ic.int_(1), "01038000000000000001"),
        (ic.int_(-1), "01037fffffffffffffff"),
        (ic.int_(I64_MIN), "01030000000000000000"),
        (ic.int_(I64_MAX), "0103ffffffffffffffff"),
        (ic.uint(1), "01040000000000000001"),
        (ic.uint(U64_MAX), "0104ffffffffffffffff"),
        (ic.float_(1.0), "0105bff0000000000000"),
        (ic.float_(-1.0), "0105400fffffffffffff"),
        (ic.float_(0.0), "01058000000000000000"),
        (ic.float_(-0.0), "01058000000000000000"),
        (ic.timestamp_ns(0), "01068000000000000000"),
        (
            ic.timestamp_ns(1_700_000_000_000_000_000),
            "0106" + (1_700_000_000_000_000_000 + 2**63).to_bytes(8, "big").hex(),
        ),
        (ic.bytes_(b""), "01070000"),
        (ic.bytes_(b"a\x00b"), "01076100ff620000"),
        (ic.string(""), "01080000"),
        (ic.string("\u00e9"), "0108c3a90000"),
        (ic.string("a\x00"), "01086100ff0000"),
    ],
)
def test_golden_bytes(value, hex_bytes):
    assert ic.encode(value).hex() == hex_bytes
    assert ic.decode(bytes.fromhex(hex_bytes)) == value


def test_kind_tags_are_fixed():
    assert [(k.name, int(k)) for k in IndexKind] == [
        ("Null", 1), ("Bool", 2), ("Int", 3), ("UInt", 4),
        ("Float", 5), ("Timestamp", 6), ("Bytes", 7), ("String", 8),
    ]  # fmt: skip
    assert ic.CODEC_VERSION == 1


# --- rejected values -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -math.nan])
def test_non_finite_floats_rejected(bad):
    with pytest.raises(IndexValueInvalid):
        ic.float_(bad)
    with pytest.raises(IndexValueInvalid):
        ic.from_python(bad)
    with pytest.raises(IndexValueInvalid):
        IndexValue(IndexKind.Float, bad)


def test_int_range_limits():
    assert ic.int_(I64_MIN).value == I64_MIN
    assert ic.int_(I64_MAX).value == I64_MAX
    for bad in (I64_MAX + 1, I64_MIN - 1, 2**100):
        with pytest.raises(IndexValueInvalid):
            ic.int_(bad)
        with pytest.raises(IndexValueInvalid):
            ic.timestamp_ns(bad)
    assert ic.uint(0).value == 0 and ic.uint(U64_MAX).value == U64_MAX
    for bad in (-1, U64_MAX + 1):
        with pytest.raises(IndexValueInvalid):
            ic.uint(bad)


@pytest.mark.parametrize(
    "kind, value",
    [
        (IndexKind.Null, 0),
        (IndexKind.Bool, 1),
        (IndexKind.Int, True),
        (IndexKind.Int, 1.0),
        (IndexKind.UInt, False),
        (IndexKind.Timestamp, "0"),
        (IndexKind.Float, 1),
        (IndexKind.Bytes, "ab"),
        (IndexKind.Bytes, bytearray(b"ab")),
        (IndexKind.String, b"ab"),
        (IndexKind.String, "\ud800"),
        (0, None),
        (9, None),
    ],
)
def test_wrong_types_rejected(kind, value):
    with pytest.raises(IndexValueInvalid):
        IndexValue(kind, value)


def test_helpers_coerce_where_natural():
    assert ic.float_(3) == IndexValue(IndexKind.Float, 3.0)
    assert ic.bytes_(bytearray(b"x")) == IndexValue(IndexKind.Bytes, b"x")
    assert ic.bytes_(memoryview(b"x")).value == b"x"
    with pytest.raises(IndexValueInvalid):
        ic.string("lone \udc00 surrogate")
    with pytest.raises(IndexValueInvalid):
        ic.encode(5)  # encode takes an IndexValue, not a raw Python value
    assert issubclass(IndexValueInvalid, InvalidInput)


def test_from_python():
    assert ic.from_python(None) == ic.null()
    assert ic.from_python(True) == ic.boolean(True)
    assert ic.from_python(0) == ic.int_(0)
    assert ic.from_python(-(2**63)) == ic.int_(-(2**63))
    assert ic.from_python(2**63 - 1) == ic.int_(2**63 - 1)
    assert ic.from_python(2**63) == ic.uint(2**63)
    assert ic.from_python(2**64 - 1) == ic.uint(2**64 - 1)
    assert ic.from_python(1.5) == ic.float_(1.5)
    assert ic.from_python(b"x") == ic.bytes_(b"x")
    assert ic.from_python(bytearray(b"x")) == ic.bytes_(b"x")
    assert ic.from_python("x") == ic.string("x")
    assert ic.from_python(ic.uint(3)) == ic.uint(3)
    for bad in (2**64, -(2**63) - 1, object(), [1], {"a": 1}, dt.date(2020, 1, 1)):
        with pytest.raises(IndexValueInvalid):
            ic.from_python(bad)


def test_from_python_datetime():
    utc = dt.timezone.utc
    assert ic.from_python(dt.datetime(1970, 1, 1, tzinfo=utc)) == ic.timestamp_ns(0)
    assert ic.from_python(dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc)) == ic.timestamp_ns(-1000)
    stamp = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert ic.from_python(stamp).value == 1714972089_123456_000
    with pytest.raises(IndexValueInvalid):
        ic.from_python(dt.datetime(2024, 1, 1))  # naive
    with pytest.raises(IndexValueInvalid):
        ic.from_python(dt.datetime(9999, 1, 1, tzinfo=utc))  # beyond signed 64-bit nanoseconds


# --- corrupt and unknown inputs ------------------------------------------------------------------


def _float_payload(f: float) -> bytes:
    bits = struct.unpack(">Q", struct.pack(">d", f))[0]
    bits = bits ^ (2**64 - 1) if bits >> 63 else bits | (1 << 63)
    return bits.to_bytes(8, "big")


@pytest.mark.parametrize("data", [b"\x00\x01", b"\x02\x01", b"\xff\x08\x00\x00", b"\x00"])
def test_unknown_codec_version(data):
    with pytest.raises(UnknownVersion):
        ic.decode(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01",
        b"\x01\x00",  # tag 0 is not a kind
        b"\x01\x09",  # past the last kind
        b"\x01\xff",
        b"\x01\x02",  # Bool without payload
        b"\x01\x02\x02",  # Bool byte not 0/1
        b"\x01\x03\x80\x00",  # truncated Int
        b"\x01\x04" + b"\x00" * 7,  # truncated UInt
        b"\x01\x05" + _float_payload(0.0)[:7],
        b"\x01\x05\x7f\xff\xff\xff\xff\xff\xff\xff",  # -0.0: not canonical
        b"\x01\x05" + _float_payload(math.inf),
        b"\x01\x05" + _float_payload(-math.inf),
        b"\x01\x05" + _float_payload(math.nan),
        b"\x01\x05" + _float_payload(-math.nan),
        b"\x01\x07",  # Bytes, unterminated
        b"\x01\x07ab",
        b"\x01\x07ab\x00",  # NUL then end of data
        b"\x01\x07a\x00\x01\x00\x00",  # bad escape
        b"\x01\x07a\x00\xfe\x00\x00",
        b"\x01\x08\xff\x00\x00",  # String not UTF-8
        b"\x01\x08\xed\xa0\x80\x00\x00",  # encoded surrogate
        b"\x01\x01\x00",  # trailing byte after Null
        b"\x01\x07\x00\x00\x00",  # trailing byte after Bytes
    ],
)
def test_corrupt_inputs(data):
    with pytest.raises(CorruptRecord):
        ic.decode(data)


def test_decode_prefix_position_out_of_range():
    data = ic.encode(ic.null())
    with pytest.raises(CorruptRecord):
        ic.decode_prefix(data, len(data))
    with pytest.raises(CorruptRecord):
        ic.decode_prefix(data, -1)
