"""All-zero bytes: a sparse file's holes (`truncate -s 10G`, `dd seek=`) hold nothing but zeros.

Recognising them costs a memcmp against a zero buffer (about 0.1 ms per 4 MiB here, against
3.5 ms for a SHA-256), so a block of zeros is planned, verified and stored without hashing it
again or writing it out: its SHA-256 is known, and the local store leaves a hole in its object
file (which reads back as the same zeros). Nothing durable changes: digests, etags, object
lengths and bytes read are those of the zeros.
"""

from __future__ import annotations

import functools
import hashlib

_CACHED = 4  # zero buffers kept, one per length asked for (a block size, a read chunk, a tail)


@functools.lru_cache(maxsize=_CACHED)
def zeros(length: int) -> bytes:
    return bytes(length)


@functools.lru_cache(maxsize=_CACHED)
def zero_sha256(length: int) -> bytes:
    return hashlib.sha256(zeros(length)).digest()


def is_zero(data) -> bool:
    """Whether `data` (bytes-like) is all zeros; stops at the first byte that is not."""
    if isinstance(data, memoryview):
        data = data.cast("B")
        if not data or data[0] or data[-1]:
            return False
        data = data.tobytes()  # bytes compare with memcmp; a memoryview compares item by item
    length = len(data)
    return length > 0 and data == zeros(length)


def sha256_of(data) -> bytes:
    """hashlib.sha256(data).digest(), without hashing a block of zeros."""
    if is_zero(data):
        return zero_sha256(len(data))
    return hashlib.sha256(data).digest()
