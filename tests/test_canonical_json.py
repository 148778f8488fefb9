"""Canonical JSON: RFC 8785 vectors, the exact-integer rule of 003 section 3.1, strict parsing."""

from __future__ import annotations

import decimal
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.errors import CanonicalJsonError
from nokvfs.schema import canonical_json as cj

SLOW_OK = [HealthCheck.too_slow]

# --- RFC 8785 Appendix B: number serialization samples (IEEE-754 bits -> JSON text) ---------------

APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),  # round to even
]


def _double(hex_bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(hex_bits))[0]


@pytest.mark.parametrize("hex_bits, expected", APPENDIX_B)
def test_appendix_b_number_serialization(hex_bits, expected):
    value = _double(hex_bits)
    assert cj.es_number_to_string(value) == expected
    assert cj.dumps(value, allow_float=True) == expected.encode()
    assert cj.dumps([value], allow_float=True) == f"[{expected}]".encode()


@pytest.mark.parametrize("hex_bits", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_appendix_b_nan_and_infinity_rejected(hex_bits):
    value = _double(hex_bits)
    with pytest.raises(CanonicalJsonError):
        cj.es_number_to_string(value)
    with pytest.raises(CanonicalJsonError):
        cj.dumps(value, allow_float=True)
    with pytest.raises(CanonicalJsonError):
        cj.dumps(value)


@pytest.mark.parametrize(
    "value, expected",
    [
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (-0.0, "0"),
        (1.5e-7, "1.5e-7"),
        (123e-20, "1.23e-18"),
        (0.1, "0.1"),
        (100.0, "100"),
        (-1.0, "-1"),
        (4.5, "4.5"),
        (2e-3, "0.002"),
        (1e30, "1e+30"),
        (5e-324, "5e-324"),
        (123456789012345680000.0, "123456789012345680000"),
    ],
)
def test_es_number_forms(value, expected):
    assert cj.es_number_to_string(value) == expected


@settings(max_examples=2000)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_es_number_round_trips_and_uses_exponent_only_outside_es_range(value):
    text = cj.es_number_to_string(value)
    assert float(text) == value
    magnitude = abs(value)
    uses_exponent = "e" in text
    assert uses_exponent == (magnitude != 0 and (magnitude >= 1e21 or magnitude < 1e-6))
    # No superfluous characters: no '+' in plain form, no trailing zeros in a fraction.
    if "." in text:
        mantissa = text.split("e")[0]
        assert not mantissa.endswith("0") and not mantissa.endswith(".")

    # The digit string is the shortest that round-trips (Python's repr has the same digits).
    def digits(s):
        return s.split("e")[0].replace("-", "").replace(".", "").strip("0")

    assert digits(text) == digits(repr(magnitude)) or value == 0


# --- RFC 8785 section 3.2.2 / 3.2.3 examples -------------------------------------------------------


def test_rfc8785_section_3_2_2_example():
    source = (
        b'{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        b' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        b' "literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    ).encode("utf-8")
    assert cj.dumps(cj.loads(source, allow_float=True), allow_float=True) == expected
    assert cj.is_canonical(expected, allow_float=True)
    # Under the default (003) rules the same document is malformed: it carries fractions.
    with pytest.raises(CanonicalJsonError):
        cj.loads(source)


def test_rfc8785_section_3_2_3_sorting_example():
    source = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    expected_order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    out = cj.dumps(source)
    assert list(cj.loads(out)) == expected_order
    assert out == (
        "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + json.dumps(source[k]) for k in expected_order) + "}"
    ).encode("utf-8")


def test_astral_sorts_before_bmp_above_e000():
    # Code-point order would put U+E000 and U+FFFF first; UTF-16 code units put the surrogate
    # pair (0xd800..) first, as RFC 8785 requires.
    out = cj.dumps({"\uffff": 1, "\ue000": 2, "\U00010000": 3, "\U0010ffff": 4, "\ud7ff": 5})
    assert list(cj.loads(out)) == ["\ud7ff", "\U00010000", "\U0010ffff", "\ue000", "\uffff"]


def test_cyberphone_vectors():
    # From the JCS reference test data (arrays, french, unicode, structures, weird).
    assert cj.dumps(cj.loads(b'[\n  56,\n  {\n    "d": true,\n    "10": null,\n    "1": [ ]\n  }\n]')) == (
        b'[56,{"1":[],"10":null,"d":true}]'
    )
    french = {"peach": "This sorting order", "p\u00e9ch\u00e9": "is wrong according to French",
              "p\u00eache": "but canonicalization MUST", "sin": "ignore locale"}  # fmt: skip
    assert list(cj.loads(cj.dumps(french))) == ["peach", "p\u00e9ch\u00e9", "p\u00eache", "sin"]
    assert cj.dumps(cj.loads(b'{"Unnormalized Unicode":"A\\u030a"}')) == (
        '{"Unnormalized Unicode":"A\u030a"}'.encode("utf-8")
    )
    structures = (
        b'{"1": {"f": {"f": "hi","F": 5} ,"\\n": 56.0},"10": { },"": "empty","a": { },'
        b'"111": [ {"e": "yes","E": "no" } ],"A": { }}'
    )
    assert cj.dumps(cj.loads(structures, allow_float=True), allow_float=True) == (
        b'{"":"empty","1":{"\\n":56,"f":{"F":5,"f":"hi"}},"10":{},"111":[{"E":"no","e":"yes"}],"A":{},"a":{}}'
    )
    weird = {
        "\u20ac": "Euro Sign", "\r": "Carriage Return", "\n": "Newline", "1": "One",
        "\u0080": "Control\u007f", "\U0001f602": "Smiley", "\u00f6": "Latin Small Letter O With Diaeresis",
        "\ufb33": "Hebrew Letter Dalet With Dagesh", "</script>": "Browser Challenge",
    }  # fmt: skip
    assert cj.dumps(weird) == (
        '{"\\n":"Newline","\\r":"Carriage Return","1":"One","</script>":"Browser Challenge",'
        '"\u0080":"Control\u007f","\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
        '"\U0001f602":"Smiley","\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    ).encode("utf-8")


# --- strings ----------------------------------------------------------------------------------


def test_string_escapes_exactly_as_json_stringify():
    controls = "".join(chr(c) for c in range(0x20))
    out = cj.dumps(controls + '"\\/\x7f\u2028\u2029\u00e9\U0001f600')
    assert out == (
        '"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f'
        "\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c"
        '\\u001d\\u001e\\u001f\\"\\\\/\x7f\u2028\u2029\u00e9\U0001f600"'
    ).encode("utf-8")


@pytest.mark.parametrize("bad", ["\ud800", "a\udfff", "\udc00\ud800"])
def test_lone_surrogates_rejected_on_dump(bad):
    with pytest.raises(CanonicalJsonError):
        cj.dumps(bad)
    with pytest.raises(CanonicalJsonError):
        cj.dumps({bad: 1})


@pytest.mark.parametrize(
    "bad",
    [b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\u0041"', b'"\\ud800x"', b'"\\udbff\\ud800"', b'"\\ude00\\ud83d"'],
)
def test_lone_surrogate_escapes_rejected_on_load(bad):
    with pytest.raises(CanonicalJsonError):
        cj.loads(bad)


def test_surrogate_pair_escape_loads_as_one_character():
    assert cj.loads(b'"\\ud83d\\ude00"') == "\U0001f600"
    assert cj.loads(b'"\\uD83D\\uDE00"') == "\U0001f600"
    assert not cj.is_canonical(b'"\\ud83d\\ude00"')
    assert cj.is_canonical('"\U0001f600"'.encode())


@pytest.mark.parametrize(
    "bad",
    [
        b'"\xff"',
        b'"\xc0\xaf"',  # overlong '/'
        b'"\xed\xa0\x80"',  # UTF-8-encoded surrogate
        b'"\xe2\x82"',  # truncated sequence
        b'"\xf4\x90\x80\x80"',  # above U+10FFFF
    ],
)
def test_invalid_utf8_rejected(bad):
    with pytest.raises(CanonicalJsonError):
        cj.loads(bad)


@pytest.mark.parametrize(
    "bad",
    [b'"\x01"', b'"a\nb"', b'"\t"', b'"\\x"', b'"\\u12"', b'"\\u12g4"', b'"abc', b'"\\', b'"\\u"', b"'a'"],
)
def test_malformed_strings_rejected(bad):
    with pytest.raises(CanonicalJsonError):
        cj.loads(bad)


# --- integers: exact, never through binary64 (003 section 3.1) -----------------------------------


@pytest.mark.parametrize(
    "value",
    [2**63 + 1, 2**64 - 1, -(2**63), 2**53 + 1, 1_730_000_000_000_000_001, -(2**63) + 1, 0, -1],
)
def test_exact_integers(value):
    text = str(value).encode()
    assert cj.dumps(value) == text
    parsed = cj.loads(text)
    assert type(parsed) is int and parsed == value
    assert cj.is_canonical(text)


def test_big_integer_is_not_rounded_through_binary64():
    value = 2**63 + 1
    assert float(value) == float(2**63)  # binary64 cannot hold it...
    assert cj.dumps({"t": value}) == b'{"t":9223372036854775809}'  # ...the canonical form can
    assert cj.loads(b'{"t":9223372036854775809}')["t"] == value


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30, -(10**30)])
def test_integers_outside_range_rejected(value):
    with pytest.raises(CanonicalJsonError):
        cj.dumps(value)
    with pytest.raises(CanonicalJsonError):
        cj.loads(str(value).encode())


def test_huge_integer_literal_rejected_cleanly():
    with pytest.raises(CanonicalJsonError):
        cj.loads(b"1" * 10_000)


def test_int_subclasses_and_bools():
    assert cj.dumps(True) == b"true" and cj.dumps(False) == b"false" and cj.dumps(None) == b"null"
    assert cj.dumps([1, True, 0, False]) == b"[1,true,0,false]"
    assert cj.loads(b"[1,true]") == [1, True] and type(cj.loads(b"true")) is bool


@pytest.mark.parametrize("value", [1.0, 0.5, -0.0, 1e300, 2.0**64])
def test_floats_rejected_by_default(value):
    with pytest.raises(CanonicalJsonError):
        cj.dumps(value)
    with pytest.raises(CanonicalJsonError):
        cj.dumps({"a": [value]})


@pytest.mark.parametrize("literal", [b"1.0", b"1e2", b"1E2", b"-0.5", b"0e0", b"1e-2", b"[1,2.5]", b'{"a":1E+2}'])
def test_non_integer_literals_rejected_by_default(literal):
    with pytest.raises(CanonicalJsonError):
        cj.loads(literal)
    assert not cj.is_canonical(literal)


def test_allow_float_reads_fractions_and_out_of_range_integers_as_binary64():
    assert cj.loads(b"1.5", allow_float=True) == 1.5
    assert cj.loads(b"1e2", allow_float=True) == 100.0
    assert cj.loads(b"295147905179352830000", allow_float=True) == 295147905179352830000.0
    assert type(cj.loads(b"5", allow_float=True)) is int
    with pytest.raises(CanonicalJsonError):
        cj.loads(b"1e400", allow_float=True)


@pytest.mark.parametrize("bad", [b"01", b"+1", b"-", b"1.", b".5", b"0x10", b"1e", b"--1", b"- 1", b"Infinity", b"NaN"])
def test_malformed_numbers_rejected(bad):
    with pytest.raises(CanonicalJsonError):
        cj.loads(bad)
    with pytest.raises(CanonicalJsonError):
        cj.loads(bad, allow_float=True)


def test_negative_zero_integer_parses_but_is_not_canonical():
    assert cj.loads(b"-0") == 0
    assert not cj.is_canonical(b"-0")
    assert cj.is_canonical(b"0")


# --- structure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [b'{"a":1,"a":2}', b'{"a":1,"\\u0061":2}', b'{"x":{"b":1,"b":1}}', b'[{"":1,"":1}]'],
)
def test_duplicate_names_rejected(bad):
    with pytest.raises(CanonicalJsonError, match="duplicate"):
        cj.loads(bad)


