"""POSIX attributes, symbolic links and directory markers, kept inside the NoKV schema.

The seed forbids xattr, symlink and dentry families, so nothing here adds a record (a nokvfs
extension, see README "Durable format"):

* A path's mode, optional owner and times are ONE reserved typed index field, POSIX_FIELD, in
  PathEntry.typed_index_projection. Commit members (CommitMember.typed_projection), snapshots
  (MVCC reads of PathCurrent) and restore (a copy of the entry) carry it with no new code. Its
  value is an index-codec Bytes value whose payload is `Attributes.encode()`. Reserved fields are
  projection-only: no SecondaryIndex row, refused as user index fields, invisible to search.
* A symbolic link is an artifact with content type SYMLINK_CONTENT_TYPE whose body is the target.
* A directory's attributes live on an empty-body artifact named DIRECTORY_MARKER (content type
  DIRECTORY_CONTENT_TYPE) inside it, created only when a directory attribute is set. Listings
  hide it; it is an ordinary PathCurrent row, so history, commits and restore carry it.

Attributes layout, version 1 (36 bytes, big-endian, one encoding per value so commit digests
are stable): u8 layout version (1) | u16 mode (0..0o7777) | u8 flags (bit 0: uid stored, bit 1:
gid stored; other bits 0) | u32 uid | u32 gid (0 when not stored) | i64 mtime_ns | i64 atime_ns
| i64 ctime_ns (signed nanoseconds since the epoch). Unknown versions, other lengths, unknown
flag bits, an absent owner with non-zero bytes and mode bits above 0o7777 fail closed.
"""

from __future__ import annotations

import dataclasses
import os
import stat as stat_module
import struct
import time
from dataclasses import dataclass

from nokvfs.errors import CorruptRecord, InvalidInput, UnknownVersion
from nokvfs.schema import index_codec
from nokvfs.schema.ids import creation_unix_ms
from nokvfs.schema.records import IndexField

RESERVED_FIELD_PREFIX = "nokvfs:"  # index field names with this prefix are reserved
POSIX_FIELD = "nokvfs:posix"  # the one reserved typed index field holding POSIX attributes
SYMLINK_CONTENT_TYPE = "inode/symlink"  # a symbolic link: an artifact whose body is the target
DIRECTORY_CONTENT_TYPE = "inode/directory"  # a directory's attributes marker (empty body)
DIRECTORY_MARKER = ".nokvfs-directory"  # reserved component name of a directory's marker
RESERVED_CONTENT_TYPES = (SYMLINK_CONTENT_TYPE, DIRECTORY_CONTENT_TYPE)
FILE_MODE = 0o644
LINK_MODE = 0o777
DIRECTORY_MODE = 0o755
MAX_LINK_TARGET = 4095  # bytes (PATH_MAX - 1)
MODE_BITS = 0o7777  # permission bits with setuid, setgid and sticky
MAX_ID = 0xFFFFFFFE  # uid_t/gid_t; (uid_t)-1 means "no change" to chown, so it is never an owner

LAYOUT_VERSION = 1
_LAYOUT = struct.Struct(">BHBIIqqq")
_UID_STORED = 0x01
_GID_STORED = 0x02
_I64 = (-(1 << 63), (1 << 63) - 1)


def now_ns() -> int:
    """The writer's clock, in one place (ctime of every change, times of new markers)."""
    return time.time_ns()


@dataclass(frozen=True)
class Attributes:
    mode: int  # permission bits only, 0..0o7777 (setuid/setgid/sticky included)
    uid: int | None  # None: not stored (shown as the mount's owner)
    gid: int | None
    mtime_ns: int  # signed nanoseconds since the epoch (times before 1970 allowed)
    atime_ns: int
    ctime_ns: int  # set by the writer to the time of the change it publishes

    def __post_init__(self) -> None:
        if not _is_int(self.mode) or not 0 <= self.mode <= MODE_BITS:
            raise InvalidInput(f"mode {self.mode!r} is not a permission mode (0..0o7777)")
        for name in ("uid", "gid"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_ID):
                raise InvalidInput(f"{name} {value!r} is not an owner id (0..{MAX_ID})")
        for name in ("mtime_ns", "atime_ns", "ctime_ns"):
            value = getattr(self, name)
            if not _is_int(value) or not _I64[0] <= value <= _I64[1]:
                raise InvalidInput(f"{name} {value!r} is not a signed 64-bit nanosecond time")

    def encode(self) -> bytes:
        flags = (_UID_STORED if self.uid is not None else 0) | (_GID_STORED if self.gid is not None else 0)
        return _LAYOUT.pack(
            LAYOUT_VERSION, self.mode, flags, self.uid or 0, self.gid or 0, self.mtime_ns, self.atime_ns, self.ctime_ns
        )

    @classmethod
    def decode(cls, raw: bytes) -> Attributes:
        if not isinstance(raw, (bytes, bytearray, memoryview)) or len(raw) == 0:
            raise CorruptRecord("POSIX attributes: no bytes")
        raw = bytes(raw)
        if raw[0] != LAYOUT_VERSION:
            raise UnknownVersion(f"POSIX attributes: unknown layout version {raw[0]}")
        if len(raw) != _LAYOUT.size:
            raise CorruptRecord(f"POSIX attributes: {len(raw)} bytes, layout {LAYOUT_VERSION} has {_LAYOUT.size}")
        _, mode, flags, uid, gid, mtime, atime, ctime = _LAYOUT.unpack(raw)
        if flags & ~(_UID_STORED | _GID_STORED):
            raise CorruptRecord(f"POSIX attributes: unknown flag bits {flags:#04x}")
        if (not flags & _UID_STORED and uid) or (not flags & _GID_STORED and gid):
            raise CorruptRecord("POSIX attributes: an owner id that is not stored has non-zero bytes")
        try:
            return cls(
                mode=mode,
                uid=uid if flags & _UID_STORED else None,
                gid=gid if flags & _GID_STORED else None,
                mtime_ns=mtime,
                atime_ns=atime,
                ctime_ns=ctime,
            )
        except InvalidInput as exc:
            raise CorruptRecord(f"POSIX attributes: {exc}") from None

    def replace(self, **changes) -> Attributes:
        return dataclasses.replace(self, **changes)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the reserved projection field ------------------------------------------------------------


