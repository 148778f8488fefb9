"""Helpers the workspace tests share: a fresh data directory's root, a 'process' killed after its
n-th command, a workbench's files put and read back whole, and a file nobody can delete."""

from __future__ import annotations

import contextlib
import shutil
import subprocess

from nokvfs.workspace import datadir, listing, namespace, reading, workbench


@contextlib.contextmanager
def opened_root(tmp_path, *, workbenches=(), **init_options):
    """The root of a new data directory `tmp_path/data` with these workbenches, closed after
    (its block cache too, so that a mount started later owns the cache)."""
    data_dir = str(tmp_path / "data")
    datadir.init(data_dir, **init_options)
    root = datadir.open_root(data_dir)
    try:
        for name in workbenches:
            workbench.create(root, name)
        yield root
    finally:
        if root.blocks.cache is not None:
            root.blocks.cache.close()
        root.close()


class Killed(BaseException):
    """The process died here (not an error any handler of the facade may catch)."""


@contextlib.contextmanager
def killed_after(root, commands: int):
    """Kill the 'process' right after its `commands`-th applied MetadataCommand."""
    real = root.apply
    applied = [0]

    def apply(build, **kw):
        outcome = real(build, **kw)
        applied[0] += 1
        if applied[0] == commands:
            raise Killed(f"after command {commands}")
        return outcome

    root.apply = apply
    try:
        yield applied
    finally:
        del root.apply


def put_all(root, workbench_id: str, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        namespace.put(root, workbench_id, path, data)


def files_of(root, workbench_id: str) -> dict[str, bytes]:
    """Every live file of the workbench, path -> bytes."""
    with root.read() as view:
        return {
            c.name: reading.read(root, c.entry, view=view)
            for c in listing.list_recursive(view, root, workbench_id).children
        }


@contextlib.contextmanager
def undeletable(path: str):
    """`path` made immutable (chattr +i) for the block: unlinking it fails with EPERM even for
    root, a real filesystem refusal. Skips the test where the filesystem or the process cannot."""
    import pytest

    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    made = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make {path} immutable here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", path], check=True)