@pytest.mark.parametrize(
    "bad",
    [
        b"", b" ", b"{} {}", b"1 2", b"[]x", b"[1,]", b"[,1]", b'{"a":1,}', b'{"a"}', b'{"a" 1}', b"{1:2}",
        b"[1", b"{", b"nul", b"tru", b"nullx", b"\xef\xbb\xbf{}", b"\x00", b"{}\x00", b"[1]\n]",
    ],
)  # fmt: skip
def test_malformed_documents_rejected(bad):
    with pytest.raises(CanonicalJsonError):
        cj.loads(bad)


def test_whitespace_accepted_but_not_canonical():
    assert cj.loads(b' \t\r\n{ "b" : [ 1 , 2 ] , "a" : null } \n') == {"b": [1, 2], "a": None}
    assert not cj.is_canonical(b'{"a": null}')
    assert not cj.is_canonical(b'{"b":1,"a":2}')  # unsorted
    assert not cj.is_canonical(b'"\\/"')
    assert not cj.is_canonical(b'"\\u0041"')
    assert not cj.is_canonical(b'"\\u001F"')  # uppercase hex escape
    assert cj.is_canonical(b'"\\u001f"')
    assert not cj.is_canonical(b"[1] ")
    assert not cj.is_canonical(b"not json")
    assert cj.is_canonical(b'{"a":null,"b":[1,2]}')


