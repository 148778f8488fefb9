"""Canonical JSON: RFC 8785 (JCS) with the exact-integer rule of metatheca 003 section 3.1.

Used for the run and restore manifests, whose bytes are hashed, so one value has exactly one
encoding:

* UTF-8, no insignificant whitespace;
* object members sorted by their names' UTF-16 code units (RFC 8785 section 3.2.3), so an astral
  character (a surrogate pair, 0xd800-0xdbff) sorts before BMP characters U+E000..U+FFFF;
* strings escaped as ECMAScript JSON.stringify does: \\" \\\\ \\b \\f \\n \\r \\t, other C0
  controls as \\u00xx (lowercase hex), everything else literal; lone surrogates are an error
  (RFC 8785 section 3.2.2.2);
* integers as exact decimals, never through binary64 (003 3.1), limited to [-(2**63), 2**64).

003 3.1 also says non-integer numbers (fractions, exponents) are malformed: writers must not produce
them and readers must reject them. So by default `dumps` rejects every Python float and `loads`
rejects every number literal with a fraction or an exponent. `allow_float=True` opts into strict
RFC 8785 numbers for interop: floats are written with the ECMAScript Number-to-String algorithm
(`es_number_to_string`) and non-integer literals, or integer literals outside the 64-bit range, are
read as binary64. Integer literals inside the range are always read as exact Python ints.
"""

from __future__ import annotations

import math
import re
from typing import Any

from nokvfs.errors import CanonicalJsonError

INT_MIN = -(1 << 63)
INT_LIMIT = 1 << 64  # exclusive
# Nesting bound for both directions, so dumps output always loads and neither recurses unbounded.
MAX_DEPTH = 256

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_WS = " \t\n\r"
_SIMPLE_UNESCAPE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


# --- numbers ----------------------------------------------------------------------------------


def es_number_to_string(x: float) -> str:
    """ECMAScript Number::toString for a finite double, as RFC 8785 section 3.2.2.3 requires.

    Python's repr gives the shortest round-tripping digits (nearest, ties to even), which are the
    digits ECMAScript picks; only the layout differs.
    """
    if not math.isfinite(x):
        raise CanonicalJsonError(f"{x!r} has no JSON representation")
    if x == 0:
        return "0"  # also -0.0
    sign = "-" if x < 0 else ""
    mantissa, _, exp = repr(abs(x)).partition("e")
    int_part, _, frac = mantissa.partition(".")
    digits = int_part + frac
    point = len(int_part) + (int(exp) if exp else 0)  # decimal point after `point` digits
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point  # the s, k, n of ECMA-262 Number::toString
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        exponent = ("e+" if e >= 0 else "e-") + str(abs(e))
        body = digits + exponent if k == 1 else digits[0] + "." + digits[1:] + exponent
    return sign + body


def _check_int(value: int) -> int:
    if not INT_MIN <= value < INT_LIMIT:
        raise CanonicalJsonError(f"integer {value} is outside [-(2**63), 2**64)")
    return value


# --- dumps ------------------------------------------------------------------------------------


def _escape_char(match: re.Match) -> str:
    ch = match.group()
    return _ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


def _string(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalJsonError(f"string has a lone surrogate at character {exc.start}") from None
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, s) + '"'


