"""The commit closure: members, their PathEntry projections and the seals that prove them.

The Commit seal is the closure proof (seed "Commit Closure"): CommitMember path membership,
unique RevisionRef(Commit, commit_id, revision) rows and unique outbound
CommitConsumer(parent, ChildCommit, child) rows must match the member, revision and parent
count/digest pairs. `verify_closure` recomputes them from the rows.

Cursors: b"" is "from the start", EOF = b"\\xff" (no ordered path key starts with 0xff).
"""

from __future__ import annotations

from dataclasses import dataclass

from nokvfs.engine.scan import iter_prefix, scan_prefix
from nokvfs.errors import IntegrityError
from nokvfs.schema import keys
from nokvfs.schema.enums import CommitConsumerKind, ReferenceKind
from nokvfs.schema.paths import ordered_path, unordered_path
from nokvfs.schema.records import ZERO_DIGEST, BuildCommitOperation, Commit, CommitMember, PathEntry
from nokvfs.workspace.commit.identity import RUN_MANIFEST, member_chain, parent_digest, revision_digest
from nokvfs.workspace.consumers import consumer_key

EOF = b"\xff"


def member_from_entry(entry: PathEntry) -> CommitMember:
    return CommitMember(
        artifact_revision_id=entry.artifact_revision_id,
        path_generation=entry.generation,
        body_digest_uri=entry.body_digest_uri,
        manifest_digest_uri=entry.manifest_digest_uri,
        logical_size=entry.logical_size,
        dependency_count=entry.dependency_count,
        dependency_depth=entry.dependency_depth,
        content_type=entry.content_type,
        producer=entry.producer,
        manifest_id=entry.manifest_id,
        typed_projection=tuple(entry.typed_index_projection),
    )


def entry_of(member: CommitMember, version: int) -> PathEntry:
    """A PathEntry serving a commit member to listing/reading code (versions: the commit's)."""
    return PathEntry(
        generation=member.path_generation,
        artifact_revision_id=member.artifact_revision_id,
        logical_size=member.logical_size,
        body_digest_uri=member.body_digest_uri,
        manifest_digest_uri=member.manifest_digest_uri,
        dependency_count=member.dependency_count,
        dependency_depth=member.dependency_depth,
        content_type=member.content_type,
        producer=member.producer,
        manifest_id=member.manifest_id,
        created_version=version,
        modified_version=version,
        typed_index_projection=tuple(member.typed_projection),
    )


def _virtual_member(op: BuildCommitOperation) -> CommitMember:
    binding = op.run_manifest
    return CommitMember(
        artifact_revision_id=binding.artifact_revision_id,
        path_generation=(op.run_manifest_expected_generation or 0) + 1,
        body_digest_uri=binding.body_digest_uri,
        manifest_digest_uri=binding.manifest_digest_uri,
        logical_size=binding.logical_size,
        dependency_count=0,
        dependency_depth=0,
        content_type=binding.content_type,
        producer=op.producer,
        manifest_id=binding.artifact_revision_id,
        typed_projection=(),
    )


def frozen_members(frozen, root, op: BuildCommitOperation, start_after: bytes | None):
    """(ordered path bytes, components, CommitMember) of the frozen tree after `start_after`, in
    canonical order, metadata/run_manifest.json replaced or inserted as the virtual member."""
    prefix = keys.path_current_prefix(root.root_id, op.source_workspace_incarnation_id)
    virtual_key = ordered_path(RUN_MANIFEST)
    virtual = _virtual_member(op)
    emitted = start_after is not None and start_after >= virtual_key
    marker = None if start_after is None else prefix + start_after
    while True:
        page = scan_prefix(frozen, "path_current", prefix, start_after=marker)
        for key, value in page.items:
            suffix = key[len(prefix) :]
            if not emitted and suffix >= virtual_key:
                emitted = True
                yield virtual_key, RUN_MANIFEST, virtual
                if suffix == virtual_key:
                    continue
            yield suffix, unordered_path(suffix), member_from_entry(PathEntry.decode(value))
        if page.next_marker is None:
            break
        marker = page.next_marker
    if not emitted:
        yield virtual_key, RUN_MANIFEST, virtual


def member_rows(view, root, commit_id: bytes):
    """Every (ordered suffix, components, CommitMember) of a commit, in path order."""
    prefix = keys.commit_member_prefix(root.root_id, commit_id)
    for key, value in iter_prefix(view, "commit_member", prefix):
        suffix = key[len(prefix) :]
        yield suffix, unordered_path(suffix), CommitMember.decode(value)


def commit_ref_ids(view, root, commit_id: bytes) -> list[bytes]:
    prefix = keys.revision_ref_prefix(root.root_id, ReferenceKind.Commit, keys.commit_reference_owner(commit_id))
    return [key[len(prefix) :] for key, _ in iter_prefix(view, "revision_ref", prefix)]


@dataclass(frozen=True)
class Seals:
    member_count: int
    member_digest: bytes
    unique_revision_count: int
    revision_digest: bytes
    parents: tuple
    parent_count: int
    parent_digest: bytes


def verify_closure(view, root, commit_id: bytes, seals: Seals) -> None:
    """Recompute the member, revision and parent count/digest pairs from their exact rows and
    compare them with `seals`; IntegrityError names the first pair that differs."""
    count, digest, revisions = 0, ZERO_DIGEST, set()
    for _, components, member in member_rows(view, root, commit_id):
        count += 1
        digest = member_chain(digest, components, member)
        revisions.add(member.artifact_revision_id)
    if (count, digest) != (seals.member_count, seals.member_digest):
        raise IntegrityError(
            f"commit {commit_id.hex()}: the CommitMember rows do not match the member seal ({count} rows, sealed "
            f"{seals.member_count})"
        )
    refs = commit_ref_ids(view, root, commit_id)
    if (
        set(refs) != revisions
        or len(refs) != seals.unique_revision_count
        or revision_digest(refs) != seals.revision_digest
    ):
        raise IntegrityError(
            f"commit {commit_id.hex()}: the Commit RevisionRefs do not match the revision seal ({len(refs)} refs, "
            f"{len(revisions)} member revisions, sealed {seals.unique_revision_count})"
        )
    parents = tuple(seals.parents)
    if (
        len(set(parents)) != len(parents)
        or len(parents) != seals.parent_count
        or parent_digest(parents) != seals.parent_digest
    ):
        raise IntegrityError(f"commit {commit_id.hex()}: the parents do not match the parent seal")
    for parent in parents:
        if (
            view.get("commit_consumer", consumer_key(root.root_id, parent, CommitConsumerKind.ChildCommit, commit_id))
            is None
        ):
            raise IntegrityError(f"commit {commit_id.hex()}: parent {parent.hex()} has no ChildCommit consumer row")


def op_seals(op: BuildCommitOperation) -> Seals:
    return Seals(
        op.member_count,
        op.member_digest,
        op.unique_revision_count,
        op.revision_digest,
        tuple(op.parents),
        op.parent_count,
        op.parent_digest,
    )


def commit_seals(commit: Commit) -> Seals:
    return Seals(
        commit.member_count,
        commit.member_digest,
        commit.unique_revision_count,
        commit.revision_digest,
        tuple(commit.parents),
        commit.parent_count,
        commit.parent_digest,
    )
