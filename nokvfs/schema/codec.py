"""One declarative codec for every durable record and key.

A record is a frozen dataclass whose fields are annotated with a field codec:

    @record(version=2)
    class PathEntry:
        generation: U64
        artifact_revision_id: Id16
        content_type: Str

Encoding is the u8 value version, then each field in declared order: unsigned integers big-endian
of fixed width, fixed-width ids raw, variable byte strings with a u32 big-endian length (u16 where
the seed says two bytes), enums as a u8 discriminant, optionals as a u8 presence flag, lists as a
u32 count. `@record(version=None)` declares a key layout: the same fields without a version byte.
Decoding fails closed: an unknown version, an unknown discriminant, a truncated or over-long value
each raise a typed FormatError.
"""

from __future__ import annotations

import dataclasses
import struct
import sys
import typing
from enum import IntEnum
from typing import Annotated, Any

from nokvfs.errors import CorruptRecord, PathInvalid, UnknownDiscriminant, UnknownVersion
from nokvfs.schema.enums import decode_enum
from nokvfs.schema.paths import check_component, ordered_path, unordered_path


class FieldCodec:
    """Encodes one field value onto a bytearray and decodes it from a buffer at an offset."""

    name = "field"

    def encode(self, value: Any, out: bytearray) -> None:
        raise NotImplementedError

    def decode(self, buf: bytes, pos: int) -> tuple[Any, int]:
        raise NotImplementedError

    def _need(self, buf: bytes, pos: int, n: int) -> None:
        if pos + n > len(buf):
            raise CorruptRecord(f"{self.name}: truncated, need {n} bytes at offset {pos}")


class UInt(FieldCodec):
    _FORMATS = {1: ">B", 2: ">H", 4: ">I", 8: ">Q"}

    def __init__(self, width: int):
        self.width = width
        self._struct = struct.Struct(self._FORMATS[width])
        self.max = (1 << (8 * width)) - 1
        self.name = f"u{8 * width}"

    def encode(self, value, out):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= self.max:
            raise CorruptRecord(f"{self.name}: {value!r} is not an integer in 0..{self.max}")
        out += self._struct.pack(value)

    def decode(self, buf, pos):
        self._need(buf, pos, self.width)
        return self._struct.unpack_from(buf, pos)[0], pos + self.width


class Bool(FieldCodec):
    name = "bool"

    def encode(self, value, out):
        if not isinstance(value, bool):
            raise CorruptRecord(f"bool: {value!r} is not a bool")
        out.append(1 if value else 0)

    def decode(self, buf, pos):
        self._need(buf, pos, 1)
        b = buf[pos]
        if b > 1:
            raise CorruptRecord(f"bool: byte {b} at offset {pos} is neither 0 nor 1")
        return b == 1, pos + 1


class FixedBytes(FieldCodec):
    def __init__(self, length: int):
        self.length = length
        self.name = f"bytes[{length}]"

    def encode(self, value, out):
        if not isinstance(value, (bytes, bytearray)) or len(value) != self.length:
            raise CorruptRecord(f"{self.name}: value is not exactly {self.length} bytes")
        out += value

    def decode(self, buf, pos):
        self._need(buf, pos, self.length)
        return bytes(buf[pos : pos + self.length]), pos + self.length


class LenBytes(FieldCodec):
    def __init__(self, len_width: int = 4):
        self.len_codec = UInt(len_width)
        self.name = f"bytes/u{8 * len_width}"

    def encode(self, value, out):
        if not isinstance(value, (bytes, bytearray)):
            raise CorruptRecord(f"{self.name}: {type(value).__name__} is not bytes")
        if len(value) > self.len_codec.max:
            raise CorruptRecord(f"{self.name}: {len(value)} bytes do not fit the length prefix")
        self.len_codec.encode(len(value), out)
        out += value

    def decode(self, buf, pos):
        # Flat on purpose: this runs for every variable field of every point read.
        width = self.len_codec.width
        start = pos + width
        if start > len(buf):
            raise CorruptRecord(f"{self.name}: truncated, need {width} bytes at offset {pos}")
        end = start + self.len_codec._struct.unpack_from(buf, pos)[0]
        if end > len(buf):
            raise CorruptRecord(f"{self.name}: truncated, need {end - start} bytes at offset {start}")
        return bytes(buf[start:end]), end


