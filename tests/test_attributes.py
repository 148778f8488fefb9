"""The POSIX attributes layout and its reserved projection field (a nokvfs durable extension):
golden bytes, fail-closed decoding, and the bytes the field takes inside a PathEntry."""

from __future__ import annotations

import os

import pytest

from nokvfs.errors import (
    CorruptRecord,
    FormatError,
    IndexValueInvalid,
    InvalidInput,
    UnknownVersion,
)
from nokvfs.schema import index_codec
from nokvfs.schema.ids import uuid7_unix_ms
from nokvfs.schema.records import CommitMember, IndexField, PathEntry
from nokvfs.workspace import attributes as attrs
from nokvfs.workspace import index
from nokvfs.workspace.attributes import Attributes

# mode 0o4755 (setuid), uid 1000, gid 100, an mtime with nanoseconds, an atime before 1970.
SAMPLE = Attributes(
    mode=0o4755,
    uid=1000,
    gid=100,
    mtime_ns=1_700_000_000_123_456_789,
    atime_ns=-1_000_000_001,
    ctime_ns=1_700_000_001_000_000_000,
)
SAMPLE_HEX = (
    "01"  # layout version 1
    + "09ed"  # mode 0o4755
    + "03"  # flags: uid and gid stored
    + "000003e8"  # uid 1000
    + "00000064"  # gid 100
    + "17979cfe3d85cd15"  # mtime_ns 1_700_000_000_123_456_789
    + "ffffffffc46535ff"  # atime_ns -1_000_000_001 (two's complement)
    + "17979cfe71c4ca00"  # ctime_ns 1_700_000_001_000_000_000
)
NO_OWNER = Attributes(mode=0o644, uid=None, gid=None, mtime_ns=0, atime_ns=0, ctime_ns=0)
NO_OWNER_HEX = "01" + "01a4" + "00" + "00000000" * 2 + "00" * 24
# The index-codec Bytes value holding NO_OWNER: codec version 1, kind Bytes (7), the payload with
# every 0x00 escaped as 0x00 0xff, then the 0x00 0x00 terminator.
NO_OWNER_FIELD_HEX = "0107" + "01" + "01a4" + "00ff" * 33 + "0000"


def test_golden_bytes():
    assert SAMPLE.encode().hex() == SAMPLE_HEX
    assert Attributes.decode(bytes.fromhex(SAMPLE_HEX)) == SAMPLE
    assert NO_OWNER.encode().hex() == NO_OWNER_HEX
    assert Attributes.decode(bytes.fromhex(NO_OWNER_HEX)) == NO_OWNER
    assert len(SAMPLE.encode()) == 36


def test_the_reserved_field_golden_bytes_inside_a_path_entry():
    field = attrs.posix_field(NO_OWNER)
    assert field == IndexField(name="nokvfs:posix", encoded_value=bytes.fromhex(NO_OWNER_FIELD_HEX))
    user = IndexField(name="k", encoded_value=index_codec.encode(index_codec.uint(1)))
    entry = PathEntry(
        generation=1,
        artifact_revision_id=b"\xa1" * 16,
        logical_size=0,
        body_digest_uri="",
        manifest_digest_uri="",
        dependency_count=0,
        dependency_depth=0,
        content_type="",
        producer="",
        manifest_id=b"\xa1" * 16,
        created_version=1,
        modified_version=1,
        typed_index_projection=attrs.with_attributes((user,), NO_OWNER),
    )
    encoded = entry.encode()
    # The projection is a list (u32 count) of (u32-length name, u32-length value): the user's
    # field (a uint: codec 1, kind 4, u64), then the reserved one (a 73-byte Bytes value).
    user_hex = "00000001" + "6b" + "0000000a" + "0104" + "0000000000000001"
    reserved_hex = "0000000c" + b"nokvfs:posix".hex() + "00000049" + NO_OWNER_FIELD_HEX
    assert encoded.hex().endswith("00000002" + user_hex + reserved_hex)
    again = PathEntry.decode(encoded)
    assert attrs.of(again) == NO_OWNER
    assert attrs.user_fields(again.typed_index_projection) == (user,)


def test_unknown_layout_versions_fail_closed():
    for version in (0, 2, 255):
        raw = bytes([version]) + bytes.fromhex(SAMPLE_HEX)[1:]
        with pytest.raises(UnknownVersion):
            Attributes.decode(raw)


@pytest.mark.parametrize(
    "raw_hex, why",
    [
        ("", "empty"),
        (SAMPLE_HEX[:-2], "truncated"),
        (SAMPLE_HEX + "00", "trailing byte"),
        ("01" + "1000" + SAMPLE_HEX[6:], "mode bits above 0o7777"),
        ("01" + "09ed" + "04" + SAMPLE_HEX[8:], "unknown flag bit"),
        ("01" + "01a4" + "00" + "00000001" + "00000000" + "00" * 24, "an unstored uid with bytes"),
        ("01" + "01a4" + "01" + "00000000" + "00000007" + "00" * 24, "an unstored gid with bytes"),
        ("01" + "01a4" + "01" + "ffffffff" + "00000000" + "00" * 24, "uid (uid_t)-1"),
    ],
)
def test_corrupt_bytes_fail_closed(raw_hex, why):
    with pytest.raises(CorruptRecord):
        Attributes.decode(bytes.fromhex(raw_hex))


