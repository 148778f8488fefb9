"""The inode table: deterministic inode numbers, the collision table, lookup counts and forget.

An inode number is xxh3-64 over (view, workspace incarnation, path), so the same path of the same
workbench incarnation gets the same number on every mount and after every daemon restart. The
seed has no inode of its own (a path *is* the identity), so nothing durable is kept here. The
view is "live" or the identity of a read-only view (`snapshot:<id>[:<alias>]`,
`commit:<hex>[:<prefix>]`, `tag:<hex>:<name>`, see nokvfs.fs.views), so a past version of a path
never shares a number -- or page cache -- with its live version.

Numbers 0 and 1 (the root) and any number already held by another live node are never handed out:
the key is re-hashed with seeds 1, 2, ... until a free number comes up, and the key keeps that
number in the collision table while the daemon runs. A collision is therefore stable for one
daemon's life; across restarts the first key looked up gets the primary hash (with 2**64 values
this needs ~4 billion live paths to become likely).

A node lives while the kernel holds a lookup count on it or a handle is open on it. A node whose
path was removed or renamed over while the kernel still holds it is *detached*: it keeps its
number and last attributes for the kernel, and a new file at that path gets a different number,
so open descriptors of the old file never share page cache with the new one.
"""

from __future__ import annotations

import logging
import typing

import pyfuse3
import xxhash

from nokvfs.workspace import attributes

log = logging.getLogger(__name__)

ROOT_INODE = pyfuse3.ROOT_INODE
_RESERVED = range(0, 16)  # 0 is "no inode" to FUSE, 1 is the root; keep a little headroom
_DOMAIN = b"nokvfs.inode.v1\0"


class Kind:
    """What an inode is. A fixed set of singletons compared with `is`, like an enum's members, but
    a plain class: on Python 3.11 every `Kind.X` of an enum.Enum goes through EnumType.__getattr__
    (about 150 ns each) and its hash through a Python __hash__, and a listing or lookup takes
    several of each per entry."""

    ROOT: typing.ClassVar[Kind]  # the mount's `/`: the Visible workbenches
    WORKBENCH: typing.ClassVar[Kind]  # `/<wb>/`: the five sections
    SECTION: typing.ClassVar[Kind]  # `/<wb>/<section>/`: always present, never removable
    DIR: typing.ClassVar[Kind]  # an implicit directory below a section
    FILE: typing.ClassVar[Kind]
    LINK: typing.ClassVar[Kind]  # a symbolic link (an artifact whose body is the target)
    HISTORY: typing.ClassVar[Kind]  # `/<wb>/.snapshots`, `/<wb>/.commits`, `/<wb>/.tags`: the as-of views
    VIEW: typing.ClassVar[Kind]  # `/<wb>/.snapshots/<name>/` ...: a read-only view's workbench directory

    __slots__ = ("name", "value", "is_dir")

    def __init__(self, name: str, value: str, is_dir: bool):
        self.name = name
        self.value = value
        self.is_dir = is_dir  # listed and looked up in like a directory

    def __repr__(self) -> str:
        return f"<Kind.{self.name}>"

    def __reduce__(self):
        return getattr, (Kind, self.name)


for _name, _is_dir in (
    ("ROOT", True),
    ("WORKBENCH", True),
    ("SECTION", True),
    ("DIR", True),
    ("FILE", False),
    ("LINK", False),
    ("HISTORY", True),
    ("VIEW", True),
):
    setattr(Kind, _name, Kind(_name, _name.lower(), _is_dir))
del _name, _is_dir


