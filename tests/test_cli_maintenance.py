"""CLI: snapshot, changes, gc, fsck and search, driven through main() with real data dirs."""

from __future__ import annotations

import io
import json

import pytest

from nokvfs.cli.main import main
from nokvfs.cli.maintenance_commands import parse_query


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("NOKVFS_DATA_DIR", str(tmp_path / "data"))
    assert main(["init"]) == 0
    assert main(["workbench", "create", "w"]) == 0
    return tmp_path / "data"


def run(capsys, *argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(list(argv))
    return code, capsys.readouterr()


def test_snapshot_mint_list_retire(data, capsys, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"one")
    capsys.readouterr()
    assert main(["put", "w:outputs/f", str(src)]) == 0
    capsys.readouterr()
    code, out = run(capsys, "snapshot", "mint", "w", "--alias", "base", "--json")
    assert code == 0
    snap = json.loads(out.out)
    assert snap["alias"] == "base" and snap["state"] == "Active"
    code, out = run(capsys, "snapshot", "list", "w", "--json")
    assert [s["snapshot_id"] for s in json.loads(out.out)] == [snap["snapshot_id"]]
    assert run(capsys, "snapshot", "renew", "w", "base")[0] == 0
    assert run(capsys, "snapshot", "retire", "w", "base")[0] == 0
    code, out = run(capsys, "snapshot", "retire", "w", "base")
    assert code == 4 and "Retired" in out.err
    assert run(capsys, "snapshot", "retire", "w", "nope")[0] == 3


def test_changes_json_lines(data, capsys, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"x")
    main(["put", "w:outputs/a", str(src)])
    main(["rm", "w:outputs/a"])
    capsys.readouterr()
    code, out = run(capsys, "changes", "--workbench", "w", "--json")
    kinds = [json.loads(line)["kind"] for line in out.out.splitlines()]
    assert code == 0 and kinds == ["WorkspaceCreated", "PathPut", "PathRemoved"]
    first = json.loads(out.out.splitlines()[1])["commit_version"]
    code, out = run(capsys, "changes", "--after", str(first), "--json")
    assert [json.loads(line)["kind"] for line in out.out.splitlines()] == ["PathRemoved"]


def test_gc_frees_and_fsck_exit_codes(data, capsys, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"y" * 5000)
    main(["put", "w:outputs/a", str(src)])
    main(["rm", "w:outputs/a"])
    capsys.readouterr()
    code, out = run(capsys, "gc", "--dry-run", "--json")
    assert code == 0 and json.loads(out.out)["freed_bytes"] == 5000
    code, out = run(capsys, "gc", "--json")
    assert json.loads(out.out)["freed_revisions"] == 1
    assert run(capsys, "fsck")[0] == 0
    # An orphan object makes fsck exit 5; --repair removes it and the next run is clean.
    config = json.loads((data / "nokvfs.json").read_text())
    from nokvfs.objects.store import open_store

    with open_store(config["store"]) as store:
        store.put(
            f"nokv/artifacts/{config['logical_shard_id']}/{config['root_id']}/{'ab' * 16}/blocks/{0:016x}", b"orphan"
        )
    code, out = run(capsys, "fsck", "--json")
    assert code == 5 and [f["code"] for f in json.loads(out.out)["findings"]] == ["ORPHAN_OBJECT"]
    assert run(capsys, "fsck", "--repair")[0] == 5
    assert run(capsys, "fsck")[0] == 0


def test_gc_prunes_history_keeping_the_configured_versions(data, capsys, tmp_path, monkeypatch):
    src = tmp_path / "f"
    for n in range(4):
        src.write_bytes(b"%d" % n)
        main(["put", "w:outputs/a", str(src)])
    capsys.readouterr()
    code, out = run(capsys, "gc", "--dry-run", "--keep-versions", "3")
    assert code == 0 and "would prune" in out.out
    code, out = run(capsys, "gc", "--keep-versions", "3", "--json")
    report = json.loads(out.out)
    assert code == 0 and report["history_pruned"] > 0
    version = report["history_floor"] + 3
    code, out = run(capsys, "gc", "--json")  # the data directory's retention: 0
    assert json.loads(out.out)["history_floor"] > version - 3 and run(capsys, "fsck")[0] == 0
    for bad in ("-1", "x", str(1 << 63)):
        assert run(capsys, "gc", "--keep-versions", bad)[0] == 2
    # A data directory can keep more History for diagnostics.
    monkeypatch.setenv("NOKVFS_DATA_DIR", str(tmp_path / "kept"))
    assert run(capsys, "init", "--history-retention", "1000")[0] == 0
    assert json.loads((tmp_path / "kept" / "nokvfs.json").read_text())["history_retention_versions"] == 1000
    main(["workbench", "create", "w"])
    capsys.readouterr()
    code, out = run(capsys, "gc", "--json")
    assert json.loads(out.out)["history_pruned"] == 0
    assert run(capsys, "init", "--history-retention", "-5")[0] == 2


def test_search_queries(data, capsys):
    from nokvfs.workspace import datadir, index, namespace

    root = datadir.open_root(str(data))
    try:
        for n in range(5):
            namespace.put(
                root,
                "w",
                f"outputs/r{n}",
                b"x",
                index_fields=index.fields({"n": n, "tag": "even" if n % 2 == 0 else "odd"}),
            )
    finally:
        root.close()
    code, out = run(capsys, "search", "w", "n>=3")
    assert code == 0 and out.out.split() == ["w:outputs/r3", "3", "w:outputs/r4", "4"]
    code, out = run(capsys, "search", "w", "n in [1,3)", "--json")
    assert [h["path"] for h in json.loads(out.out)] == ["outputs/r1", "outputs/r2"]
    code, out = run(capsys, "search", "w", "tag=odd", "--json")
    assert [h["path"] for h in json.loads(out.out)] == ["outputs/r1", "outputs/r3"]
    assert run(capsys, "search", "w", "n~3")[0] == 2


def test_query_parsing():
    assert parse_query("n=3") == ("n", {"equals": 3})
    assert parse_query("x>1.5") == ("x", {"lower": 1.5, "include_lower": False})
    assert parse_query("s<=s:12") == ("s", {"upper": "12", "include_upper": True})
    field, q = parse_query("t in [t:2026-01-01T00:00:00Z,)")
    assert field == "t" and q["upper"] is None and q["include_lower"]
    assert parse_query("ok=true") == ("ok", {"equals": True})


def test_put_index_fields_are_searchable(data, capsys, tmp_path):
    src = tmp_path / "f"
    src.write_bytes(b"x")
    assert main(["put", "w:outputs/a", str(src), "--index", "run=3", "--index", "stage=raw"]) == 0
    assert main(["put", "w:outputs/b", str(src), "--index", "run=5"]) == 0
    capsys.readouterr()
    code, out = run(capsys, "search", "w", "run>=4", "--json")
    assert [h["path"] for h in json.loads(out.out)] == ["outputs/b"]
    code, out = run(capsys, "search", "w", "stage=raw", "--json")
    assert [h["path"] for h in json.loads(out.out)] == ["outputs/a"]
    assert main(["put", "w:outputs/c", str(src), "--index", "novalue"]) == 2
