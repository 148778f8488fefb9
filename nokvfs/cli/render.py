"""Text and JSON formatting of workbenches, path entries and listings.

JSON is always `sort_keys`, ids and raw bytes are lowercase hex, enums are their names, times are
both `mtime_ms` (Unix milliseconds) and `mtime` (ISO-8601 UTC, millisecond precision, `Z`). A
file's mtime is the creation time of its artifact revision (the UUIDv7 timestamp of the revision
id): a put or an append moves it, a rename keeps it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import sys

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
    return json.dumps(jsonable(value), sort_keys=True, indent=indent, ensure_ascii=False)


def print_json(value, out=None) -> None:
    (out or sys.stdout).write(dumps(value) + "\n")


class JsonArray:
    """A JSON array written one element per line as the elements arrive (listings stream)."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.count = 0

    def __enter__(self):
        self.out.write("[")
        return self

    def add(self, value) -> None:
        self.out.write(("," if self.count else "") + "\n  " + dumps(value, indent=None))
        self.count += 1

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.out.write("\n]\n" if self.count else "]\n")


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
    return f"{verb} {qualified(workbench_id, path)} generation={entry.generation} revision={entry.artifact_revision_id.hex()} size={entry.logical_size}"


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
        lines.append(f"{key + ':':<{width + 1}} {value}")
    return "\n".join(lines)


# --- listings -------------------------------------------------------------------------------


def listing_json(name: str, path: str, kind: str, entry) -> dict:
    out = {"name": name, "path": path, "kind": kind}
    if entry is not None:
        out.update(entry_json(entry))
    return out


def long_line(name: str, kind: str, entry) -> str:
    """`ls -l`: kind, size, generation, mtime (UTC), name; directories show '-' for the rest."""
    if entry is None:
        return f"{kind:<4} {'-':>12} {'-':>6} {'-':<20} {name}"
    when = iso_ms(mtime_ms(entry), seconds=True)
    return f"{kind:<4} {entry.logical_size:>12} {entry.generation:>6} {when:<20} {name}"