class Node:
    """What the daemon knows about one inode the kernel may hold.

    A file's inode shows one revision (`facts`, and `bound` while descriptors are open) for its
    whole life, except where this mount itself publishes the inode's next revision (its pages are
    then exactly those bytes). When the path moves to another revision any other way, the node is
    detached and the path gets a fresh inode: the kernel's page cache and its cached size of an
    inode never belong to two revisions.
    """

    __slots__ = (
        "ino",
        "kind",
        "view",
        "workbench_id",
        "incarnation",
        "components",
        "nlookup",
        "facts",
        "bound",
        "spool",
        "handles",
        "open_count",
        "dir_ctime_ns",
        "dir_subdirs",
        "dir_scans",
        "detached",
    )

    def __init__(
        self, ino: int, kind: Kind, view: str, workbench_id: str | None, incarnation: bytes | None, components: tuple
    ):
        self.ino = ino
        self.kind = kind
        self.view = view
        self.workbench_id = workbench_id
        self.incarnation = incarnation
        self.components = components
        self.nlookup = 0
        # FILE/LINK: the few numbers attributes need of the revision the inode shows (a node keeps
        # these, not the whole PathEntry: a listing of 100,000 files makes 100,000 nodes). None:
        # unknown (a new file, or forgotten after a change).
        self.facts = None
        self.bound = None  # FILE/LINK: the PathEntry open descriptors read (while any is open)
        self.spool = None  # FILE: the one write state of the file in this mount (nokvfs.fs.spools)
        self.handles = 0  # open file descriptors (FILE/LINK)
        self.open_count = 0  # open handles of any kind (file and directory)
        self.dir_ctime_ns = None  # directories: the derived change time, cached until a change below
        # directories: how many subdirectories they hold (st_nlink is 2 more), cached until a
        # directory below is made, removed or moved; -1: too many children to count
        self.dir_subdirs = None
        self.dir_scans = 0  # directories: scans of their children so far (see Tree.subdirectories_changed)
        self.detached = False

    def learn(self, entry) -> None:
        """Remember what the attributes need of a PathEntry."""
        self.facts = facts_of(entry)

    def unlearn(self) -> None:
        self.facts = None

    @property
    def revision(self) -> bytes | None:
        return None if self.facts is None else self.facts.revision_id

    @property
    def in_use(self) -> bool:
        """Descriptors are open on it, or this mount is writing it."""
        return self.handles > 0 or self.spool is not None

    def shows(self, entry) -> bool:
        """Whether the node can stand for `entry`: it shows that revision, or none yet."""
        return self.facts is None or self.facts.revision_id == entry.artifact_revision_id

    @property
    def key(self) -> tuple:
        return (self.view, self.incarnation, self.components)

    @property
    def path(self) -> str:
        return "/".join(self.components)

    def describe(self) -> str:
        if self.kind is Kind.ROOT:
            return "/"
        if self.view != "live":
            return f"/{self.workbench_id}@{self.view}/{self.path}".rstrip("/")
        return f"/{self.workbench_id}/{self.path}".rstrip("/")

    def __repr__(self) -> str:
        return f"Node({self.ino}, {self.kind.value}, {self.describe()!r}, nlookup={self.nlookup})"


class Facts(typing.NamedTuple):
    """What the attributes of a file or link show (from its PathEntry)."""

    revision_id: bytes
    size: int
    is_link: bool
    mode: int  # permission bits
    uid: int | None  # None: not stored, shown as the mount's owner
    gid: int | None
    mtime_ns: int
    atime_ns: int
    ctime_ns: int


def facts_of(entry) -> Facts:
    shown = attributes.shown(entry)
    return Facts(
        entry.artifact_revision_id,
        entry.logical_size,
        attributes.is_symlink(entry),
        shown.mode,
        shown.uid,
        shown.gid,
        shown.mtime_ns,
        shown.atime_ns,
        shown.ctime_ns,
    )


def hashed_inode(view: str, incarnation: bytes, components: tuple, seed: int = 0) -> int:
    data = _DOMAIN + view.encode() + b"\0" + incarnation + b"\0" + "/".join(components).encode("utf-8")
    return xxhash.xxh3_64_intdigest(data, seed=seed)


