"""The family table, golden key bytes, discriminated owner ids, and History key order.

Expected hex is written by hand from the seed's "key:" lines, never computed by the codec.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nokvfs.errors import CorruptRecord, PathInvalid, UnknownDiscriminant
from nokvfs.schema import keys as K
from nokvfs.schema import records as R
from nokvfs.schema.enums import (
    CommitConsumerKind,
    GcPhase,
    HistoryHoldKind,
    OperationKind,
    ReferenceKind,
    RootActivationState,
)
from nokvfs.schema.paths import ordered_path

ROOT = b"\x10" * 16
A16 = b"\xa1" * 16
B16 = b"\xb2" * 16
F16 = b"\xf6" * 16
C32 = b"\xc3" * 32
E32 = b"\xe5" * 32
R_HEX = "10" * 16
AB_ORDERED = "62006301"  # ("a", "b"): a+1, NUL, b+1, terminator

# The seed's "Tree / Tag" table, transcribed.
SEED_TREES = [
    ("root_fence", 0x01),
    ("workspace_current", 0x02),
    ("path_current", 0x03),
    ("artifact_revision", 0x04),
    ("artifact_manifest", 0x05),
    ("revision_ref", 0x06),
    ("commit", 0x07),
    ("commit_member", 0x08),
    ("workbench_commit_head", 0x09),
    ("tag", 0x0A),
    ("snapshot_ref", 0x0B),
    ("snapshot_alias", 0x0C),
    ("history_hold", 0x0D),
    ("commit_consumer", 0x0E),
    ("secondary_index", 0x0F),
    ("change_event", 0x10),
    ("operation", 0x11),
    ("restore_member", 0x12),
    ("staged_object", 0x13),
    ("command_dedupe", 0x14),
    ("gc_candidate", 0x15),
    ("gc_barrier", 0x16),
    ("workspace_incarnation_claim", 0x17),
]


def stub_decode_prefix(data, pos):
    """A stand-in index codec whose values are exactly two bytes."""
    if pos + 2 > len(data):
        raise CorruptRecord("stub: truncated")
    return data[pos : pos + 2], pos + 2


# layout -> list of (key, expected hex)
GOLDEN = {
    K.RootFenceKey: [(K.RootFenceKey(ROOT), R_HEX)],
    K.WorkspaceCurrentKey: [(K.WorkspaceCurrentKey(ROOT, "wb-1"), R_HEX + "0000000477622d31")],
    K.PathCurrentKey: [(K.PathCurrentKey(ROOT, B16, ("a", "b")), R_HEX + "b2" * 16 + AB_ORDERED)],
    K.ArtifactRevisionKey: [(K.ArtifactRevisionKey(ROOT, A16), R_HEX + "a1" * 16)],
    K.ArtifactManifestKey: [(K.ArtifactManifestKey(ROOT, A16, 5), R_HEX + "a1" * 16 + "0000000000000005")],
    K.RevisionRefKey: [
        (
            K.RevisionRefKey.path(ROOT, B16, ("a", "b"), A16),
            R_HEX + "01" + "b2" * 16 + "00000003" + "620063" + "a1" * 16,
        ),
        (K.RevisionRefKey.commit(ROOT, C32, A16), R_HEX + "02" + "c3" * 32 + "a1" * 16),
        (K.RevisionRefKey.dependency(ROOT, F16, A16), R_HEX + "03" + "f6" * 16 + "a1" * 16),
    ],
    K.CommitKey: [(K.CommitKey(ROOT, C32), R_HEX + "c3" * 32)],
    K.CommitMemberKey: [(K.CommitMemberKey(ROOT, C32, ("a", "b")), R_HEX + "c3" * 32 + AB_ORDERED)],
    K.WorkbenchCommitHeadKey: [(K.WorkbenchCommitHeadKey(ROOT, B16), R_HEX + "b2" * 16)],
    K.TagKey: [(K.TagKey(ROOT, B16, "v1"), R_HEX + "b2" * 16 + "00027631")],
    K.SnapshotRefKey: [(K.SnapshotRefKey(ROOT, B16, 42), R_HEX + "b2" * 16 + "000000000000002a")],
    K.SnapshotAliasKey: [(K.SnapshotAliasKey(ROOT, B16, "nightly"), R_HEX + "b2" * 16 + "00076e696768746c79")],
    K.HistoryHoldKey: [
        (K.HistoryHoldKey.snapshot(ROOT, 42), R_HEX + "01" + "000000000000002a"),
        (K.HistoryHoldKey(ROOT, HistoryHoldKind.BuildCommit, F16), R_HEX + "02" + "f6" * 16),
        (K.HistoryHoldKey(ROOT, HistoryHoldKind.Restore, F16), R_HEX + "03" + "f6" * 16),
    ],
    K.CommitConsumerKey: [
        (
            K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.WorkbenchHead, K.workbench_head_consumer_owner(B16)),
            R_HEX + "c3" * 32 + "01" + "b2" * 16,
        ),
        (
            K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.Tag, K.tag_consumer_owner(B16, "v1")),
            R_HEX + "c3" * 32 + "02" + "b2" * 16 + "00027631",
        ),
        (
            K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.Lease, K.lease_consumer_owner(F16)),
            R_HEX + "c3" * 32 + "03" + "f6" * 16,
        ),
        (
            K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.ChildCommit, K.child_commit_consumer_owner(E32)),
            R_HEX + "c3" * 32 + "04" + "e5" * 32,
        ),
    ],
    K.SecondaryIndexKey: [
        (
            K.SecondaryIndexKey(ROOT, "size", b"\x05\x06", B16, ("a", "b")),
            R_HEX + "000473697a65" + "0506" + "b2" * 16 + AB_ORDERED,
        )
    ],
    K.ChangeEventKey: [(K.ChangeEventKey(ROOT, 7, 3), R_HEX + "0000000000000007" + "00000003")],
    K.OperationKey: [(K.OperationKey(ROOT, OperationKind.Restore, F16), R_HEX + "03" + "f6" * 16)],
    K.RestoreMemberKey: [(K.RestoreMemberKey(ROOT, F16, 3), R_HEX + "f6" * 16 + "0000000000000003")],
    K.StagedObjectKey: [(K.StagedObjectKey(ROOT, F16, 2), R_HEX + "f6" * 16 + "00000002")],
    K.CommandDedupeKey: [(K.CommandDedupeKey(ROOT, F16), R_HEX + "f6" * 16)],
    K.GcCandidateKey: [(K.GcCandidateKey(ROOT, A16, 4), R_HEX + "a1" * 16 + "0000000000000004")],
    K.GcBarrierKey: [(K.GcBarrierKey(ROOT), R_HEX)],
    K.WorkspaceIncarnationClaimKey: [(K.WorkspaceIncarnationClaimKey(ROOT, B16), R_HEX + "b2" * 16)],
}

CASES = [(layout, key, hex_) for layout, rows in GOLDEN.items() for key, hex_ in rows]
CASE_IDS = [f"{layout.__name__}-{i}" for i, (layout, _, _) in enumerate(CASES)]


def decode(layout, data):
    if layout is K.SecondaryIndexKey:
        return layout.decode(data, decode_prefix=stub_decode_prefix)
    return layout.decode(data)


# --- the family table ------------------------------------------------------------------------


def test_the_family_table_is_exactly_the_seed_table():
    assert [(f.name, f.tag) for f in K.FAMILIES] == SEED_TREES
    assert len(K.FAMILIES) == 23
    assert list(K.FAMILY_BY_NAME) == [name for name, _ in SEED_TREES]
    assert sorted(K.FAMILY_BY_TAG) == [tag for _, tag in SEED_TREES]
    for name, tag in SEED_TREES:
        assert K.FAMILY_BY_NAME[name] is K.FAMILY_BY_TAG[tag]


def test_tree_names_are_the_families_plus_the_reserved_engine_trees():
    assert len(K.TREE_NAMES) == len(set(K.TREE_NAMES)) == 26
    assert K.TREE_NAMES[:23] == tuple(name for name, _ in SEED_TREES)
    assert set(K.TREE_NAMES[23:]) == {"system", "history", "recovery_outbox"}
    assert (K.SYSTEM_TREE, K.HISTORY_TREE, K.RECOVERY_OUTBOX_TREE) == ("system", "history", "recovery_outbox")
    assert not set(K.RESERVED_TREES) & set(K.FAMILY_BY_NAME)


def test_each_family_names_its_key_and_value_layouts():
    for family in K.FAMILIES:
        assert family.key_layout.VERSION is None
        if family.name == "operation":
            assert family.value_record is None
        else:
            assert family.value_record in R.ALL_VALUE_RECORDS
    values = [f.value_record for f in K.FAMILIES if f.value_record is not None]
    assert len(values) == len(set(values)) == 22
    assert set(R.ALL_VALUE_RECORDS) - set(values) == {R.RootPlacement} | set(R.OPERATION_RECORDS.values())
    assert K.FAMILY_BY_NAME["path_current"].value_record is R.PathEntry


def test_family_decode_value_dispatches_operation_values_by_key():
    family = K.FAMILY_BY_NAME["operation"]
    op = R.GcOperation(A16, 3, GcPhase.Queued, 0, b"", 0, b"", None, None, 1)
    key = K.operation_key(ROOT, OperationKind.Gc, F16)
    assert family.decode_value(op.encode(), key) == op
    with pytest.raises(CorruptRecord):
        family.decode_value(op.encode())
    fence = R.RootFence(A16, 1, RootActivationState.Active)
    assert K.FAMILY_BY_NAME["root_fence"].decode_value(fence.encode()) == fence


# --- golden bytes and round trips ------------------------------------------------------------


def test_every_key_layout_has_a_golden_case():
    assert set(GOLDEN) == set(K.KEY_LAYOUTS)


@pytest.mark.parametrize(("layout", "key", "expected_hex"), CASES, ids=CASE_IDS)
def test_golden_key_bytes(layout, key, expected_hex):
    assert type(key) is layout
    assert key.encode().hex() == expected_hex
    assert decode(layout, bytes.fromhex(expected_hex)) == key


@pytest.mark.parametrize(("layout", "key", "expected_hex"), CASES, ids=CASE_IDS)
def test_keys_fail_closed_on_truncation_and_trailing_bytes(layout, key, expected_hex):
    data = key.encode()
    for n in range(len(data)):
        with pytest.raises(CorruptRecord):
            decode(layout, data[:n])
    with pytest.raises(CorruptRecord):  # for a discriminated tail it widens the owner/hold id
        decode(layout, data + b"\x00")


def test_unknown_key_discriminants_fail_closed():
    enum_offsets = {
        K.RevisionRefKey: 16,
        K.HistoryHoldKey: 16,
        K.CommitConsumerKey: 48,
        K.OperationKey: 16,
    }
    for layout, offset in enum_offsets.items():
        key, _ = GOLDEN[layout][0]
        data = bytearray(key.encode())
        data[offset] = 0xEE
        with pytest.raises(UnknownDiscriminant):
            decode(layout, bytes(data))


def test_change_event_key_helper_matches_the_layout():
    assert K.change_event_key(ROOT, 7, 3).hex() == R_HEX + "0000000000000007" + "00000003"
    assert K.change_event_key(ROOT, 7, 3).startswith(K.change_event_prefix(ROOT))
    assert K.change_event_key(ROOT, 7, 3) < K.change_event_key(ROOT, 7, 4) < K.change_event_key(ROOT, 8, 0)


# --- discriminated owner ids -----------------------------------------------------------------


def test_revision_ref_owner_ids_are_discriminated_by_kind():
    path_key = K.RevisionRefKey.path(ROOT, B16, "a/b", A16)
    assert path_key.reference_owner_id.hex() == "b2" * 16 + "00000003" + "620063"
    assert path_key.owner() == K.PathOwner(B16, ("a", "b"))
    assert K.reference_owner(ReferenceKind.Path, B16, ("a", "b")) == path_key.reference_owner_id
    assert K.RevisionRefKey.commit(ROOT, C32, A16).owner() == C32
    assert K.reference_owner(ReferenceKind.Commit, C32) == C32
    assert K.RevisionRefKey.dependency(ROOT, F16, A16).owner() == F16
    assert K.reference_owner(ReferenceKind.RevisionDependency, F16) == F16
    with pytest.raises(CorruptRecord):  # a commit owner is 32 bytes
        K.RevisionRefKey(ROOT, ReferenceKind.Commit, F16, A16)
    with pytest.raises(CorruptRecord):  # a dependency owner is 16 bytes
        K.RevisionRefKey(ROOT, ReferenceKind.RevisionDependency, C32, A16)
    with pytest.raises(CorruptRecord):  # a path owner's length must cover its bytes
        K.RevisionRefKey(ROOT, ReferenceKind.Path, B16 + b"\x00\x00\x00\x05" + b"\x62", A16)
    with pytest.raises(CorruptRecord):  # an empty path is no path
        K.RevisionRefKey(ROOT, ReferenceKind.Path, B16 + b"\x00\x00\x00\x00", A16)
    with pytest.raises(CorruptRecord):  # "." is not a normalized component
        K.RevisionRefKey(ROOT, ReferenceKind.Path, B16 + b"\x00\x00\x00\x01" + b"\x2f", A16)


def test_a_path_owner_with_a_long_length_field_is_corrupt_in_durable_bytes():
    data = bytearray(K.RevisionRefKey.path(ROOT, B16, ("a", "b"), A16).encode())
    data[17 + 16 + 3] = 0x13  # claims 19 path bytes: runs over the revision id
    with pytest.raises(CorruptRecord):
        K.RevisionRefKey.decode(bytes(data))


def test_commit_consumer_owner_ids_are_discriminated_by_kind():
    rows = GOLDEN[K.CommitConsumerKey]
    assert [key.owner() for key, _ in rows] == [B16, K.TagOwner(B16, "v1"), F16, E32]
    assert K.consumer_owner(CommitConsumerKind.Tag, B16, "v1") == B16 + b"\x00\x02v1"
    assert K.consumer_owner(CommitConsumerKind.ChildCommit, E32) == E32
    with pytest.raises(CorruptRecord):  # a head owner is an incarnation
        K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.WorkbenchHead, C32)
    with pytest.raises(CorruptRecord):  # a child commit owner is a commit id
        K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.ChildCommit, F16)
    with pytest.raises(CorruptRecord):  # tag name length does not match
        K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.Tag, B16 + b"\x00\x03v1")
    with pytest.raises(CorruptRecord):  # tag names have no NUL
        K.CommitConsumerKey(ROOT, C32, CommitConsumerKind.Tag, B16 + b"\x00\x02v\x00")
    with pytest.raises(CorruptRecord):
        K.tag_consumer_owner(B16, "")


def test_history_hold_ids_are_discriminated_by_kind():
    snap = K.HistoryHoldKey.snapshot(ROOT, 42)
    assert snap.snapshot_id == 42
    assert K.HistoryHoldKey(ROOT, HistoryHoldKind.Restore, F16).snapshot_id is None
    with pytest.raises(CorruptRecord):
        K.HistoryHoldKey(ROOT, HistoryHoldKind.Snapshot, F16)
    with pytest.raises(CorruptRecord):
        K.HistoryHoldKey(ROOT, HistoryHoldKind.BuildCommit, b"\x00" * 8)


# --- secondary index keys --------------------------------------------------------------------


def test_secondary_index_keys_delimit_the_value_through_the_index_codec():
    key = K.SecondaryIndexKey(ROOT, "size", b"\x01\x01", B16, ("a",))  # value bytes may hold 0x01
    assert K.SecondaryIndexKey.decode(key.encode(), decode_prefix=stub_decode_prefix) == key
    assert key.encode().startswith(K.secondary_index_prefix(ROOT, "size", b"\x01\x01"))
    assert K.secondary_index_prefix(ROOT, "size").hex() == R_HEX + "000473697a65"
    data = key.encode()
    with pytest.raises(CorruptRecord):  # a path that does not end in 0x01
        K.SecondaryIndexKey.decode(data[:-1] + b"\x02", decode_prefix=stub_decode_prefix)

    def broken(data, pos):
        raise ValueError("not an index value")

    with pytest.raises(CorruptRecord):
        K.SecondaryIndexKey.decode(data, decode_prefix=broken)
    with pytest.raises(CorruptRecord):
        K.SecondaryIndexKey.decode(data, decode_prefix=lambda d, p: (None, p))
    with pytest.raises(CorruptRecord):
        K.SecondaryIndexKey(ROOT, "", b"\x01", B16, ("a",))


def test_secondary_index_keys_with_the_real_index_codec():
    index_codec = pytest.importorskip("nokvfs.schema.index_codec")
    values = (None, True, -3, 7, 2.5, "x\x00y", b"\x00\x01\xff")
    for value in values:
        encoded = index_codec.encode(index_codec.from_python(value))
        key = K.SecondaryIndexKey(ROOT, "f", encoded, B16, ("a", "b"))
        assert K.SecondaryIndexKey.decode(key.encode()) == key  # the lazily imported decoder
    data = K.SecondaryIndexKey(ROOT, "f", index_codec.encode(index_codec.from_python("x")), B16, ("a",)).encode()
    for n in range(len(data)):
        with pytest.raises(CorruptRecord):
            K.SecondaryIndexKey.decode(data[:n])


def test_keys_refuse_paths_their_decoder_would_refuse():
    for bad in (("a/b",), ("..",), ("a", ""), ("a\x00",), ("a\\b",), ()):
        with pytest.raises(CorruptRecord):
            K.PathCurrentKey(ROOT, B16, bad).encode()
        with pytest.raises(CorruptRecord):
            K.CommitMemberKey(ROOT, C32, bad).encode()
        with pytest.raises(CorruptRecord):
            K.SecondaryIndexKey(ROOT, "f", b"\x01", B16, bad)
        with pytest.raises(CorruptRecord):
            K.path_reference_owner(B16, bad)
    with pytest.raises(PathInvalid):  # path text goes through the one normalizer
        K.path_current_key(ROOT, B16, "a//b")


# --- prefixes --------------------------------------------------------------------------------


def test_path_subtree_keys_share_the_subtree_prefix():
    prefix = K.path_subtree_prefix(ROOT, B16, ("a",))
    assert prefix.hex() == R_HEX + "b2" * 16 + "6200"
    below = [("a", "b"), ("a", "b", "c"), ("a", "z")]
    for path in below:
        key = K.path_current_key(ROOT, B16, path)
        assert key.startswith(prefix) and key.startswith(K.path_current_prefix(ROOT, B16))
    assert not K.path_current_key(ROOT, B16, ("a",)).startswith(prefix)  # the exact row
    assert not K.path_current_key(ROOT, B16, ("ab",)).startswith(prefix)
    assert not K.path_current_key(ROOT, B16, ("ab", "c")).startswith(prefix)
    assert K.path_current_key(ROOT, B16, "a/b") == K.path_current_key(ROOT, B16, ("a", "b"))
    assert K.path_subtree_prefix(ROOT, B16, ()) == K.path_current_prefix(ROOT, B16)
    # subtree, then the exact row, then longer siblings
    assert (
        K.path_current_key(ROOT, B16, ("a", "z"))
        < K.path_current_key(ROOT, B16, ("a",))
        < K.path_current_key(ROOT, B16, ("a\x01",))
        < K.path_current_key(ROOT, B16, ("ab",))
    )


def test_prefix_helpers_are_prefixes_of_their_keys():
    assert K.workspace_current_key(ROOT, "wb-1").startswith(K.workspace_current_prefix(ROOT))
    assert K.StagedObjectKey(ROOT, F16, 9).encode().startswith(K.staged_object_prefix(ROOT, F16))
    assert K.ArtifactManifestKey(ROOT, A16, 9).encode().startswith(K.artifact_manifest_prefix(ROOT, A16))
    assert K.CommitMemberKey(ROOT, C32, ("a",)).encode().startswith(K.commit_member_prefix(ROOT, C32))
    assert K.RestoreMemberKey(ROOT, F16, 1).encode().startswith(K.restore_member_prefix(ROOT, F16))
    assert K.SnapshotRefKey(ROOT, B16, 1).encode().startswith(K.snapshot_ref_prefix(ROOT, B16))
    for key, _ in GOLDEN[K.CommitConsumerKey]:
        encoded = key.encode()
        assert encoded.startswith(K.commit_consumer_prefix(ROOT, C32))
        assert encoded.startswith(K.commit_consumer_prefix(ROOT, C32, key.consumer_kind))
    for key, _ in GOLDEN[K.RevisionRefKey]:
        encoded = key.encode()
        assert encoded.startswith(K.revision_ref_prefix(ROOT, key.reference_kind))
        assert encoded.startswith(K.revision_ref_prefix(ROOT, key.reference_kind, key.reference_owner_id))
    # a path owner prefix never matches a longer path's owner
    owner_a = K.path_reference_owner(B16, ("a",))
    assert (
        not K.RevisionRefKey.path(ROOT, B16, ("ab",), A16)
        .encode()
        .startswith(K.revision_ref_prefix(ROOT, ReferenceKind.Path, owner_a))
    )
    assert K.operation_key(ROOT, OperationKind.Gc, F16) == K.OperationKey(ROOT, OperationKind.Gc, F16).encode()


# --- History key -----------------------------------------------------------------------------


def test_history_key_golden_bytes_and_round_trip():
    key = K.history_key(0x03, b"\x01\x02", 1)
    assert key.hex() == "03000000020102fffffffffffffffe"
    assert K.decode_history_key(key) == (0x03, b"\x01\x02", 1)
    assert key.startswith(K.history_key_prefix(0x03, b"\x01\x02"))
    assert K.history_key(0x17, b"", 0).hex() == "1700000000ffffffffffffffff"


def test_history_keys_sort_newer_versions_first():
    user_key = K.path_current_key(ROOT, B16, ("a",))
    versions = [1, 2, 3, 1000, 2**40, 2**64 - 1]
    encoded = [K.history_key(0x03, user_key, v) for v in versions]
    assert sorted(encoded) == list(reversed(encoded))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([tag for _, tag in SEED_TREES]),
    st.binary(max_size=40),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_history_keys_round_trip_and_order(tag, user_key, v1, v2):
    k1, k2 = K.history_key(tag, user_key, v1), K.history_key(tag, user_key, v2)
    assert K.decode_history_key(k1) == (tag, user_key, v1)
    assert (k1 < k2) == (v1 > v2)


def test_history_keys_fail_closed():
    key = K.history_key(0x03, b"\x01\x02", 1)
    with pytest.raises(UnknownDiscriminant):
        K.history_key(0x00, b"k", 1)
    with pytest.raises(UnknownDiscriminant):
        K.history_key(0x18, b"k", 1)
    with pytest.raises(UnknownDiscriminant):
        K.decode_history_key(b"\x18" + key[1:])
    for n in range(len(key)):
        with pytest.raises(CorruptRecord):
            K.decode_history_key(key[:n])
    with pytest.raises(CorruptRecord):
        K.decode_history_key(key + b"\x00")
    with pytest.raises(CorruptRecord):
        K.history_key(0x03, b"k", 2**64)


def _decoded(data: bytes):
    try:
        return K.decode_history_key(data)
    except (CorruptRecord, UnknownDiscriminant) as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([tag for _, tag in SEED_TREES] + [0, 0x18, 0xFF]), st.binary(max_size=24), st.data())
def test_history_key_decoding_takes_its_checks_answer_on_any_bytes(tag, user_key, data):
    """decode_history_key's straight-line path for well-formed keys gives the checked path's
    answer, and any other bytes (a cut, an added byte, a wrong length) its typed error."""
    key = bytes([tag]) + len(user_key).to_bytes(4, "big") + user_key + data.draw(st.binary(min_size=8, max_size=8))
    for candidate in (
        key,
        key[: data.draw(st.integers(0, len(key)))],
        key + b"\x00",
        data.draw(st.binary(max_size=40)),
    ):
        try:
            checked = K._decode_history_key_checked(candidate)
        except (CorruptRecord, UnknownDiscriminant) as exc:
            checked = type(exc)
        assert _decoded(candidate) == checked
        assert _decoded(bytearray(candidate)) == checked


# --- generated round trips -------------------------------------------------------------------

components = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\x00"),
    min_size=1,
    max_size=6,
).filter(lambda c: c not in (".", ".."))
paths = st.lists(components, min_size=1, max_size=4).map(tuple)
ids16 = st.binary(min_size=16, max_size=16)
ids32 = st.binary(min_size=32, max_size=32)


@settings(max_examples=150, deadline=None)
@given(ids16, ids16, paths, ids16, ids32)
def test_generated_path_and_owner_keys_round_trip(root, inc, path, rev, commit):
    for key in (
        K.PathCurrentKey(root, inc, path),
        K.CommitMemberKey(root, commit, path),
        K.RevisionRefKey.path(root, inc, path, rev),
        K.RevisionRefKey.commit(root, commit, rev),
        K.RevisionRefKey.dependency(root, inc, rev),
    ):
        assert type(key).decode(key.encode()) == key
    assert K.RevisionRefKey.path(root, inc, path, rev).owner() == K.PathOwner(inc, path)
    sik = K.SecondaryIndexKey(root, "f", b"\xff\x01", inc, path)
    assert K.SecondaryIndexKey.decode(sik.encode(), decode_prefix=stub_decode_prefix) == sik
    assert K.path_current_key(root, inc, path).endswith(ordered_path(path))
