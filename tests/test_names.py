"""Workbench ids, tag names and snapshot aliases (seed: Ids, Names, And Keys)."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.errors import InvalidInput, NameInvalid
from nokvfs.schema.names import (
    MAX_LABEL_BYTES,
    MAX_WORKBENCH_ID_BYTES,
    check_snapshot_alias,
    check_tag_name,
    check_workbench_id,
)

SLOW_OK = [HealthCheck.too_slow]
_LEAD = string.ascii_letters + string.digits
_BODY = _LEAD + "_-"


# --- workbench id -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "Z", "0", "9abc", "a_b-c", "A--", "x_", "run-2024_01", "0-0"])
def test_valid_workbench_ids(value):
    assert check_workbench_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "", "_a", "-a", " a", "a b", "a.b", "a/b", "a\\b", "a\x00", "a\n", "a\t", "a:b", "a@b",
        "\u00e9", "a\u00e9", "\uff21", "\u0661",  # non-ASCII letters/digits (Arabic-Indic one)
        "a" * (MAX_WORKBENCH_ID_BYTES + 1),
    ],
)  # fmt: skip
def test_invalid_workbench_ids(value):
    with pytest.raises(NameInvalid):
        check_workbench_id(value)


@pytest.mark.parametrize("value", [None, 1, b"abc", ["a"]])
def test_workbench_id_must_be_a_str(value):
    with pytest.raises(NameInvalid):
        check_workbench_id(value)


def test_workbench_id_length_limit_exactly():
    assert MAX_WORKBENCH_ID_BYTES == 128
    assert check_workbench_id("a" * 128) == "a" * 128
    assert check_workbench_id("A" + "_-" * 63 + "z") == "A" + "_-" * 63 + "z"  # 128 characters
    with pytest.raises(NameInvalid):
        check_workbench_id("a" * 129)


def test_workbench_ids_are_case_sensitive():
    # Both spellings are valid and returned unchanged: no folding makes them the same id.
    assert check_workbench_id("Build") == "Build"
    assert check_workbench_id("build") == "build"
    assert check_workbench_id("BUILD") != check_workbench_id("build")


@settings(max_examples=1000, suppress_health_check=SLOW_OK)
@given(st.text(max_size=140))
def test_workbench_id_rule_matches_reference(value):
    # Reference, straight from the seed's bullet list.
    ok = 0 < len(value.encode("utf-8")) <= 128 and value[0] in _LEAD and all(ch in _BODY for ch in value)
    if ok:
        assert check_workbench_id(value) == value
    else:
        with pytest.raises(NameInvalid):
            check_workbench_id(value)


@settings(max_examples=300)
@given(st.text(alphabet=_LEAD, min_size=1, max_size=1), st.text(alphabet=_BODY, max_size=127))
def test_generated_valid_workbench_ids(lead, body):
    assert check_workbench_id(lead + body) == lead + body


# --- tag names and snapshot aliases -----------------------------------------------------------

LABEL_CHECKS = [check_tag_name, check_snapshot_alias]


@pytest.mark.parametrize("check", LABEL_CHECKS)
@pytest.mark.parametrize(
    "value",
    ["v1", "release/2024", "with space", " ", "_", "-", ".", "..", "\u00e9", "\U0001f600", "a\\b", "\x01", "\n"],
)
def test_valid_labels(check, value):
    assert check(value) == value


@pytest.mark.parametrize("check", LABEL_CHECKS)
@pytest.mark.parametrize("value", ["", "\x00", "a\x00b", "\ud800", "a\udfff", "x" * 129])
def test_invalid_labels(check, value):
    with pytest.raises(NameInvalid):
        check(value)


@pytest.mark.parametrize("check", LABEL_CHECKS)
@pytest.mark.parametrize("value", [None, 1, b"v1"])
def test_labels_must_be_str(check, value):
    with pytest.raises(NameInvalid):
        check(value)


@pytest.mark.parametrize("check", LABEL_CHECKS)
def test_label_limit_is_in_utf8_bytes(check):
    assert MAX_LABEL_BYTES == 128
    assert check("x" * 128) == "x" * 128
    assert check("\u00e9" * 64) == "\u00e9" * 64  # 128 bytes
    assert check("\u20ac" * 42 + "ab") == "\u20ac" * 42 + "ab"  # 126 + 2 bytes
    assert check("\U0001f600" * 32) == "\U0001f600" * 32  # 128 bytes
    for over in ("x" * 129, "\u00e9" * 64 + "a", "\u20ac" * 43, "\U0001f600" * 32 + "a"):
        assert len(over) <= 129
        with pytest.raises(NameInvalid):
            check(over)


@pytest.mark.parametrize("check", LABEL_CHECKS)
def test_labels_case_sensitive_and_not_normalised(check):
    assert check("Stable") != check("stable")
    assert check("caf\u00e9") != check("cafe\u0301")


@settings(max_examples=500, suppress_health_check=SLOW_OK)
@given(st.text(max_size=140))
def test_label_rule_matches_reference(value):
    raw = value.encode("utf-8")
    ok = 0 < len(raw) <= 128 and b"\x00" not in raw
    for check in LABEL_CHECKS:
        if ok:
            assert check(value) == value
        else:
            with pytest.raises(NameInvalid):
                check(value)


def test_name_invalid_is_invalid_input():
    assert issubclass(NameInvalid, InvalidInput)
