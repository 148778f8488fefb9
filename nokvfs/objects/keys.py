"""Physical object keys and SHA-256 digest URIs.

An artifact block lives at exactly

    nokv/artifacts/{logical_shard_id}/{root_id}/{artifact_revision_id}/blocks/{object_index}

with every id as 32 lowercase hex characters and object_index as 16 lowercase hex characters
(the seed's "Artifact Revisions And Strong References"). The key names the revision that
physically owns the block and that owner's local physical_object_index, never the row position
of a child revision's manifest. Owner epochs and process addresses never appear.

Durable digests are SHA-256, written as ``sha256:<64 lowercase hex>``.
"""

from __future__ import annotations

import hashlib
import re

from nokvfs.errors import IdInvalid, InvalidInput
from nokvfs.schema.ids import check_id16, id16_from_hex, object_index_hex, to_hex

ARTIFACTS_PREFIX = "nokv/artifacts/"
SHA256_PREFIX = "sha256:"
SHA256_LEN = 32

_BLOCK_KEY = re.compile(r"nokv/artifacts/([0-9a-f]{32})/([0-9a-f]{32})/([0-9a-f]{32})/blocks/([0-9a-f]{16})")
_SHA256_URI = re.compile(r"sha256:([0-9a-f]{64})")


def artifact_revision_prefix(logical_shard_id: bytes, root_id: bytes, artifact_revision_id: bytes) -> str:
    """The key prefix (ending in ``blocks/``) under which one revision owns all its blocks."""
    return (
        f"{ARTIFACTS_PREFIX}{to_hex(check_id16(logical_shard_id, 'logical shard id'))}/"
        f"{to_hex(check_id16(root_id, 'root id'))}/"
        f"{to_hex(check_id16(artifact_revision_id, 'artifact revision id'))}/blocks/"
    )


def artifact_block_key(logical_shard_id: bytes, root_id: bytes, artifact_revision_id: bytes, object_index: int) -> str:
    """The physical key of block `object_index` owned by `artifact_revision_id`."""
    return artifact_revision_prefix(logical_shard_id, root_id, artifact_revision_id) + object_index_hex(object_index)


def parse_artifact_block_key(key: str) -> tuple[bytes, bytes, bytes, int]:
    """(logical_shard_id, root_id, artifact_revision_id, object_index) of an artifact block key.

    Anything that is not exactly the canonical form (upper-case hex, a different width, a
    trailing slash, another prefix) raises InvalidInput.
    """
    match = _BLOCK_KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise InvalidInput(f"not an artifact block key: {key!r}")
    shard, root, revision, index = match.groups()
    return (
        id16_from_hex(shard, "logical shard id"),
        id16_from_hex(root, "root id"),
        id16_from_hex(revision, "artifact revision id"),
        int(index, 16),
    )


def sha256_uri(digest: bytes) -> str:
    """``sha256:<hex>`` of a raw 32-byte SHA-256 digest."""
    if not isinstance(digest, (bytes, bytearray)) or len(digest) != SHA256_LEN:
        raise IdInvalid(f"a SHA-256 digest must be {SHA256_LEN} bytes, got {digest!r:.80}")
    return SHA256_PREFIX + bytes(digest).hex()


def parse_sha256_uri(uri: str) -> bytes:
    """The raw 32-byte digest of a ``sha256:<64 lowercase hex>`` URI; InvalidInput otherwise."""
    match = _SHA256_URI.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise InvalidInput(f"not a sha256 digest URI: {uri!r:.100}")
    return bytes.fromhex(match.group(1))


def sha256_uri_of(data: bytes) -> str:
    """The digest URI of `data`."""
    return sha256_uri(hashlib.sha256(data).digest())