class LenStr(LenBytes):
    """UTF-8 text with a length prefix; decoding rejects invalid UTF-8."""

    def __init__(self, len_width: int = 4):
        super().__init__(len_width)
        self.name = f"str/u{8 * len_width}"

    def encode(self, value, out):
        if not isinstance(value, str):
            raise CorruptRecord(f"{self.name}: {type(value).__name__} is not str")
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: fail typed, like every other bad field
            raise CorruptRecord(f"{self.name}: text is not encodable as UTF-8") from None
        super().encode(raw, out)

    def decode(self, buf, pos):
        width = self.len_codec.width
        start = pos + width
        if start > len(buf):
            raise CorruptRecord(f"{self.name}: truncated, need {width} bytes at offset {pos}")
        end = start + self.len_codec._struct.unpack_from(buf, pos)[0]
        if end > len(buf):
            raise CorruptRecord(f"{self.name}: truncated, need {end - start} bytes at offset {start}")
        try:
            return str(buf[start:end], "utf-8"), end
        except UnicodeDecodeError:
            raise CorruptRecord(f"{self.name}: invalid UTF-8 before offset {end}") from None


class EnumField(FieldCodec):
    def __init__(self, enum_type: type[IntEnum]):
        self.enum_type = enum_type
        self.name = enum_type.__name__

    def encode(self, value, out):
        if not isinstance(value, self.enum_type):
            if isinstance(value, IntEnum) or not isinstance(value, int):
                raise CorruptRecord(f"{self.name}: {value!r} is not a {self.name}")
            try:
                value = self.enum_type(value)
            except ValueError:
                raise UnknownDiscriminant(f"{self.name} has no discriminant {value}") from None
        out.append(int(value))

    def decode(self, buf, pos):
        self._need(buf, pos, 1)
        return decode_enum(self.enum_type, buf[pos]), pos + 1


class Optional(FieldCodec):
    def __init__(self, inner: FieldCodec):
        self.inner = inner
        self.name = f"optional[{inner.name}]"

    def encode(self, value, out):
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.encode(value, out)

    def decode(self, buf, pos):
        self._need(buf, pos, 1)
        flag = buf[pos]
        if flag == 0:
            return None, pos + 1
        if flag != 1:
            raise CorruptRecord(f"{self.name}: presence byte {flag} at offset {pos}")
        return self.inner.decode(buf, pos + 1)


class ListOf(FieldCodec):
    def __init__(self, inner: FieldCodec, count_width: int = 4):
        self.inner = inner
        self.count_codec = UInt(count_width)
        self.name = f"list[{inner.name}]"

    def encode(self, value, out):
        if not isinstance(value, (tuple, list)):
            raise CorruptRecord(f"{self.name}: {type(value).__name__} is not a tuple")
        self.count_codec.encode(len(value), out)
        for item in value:
            self.inner.encode(item, out)

    def decode(self, buf, pos):
        n, pos = self.count_codec.decode(buf, pos)
        # Each item takes at least one byte: a count larger than the rest is corrupt, not a
        # reason to allocate.
        if n > len(buf) - pos:
            raise CorruptRecord(f"{self.name}: count {n} exceeds the remaining bytes")
        items = []
        for _ in range(n):
            item, pos = self.inner.decode(buf, pos)
            items.append(item)
        return tuple(items), pos


class Nested(FieldCodec):
    """A record (or key layout) embedded inline, without its own version byte."""

    def __init__(self, record_type: type):
        self.record_type = record_type
        self.name = record_type.__name__

    def encode(self, value, out):
        if not isinstance(value, self.record_type):
            raise CorruptRecord(f"{self.name}: {type(value).__name__} is not a {self.name}")
        _encode_fields(value, out)

    def decode(self, buf, pos):
        return _decode_fields(self.record_type, buf, pos)


