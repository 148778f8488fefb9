"""Staging: a typed manifest uploaded through the publish pipeline and published by its owner.

A commit build stages metadata/run_manifest.json (seed: CommitStaging), a restore
metadata/restore_manifest.json (RestoreStaging). Both upload the body through publish's public
staging API -- `publish.begin` (the PublishOperation and its exact StagedObject ledger, for a
given workspace incarnation), `publish.upload`, `publish.finalize` -- and then one command of
the owning state machine (`bind`) creates the ArtifactRevision (Available) and its manifest,
adds the owner's reference to it and moves the publish operation Finalizing -> Published,
deleting the ledger. That command uses the publish operation's request id, so publish.abort's
Finalizing takeover proof (no dedupe row for it) is exact. Generic publish recovery leaves these
operations alone: their owner settles them.

An owner makes numbered attempts (`Attempts`): attempt n is the publish operation
`publish_id(n)`, derived from the owner's id, so the attempts are found again by point reads
and never by a scan. An attempt whose uploader died is aborted and cleaned and the next attempt
stages again. A restore's attempts all stage the same (deterministic) revision, hence the same
object keys: a Quarantined attempt there stops the restore, since its keys cannot be reused
until reconciliation settles them (`reconcile`, run by gc only once the owner is terminal, so
no further attempt can reuse a key in doubt).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable

from nokvfs.engine.command import Delete, Put, ValueEquals
from nokvfs.errors import IntegrityError, NokvError, NotFound, PredicateFailed
from nokvfs.objects.keys import artifact_block_key
from nokvfs.schema import keys
from nokvfs.schema.enums import PublishPhase, StagedCleanupState
from nokvfs.schema.records import ArtifactManifest, ArtifactRevision, PublishOperation
from nokvfs.workspace import body as bodies
from nokvfs.workspace import publish
from nokvfs.workspace.operations import OperationLock, crash_point, driving
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 64


@dataclass(frozen=True)
class Attempts:
    """The staged attempts of one owner."""

    publish_id: Callable[[int], bytes]  # attempt number -> publish operation id
    owner: str  # how messages name the owner ("build-commit <hex>", "restore <hex>")
    manifest: str  # "run manifest", "restore manifest"
    same_keys: bool  # every attempt stages the same revision (and object keys)

    def made(self, root) -> list[tuple[bytes, PublishOperation]]:
        """[(publish id, PublishOperation)] of every attempt made so far, in order."""
        out = []
        for attempt in range(MAX_ATTEMPTS):
            publish_id = self.publish_id(attempt)
            op = read_publish(root, publish_id)
            if op is None:
                break
            out.append((publish_id, op))
        return out


def read_publish(root, publish_id: bytes) -> PublishOperation | None:
    return publish.ROWS.find(root, publish_id)


def planned_manifest(root, revision_id: bytes, body: bodies.Body) -> list[ArtifactManifest]:
    """The manifest rows a staged body will have, known before its upload."""
    return [
        ArtifactManifest(
            physical_owner_revision_id=revision_id,
            physical_object_index=block.index,
            object_key=artifact_block_key(root.logical_shard_id, root.root_id, revision_id, block.index),
            logical_offset=block.offset,
            object_offset=0,
            length=block.length,
            digest_uri="sha256:" + block.sha256.hex(),
            append_segment=None,
        )
        for block in body.blocks
    ]


# --- staging and settling attempts ------------------------------------------------------------


def stage_next(root, attempts: Attempts, publication, incarnation: bytes, bind_attempt) -> None:
    """The owner's staging step: settle what earlier drivers left (binding a Finalizing attempt
    whose objects are all present), else stage a new attempt.

    `publication(publish id)` builds the Publication of a new attempt; `bind_attempt(publish
    id)` runs the owner's binding command.
    """
    made = attempts.made(root)
    for publish_id, pub in made:
        if pub.phase == PublishPhase.Quarantined and attempts.same_keys:
            raise _keys_in_doubt(attempts, publish_id)
        if pub.phase in (PublishPhase.Cleaned, PublishPhase.Quarantined):
            continue
        if pub.phase == PublishPhase.Published:
            raise IntegrityError(
                f"staged {attempts.manifest} {publish_id.hex()} was published outside its {attempts.owner.split()[0]}"
            )
        outcome = _settle(root, publish_id, pub, lambda publish_id=publish_id: bind_attempt(publish_id))
        if outcome == "bound":
            return
        if outcome == PublishPhase.Quarantined.name and attempts.same_keys:
            raise _keys_in_doubt(attempts, publish_id)
    if len(made) >= MAX_ATTEMPTS:
        raise PredicateFailed(f"{attempts.owner}: {MAX_ATTEMPTS} staging attempts failed")
    publish_id = attempts.publish_id(len(made))
    _stage(root, publication(publish_id), incarnation, lambda: bind_attempt(publish_id))


def _keys_in_doubt(attempts: Attempts, publish_id: bytes) -> IntegrityError:
    return IntegrityError(
        f"{attempts.owner}: staging attempt {publish_id.hex()} is quarantined; its object keys cannot be reused"
    )


def _stage(root, pub: publish.Publication, incarnation: bytes, bind) -> None:
    """Upload a typed manifest through the publish pipeline and let `bind()` (one command of the
    owning state machine, using pub.request_id) publish it as staged. On a typed failure the
    publish operation is aborted and cleaned and the error re-raised."""
    with driving(root, pub.operation_id, "publish"):
        publish.begin(root, pub, incarnation)
        crash_point("staged-after-begin")
        try:
            publish.upload(root, pub)
            publish.finalize(root, pub.operation_id)
            crash_point("staged-after-finalize")
            bind()
        except NokvError as exc:
            try:
                publish.abort(root, pub.operation_id, reason=f"{type(exc).__name__}: {exc}")
            except NokvError as cleanup:
                log.error("staged %s: cleanup after %r failed: %s", pub.operation_id.hex(), exc, cleanup)
            raise


def _settle(root, publish_id: bytes, op: PublishOperation, bind) -> str:
    """Settle a staged publish a previous driver left behind: "bound" when `bind()` finished a
    Finalizing one whose objects are all present, else the phase it was aborted to."""
    with driving(root, publish_id, "publish"):
        if op.phase == PublishPhase.Finalizing:
            with root.read() as view:
                ledger = publish.read_ledger(view, root, publish_id)
            if all(publish.object_present(root, row) for _, row in ledger):
                bind()
                return "bound"
            reason = "a staged object is missing"
        else:
            reason = "the staging process was lost"
        return publish.abort(root, publish_id, reason=reason).name


def abort_attempts(root, attempts: Attempts, reason: str) -> bool:
    """The owner's cleanup: abort every attempt that is not terminal (its bind needs the owner
    live, so none can publish any more). Returns whether any attempt is Quarantined."""
    quarantined = False
    for publish_id, pub in attempts.made(root):
        phase = pub.phase
        if phase not in publish.TERMINAL:
            phase = publish.abort(root, publish_id, reason=reason)
        quarantined |= phase == PublishPhase.Quarantined
    return quarantined


def reconcile(root, attempts: Attempts) -> bool:
    """Reconcile the attempts of an owner that is terminal (it makes no further attempt, so no
    key of a quarantined one can be reused meanwhile): an attempt a dead driver left
    unfinished is aborted, a Quarantined one reconciled (publish.reconcile, under its lock).
    Returns whether none is Quarantined any more."""
    settled = True
    for publish_id, pub in attempts.made(root):
        phase = pub.phase
        if phase not in publish.TERMINAL or phase == PublishPhase.Quarantined:
            lock = OperationLock(root.run_dir, publish_id)
            if not lock.try_acquire():
                settled = False  # a live process still holds it
                continue
            try:
                if phase not in publish.TERMINAL:
                    phase = publish.abort(root, publish_id, reason=f"{attempts.owner} is terminal")
                if phase == PublishPhase.Quarantined:
                    phase = publish.reconcile(root, publish_id)
            finally:
                lock.release(remove=True)
        settled &= phase != PublishPhase.Quarantined
    return settled


def quarantined_bytes(view, root, publish_id: bytes) -> tuple[int, int]:
    """(objects, bytes) a publish operation's ledger still owns (what is in doubt while it is
    Quarantined)."""
    rows = [
        row for _, row in publish.read_ledger(view, root, publish_id) if row.cleanup_state != StagedCleanupState.Deleted
    ]
    return len(rows), sum(row.expected_length for row in rows)


# --- the owner's binding command --------------------------------------------------------------


@dataclass(frozen=True)
class Staged:
    """A Finalizing staged publish as the binding command sees it."""

    publish_id: bytes
    op: PublishOperation
    revision: ArtifactRevision  # the Available revision the command creates


def bind(root, publish_id: bytes, digest: bytes, check, rows) -> None:
    """The owner's one command that publishes a staged revision.

    `check(view)` runs first and refuses by raising (the owner's own phase). The staged publish
    must then be Finalizing; its revision (Available) and manifest are built from its ledger.
    `rows(view, staged, refs)` returns the owner's (predicates, mutations) -- its reference
    to the revision goes through `refs`, its own operation row through the mutations. The
    command moves the publish operation Finalizing -> Published (result: the revision's
    PathEntry, which `rows` returns third) and deletes its ledger.
    """
    pub_op = read_publish(root, publish_id)
    if pub_op is None:
        raise NotFound(f"no staged publish {publish_id.hex()}")

    def build(view):
        check(view)
        raw_pub, pub = publish.read_operation(view, root, publish_id)
        if pub.phase != PublishPhase.Finalizing:
            raise PredicateFailed(f"staged publish {publish_id.hex()} is {pub.phase.name}, not Finalizing")
        to_write, revision, ledger_keys = _staged_revision(view, root, publish_id, pub, view.version + 1)
        refs = References(view, root.root_id)
        refs.create(pub.artifact_revision_id, revision)
        owner_predicates, owner_mutations, result = rows(view, Staged(publish_id, pub, revision), refs)
        predicates, mutations = refs.rows()
        predicates += [ValueEquals("operation", publish.ROWS.key(root, publish_id), raw_pub)] + owner_predicates
        mutations += [
            Put(
                "artifact_manifest",
                keys.ArtifactManifestKey(root.root_id, pub.artifact_revision_id, index).encode(),
                row,
            )
            for index, row in enumerate(to_write)
        ]
        mutations.append(
            Put(
                "operation",
                publish.ROWS.key(root, publish_id),
                dataclasses.replace(pub, phase=PublishPhase.Published, result=result),
            )
        )
        mutations += [Delete("staged_object", key) for key in ledger_keys]
        return Built(predicates=predicates, mutations=mutations + owner_mutations)

    root.apply(build, digest=digest, request_id=pub_op.request_id)


def _staged_revision(view, root, publish_id: bytes, op: PublishOperation, version: int):
    """(manifest rows still to write, the Available ArtifactRevision, ledger keys) of a
    Finalizing staged publish: publish's revision construction for a body with no reused
    blocks. publish.finalize may already have written the manifest rows; they must then be
    exactly the ledger's (otherwise PredicateFailed), and are not written again."""
    if op.reused_count:
        raise PredicateFailed(f"staged {op.path}: a typed manifest reuses no blocks")
    ledger = publish.read_ledger(view, root, publish_id)
    rows = publish.manifest_rows(view, root, op, ledger)
    written = publish.read_manifest(view, root, op.artifact_revision_id)
    if written and written != rows:
        raise PredicateFailed(f"staged {op.path}: the manifest rows written at finalize are incomplete")
    revision = publish.available_revision(op, rows, (), 0, version)
    return ([] if written else rows), revision, [key for key, _ in ledger]
