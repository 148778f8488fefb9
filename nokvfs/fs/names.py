"""The mount's name rules: what a directory entry may be called, how long a path may be, and
which places refuse which changes -- each refused at the call that names it, never at close.

* ENAMETOOLONG: a component over NAME_MAX (255) bytes, at every call that names it (lookup,
  create, mkdir, symlink, rename, unlink), as on a local filesystem; a path whose shard keys
  would exceed what the shard stores (about 440 UTF-8 bytes with LMDB's 511-byte keys, and the
  seed's 4,096 bytes / 64 components otherwise) at create, mkdir, symlink and rename.
* EINVAL: a name the seed's path normalizer refuses (a backslash, not UTF-8).
* EPERM: removing, renaming or replacing a workbench or a section; files or directories directly
  in `/` or `/<wb>/`; writes to `metadata/run_manifest.json` and `metadata/restore_manifest.json`
  (their commit/restore state machines own them) and to a directory's attribute marker.
* EROFS: any change inside a snapshot, commit or tag view, in `.commits/` or `.tags/`, or on a
  `--read-only` mount (`.snapshots/` takes mkdir and rmdir only).
* EXDEV: a rename across workbenches (or views).
"""

from __future__ import annotations

import errno

from nokvfs.errors import KeyTooLong, PathInvalid
from nokvfs.fs.errors import refuse
from nokvfs.fs.inodes import Kind, Node
from nokvfs.schema.paths import check_component, normalize_path
from nokvfs.workspace import attributes, publish
from nokvfs.workspace import workbench as wb

NAME_MAX = 255
LIVE = "live"


def component(raw: bytes, *, creating: bool) -> str | None:
    """A directory entry name as the path normalizer accepts it; None: no such entry can exist.

    A name longer than NAME_MAX is ENAMETOOLONG wherever it is used, lookups included.
    """
    if len(raw) > NAME_MAX:
        raise refuse(errno.ENAMETOOLONG, f"a name of {len(raw)} bytes is longer than {NAME_MAX}")
    try:
        name = raw.decode("utf-8")
        check_component(name)
        return name
    except (UnicodeDecodeError, PathInvalid) as exc:
        if creating:
            raise refuse(errno.EINVAL, f"name {raw!r} is not a valid path component: {exc}") from None
        return None


def check_storable(root, node_or_workbench: str, components: tuple) -> None:
    """ENAMETOOLONG unless a file at `components` fits the seed's limits and the shard's keys."""
    try:
        normalize_path("/".join(components))
    except PathInvalid as exc:
        raise refuse(errno.ENAMETOOLONG if "more than" in str(exc) else errno.EINVAL, str(exc)) from None
    try:
        publish.check_key_lengths(root, components)
    except KeyTooLong as exc:
        raise refuse(errno.ENAMETOOLONG, f"/{node_or_workbench}/{'/'.join(components)}: {exc}") from None


def check_publishable(root, node: Node, components: tuple) -> None:
    """A file may be written at `components`: storable, and not a path a state machine owns."""
    check_storable(root, node.workbench_id, components)
    if components in publish.RESERVED_MANIFESTS:
        raise refuse(
            errno.EPERM,
            f"/{node.workbench_id}/{'/'.join(components)} is written only by its commit/restore state machine",
        )
    if components[-1] == attributes.DIRECTORY_MARKER:
        raise refuse(errno.EPERM, f"{components[-1]!r} is reserved for a directory's attributes")


def check_directory_path(root, node: Node, components: tuple) -> None:
    """A directory may be made at `components`: its attribute marker fits, and it is not a path a
    state machine owns as a file."""
    check_storable(root, node.workbench_id, components + (attributes.DIRECTORY_MARKER,))
    if components in publish.RESERVED_MANIFESTS or components[-1] == attributes.DIRECTORY_MARKER:
        raise refuse(errno.EPERM, f"/{node.workbench_id}/{'/'.join(components)} is reserved")


def check_writable(what: str, read_only: bool, *nodes: Node) -> None:
    """EROFS for a change inside a read-only view (or `.commits`/`.tags`) or on a --read-only mount."""
    for node in nodes:
        if node.view != LIVE or node.kind in (Kind.HISTORY, Kind.VIEW):
            raise refuse(errno.EROFS, f"{what}: {node.describe()} is in a read-only view")
    if read_only:
        raise refuse(errno.EROFS, f"{what}: the mount is read-only")


def check_entry_parent(parent: Node, what: str) -> None:
    """Files, links and directories live below a section: EPERM in `/` and `/<wb>/`."""
    if parent.kind in (Kind.ROOT, Kind.WORKBENCH):
        raise refuse(errno.EPERM, f"{what}: entries live below a section {wb.SECTIONS}, not in {parent.describe()}")
    if not parent.kind.is_dir:
        raise refuse(errno.ENOTDIR, f"{parent.describe()} is not a directory")
