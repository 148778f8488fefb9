"""Extended attributes: a file's typed index fields, and the read-only `user.nokvfs.*` facts.

Index fields (the PathEntry's typed projection, `index.decoded`) are listed by listxattr and read
by getxattr as `user.nokv.<field name>`, with a textual value:

    Null       the empty value
    Bool       true | false
    Int, UInt  decimal
    Float      decimal, the shortest text that reads back as the same binary64 (Python's repr:
               1.5, 0.1, 1e-07, 1e+16)
    Timestamp  ISO-8601 UTC with a `Z`, fractional seconds only as long as needed (3, 6 or 9
               digits): 2024-05-01T12:00:00Z, 2024-05-01T12:00:00.250Z
    Bytes      lowercase hex
    String     its UTF-8 bytes

A field whose attribute name would exceed the kernel's 255-byte xattr name limit is not listed
(and cannot be asked for). The facts -- `user.nokvfs.generation` (path generation of a file,
workspace revision of a directory), `.revision`, `.digest`, `.content_type`, `.workbench`,
`.incarnation`, `.root`, and on a view's directory `.snapshot` or `.commit` -- answer getxattr but
are not listed, so cp -a and rsync -X copy only the index fields. Nothing can be set or removed:
setxattr/removexattr answer ENOTSUP (EROFS inside a read-only view).
"""

from __future__ import annotations

import datetime as _dt

from nokvfs.schema.index_codec import IndexKind, IndexValue
from nokvfs.workspace import index

INDEX_PREFIX = b"user.nokv."
XATTR_NAME_MAX = 255
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def iso_utc(ns: int) -> str:
    """Nanoseconds since the epoch as ISO-8601 UTC (`Z`), trailing zero groups of the fraction dropped."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    t = _EPOCH + _dt.timedelta(seconds=seconds)
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    if fraction:
        digits = f"{fraction:09d}"
        while digits.endswith("000"):
            digits = digits[:-3]
        text += "." + digits
    return text + "Z"


def text(value: IndexValue) -> bytes:
    """The textual xattr value of one typed index value."""
    kind = IndexKind(value.kind)
    if kind is IndexKind.Null:
        return b""
    if kind is IndexKind.Bool:
        return b"true" if value.value else b"false"
    if kind in (IndexKind.Int, IndexKind.UInt):
        return str(int(value.value)).encode()
    if kind is IndexKind.Float:
        return repr(float(value.value)).encode()
    if kind is IndexKind.Timestamp:
        return iso_utc(int(value.value)).encode()
    if kind is IndexKind.Bytes:
        return bytes(value.value).hex().encode()
    return str(value.value).encode("utf-8")


def _attribute_name(field: str) -> bytes:
    return INDEX_PREFIX + field.encode("utf-8")


def index_names(entry) -> list[bytes]:
    """The `user.nokv.<name>` attribute names of an entry's index fields, in field order."""
    out = []
    for field in entry.typed_index_projection:
        name = _attribute_name(field.name)
        if len(name) <= XATTR_NAME_MAX:
            out.append(name)
    return out


def index_value(entry, name: bytes) -> bytes | None:
    """The textual value of the index field an attribute name asks for, or None."""
    if not name.startswith(INDEX_PREFIX) or not entry.typed_index_projection:
        return None
    try:
        field = name[len(INDEX_PREFIX) :].decode("utf-8")
    except UnicodeDecodeError:
        return None
    value = index.decoded(entry).get(field)
    return None if value is None else text(value)
