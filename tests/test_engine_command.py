"""MetadataCommand: fences, the read-version fence, request-id replay, predicates, side rows."""

from __future__ import annotations

import pytest

from nokvfs.engine.command import (
    Absent,
    Delete,
    Exists,
    FieldEquals,
    Generation,
    MetadataCommand,
    Put,
    State,
    ValueEquals,
)
from nokvfs.engine.records import CommandRecord, HistoryValue
from nokvfs.engine.shard import _command_record, command_from_record, command_payload
from nokvfs.errors import (
    CommandTooLarge,
    FenceError,
    GenerationConflict,
    InvalidInput,
    OwnerFenced,
    PredicateFailed,
    ReadVersionStale,
    RequestMismatch,
)
from nokvfs.schema import keys, records
from nokvfs.schema.enums import GcClaimState, OutboxRecordKind
from nokvfs.schema.ids import new_id16

K1 = b"\x01" * 16 + b"one"
K2 = b"\x01" * 16 + b"two"


def gc_candidate(version, state=GcClaimState.Candidate):
    return records.GcCandidate(
        last_zero_ref_version=version, claim_state=state, retry_count=0, quarantine_evidence=None
    )


def test_a_command_commits_at_read_version_plus_one(shard_env):
    before = shard_env.shard.commit_version
    outcome = shard_env.apply(mutations=[Put("path_current", K1, b"\x02a")], result=b"ok")
    assert outcome.commit_version == before + 1 == shard_env.shard.commit_version
    assert outcome.result == b"ok" and not outcome.replayed


def test_a_stale_read_version_is_rejected_and_applies_nothing(shard_env):
    stale = shard_env.command(mutations=[Put("path_current", K1, b"\x02a")])
    shard_env.apply(mutations=[Put("path_current", K2, b"\x02b")])
    with pytest.raises(ReadVersionStale) as info:
        shard_env.shard.apply(stale)
    assert info.value.current == stale.read_version + 1
    with shard_env.shard.read() as view:
        assert view.get("path_current", K1) is None


def test_request_id_replay_returns_the_stored_result_before_the_version_fence(shard_env):
    request_id = new_id16()
    first = shard_env.apply(mutations=[Put("path_current", K1, b"\x02a")], result=b"rev-1", request_id=request_id)
    shard_env.apply(mutations=[Put("path_current", K2, b"\x02b")])
    # Same request, rebuilt at a stale version: the replay wins over the fence.
    again = shard_env.shard.apply(
        shard_env.command(
            mutations=[Put("path_current", K1, b"\x02a")], result=b"rev-1", request_id=request_id, read_version=0
        )
    )
    assert again.replayed and again.result == b"rev-1"
    assert (again.commit_version, again.recovery_lsn) == (first.commit_version, first.recovery_lsn)


def test_reusing_a_request_id_with_other_inputs_is_a_mismatch(shard_env):
    request_id = new_id16()
    shard_env.apply(mutations=[Put("path_current", K1, b"\x02a")], request_id=request_id)
    with pytest.raises(RequestMismatch):
        shard_env.apply(mutations=[Put("path_current", K1, b"\x02other")], request_id=request_id)


def test_a_caller_digest_makes_rebuilt_commands_replay(shard_env):
    request_id, digest = new_id16(), b"\x07" * 32
    shard_env.apply(mutations=[Put("path_current", K1, b"\x02v1")], request_id=request_id, command_digest=digest)
    again = shard_env.apply(
        mutations=[Put("path_current", K1, b"\x02v2")], request_id=request_id, command_digest=digest
    )
    assert again.replayed


def test_no_fence_wrong_generation_or_wrong_shard_is_refused(shard_env):
    with pytest.raises(FenceError, match="no fence"):
        shard_env.shard.apply(
            MetadataCommand(
                root_id=new_id16(),
                logical_shard_id=shard_env.shard.logical_shard_id,
                placement_generation=shard_env.placement_generation,
                owner_epoch=shard_env.shard.owner_epoch,
                request_id=new_id16(),
                read_version=shard_env.shard.commit_version,
            )
        )
    with pytest.raises(FenceError, match="placement generation"):
        shard_env.apply(placement_generation=shard_env.placement_generation + 1)
    with pytest.raises(FenceError, match="another logical shard"):
        shard_env.apply(logical_shard_id=new_id16())


def test_an_old_owner_epoch_is_fenced(shard_env):
    old = shard_env.shard.owner_epoch
    shard_env.shard.advance_owner_epoch(old + 1)
    with pytest.raises(OwnerFenced):
        shard_env.apply(owner_epoch=old, mutations=[Put("path_current", K1, b"\x02a")])
    with pytest.raises(OwnerFenced, match="does not advance"):
        shard_env.shard.advance_owner_epoch(old + 1)
    assert shard_env.apply(mutations=[Put("path_current", K1, b"\x02a")]).commit_version > 0


