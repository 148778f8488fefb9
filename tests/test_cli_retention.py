"""Retention from the user's side: windows set at `nokvfs init` and later, `nokvfs gc` applying
them, an expired change-feed position (CursorExpired, and `nokvfs changes` saying how to
resync), all through main() on real data directories."""

from __future__ import annotations

import json

import pytest

from nokvfs.cli.main import main
from nokvfs.errors import CursorExpired, InvalidInput
from nokvfs.workspace import changes, datadir, namespace
from nokvfs.workspace.retention import DEFAULT_REQUEST_SECONDS, RetentionSettings


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr()


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("NOKVFS_DATA_DIR", str(tmp_path / "data"))
    assert main(["init", "--retain-versions", "5", "--retain-outbox-records", "20"]) == 0
    assert main(["workbench", "create", "w"]) == 0
    return str(tmp_path / "data")


def put(capsys, tmp_path, n: int) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"body %d" % n)
    assert main(["put", f"w:outputs/f{n % 3}", str(src)]) == 0
    capsys.readouterr()


def test_windows_set_at_init_and_changed_later(data, capsys):
    assert datadir.retention_settings(data) == RetentionSettings(
        versions=5, request_seconds=DEFAULT_REQUEST_SECONDS, outbox_records=20
    )
    code, out = run(capsys, "retention", "--retain-request-seconds", "60", "--json")
    assert code == 0 and json.loads(out.out) == {"versions": 5, "request_seconds": 60, "outbox_records": 20}
    code, out = run(capsys, "retention")
    assert code == 0 and "5 versions" in out.out and "60 s" in out.out
    assert run(capsys, "retention", "--retain-versions", "-1")[0] == 2
    with pytest.raises(InvalidInput):
        RetentionSettings(versions=True)


def test_gc_keeps_the_window_and_an_older_feed_position_is_expired(data, capsys, tmp_path):
    for n in range(12):
        put(capsys, tmp_path, n)
    code, out = run(capsys, "changes", "--json")
    first = [json.loads(line) for line in out.out.splitlines()]
    assert len(first) >= 13
    old_version = first[2]["commit_version"]
    code, out = run(capsys, "gc", "--json")
    assert code == 0
    kept = json.loads(out.out)["retention"]
    assert kept["events_removed"] > 0 and kept["outbox_removed"] > 0
    root = datadir.open_root(data)
    try:
        floors = root.shard.retention_floors
        assert old_version < floors.event_floor_version <= root.shard.commit_version - 5
        assert floors.outbox_floor_lsn > 0 and root.shard.recovery_tail.applied_lsn - floors.outbox_floor_lsn >= 20
        with pytest.raises(CursorExpired) as caught:
            changes.read_changes(root, after_commit_version=old_version)
        assert caught.value.floor == floors.event_floor_version and caught.value.current == root.shard.commit_version
        page = changes.read_changes(root)  # no position: from the oldest kept event
        assert page.changes and all(c.commit_version > floors.event_floor_version for c in page.changes)
        resume = changes.read_changes(root, after_commit_version=floors.event_floor_version)
        assert resume.changes == page.changes
        current = root.shard.commit_version
    finally:
        root.close()
    code, out = run(capsys, "changes", "--after", str(old_version), "--follow")
    assert code == 3
    assert "no longer kept" in out.err and f"--after {current} --follow" in out.err
    # The advice works: following from the version given prints what comes next.
    code, out = run(capsys, "changes", "--after", str(current), "--json")
    assert code == 0 and out.out == ""


def test_a_cursor_taken_before_retention_expires(data, capsys, tmp_path):
    put(capsys, tmp_path, 0)
    root = datadir.open_root(data)
    try:
        page = changes.read_changes(root, limit=1)
        for n in range(1, 10):
            namespace.put(root, "w", f"outputs/g{n}", b"x")
        from nokvfs.workspace import retention

        retention.run(root)
        with pytest.raises(CursorExpired):
            changes.read_changes(root, cursor=page.cursor)
    finally:
        root.close()