class OrderedPathField(FieldCodec):
    """A normalized path as its ordered key bytes, self-delimited by the 0x01 terminator.

    Values are component tuples. Only valid at the end of a key or before fixed-width fields,
    since 0x01 can occur nowhere else in an ordered path.
    """

    name = "ordered_path"

    def encode(self, value, out):
        if not isinstance(value, tuple) or not value:
            raise CorruptRecord("ordered_path: value is not a non-empty component tuple")
        for index, component in enumerate(value):
            # Never write a key the decoder would refuse ("a/b", "..", "", NUL, ...).
            if not isinstance(component, str):
                raise CorruptRecord(f"ordered_path: component {index} is not str")
            try:
                check_component(component, index)
            except PathInvalid as exc:
                raise CorruptRecord(f"ordered_path: {exc}") from None
        out += ordered_path(value)

    def decode(self, buf, pos):
        end = bytes(buf).find(b"\x01", pos)
        if end < 0:
            raise CorruptRecord(f"ordered_path: no 0x01 terminator after offset {pos}")
        try:
            return unordered_path(bytes(buf[pos : end + 1])), end + 1
        except Exception as exc:  # noqa: BLE001 - whatever fails to decode is a corrupt key
            raise CorruptRecord(f"ordered_path: {exc}") from None


class Rest(FieldCodec):
    """All remaining bytes. Only as the last field of a key layout."""

    name = "rest"

    def encode(self, value, out):
        if not isinstance(value, (bytes, bytearray)):
            raise CorruptRecord("rest: value is not bytes")
        out += value

    def decode(self, buf, pos):
        return bytes(buf[pos:]), len(buf)


# --- the field vocabulary records are declared with -----------------------------------------

U8 = Annotated[int, UInt(1)]
U16 = Annotated[int, UInt(2)]
U32 = Annotated[int, UInt(4)]
U64 = Annotated[int, UInt(8)]
Flag = Annotated[bool, Bool()]
Id16 = Annotated[bytes, FixedBytes(16)]
Id32 = Annotated[bytes, FixedBytes(32)]  # CommitId and raw SHA-256 digests
Bytes = Annotated[bytes, LenBytes(4)]
Str = Annotated[str, LenStr(4)]
Label = Annotated[str, LenStr(2)]  # tag names and snapshot aliases: two-byte length
OrderedPath = Annotated[tuple, OrderedPathField()]
RestBytes = Annotated[bytes, Rest()]


def Enum(enum_type: type[IntEnum]):
    return Annotated[enum_type, EnumField(enum_type)]


def Opt(field_type):
    return Annotated[typing.Optional[typing.get_args(field_type)[0]], Optional(_codec_of(field_type))]


def List(field_type):
    return Annotated[tuple, ListOf(_codec_of(field_type))]


def Struct(record_type: type):
    return Annotated[record_type, Nested(record_type)]


def _codec_of(annotation) -> FieldCodec:
    for extra in getattr(annotation, "__metadata__", ()):
        if isinstance(extra, FieldCodec):
            return extra
    raise TypeError(f"annotation {annotation!r} carries no field codec")


# --- records ---------------------------------------------------------------------------------

ALL_RECORDS: list[type] = []


def record(version: int | None):
    """Declare a record with value version `version`, or a key layout when `version` is None."""
    if version is not None and not 0 <= version <= 255:
        raise ValueError("value version must fit in a u8")

    def wrap(cls):
        cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
        cls.__init__ = _compile_init(cls)
        module = sys.modules[cls.__module__]
        hints = typing.get_type_hints(cls, globalns=vars(module), include_extras=True)
        cls.__codec_fields__ = tuple((f.name, _codec_of(hints[f.name])) for f in dataclasses.fields(cls))
        cls.__decode_plan__ = _plan(cls.__codec_fields__)
        cls.__fast_encode__ = _compiled_on_first_call(cls, "__fast_encode__", _compile_encoder)
        cls.__fast_decode__ = _compiled_on_first_call(cls, "__fast_decode__", _compile_decoder)
        cls.VERSION = version
        cls.encode = _encode
        cls.decode = classmethod(_decode)
        ALL_RECORDS.append(cls)
        return cls

    return wrap


