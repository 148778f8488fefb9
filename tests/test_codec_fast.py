"""The compiled codec functions agree with the declared field codecs, byte for byte and error for
error: every record's generated encoder and decoder (nokvfs.schema.codec, "compiled codecs") is a
fast path that either gives the checked path's exact answer or gives up to it."""

from __future__ import annotations

import enum

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nokvfs.errors import CorruptRecord, UnknownDiscriminant
from nokvfs.schema import codec
from nokvfs.schema import records as R
from nokvfs.schema.enums import PublishPhase
from tests.test_records import ALL, GOLDEN, IDS, _instances

_SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def _checked(obj) -> bytes:
    out = bytearray()
    if obj.VERSION is not None:
        out.append(obj.VERSION)
    codec._encode_fields_checked(obj, out)
    return bytes(out)


def _fast_decode(cls, data: bytes):
    """The compiled decoder alone: (record, end) or the _Slow it gives up with."""
    return cls.__fast_decode__(data, 0 if cls.VERSION is None else 1)


@pytest.mark.parametrize("cls", ALL, ids=IDS)
@_SETTINGS
@given(data=st.data())
def test_compiled_encoder_writes_the_declared_bytes(cls, data):
    sample = data.draw(_instances(cls))
    out = bytearray([cls.VERSION])
    cls.__fast_encode__(sample, out)  # plain values: the fast path must not give up
    assert bytes(out) == _checked(sample) == sample.encode()


@pytest.mark.parametrize("cls", ALL, ids=IDS)
@_SETTINGS
@given(data=st.data(), cut=st.integers(min_value=0, max_value=64), flip=st.integers(min_value=0, max_value=255))
def test_compiled_decoder_agrees_or_gives_up_on_any_bytes(cls, data, cut, flip):
    encoded = data.draw(_instances(cls)).encode()
    variants = [encoded, encoded[: max(1, len(encoded) - cut)], encoded + bytes([flip])]
    if len(encoded) > 1:
        position = 1 + cut % (len(encoded) - 1)
        variants.append(encoded[:position] + bytes([flip]) + encoded[position + 1 :])
    for variant in variants:
        try:
            checked = codec._decode_fields_checked(cls, variant, 1)
        except (CorruptRecord, UnknownDiscriminant):
            checked = None
        try:
            fast = _fast_decode(cls, variant)
        except Exception:
            continue
        assert fast == checked  # an answer of the fast path is the checked path's answer


def test_values_only_the_declared_codecs_accept_still_encode():
    """An IntEnum in an integer field and a bytearray id leave the fast path and are encoded
    exactly as the field codecs encode them."""
    sample = GOLDEN[R.PathEntry][0]
    odd = type(sample)(
        **{
            **{f: getattr(sample, f) for f, _ in sample.__codec_fields__},
            "generation": PublishPhase.Finalizing,
            "artifact_revision_id": bytearray(sample.artifact_revision_id),
        }
    )
    assert (
        odd.encode()
        == type(sample)(**{**{f: getattr(sample, f) for f, _ in sample.__codec_fields__}, "generation": 2}).encode()
    )


def test_bad_values_fail_with_the_field_named():
    sample = GOLDEN[R.PathEntry][0]
    fields = {f: getattr(sample, f) for f, _ in sample.__codec_fields__}
    for name, value in (
        ("generation", -1),
        ("generation", True),
        ("artifact_revision_id", b"short"),
        ("content_type", b"bytes"),
    ):
        with pytest.raises(CorruptRecord, match=f"PathEntry.{name}"):
            type(sample)(**{**fields, name: value}).encode()


def test_an_unknown_discriminant_names_the_field():
    class Other(enum.IntEnum):
        X = 1

    sample, expected_hex, offsets = GOLDEN[R.PublishOperation]
    data = bytearray.fromhex(expected_hex)
    data[offsets[0]] = 0xEE
    with pytest.raises(UnknownDiscriminant, match="PublishOperation"):
        R.PublishOperation.decode(bytes(data))
