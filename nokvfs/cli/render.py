r"""Text and JSON formatting of workbenches, path entries and listings.

JSON is always `sort_keys`, ids and raw bytes are lowercase hex, enums are their names, times are
both `mtime_ms` (Unix milliseconds) and `mtime` (ISO-8601 UTC, millisecond precision, `Z`). A
file's mtime is the creation time of its artifact revision (the UUIDv7 timestamp of the revision
id): a put or an append moves it, a rename keeps it.

Safe output. Names and every other user-controlled text (paths, tag names, aliases, notes,
producers, content types, index values, URLs, error messages) go through `safe()` before they
are printed in human-readable form, so a name cannot move the cursor, recolour or clear the
terminal, or reorder what follows it with a bidirectional override. The escaping is reversible
(`unescape`) and unambiguous, because a backslash is escaped too:

    \\  a backslash        \n \t \r  newline, tab, carriage return
    \xNN  any other code point below U+0100 that is a control character (C0, DEL, C1)
    \u{N}  any other control, format, separator or surrogate code point (Unicode categories
          Cc, Cf, Zl, Zp, Cs: U+200B-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF, ...), in hex

Everything else is printed as itself. JSON keeps exact names: the same code points are written
as JSON `\uXXXX` escapes there (exact once decoded, inert on a terminal).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
import sys
import unicodedata

from nokvfs.schema.ids import creation_unix_ms


def jsonable(value):
    """A JSON-ready copy of a record, dataclass, enum, bytes or container."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def dumps(value, *, indent: int | None = 2) -> str:
    return json_safe(json.dumps(jsonable(value), sort_keys=True, indent=indent, ensure_ascii=False))


def print_json(value, out=None) -> None:
    (out or sys.stdout).write(dumps(value) + "\n")


class JsonArray:
    """A JSON array written one element per line as the elements arrive (listings stream).

    Each element is written once the next one (or the end) shows whether a comma follows, so
    every write ends a line (a progress line on the same terminal can be redrawn below it).
    """

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.count = 0
        self._pending: str | None = None

    def __enter__(self):
        return self

    def add(self, value) -> None:
        row = dumps(value, indent=None)
        if self._pending is not None:
            self.out.write(("[\n" if self.count == 1 else "") + f"  {self._pending},\n")
        self._pending = row
        self.count += 1

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            if self._pending is None:
                self.out.write("[]\n")
            else:
                self.out.write(("[\n" if self.count == 1 else "") + f"  {self._pending}\n]\n")


# --- safe text ------------------------------------------------------------------------------

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_ASCII_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_UNNAMED = {v: k for k, v in _NAMED.items()}
_ESCAPE = re.compile(r"\\(?:[\\ntr]|x[0-9a-f]{2}|u\{[0-9a-f]{1,6}\})")


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE_CATEGORIES


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{{{code:x}}}"


def safe(text) -> str:
    """`text` (str() of it) for a terminal: control, format and separator characters and the
    backslash escaped as the module docstring says; anything else unchanged."""
    text = str(text)
    if text.isascii():  # the common case, one regex scan
        return _ASCII_UNSAFE.sub(lambda m: _escape(m.group()), text) if _ASCII_UNSAFE.search(text) else text
    return "".join(_escape(c) if c == "\\" or _unsafe(c) else c for c in text)


def unescape(text: str) -> str:
    """The exact text `safe()` printed (for a reader or a script holding human output)."""

    def one(match) -> str:
        token = match.group()
        if token in _UNNAMED:
            return _UNNAMED[token]
        return chr(int(token[2:4] if token[1] == "x" else token[3:-1], 16))

    return _ESCAPE.sub(one, text)


def json_safe(text: str) -> str:
    """Serialised JSON with DEL, C1 and every format/separator code point as a `\\uXXXX` escape
    (json.dumps leaves them raw with ensure_ascii=False). They occur only inside strings, so the
    document decodes to exactly the same values."""
    if text.isascii() and "\x7f" not in text:
        return text
    out = []
    for char in text:
        if char == "\x7f" or (not char.isascii() and _unsafe(char)):
            code = ord(char)
            if code > 0xFFFF:  # as a UTF-16 surrogate pair, as JSON spells it
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


# --- times ----------------------------------------------------------------------------------


def mtime_ms(entry) -> int:
    return creation_unix_ms(entry.artifact_revision_id)


def iso_ms(ms: int, *, seconds: bool = False) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="seconds" if seconds else "milliseconds").replace("+00:00", "Z")


# --- records --------------------------------------------------------------------------------


def workbench_json(workbench) -> dict:
    return jsonable(workbench)


def entry_json(entry) -> dict:
    """Every PathEntry field plus `size`, `mtime_ms` and `mtime`."""
    out = jsonable(entry)
    out["size"] = entry.logical_size
    out["mtime_ms"] = mtime_ms(entry)
    out["mtime"] = iso_ms(out["mtime_ms"])
    return out


def qualified(workbench_id: str, path: str) -> str:
    return f"{workbench_id}:{path}"


def write_result(verb: str, workbench_id: str, path: str, entry) -> str:
    """The one-line summary of a write: `put wb:outputs/a generation=2 revision=... size=11`."""
    return f"{verb} {safe(qualified(workbench_id, path))} generation={entry.generation} revision={entry.artifact_revision_id.hex()} size={entry.logical_size}"


def write_json(workbench_id: str, path: str, entry) -> dict:
    out = entry_json(entry)
    out.update(workbench=workbench_id, path=path)
    return out


def stat_json(info, workbench_id: str) -> dict:
    out = {
        "workbench": workbench_id,
        "path": info.path,
        "kind": info.kind,
        "generation": info.generation,
        "read_version": info.read_version,
    }
    if info.entry is not None:
        out.update(entry_json(info.entry))
    return out


def stat_text(info, workbench_id: str) -> str:
    fields = stat_json(info, workbench_id)
    order = ["workbench", "path", "kind", "size", "generation", "mtime", "mtime_ms"]
    keys = [k for k in order if k in fields] + sorted(k for k in fields if k not in order)
    width = max(len(k) for k in keys)
    lines = []
    for key in keys:
        value = fields[key]
        if isinstance(value, list):
            value = ", ".join(f"{v['name']}={v['encoded_value']}" for v in value) if value else "-"
        elif value == "":
            value = "-"
        lines.append(f"{key + ':':<{width + 1}} {safe(value)}")
    return "\n".join(lines)


# --- listings -------------------------------------------------------------------------------


def listing_json(name: str, path: str, kind: str, entry) -> dict:
    out = {"name": name, "path": path, "kind": kind}
    if entry is not None:
        out.update(entry_json(entry))
    return out


def long_line(name: str, kind: str, entry) -> str:
    """`ls -l`: kind, size, generation, mtime (UTC), name (escaped); directories show '-' for the rest."""
    if entry is None:
        return f"{kind:<4} {'-':>12} {'-':>6} {'-':<20} {safe(name)}"
    when = iso_ms(mtime_ms(entry), seconds=True)
    return f"{kind:<4} {entry.logical_size:>12} {entry.generation:>6} {when:<20} {safe(name)}"