class InodeTable:
    def __init__(self):
        self._by_ino: dict[int, Node] = {}
        self._by_key: dict[tuple, Node] = {}
        self._collided: dict[tuple, int] = {}  # key -> the non-primary number it was given
        self.collisions = 0
        self.root = Node(ROOT_INODE, Kind.ROOT, "live", None, None, ())
        self.root.nlookup = 1 << 62  # the kernel never forgets the root
        self._by_ino[ROOT_INODE] = self.root

    def __len__(self) -> int:
        return len(self._by_ino)

    def get(self, ino: int) -> Node | None:
        return self._by_ino.get(ino)

    def find(self, view: str, incarnation: bytes, components: tuple) -> Node | None:
        """The live, attached node of a path, if the kernel may hold one."""
        return self._by_key.get((view, incarnation, components))

    def node(self, kind: Kind, view: str, workbench_id: str, incarnation: bytes, components: tuple) -> Node:
        """The node of a path, created with its deterministic number when it is not live."""
        key = (view, incarnation, components)
        node = self._by_key.get(key)
        if node is not None:
            node.kind = kind
            return node
        ino = self._allocate(key)
        node = Node(ino, kind, view, workbench_id, incarnation, components)
        self._by_ino[ino] = node
        self._by_key[key] = node
        return node

    def _allocate(self, key: tuple) -> int:
        remembered = self._collided.get(key)
        if remembered is not None and remembered not in self._by_ino:
            return remembered
        seed = 0
        while True:
            ino = hashed_inode(key[0], key[1], key[2], seed)
            if ino not in _RESERVED and ino not in self._by_ino:
                if seed:
                    self.collisions += 1
                    self._collided[key] = ino
                    log.info("inode collision for %r: using %d (seed %d)", key[2], ino, seed)
                return ino
            seed += 1

    def remember(self, node: Node, count: int = 1) -> None:
        """The kernel took `count` more lookup references (lookup, create, mkdir, readdirplus)."""
        node.nlookup += count

    def forget(self, ino: int, count: int) -> None:
        node = self._by_ino.get(ino)
        if node is None or node is self.root:
            return
        node.nlookup = max(0, node.nlookup - count)
        self._maybe_drop(node)

    def unused(self, node: Node) -> None:
        """A node made for a reply the kernel did not take (readdir buffer full)."""
        self._maybe_drop(node)

    def closed(self, node: Node) -> None:
        """A handle on the node was released."""
        node.open_count = max(0, node.open_count - 1)
        self._maybe_drop(node)

    def settled(self, node: Node) -> None:
        """A node's spool was settled after its last descriptor went (write-back: by the publisher)."""
        self._maybe_drop(node)

    def _maybe_drop(self, node: Node) -> None:
        if node is self.root:
            return  # the kernel never looks the root up: it is held for the mount's life
        if node.nlookup == 0 and node.open_count == 0 and node.spool is None:
            self._by_ino.pop(node.ino, None)
            if self._by_key.get(node.key) is node:
                del self._by_key[node.key]

    def detach(self, node: Node) -> None:
        """The path is gone (removed, renamed over): the node lives on only for the kernel."""
        if self._by_key.get(node.key) is node:
            del self._by_key[node.key]
        node.detached = True
        self._maybe_drop(node)

    def move(self, node: Node, components: tuple) -> None:
        """A rename: the kernel keeps the inode, so the node follows it to its new path."""
        if self._by_key.get(node.key) is node:
            del self._by_key[node.key]
        displaced = self._by_key.get((node.view, node.incarnation, components))
        if displaced is not None and displaced is not node:
            self.detach(displaced)
        node.components = components
        node.detached = False
        self._by_key[node.key] = node

    def attached(self) -> list[Node]:
        """Every node a path still names (what the kernel may hold by name)."""
        return list(self._by_key.values())

    def below(self, view: str, incarnation: bytes, components: tuple) -> list[Node]:
        """The attached nodes strictly below a directory (a directory rename moves them all)."""
        depth = len(components)
        return [
            node
            for (v, inc, path), node in list(self._by_key.items())
            if v == view and inc == incarnation and len(path) > depth and path[:depth] == components
        ]

    def with_spools(self) -> list[Node]:
        """The nodes holding write state (a spool) now."""
        return [node for node in self._by_ino.values() if node.spool is not None]

    def of_workbench(self, workbench_id: str):
        return [node for node in list(self._by_ino.values()) if node.workbench_id == workbench_id]
