"""Object stores for artifact bytes, and the local block cache.

`store.py` is the one interface (`ObjectStore`) and `open_store(url)`; `local.py` and `s3.py`
implement it; `keys.py` builds and parses physical keys and digest URIs; `cache.py` is the
byte-bounded, BLAKE3-verified block cache; `blocks.py` is where blocks are fetched, verified and
cut (`BlockReader`, `BlockWriter`, `split_blocks`).
"""

from nokvfs.objects.blocks import DEFAULT_BLOCK_SIZE, Block, BlockReader, BlockWriter, split_blocks
from nokvfs.objects.cache import BlockCache, CacheStats
from nokvfs.objects.keys import (
    artifact_block_key,
    artifact_revision_prefix,
    parse_artifact_block_key,
    parse_sha256_uri,
    sha256_uri,
    sha256_uri_of,
)
from nokvfs.objects.store import ObjectInfo, ObjectStore, StoreStats, open_store

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "Block",
    "BlockCache",
    "BlockReader",
    "BlockWriter",
    "CacheStats",
    "ObjectInfo",
    "ObjectStore",
    "StoreStats",
    "artifact_block_key",
    "artifact_revision_prefix",
    "open_store",
    "parse_artifact_block_key",
    "parse_sha256_uri",
    "sha256_uri",
    "sha256_uri_of",
    "split_blocks",
]