def _compiled_on_first_call(cls, attribute: str, compile_):
    """A stand-in for `cls`'s compiled encoder or decoder that compiles it at its first call and
    puts it in its place: compiling all of them at import was about a fifth of the imports every
    `nokvfs` command and daemon starts with, and a process uses few of them. Two threads may both
    compile one: the same function."""

    def first_call(*args):
        fast = compile_(cls)
        setattr(cls, attribute, staticmethod(fast))
        return fast(*args)

    return staticmethod(first_call)


def _compile_init(cls):
    """The record's __init__: the dataclass's own signature (field names, order and defaults)
    and __post_init__ call, each field stored through its slot descriptor. A frozen dataclass's
    generated __init__ stores each through object.__setattr__, which costs about twice as much;
    a record is made for every row decoded and every key built, so this is most of what
    decoding a short row costs beyond the parse. Falls back to the dataclass's own __init__
    for a field it would treat differently (a default factory, init=False, keyword-only)."""
    fields = dataclasses.fields(cls)
    if any(f.default_factory is not dataclasses.MISSING or not f.init or f.kw_only or f.name == "self" for f in fields):
        return cls.__init__
    env = {}
    params, body = [], []
    for index, f in enumerate(fields):
        env[f"S{index}"] = cls.__dict__[f.name].__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            env[f"D{index}"] = f.default
            params.append(f"{f.name}=D{index}")
        body.append(f"    S{index}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    exec(f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass"), env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def replace(obj, /, **changes):
    """`dataclasses.replace` for a record, at half its cost (it inspects every field on each
    call; GC's builders make three changed records per revision): the same new record, built
    through the record's __init__, so its __post_init__ checks still run."""
    replaced = _REPLACERS.get(type(obj))
    if replaced is None:  # compiled on first use: most records are never replaced
        replaced = _REPLACERS[type(obj)] = _compile_replace(type(obj))
    return replaced(obj, changes)


_REPLACERS: dict = {}  # record type -> its compiled replace (two threads may both compile one: the same)


def _compile_replace(cls):
    """`cls`'s replace(record, changes) (see `replace`): each field from `changes` or from the
    record, passed to __init__ in declaration order. A record whose __init__ is the
    dataclass's own (see _compile_init) keeps dataclasses.replace."""
    fields = dataclasses.fields(cls)
    if any(f.default_factory is not dataclasses.MISSING or not f.init or f.kw_only or f.name == "self" for f in fields):
        return lambda obj, changes: dataclasses.replace(obj, **changes)
    names = frozenset(f.name for f in fields)
    env = {"cls": cls, "names": names}
    values = ", ".join(f"get({f.name!r}, self.{f.name})" for f in fields)
    exec(
        "def replaced(self, changes):\n"
        "    if not changes.keys() <= names:\n"
        "        raise TypeError(f'{cls.__name__} has no field {sorted(changes.keys() - names)[0]!r}')\n"
        "    get = changes.get\n"
        f"    return cls({values})",
        env,
    )
    replaced = env["replaced"]
    replaced.__qualname__ = f"{cls.__qualname__}.replaced"
    replaced.__module__ = cls.__module__
    return replaced


class _FixedRun:
    """Consecutive unsigned-integer and fixed-width byte fields, decoded with one struct call.

    Only the decoder uses it (decoding is the hot path: every point read); it yields exactly
    the values the per-field codecs would, and falls back to them for the error message.
    """

    def __init__(self, fields):
        self.fields = fields
        formats = []
        for _, codec in fields:
            formats.append(UInt._FORMATS[codec.width][1] if isinstance(codec, UInt) else f"{codec.length}s")
        self.struct = struct.Struct(">" + "".join(formats))
        self.names = tuple(name for name, _ in fields)


def _plan(fields):
    """Decode steps: _FixedRun for runs of two or more fixed-width fields, else (name, codec)."""
    steps, run = [], []

    def flush():
        if len(run) >= 2:
            steps.append(_FixedRun(tuple(run)))
        else:
            steps.extend(run)
        run.clear()

    for name, codec in fields:
        if type(codec) in (UInt, FixedBytes):
            run.append((name, codec))
        else:
            flush()
            steps.append((name, codec))
    flush()
    return tuple(steps)


