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
from nokvfs.schema.enums import PublishPhase, RevisionState
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


ENGINE = [cls for cls in codec.ALL_RECORDS if cls.__module__ == "nokvfs.engine.records" and cls.VERSION is not None]


@pytest.mark.parametrize("cls", ENGINE, ids=[cls.__name__ for cls in ENGINE])
@_SETTINGS
@given(data=st.data())
def test_compiled_encoder_writes_the_declared_bytes_of_engine_records(cls, data):
    """The engine's records too (the outbox's CommandRecord: lists of nested rows with optional
    fields, compiled item by item)."""
    sample = data.draw(_instances(cls))
    out = bytearray([cls.VERSION])
    cls.__fast_encode__(sample, out)
    assert bytes(out) == _checked(sample) == sample.encode()


def test_a_list_where_the_declaration_says_tuple_still_encodes_as_declared():
    from nokvfs.engine.records import CommandRecord, MutationRow, PredicateRow
    from nokvfs.schema.enums import MutationKind, PredicateKind

    rows = dict(
        predicates=[PredicateRow(PredicateKind.ValueEquals, "operation", b"k", b"v", None, None, None)],
        mutations=[
            MutationRow(MutationKind.Put, "operation", b"k", b"w"),
            MutationRow(MutationKind.Delete, "x", b"y", None),
        ],
    )
    fields = dict(
        schema_id="s",
        root_id=bytes(16),
        logical_shard_id=bytes(16),
        placement_generation=1,
        owner_epoch=1,
        request_id=bytes(16),
        command_digest=bytes(32),
        read_version=1,
        commit_version=2,
        fence_install=False,
        events=(),
        result=b"",
    )
    as_lists = CommandRecord(**fields, **rows)
    as_tuples = CommandRecord(**fields, **{name: tuple(value) for name, value in rows.items()})
    with pytest.raises(codec._Slow):
        as_lists.__fast_encode__(as_lists, bytearray())
    assert as_lists.encode() == as_tuples.encode() == _checked(as_tuples)
    assert CommandRecord.decode(as_lists.encode()) == as_tuples


def test_every_records_init_has_the_dataclass_signature_and_keeps_it_frozen():
    import dataclasses
    import inspect

    for cls in codec.ALL_RECORDS:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        fields = dataclasses.fields(cls)
        assert [p.name for p in params] == [f.name for f in fields], cls
        for p, f in zip(params, fields, strict=True):
            assert p.default == (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default), cls
    publish = GOLDEN[R.PublishOperation][0]
    values = {f.name: getattr(publish, f.name) for f in dataclasses.fields(R.PublishOperation)}
    values.pop("expected_revision_id")
    assert R.PublishOperation(**values).expected_revision_id is None  # the declared default
    assert R.PublishOperation(**values, expected_revision_id=b"\x05" * 16).expected_revision_id == b"\x05" * 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        publish.phase = PublishPhase.Finalizing
    with pytest.raises(TypeError):
        R.PublishOperation(**values, no_such_field=1)
    restore = GOLDEN[R.RestoreOperation][0]
    with pytest.raises(CorruptRecord):  # its __post_init__ still runs
        dataclasses.replace(restore, source_selector=b"\x01")


@pytest.mark.parametrize("cls", ALL, ids=IDS)
@_SETTINGS
@given(data=st.data(), cut=st.integers(min_value=0, max_value=64), flip=st.integers(min_value=0, max_value=255))
def test_decode_field_is_the_field_of_the_whole_decoding(cls, data, cut, flip):
    """decode_field (one field, the rest unread): the whole decoding's field wherever that
    succeeds, on damaged bytes too, and only typed errors otherwise."""
    from nokvfs.errors import UnknownVersion

    encoded = data.draw(_instances(cls)).encode()
    variants = [encoded, encoded[: max(1, len(encoded) - cut)]]
    if len(encoded) > 1:
        position = 1 + cut % (len(encoded) - 1)
        variants.append(encoded[:position] + bytes([flip]) + encoded[position + 1 :])
    for name, _ in cls.__codec_fields__:
        for variant in variants:
            try:
                whole = cls.decode(variant)
            except (CorruptRecord, UnknownDiscriminant, UnknownVersion):
                whole = None
            try:
                value = codec.decode_field(cls, variant, name)
            except (CorruptRecord, UnknownDiscriminant, UnknownVersion):
                assert whole is None
                continue
            if whole is not None:
                assert value == getattr(whole, name)


def test_replace_makes_the_record_dataclasses_replace_makes():
    import dataclasses

    for cls, (golden, _, _) in GOLDEN.items():
        for field in dataclasses.fields(cls):
            value = getattr(golden, field.name)
            fast, slow = (
                codec.replace(golden, **{field.name: value}),
                dataclasses.replace(golden, **{field.name: value}),
            )
            assert fast == slow and fast is not golden, (cls, field.name)
        assert codec.replace(golden) == golden
        with pytest.raises(TypeError, match="no_such_field"):
            codec.replace(golden, no_such_field=1)
    revision = GOLDEN[R.ArtifactRevision][0]
    changed = codec.replace(revision, state=RevisionState.Deleted, strong_reference_count=3)
    assert changed == dataclasses.replace(revision, state=RevisionState.Deleted, strong_reference_count=3)
    assert (
        changed.encode()
        == dataclasses.replace(revision, state=RevisionState.Deleted, strong_reference_count=3).encode()
    )
    assert revision.state != RevisionState.Deleted  # the original is left as it was
    with pytest.raises(CorruptRecord):  # the record's __post_init__ still runs
        codec.replace(GOLDEN[R.RestoreOperation][0], source_selector=b"\x01")
