"""The daemon's in-memory overlay on the namespace: what exists here before it is durable.

Directories are implicit in the seed (a directory is the prefix of a published path, and empty
directory identity is unsupported), yet `mkdir d && cd d && touch f` must work. So a directory
made by `mkdir` lives here, in this daemon's memory only, until a file is published below it;
a directory that loses its last file through this mount (unlink, rename away) is kept here too,
so it does not vanish under the shell that is standing in it. A file created by `open(O_CREAT)`
is pending here until its first close publishes it. Nothing here is shared with other mounts or
survives the daemon; it is exactly the state the seed says may not be durable.
"""

from __future__ import annotations

DIR = "dir"
FILE = "file"


class Overlay:
    def __init__(self):
        self._dirs: set[tuple] = set()  # (incarnation, components)
        self._pending: dict[tuple, object] = {}  # (incarnation, components) -> Node
        self._children: dict[tuple, dict[str, str]] = {}  # (incarnation, parent) -> name -> kind

    def _link(self, incarnation: bytes, components: tuple, kind: str) -> None:
        self._children.setdefault((incarnation, components[:-1]), {})[components[-1]] = kind

    def _unlink(self, incarnation: bytes, components: tuple) -> None:
        parent = (incarnation, components[:-1])
        names = self._children.get(parent)
        if names is not None:
            names.pop(components[-1], None)
            if not names:
                del self._children[parent]

    # --- directories ----------------------------------------------------------------------------

    def add_dir(self, incarnation: bytes, components: tuple) -> None:
        """Keep a directory (and its ancestors below the section) alive in memory."""
        for depth in range(2, len(components) + 1):
            key = (incarnation, components[:depth])
            if key not in self._dirs and key not in self._pending:
                self._dirs.add(key)
                self._link(incarnation, components[:depth], DIR)

    def remove_dir(self, incarnation: bytes, components: tuple) -> None:
        key = (incarnation, components)
        if key in self._dirs:
            self._dirs.discard(key)
            self._unlink(incarnation, components)

    def is_dir(self, incarnation: bytes, components: tuple) -> bool:
        return (incarnation, components) in self._dirs

    # --- files ----------------------------------------------------------------------------------

    def add_file(self, incarnation: bytes, components: tuple, node) -> None:
        self.add_dir(incarnation, components[:-1])
        self._pending[(incarnation, components)] = node
        self._link(incarnation, components, FILE)

    def pending(self, incarnation: bytes, components: tuple):
        return self._pending.get((incarnation, components))

    def remove_file(self, incarnation: bytes, components: tuple) -> None:
        if self._pending.pop((incarnation, components), None) is not None:
            self._unlink(incarnation, components)

    def published(self, incarnation: bytes, components: tuple) -> None:
        """A file at `components` is durable now, and so are the directories above it."""
        self.remove_file(incarnation, components)
        for depth in range(2, len(components)):
            self.remove_dir(incarnation, components[:depth])

    def move_tree(self, incarnation: bytes, source: tuple, target: tuple) -> None:
        """A directory rename: what the overlay holds at or below `source` moves below `target`."""
        depth = len(source)

        def moved(key):
            inc, components = key
            if inc == incarnation and components[:depth] == source:
                return (inc, target + components[depth:])
            return key

        self._dirs = {moved(key) for key in self._dirs}
        self._pending = {moved(key): node for key, node in self._pending.items()}
        self._children = {moved(key): names for key, names in self._children.items()}
        if (incarnation, target) in self._dirs or (incarnation, target) in self._children:
            self._dirs.add((incarnation, target))
            self._link(incarnation, target, DIR)
        self._unlink(incarnation, source)

    # --- listing --------------------------------------------------------------------------------

    def children(self, incarnation: bytes, components: tuple) -> list[tuple[str, str]]:
        """(name, kind) of the overlay's entries directly below a directory, sorted by name."""
        return sorted(self._children.get((incarnation, components), {}).items())

    def has_children(self, incarnation: bytes, components: tuple) -> bool:
        return bool(self._children.get((incarnation, components)))