@pytest.mark.parametrize(
    "make_predicate, error",
    [
        (lambda: Exists("path_current", K2), PredicateFailed),
        (lambda: Absent("gc_candidate", K1), PredicateFailed),
        (lambda: ValueEquals("gc_candidate", K1, gc_candidate(4)), PredicateFailed),
        (lambda: FieldEquals("gc_candidate", K1, records.GcCandidate, "retry_count", 1), PredicateFailed),
        (lambda: Generation("gc_candidate", K1, records.GcCandidate, "last_zero_ref_version", 4), GenerationConflict),
        (lambda: State("gc_candidate", K1, records.GcCandidate, "claim_state", GcClaimState.Claimed), PredicateFailed),
        (lambda: Generation("gc_candidate", K2, records.GcCandidate, "last_zero_ref_version", 3), GenerationConflict),
    ],
    ids=["exists", "absent", "equals", "field", "generation", "state", "generation-missing-row"],
)
def test_a_failed_predicate_applies_no_mutation(shard_env, make_predicate, error):
    shard_env.apply(mutations=[Put("gc_candidate", K1, gc_candidate(3))])
    version = shard_env.shard.commit_version
    with pytest.raises(error) as info:
        shard_env.apply(
            predicates=[Exists("gc_candidate", K1), make_predicate()],
            mutations=[Put("path_current", K2, b"\x02x"), Delete("gc_candidate", K1)],
            events=[b"\x02event"],
        )
    assert info.value.index == 1
    assert shard_env.shard.commit_version == version
    with shard_env.shard.read() as view:
        assert view.get("path_current", K2) is None
        assert view.get("gc_candidate", K1) == gc_candidate(3).encode()
        assert view.get("change_event", keys.change_event_key(shard_env.root_id, version + 1, 0)) is None


def test_holding_predicates_let_the_command_apply(shard_env):
    shard_env.apply(mutations=[Put("gc_candidate", K1, gc_candidate(3))])
    shard_env.apply(
        predicates=[
            Exists("gc_candidate", K1),
            Absent("gc_candidate", K2),
            ValueEquals("gc_candidate", K1, gc_candidate(3)),
            Generation("gc_candidate", K1, records.GcCandidate, "last_zero_ref_version", 3),
            State("gc_candidate", K1, records.GcCandidate, "claim_state", GcClaimState.Candidate),
        ],
        mutations=[Put("gc_candidate", K1, gc_candidate(3, GcClaimState.Claimed))],
    )


def test_history_events_dedupe_and_outbox_are_written_with_the_mutations(shard_env):
    shard_env.apply(mutations=[Put("path_current", K1, b"\x02v1")])
    request_id = new_id16()
    outcome = shard_env.apply(
        mutations=[Put("path_current", K1, b"\x02v2"), Put("path_current", K1, b"\x02v3"), Delete("path_current", K2)],
        events=[b"\x02first", b"\x02second"],
        result=b"R",
        request_id=request_id,
    )
    version = outcome.commit_version
    env = shard_env.shard._env
    with env.begin() as txn:
        tag = keys.FAMILY_BY_NAME["path_current"].tag
        # The first write of K1 in the command records the value before the command, not v2.
        h = shard_env.stored(txn, "history", keys.history_key(tag, K1, version))
        assert HistoryValue.decode(h).previous == b"\x02v1"
        assert (
            HistoryValue.decode(shard_env.stored(txn, "history", keys.history_key(tag, K2, version))).previous is None
        )
        assert shard_env.stored(txn, "path_current", K1) == b"\x02v3"
        for seq, body in enumerate([b"\x02first", b"\x02second"]):
            assert shard_env.stored(txn, "change_event", keys.change_event_key(shard_env.root_id, version, seq)) == body
        dedupe = records.CommandDedupe.decode(
            shard_env.stored(txn, "command_dedupe", keys.CommandDedupeKey(shard_env.root_id, request_id).encode())
        )
        assert (dedupe.result, dedupe.commit_version, dedupe.recovery_lsn) == (b"R", version, outcome.recovery_lsn)
    entries = list(shard_env.shard.outbox_entries())
    last = entries[-1]
    assert last.lsn == outcome.recovery_lsn and last.header.record_kind == OutboxRecordKind.MetadataCommand
    record = CommandRecord.decode(last.payload)
    assert record.commit_version == version and record.request_id == request_id
    rebuilt = command_from_record(record)
    assert rebuilt.command_digest == record.command_digest and len(rebuilt.mutations) == 3


