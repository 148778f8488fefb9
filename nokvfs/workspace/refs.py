"""Strong references: every add or remove is one RevisionRef row plus the revision's count/epoch.

A `References` collects the reference changes of one command being built. It reads each touched
ArtifactRevision once from the command's view, applies the changes in memory, and emits the
predicates (the exact rows it read) and mutations (the updated rows). When a count reaches zero
it records last_zero_ref_version and a GcCandidate keyed by the new reference epoch.
"""

from __future__ import annotations

import dataclasses

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.errors import IntegrityError, NotFound, PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.enums import GcClaimState, ReferenceKind, RevisionState
from nokvfs.schema.records import ArtifactRevision, GcCandidate, RevisionRef


class References:
    def __init__(self, view, root_id: bytes):
        self.view = view
        self.root_id = root_id
        self.commit_version = view.version + 1
        self._original: dict[bytes, bytes | None] = {}
        self._current: dict[bytes, ArtifactRevision] = {}
        self._refs: dict[bytes, object] = {}  # RevisionRef key -> new value or None (delete)
        self._candidates: dict[bytes, GcCandidate] = {}

    def revision(self, revision_id: bytes) -> ArtifactRevision:
        if revision_id not in self._current:
            raw = self.view.get("artifact_revision", keys.ArtifactRevisionKey(self.root_id, revision_id).encode())
            if raw is None:
                raise NotFound(f"artifact revision {revision_id.hex()} does not exist")
            self._original[revision_id] = raw
            self._current[revision_id] = ArtifactRevision.decode(raw)
        return self._current[revision_id]

    def create(self, revision_id: bytes, revision: ArtifactRevision) -> None:
        """A revision this command creates (count 0 until references are added)."""
        self._original[revision_id] = None
        self._current[revision_id] = revision

    def add(self, kind: ReferenceKind, owner: bytes, revision_id: bytes) -> None:
        revision = self.revision(revision_id)
        if revision.state != RevisionState.Available:
            raise PredicateFailed(f"revision {revision_id.hex()} is {revision.state.name}: references need Available")
        key = keys.RevisionRefKey(self.root_id, kind, owner, revision_id).encode()
        if key in self._refs:
            if self._refs[key] is not None:
                raise IntegrityError(f"reference {key.hex()} added twice in one command")
        elif self.view.get("revision_ref", key) is not None:
            raise IntegrityError(f"reference {key.hex()} already exists")
        epoch = revision.reference_epoch + 1
        self._refs[key] = RevisionRef(reference_epoch_at_add=epoch, created_version=self.commit_version)
        self._current[revision_id] = dataclasses.replace(
            revision, strong_reference_count=revision.strong_reference_count + 1, reference_epoch=epoch
        )

    def remove(self, kind: ReferenceKind, owner: bytes, revision_id: bytes) -> None:
        revision = self.revision(revision_id)
        key = keys.RevisionRefKey(self.root_id, kind, owner, revision_id).encode()
        if key in self._refs:
            if self._refs[key] is None:
                raise IntegrityError(f"reference {key.hex()} removed twice in one command")
        elif self.view.get("revision_ref", key) is None:
            raise IntegrityError(f"reference {key.hex()} to remove does not exist")
        if revision.strong_reference_count == 0:
            raise IntegrityError(f"revision {revision_id.hex()} has no reference to remove")
        self._refs[key] = None
        epoch = revision.reference_epoch + 1
        count = revision.strong_reference_count - 1
        updated = dataclasses.replace(revision, strong_reference_count=count, reference_epoch=epoch)
        if count == 0:
            updated = dataclasses.replace(updated, last_zero_ref_version=self.commit_version)
            candidate_key = keys.GcCandidateKey(self.root_id, revision_id, epoch).encode()
            self._candidates[candidate_key] = GcCandidate(
                last_zero_ref_version=self.commit_version,
                claim_state=GcClaimState.Candidate,
                retry_count=0,
                quarantine_evidence=None,
            )
        self._current[revision_id] = updated

    def rows(self):
        """(predicates, mutations) for the command."""
        predicates, mutations = [], []
        for revision_id, revision in self._current.items():
            key = keys.ArtifactRevisionKey(self.root_id, revision_id).encode()
            original = self._original[revision_id]
            predicates.append(
                Absent("artifact_revision", key)
                if original is None
                else ValueEquals("artifact_revision", key, original)
            )
            mutations.append(Put("artifact_revision", key, revision))
        for key, value in self._refs.items():
            mutations.append(Delete("revision_ref", key) if value is None else Put("revision_ref", key, value))
        for key, candidate in self._candidates.items():
            mutations.append(Put("gc_candidate", key, candidate))
        return predicates, mutations
