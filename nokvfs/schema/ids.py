"""Fixed-width storage ids, their lowercase-hex forms, and UUIDv7 generation.

RootId, LogicalShardId, WorkspaceIncarnationId, ArtifactRevisionId and OperationId are 16 bytes;
SnapshotId is a u64 (8 bytes big-endian); CommitId is 32 bytes. New 16-byte ids are UUIDv7
(RFC 9562): 48-bit Unix milliseconds, version 7, then 74 bits that are random at the start of each
millisecond and counted up within it (method 1 of RFC 9562 section 6.2), so ids made by one process
are strictly increasing even within one millisecond.
"""

from __future__ import annotations

import os
import re
import threading
import time

from nokvfs.errors import IdInvalid

ID16_LEN = 16
COMMIT_ID_LEN = 32
SNAPSHOT_ID_LEN = 8
U64_MAX = (1 << 64) - 1

_HEX = re.compile(r"[0-9a-f]*")


def check_id16(value: bytes, what: str = "id") -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != ID16_LEN:
        raise IdInvalid(f"{what} must be exactly {ID16_LEN} bytes, got {_describe(value)}")
    return bytes(value)


def check_commit_id(value: bytes) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != COMMIT_ID_LEN:
        raise IdInvalid(f"commit id must be exactly {COMMIT_ID_LEN} bytes, got {_describe(value)}")
    return bytes(value)


def check_snapshot_id(value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64_MAX:
        raise IdInvalid(f"snapshot id must be an unsigned 64-bit integer, got {value!r}")
    return value


def to_hex(value: bytes) -> str:
    """Lowercase hex with no punctuation: the only text form of an id in keys and APIs."""
    return bytes(value).hex()


def from_hex(text: str, length: int, what: str = "id") -> bytes:
    if not isinstance(text, str) or len(text) != 2 * length or not _HEX.fullmatch(text):
        raise IdInvalid(f"{what} must be {2 * length} lowercase hex characters, got {text!r}")
    return bytes.fromhex(text)


def id16_from_hex(text: str, what: str = "id") -> bytes:
    return from_hex(text, ID16_LEN, what)


def commit_id_from_hex(text: str) -> bytes:
    return from_hex(text, COMMIT_ID_LEN, "commit id")


def snapshot_id_bytes(snapshot_id: int) -> bytes:
    return check_snapshot_id(snapshot_id).to_bytes(SNAPSHOT_ID_LEN, "big")


def object_index_hex(index: int) -> str:
    """object_index in object keys: exactly 16 lowercase hex characters."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= U64_MAX:
        raise IdInvalid(f"object index must be an unsigned 64-bit integer, got {index!r}")
    return f"{index:016x}"


def _describe(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return type(value).__name__


class Uuid7Generator:
    """Monotonic UUIDv7 source. Thread-safe; one per process is enough (see `new_id16`)."""

    def __init__(self, clock_ms=None, random_bytes=os.urandom):
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._random = random_bytes
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0  # 74 bits: 12 of rand_a then 62 of rand_b

    def new(self) -> bytes:
        with self._lock:
            now = self._clock_ms()
            if now > self._last_ms:
                self._last_ms = now
                # Leave headroom in the top bit so a burst within one millisecond can count up.
                self._counter = int.from_bytes(self._random(10), "big") >> 7
            else:
                # Same millisecond, or the wall clock went back: keep the last timestamp and count.
                self._counter += 1
                if self._counter >= 1 << 74:
                    self._last_ms += 1
                    self._counter = int.from_bytes(self._random(10), "big") >> 7
            ms = self._last_ms & ((1 << 48) - 1)
            rand_a = self._counter >> 62
            rand_b = self._counter & ((1 << 62) - 1)
            value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
            return value.to_bytes(16, "big")


_GENERATOR = Uuid7Generator()


def new_id16() -> bytes:
    """A fresh UUIDv7 as 16 raw bytes, strictly greater than the previous one from this process."""
    return _GENERATOR.new()


def uuid7_unix_ms(value: bytes) -> int:
    """The millisecond timestamp embedded in a UUIDv7."""
    return int.from_bytes(check_id16(value)[:6], "big")


def is_uuid7(value: bytes) -> bool:
    value = check_id16(value)
    return value[6] >> 4 == 0x7 and value[8] >> 6 == 0b10


def creation_unix_ms(value: bytes, *, fallback: int = 0) -> int:
    """The creation time of an id made by `new_id16`, or `fallback` for any other id (a derived
    one, or one whose clock is implausibly far in the future), so no reader sees a wild date."""
    if not is_uuid7(value):
        return fallback
    ms = uuid7_unix_ms(value)
    return ms if ms <= time.time_ns() // 1_000_000 + 86_400_000 else fallback


def derived_id16(digest: bytes) -> bytes:
    """A 16-byte id derived from a digest, shaped as a UUIDv8 (RFC 9562: version 8, variant 10),
    so it can never be taken for a UUIDv7 and the time one carries. Request ids nokvfs derives
    are made so: the engine's replay retention judges a UUIDv7 request id by its time
    (nokvfs.engine.retention), and a derived id has none."""
    if len(digest) < 16:
        raise IdInvalid("derived_id16 needs at least 16 bytes of digest")
    value = bytearray(digest[:16])
    value[6] = 0x80 | (value[6] & 0x0F)
    value[8] = 0x80 | (value[8] & 0x3F)
    return bytes(value)


def uuid7_from(timestamp: bytes, randomness: bytes) -> bytes:
    """A UUIDv7 with the given 6-byte millisecond timestamp and bits taken from `randomness`."""
    if len(timestamp) != 6 or len(randomness) < 10:
        raise IdInvalid("uuid7_from needs a 6-byte timestamp and 10 bytes of randomness")
    rand_a = int.from_bytes(randomness[:2], "big") & 0x0FFF
    rand_b = int.from_bytes(randomness[2:10], "big") & ((1 << 62) - 1)
    value = (int.from_bytes(timestamp, "big") << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return value.to_bytes(16, "big")