def _encode_fields(obj, out: bytearray) -> None:
    start = len(out)
    try:
        obj.__fast_encode__(obj, out)
    except Exception:  # noqa: BLE001 - the declared codecs say what is wrong, and where
        del out[start:]
        _encode_fields_checked(obj, out)


def _encode_fields_checked(obj, out: bytearray) -> None:
    for name, codec in obj.__codec_fields__:
        try:
            codec.encode(getattr(obj, name), out)
        except CorruptRecord as exc:
            raise CorruptRecord(f"{type(obj).__name__}.{name}: {exc}") from None


def _decode_fields(cls, buf, pos):
    if type(buf) is bytes:
        try:
            return cls.__fast_decode__(buf, pos)
        except Exception:  # noqa: BLE001 - the declared codecs say what is wrong, and where
            pass
    return _decode_fields_checked(cls, buf, pos)


def _decode_fields_checked(cls, buf, pos):
    values = {}
    for step in cls.__decode_plan__:
        if type(step) is _FixedRun:
            if pos + step.struct.size > len(buf):
                for name, codec in step.fields:  # truncated: let the field codec say where
                    values[name], pos = _decode_checked(cls, name, codec, buf, pos)
            values.update(zip(step.names, step.struct.unpack_from(buf, pos)))
            pos += step.struct.size
            continue
        name, codec = step
        values[name], pos = _decode_checked(cls, name, codec, buf, pos)
    return cls(**values), pos


def _decode_checked(cls, name: str, codec, buf, pos: int):
    """Field `name` at `pos` through its declared codec: (value, end), a failure naming the field."""
    try:
        return codec.decode(buf, pos)
    except CorruptRecord as exc:
        raise CorruptRecord(f"{cls.__name__}.{name}: {exc}") from None
    except UnknownDiscriminant as exc:
        raise UnknownDiscriminant(f"{cls.__name__}.{name}: {exc}") from None


def _encode(self) -> bytes:
    out = bytearray()
    if self.VERSION is not None:
        out.append(self.VERSION)
    _encode_fields(self, out)
    return bytes(out)


def _after_version(cls, buf: bytes) -> int:
    """Where a `cls` value's fields start, once its version byte (if it has one) is checked."""
    if cls.VERSION is None:
        return 0
    if not buf:
        raise CorruptRecord(f"{cls.__name__}: empty value has no version byte")
    if buf[0] != cls.VERSION:
        raise UnknownVersion(f"{cls.__name__}: value version {buf[0]}, this build knows only {cls.VERSION}")
    return 1


def _decode(cls, data: bytes):
    buf = bytes(data)
    pos = _after_version(cls, buf)
    obj, pos = _decode_fields(cls, buf, pos)
    if pos != len(buf):
        raise CorruptRecord(f"{cls.__name__}: {len(buf) - pos} trailing bytes after offset {pos}")
    return obj


_FIELD_DECODERS: dict = {}  # (record class, field name) -> compiled decoder up to that field


def decode_field(cls, data, name: str):
    """Field `name` of a `cls` value alone: the version byte and the fields before it decoded and
    checked as `decode` would, the rest not read. For a scan that picks a few rows of many by
    one field (recovery looks for operations not in a terminal phase): the rows it keeps are
    decoded whole, and so checked whole, by their reader."""
    buf = data if type(data) is bytes else bytes(data)
    pos = _after_version(cls, buf)
    fast = _FIELD_DECODERS.get((cls, name))
    if fast is None:
        fast = _FIELD_DECODERS[(cls, name)] = _compile_decoder(cls, upto=name)
    try:
        return fast(buf, pos)[0]
    except Exception:  # noqa: BLE001 - the declared codecs below say what is wrong, and where
        pass
    for step in cls.__decode_plan__:
        if type(step) is _FixedRun:
            if name not in step.names and pos + step.struct.size <= len(buf):
                pos += step.struct.size
                continue
            fields = step.fields
        else:
            fields = (step,)
        for field, codec in fields:
            value, pos = _decode_checked(cls, field, codec, buf, pos)
            if field == name:
                return value
    raise KeyError(f"{cls.__name__} has no field {name!r}")


