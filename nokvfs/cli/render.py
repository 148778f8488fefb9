r"""Text and JSON formatting of workbenches, path entries and listings.

JSON is always `sort_keys`, ids and raw bytes are lowercase hex, enums are their names, times are
both `mtime_ms` (Unix milliseconds) and `mtime` (ISO-8601 UTC, millisecond precision, `Z`). A
path's attributes are what it stores (nokvfs.workspace.attributes): `mode` (an integer) and
`mode_text` (`-rw-r--r--`, `lrwxrwxrwx`, `drwxr-xr-x`), `uid`/`gid` (null when not stored),
`mtime_ns`/`atime_ns`/`ctime_ns` and `attributes_stored`; a path that stores none shows the
defaults, its times being the creation time of its artifact revision (the UUIDv7 timestamp of
the revision id: a put or an append moves it, a rename keeps it). A link is kind `link` and
carries `link_target`. The reserved `nokvfs:posix` field is shown as these keys, not in
`typed_index_projection`.

Safe output. Names and every other user-controlled text (paths, link targets, tag names,
aliases, notes, producers, content types, index values, URLs, error messages) go through
`safe()` before they are printed in human-readable form, so a name cannot move the cursor,
recolour or clear the terminal, or reorder what follows it with a bidirectional override. The
escaping is reversible (`unescape`) and unambiguous, because a backslash is escaped too:

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
import stat as stat_module
import sys
import unicodedata


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


def iso_ms(ms: int, *, seconds: bool = False) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="seconds" if seconds else "milliseconds").replace("+00:00", "Z")


# --- records --------------------------------------------------------------------------------


def workbench_json(workbench) -> dict:
    return jsonable(workbench)


def entry_json(entry, link_target: str | None = None) -> dict:
    """Every PathEntry field plus `size`, the attributes and `mtime_ms`/`mtime`."""
    from nokvfs.workspace import attributes

    out = jsonable(entry)
    out["typed_index_projection"] = jsonable(attributes.user_fields(entry.typed_index_projection))
    out["size"] = entry.logical_size
    out.update(
        attributes_json(attributes.shown(entry), stored=attributes.of(entry) is not None, kind=entry_kind(entry))
    )
    if link_target is not None:
        out["link_target"] = link_target
    return out


def entry_kind(entry) -> str:
    from nokvfs.workspace import attributes

    return "link" if attributes.is_symlink(entry) else "file"


def mode_text(kind: str, mode: int) -> str:
    """`-rw-r--r--`, `lrwxrwxrwx`, `drwxr-xr-x` (setuid, setgid and sticky as ls shows them)."""
    file_type = {"dir": stat_module.S_IFDIR, "link": stat_module.S_IFLNK}.get(kind, stat_module.S_IFREG)
    return stat_module.filemode(file_type | mode)


def attributes_json(shown, *, stored: bool, kind: str) -> dict:
    ms = shown.mtime_ns // 1_000_000
    return {
        "mode": shown.mode,
        "mode_text": mode_text(kind, shown.mode),
        "uid": shown.uid,
        "gid": shown.gid,
        "mtime_ns": shown.mtime_ns,
        "atime_ns": shown.atime_ns,
        "ctime_ns": shown.ctime_ns,
        "attributes_stored": stored,
        "mtime_ms": ms,
        "mtime": iso_ms(ms),
    }


def owner_text(shown) -> str:
    if shown.uid is None and shown.gid is None:
        return "-"
    return f"{'-' if shown.uid is None else shown.uid}:{'-' if shown.gid is None else shown.gid}"


def qualified(workbench_id: str, path: str) -> str:
    return f"{workbench_id}:{path}"


def write_result(verb: str, workbench_id: str, path: str, entry) -> str:
    """The one-line summary of a write: `put wb:outputs/a generation=2 revision=... size=11`."""
    return (
        f"{verb} {safe(qualified(workbench_id, path))} generation={entry.generation} "
        f"revision={entry.artifact_revision_id.hex()} size={entry.logical_size}"
    )


def write_json(workbench_id: str, path: str, entry) -> dict:
    out = entry_json(entry)
    out.update(workbench=workbench_id, path=path)
    return out


def stat_json(info, workbench_id: str, *, link_target: str | None = None, directory=None) -> dict:
    """A stat: the path's entry (a file or link), or a directory with its stored attributes
    (`directory`, from its marker) when it has any."""
    out = {
        "workbench": workbench_id,
        "path": info.path,
        "kind": info.kind,
        "generation": info.generation,
        "read_version": info.read_version,
    }
    if info.entry is not None:
        out.update(entry_json(info.entry, link_target))
        out["kind"] = entry_kind(info.entry)
    elif directory is not None:
        out.update(attributes_json(directory, stored=True, kind="dir"))
    return out


def stat_text(info, workbench_id: str, **extra) -> str:
    fields = stat_json(info, workbench_id, **extra)
    order = [
        "workbench",
        "path",
        "kind",
        "link_target",
        "size",
        "generation",
        "mode_text",
        "mode",
        "uid",
        "gid",
        "mtime",
        "mtime_ms",
    ]
    keys = [k for k in order if k in fields] + sorted(k for k in fields if k not in order)
    width = max(len(k) for k in keys)
    lines = []
    for key in keys:
        value = fields[key]
        if isinstance(value, list):
            value = ", ".join(f"{v['name']}={v['encoded_value']}" for v in value) if value else "-"
        elif value == "" or value is None:
            value = "-"
        elif key == "mode":
            value = f"{value:04o}"
        lines.append(f"{key + ':':<{width + 1}} {safe(value)}")
    return "\n".join(lines)


# --- listings -------------------------------------------------------------------------------


def listing_json(name: str, path: str, kind: str, entry, *, link_target: str | None = None, directory=None) -> dict:
    out = {"name": name, "path": path, "kind": kind}
    if entry is not None:
        out.update(entry_json(entry, link_target))
        out["kind"] = entry_kind(entry)
    elif directory is not None:
        out.update(attributes_json(directory, stored=True, kind="dir"))
    return out


def long_line(name: str, kind: str, entry, *, link_target: str | None = None, directory=None) -> str:
    """`ls -l`: mode, owner (uid:gid, '-' when not stored), size, generation, mtime (UTC), name
    (`name -> target` for a link; both escaped). A directory shows its stored mode and mtime
    (defaults and '-' without a marker) and '-' for size and generation."""
    from nokvfs.workspace import attributes

    if entry is None:
        mode = mode_text("dir", attributes.DIRECTORY_MODE if directory is None else directory.mode)
        owner = "-" if directory is None else owner_text(directory)
        when = "-" if directory is None else iso_ms(directory.mtime_ns // 1_000_000, seconds=True)
        return f"{mode} {owner:>11} {'-':>12} {'-':>6} {when:<20} {safe(name)}"
    shown = attributes.shown(entry)
    when = iso_ms(shown.mtime_ns // 1_000_000, seconds=True)
    line = (
        f"{mode_text(entry_kind(entry), shown.mode)} {owner_text(shown):>11} {entry.logical_size:>12} "
        f"{entry.generation:>6} {when:<20} {safe(name)}"
    )
    return line if link_target is None else f"{line} -> {safe(link_target)}"
