"""Fixed-width ids, their lowercase-hex forms, and monotonic UUIDv7 generation (RFC 9562)."""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nokvfs.errors import IdInvalid, InvalidInput
from nokvfs.schema import ids
from nokvfs.schema.ids import Uuid7Generator, new_id16

FROZEN_MS = 1_730_000_000_123


def _version(value: bytes) -> int:
    return value[6] >> 4


def _variant_bits(value: bytes) -> int:
    return value[8] >> 6


class _Clock:
    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


# --- UUIDv7 -------------------------------------------------------------------------------------


def test_layout_version_variant_and_timestamp():
    value = Uuid7Generator(clock_ms=_Clock(FROZEN_MS)).new()
    assert isinstance(value, bytes) and len(value) == 16
    assert _version(value) == 7
    assert _variant_bits(value) == 0b10
    assert int.from_bytes(value[:6], "big") == FROZEN_MS
    assert ids.uuid7_unix_ms(value) == FROZEN_MS
    parsed = uuid.UUID(bytes=value)  # the stdlib agrees
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122


def test_ten_thousand_ids_in_one_frozen_millisecond_strictly_increase():
    gen = Uuid7Generator(clock_ms=_Clock(FROZEN_MS))
    values = [gen.new() for _ in range(10_000)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert len(set(values)) == 10_000
    for value in values:
        assert _version(value) == 7 and _variant_bits(value) == 0b10
        assert ids.uuid7_unix_ms(value) == FROZEN_MS  # counted within the millisecond, not bumped


def test_counter_is_random_at_each_new_millisecond():
    draws = iter([b"\x00" * 10, b"\xff" * 10])
    clock = _Clock(FROZEN_MS)
    gen = Uuid7Generator(clock_ms=clock, random_bytes=lambda n: next(draws))
    first = gen.new()
    clock.ms += 1
    second = gen.new()
    assert first[6:] == bytes([0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0])  # zero counter
    assert ids.uuid7_unix_ms(second) == FROZEN_MS + 1
    # 10 random bytes shifted right by 7: the top counter bit is left clear as headroom.
    counter = (int.from_bytes(b"\xff" * 10, "big")) >> 7
    assert counter == (1 << 73) - 1
    rand_a = int.from_bytes(second[6:8], "big") & 0x0FFF
    rand_b = int.from_bytes(second[8:], "big") & ((1 << 62) - 1)
    assert (rand_a << 62) | rand_b == counter


def test_monotonic_when_the_clock_goes_backwards():
    clock = _Clock(FROZEN_MS)
    gen = Uuid7Generator(clock_ms=clock)
    values = [gen.new()]
    for step in (-1, -1000, 0, -5, +3, -10_000):
        clock.ms += step
        values.append(gen.new())
        values.append(gen.new())
    assert all(a < b for a, b in zip(values, values[1:]))
    # While the clock is behind, ids keep the last timestamp instead of going back in time.
    assert all(ids.uuid7_unix_ms(v) == FROZEN_MS for v in values)
    clock.ms = FROZEN_MS + 50
    later = gen.new()
    assert later > values[-1] and ids.uuid7_unix_ms(later) == FROZEN_MS + 50


def test_counter_exhaustion_moves_to_the_next_millisecond():
    gen = Uuid7Generator(clock_ms=_Clock(FROZEN_MS))
    before = gen.new()
    gen._counter = (1 << 74) - 1  # white-box: jump to the last counter value of the millisecond
    last = gen.new()  # wraps: counter overflowed on this call
    assert last > before
    assert ids.uuid7_unix_ms(last) == FROZEN_MS + 1
    after = gen.new()
    assert after > last and _version(after) == 7 and _variant_bits(after) == 0b10


def test_generator_is_thread_safe():
    gen = Uuid7Generator(clock_ms=_Clock(FROZEN_MS))
    out: list[list[bytes]] = [[] for _ in range(8)]

    def work(bucket: list[bytes]) -> None:
        for _ in range(500):
            bucket.append(gen.new())

    threads = [threading.Thread(target=work, args=(bucket,)) for bucket in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged = [v for bucket in out for v in bucket]
    assert len(set(merged)) == len(merged) == 4000
    for bucket in out:  # each thread sees its own ids strictly increase
        assert all(a < b for a, b in zip(bucket, bucket[1:]))


def test_new_id16_from_the_process_generator():
    values = [ids.new_id16() for _ in range(1000)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert all(len(v) == 16 and _version(v) == 7 and _variant_bits(v) == 0b10 for v in values)


def test_uuid7_unix_ms_validates_width():
    with pytest.raises(IdInvalid):
        ids.uuid7_unix_ms(b"\x00" * 15)


# --- widths -------------------------------------------------------------------------------------


def test_fixed_widths():
    assert ids.ID16_LEN == 16 and ids.COMMIT_ID_LEN == 32 and ids.SNAPSHOT_ID_LEN == 8
    assert ids.check_id16(b"\x01" * 16) == b"\x01" * 16
    assert ids.check_id16(bytearray(16)) == bytes(16)
    assert ids.check_commit_id(b"\x02" * 32) == b"\x02" * 32
    for bad in (b"", b"\x00" * 15, b"\x00" * 17, "0" * 16, None, 5):
        with pytest.raises(IdInvalid):
            ids.check_id16(bad)
    for bad in (b"\x00" * 31, b"\x00" * 33, b"\x00" * 16, "0" * 32):
        with pytest.raises(IdInvalid):
            ids.check_commit_id(bad)


def test_snapshot_id_is_u64_big_endian():
    assert ids.snapshot_id_bytes(0) == bytes(8)
    assert ids.snapshot_id_bytes(1) == b"\x00" * 7 + b"\x01"
    assert ids.snapshot_id_bytes(2**64 - 1) == b"\xff" * 8
    assert ids.check_snapshot_id(2**64 - 1) == 2**64 - 1
    for bad in (-1, 2**64, True, False, 1.0, "1", None):
        with pytest.raises(IdInvalid):
            ids.check_snapshot_id(bad)
        with pytest.raises(IdInvalid):
            ids.snapshot_id_bytes(bad)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_snapshot_id_bytes_preserve_order(a, b):
    assert (ids.snapshot_id_bytes(a) < ids.snapshot_id_bytes(b)) == (a < b)


# --- hex forms -----------------------------------------------------------------------------------


@given(st.binary(min_size=16, max_size=16), st.binary(min_size=32, max_size=32))
def test_hex_round_trip(id16, commit_id):
    text = ids.to_hex(id16)
    assert len(text) == 32 and text == text.lower() and all(c in "0123456789abcdef" for c in text)
    assert ids.id16_from_hex(text) == id16
    commit_text = ids.to_hex(commit_id)
    assert len(commit_text) == 64
    assert ids.commit_id_from_hex(commit_text) == commit_id


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0" * 31,
        "0" * 33,
        "A" * 32,  # uppercase is not the canonical form
        "0123456789ABCDEF0123456789abcdef",
        "0x" + "0" * 30,
        "01234567-89ab-cdef-0123-456789abcdef",  # no UUID punctuation
        "0123456789abcdef0123456789abcdeg",
        " " + "0" * 31,
        "0" * 31 + "\n",
        "\uff10" * 32,  # fullwidth digits
        None,
        b"0" * 32,
    ],
)
def test_id16_hex_validation(text):
    with pytest.raises(IdInvalid):
        ids.id16_from_hex(text)


def test_commit_id_hex_validation():
    assert ids.commit_id_from_hex("ab" * 32) == b"\xab" * 32
    for bad in ("ab" * 16, "ab" * 33, "AB" * 32, "g" * 64):
        with pytest.raises(IdInvalid):
            ids.commit_id_from_hex(bad)


def test_object_index_hex():
    assert ids.object_index_hex(0) == "0000000000000000"
    assert ids.object_index_hex(255) == "00000000000000ff"
    assert ids.object_index_hex(2**64 - 1) == "ffffffffffffffff"
    for bad in (-1, 2**64, 1.0, "1", None, True):
        with pytest.raises(IdInvalid):
            ids.object_index_hex(bad)


@given(st.integers(0, 2**64 - 1))
def test_object_index_hex_is_fixed_width_and_ordered(index):
    text = ids.object_index_hex(index)
    assert len(text) == 16 and int(text, 16) == index and text == text.lower()


def test_id_invalid_is_invalid_input():
    assert issubclass(IdInvalid, InvalidInput)


def test_creation_time_is_read_only_from_real_uuid7_ids():
    from nokvfs.schema.ids import creation_unix_ms, is_uuid7, uuid7_from, uuid7_unix_ms

    made = new_id16()
    assert is_uuid7(made) and creation_unix_ms(made) == uuid7_unix_ms(made)
    derived = bytes(range(16))  # not UUIDv7-shaped
    assert not is_uuid7(derived) and creation_unix_ms(derived, fallback=-1) == -1
    far_future = (2**48 - 1).to_bytes(6, "big") + made[6:]
    assert is_uuid7(far_future) and creation_unix_ms(far_future) == 0
    stamped = uuid7_from(made[:6], b"\xff" * 10)
    assert is_uuid7(stamped) and uuid7_unix_ms(stamped) == uuid7_unix_ms(made)


def test_derived_ids_are_uuid8_never_uuid7():
    """A derived request id carries no time: replay retention must never judge it by one."""
    import hashlib

    from nokvfs.schema.ids import derived_id16, is_uuid7

    for n in range(2000):
        value = derived_id16(hashlib.sha256(n.to_bytes(4, "big")).digest())
        assert len(value) == 16 and not is_uuid7(value)
        assert value[6] >> 4 == 0x8 and value[8] >> 6 == 0b10
    assert derived_id16(b"\xff" * 32).hex() == "ffffffffffff8fffbfffffffffffffff"
    with pytest.raises(ids.IdInvalid):
        derived_id16(b"\x00" * 15)


def test_the_request_ids_nokvfs_derives_are_not_uuid7():
    from nokvfs.schema.ids import is_uuid7
    from nokvfs.workspace.commit.identity import publish_request_id
    from nokvfs.workspace.restore import _request_id

    for n in range(500):
        op = n.to_bytes(16, "big")
        assert not is_uuid7(publish_request_id(op))
        assert not is_uuid7(_request_id(op, b"prepare")) and not is_uuid7(_request_id(op, b"complete"))
