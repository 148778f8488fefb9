"""Commit identities and digests: what the lead decided where the seed names fields, not bytes.

* CommitId = SHA-256("nokv.commit.identity.v1\\0" | root_id | source incarnation | u64
  read_version | u64 committed_at_unix_seconds | request_id (16) | u32 parent count |
  parents...). It is known at step 1.
* The run manifest is canonical JSON of {"schema": "nokv.workbench.run_manifest.v1",
  "workbench_id", "commit_id" (64 hex), "parents" (hex, in order), "producer", "lineage",
  "source_read_version", "workspace_revision", "committed_at_unix_seconds"}. The projection input
  `canonical_manifest` is the same object without committed_at_unix_seconds;
  content_digest_uri = "sha256:" + hex(SHA-256(canonical_manifest)) and manifest_digest_uri is
  the same URI (the Agent has no other manifest identity for it before the owner time exists).
  workbench_path is "metadata/run_manifest.json". projection_input_digest is the seed's formula
  with len64be = u64 big-endian length prefixes; initialization_digest uses
  "nokv.build-commit.initialization.v5\\0" over the projection-input digest, source incarnation,
  read version, expected head (u8 presence | id) and head generation, both explicit digests,
  tree revision, replace, run-manifest condition (u8 presence | u64), committed_at, producer,
  lineage and the ordered parents (variable fields u64-length-prefixed, lists u64-counted).
* member_digest is a chain: d0 = 32 zero bytes, d_i = SHA-256("nokv.commit.member.v1\\0" |
  d_{i-1} | u32 len(path) | path UTF-8 | encoded CommitMember); revision_digest =
  SHA-256("nokv.commit.revisions.v1\\0" | unique revision ids sorted bytewise); parent_digest =
  SHA-256("nokv.commit.parents.v1\\0" | parents in request order); tree_digest_uri =
  "sha256:" + hex(member_digest).
* The build operation id is SHA-256("nokv.build-commit.operation.v1\\0" | root | request
  id)[:16]; the retirement operation id SHA-256("nokv.commit.retire.v1\\0" | root |
  commit)[:16]; staging attempt n of a build publishes operation
  SHA-256("nokv.build-commit.run-manifest.v1\\0" | operation id | u32 n)[:16]; step 9's request id
  is SHA-256("nokv.build-commit.publish-request.v1\\0" | operation id)[:16].
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from nokvfs.schema import canonical_json
from nokvfs.schema.ids import check_commit_id, derived_id16
from nokvfs.schema.paths import join
from nokvfs.schema.records import BuildCommitOperation, CommitMember
from nokvfs.workspace import publish

RUN_MANIFEST = publish.RUN_MANIFEST
RUN_MANIFEST_PATH = join(RUN_MANIFEST)
RUN_MANIFEST_SCHEMA = "nokv.workbench.run_manifest.v1"

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def _len64(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _derived_id(domain: bytes, *parts: bytes) -> bytes:
    return hashlib.sha256(domain + b"".join(parts)).digest()[:16]


def operation_id(root_id: bytes, request_id: bytes) -> bytes:
    return _derived_id(b"nokv.build-commit.operation.v1\0", root_id, request_id)


def retire_operation_id(root_id: bytes, commit_id: bytes) -> bytes:
    return _derived_id(b"nokv.commit.retire.v1\0", root_id, commit_id)


def staged_publish_id(operation: bytes, attempt: int) -> bytes:
    return _derived_id(b"nokv.build-commit.run-manifest.v1\0", operation, _U32.pack(attempt))


def publish_request_id(operation: bytes) -> bytes:
    # UUIDv8-shaped: a derived request id carries no time the replay retention could judge.
    return derived_id16(hashlib.sha256(b"nokv.build-commit.publish-request.v1\0" + operation).digest())


def commit_identity(
    root_id: bytes, incarnation: bytes, read_version: int, committed_at: int, request_id: bytes, parents
) -> bytes:
    h = hashlib.sha256(b"nokv.commit.identity.v1\0")
    h.update(root_id + incarnation + _U64.pack(read_version) + _U64.pack(committed_at) + request_id)
    h.update(_U32.pack(len(parents)))
    for parent in parents:
        h.update(parent)
    return h.digest()


def member_chain(previous: bytes, components: tuple[str, ...], member: CommitMember) -> bytes:
    path = join(components).encode("utf-8")
    return hashlib.sha256(
        b"nokv.commit.member.v1\0" + previous + _U32.pack(len(path)) + path + member.encode()
    ).digest()


def revision_digest(revision_ids) -> bytes:
    return hashlib.sha256(b"nokv.commit.revisions.v1\0" + b"".join(sorted(set(revision_ids)))).digest()


def parent_digest(parents) -> bytes:
    return hashlib.sha256(b"nokv.commit.parents.v1\0" + b"".join(parents)).digest()


def projection_input_digest(
    workbench_id: str,
    workbench_path: str,
    content_digest_uri: str,
    canonical_manifest: bytes,
    manifest_digest_uri: str,
    identity: bytes,
) -> bytes:
    h = hashlib.sha256(b"nokv.workbench.run_manifest.projection_input.v1\0")
    for part in (
        workbench_id.encode(),
        workbench_path.encode(),
        content_digest_uri.encode(),
        canonical_manifest,
        manifest_digest_uri.encode(),
    ):
        h.update(_len64(part))
    h.update(check_commit_id(identity))
    return h.digest()


def sha256_uri(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FrozenRequest:
    """The exact request as step 1 freezes it; every digest of the commit derives from it."""

    workbench_id: str
    incarnation: bytes
    read_version: int
    tree_revision: int
    expected_head: bytes | None
    expected_head_generation: int
    replace: bool
    run_manifest_expected_generation: int | None
    committed_at: int
    producer: str
    lineage: str
    parents: tuple
    request_id: bytes

    @classmethod
    def from_op(cls, op: BuildCommitOperation) -> "FrozenRequest":
        return cls(
            op.workbench_id,
            op.source_workspace_incarnation_id,
            op.read_version,
            op.tree_revision,
            op.expected_head,
            op.expected_head_generation,
            op.replace,
            op.run_manifest_expected_generation,
            op.committed_at_unix_seconds,
            op.producer,
            op.lineage,
            tuple(op.parents),
            op.request_id,
        )

    def commit_id(self, root_id: bytes) -> bytes:
        return commit_identity(
            root_id, self.incarnation, self.read_version, self.committed_at, self.request_id, self.parents
        )

    def manifest_object(self, commit_id: bytes) -> dict:
        return {
            "schema": RUN_MANIFEST_SCHEMA,
            "workbench_id": self.workbench_id,
            "commit_id": commit_id.hex(),
            "parents": [p.hex() for p in self.parents],
            "producer": self.producer,
            "lineage": self.lineage,
            "source_read_version": self.read_version,
            "workspace_revision": self.tree_revision,
            "committed_at_unix_seconds": self.committed_at,
        }

    def run_manifest_bytes(self, commit_id: bytes) -> bytes:
        return canonical_json.dumps(self.manifest_object(commit_id))

    def canonical_manifest(self, commit_id: bytes) -> bytes:
        obj = self.manifest_object(commit_id)
        del obj["committed_at_unix_seconds"]
        return canonical_json.dumps(obj)

    def content_digest_uri(self, commit_id: bytes) -> str:
        return sha256_uri(self.canonical_manifest(commit_id))

    def projection_input_digest(self, commit_id: bytes) -> bytes:
        uri = self.content_digest_uri(commit_id)
        return projection_input_digest(
            self.workbench_id, RUN_MANIFEST_PATH, uri, self.canonical_manifest(commit_id), uri, commit_id
        )

    def initialization_digest(self, commit_id: bytes) -> bytes:
        uri = self.content_digest_uri(commit_id)
        h = hashlib.sha256(b"nokv.build-commit.initialization.v5\0")
        h.update(self.projection_input_digest(commit_id))
        h.update(self.incarnation + _U64.pack(self.read_version))
        h.update(b"\x00" if self.expected_head is None else b"\x01" + self.expected_head)
        h.update(_U64.pack(self.expected_head_generation))
        h.update(_len64(uri.encode()) + _len64(uri.encode()))
        h.update(_U64.pack(self.tree_revision))
        h.update(b"\x01" if self.replace else b"\x00")
        cond = self.run_manifest_expected_generation
        h.update(b"\x00" if cond is None else b"\x01" + _U64.pack(cond))
        h.update(_U64.pack(self.committed_at))
        h.update(_len64(self.producer.encode()) + _len64(self.lineage.encode()))
        h.update(_U64.pack(len(self.parents)))
        for parent in self.parents:
            h.update(parent)
        return h.digest()
