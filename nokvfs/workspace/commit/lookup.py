"""Finding commits: by id, the workbench's head and first-parent log, and hex-prefix resolution.

`resolve` matches commits whose source incarnation is the workbench's current one; any non-empty
lowercase hex prefix is accepted, and AmbiguousReference lists every match.
"""

from __future__ import annotations

from dataclasses import dataclass

from nokvfs.engine.scan import MAX_ITEMS_PER_CALL, scan_prefix
from nokvfs.errors import InvalidInput, NotFound
from nokvfs.schema import keys
from nokvfs.schema.enums import CommitState
from nokvfs.schema.ids import check_commit_id
from nokvfs.schema.paths import join, unordered_path
from nokvfs.schema.records import Commit, CommitMember, WorkbenchCommitHead
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.consumers import read_commit


class AmbiguousReference(InvalidInput):
    """A commit hex prefix names more than one commit; `matches` lists them (full hex)."""

    def __init__(self, message: str, matches: list[str]):
        super().__init__(message)
        self.matches = matches


def head_key(root, incarnation: bytes) -> bytes:
    return keys.WorkbenchCommitHeadKey(root.root_id, incarnation).encode()


@dataclass(frozen=True)
class CommitInfo:
    commit_id: bytes
    commit: Commit

    @property
    def hex(self) -> str:
        return self.commit_id.hex()

    @property
    def state(self) -> CommitState:
        return self.commit.state

    @property
    def parents(self) -> tuple:
        return tuple(self.commit.parents)


def get(root, commit_id: bytes) -> CommitInfo:
    with root.read() as view:
        _, commit = read_commit(view, root.root_id, check_commit_id(commit_id))
    if commit is None:
        raise NotFound(f"commit {commit_id.hex()} does not exist")
    return CommitInfo(commit_id, commit)


def head(root, workbench_id: str) -> WorkbenchCommitHead | None:
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        raw = view.get("workbench_commit_head", head_key(root, workbench.incarnation_id))
    return None if raw is None else WorkbenchCommitHead.decode(raw)


def log(root, workbench_id: str, *, limit: int = 1000) -> list[CommitInfo]:
    """The head and its first-parent ancestors, newest first (at most `limit`)."""
    out = []
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        raw = view.get("workbench_commit_head", head_key(root, workbench.incarnation_id))
        current = None if raw is None else WorkbenchCommitHead.decode(raw).commit_id
        while current is not None and len(out) < limit:
            _, commit = read_commit(view, root.root_id, current)
            if commit is None:
                break
            out.append(CommitInfo(current, commit))
            current = commit.parents[0] if commit.parents else None
    return out


def resolve(root, workbench_id: str, prefix: str) -> bytes:
    """The one commit of the workbench whose lowercase hex id starts with `prefix`.

    AmbiguousReference lists every match; NotFound when none matches.
    """
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        return resolve_in(view, root, workbench, prefix)


def resolve_in(view, root, workbench: wb.Workbench, prefix: str) -> bytes:
    """`resolve` within one read view, for a workbench already read from it."""
    if (
        not isinstance(prefix, str)
        or not prefix
        or len(prefix) > 64
        or any(c not in "0123456789abcdef" for c in prefix)
    ):
        raise InvalidInput(f"a commit reference is 1..64 lowercase hex characters, not {prefix!r}")
    matches = []
    key_prefix = root.root_id + bytes.fromhex(prefix[: len(prefix) // 2 * 2])
    marker = None
    while True:
        page = scan_prefix(view, "commit", key_prefix, start_after=marker)
        for key, value in page.items:
            commit_id = keys.CommitKey.decode(key).commit_id
            if (
                commit_id.hex().startswith(prefix)
                and Commit.decode(value).source_workspace_incarnation_id == workbench.incarnation_id
            ):
                matches.append(commit_id)
        if page.next_marker is None:
            break
        marker = page.next_marker
    if not matches:
        raise NotFound(f"no commit {prefix} in {workbench.workbench_id}")
    if len(matches) > 1:
        hexes = [m.hex() for m in matches]
        raise AmbiguousReference(
            f"commit prefix {prefix} is ambiguous in {workbench.workbench_id}: " + ", ".join(hexes), hexes
        )
    return matches[0]


def members(view, root, commit_id: bytes, *, start_after: bytes | None = None, limit: int = MAX_ITEMS_PER_CALL):
    """One bounded page of a commit's members: ([(path text, CommitMember)], next marker)."""
    prefix = keys.commit_member_prefix(root.root_id, check_commit_id(commit_id))
    page = scan_prefix(view, "commit_member", prefix, start_after=start_after, limit=limit)
    return [(join(unordered_path(k[len(prefix) :])), CommitMember.decode(v)) for k, v in page.items], page.next_marker