@pytest.mark.parametrize(
    "bad",
    [
        {1: "a"},
        {("a",): 1},
        {b"a": 1},
        {1, 2},
        b"bytes",
        bytearray(b"x"),
        object(),
        decimal.Decimal("1"),
        1j,
        {"a": {None: 1}},
    ],
)
def test_unsupported_types_rejected(bad):
    with pytest.raises(CanonicalJsonError):
        cj.dumps(bad)


def test_tuple_is_an_array():
    assert cj.dumps(("a", (1, 2), [])) == b'["a",[1,2],[]]'


def test_loads_takes_bytes_only():
    with pytest.raises(CanonicalJsonError):
        cj.loads("{}")
    assert cj.loads(bytearray(b"[]")) == [] and cj.loads(memoryview(b"{}")) == {}


def test_depth_limit_is_symmetric():
    deep = []
    for _ in range(cj.MAX_DEPTH - 1):
        deep = [deep]
    text = cj.dumps(deep)
    assert text == b"[" * cj.MAX_DEPTH + b"]" * cj.MAX_DEPTH
    assert cj.loads(text) == deep
    with pytest.raises(CanonicalJsonError):
        cj.dumps([deep])
    with pytest.raises(CanonicalJsonError):
        cj.loads(b"[" * (cj.MAX_DEPTH + 1) + b"]" * (cj.MAX_DEPTH + 1))
    with pytest.raises(CanonicalJsonError):
        cj.loads(b'{"a":' * (cj.MAX_DEPTH + 1) + b"1" + b"}" * (cj.MAX_DEPTH + 1))