# --- compiled codecs ---------------------------------------------------------------------------
#
# Encoding and decoding run for every row a command writes or a read touches, so each record
# gets straight-line functions generated from its declaration: the same bytes, checks that
# accept exactly the plain values the field codecs accept (anything else -- a subclass, a
# bytearray, a bad value -- leaves the fast path), and no per-field call or exception frame.
# Whenever the fast path gives up, the declared codecs run instead: they produce the bytes
# (for the values only they accept) or the typed error naming the field. tests/test_codec_fast.py
# holds the two paths to the same bytes and errors.


class _Slow(Exception):
    """The compiled path gives up: the declared codecs decide."""


def _compile_encoder(cls):
    lines = ["def encode(obj, out):"]
    env = {"_Slow": _Slow, "int": int, "bytes": bytes, "str": str, "len": len, "tuple": tuple}
    run_vars, run_formats = [], []

    def flush():
        if run_vars:
            name = f"S{len(env)}"
            env[name] = struct.Struct(">" + "".join(run_formats))
            lines.append(f"    out += {name}.pack({', '.join(run_vars)})")
            run_vars.clear()
            run_formats.clear()

    def check_fixed(v: str, codec, pad: str) -> None:
        """The check a fixed-width field's value passes (an int in range, bytes of the width)."""
        if type(codec) is UInt:
            lines.append(f"{pad}if {v}.__class__ is not int or {v} < 0 or {v} > {codec.max}: raise _Slow")
        else:
            lines.append(f"{pad}if {v}.__class__ is not bytes or len({v}) != {codec.length}: raise _Slow")

    def emit(v: str, codec, pad: str) -> None:
        """Straight-line code writing `v` as `codec` does (or giving up), at indentation `pad`."""
        kind = type(codec)
        if kind is UInt:
            pack = f"U{len(env)}"
            env[pack] = codec._struct
            check_fixed(v, codec, pad)
            lines.append(f"{pad}out += {pack}.pack({v})")
        elif kind is FixedBytes:
            check_fixed(v, codec, pad)
            lines.append(f"{pad}out += {v}")
        elif kind in (LenBytes, LenStr):
            length = f"L{len(env)}"
            env[length] = codec.len_codec._struct
            if kind is LenStr:
                lines.append(f"{pad}if {v}.__class__ is not str: raise _Slow")
                lines.append(f"{pad}{v} = {v}.encode('utf-8')")
            else:
                lines.append(f"{pad}if {v}.__class__ is not bytes: raise _Slow")
            lines.append(f"{pad}if len({v}) > {codec.len_codec.max}: raise _Slow")
            lines.append(f"{pad}out += {length}.pack(len({v}))")
            lines.append(f"{pad}out += {v}")
        elif kind is EnumField:
            enum = f"E{len(env)}"
            env[enum] = codec.enum_type
            lines.append(f"{pad}if {v}.__class__ is not {enum}: raise _Slow")
            lines.append(f"{pad}out.append({v}._value_)")
        elif kind is Bool:
            lines.append(f"{pad}if {v} is True: out.append(1)")
            lines.append(f"{pad}elif {v} is False: out.append(0)")
            lines.append(f"{pad}else: raise _Slow")
        elif kind is Optional:
            lines.append(f"{pad}if {v} is None: out.append(0)")
            lines.append(f"{pad}else:")
            lines.append(f"{pad}    out.append(1)")
            emit(v, codec.inner, pad + "    ")
        elif kind is ListOf and type(codec.inner) is Nested:
            # Items through their own record's compiled encoder (a list or a subclass item
            # leaves the fast path, as any value only the declared codecs accept does).
            count, item_type = f"N{len(env)}", f"R{len(env)}"
            env[count] = codec.count_codec._struct
            env[item_type] = codec.inner.record_type
            lines.append(f"{pad}if {v}.__class__ is not tuple or len({v}) > {codec.count_codec.max}: raise _Slow")
            lines.append(f"{pad}out += {count}.pack(len({v}))")
            lines.append(f"{pad}for item in {v}:")
            lines.append(f"{pad}    if item.__class__ is not {item_type}: raise _Slow")
            lines.append(f"{pad}    item.__fast_encode__(item, out)")
        else:
            field = f"C{len(env)}"
            env[field] = codec
            lines.append(f"{pad}{field}.encode({v}, out)")

    for index, (name, codec) in enumerate(cls.__codec_fields__):
        v = f"v{index}"
        lines.append(f"    {v} = obj.{name}")
        kind = type(codec)
        if kind in (UInt, FixedBytes):  # consecutive ones are packed with one struct call
            check_fixed(v, codec, "    ")
            run_vars.append(v)
            run_formats.append(UInt._FORMATS[codec.width][1] if kind is UInt else f"{codec.length}s")
            continue
        flush()
        emit(v, codec, "    ")
    flush()
    if len(lines) == 1:
        lines.append("    pass")
    exec("\n".join(lines), env)
    return env["encode"]


