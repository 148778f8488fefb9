"""The one path normalizer and the ordered path key (seed: Ids, Names, And Keys)."""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.errors import InvalidInput, PathInvalid
from nokvfs.schema.paths import (
    MAX_COMPONENTS,
    MAX_PATH_BYTES,
    check_component,
    join,
    normalize_path,
    ordered_component,
    ordered_path,
    ordered_path_of,
    path_bytes,
    subtree_prefix,
    unordered_path,
)

SLOW_OK = [HealthCheck.too_slow]


# --- reference order, from first principles ------------------------------------------------------
# The seed: "The resulting order is a/NUL subtree, exact a, then longer siblings such as a\u{1} and
# ab". So paths compare component by component, each component by its UTF-8 bytes (a component
# that is a byte prefix of another sorts first: a < a\x01 < ab); when one path is a proper prefix
# of the other (same components up to the shorter length), the longer one -- a member of the
# shorter one's subtree -- sorts BEFORE the shorter exact path: a/x < a.


def ref_cmp(c: tuple[str, ...], d: tuple[str, ...]) -> int:
    for x, y in zip(c, d):
        if x != y:
            bx, by = x.encode("utf-8"), y.encode("utf-8")
            return -1 if bx < by else 1
    if len(c) == len(d):
        return 0
    return -1 if len(c) > len(d) else 1


def key_cmp(c: tuple[str, ...], d: tuple[str, ...]) -> int:
    kc, kd = ordered_path(c), ordered_path(d)
    return (kc > kd) - (kc < kd)


# --- strategies -----------------------------------------------------------------------------------

# A small alphabet makes shared prefixes, prefix components and multi-byte boundaries common.
_ALPHABET = [
    "a",
    "b",
    "\x01",
    "\x7f",
    ".",
    " ",
    "A",
    "\u00e9",
    "e\u0301",
    "\u0080",
    "\uffff",
    "\U0001f600",
    "\U0010ffff",
]
_small_component = st.lists(st.sampled_from(_ALPHABET), min_size=1, max_size=3).map("".join)
_any_component = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\x00"),
    min_size=1,
    max_size=8,
)
components = st.one_of(_small_component, _any_component).filter(lambda c: c not in (".", ".."))
paths = st.lists(components, min_size=1, max_size=4).map(tuple)


def _shared_prefix_pair(draw_source):
    base, extra_a, extra_b = draw_source
    return base + extra_a, base + extra_b


path_pairs = st.one_of(
    st.tuples(paths, paths),
    # Force common ancestors so prefix/subtree relations are well covered.
    st.tuples(
        st.lists(components, max_size=2).map(tuple),
        st.lists(components, max_size=2).map(tuple),
        st.lists(components, max_size=2).map(tuple),
    )
    .filter(lambda t: t[0] + t[1] and t[0] + t[2])
    .map(_shared_prefix_pair),
)


# --- order ------------------------------------------------------------------------------------------


def test_seed_order_sentence():
    # a/NUL subtree first (all of a's descendants), then exact a, then the longer siblings.
    expected = [("a", "x"), ("a", "\U0010ffff", "z"), ("a",), ("a\x01", "b"), ("a\x01",), ("ab",), ("b",)]
    keys = [ordered_path(p) for p in expected]
    assert keys == sorted(keys)
    assert sorted(expected, key=functools.cmp_to_key(ref_cmp)) == expected


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(path_pairs)
def test_key_order_equals_reference_order(pair):
    c, d = pair
    assert key_cmp(c, d) == ref_cmp(c, d)