def _utf16_key(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like sequences of UTF-16 code units.
    return name.encode("utf-16-be")


def _dump(value: Any, out: list[str], depth: int, allow_float: bool) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(_check_int(value))))
    elif isinstance(value, float):
        if not allow_float:
            raise CanonicalJsonError(f"float {value!r} is not allowed: canonical JSON carries exact integers only")
        out.append(es_number_to_string(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise CanonicalJsonError(f"nesting deeper than {MAX_DEPTH}")
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _dump(item, out, depth + 1, allow_float)
        out.append("]")
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise CanonicalJsonError(f"nesting deeper than {MAX_DEPTH}")
        for name in value:
            if not isinstance(name, str):
                raise CanonicalJsonError(f"object name must be a str, got {type(name).__name__}")
        names = [(_string(name), name) for name in value]  # _string rejects lone surrogates
        names.sort(key=lambda pair: _utf16_key(pair[1]))
        out.append("{")
        for index, (encoded, name) in enumerate(names):
            if index:
                out.append(",")
            out.append(encoded)
            out.append(":")
            _dump(value[name], out, depth + 1, allow_float)
        out.append("}")
    else:
        raise CanonicalJsonError(f"{type(value).__name__} has no canonical JSON representation")


def dumps(value: Any, *, allow_float: bool = False) -> bytes:
    """Canonical UTF-8 bytes of `value`: None, bool, int, str, list/tuple, dict with str keys."""
    out: list[str] = []
    _dump(value, out, 0, allow_float)
    return "".join(out).encode("utf-8")


# --- loads ------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str, allow_float: bool):
        self.text = text
        self.pos = 0
        self.allow_float = allow_float

    def fail(self, what: str) -> CanonicalJsonError:
        return CanonicalJsonError(f"{what} at character {self.pos}")

    def skip_ws(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        self.pos = pos

    def value(self, depth: int) -> Any:
        self.skip_ws()
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of input")
        ch = self.text[self.pos]
        if ch == "{":
            return self.object(depth)
        if ch == "[":
            return self.array(depth)
        if ch == '"':
            return self.string()
        for literal, result in (("null", None), ("true", True), ("false", False)):
            if self.text.startswith(literal, self.pos):
                self.pos += len(literal)
                return result
        return self.number()

    def object(self, depth: int) -> dict:
        if depth >= MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        self.pos += 1
        result: dict = {}
        self.skip_ws()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return result
        while True:
            self.skip_ws()
            if not self.text.startswith('"', self.pos):
                raise self.fail("expected an object member name")
            start = self.pos
            name = self.string()
            if name in result:  # compared after unescaping: "a" and "\u0061" are the same name
                self.pos = start
                raise self.fail(f"duplicate object member name {name!r}")
            self.skip_ws()
            if not self.text.startswith(":", self.pos):
                raise self.fail("expected ':'")
            self.pos += 1
            result[name] = self.value(depth + 1)
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("}", self.pos):
                self.pos += 1
                return result
            else:
                raise self.fail("expected ',' or '}'")

    def array(self, depth: int) -> list:
        if depth >= MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        self.pos += 1
        result: list = []
        self.skip_ws()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return result
        while True:
            result.append(self.value(depth + 1))
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("]", self.pos):
                self.pos += 1
                return result
            else:
                raise self.fail("expected ',' or ']'")

    def hex4(self) -> int:
        match = _HEX4.match(self.text, self.pos)
        if not match:
            raise self.fail("bad \\u escape")
        self.pos = match.end()
        return int(match.group(), 16)

    def string(self) -> str:
        text = self.text
        self.pos += 1  # opening quote
        parts: list[str] = []
        while True:
            match = _PLAIN.match(text, self.pos)
            if match:
                parts.append(match.group())
                self.pos = match.end()
            if self.pos >= len(text):
                raise self.fail("unterminated string")
            ch = text[self.pos]
            if ch == '"':
                self.pos += 1
                return "".join(parts)
            if ch != "\\":
                raise self.fail(f"unescaped control character U+{ord(ch):04X} in string")
            self.pos += 1
            if self.pos >= len(text):
                raise self.fail("unterminated escape")
            esc = text[self.pos]
            self.pos += 1
            if esc in _SIMPLE_UNESCAPE:
                parts.append(_SIMPLE_UNESCAPE[esc])
                continue
            if esc != "u":
                raise self.fail(f"bad escape \\{esc}")
            unit = self.hex4()
            if 0xDC00 <= unit <= 0xDFFF:
                raise self.fail("lone low surrogate escape")
            if 0xD800 <= unit <= 0xDBFF:
                if not text.startswith("\\u", self.pos):
                    raise self.fail("lone high surrogate escape")
                self.pos += 2
                low = self.hex4()
                if not 0xDC00 <= low <= 0xDFFF:
                    raise self.fail("high surrogate escape not followed by a low surrogate")
                unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
            parts.append(chr(unit))

    def number(self) -> Any:
        match = _NUMBER.match(self.text, self.pos)
        if not match:
            raise self.fail("unexpected character")
        literal = match.group()
        self.pos = match.end()
        non_integer = match.group(1) is not None or match.group(2) is not None
        if not non_integer:
            # At most 20 digits fit the range; check the length first so a huge literal
            # never reaches int() (and its digit limit).
            if len(literal.lstrip("-")) <= 20:
                value = int(literal)
                if INT_MIN <= value < INT_LIMIT:
                    return value
            if not self.allow_float:
                raise self.fail(f"integer {literal[:40]} is outside [-(2**63), 2**64)")
        elif not self.allow_float:
            raise self.fail(f"non-integer number {literal[:40]} is not allowed")
        value = float(literal)
        if not math.isfinite(value):
            raise self.fail(f"number {literal[:40]} is outside binary64")
        return value


def loads(data: bytes, *, allow_float: bool = False) -> Any:
    """Parse strict JSON (RFC 8259) from UTF-8 bytes under the rules of this module.

    Rejects invalid UTF-8, a byte-order mark, lone surrogate escapes, duplicate member names,
    non-integer numbers (unless `allow_float`), out-of-range integers and trailing data.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CanonicalJsonError(f"canonical JSON is bytes, got {type(data).__name__}")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CanonicalJsonError(f"invalid UTF-8 at byte {exc.start}") from None
    parser = _Parser(text, allow_float)
    value = parser.value(0)
    parser.skip_ws()
    if parser.pos != len(text):
        raise parser.fail("trailing data")
    return value


def is_canonical(data: bytes, *, allow_float: bool = False) -> bool:
    """True when `data` parses and re-serializes to exactly the same bytes."""
    try:
        return dumps(loads(data, allow_float=allow_float), allow_float=allow_float) == bytes(data)
    except CanonicalJsonError:
        return False
