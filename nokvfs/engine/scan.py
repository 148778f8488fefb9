"""Bounded scans: the delimiter-aware direct-child listing and the recursive prefix scan.

Over ordered path keys a child's subtree `c NUL ...` sorts right before its exact row `c 0x01`,
and ordered component bytes are all >= 0x02. So a child component ends at the first byte <= 0x01;
after meeting a child we seek to `c 0x01` (its exact row, which wins over the subtree rollup) and
the next seek target `c 0x02` is past everything of that child. Listing costs one or two seeks per
child, never a read per descendant.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ITEMS_PER_CALL = 255


@dataclass(frozen=True)
class ChildItem:
    child: bytes  # the ordered component
    value: bytes | None  # the exact row's value; None for a Prefix (subtree rollup) item

    @property
    def is_prefix(self) -> bool:
        return self.value is None


@dataclass(frozen=True)
class Page:
    items: tuple
    read_version: int
    # The exclusive start marker of the next page, or None at the end.
    next_marker: bytes | None
    cursor_ops: int


def _bounded(limit: int) -> int:
    if not 1 <= limit <= MAX_ITEMS_PER_CALL:
        raise ValueError(f"a scan returns 1..{MAX_ITEMS_PER_CALL} items per call, not {limit}")
    return limit


def list_children(
    view, tree: str, prefix: bytes, *, start_after: bytes | None = None, limit: int = MAX_ITEMS_PER_CALL
) -> Page:
    """Direct children of `prefix` (a key prefix ending where a component starts)."""
    limit = _bounded(limit)
    ops_before = view.ops
    position = prefix if start_after is None else prefix + start_after + b"\x02"
    items = []
    last = None
    exhausted = False
    while len(items) < limit:
        found = view.seek(tree, position, within=prefix)
        if found is None:
            exhausted = True
            break
        key, value = found
        rest = key[len(prefix) :]
        end = next((i for i, b in enumerate(rest) if b <= 0x01), len(rest))
        child = rest[:end]
        if end == len(rest) or not child:
            raise ValueError(f"key {key.hex()} under the listed prefix is not an ordered path key")
        if rest[end] == 0x01 and end == len(rest) - 1:
            items.append(ChildItem(child, value))
        else:
            exact = view.seek(tree, prefix + child + b"\x01", within=prefix)
            if exact is not None and exact[0] == prefix + child + b"\x01":
                items.append(ChildItem(child, exact[1]))
            else:
                items.append(ChildItem(child, None))
        last = child
        position = prefix + child + b"\x02"
    if not exhausted:
        # A full page: the next page starts after `last` (it may turn out empty).
        return Page(tuple(items), view.version, last, view.ops - ops_before)
    return Page(tuple(items), view.version, None, view.ops - ops_before)


def scan_prefix(
    view, tree: str, prefix: bytes, *, start_after: bytes | None = None, limit: int = MAX_ITEMS_PER_CALL
) -> Page:
    """Rows whose key starts with `prefix`, in key order, after the exclusive key `start_after`.

    Items are (key, value) pairs; next_marker is the last key returned when the page is full.
    """
    limit = _bounded(limit)
    ops_before = view.ops
    position = prefix if start_after is None else start_after + b"\x00"
    items, exhausted = view.walk(tree, position, prefix, limit)
    next_marker = None if exhausted else items[-1][0]
    return Page(tuple(items), view.version, next_marker, view.ops - ops_before)


def iter_prefix(view, tree: str, prefix: bytes, *, start_after: bytes | None = None):
    """Every (key, value) under `prefix` (after `start_after`), in key order, fetched in bounded pages
    (scan_prefix's, without building a Page: GC reads each collected revision's manifest so)."""
    marker = start_after
    while True:
        position = prefix if marker is None else marker + b"\x00"
        items, exhausted = view.walk(tree, position, prefix, MAX_ITEMS_PER_CALL)
        yield from items
        if exhausted:
            return
        marker = items[-1][0]