def test_a_reserved_field_that_is_not_a_bytes_value_is_corrupt():
    entry = PathEntry.decode(
        _entry_with((IndexField("nokvfs:posix", index_codec.encode(index_codec.uint(7))),)).encode()
    )
    with pytest.raises(CorruptRecord):
        attrs.of(entry)
    entry = _entry_with((IndexField("nokvfs:posix", b"\x09\x07garbage"),))
    with pytest.raises(FormatError):
        attrs.of(entry)
    entry = _entry_with((IndexField("nokvfs:posix", index_codec.encode(index_codec.bytes_(b"\x02" + bytes(35)))),))
    with pytest.raises(UnknownVersion):
        attrs.of(entry)


@pytest.mark.parametrize(
    "changes",
    [
        dict(mode=0o10000),
        dict(mode=-1),
        dict(mode=True),
        dict(uid=-1),
        dict(gid=0xFFFFFFFF),
        dict(mtime_ns=1 << 63),
        dict(atime_ns=1.5),
    ],
)
def test_values_out_of_range_are_invalid_input(changes):
    with pytest.raises(InvalidInput):
        NO_OWNER.replace(**changes)


def _entry_with(projection, *, content_type="text/plain", revision=None) -> PathEntry:
    revision = revision or bytes.fromhex("0190f1a2b3c47d8e8f9a0b1c2d3e4f50")
    return PathEntry(
        generation=1,
        artifact_revision_id=revision,
        logical_size=0,
        body_digest_uri="",
        manifest_digest_uri="",
        dependency_count=0,
        dependency_depth=0,
        content_type=content_type,
        producer="",
        manifest_id=revision,
        created_version=1,
        modified_version=1,
        typed_index_projection=tuple(projection),
    )


def test_shown_defaults_follow_the_kind_and_the_revision_time():
    revision = bytes.fromhex("0190f1a2b3c47d8e8f9a0b1c2d3e4f50")
    when = uuid7_unix_ms(revision) * 1_000_000
    for content_type, mode in (("text/plain", 0o644), ("inode/symlink", 0o777), ("inode/directory", 0o755)):
        shown = attrs.shown(_entry_with((), content_type=content_type, revision=revision))
        assert shown == Attributes(mode, None, None, when, when, when)
    stored = _entry_with((attrs.posix_field(SAMPLE),))
    assert attrs.shown(stored) == SAMPLE == attrs.of(stored)
    assert attrs.of(_entry_with(())) is None


def test_of_reads_a_commit_member_too():
    member = CommitMember(
        artifact_revision_id=b"\x01" * 16,
        path_generation=1,
        body_digest_uri="",
        manifest_digest_uri="",
        logical_size=0,
        dependency_count=0,
        dependency_depth=0,
        content_type="",
        producer="",
        manifest_id=b"\x01" * 16,
        typed_projection=(attrs.posix_field(SAMPLE),),
    )
    assert attrs.of(CommitMember.decode(member.encode())) == SAMPLE


def test_with_attributes_replaces_or_removes_only_the_reserved_field():
    user = index.fields({"b": 2, "a": "x"})
    once = attrs.with_attributes(user, SAMPLE)
    assert once[:2] == user and once[2].name == attrs.POSIX_FIELD
    twice = attrs.with_attributes(once, NO_OWNER)
    assert len(twice) == 3 and attrs.of(_entry_with(twice)) == NO_OWNER
    assert attrs.with_attributes(twice, None) == user
    assert attrs.user_fields(twice) == user


def test_reserved_names_are_refused_as_user_index_fields():
    assert attrs.is_reserved_field("nokvfs:posix") and attrs.is_reserved_field("nokvfs:anything")
    assert not attrs.is_reserved_field("nokvfs") and not attrs.is_reserved_field("user:posix")
    with pytest.raises(IndexValueInvalid):
        index.fields({"nokvfs:posix": b"x"})


def test_kinds():
    assert attrs.is_symlink(_entry_with((), content_type="inode/symlink"))
    assert not attrs.is_symlink(_entry_with(()))
    assert attrs.is_directory_marker(("outputs", "d", ".nokvfs-directory"))
    assert not attrs.is_directory_marker(("outputs", ".nokvfs-directory", "x"))
    assert attrs.is_directory_marker(_entry_with((), content_type="inode/directory"))


def test_from_stat_keeps_mode_and_times_and_the_owner_only_when_asked(tmp_path):
    path = tmp_path / "script.sh"
    path.write_bytes(b"#!/bin/sh\n")
    os.chmod(path, 0o2751)
    os.utime(path, ns=(-5_000_000_000, 1_234_567_890_123_456_789))
    st = os.stat(path)
    before = attrs.now_ns()
    kept = attrs.from_stat(st, keep_owner=False)
    assert (kept.mode, kept.uid, kept.gid, kept.atime_ns, kept.mtime_ns) == (
        0o2751,
        None,
        None,
        -5_000_000_000,
        1_234_567_890_123_456_789,
    )
    assert kept.ctime_ns >= before
    owned = attrs.from_stat(st, keep_owner=True)
    assert (owned.uid, owned.gid) == (st.st_uid, st.st_gid)


def test_link_targets():
    assert attrs.link_target_bytes("../a b/ü") == "../a b/ü".encode()
    raw = b"odd\xff\xfe"
    assert attrs.link_target_bytes(attrs.link_target_text(raw)) == raw  # a non-UTF-8 target round-trips
    assert len(attrs.link_target_bytes("x" * 4095)) == 4095
    for bad in ("", "x" * 4096, "a\x00b", b"bytes"):
        with pytest.raises(InvalidInput):
            attrs.link_target_bytes(bad)