def _compile_decoder(cls, upto: str | None = None):
    """decode(buf, pos) -> (record, pos); with `upto`, -> (that field's value, pos), the fields
    after it not read."""
    lines = ["def decode(buf, pos):", "    n = len(buf)"]
    env = {"_Slow": _Slow, "cls": cls, "str": str}
    names = []
    for step in cls.__decode_plan__:
        if type(step) is _FixedRun:
            run = f"S{len(env)}"
            env[run] = step.struct
            targets = [f"v{len(names) + i}" for i in range(len(step.names))]
            names += list(step.names)
            lines.append(f"    if pos + {step.struct.size} > n: raise _Slow")
            lines.append(f"    {', '.join(targets)}, = {run}.unpack_from(buf, pos)")
            lines.append(f"    pos += {step.struct.size}")
            if upto in step.names:
                lines.append(f"    return v{names.index(upto)}, pos")
                break
            continue
        name, codec = step
        v = f"v{len(names)}"
        names.append(name)
        kind = type(codec)
        if kind is UInt:
            single = f"U{len(env)}"
            env[single] = codec._struct
            lines.append(f"    if pos + {codec.width} > n: raise _Slow")
            lines.append(f"    {v}, = {single}.unpack_from(buf, pos)")
            lines.append(f"    pos += {codec.width}")
        elif kind is FixedBytes:
            lines.append(f"    if pos + {codec.length} > n: raise _Slow")
            lines.append(f"    {v} = buf[pos:pos + {codec.length}]")
            lines.append(f"    pos += {codec.length}")
        elif kind in (LenBytes, LenStr):
            length = f"L{len(env)}"
            env[length] = codec.len_codec._struct
            width = codec.len_codec.width
            lines.append(f"    if pos + {width} > n: raise _Slow")
            lines.append(f"    end = pos + {width} + {length}.unpack_from(buf, pos)[0]")
            lines.append("    if end > n: raise _Slow")
            if kind is LenStr:
                lines.append(f"    {v} = str(buf[pos + {width}:end], 'utf-8')")
            else:
                lines.append(f"    {v} = buf[pos + {width}:end]")
            lines.append("    pos = end")
        elif kind is EnumField:
            members = f"M{len(env)}"
            env[members] = codec.enum_type._value2member_map_
            lines.append("    if pos >= n: raise _Slow")
            lines.append(f"    {v} = {members}.get(buf[pos])")
            lines.append(f"    if {v} is None: raise _Slow")
            lines.append("    pos += 1")
        elif kind is Bool:
            lines.append("    if pos >= n or buf[pos] > 1: raise _Slow")
            lines.append(f"    {v} = buf[pos] == 1")
            lines.append("    pos += 1")
        else:
            field = f"C{len(env)}"
            env[field] = codec
            lines.append(f"    {v}, pos = {field}.decode(buf, pos)")
        if name == upto:
            lines.append(f"    return {v}, pos")
            break
    else:
        if upto is not None:
            raise KeyError(f"{cls.__name__} has no field {upto!r}")
        lines.append(f"    return cls({', '.join(f'v{i}' for i in range(len(names)))}), pos")
    exec("\n".join(lines), env)
    return env["decode"]
