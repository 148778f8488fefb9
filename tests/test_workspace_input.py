"""Bad input through the facade: every rule of the one path normalizer, paths outside the five
sections, the sections themselves and the typed manifests. Each refusal happens before any
metadata command or upload.
"""

from __future__ import annotations

import pytest

from nokvfs.errors import InvalidInput, NotFound, PathInvalid, ReservedPath
from nokvfs.workspace import append, listing, namespace
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    WB,
    all_rows,
    bench_fixture,
    data_dir_fixture,
    get_bytes,
    publish_ops,
    root_fixture,
)

BAD_PATHS = {
    "absolute": "/outputs/x",
    "empty": "",
    "dot component": "outputs/./x",
    "leading dot": "./outputs/x",
    "trailing dot": "outputs/.",
    "dotdot component": "outputs/../x",
    "trailing dotdot": "outputs/..",
    "backslash": "outputs\\x",
    "backslash inside": "outputs/a\\b",
    "NUL": "outputs/a\x00b",
    "trailing slash": "outputs/x/",
    "double slash": "outputs//x",
    "over 4096 bytes": "outputs/" + "x" * (4097 - len("outputs/")),
    "over 4096 bytes of multibyte": "outputs/" + "é" * 2045,  # 8 + 4090 bytes
    "over 64 components": "outputs/" + "/".join("c" * 1 for _ in range(64)),
    "non-UTF-8 bytes": b"outputs/\xff\xfe",
    "truncated UTF-8 bytes": b"outputs/\xc3",
    "lone surrogate": "outputs/\udc80",
}


def _refusals(root):
    """Every facade entry point that takes a path, as (name, call(path))."""
    return [
        ("put", lambda p: namespace.put(root, WB, p, b"x")),
        ("remove", lambda p: namespace.remove(root, WB, p)),
        ("rename from", lambda p: namespace.rename(root, WB, p, "outputs/ok")),
        ("rename to", lambda p: namespace.rename(root, WB, "outputs/src", p)),
        ("append", lambda p: append.append(root, WB, p, b"x")),
        ("stat", lambda p: _with_view(root, lambda v: listing.stat(v, root, WB, p))),
        ("list", lambda p: _with_view(root, lambda v: listing.list_dir(v, root, WB, p))),
        ("list recursive", lambda p: _with_view(root, lambda v: listing.list_recursive(v, root, WB, p))),
    ]


def _with_view(root, fn):
    with root.read() as view:
        return fn(view)


def _nothing_happened(root, version):
    assert root.shard.commit_version == version
    assert len(publish_ops(root)) == 1  # only outputs/src from the setup
    assert all_rows(root, "staged_object") == []


@pytest.mark.parametrize("rule", sorted(BAD_PATHS))
def test_every_normalizer_rule_is_refused_by_every_entry_point(bench, rule):
    root = bench
    namespace.put(root, WB, "outputs/src", b"src")
    version = root.shard.commit_version
    path = BAD_PATHS[rule]
    for name, call in _refusals(root):
        if path in ("", ".") and name in ("stat", "list", "list recursive"):
            continue  # "" names the workbench root for reads
        with pytest.raises(PathInvalid):
            call(path)
    _nothing_happened(root, version)
    assert get_bytes(root, "outputs/src") == b"src"


def test_the_limits_themselves_are_accepted_by_the_normalizer(bench):
    root = bench
    namespace.put(root, WB, "outputs/" + "/".join("c" for _ in range(63)), b"64 components")
    # 4096 bytes passes the normalizer; whether the shard can store it is tested in the publish
    # tests (an engine key-size limit, see test_the_longest_normalized_path_can_be_published).
    from nokvfs.schema.paths import normalize_path

    assert len(normalize_path("outputs/" + "x" * (4096 - 8))) == 2


@pytest.mark.parametrize("path", ["other/x", "Outputs/x", "output/x", "x", "inputs/x", ".snapshots/x"])
def test_paths_outside_the_sections_are_refused(bench, path):
    root = bench
    namespace.put(root, WB, "outputs/src", b"src")
    version = root.shard.commit_version
    for _name, call in _refusals(root)[:5]:
        with pytest.raises(InvalidInput) as info:
            call(path)
        assert not isinstance(info.value, PathInvalid)
    with pytest.raises(NotFound):  # reads find nothing there
        _with_view(root, lambda v: listing.stat(v, root, WB, path))
    _nothing_happened(root, version)


@pytest.mark.parametrize("section", ["input", "scripts", "outputs", "logs", "metadata"])
def test_sections_cannot_be_written_removed_or_shadowed(bench, section):
    root = bench
    namespace.put(root, WB, "outputs/src", b"src")
    version = root.shard.commit_version
    for _name, call in _refusals(root)[:5]:
        with pytest.raises(InvalidInput):
            call(section)
    _nothing_happened(root, version)
    assert _with_view(root, lambda v: listing.stat(v, root, WB, section)).kind == listing.DIRECTORY


@pytest.mark.parametrize("path", ["metadata/run_manifest.json", "metadata/restore_manifest.json"])
def test_reserved_manifests_refuse_every_generic_write(bench, path):
    root = bench
    namespace.put(root, WB, "outputs/src", b"src")
    version = root.shard.commit_version
    for _name, call in _refusals(root)[:5]:
        with pytest.raises(ReservedPath):
            call(path)
    _nothing_happened(root, version)


def test_paths_are_case_sensitive_and_never_unicode_normalized(bench):
    root = bench
    nfc, nfd = "outputs/caf\u00e9", "outputs/cafe\u0301"
    namespace.put(root, WB, nfc, b"nfc")
    namespace.put(root, WB, nfd, b"nfd")
    namespace.put(root, WB, "outputs/CAFE", b"upper")
    namespace.put(root, WB, "outputs/cafe", b"lower")
    assert get_bytes(root, nfc) == b"nfc" and get_bytes(root, nfd) == b"nfd"
    assert get_bytes(root, "outputs/CAFE") == b"upper" and get_bytes(root, "outputs/cafe") == b"lower"
    with root.read() as view:
        assert len(listing.list_dir(view, root, WB, "outputs").children) == 4


def test_bytes_paths_that_are_valid_utf8_are_accepted(bench):
    root = bench
    found = namespace.put(root, WB, "outputs/b\u00fc".encode(), b"bytes")
    assert get_bytes(root, "outputs/b\u00fc") == b"bytes"
    assert namespace.remove(root, WB, "outputs/b\u00fc".encode()) == found
