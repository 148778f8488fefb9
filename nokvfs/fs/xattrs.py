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

A mount with `--no-xattrs` offers none: the first call of each kind answers ENOSYS, on which the
kernel answers every later one itself (EOPNOTSUPP; no ACL for `system.posix_acl_*`), without a
round trip to the daemon. That spares `ls -l` the two trips it makes per file (security.selinux,
system.posix_acl_access) and a write the one the kernel makes on a file's first write
(security.capability); the index fields stay readable with `nokvfs stat`.
"""

from __future__ import annotations

import datetime as _dt
import errno

from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import Kind
from nokvfs.schema.index_codec import IndexKind, IndexValue
from nokvfs.workspace import attributes, index

LIVE = "live"

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
    for field in attributes.user_fields(entry.typed_index_projection):
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


class Xattrs:
    """getxattr/listxattr/setxattr/removexattr of the mount's nodes."""

    def __init__(self, tree, *, offered: bool = True):
        self.tree = tree
        self.offered = offered
        self.calls = 0  # xattr requests that reached the daemon (`nokvfs status`)

    def _check_offered(self) -> None:
        self.calls += 1
        if not self.offered:
            raise refuse(errno.ENOSYS, "this mount offers no extended attributes (--no-xattrs)")

    def _file_entry(self, node):
        """The PathEntry a file node shows now (an open descriptor's, once detached), or None."""
        if node.bound is not None and (node.detached or node.in_use):
            return node.bound
        if node.detached:
            return None
        return self.tree.current_entry(node)

    def get(self, node, name: bytes) -> bytes:
        """A file's index fields as `user.nokv.<name>`, and read-only facts as `user.nokvfs.*`
        (not listed, so cp -a/rsync -X copy only the index fields)."""
        self._check_offered()
        if not name.startswith(b"user."):
            # What `ls -l` asks of every file (security.selinux, system.posix_acl_access): no
            # such attribute is ever stored, so no row is read to say so.
            raise refuse(errno.ENODATA, f"no extended attribute {name!r}")
        tree = self.tree
        if not node.kind.is_dir:
            entry = self._file_entry(node)
            if entry is None:
                raise refuse(errno.ENODATA, "not published yet")
            if name.startswith(INDEX_PREFIX):
                value = index_value(entry, name)
                if value is None:
                    raise refuse(errno.ENODATA, f"{node.describe()} has no index field {name[len(INDEX_PREFIX) :]!r}")
                return value
            facts = {
                b"user.nokvfs.generation": str(entry.generation),
                b"user.nokvfs.revision": entry.artifact_revision_id.hex(),
                b"user.nokvfs.digest": entry.body_digest_uri,
                b"user.nokvfs.content_type": entry.content_type,
                b"user.nokvfs.workbench": node.workbench_id,
            }
        elif node.kind is Kind.ROOT:
            facts = {b"user.nokvfs.root": tree.root.root_id.hex()}
        elif node.view != LIVE:
            view = tree.view_of(node)
            with view.read() as v:
                workbench = view.require(v, node.workbench_id, node.incarnation)
                generation = view.stat(v, workbench, node.components).generation
            facts = {
                b"user.nokvfs.generation": str(generation),
                b"user.nokvfs.incarnation": workbench.incarnation_id.hex(),
                b"user.nokvfs.workbench": workbench.workbench_id,
                **(view.facts() if node.kind is Kind.VIEW else {}),
            }
        else:
            with tree.view.read() as v:
                workbench = tree.view.require(v, node.workbench_id, node.incarnation)
            facts = {
                b"user.nokvfs.generation": str(workbench.revision),
                b"user.nokvfs.incarnation": workbench.incarnation_id.hex(),
                b"user.nokvfs.workbench": node.workbench_id,
            }
        value = facts.get(name)
        if value is None:
            raise refuse(errno.ENODATA, f"no attribute {name!r}")
        return value.encode()

    def list(self, node) -> list[bytes]:
        """The `user.nokv.<name>` attributes of a file's index fields (none elsewhere)."""
        self._check_offered()
        if node.kind.is_dir:
            return []
        entry = self._file_entry(node)
        return [] if entry is None else index_names(entry)

    def refuse_change(self, node):
        """setxattr/removexattr: EROFS inside a view, else ENOTSUP (nothing is stored)."""
        self._check_offered()
        if node.view != LIVE or node.kind in (Kind.HISTORY, Kind.VIEW) or self.tree.read_only:
            return refuse(errno.EROFS, f"extended attributes of {node.describe()}: read-only")
        return refuse(errno.ENOTSUP, "extended attributes are not stored (index fields are set at publication)")