def test_cycles_rejected():
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(CanonicalJsonError):
        cj.dumps(cyclic)


# --- properties -------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


def utf16_units(s: str) -> list[int]:
    """UTF-16 code units of s, computed arithmetically (independent of the codec)."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp < 0x10000:
            units.append(cp)
        else:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
    return units


def _check_sorted(value) -> None:
    if isinstance(value, dict):
        names = list(value)
        assert names == sorted(names, key=utf16_units)
        for item in value.values():
            _check_sorted(item)
    elif isinstance(value, list):
        for item in value:
            _check_sorted(item)


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(json_values)
def test_round_trip(value):
    data = cj.dumps(value)
    assert cj.loads(data) == value
    assert cj.is_canonical(data)
    _check_sorted(cj.loads(data))  # dicts keep parse order: the wire order


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(json_values, st.integers(min_value=0, max_value=3))
def test_agrees_with_stdlib_json(value, indent):
    # The stdlib writes and reads the same documents non-canonically; both parsers agree, and
    # canonicalising the stdlib's text yields our bytes.
    loose = json.dumps(value, indent=indent or None, ensure_ascii=bool(indent % 2)).encode("utf-8")
    assert cj.loads(loose) == json.loads(loose)
    assert cj.dumps(cj.loads(loose)) == cj.dumps(value)
    # The stdlib's string escaping with ensure_ascii=False is exactly JSON.stringify's.
    if isinstance(value, str):
        assert cj.dumps(value) == json.dumps(value, ensure_ascii=False).encode("utf-8")


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=8))
def test_key_order_is_utf16_code_unit_order(value):
    assert list(cj.loads(cj.dumps(value))) == sorted(value, key=utf16_units)


@settings(max_examples=500, suppress_health_check=SLOW_OK)
@given(st.recursive(
    st.one_of(json_scalars, st.floats(allow_nan=False, allow_infinity=False)),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=3), c, max_size=3)),
    max_leaves=10,
))  # fmt: skip
def test_float_mode_is_idempotent(value):
    data = cj.dumps(value, allow_float=True)
    assert cj.is_canonical(data, allow_float=True)
    reparsed = cj.loads(data, allow_float=True)
    assert cj.dumps(reparsed, allow_float=True) == data


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(st.binary(max_size=16))
def test_loads_fails_only_with_canonical_json_error(data):
    try:
        cj.loads(data)
    except CanonicalJsonError:
        pass


@given(st.floats())
def test_float_never_leaks_into_default_mode(value):
    with pytest.raises(CanonicalJsonError):
        cj.dumps({"x": value})
