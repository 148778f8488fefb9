"""Commit consumers: every head, tag, restore/fork lease and child commit owns one CommitConsumer.

A `Consumers` collects the consumer changes of one command being built, as refs.References does
for strong references. It reads each touched Commit once from the command's view, applies the
changes in memory and emits the predicates (the exact rows it read, so a concurrent change of the
same commit invalidates the command) and the mutations (the updated rows):

* adding a consumer requires Commit.state == Sealed (and, when the caller names one, the expected
  consumer_epoch); it increments consumer_count and consumer_epoch and writes the
  CommitConsumer row with consumer_epoch_at_add = the new epoch;
* removing one deletes the row, decrements consumer_count and increments consumer_epoch; when
  the count reaches zero it records last_zero_consumer_version = this command's version.

Retirement (commit.retire) CASes Sealed -> Retiring on the same commit row with
consumer_count == 0 at the expected epoch, so an attach and a retirement have one winner, and
after Retiring no consumer can attach.

Consumer owner ids are discriminated by kind (nokvfs.schema.keys): WorkbenchHead and Tag owners
carry the workspace incarnation, Lease owners the restore/fork operation id, ChildCommit owners
the child commit id.
"""

from __future__ import annotations

import dataclasses

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.errors import IntegrityError, NotFound, PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.enums import CommitConsumerKind, CommitState
from nokvfs.schema.records import Commit, CommitConsumer


def commit_key(root_id: bytes, commit_id: bytes) -> bytes:
    return keys.CommitKey(root_id, commit_id).encode()


def consumer_key(root_id: bytes, commit_id: bytes, kind: CommitConsumerKind, owner: bytes) -> bytes:
    return keys.CommitConsumerKey(root_id, commit_id, kind, owner).encode()


def read_commit(view, root_id: bytes, commit_id: bytes) -> tuple[bytes | None, Commit | None]:
    raw = view.get("commit", commit_key(root_id, commit_id))
    return raw, (None if raw is None else Commit.decode(raw))


class Consumers:
    def __init__(self, view, root_id: bytes):
        self.view = view
        self.root_id = root_id
        self.commit_version = view.version + 1
        self._original: dict[bytes, bytes | None] = {}
        self._current: dict[bytes, Commit] = {}
        self._rows: dict[bytes, object] = {}  # CommitConsumer key -> new value or None (delete)

    def commit(self, commit_id: bytes) -> Commit:
        if commit_id not in self._current:
            raw, commit = read_commit(self.view, self.root_id, commit_id)
            if commit is None:
                raise NotFound(f"commit {commit_id.hex()} does not exist")
            self._original[commit_id] = raw
            self._current[commit_id] = commit
        return self._current[commit_id]

    def create(self, commit_id: bytes, commit: Commit) -> None:
        """A commit this command creates (its consumers are added after this)."""
        if commit_id in self._current:
            raise IntegrityError(f"commit {commit_id.hex()} is already part of this command")
        self._original[commit_id] = None
        self._current[commit_id] = commit

    def exists(self, commit_id: bytes, kind: CommitConsumerKind, owner: bytes) -> bool:
        key = consumer_key(self.root_id, commit_id, kind, owner)
        if key in self._rows:
            return self._rows[key] is not None
        return self.view.get("commit_consumer", key) is not None

    def add(
        self, commit_id: bytes, kind: CommitConsumerKind, owner: bytes, *, expected_epoch: int | None = None
    ) -> None:
        commit = self.commit(commit_id)
        if commit.state != CommitState.Sealed:
            raise PredicateFailed(f"commit {commit_id.hex()} is {commit.state.name}: consumers need Sealed")
        if expected_epoch is not None and commit.consumer_epoch != expected_epoch:
            raise PredicateFailed(
                f"commit {commit_id.hex()} is at consumer epoch {commit.consumer_epoch}, expected {expected_epoch}"
            )
        key = consumer_key(self.root_id, commit_id, kind, owner)
        if self.exists(commit_id, kind, owner):
            raise IntegrityError(f"commit consumer {key.hex()} already exists")
        epoch = commit.consumer_epoch + 1
        self._rows[key] = CommitConsumer(consumer_epoch_at_add=epoch, created_version=self.commit_version)
        self._current[commit_id] = dataclasses.replace(
            commit, consumer_count=commit.consumer_count + 1, consumer_epoch=epoch
        )

    def remove(self, commit_id: bytes, kind: CommitConsumerKind, owner: bytes) -> None:
        commit = self.commit(commit_id)
        key = consumer_key(self.root_id, commit_id, kind, owner)
        if not self.exists(commit_id, kind, owner):
            raise IntegrityError(f"commit consumer {key.hex()} to remove does not exist")
        if commit.consumer_count == 0:
            raise IntegrityError(f"commit {commit_id.hex()} has no consumer to remove")
        self._rows[key] = None
        count = commit.consumer_count - 1
        updated = dataclasses.replace(commit, consumer_count=count, consumer_epoch=commit.consumer_epoch + 1)
        if count == 0:
            updated = dataclasses.replace(updated, last_zero_consumer_version=self.commit_version)
        self._current[commit_id] = updated

    def rows(self):
        """(predicates, mutations) for the command."""
        predicates, mutations = [], []
        for commit_id, commit in self._current.items():
            key = commit_key(self.root_id, commit_id)
            original = self._original[commit_id]
            predicates.append(Absent("commit", key) if original is None else ValueEquals("commit", key, original))
            mutations.append(Put("commit", key, commit))
        for key, value in self._rows.items():
            mutations.append(Delete("commit_consumer", key) if value is None else Put("commit_consumer", key, value))
        return predicates, mutations