@settings(max_examples=300, suppress_health_check=SLOW_OK)
@given(st.lists(paths, max_size=25))
def test_sorting_keys_sorts_paths_in_reference_order(items):
    by_key = sorted(items, key=ordered_path)
    by_ref = sorted(items, key=functools.cmp_to_key(ref_cmp))
    assert by_key == by_ref


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(path_pairs)
def test_no_exact_key_is_a_strict_prefix_of_another(pair):
    c, d = pair
    kc, kd = ordered_path(c), ordered_path(d)
    if c != d:
        assert not kd.startswith(kc) and not kc.startswith(kd)
    else:
        assert kc == kd


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(path_pairs)
def test_subtree_prefix_matches_exactly_the_descendants(pair):
    c, d = pair
    is_descendant = len(d) > len(c) and d[: len(c)] == c
    assert ordered_path(d).startswith(subtree_prefix(c)) == is_descendant


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(paths, paths)
def test_subtree_is_one_contiguous_range_just_before_the_exact_row(c, d):
    # c's descendants are exactly the keys in [subtree_prefix(c), ordered_path(c)).
    prefix, exact, key = subtree_prefix(c), ordered_path(c), ordered_path(d)
    is_descendant = len(d) > len(c) and d[: len(c)] == c
    assert (prefix <= key < exact) == is_descendant


def test_subtree_prefix_never_matches_a_longer_sibling():
    assert not ordered_path(("ab",)).startswith(subtree_prefix(("a",)))
    assert not ordered_path(("ab", "c")).startswith(subtree_prefix(("a",)))
    assert not ordered_path(("a",)).startswith(subtree_prefix(("a",)))
    assert not ordered_path(("a\x01", "c")).startswith(subtree_prefix(("a",)))
    assert ordered_path(("a", "b")).startswith(subtree_prefix(("a",)))
    assert subtree_prefix(()) == b""


# --- key bytes and round trips ----------------------------------------------------------------------


def test_ordered_bytes():
    assert ordered_component("a") == b"b"
    assert ordered_component("\x01") == b"\x02"
    assert ordered_component("\u00e9") == b"\xc4\xaa"  # c3 a9 + 1
    assert ordered_path(("a", "bc")) == b"b\x00cd\x01"
    assert ordered_path(("a",)) == b"b\x01"
    assert path_bytes(("a", "bc")) == b"b\x00cd"
    assert subtree_prefix(("a", "bc")) == b"b\x00cd\x00"


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(paths)
def test_round_trip(c):
    key = ordered_path(c)
    assert unordered_path(key) == c
    assert normalize_path(join(c)) == c
    assert normalize_path(join(c).encode("utf-8")) == c
    assert ordered_path_of(join(c)) == key
    assert path_bytes(c) + b"\x01" == key
    assert len(key) == len(join(c).encode("utf-8")) + 1  # length-preserving
    for part in c:
        raw, shifted = part.encode("utf-8"), ordered_component(part)
        assert shifted == bytes(b + 1 for b in raw)
        assert 0x00 not in shifted and 0x01 not in shifted


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b"b",  # no terminator
        b"\x01",  # empty component
        b"b\x01\x01",  # 0x01 before the end
        b"b\x00\x01",  # empty trailing component
        b"\x00b\x01",  # empty leading component
        b"b\x00\x00c\x01",  # empty middle component
        b"\xc4\x01",  # c3 alone: not UTF-8
        b"0\x01",  # '/'
        b"/\x01",  # '.'
        b"//\x01",  # '..'
        b"]\x01",  # backslash
    ],
)
def test_unordered_path_rejects_non_keys(key):
    with pytest.raises(PathInvalid):
        unordered_path(key)


def test_unordered_path_enforces_the_normalizer_limits():
    at_limit = tuple(["a"] * MAX_COMPONENTS)
    assert unordered_path(ordered_path(at_limit)) == at_limit
    with pytest.raises(PathInvalid):
        unordered_path(ordered_path(at_limit + ("a",)))
    longest = ("a" * MAX_PATH_BYTES,)
    assert unordered_path(ordered_path(longest)) == longest
    with pytest.raises(PathInvalid):
        unordered_path(ordered_path(("a" * (MAX_PATH_BYTES + 1),)))


