"""The mount's directory tree: names to nodes, and the rules of what may change where.

    /                     the Visible workbenches (mkdir creates one; nothing else lives here)
    /<wb>/                the five sections, always present, never removed, renamed or shadowed,
                          and beside them the dot-names of the read-only views (`ls -a`):
    /<wb>/.snapshots/     Active snapshots by id and alias; mkdir <alias> mints, rmdir retires
    /<wb>/.commits/       the head's first-parent log by full id; any unique prefix resolves
    /<wb>/.tags/          the tags
    /<wb>/.snapshots/<name>/<section>/...   the workbench as of that point (nokvfs.fs.views)
    /<wb>/<section>/...   artifacts and implicit directories (plus this daemon's overlay)

Reads follow the seed's cost model. A cold lookup is one WorkspaceCurrent point read (it also
proves the workbench is still the incarnation the parent node was made for) and one PathCurrent
point read; a miss costs one bounded prefix probe for an implicit directory. getattr of a file is
one PathCurrent point read (the incarnation is cached) and never reads the ArtifactRevision; of a
directory, nothing. A listing is the engine's delimiter scan, one page of at most 255 children at
a time from the anchor the directory handle keeps.

Writes are facade calls (one MetadataCommand each, an LMDB write transaction that syncs), run in
worker threads. What the tree refuses, and with which errno:

* EPERM:  removing, renaming or replacing a workbench or a section; files or directories directly
          in `/` or `/<wb>/`; writes to `metadata/run_manifest.json`, `metadata/restore_manifest.json`
* EROFS:  any change inside a snapshot, commit or tag view, in `.commits/` or `.tags/`, or on a
          `--read-only` mount (`.snapshots/` takes mkdir and rmdir only)
* EINVAL: mkdir of a numeric name (or an invalid alias) in `.snapshots/`
* EBUSY:  rmdir of a snapshot a restore/fork still consumes
* EXDEV:  rename across workbenches (or views); rename of a directory that holds published files
          (directories are implicit prefixes: moving one is one rename per file, not one command,
          so like overlayfs the mount answers EXDEV and `mv` falls back to copy and remove)
* EINVAL: RENAME_EXCHANGE; a name the path normalizer refuses (backslash, non-UTF-8)
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import time

from nokvfs.errors import GenerationConflict, NameInvalid, NotFound, PathInvalid
from nokvfs.fs import attrs, overlay as overlays
from nokvfs.fs import views as views_
from nokvfs.fs import xattrs
from nokvfs.fs.errors import refuse
from nokvfs.fs.handles import DirHandle, ReadHandle, WriteHandle
from nokvfs.fs.inodes import ROOT_INODE, InodeTable, Kind, Node
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.schema.ids import creation_unix_ms
from nokvfs.schema.names import check_snapshot_alias, check_workbench_id
from nokvfs.schema.paths import check_component, normalize_path, ordered_component
from nokvfs.workspace import namespace, publish, snapshot
from nokvfs.workspace import workbench as wb

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
PAGE = 255
_OWN_CHANGES_BOUND = 65536
_PATH_KINDS = (ChangeEventKind.PathPut, ChangeEventKind.PathAppended, ChangeEventKind.PathRemoved, ChangeEventKind.PathRenamed)
_HISTORY_KINDS = (
    ChangeEventKind.SnapshotMinted,
    ChangeEventKind.SnapshotRetired,
    ChangeEventKind.CommitPublished,
    ChangeEventKind.TagSet,
    ChangeEventKind.TagDeleted,
)
_VIEW_CACHE = 4096  # read-only view objects kept (each is rebuilt from its identity on demand)
LIVE = views_.LIVE


def _ms_to_ns(ms: int) -> int:
    return ms * 1_000_000


class Tree:
    def __init__(self, root, view, workers, invalidator, *, uid: int | None = None, gid: int | None = None):
        self.root = root
        self.view = view
        self.workers = workers
        self.invalidator = invalidator
        self.inodes = InodeTable()
        self.overlay = overlays.Overlay()
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.read_only = view.read_only
        self.mounted_ns = time.time_ns()
        self._workbench_times: dict[str, int] = {}
        self._root_mtime_ns = self.mounted_ns
        self._own = collections.OrderedDict()  # (event kind, revision id) this mount committed
        # Paths with a change of this mount in flight: their events wait until it is known whether
        # they are this mount's own (the commit lands before the facade call returns).
        self._inflight = collections.Counter()
        self._deferred: dict[tuple, list] = {}
        self._statfs = None
        self._views = collections.OrderedDict()  # (identity, incarnation) -> read-only view
        self.refresh_workbenches()

    # --- names ------------------------------------------------------------------------------------

    @staticmethod
    def component(raw: bytes, *, creating: bool) -> str | None:
        """A directory entry name as the path normalizer accepts it (None: cannot exist)."""
        try:
            name = raw.decode("utf-8")
            check_component(name)
            return name
        except (UnicodeDecodeError, PathInvalid) as exc:
            if creating:
                raise refuse(errno.EINVAL, f"name {raw!r} is not a valid path component: {exc}") from None
            return None

    def node(self, ino: int) -> Node:
        node = self.inodes.get(ino)
        if node is None:
            raise refuse(errno.ESTALE, f"inode {ino} is not known to this mount")
        return node

    def _writable(self, what: str, *nodes: Node) -> None:
        """EROFS for a change inside a read-only view (or `.commits`/`.tags`) or on a --read-only mount."""
        for node in nodes:
            if node.view != LIVE or node.kind in (Kind.HISTORY, Kind.VIEW):
                raise refuse(errno.EROFS, f"{what}: {node.describe()} is in a read-only view")
        if self.read_only:
            raise refuse(errno.EROFS, f"{what}: the mount is read-only")

    def check_writable(self, what: str, node: Node) -> None:
        self._writable(what, node)

    # --- views ---------------------------------------------------------------------------------

    def view_of(self, node: Node):
        """The view a node reads from: the live view, or the read-only view its identity names."""
        if node.view == LIVE:
            return self.view
        key = (node.view, node.incarnation)
        view = self._views.get(key)
        if view is None:
            view = views_.from_identity(self.root, node.view, node.workbench_id, node.incarnation)
            self._keep_view(view)
        else:
            self._views.move_to_end(key)
        return view

    def _keep_view(self, view) -> None:
        self._views[(view.name, view.incarnation)] = view
        while len(self._views) > _VIEW_CACHE:
            self._views.popitem(last=False)

    def _history_node(self, workbench_node: Node, family: str) -> Node:
        return self.inodes.node(Kind.HISTORY, LIVE, workbench_node.workbench_id, workbench_node.incarnation, (family,))

    def _view_root(self, view) -> Node:
        self._keep_view(view)
        return self.inodes.node(Kind.VIEW, view.name, view.workbench_id, view.incarnation, ())

    # --- workbenches -----------------------------------------------------------------------------

    def refresh_workbenches(self) -> list[wb.Workbench]:
        with self.view.read() as v:
            found = self.view.workbenches(v)
        for workbench in found:
            self._workbench_times.setdefault(workbench.workbench_id, _ms_to_ns(creation_unix_ms(workbench.incarnation_id)))
        self._workbenches = sorted(found, key=lambda w: w.workbench_id)
        if self._workbench_times:
            self._root_mtime_ns = max(self._workbench_times.values())
        return self._workbenches

    def _workbench_node(self, workbench: wb.Workbench) -> Node:
        return self.inodes.node(Kind.WORKBENCH, self.view.name, workbench.workbench_id, workbench.incarnation_id, ())

    def _child(self, parent: Node, kind: Kind, name: str) -> Node:
        return self.inodes.node(kind, parent.view, parent.workbench_id, parent.incarnation, parent.components + (name,))

    def parent_of(self, node: Node) -> Node:
        if node.kind in (Kind.ROOT, Kind.WORKBENCH):
            return self.inodes.root
        if node.kind is Kind.VIEW:
            family = self.view_of(node).family
            return self.inodes.node(Kind.HISTORY, LIVE, node.workbench_id, node.incarnation, (family,))
        components = node.components[:-1]
        if not components and node.view != LIVE:
            return self.inodes.node(Kind.VIEW, node.view, node.workbench_id, node.incarnation, ())
        kind = Kind.WORKBENCH if not components else Kind.SECTION if len(components) == 1 else Kind.DIR
        return self.inodes.node(kind, node.view, node.workbench_id, node.incarnation, components)

    # --- lookup and attributes -------------------------------------------------------------------

    def lookup(self, parent: Node, name: str | None) -> Node | None:
        if name is None:
            return None
        if name == ".":
            return parent
        if name == "..":
            return self.parent_of(parent)
        if parent.kind is Kind.FILE:
            raise refuse(errno.ENOTDIR, f"{parent.describe()} is a file")
        if parent.kind is Kind.HISTORY:
            with self.view.read() as v:
                workbench = self.view.require(v, parent.workbench_id, parent.incarnation)
            view = views_.resolve(self.root, workbench, parent.components[0], name)
            return None if view is None else self._view_root(view)
        view = self.view_of(parent)
        with view.read() as v:
            if parent.kind is Kind.ROOT:
                try:
                    check_workbench_id(name)
                    return self._workbench_node(self.view.workbench(v, name))
                except (NameInvalid, NotFound):
                    return None
            workbench = view.require(v, parent.workbench_id, parent.incarnation)
            if parent.kind is Kind.WORKBENCH:
                if name in views_.HISTORY_DIRS:
                    return self._history_node(parent, name)
                return self._child(parent, Kind.SECTION, name) if name in wb.SECTIONS else None
            if parent.kind is Kind.VIEW:
                return self._child(parent, Kind.SECTION, name) if name in wb.SECTIONS else None
            components = parent.components + (name,)
            try:
                found = view.stat(v, workbench, components)
            except NotFound:
                found = None
        if found is not None and found.entry is not None:
            node = self._child(parent, Kind.FILE, name)
            node.learn(found.entry)
            return node
        if found is not None:
            return self._child(parent, Kind.DIR, name)
        if parent.view != LIVE:
            return None
        pending = self.overlay.pending(parent.incarnation, components)
        if pending is not None:
            return pending
        if self.overlay.is_dir(parent.incarnation, components):
            return self._child(parent, Kind.DIR, name)
        return None

    def attributes(self, node: Node, *, fresh: bool = True):
        kind = node.kind
        if kind is Kind.ROOT:
            return self._attrs(node, 0, self._root_mtime_ns)
        if kind.is_dir:
            mtime = self._workbench_times.get(node.workbench_id)
            if mtime is None:
                mtime = _ms_to_ns(creation_unix_ms(node.incarnation))
            return self._attrs(node, 0, mtime)
        writer = self.latest_writer(node) if node.view == LIVE else None
        if writer is not None:
            mtime = writer.mtime_ns if writer.dirty or writer.base is None else _ms_to_ns(creation_unix_ms(writer.base.artifact_revision_id))
            return self._attrs(node, writer.size, mtime)
        view = self.view_of(node)
        # A view's file never changes: what a lookup or listing learnt of it stays true.
        if ((fresh and not view.immutable) or node.mtime_ns is None) and not node.detached:
            with view.read() as v:
                entry = view.entry(v, node.incarnation, node.components)
            if entry is not None and node.readers and all(
                h.entry is None or h.entry.artifact_revision_id != entry.artifact_revision_id for h in node.readers
            ):
                # The path was replaced under open readers and the change feed has not said so
                # yet: this inode stays the file they opened (size included), as the follower
                # would leave it, and the path gets a fresh inode at its next lookup.
                self._path_changed(node.incarnation, node.components, False, entry.artifact_revision_id)
            elif entry is not None:
                node.learn(entry)
        if node.mtime_ns is None:
            return self._attrs(node, 0, self.mounted_ns)
        return self._attrs(node, node.size, node.mtime_ns)

    def _attrs(self, node: Node, size: int, mtime_ns: int):
        in_view = node.view != LIVE
        timeouts = attrs.READ_ONLY_TIMEOUTS if in_view else None
        # `.snapshots` takes mkdir and rmdir; `.commits` and `.tags` take nothing.
        read_only = self.read_only or in_view or (node.kind is Kind.HISTORY and node.components[0] != views_.SNAPSHOTS)
        return attrs.build(node, size=size, mtime_ns=mtime_ns, uid=self.uid, gid=self.gid, read_only=read_only, timeouts=timeouts)

    @staticmethod
    def latest_writer(node: Node):
        """The handle whose bytes a reader of the node sees: the last one written in this mount."""
        if not node.writers:
            return None
        return max(node.writers, key=lambda h: h.mtime_ns)

    # --- listing ---------------------------------------------------------------------------------

    def opendir(self, fh: int, node: Node) -> DirHandle:
        if not node.kind.is_dir:
            raise refuse(errno.ENOTDIR, f"{node.describe()} is a file")
        handle = DirHandle(fh, node)
        # Directories with a short, fixed or facade-listed set of names are listed from a list
        # taken at opendir (like the root's workbenches); the others page the delimiter scan.
        sections = [(name, Kind.SECTION, None, None) for name in sorted(wb.SECTIONS)]
        if node.kind is Kind.ROOT:
            handle.static = [(w.workbench_id, Kind.WORKBENCH, w, None) for w in self.refresh_workbenches()]
        elif node.kind is Kind.WORKBENCH:
            with self.view.read() as v:
                self.view.require(v, node.workbench_id, node.incarnation)
            handle.static = [(name, Kind.HISTORY, None, None) for name in views_.HISTORY_DIRS] + sections
        elif node.kind is Kind.HISTORY:
            with self.view.read() as v:
                workbench = self.view.require(v, node.workbench_id, node.incarnation)
            handle.static = [(name, Kind.VIEW, view, None) for name, view in views_.names(self.root, workbench, node.components[0])]
        elif node.kind is Kind.VIEW:
            view = self.view_of(node)
            with view.read() as v:
                view.require(v, node.workbench_id, node.incarnation)
            handle.static = sections
        node.open_count += 1
        return handle

    def seek(self, handle: DirHandle, start_id: int) -> None:
        """Position the handle so the next entry handed over has offset start_id + 1."""
        if start_id == handle.pos:
            return
        if start_id == 0:
            handle.reset()
            return
        if handle.restore(start_id):
            return
        # An offset this handle no longer remembers: recount from the start (bounded memory).
        handle.reset()
        while handle.pos < start_id:
            if not handle.buffer and not self.fill(handle):
                return
            self.advance(handle, handle.buffer.popleft())

    def fill(self, handle: DirHandle) -> bool:
        """Fetch the next page of children into handle.buffer; False at the end of the listing.

        Items are (name, kind, PathEntry | Workbench | view | None, overlay index | None).
        """
        node = handle.node
        if handle.phase == "done":
            return False
        if handle.static is not None:
            index = handle.anchor or 0
            handle.buffer.extend(handle.static[index : index + PAGE])
            if not handle.buffer:
                handle.phase = "done"
            return bool(handle.buffer)
        if handle.phase == "scan":
            view = self.view_of(node)
            with view.read() as v:
                workbench = view.require(v, node.workbench_id, node.incarnation)
                children, anchor = view.children(v, workbench, node.components, start_after=handle.anchor, limit=PAGE)
            child_kind = Kind.SECTION if node.kind in (Kind.WORKBENCH, Kind.VIEW) else Kind.DIR
            for child in children:
                if child.entry is not None:
                    handle.buffer.append((child.name, Kind.FILE, child.entry, None))
                else:
                    handle.buffer.append((child.name, child_kind, None, None))
            if anchor is None:
                handle.phase = "overlay"
            if handle.buffer:
                return True
        if handle.phase == "overlay":
            if node.kind is not Kind.WORKBENCH and node.view == LIVE:
                names = self.overlay.children(node.incarnation, node.components)
                with self.view.read() as v:
                    for index in range(handle.overlay_index, len(names)):
                        name, kind = names[index]
                        components = node.components + (name,)
                        if self.view.entry(v, node.incarnation, components) is None and not self.view.has_children(v, node.incarnation, components):
                            handle.buffer.append((name, Kind.FILE if kind == overlays.FILE else Kind.DIR, None, index))
            handle.phase = "done"
            return bool(handle.buffer)
        return False

    def entry_node(self, handle: DirHandle, item) -> Node | None:
        """The node of a buffered listing item (None: it is gone, skip it)."""
        name, kind, extra, overlay_index = item
        parent = handle.node
        if kind is Kind.WORKBENCH:
            return self._workbench_node(extra)
        if kind is Kind.HISTORY:
            return self._history_node(parent, name)
        if kind is Kind.VIEW:
            return self._view_root(extra)
        if overlay_index is not None and kind is Kind.FILE:
            return self.overlay.pending(parent.incarnation, parent.components + (name,))
        node = self._child(parent, kind, name)
        if kind is Kind.FILE:
            node.learn(extra)
        return node

    def advance(self, handle: DirHandle, item) -> None:
        """`item` (just taken from the head of the buffer) was handed to the kernel."""
        handle.pos += 1
        if item[3] is not None:
            handle.overlay_index = item[3] + 1
        elif handle.static is not None:
            handle.anchor = (handle.anchor or 0) + 1
        else:
            handle.anchor = ordered_component(item[0])
        if handle.buffer:
            resume = "overlay" if handle.buffer[0][3] is not None else "scan"
        else:
            resume = handle.phase
        handle.remember(resume)

    def releasedir(self, handle: DirHandle) -> None:
        self.inodes.closed(handle.node)

    # --- opening files ---------------------------------------------------------------------------

    def _publishable(self, node: Node, components: tuple) -> None:
        try:
            normalize_path("/".join(components))  # depth and length limits, before any byte is spooled
        except PathInvalid as exc:
            raise refuse(errno.ENAMETOOLONG if "more than" in str(exc) else errno.EINVAL, str(exc)) from None
        if components in publish.RESERVED_MANIFESTS:
            raise refuse(errno.EPERM, f"/{node.workbench_id}/{'/'.join(components)} is written only by its commit/restore state machine")

    def open(self, fh: int, node: Node, flags: int):
        """A ReadHandle or WriteHandle for an open(2) of a file, and whether to keep the page cache."""
        if node.kind.is_dir:
            raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        if writing or flags & os.O_TRUNC:
            self._writable(f"open {node.describe()} for writing", node)
            self._publishable(node, node.components)
        view = self.view_of(node)
        entry = None
        if not node.detached:
            with view.read() as v:
                entry = view.entry(v, node.incarnation, node.components)
        elif node.readers and not writing:
            entry = next(iter(node.readers)).entry  # a detached file reopened (/proc/PID/fd/N)
        pending = self.overlay.pending(node.incarnation, node.components) is node
        if entry is None and not pending and not node.writers:
            raise refuse(errno.ENOENT, f"{node.describe()} no longer exists")
        # A view's inode only ever has one revision: its page cache is always right.
        keep_cache = entry is not None and (view.immutable or node.kernel_revision == entry.artifact_revision_id)
        if entry is not None:
            node.learn(entry)
            node.kernel_revision = entry.artifact_revision_id
        if not writing:
            handle = ReadHandle(fh, node, entry)
            if node.readers is None:
                node.readers = set()
            node.readers.add(handle)
        else:
            handle = WriteHandle(
                fh,
                node,
                self.root,
                workbench_id=node.workbench_id,
                incarnation=node.incarnation,
                components=node.components,
                base=entry,
                append=bool(flags & os.O_APPEND),
                expected_generation=0 if entry is None else entry.generation,
                creating=entry is None,
            )
            if flags & os.O_TRUNC:  # libfuse negotiates atomic O_TRUNC: the flag arrives here
                handle.filled, handle.size, handle.dirty, handle.written, handle.append_mode = True, 0, True, True, False
            self._add_writer(node, handle)
        node.open_count += 1
        return handle, keep_cache

    def create(self, fh: int, parent: Node, name: str, flags: int):
        """A new file (pending in the overlay until its first close publishes it)."""
        self._writable(f"create {name}", parent)
        if parent.kind in (Kind.ROOT, Kind.WORKBENCH):
            raise refuse(errno.EPERM, f"files live below a section {wb.SECTIONS}, not in {parent.describe()}")
        if parent.kind is Kind.FILE:
            raise refuse(errno.ENOTDIR, f"{parent.describe()} is a file")
        components = parent.components + (name,)
        self._publishable(parent, components)
        existing = self.lookup(parent, name)
        if existing is not None and existing.kind.is_dir:
            raise refuse(errno.EISDIR, f"{existing.describe()} is a directory")
        if existing is not None:
            if flags & os.O_EXCL:
                raise refuse(errno.EEXIST, f"{existing.describe()} exists")
            handle, _ = self.open(fh, existing, flags if flags & os.O_ACCMODE else flags | os.O_WRONLY)
            if flags & os.O_TRUNC:
                handle.filled, handle.size, handle.dirty, handle.written, handle.append_mode = True, 0, True, True, False
            return handle
        node = self._child(parent, Kind.FILE, name)
        node.unlearn()
        node.kernel_revision = None
        handle = WriteHandle(
            fh,
            node,
            self.root,
            workbench_id=node.workbench_id,
            incarnation=node.incarnation,
            components=components,
            base=None,
            append=False,
            expected_generation=0,
            creating=True,
        )
        self.overlay.add_file(node.incarnation, components, node)
        self._add_writer(node, handle)
        node.open_count += 1
        return handle

    @staticmethod
    def _add_writer(node: Node, handle: WriteHandle) -> None:
        if node.writers is None:
            node.writers = set()
        node.writers.add(handle)

    # --- publication ------------------------------------------------------------------------------

    def begin_change(self, incarnation: bytes, *paths: tuple) -> None:
        for components in paths:
            self._inflight[(incarnation, components)] += 1

    def end_change(self, incarnation: bytes, *paths: tuple) -> None:
        replay = []
        for components in paths:
            key = (incarnation, components)
            self._inflight[key] -= 1
            if self._inflight[key] <= 0:
                del self._inflight[key]
                replay += self._deferred.pop(key, [])
        for version, event in replay:
            self.changed(version, event)

    def own(self, kind: ChangeEventKind, revision_id: bytes) -> None:
        """Remember a change this mount committed, so the follower does not invalidate it."""
        self._own[(kind, revision_id)] = None
        while len(self._own) > _OWN_CHANGES_BOUND:
            self._own.popitem(last=False)

    async def publish_if_dirty(self, handle: WriteHandle, *, why: str, closing: bool = False) -> None:
        async with handle.lock:
            if handle.orphaned or not handle.dirty:
                return
            if closing and handle.creating and not handle.written:
                return  # an empty new file is published at release (see nokvfs.fs.handles)
            node = handle.node
            components = handle.components
            self.begin_change(handle.incarnation, components)
            try:
                entry = await self.workers.run(handle.publish_blocking)
            except Exception as exc:
                self.end_change(handle.incarnation, components)
                handle.failed = exc
                sidecar = handle.keep_spool(f"{type(exc).__name__}: {exc}")
                log.error(
                    "%s of %s failed (%s: %s); nothing is lost: the bytes are kept in %s (described in %s)",
                    why, handle.describe(), type(exc).__name__, exc, handle.spool_path, sidecar,
                )
                node.kernel_revision = None
                self.invalidator.inode(node.ino)
                raise
            kind = ChangeEventKind.PathAppended if handle.append_mode else ChangeEventKind.PathPut
            self.own(kind, entry.artifact_revision_id)
            self.end_change(handle.incarnation, components)
            handle.published(entry)
            self._forget_sidecar(handle)
            if handle.node.components == handle.components and not node.detached:
                node.learn(entry)
                node.kernel_revision = entry.artifact_revision_id
                # The kernel shares one inode between this mount's readers and writers of a path,
                # so readers follow what this mount publishes, as on a local filesystem.
                for reader in node.readers or ():
                    reader.entry = entry
            self.overlay.published(handle.incarnation, handle.components)
            log.debug("published %s generation %d (%d bytes)", handle.describe(), entry.generation, entry.logical_size)

    @staticmethod
    def _forget_sidecar(handle: WriteHandle) -> None:
        try:
            os.unlink(handle.spool_path + ".json")
        except FileNotFoundError:
            pass

    async def release(self, handle) -> None:
        node = handle.node
        if isinstance(handle, WriteHandle):
            if handle.dirty and not handle.orphaned and handle.failed is None:
                try:
                    await self.publish_if_dirty(handle, why="publication at release")
                except Exception:  # noqa: BLE001 - already logged with the spool's path
                    pass
            keep = handle.dirty and not handle.orphaned
            if node.writers is not None:
                node.writers.discard(handle)
            if not node.writers and self.overlay.pending(handle.incarnation, handle.components) is node:
                # Created here and never published: the name goes away with its last writer.
                self.overlay.remove_file(handle.incarnation, handle.components)
                parent = self.inodes.find(node.view, node.incarnation, node.components[:-1])
                if parent is not None:
                    self.invalidator.entry(parent.ino, node.components[-1])
                self.inodes.detach(node)
            handle.close(keep=keep)
            if keep:
                log.warning("unpublished bytes of %s are kept in %s", handle.describe(), handle.spool_path)
        elif node.readers is not None:
            node.readers.discard(handle)
        self.inodes.closed(node)

    # --- directories -----------------------------------------------------------------------------

    async def mkdir(self, parent: Node, name: str) -> Node:
        if parent.kind is Kind.HISTORY and parent.components[0] == views_.SNAPSHOTS:
            return await self._mint(parent, name)
        self._writable(f"mkdir {name}", parent)
        if parent.kind is Kind.ROOT:
            try:
                check_workbench_id(name)
            except NameInvalid as exc:
                raise refuse(errno.EINVAL, str(exc)) from None
            self.own(ChangeEventKind.WorkspaceCreated, name.encode())
            created = await self.workers.run(wb.create, self.root, name)
            self.refresh_workbenches()
            return self._workbench_node(created)
        if parent.kind is Kind.WORKBENCH:
            if name in wb.SECTIONS or name in views_.HISTORY_DIRS:
                raise refuse(errno.EEXIST, f"{name} is a section or a view directory")
            raise refuse(errno.EPERM, f"directories live below a section {wb.SECTIONS}, not in {parent.describe()}")
        if parent.kind is Kind.FILE:
            raise refuse(errno.ENOTDIR, f"{parent.describe()} is a file")
        components = parent.components + (name,)
        self._publishable(parent, components)
        if self.lookup(parent, name) is not None:
            raise refuse(errno.EEXIST, f"{parent.describe()}/{name} exists")
        self.overlay.add_dir(parent.incarnation, components)
        return self._child(parent, Kind.DIR, name)

    async def rmdir(self, parent: Node, name: str) -> None:
        if parent.kind is Kind.ROOT:
            if self.lookup(parent, name) is None:
                raise refuse(errno.ENOENT, f"no workbench {name}")
            raise refuse(errno.EPERM, "a Visible workbench is never removed")
        if parent.kind is Kind.WORKBENCH:
            if name in wb.SECTIONS or name in views_.HISTORY_DIRS:
                raise refuse(errno.EPERM, f"{name} is a section or a view directory: it cannot be removed")
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
        if parent.kind is Kind.HISTORY and parent.components[0] == views_.SNAPSHOTS:
            await self._retire(parent, name)
            return
        self._writable(f"rmdir {name}", parent)
        node = self.lookup(parent, name)
        if node is None:
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
        if node.kind is Kind.FILE:
            raise refuse(errno.ENOTDIR, f"{node.describe()} is a file")
        with self.view.read() as v:
            durable = self.view.has_children(v, node.incarnation, node.components)
        if durable or self.overlay.has_children(node.incarnation, node.components):
            raise refuse(errno.ENOTEMPTY, f"{node.describe()} is not empty")
        self.overlay.remove_dir(node.incarnation, node.components)
        self.inodes.detach(node)

    # --- snapshots: mkdir mints, rmdir retires (as in ZFS's .zfs/snapshot) -------------------------

    async def _mint(self, parent: Node, name: str) -> Node:
        """mkdir /<wb>/.snapshots/<alias>: mint a snapshot with that alias (the default lease)."""
        self._writable(f"mkdir {name}")
        if name.isascii() and name.isdigit():
            raise refuse(errno.EINVAL, f"{name!r} is numeric: snapshot ids are given by the root, an alias must not look like one")
        try:
            check_snapshot_alias(name)
        except NameInvalid as exc:
            raise refuse(errno.EINVAL, str(exc)) from None
        if self.lookup(parent, name) is not None:
            raise refuse(errno.EEXIST, f"snapshot {name!r} exists (rmdir retires it)")
        minted = await self.workers.run(snapshot.mint, self.root, parent.workbench_id, alias=name)
        if minted.workbench.incarnation_id != parent.incarnation:
            raise refuse(errno.ENOENT, f"{parent.describe()} is another incarnation now")
        log.info("minted snapshot %d (%s) of %s at version %d", minted.snapshot_id, name, parent.workbench_id, minted.read_version)
        return self._view_root(views_.SnapshotView(self.root, parent.workbench_id, parent.incarnation, minted.snapshot_id, name))

    async def _retire(self, parent: Node, name: str) -> None:
        """rmdir /<wb>/.snapshots/<alias-or-id>: retire it (EBUSY while a restore/fork consumes it)."""
        self._writable(f"rmdir {name}")
        node = self.lookup(parent, name)
        if node is None:
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} is not an Active snapshot")
        view = self.view_of(node)
        retired = await self.workers.run(snapshot.retire, self.root, parent.workbench_id, view.snapshot_id)
        log.info("retired snapshot %d (%s) of %s", retired, name, parent.workbench_id)
        self.inodes.detach(node)
        # The kernel drops `name` itself; the same snapshot under its other name (the alias or the
        # numeric id) is gone too, and must not wait for the change feed to come round to it.
        for other in list(self.inodes.of_workbench(parent.workbench_id)):
            if other is node or other.kind is not Kind.VIEW or other.incarnation != parent.incarnation:
                continue
            other_view = self.view_of(other)
            if isinstance(other_view, views_.SnapshotView) and other_view.snapshot_id == view.snapshot_id:
                self.invalidator.entry(parent.ino, other_view.entry_name, deleted=other.ino)
                self.inodes.detach(other)

    # --- files -------------------------------------------------------------------------------------

    async def unlink(self, parent: Node, name: str) -> None:
        if parent.kind in (Kind.ROOT, Kind.WORKBENCH):
            if self.lookup(parent, name) is None:
                raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
            raise refuse(errno.EPERM, f"{parent.describe()}/{name} is a workbench or a section")
        self._writable(f"unlink {name}", parent)
        await self._quiesce(self.lookup(parent, name))
        node = self.lookup(parent, name)
        if node is None:
            raise refuse(errno.ENOENT, f"{parent.describe()}/{name} does not exist")
        if node.kind.is_dir:
            raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
        self._publishable(node, node.components)
        pending = self.overlay.pending(node.incarnation, node.components) is node
        with self.view.read() as v:
            durable = self.view.entry(v, node.incarnation, node.components) is not None
        if durable:
            self.begin_change(node.incarnation, node.components)
            try:
                removed = await self.workers.run(namespace.remove, self.root, node.workbench_id, node.path)
                self.own(ChangeEventKind.PathRemoved, removed.artifact_revision_id)
            finally:
                self.end_change(node.incarnation, node.components)
        elif not pending:
            raise refuse(errno.ENOENT, f"{node.describe()} does not exist")
        self.overlay.remove_file(node.incarnation, node.components)
        for writer in list(node.writers or ()):
            writer.orphaned = True  # POSIX: bytes written to an unlinked file vanish with it
        self.overlay.add_dir(node.incarnation, node.components[:-1])
        self.inodes.detach(node)

    @staticmethod
    async def _quiesce(*nodes) -> None:
        """Wait for publications in flight on these nodes (a release publishes after close(2)
        returned, so the application's next rename or unlink can overtake it)."""
        for node in nodes:
            for writer in list(getattr(node, "writers", None) or ()):
                async with writer.lock:
                    pass

    async def rename(self, old_parent: Node, old_name: str, new_parent: Node, new_name: str, flags: int) -> None:
        for parent in (old_parent, new_parent):
            if parent.view != LIVE or parent.kind is Kind.HISTORY:
                raise refuse(errno.EROFS, f"rename in {parent.describe()}: views are read-only")
        for parent in (old_parent, new_parent):
            if parent.kind in (Kind.ROOT, Kind.WORKBENCH):
                raise refuse(errno.EPERM, f"entries of {parent.describe()} (workbenches, sections) cannot be renamed or replaced")
        self._writable("rename")
        if (old_parent.view, old_parent.workbench_id, old_parent.incarnation) != (new_parent.view, new_parent.workbench_id, new_parent.incarnation):
            raise refuse(errno.EXDEV, f"rename from {old_parent.describe()} to {new_parent.describe()} crosses workbenches")
        if flags & RENAME_EXCHANGE:
            raise refuse(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        replace = not flags & RENAME_NOREPLACE
        src = old_parent.components + (old_name,)
        dst = new_parent.components + (new_name,)
        if src == dst:
            return
        self._publishable(old_parent, src)
        self._publishable(new_parent, dst)
        if dst[: len(src)] == src:
            raise refuse(errno.EINVAL, "cannot move a directory into itself")
        await self._quiesce(self.lookup(old_parent, old_name), self.lookup(new_parent, new_name))
        source = self.lookup(old_parent, old_name)
        if source is None:
            raise refuse(errno.ENOENT, f"{old_parent.describe()}/{old_name} does not exist")
        target = self.lookup(new_parent, new_name)
        if target is not None and not replace:
            raise refuse(errno.EEXIST, f"{target.describe()} exists")
        incarnation = old_parent.incarnation
        if source.kind.is_dir:
            await self._rename_dir(source, target, dst)
            return
        if target is not None and target.kind.is_dir:
            raise refuse(errno.EISDIR, f"{target.describe()} is a directory")
        with self.view.read() as v:
            durable = self.view.entry(v, incarnation, src) is not None
            target_entry = self.view.entry(v, incarnation, dst)
        if durable:
            self.begin_change(incarnation, src, dst)
            try:
                moved = await self.workers.run(namespace.rename, self.root, source.workbench_id, "/".join(src), "/".join(dst), replace=replace)
                self.own(ChangeEventKind.PathRenamed, moved.artifact_revision_id)
            except GenerationConflict:
                raise refuse(errno.EEXIST, f"{new_parent.describe()}/{new_name} exists") from None
            finally:
                self.end_change(incarnation, src, dst)
            source.learn(moved)
            self.overlay.published(incarnation, dst)
            generation = moved.generation
        else:
            # A file created here and not yet published: it will be published at its new name.
            self.overlay.remove_file(incarnation, src)
            generation = 0 if target_entry is None else target_entry.generation
        if target is not None and target is not source:
            for writer in list(target.writers or ()):
                writer.orphaned = True
            if self.overlay.pending(incarnation, dst) is target:
                self.overlay.remove_file(incarnation, dst)
        self.inodes.move(source, dst)
        for writer in list(source.writers or ()):
            writer.components = dst
            writer.expected_generation = generation
            if not durable:
                writer.creating = target_entry is None
        if not durable:
            self.overlay.add_file(incarnation, dst, source)
        self.overlay.add_dir(incarnation, src[:-1])

    async def _rename_dir(self, source: Node, target: Node | None, dst: tuple) -> None:
        incarnation = source.incarnation
        with self.view.read() as v:
            durable = self.view.has_children(v, incarnation, source.components)
            target_durable = target is not None and self.view.has_children(v, incarnation, dst)
        if durable or self.overlay.has_children(incarnation, source.components):
            raise refuse(errno.EXDEV, f"{source.describe()} holds files: a directory is moved by copying (mv does this on EXDEV)")
        if target is not None:
            if target.kind is Kind.FILE:
                raise refuse(errno.ENOTDIR, f"{target.describe()} is a file")
            if target_durable or self.overlay.has_children(incarnation, dst):
                raise refuse(errno.ENOTEMPTY, f"{target.describe()} is not empty")
            self.overlay.remove_dir(incarnation, dst)
        self.overlay.remove_dir(incarnation, source.components)
        self.overlay.add_dir(incarnation, dst)
        self.inodes.move(source, dst)

    async def truncate(self, node: Node, size: int, handle=None) -> None:
        if node.kind.is_dir:
            raise refuse(errno.EISDIR, f"{node.describe()} is a directory")
        self._writable(f"truncate {node.describe()}", node)
        self._publishable(node, node.components)
        writer = handle if isinstance(handle, WriteHandle) else self.latest_writer(node)
        if writer is not None:
            async with writer.lock:
                await self.workers.run(writer.truncate_blocking, size)
            return
        # truncate(2) of a file nobody here has open: publish the truncated body now.
        with self.view.read() as v:
            entry = self.view.entry(v, node.incarnation, node.components)
        if entry is None:
            raise refuse(errno.ENOENT, f"{node.describe()} does not exist")
        if entry.logical_size == size:
            return
        temporary = WriteHandle(
            0, node, self.root, workbench_id=node.workbench_id, incarnation=node.incarnation,
            components=node.components, base=entry, append=False, expected_generation=entry.generation, creating=False,
        )
        try:
            await self.workers.run(temporary.truncate_blocking, size)
            await self.publish_if_dirty(temporary, why="truncate")
        finally:
            temporary.close(keep=temporary.dirty)

    # --- extended attributes ---------------------------------------------------------------------

    def _file_entry(self, node: Node):
        """The PathEntry a file node shows now (an open reader's, once detached), or None."""
        if not node.detached:
            view = self.view_of(node)
            with view.read() as v:
                return view.entry(v, node.incarnation, node.components)
        if node.readers:
            return next(iter(node.readers)).entry
        return None

    def xattr(self, node: Node, name: bytes) -> bytes:
        """A file's index fields as `user.nokv.<name>` (see nokvfs.fs.xattrs), and read-only
        facts as `user.nokvfs.*` (not listed, so cp -a/rsync -X copy only the index fields)."""
        if node.kind is Kind.FILE:
            entry = self._file_entry(node)
            if entry is None:
                raise refuse(errno.ENODATA, "not published yet")
            if name.startswith(xattrs.INDEX_PREFIX):
                value = xattrs.index_value(entry, name)
                if value is None:
                    raise refuse(errno.ENODATA, f"{node.describe()} has no index field {name[len(xattrs.INDEX_PREFIX):]!r}")
                return value
            facts = {
                b"user.nokvfs.generation": str(entry.generation),
                b"user.nokvfs.revision": entry.artifact_revision_id.hex(),
                b"user.nokvfs.digest": entry.body_digest_uri,
                b"user.nokvfs.content_type": entry.content_type,
                b"user.nokvfs.workbench": node.workbench_id,
            }
        elif node.kind is Kind.ROOT:
            facts = {b"user.nokvfs.root": self.root.root_id.hex()}
        elif node.view != LIVE:
            view = self.view_of(node)
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
            with self.view.read() as v:
                workbench = self.view.require(v, node.workbench_id, node.incarnation)
            facts = {
                b"user.nokvfs.generation": str(workbench.revision),
                b"user.nokvfs.incarnation": workbench.incarnation_id.hex(),
                b"user.nokvfs.workbench": node.workbench_id,
            }
        value = facts.get(name)
        if value is None:
            raise refuse(errno.ENODATA, f"no attribute {name!r}")
        return value.encode()

    def listxattr(self, node: Node) -> list[bytes]:
        """The `user.nokv.<name>` attributes of a file's index fields (none elsewhere)."""
        if node.kind is not Kind.FILE:
            return []
        entry = self._file_entry(node)
        return [] if entry is None else xattrs.index_names(entry)

    def refuse_xattr_change(self, node: Node):
        """setxattr/removexattr: EROFS inside a view, else ENOTSUP (nothing is stored)."""
        if node.view != LIVE or node.kind in (Kind.HISTORY, Kind.VIEW) or self.read_only:
            return refuse(errno.EROFS, f"extended attributes of {node.describe()}: read-only")
        return refuse(errno.ENOTSUP, "extended attributes are not stored (index fields are set at publication)")

    # --- the change feed -------------------------------------------------------------------------

    def changed(self, version: int, event) -> None:
        """One ChangeEvent from the feed: invalidate what the kernel may hold of it."""
        kind = event.kind
        if kind in (ChangeEventKind.WorkspaceCreated, ChangeEventKind.WorkspaceRestored):
            self.refresh_workbenches()
            if (kind, event.workbench_id.encode()) in self._own:
                del self._own[(kind, event.workbench_id.encode())]
                return
            self.invalidator.entry(ROOT_INODE, event.workbench_id)
            self.invalidator.inode(ROOT_INODE, attr_only=True)
            return
        if kind in _HISTORY_KINDS:
            self._history_changed(event)
            if kind is ChangeEventKind.CommitPublished and event.path:
                # The commit also published metadata/run_manifest.json in the live view (the event
                # names the commit, not the manifest's revision: the kernel's copy is dropped).
                self._path_changed(event.workspace_incarnation_id, tuple(event.path.split("/")), False, None)
            return
        if kind not in _PATH_KINDS or event.path is None:
            return
        revision = event.before if kind is ChangeEventKind.PathRemoved else event.after
        if (kind, revision) in self._own:
            del self._own[(kind, revision)]
            return  # this mount made the change; the kernel already knows
        incarnation = event.workspace_incarnation_id
        paths = [(tuple(event.path.split("/")), kind is ChangeEventKind.PathRemoved)]
        if kind is ChangeEventKind.PathRenamed and event.before:
            paths.append((tuple(event.before.decode("utf-8").split("/")), True))
        for components, _ in paths:
            if (incarnation, components) in self._inflight:
                self._deferred.setdefault((incarnation, components), []).append((version, event))
                return
        for components, gone in paths:
            self._path_changed(incarnation, components, gone, event.after)

    def _path_changed(self, incarnation: bytes, components: tuple, gone: bool, revision: bytes | None) -> None:
        view = self.view.name
        node = self.inodes.find(view, incarnation, components)
        parent = self.inodes.find(view, incarnation, components[:-1]) if len(components) > 1 else None
        if node is not None:
            if gone:
                if self.overlay.pending(incarnation, components) is node:
                    return  # a file this mount is still writing keeps its name here
                if parent is not None:
                    self.invalidator.entry(parent.ino, components[-1], deleted=node.ino)
                self.inodes.detach(node)
            elif node.open_count:
                # Open descriptors keep the revision they opened, size included: the old inode
                # stays theirs and the path gets a fresh one at its next lookup.
                if parent is not None:
                    self.invalidator.entry(parent.ino, components[-1])
                self.inodes.detach(node)
            else:
                node.unlearn()
                cached = revision is not None and node.kernel_revision == revision
                if not cached:
                    node.kernel_revision = None
                self.invalidator.inode(node.ino, attr_only=cached)
        elif parent is not None:
            self.invalidator.entry(parent.ino, components[-1])  # a cached negative entry
        # Implicit directories above the path may have appeared or vanished.
        with self.view.read() as v:
            for depth in range(len(components) - 1, 1, -1):
                directory = components[:depth]
                dir_node = self.inodes.find(view, incarnation, directory)
                above = self.inodes.find(view, incarnation, directory[:-1])
                if gone:
                    if dir_node is None or self.overlay.is_dir(incarnation, directory):
                        continue
                    if not self.view.has_children(v, incarnation, directory):
                        if above is not None:
                            self.invalidator.entry(above.ino, directory[-1], deleted=dir_node.ino)
                        self.inodes.detach(dir_node)
                elif dir_node is None and above is not None:
                    self.invalidator.entry(above.ino, directory[-1])

    def _history_changed(self, event) -> None:
        """A snapshot minted or retired, a commit published, a tag set or deleted: the names in
        `/<wb>/.snapshots/`, `.commits/` or `.tags/` the kernel may hold (or hold as negative)
        are invalidated, so the next lookup resolves them again."""
        kind, incarnation = event.kind, event.workspace_incarnation_id
        names = []
        if kind in (ChangeEventKind.SnapshotMinted, ChangeEventKind.SnapshotRetired):
            family = views_.SNAPSHOTS
            if event.path:
                names.append(event.path)  # the alias
            raw = event.after if kind is ChangeEventKind.SnapshotMinted else event.before
            if raw:
                names.append(str(int.from_bytes(raw, "big")))
        elif kind is ChangeEventKind.CommitPublished:
            family = views_.COMMITS
            if event.after:
                names.append(event.after.hex())
            # A prefix that named one commit may name two now: every prefix the kernel holds.
            for node in self.inodes.of_workbench(event.workbench_id):
                if node.kind is Kind.VIEW and node.incarnation == incarnation and node.view.startswith("commit:"):
                    view = self.view_of(node)
                    if view.entry_name != view.commit_id.hex():
                        names.append(view.entry_name)
        else:
            family = views_.TAGS
            if event.path:
                names.append(event.path)
        history = self.inodes.find(LIVE, incarnation, (family,))
        if history is None:
            return  # the kernel holds nothing below it
        for name in dict.fromkeys(names):
            self.invalidator.entry(history.ino, name)

    def caught_up(self, version: int) -> None:
        """The follower has applied everything up to `version`."""

    # --- statfs ------------------------------------------------------------------------------------

    async def statfs(self):
        now = time.monotonic()
        if self._statfs is None or now - self._statfs[0] > 1.0:
            stats = await self.workers.run(self.root.store.statfs)
            self._statfs = (now, stats)
        return self._statfs[1]