class _Subclassed(Exists):
    """A predicate subclass: its row is left to the record's codec."""


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [Put("path_current", bytearray(b"\x01" * 16 + b"ba"), b"\x02v")],  # a key of another type
        [Put("operation", K2 + b"\xff" * 300, b"\x00" * 70_000)],
    ],
)
def test_the_outbox_payload_written_row_by_row_is_the_records_encoding(shard_env, extra):
    candidate = keys.GcCandidateKey(shard_env.root_id, b"\x07" * 16, 3).encode()
    predicates = [
        Exists("path_current", K1),
        Absent("path_current", K2),
        ValueEquals("gc_candidate", candidate, gc_candidate(4)),
        ValueEquals("path_current", b"", b""),
        FieldEquals("gc_candidate", candidate, records.GcCandidate, "retry_count", 0),
        Generation("gc_candidate", candidate, records.GcCandidate, "last_zero_ref_version", 4),
        State("gc_candidate", candidate, records.GcCandidate, "claim_state", GcClaimState.Candidate),
    ]
    mutations = [Put("path_current", K1, b"\x02a"), Delete("path_current", K2), Put("gc_candidate", candidate, b"")]
    for events, result, fence_install in (((), b"", False), ((b"\x02first", b""), b"R" * 300, True)):
        more = dict(events=events, result=result, fence_install=fence_install)
        command = shard_env.command(predicates=predicates, mutations=mutations + extra, **more)
        assert command_payload(command, 12) == _command_record(command, 12).encode()
    odd = shard_env.command(predicates=[_Subclassed("path_current", K1)], mutations=mutations)
    assert command_payload(odd, 5) == _command_record(odd, 5).encode()
    assert CommandRecord.decode(command_payload(odd, 5)).predicates[0].kind == 1


def test_lease_clock_observations_only_move_forward_and_are_in_the_outbox(shard_env):
    assert shard_env.shard.observe_lease_clock(1_000) == 1_000
    assert shard_env.shard.observe_lease_clock(500) == 1_000
    kinds = [e.header.record_kind for e in shard_env.shard.outbox_entries()]
    assert kinds.count(OutboxRecordKind.LeaseClockObservation) == 1
    shard_env.reopen()
    assert shard_env.shard.lease_clock_ms == 1_000


def test_reopen_after_every_kind_of_write(shard_env):
    shard_env.apply(mutations=[Put("path_current", K1, b"\x02v1")], events=[b"\x02e"])
    shard_env.reopen()
    shard_env.apply(mutations=[Delete("path_current", K1)])
    shard_env.reopen()
    shard_env.shard.observe_lease_clock(42)
    shard_env.reopen()
    shard_env.shard.advance_owner_epoch(shard_env.shard.owner_epoch + 1)
    shard_env.reopen()
    shard_env.apply(mutations=[Put("path_current", K2, b"\x02v2")])
    shard_env.reopen()
    with shard_env.shard.read() as view:
        assert view.get("path_current", K1) is None
        assert view.get("path_current", K2) == b"\x02v2"
    tail = shard_env.shard.recovery_tail
    assert tail.applied_lsn == len(list(shard_env.shard.outbox_entries()))


def test_command_bounds_and_unknown_trees_are_refused(shard_env):
    with pytest.raises(CommandTooLarge):
        shard_env.command(mutations=[Put("path_current", bytes([i % 256]) * 3, b"\x02") for i in range(20_000)])
    from nokvfs.errors import InvalidInput

    with pytest.raises(InvalidInput, match="no metadata family"):
        shard_env.apply(mutations=[Put("history", K1, b"x")])
    with pytest.raises(InvalidInput, match="no metadata family"):
        shard_env.apply(mutations=[Put("inode_current", K1, b"x")])


def test_a_key_beyond_the_engine_limit_is_refused_before_anything_is_written(shard_env):
    from nokvfs.errors import KeyTooLong

    limit = shard_env.shard.max_family_key_bytes
    assert limit == 511 - 13
    version = shard_env.shard.commit_version
    with pytest.raises(KeyTooLong, match=f"limit of {limit} bytes"):
        shard_env.apply(
            mutations=[Put("path_current", K1, b"\x02ok"), Put("path_current", b"k" * (limit + 1), b"\x02v")]
        )
    assert shard_env.shard.commit_version == version
    shard_env.apply(mutations=[Put("path_current", b"k" * limit, b"\x02v")])
    shard_env.reopen()


@pytest.mark.parametrize("kind", [Put, ValueEquals])
def test_put_and_value_equals_are_built_as_their_dataclass_declares(kind):
    """Their own __init__ (no object.__setattr__ per field) takes the declared fields, by
    position or name, stores the value as bytes (a versioned record encoded), and leaves the
    row frozen, comparable and hashable like any frozen dataclass."""
    import dataclasses

    candidate = records.GcCandidate(3, GcClaimState.Candidate, 0, None)
    row = kind("gc_candidate", b"k", candidate)
    assert [f.name for f in dataclasses.fields(kind)] == ["tree", "key", "value"]
    assert (row.tree, row.key, row.value) == ("gc_candidate", b"k", candidate.encode())
    assert row == kind(tree="gc_candidate", key=b"k", value=bytearray(candidate.encode()))
    assert hash(row) == hash(kind("gc_candidate", b"k", candidate.encode()))
    assert type(kind("t", b"k", bytearray(b"v")).value) is bytes
    assert dataclasses.replace(row, key=b"j") == kind("gc_candidate", b"j", candidate.encode())
    assert repr(row).startswith(f"{kind.__name__}(tree='gc_candidate', key=b'k', value=b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.value = b"other"
    with pytest.raises(InvalidInput):
        kind("t", b"k", "not bytes")
    with pytest.raises(TypeError):
        kind("t", b"k")