# --- normalizer rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, expected",
    [
        ("a", ("a",)),
        ("a/b/c", ("a", "b", "c")),
        ("...", ("...",)),
        (".a/a./..b", (".a", "a.", "..b")),
        (" a /b ", (" a ", "b ")),
        ("\U0001f600/\u00e9", ("\U0001f600", "\u00e9")),
        ("a:b|c*?", ("a:b|c*?",)),
        ("\x01\x7f", ("\x01\x7f",)),
        (b"a/b", ("a", "b")),
        ("\u00e9".encode("utf-8"), ("\u00e9",)),
    ],
)
def test_valid_paths(path, expected):
    assert normalize_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "", b"",
        "/", "/a", "//a", b"/a",  # relative only
        "a/", "a//b", "a///", "/a/",  # empty components
        ".", "..", "./a", "a/.", "a/../b", "../a", b"a/./b",
        "a\\b", "\\", "a/\\/b", b"a\\b",  # backslash
        "a\x00b", "\x00", b"a\x00b", b"a/\x00",  # NUL
        b"\xff", b"a\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",  # not UTF-8
        "\ud800", "a/\udc00b",  # not encodable
        None, 5, ["a"], ("a",), bytearray(b"a"),  # not a path type
    ],
)  # fmt: skip
def test_invalid_paths(path):
    with pytest.raises(PathInvalid):
        normalize_path(path)


def test_path_invalid_is_invalid_input():
    assert issubclass(PathInvalid, InvalidInput)


def test_byte_limit_exactly_at_and_past():
    assert normalize_path("a" * MAX_PATH_BYTES) == ("a" * MAX_PATH_BYTES,)
    with pytest.raises(PathInvalid):
        normalize_path("a" * (MAX_PATH_BYTES + 1))
    # Counted in UTF-8 bytes, not characters, and separators count.
    assert normalize_path("\u00e9" * (MAX_PATH_BYTES // 2)) == ("\u00e9" * 2048,)
    with pytest.raises(PathInvalid):
        normalize_path("\u00e9" * (MAX_PATH_BYTES // 2) + "a")
    with pytest.raises(PathInvalid):
        normalize_path("\u20ac" * 1366)  # 1366 characters, 4098 bytes
    at_limit = "/".join(["a" * 63] * 64)  # 64 * 63 + 63 = 4095 bytes
    assert len(at_limit) == 4095
    assert len(normalize_path(at_limit + "b")) == 64
    with pytest.raises(PathInvalid):
        normalize_path(at_limit + "bc")
    with pytest.raises(PathInvalid):
        normalize_path(("a" * (MAX_PATH_BYTES + 1)).encode())


def test_component_limit_exactly_at_and_past():
    assert normalize_path("/".join(["a"] * MAX_COMPONENTS)) == tuple(["a"] * MAX_COMPONENTS)
    with pytest.raises(PathInvalid):
        normalize_path("/".join(["a"] * (MAX_COMPONENTS + 1)))
    assert MAX_COMPONENTS == 64 and MAX_PATH_BYTES == 4096


def test_no_unicode_normalisation_or_case_folding():
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert normalize_path(nfc) == (nfc,) and normalize_path(nfd) == (nfd,)
    assert ordered_path_of(nfc) != ordered_path_of(nfd)
    assert normalize_path("Readme/A") == ("Readme", "A")
    assert ordered_path_of("A") != ordered_path_of("a")
    # Fullwidth and compatibility forms are kept as written too.
    assert normalize_path("\uff21\ufb01") == ("\uff21\ufb01",)


@settings(max_examples=500, suppress_health_check=SLOW_OK)
@given(st.text(max_size=12))
def test_normalizer_validates_and_never_repairs(text):
    # Either the exact text is accepted (join gives it back) or PathInvalid names a rule.
    try:
        result = normalize_path(text)
    except PathInvalid:
        return
    assert join(result) == text


@pytest.mark.parametrize("component", ["", ".", "..", "a/b", "a\\b", "a\x00"])
def test_check_component_rejects(component):
    with pytest.raises(PathInvalid):
        check_component(component)


def test_distinct_paths_have_distinct_keys():
    sample = ["a", "b", "a/b", "ab", "a\x01", "a/b/c", "A", "\u00e9", "e\u0301", "a b"]
    keys = {ordered_path_of(p) for p in sample}
    assert len(keys) == len(sample)
    for p, q in itertools.permutations(sample, 2):
        assert ordered_path_of(p) != ordered_path_of(q)