def is_reserved_field(name: str) -> bool:
    return isinstance(name, str) and name.startswith(RESERVED_FIELD_PREFIX)


def _projection(entry) -> tuple:
    """PathEntry.typed_index_projection or CommitMember.typed_projection."""
    fields = getattr(entry, "typed_index_projection", None)
    return tuple(entry.typed_projection if fields is None else fields)


def user_fields(index_fields) -> tuple:
    """The projection without reserved fields: what SecondaryIndex rows, search and the mount's
    `user.nokv.*` xattrs see."""
    return tuple(f for f in index_fields if not is_reserved_field(f.name))


def posix_field(attrs: Attributes) -> IndexField:
    return IndexField(name=POSIX_FIELD, encoded_value=index_codec.encode(index_codec.bytes_(attrs.encode())))


def with_attributes(index_fields, attrs: Attributes | None) -> tuple:
    """The projection with the reserved field replaced by `attrs` (removed for None); the user
    fields keep their order, the reserved field goes last."""
    fields = user_fields(index_fields)
    return fields if attrs is None else fields + (posix_field(attrs),)


def of(entry) -> Attributes | None:
    """The stored attributes of a PathEntry or CommitMember, None if nothing is stored."""
    for field in _projection(entry):
        if field.name == POSIX_FIELD:
            try:
                value = index_codec.decode(bytes(field.encoded_value))
            except InvalidInput as exc:  # the index codec's own refusals are caller errors there
                raise CorruptRecord(f"{POSIX_FIELD}: {exc}") from None
            if value.kind is not index_codec.IndexKind.Bytes:
                raise CorruptRecord(f"{POSIX_FIELD} holds a {value.kind.name} value, not Bytes")
            return Attributes.decode(value.value)
    return None


def default_mode(entry) -> int:
    if is_symlink(entry):
        return LINK_MODE
    if entry.content_type == DIRECTORY_CONTENT_TYPE:
        return DIRECTORY_MODE
    return FILE_MODE


def revision_time_ns(entry) -> int:
    """The creation time of the entry's revision (its UUIDv7 timestamp): what every file showed
    before attributes were stored, and still shows when none are."""
    return creation_unix_ms(entry.artifact_revision_id) * 1_000_000


def shown(entry) -> Attributes:
    """The stored attributes, or the defaults: FILE_MODE (LINK_MODE for links, DIRECTORY_MODE for
    markers), no owner, all three times = the revision's creation time."""
    stored = of(entry)
    if stored is not None:
        return stored
    when = revision_time_ns(entry)
    return Attributes(mode=default_mode(entry), uid=None, gid=None, mtime_ns=when, atime_ns=when, ctime_ns=when)


def merged(
    base: Attributes, *, mode=None, uid=None, gid=None, mtime_ns=None, atime_ns=None, ctime_ns=None
) -> Attributes:
    """`base` with the given fields changed (None keeps a field)."""
    changes = {
        name: value
        for name, value in (
            ("mode", mode),
            ("uid", uid),
            ("gid", gid),
            ("mtime_ns", mtime_ns),
            ("atime_ns", atime_ns),
            ("ctime_ns", ctime_ns),
        )
        if value is not None
    }
    return base.replace(**changes)


# --- kinds ------------------------------------------------------------------------------------


def is_symlink(entry) -> bool:
    return entry is not None and entry.content_type == SYMLINK_CONTENT_TYPE


def is_directory_marker(entry_or_components) -> bool:
    """A marker entry (by content type), or a path (tuple of components) naming one."""
    if isinstance(entry_or_components, (tuple, list)):
        return bool(entry_or_components) and entry_or_components[-1] == DIRECTORY_MARKER
    return entry_or_components is not None and entry_or_components.content_type == DIRECTORY_CONTENT_TYPE


def from_stat(st: os.stat_result, *, keep_owner: bool) -> Attributes:
    """The attributes of a local file as `put` keeps them: mode bits and times (ctime is now, the
    time of this change), and the owner only when asked."""
    return Attributes(
        mode=stat_module.S_IMODE(st.st_mode),
        uid=st.st_uid if keep_owner else None,
        gid=st.st_gid if keep_owner else None,
        mtime_ns=st.st_mtime_ns,
        atime_ns=st.st_atime_ns,
        ctime_ns=now_ns(),
    )


def link_target_bytes(target: str) -> bytes:
    """A link target as stored: its UTF-8 bytes (surrogate escapes give back the raw bytes of a
    non-UTF-8 target read with os.readlink), 1..MAX_LINK_TARGET of them, no NUL."""
    if not isinstance(target, str):
        raise InvalidInput(f"a link target is a string, not {type(target).__name__}")
    try:
        raw = target.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise InvalidInput(f"link target {target!r} cannot be encoded") from None
    if not 1 <= len(raw) <= MAX_LINK_TARGET:
        raise InvalidInput(f"a link target is 1..{MAX_LINK_TARGET} bytes, not {len(raw)}")
    if b"\x00" in raw:
        raise InvalidInput("a link target cannot contain NUL")
    return raw


def link_target_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")
