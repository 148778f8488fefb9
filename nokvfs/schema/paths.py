"""The one path normalizer and the ordered path key.

Every caller that turns a user path into a key, a request identity, a reference owner, an index
key or a restore member goes through `normalize_path`. It validates and never repairs: no slash
collapsing, no case folding, no Unicode normalization.

ordered(component) adds one to each UTF-8 byte (valid UTF-8 never contains 0xff), components are
joined by NUL and an exact row ends in 0x01. So for a directory `a` the subtree `a NUL ...` sorts
right before the exact row `a 0x01`, which sorts before longer siblings such as `ab`, and no exact
key is a strict prefix of another.
"""

from __future__ import annotations

from nokvfs.errors import PathInvalid

MAX_PATH_BYTES = 4096
MAX_COMPONENTS = 64
SEPARATOR = 0x00  # between ordered components
TERMINATOR = 0x01  # ends an exact row

_SHIFT_UP = bytes(range(1, 256)) + b"\x00"  # 0xff never occurs in valid UTF-8
_SHIFT_DOWN = b"\xff" + bytes(range(0, 255))


def normalize_path(path: str | bytes) -> tuple[str, ...]:
    """Validate a relative path and return its components. Raises PathInvalid naming the rule."""
    if isinstance(path, bytes):
        try:
            text = path.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PathInvalid(f"path is not valid UTF-8 at byte {exc.start}") from None
    elif isinstance(path, str):
        text = path
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PathInvalid(f"path is not encodable as UTF-8 at character {exc.start}") from None
    else:
        raise PathInvalid(f"path must be str or bytes, got {type(path).__name__}")
    if text == "":
        raise PathInvalid("path is empty")
    if text.startswith("/"):
        raise PathInvalid(f"path must be relative: {text!r}")
    encoded_len = len(text.encode("utf-8"))
    if encoded_len > MAX_PATH_BYTES:
        raise PathInvalid(f"path is {encoded_len} UTF-8 bytes, more than {MAX_PATH_BYTES}")
    components = tuple(text.split("/"))
    if len(components) > MAX_COMPONENTS:
        raise PathInvalid(f"path has {len(components)} components, more than {MAX_COMPONENTS}")
    for index, component in enumerate(components):
        check_component(component, index)
    return components


def check_component(component: str, index: int = 0) -> str:
    if component == "":
        raise PathInvalid(f"component {index} is empty (leading, trailing or doubled '/')")
    if component in (".", ".."):
        raise PathInvalid(f"component {index} is {component!r}")
    if "\\" in component:
        raise PathInvalid(f"component {index} contains a backslash")
    if "\x00" in component:
        raise PathInvalid(f"component {index} contains NUL")
    if "/" in component:
        raise PathInvalid(f"component {index} contains '/'")
    return component


def join(components: tuple[str, ...]) -> str:
    return "/".join(components)


def ordered_component(component: str) -> bytes:
    return component.encode("utf-8").translate(_SHIFT_UP)


def ordered_path(components: tuple[str, ...]) -> bytes:
    """ordered(c0) NUL ordered(c1) ... ordered(cn) 0x01: the exact-row suffix of a path key."""
    return b"\x00".join(ordered_component(c) for c in components) + b"\x01"


def ordered_path_of(path: str | bytes) -> bytes:
    return ordered_path(normalize_path(path))


def unordered_path(key: bytes) -> tuple[str, ...]:
    """Inverse of `ordered_path`. Raises PathInvalid when the bytes are not an ordered path key."""
    if not key or key[-1] != TERMINATOR:
        raise PathInvalid("ordered path key does not end in 0x01")
    body = key[:-1]
    if TERMINATOR in body:
        raise PathInvalid("ordered path key has 0x01 before its end")
    try:
        components = tuple(part.translate(_SHIFT_DOWN).decode("utf-8") for part in body.split(b"\x00"))
    except UnicodeDecodeError:
        raise PathInvalid("ordered path key does not decode to UTF-8") from None
    for index, component in enumerate(components):
        check_component(component, index)
    # Fail closed on keys the normalizer could never have produced (ordered() is length-preserving
    # and each NUL stands for one '/', so len(body) is the path's UTF-8 length).
    if len(components) > MAX_COMPONENTS:
        raise PathInvalid(f"ordered path key has {len(components)} components, more than {MAX_COMPONENTS}")
    if len(body) > MAX_PATH_BYTES:
        raise PathInvalid(f"ordered path key is {len(body)} path bytes, more than {MAX_PATH_BYTES}")
    return components


def subtree_prefix(components: tuple[str, ...]) -> bytes:
    """Prefix of every key strictly below `components` (a directory): ordered parts then NUL.

    The empty tuple (the workspace root) has the empty prefix.
    """
    if not components:
        return b""
    return b"\x00".join(ordered_component(c) for c in components) + b"\x00"


def path_bytes(components: tuple[str, ...]) -> bytes:
    """The ordered, NUL-separated path bytes without terminator (RevisionRef Path owners)."""
    return b"\x00".join(ordered_component(c) for c in components)
