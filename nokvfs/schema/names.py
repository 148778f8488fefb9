"""Validation of workbench ids, tag names and snapshot aliases."""

from __future__ import annotations

import re

from nokvfs.errors import NameInvalid

MAX_WORKBENCH_ID_BYTES = 128
MAX_LABEL_BYTES = 128  # tag names and snapshot aliases

_WORKBENCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def check_workbench_id(value: str) -> str:
    """ASCII letter or digit first, then letters, digits, '_' and '-'; at most 128 bytes."""
    if not isinstance(value, str):
        raise NameInvalid(f"workbench id must be a string, got {type(value).__name__}")
    if not value.isascii() or not _WORKBENCH_ID.fullmatch(value):
        raise NameInvalid(
            f"workbench id {value!r} must start with an ASCII letter or digit and contain only "
            "letters, digits, '_' and '-'"
        )
    if len(value) > MAX_WORKBENCH_ID_BYTES:
        raise NameInvalid(f"workbench id is {len(value)} bytes, more than {MAX_WORKBENCH_ID_BYTES}")
    return value


def _check_label(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise NameInvalid(f"{what} must be a string, got {type(value).__name__}")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise NameInvalid(f"{what} {value!r} is not encodable as UTF-8") from None
    if not encoded:
        raise NameInvalid(f"{what} is empty")
    if b"\x00" in encoded:
        raise NameInvalid(f"{what} contains NUL")
    if len(encoded) > MAX_LABEL_BYTES:
        raise NameInvalid(f"{what} is {len(encoded)} UTF-8 bytes, more than {MAX_LABEL_BYTES}")
    return value


def check_tag_name(value: str) -> str:
    return _check_label(value, "tag name")


def check_snapshot_alias(value: str) -> str:
    return _check_label(value, "snapshot alias")
