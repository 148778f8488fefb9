"""Workbenches: direct create (claim, Staging -> Visible), lookup and listing.

Visible is the publication marker; Staging is never visible; incarnations are never reused; a
create that crashed after its first command is finished by the next create of that name.
"""

from __future__ import annotations

import threading

import pytest

from nokvfs.engine.command import Put
from nokvfs.errors import AlreadyExists, NameInvalid, NotFound
from nokvfs.schema import keys
from nokvfs.schema.enums import OperationKind, WorkspaceState
from nokvfs.schema.ids import new_id16
from nokvfs.schema.records import (
    OperationRef,
    WorkspaceCurrent,
    WorkspaceIncarnationClaim,
)
from nokvfs.workspace import listing, namespace
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.root import Built, intent_digest
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    all_rows,
    data_dir_fixture,
    root_fixture,
    workspace_row,
)


class _Crash(BaseException):
    """Stands for the process dying between a create's two commands."""


def _crash_after_first_command(monkeypatch, root):
    real = root.apply
    calls = []

    def apply(build, **kw):
        if calls:
            raise _Crash()
        calls.append(kw)
        return real(build, **kw)

    monkeypatch.setattr(root, "apply", apply)
    return lambda: monkeypatch.setattr(root, "apply", real)


def _claims(root) -> dict[bytes, str]:
    return {
        keys.WorkspaceIncarnationClaimKey.decode(k).workspace_incarnation_id: WorkspaceIncarnationClaim.decode(
            v
        ).workbench_id
        for k, v in all_rows(root, "workspace_incarnation_claim", root.root_id)
    }


def test_create_publishes_a_visible_workbench_with_a_claimed_incarnation(root):
    before = root.shard.commit_version
    created = wb.create(root, "alpha")
    assert created.state == WorkspaceState.Visible
    assert created.revision == 0
    assert root.shard.commit_version == before + 2  # stage, then publish
    assert wb.get(root, "alpha") == created
    row = workspace_row(root, "alpha")
    assert row.state == WorkspaceState.Visible and row.owning_operation is None
    assert row.created_version == before + 1 and row.modified_version == before + 2
    assert _claims(root) == {created.incarnation_id: "alpha"}


def test_create_of_an_existing_name_is_already_exists_and_changes_nothing(root):
    created = wb.create(root, "alpha")
    version = root.shard.commit_version
    with pytest.raises(AlreadyExists):
        wb.create(root, "alpha")
    assert root.shard.commit_version == version
    assert wb.get(root, "alpha") == created
    assert len(_claims(root)) == 1


def test_workbench_ids_are_case_sensitive(root):
    a = wb.create(root, "Alpha")
    b = wb.create(root, "alpha")
    assert a.incarnation_id != b.incarnation_id
    with root.read() as view:
        assert [w.workbench_id for w in wb.list_visible(view, root.root_id)] == ["Alpha", "alpha"]


@pytest.mark.parametrize("bad", ["", "-lead", "_lead", "has space", "dot.ted", "slash/ed", "é", "x" * 129, "a\x00b"])
def test_bad_workbench_ids_are_refused_before_any_command(root, bad):
    version = root.shard.commit_version
    with pytest.raises(NameInvalid):
        wb.create(root, bad)
    with pytest.raises(NameInvalid):
        wb.get(root, bad)
    assert root.shard.commit_version == version


def test_longest_workbench_id_is_accepted(root):
    name = "a" * 128
    assert wb.create(root, name).workbench_id == name


def test_incarnations_are_never_reused(root):
    created = [wb.create(root, f"w{i}") for i in range(40)]
    incarnations = {c.incarnation_id for c in created}
    assert len(incarnations) == 40
    assert _claims(root) == {c.incarnation_id: c.workbench_id for c in created}


def test_a_retired_name_is_reclaimed_with_a_fresh_incarnation_and_the_old_claim_stays(root):
    old_incarnation = new_id16()
    key = wb.current_key(root.root_id, "gone")
    claim_key = keys.WorkspaceIncarnationClaimKey(root.root_id, old_incarnation).encode()

    def retired(view):
        version = view.version + 1
        row = WorkspaceCurrent(old_incarnation, 0, WorkspaceState.Retired, None, version, version)
        return Built(
            mutations=[
                Put("workspace_current", key, row),
                Put("workspace_incarnation_claim", claim_key, WorkspaceIncarnationClaim("gone")),
            ]
        )

    root.apply(retired, digest=intent_digest("test.retired"))
    with pytest.raises(NotFound):
        wb.get(root, "gone")
    created = wb.create(root, "gone")
    assert created.incarnation_id != old_incarnation
    assert _claims(root) == {old_incarnation: "gone", created.incarnation_id: "gone"}


def test_staging_is_never_visible_and_a_crashed_create_is_finished_by_the_next(monkeypatch, root):
    restore = _crash_after_first_command(monkeypatch, root)
    with pytest.raises(_Crash):
        wb.create(root, "half")
    restore()
    row = workspace_row(root, "half")
    assert row.state == WorkspaceState.Staging
    staged_incarnation = row.workspace_incarnation_id

    with pytest.raises(NotFound):
        wb.get(root, "half")
    with root.read() as view:
        assert wb.list_visible(view, root.root_id) == []
        with pytest.raises(NotFound):
            listing.list_dir(view, root, "half")
        with pytest.raises(NotFound):
            listing.stat(view, root, "half", "outputs")
    with pytest.raises(NotFound):
        namespace.put(root, "half", "outputs/x", b"no")

    finished = wb.create(root, "half")
    assert finished.incarnation_id == staged_incarnation  # finished, not re-staged
    assert finished.state == WorkspaceState.Visible
    assert _claims(root) == {staged_incarnation: "half"}
    with pytest.raises(AlreadyExists):
        wb.create(root, "half")


def test_a_staging_row_owned_by_a_restore_is_not_taken_over(root):
    key = wb.current_key(root.root_id, "restoring")
    incarnation = new_id16()

    def staging(view):
        version = view.version + 1
        owner = OperationRef(OperationKind.Restore, new_id16())
        return Built(
            mutations=[
                Put(
                    "workspace_current",
                    key,
                    WorkspaceCurrent(incarnation, 0, WorkspaceState.Staging, owner, version, version),
                )
            ]
        )

    root.apply(staging, digest=intent_digest("test.restore-staging"))
    with pytest.raises(AlreadyExists):
        wb.create(root, "restoring")
    assert workspace_row(root, "restoring").state == WorkspaceState.Staging
    with pytest.raises(NotFound):
        wb.get(root, "restoring")


def test_concurrent_creates_of_one_name_have_one_winner_and_the_rest_already_exists(root):
    for round_ in range(10):
        name = f"race{round_}"
        barrier = threading.Barrier(4)
        outcomes = []

        def create():
            barrier.wait()
            try:
                outcomes.append(wb.create(root, name))
            except AlreadyExists as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=create) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if isinstance(o, wb.Workbench)]
        assert len(outcomes) == 4
        assert len(winners) == 1, outcomes
        assert wb.get(root, name) == winners[0]


def test_list_visible_pages_past_one_engine_call(root):
    names = sorted(f"w{i:04d}" for i in range(300))
    for name in names:
        wb.create(root, name)
    with root.read() as view:
        assert [w.workbench_id for w in wb.list_visible(view, root.root_id)] == names
