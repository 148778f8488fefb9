"""nokvfs.objects.zeros: a block of zeros recognised instead of hashed gives the SHA-256 hashing
would, for every kind of buffer, and anything not all zeros is hashed."""

from __future__ import annotations

import hashlib

import pytest

from nokvfs.objects import zeros


@pytest.mark.parametrize("length", [1, 16, 4096, 4 << 20])
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_the_digest_of_any_buffer_is_its_sha256(length, kind):
    for at in (None, 0, length // 2, length - 1):
        data = bytearray(length)
        if at is not None:
            data[at] = 1
        buffer = kind(bytes(data)) if kind is not bytearray else data
        assert zeros.is_zero(buffer) == (at is None)
        assert zeros.sha256_of(buffer) == hashlib.sha256(data).digest()


def test_nothing_is_not_a_block_of_zeros():
    assert not zeros.is_zero(b"") and not zeros.is_zero(memoryview(b""))
    assert zeros.sha256_of(b"") == hashlib.sha256(b"").digest()
