"""Commits: sealed, immutable trees of a workbench, their heads, retirement and lookup.

One module per concern:

    identity      commit ids, the run manifest's bytes, every digest and derived id
    closure       CommitMember rows, their PathEntry projections, the seals and their check
    build_commit  the BuildCommit state machine (nine steps, replay, abort/cleanup, recovery)
    retirement    the CommitRetire state machine
    lookup        get, head, log, hex-prefix resolution, member pages

A commit's tree as of the commit is read through nokvfs.workspace.asof, like a snapshot's. The
names below are the package's interface; callers import them from here.
"""

from __future__ import annotations

from nokvfs.workspace.commit import build_commit, retirement
from nokvfs.workspace.commit.build_commit import (
    MANIFEST_CONTENT_TYPE,
    MEMBER_BATCH,
    CommitAborted,
    CommitRequest,
    CommitResult,
    abort,
    advance,
    begin,
    build,
    operation,
    resume,
)
from nokvfs.workspace.commit.closure import EOF, commit_seals, entry_of, member_from_entry, verify_closure
from nokvfs.workspace.commit.identity import (
    RUN_MANIFEST,
    RUN_MANIFEST_PATH,
    FrozenRequest,
    commit_identity,
    member_chain,
    operation_id,
    parent_digest,
    retire_operation_id,
    revision_digest,
    staged_publish_id,
)
from nokvfs.workspace.commit.lookup import AmbiguousReference, CommitInfo, get, head, log, members, resolve, resolve_in
from nokvfs.workspace.commit.retirement import CommitInUse, claim_retirement, retire, retire_operation


def recover(root) -> list[tuple[str, str]]:
    """Resume every build and retirement whose owning process is gone: (op hex, outcome)."""
    return build_commit.recover(root) + retirement.recover(root)


__all__ = [
    "EOF",
    "MANIFEST_CONTENT_TYPE",
    "MEMBER_BATCH",
    "RUN_MANIFEST",
    "RUN_MANIFEST_PATH",
    "AmbiguousReference",
    "CommitAborted",
    "CommitInUse",
    "CommitInfo",
    "CommitRequest",
    "CommitResult",
    "FrozenRequest",
    "abort",
    "advance",
    "begin",
    "build",
    "claim_retirement",
    "commit_identity",
    "commit_seals",
    "entry_of",
    "get",
    "head",
    "log",
    "member_chain",
    "member_from_entry",
    "members",
    "operation",
    "operation_id",
    "parent_digest",
    "recover",
    "resolve",
    "resolve_in",
    "resume",
    "retire",
    "retire_operation",
    "retire_operation_id",
    "revision_digest",
    "staged_publish_id",
    "verify_closure",
]
