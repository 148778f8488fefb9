"""Workbenches: direct creation (claim, Staging -> Visible), lookup and listing.

WorkspaceCurrent.state == Visible is the publication marker and is terminal. A direct create
claims a never-reused incarnation and writes Staging in one command, then publishes Visible in a
second. A Staging row left by a crashed direct create is finished by the next create of that name;
one owned by a restore belongs to that restore. A Visible id is never reused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nokvfs.engine.command import Absent, Put, ValueEquals
from nokvfs.engine.scan import scan_prefix
from nokvfs.errors import AlreadyExists, NotFound
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, WorkspaceState
from nokvfs.schema.ids import new_id16
from nokvfs.schema.names import check_workbench_id
from nokvfs.schema.records import ChangeEvent, WorkspaceCurrent, WorkspaceIncarnationClaim
from nokvfs.workspace.root import Built, intent_digest

SECTIONS = ("input", "scripts", "outputs", "logs", "metadata")


@dataclass(frozen=True)
class Workbench:
    workbench_id: str
    incarnation_id: bytes
    revision: int
    state: WorkspaceState
    created_version: int
    modified_version: int

    @classmethod
    def from_record(cls, workbench_id: str, record: WorkspaceCurrent) -> "Workbench":
        return cls(
            workbench_id,
            record.workspace_incarnation_id,
            record.workspace_revision,
            record.state,
            record.created_version,
            record.modified_version,
        )


def current_key(root_id: bytes, workbench_id: str) -> bytes:
    return keys.WorkspaceCurrentKey(root_id, workbench_id).encode()


def read_current(view, root_id: bytes, workbench_id: str) -> tuple[bytes | None, WorkspaceCurrent | None]:
    raw = view.get("workspace_current", current_key(root_id, workbench_id))
    return raw, (None if raw is None else WorkspaceCurrent.decode(raw))


def visible(view, root_id: bytes, workbench_id: str) -> tuple[bytes, Workbench]:
    """The Visible workbench and its raw marker row (for predicates), or NotFound."""
    check_workbench_id(workbench_id)
    raw, record = read_current(view, root_id, workbench_id)
    if record is None or record.state != WorkspaceState.Visible:
        raise NotFound(f"no workbench {workbench_id!r}")
    return raw, Workbench.from_record(workbench_id, record)


def event(
    workbench: Workbench | tuple,
    kind: ChangeEventKind,
    path: str | None = None,
    before: bytes | None = None,
    after: bytes | None = None,
) -> ChangeEvent:
    workbench_id, incarnation = (
        (workbench.workbench_id, workbench.incarnation_id) if isinstance(workbench, Workbench) else workbench
    )
    return ChangeEvent(
        workbench_id=workbench_id,
        workspace_incarnation_id=incarnation,
        kind=kind,
        path=path,
        before=before,
        after=after,
    )


def advance_revision(root_id: bytes, workbench_id: str, raw: bytes, commit_version: int):
    """(predicate, mutation) moving the workspace revision on, CAS on the exact marker read."""
    record = WorkspaceCurrent.decode(raw)
    updated = dataclasses.replace(
        record, workspace_revision=record.workspace_revision + 1, modified_version=commit_version
    )
    key = current_key(root_id, workbench_id)
    return ValueEquals("workspace_current", key, raw), Put("workspace_current", key, updated)


def create(root, workbench_id: str) -> Workbench:
    check_workbench_id(workbench_id)
    key = current_key(root.root_id, workbench_id)
    request = new_id16()

    def stage(view):
        raw, record = read_current(view, root.root_id, workbench_id)
        if record is not None and record.state == WorkspaceState.Visible:
            raise AlreadyExists(f"workbench {workbench_id!r} exists")
        if record is not None and record.state == WorkspaceState.Staging:
            if record.owning_operation is not None:
                raise AlreadyExists(f"workbench {workbench_id!r} is being restored")
            return Built(value=(raw, record))  # an abandoned direct create: finish it
        incarnation = new_id16()
        claim_key = keys.WorkspaceIncarnationClaimKey(root.root_id, incarnation).encode()
        version = view.version + 1
        staging = WorkspaceCurrent(
            workspace_incarnation_id=incarnation,
            workspace_revision=0,
            state=WorkspaceState.Staging,
            owning_operation=None,
            created_version=version,
            modified_version=version,
        )
        return Built(
            predicates=[
                Absent("workspace_current", key) if raw is None else ValueEquals("workspace_current", key, raw),
                Absent("workspace_incarnation_claim", claim_key),
            ],
            mutations=[
                Put("workspace_incarnation_claim", claim_key, WorkspaceIncarnationClaim(workbench_id=workbench_id)),
                Put("workspace_current", key, staging),
            ],
            value=(staging.encode(), staging),
        )

    _, built = root.apply(stage, digest=intent_digest("workbench.stage", request, workbench_id), request_id=request)
    staged_raw, staged = built.value

    def publish(view):
        raw, _ = read_current(view, root.root_id, workbench_id)
        if raw != staged_raw:
            # A concurrent create of the same name published (or replaced) the Staging row first.
            raise AlreadyExists(f"workbench {workbench_id!r} exists")
        version = view.version + 1
        record = dataclasses.replace(staged, state=WorkspaceState.Visible, modified_version=version)
        return Built(
            predicates=[ValueEquals("workspace_current", key, staged_raw)],
            mutations=[Put("workspace_current", key, record)],
            events=[event((workbench_id, staged.workspace_incarnation_id), ChangeEventKind.WorkspaceCreated)],
            value=record,
        )

    _, built = root.apply(publish, digest=intent_digest("workbench.publish", staged_raw))
    return Workbench.from_record(workbench_id, built.value)


def get(root, workbench_id: str) -> Workbench:
    with root.read() as view:
        return visible(view, root.root_id, workbench_id)[1]


def list_visible(view, root_id: bytes) -> list[Workbench]:
    """Every Visible workbench of the root, in id order (bounded pages under the hood)."""
    prefix = keys.workspace_current_prefix(root_id)
    out, marker = [], None
    while True:
        page = scan_prefix(view, "workspace_current", prefix, start_after=marker)
        for key, value in page.items:
            record = WorkspaceCurrent.decode(value)
            if record.state == WorkspaceState.Visible:
                out.append(Workbench.from_record(keys.WorkspaceCurrentKey.decode(key).workbench_id, record))
        if page.next_marker is None:
            return out
        marker = page.next_marker
