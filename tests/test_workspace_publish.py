"""The publish pipeline, object-first and metadata-last:

    Uploading -> Finalizing -> Published
    Uploading -> Aborting -> Cleaning -> Cleaned

The ledger owns every key (and multipart upload id) before bytes are sent; a failure is invisible
and cleaned; a response-loss retry of the final command returns the stored result and allocates
nothing; concurrent replacers at one generation have exactly one winner.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from nokvfs.errors import (
    GenerationConflict,
    IntegrityError,
    KeyTooLong,
    NokvError,
    NotFound,
    ReadVersionStale,
    RequestMismatch,
    ReservedPath,
    StoreError,
)
from nokvfs.schema.enums import PublishPhase, StagedCleanupState, StagedProviderState
from nokvfs.workspace import body as bodies
from nokvfs.workspace import namespace, publish
from nokvfs.workspace import root as root_module
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.root import Built, intent_digest
from tests.workspace_fixtures import (  # noqa: F401 - fixtures
    BLOCK,
    WB,
    RootHolder,
    all_rows,
    bench_fixture,
    block_keys,
    body,
    data_dir_fixture,
    entry,
    get_bytes,
    ledger,
    manifest,
    present_keys,
    publish_ops,
    refs_to,
    revision,
    root_fixture,
)


def _publication(path: str, data: bytes, **kw) -> publish.Publication:
    b = bodies.from_bytes(data, BLOCK)
    return publish.Publication(
        workbench_id=WB,
        components=tuple(path.split("/")),
        body=b,
        logical_size=b.size,
        body_digest_uri=b.digest_uri,
        **kw,
    )


def _counts(root) -> dict[str, int]:
    return {
        tree: len(all_rows(root, tree))
        for tree in (
            "artifact_revision",
            "artifact_manifest",
            "revision_ref",
            "path_current",
            "operation",
            "staged_object",
            "change_event",
            "command_dedupe",
        )
    }


# --- phases and the ledger ------------------------------------------------------------------------


def test_the_ledger_owns_every_key_before_its_bytes_are_sent(monkeypatch, bench):
    root = bench
    seen = []
    real_put = root.store.put

    def checked_put(key, data, **kw):
        ((op_id, op),) = [(i, o) for i, o in publish_ops(root).items() if o.phase != PublishPhase.Published]
        assert op.phase == PublishPhase.Uploading
        rows = {r.object_key: r for r in ledger(root, op_id)}
        assert key in rows, "uploaded a key the ledger does not own"
        row = rows[key]
        assert (row.provider_state, row.cleanup_state) == (StagedProviderState.Planned, StagedCleanupState.Owned)
        assert row.expected_length == len(data) and row.upload_id is None
        assert entry(root, "outputs/x") is None  # nothing is visible while uploading
        seen.append(key)
        return real_put(key, data, **kw)

    monkeypatch.setattr(root.store, "put", checked_put)
    data = body(3 * BLOCK + 1, "ledger")
    found = namespace.put(root, WB, "outputs/x", data)
    assert sorted(seen) == block_keys(root, found.artifact_revision_id, 4)  # sent up to four at a time
    ((op_id, op),) = publish_ops(root).items()
    assert op.phase == PublishPhase.Published
    assert op.object_count == 4 and op.logical_size == len(data)
    assert ledger(root, op_id) == []  # the final command drops the ledger rows
    assert get_bytes(root, "outputs/x") == data


def test_each_stage_moves_the_operation_one_phase(bench):
    root = bench
    pub = _publication("outputs/staged", body(2 * BLOCK, "stages"))
    publish.begin(root, pub)
    op = publish_ops(root)[pub.operation_id]
    assert op.phase == PublishPhase.Uploading
    assert [r.provider_state for r in ledger(root, pub.operation_id)] == [StagedProviderState.Planned] * 2
    publish.upload(root, pub)
    assert len(present_keys(root.store, block_keys(root, pub.revision_id, 2))) == 2
    assert entry(root, "outputs/staged") is None
    publish.finalize(root, pub.operation_id)
    assert publish_ops(root)[pub.operation_id].phase == PublishPhase.Finalizing
    assert [r.provider_state for r in ledger(root, pub.operation_id)] == [StagedProviderState.Uploaded] * 2
    assert entry(root, "outputs/staged") is None
    assert revision(root, pub.revision_id) is None  # the revision exists only once published
    published = publish._publish(root, pub.operation_id)
    assert publish_ops(root)[pub.operation_id].phase == PublishPhase.Published
    assert entry(root, "outputs/staged") == published
    # Finalizing twice, or abort after publication, cannot move a published operation.
    with pytest.raises(NokvError):
        publish.finalize(root, pub.operation_id)
    assert publish.abort(root, pub.operation_id, reason="too late") == PublishPhase.Published
    assert get_bytes(root, "outputs/staged") == body(2 * BLOCK, "stages")


def test_abort_of_an_uploading_operation_cleans_its_objects(bench):
    root = bench
    pub = _publication("outputs/aborted", body(3 * BLOCK, "abort"))
    publish.begin(root, pub)
    publish.upload(root, pub)
    keys_ = block_keys(root, pub.revision_id, 3)
    assert len(present_keys(root.store, keys_)) == 3
    assert publish.abort(root, pub.operation_id, reason="test") == PublishPhase.Cleaned
    op = publish_ops(root)[pub.operation_id]
    assert op.phase == PublishPhase.Cleaned and op.terminal_error == "test"
    assert present_keys(root.store, keys_) == []
    assert ledger(root, pub.operation_id) == []
    # A cleaned operation can never be finalized or published.
    with pytest.raises(NokvError):
        publish.finalize(root, pub.operation_id)
    with pytest.raises(NokvError):
        publish._publish(root, pub.operation_id)
    assert entry(root, "outputs/aborted") is None


def test_a_source_that_changes_under_upload_aborts(bench):
    root = bench
    data = bytearray(body(3 * BLOCK, "mutable"))
    b = bodies.from_bytes(bytes(data), BLOCK)
    b._data = data  # the caller's buffer, changed after hashing
    data[2 * BLOCK] ^= 0xFF
    with pytest.raises(IntegrityError):
        namespace.put(root, WB, "outputs/m", b)
    (op,) = publish_ops(root).values()
    assert op.phase == PublishPhase.Cleaned
    assert present_keys(root.store, block_keys(root, op.artifact_revision_id, 3)) == []
    assert entry(root, "outputs/m") is None


def test_a_failed_upload_is_invisible_and_cleaned(monkeypatch, bench):
    root = bench
    namespace.put(root, WB, "outputs/f", b"old")
    real_put = root.store.put
    calls = []

    def failing_put(key, data, **kw):
        calls.append(key)
        if len(calls) == 2:
            raise StoreError("disk on fire")
        return real_put(key, data, **kw)

    monkeypatch.setattr(root.store, "put", failing_put)
    with pytest.raises(StoreError):
        namespace.put(root, WB, "outputs/f", body(3 * BLOCK, "fail"))
    assert get_bytes(root, "outputs/f") == b"old"
    failed = [op for op in publish_ops(root).values() if op.phase != PublishPhase.Published]
    assert [op.phase for op in failed] == [PublishPhase.Cleaned]
    assert present_keys(root.store, block_keys(root, failed[0].artifact_revision_id, 3)) == []


def test_multipart_upload_id_is_in_the_ledger_before_any_part(monkeypatch, bench):
    root = bench
    monkeypatch.setattr(root.store, "multipart_threshold", BLOCK - 1, raising=False)
    real_part = root.store.upload_part
    parts = []

    def checked_part(key, upload_id, number, data):
        (op_id,) = [i for i, o in publish_ops(root).items() if o.phase == PublishPhase.Uploading]
        (row,) = [r for r in ledger(root, op_id) if r.object_key == key]
        assert row.upload_id == upload_id
        assert row.provider_state == StagedProviderState.Uploading
        parts.append(key)
        return real_part(key, upload_id, number, data)

    monkeypatch.setattr(root.store, "upload_part", checked_part)
    data = body(2 * BLOCK + 5, "multipart")
    found = namespace.put(root, WB, "outputs/mp", data)
    # Two full blocks go multipart; the 5-byte tail is under the threshold.
    assert parts == block_keys(root, found.artifact_revision_id, 2)
    assert get_bytes(root, "outputs/mp") == data


def test_a_failed_multipart_is_aborted_from_the_ledger(monkeypatch, bench):
    root = bench
    monkeypatch.setattr(root.store, "multipart_threshold", 0, raising=False)
    recorded = {}
    real_create = root.store.create_multipart

    def create(key, **kw):
        recorded[key] = real_create(key, **kw)
        return recorded[key]

    def broken_part(key, upload_id, number, data):
        raise StoreError("part refused")

    monkeypatch.setattr(root.store, "create_multipart", create)
    monkeypatch.setattr(root.store, "upload_part", broken_part)
    with pytest.raises(StoreError):
        namespace.put(root, WB, "outputs/mp", body(BLOCK, "mpfail"))
    (op,) = publish_ops(root).values()
    assert op.phase == PublishPhase.Cleaned
    ((key, upload_id),) = recorded.items()
    # Aborted by cleanup: the staging of that upload is gone, so a late part cannot land.
    from nokvfs.errors import ObjectMissing

    with pytest.raises(ObjectMissing):
        real_part = type(root.store).upload_part
        real_part(root.store, key, upload_id, 1, b"late")


# --- reserved paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["metadata/run_manifest.json", "metadata/restore_manifest.json"])
def test_reserved_manifests_refuse_generic_put_and_rm(bench, path):
    root = bench
    version = root.shard.commit_version
    with pytest.raises(ReservedPath):
        namespace.put(root, WB, path, b"{}")
    with pytest.raises(ReservedPath):
        namespace.remove(root, WB, path)
    with pytest.raises(ReservedPath):
        namespace.rename(root, WB, path, "metadata/other.json")
    namespace.put(root, WB, "metadata/other.json", b"{}")
    with pytest.raises(ReservedPath):
        namespace.rename(root, WB, "metadata/other.json", path)
    with pytest.raises(ReservedPath):
        publish.run(root, _publication(path, b"{}"))
    assert root.shard.commit_version == version + 3  # only the legitimate put: begin, finalize, publish
    assert len(publish_ops(root)) == 1
    # Near misses are ordinary paths.
    namespace.put(root, WB, "metadata/run_manifest.json.bak", b"ok")
    namespace.put(root, WB, "outputs/metadata/run_manifest.json", b"ok")


# --- response-loss retry -----------------------------------------------------------------------


def test_applying_the_final_command_twice_returns_the_stored_result(bench):
    root = bench
    namespace.put(root, WB, "outputs/r", b"old")
    pub = _publication("outputs/r", body(2 * BLOCK, "retry"))
    publish.begin(root, pub)
    publish.upload(root, pub)
    publish.finalize(root, pub.operation_id)
    first = publish._publish(root, pub.operation_id)
    version, counts = root.shard.commit_version, _counts(root)
    again = publish._publish(root, pub.operation_id)
    assert again == first
    assert root.shard.commit_version == version  # the replay commits nothing
    assert _counts(root) == counts
    assert revision(root, pub.revision_id).strong_reference_count == 1
    assert len(refs_to(root, pub.revision_id)) == 1
    assert entry(root, "outputs/r") == first


def test_a_lost_response_of_the_final_command_is_replayed_not_reapplied(monkeypatch, bench):
    root = bench
    namespace.put(root, WB, "outputs/r", b"old")
    real_apply = root.shard.apply
    lost = []

    class ResponseLost(NokvError):
        pass

    def apply(command, **kwargs):
        outcome = real_apply(command, **kwargs)
        ops = [o for o in publish_ops(root).values() if o.request_id == command.request_id]
        if ops and not lost and not outcome.replayed:
            lost.append(ops[0])
            raise ResponseLost("the final command applied, its answer did not arrive")
        return outcome

    monkeypatch.setattr(root.shard, "apply", apply)
    data = body(BLOCK + 9, "lost")
    with pytest.raises(ResponseLost):
        namespace.put(root, WB, "outputs/r", data)
    (op,) = lost
    (op_id,) = [i for i, o in publish_ops(root).items() if o.request_id == op.request_id]
    # The failure path must not have undone the publication.
    assert publish_ops(root)[op_id].phase == PublishPhase.Published
    assert get_bytes(root, "outputs/r") == data
    version, counts = root.shard.commit_version, _counts(root)
    replayed = publish._publish(root, op_id)
    assert replayed == entry(root, "outputs/r")
    assert root.shard.commit_version == version and _counts(root) == counts
    assert publish.recover(root) == []


def test_a_replay_through_the_same_request_id_returns_the_stored_result(bench):
    root = bench
    found = namespace.put(root, WB, "outputs/q", b"once")
    ((op_id, op),) = publish_ops(root).items()
    version, counts = root.shard.commit_version, _counts(root)

    def rebuild(view):  # whatever a rebuilt retry would write, the stored result wins
        return Built(mutations=[], result=b"something else")

    outcome, _ = root.apply(rebuild, digest=intent_digest("publish.final", op_id), request_id=op.request_id)
    assert outcome.replayed
    assert outcome.result == found.encode()
    assert root.shard.commit_version == version and _counts(root) == counts
    with pytest.raises(RequestMismatch):
        root.apply(rebuild, digest=intent_digest("publish.final", b"\x00" * 16), request_id=op.request_id)


# --- bodies without blocks ---------------------------------------------------------------------


def test_an_empty_body_is_three_commands_in_one_transaction(bench):
    """An empty file or a directory's marker has nothing to upload: begin, finalize and the final
    command commit together, each at its own version (as if applied one by one), with one flush."""
    root = bench
    txn, version = root.shard.last_txn_id(), root.shard.commit_version
    found = namespace.put(root, WB, "outputs/empty", b"")
    assert root.shard.last_txn_id() == txn + 1
    assert root.shard.commit_version == version + 3
    ((_, op),) = publish_ops(root).items()
    assert op.phase == PublishPhase.Published and op.object_count == 0
    assert entry(root, "outputs/empty") == found and get_bytes(root, "outputs/empty") == b""
    txn = root.shard.last_txn_id()
    namespace.put(root, WB, "outputs/full", b"x")
    assert root.shard.last_txn_id() >= txn + 2  # a body with a block: the ledger commits before the bytes


def test_an_empty_body_published_again_with_its_request_ids_is_replayed(bench):
    root = bench
    pub = _publication("outputs/again", b"")
    first = publish.run(root, pub)
    version, counts = root.shard.commit_version, _counts(root)
    assert publish.run(root, pub) == first
    assert root.shard.commit_version == version and _counts(root) == counts


def test_an_empty_body_whose_final_command_is_refused_is_cleaned(monkeypatch, bench):
    root = bench
    namespace.put(root, WB, "outputs/kept", b"old")

    def refused(root_, operation_id, components, view):
        raise GenerationConflict("outputs/kept changed under the publication")

    monkeypatch.setattr(publish, "_publish_built", refused)
    with pytest.raises(GenerationConflict):
        namespace.put(root, WB, "outputs/kept", b"")
    monkeypatch.undo()
    phases = sorted(o.phase.name for o in publish_ops(root).values())
    assert phases == ["Cleaned", "Published"]
    assert get_bytes(root, "outputs/kept") == b"old"
    with root.read() as view:
        assert publish.pending(view, root) == []
    assert publish.recover(root) == []


# --- concurrent replacers (threads sharing one Root) -------------------------------------------


def test_two_threads_replacing_one_generation_have_exactly_one_winner(bench):
    root = bench
    namespace.put(root, WB, "outputs/hot", b"gen1")
    for round_ in range(8):
        generation = entry(root, "outputs/hot").generation
        barrier = threading.Barrier(2)
        outcomes = {}

        def replace(tag):
            barrier.wait()
            try:
                outcomes[tag] = namespace.put(
                    root, WB, "outputs/hot", body(3 * BLOCK, f"{round_}-{tag}"), expected_generation=generation
                )
            except GenerationConflict as exc:
                outcomes[tag] = exc

        threads = [threading.Thread(target=replace, args=(t,)) for t in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [t for t, o in outcomes.items() if not isinstance(o, Exception)]
        losers = [t for t, o in outcomes.items() if isinstance(o, GenerationConflict)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert get_bytes(root, "outputs/hot") == body(3 * BLOCK, f"{round_}-{winners[0]}")
        assert entry(root, "outputs/hot").generation == generation + 1
    ops = publish_ops(root).values()
    cleaned = [o for o in ops if o.phase == PublishPhase.Cleaned]
    # A loser that starts once the winner has published conflicts at its precheck, before it
    # has an operation; every other loser's operation is cleaned.
    assert len(cleaned) <= 8 and sum(o.phase == PublishPhase.Published for o in ops) == 9
    assert len(cleaned) + 9 == len(ops)
    for op in cleaned:
        assert revision(root, op.artifact_revision_id) is None
        assert manifest(root, op.artifact_revision_id) == []
        assert present_keys(root.store, block_keys(root, op.artifact_revision_id, 3)) == []


def test_an_expected_revision_is_not_fooled_by_remove_and_recreate(bench):
    """Generation ABA: removing a path and creating it again restarts its generation at 1, so a
    writer that captured generation 1 before would overwrite a different file. A writer that
    names the exact revision it started from loses instead, before anything is uploaded."""
    root = bench
    first = namespace.put(root, WB, "outputs/aba", b"first")
    namespace.remove(root, WB, "outputs/aba")
    second = namespace.put(root, WB, "outputs/aba", b"another file")
    assert second.generation == first.generation == 1  # the ABA a generation cannot see
    before = _counts(root)
    with pytest.raises(GenerationConflict, match="holds revision"):
        namespace.put(root, WB, "outputs/aba", b"stale writer", expected_revision_id=first.artifact_revision_id)
    with pytest.raises(GenerationConflict):
        namespace.remove(root, WB, "outputs/aba", expected_revision_id=first.artifact_revision_id)
    assert _counts(root) == before  # refused at the precheck: no operation, no object
    assert get_bytes(root, "outputs/aba") == b"another file"
    third = namespace.put(root, WB, "outputs/aba", b"current writer", expected_revision_id=second.artifact_revision_id)
    assert third.generation == 2 and get_bytes(root, "outputs/aba") == b"current writer"
    (op,) = [o for o in publish_ops(root).values() if o.artifact_revision_id == third.artifact_revision_id]
    assert op.expected_revision_id == second.artifact_revision_id


def test_the_final_command_rechecks_the_expected_revision(monkeypatch, bench):
    """The precheck spares a doomed upload; the final command decides: a replacement that lands
    between them makes the publication lose (and be cleaned), whatever the generation says."""
    root = bench
    old = namespace.put(root, WB, "outputs/race", b"old")
    real_finalize = publish.finalize

    def finalize_then_race(root_, operation_id, **kwargs):
        real_finalize(root_, operation_id, **kwargs)
        monkeypatch.setattr(publish, "finalize", real_finalize)  # the racer publishes normally
        namespace.remove(root_, WB, "outputs/race")
        namespace.put(root_, WB, "outputs/race", b"racer")  # generation 1 again, another revision

    monkeypatch.setattr(publish, "finalize", finalize_then_race)
    with pytest.raises(GenerationConflict):
        namespace.put(root, WB, "outputs/race", b"mine", expected_revision_id=old.artifact_revision_id)
    assert get_bytes(root, "outputs/race") == b"racer"
    assert sorted(o.phase.name for o in publish_ops(root).values()) == ["Cleaned", "Published", "Published"]


# --- paths the shard can and cannot store --------------------------------------------------------


def test_a_path_too_long_for_the_shard_is_refused_before_any_upload(monkeypatch, bench):
    """The shard bounds its keys (below the normalizer's 4096 bytes): such a path is refused as
    KeyTooLong before the operation begins, so nothing is uploaded for nothing."""
    root = bench
    sent = []
    monkeypatch.setattr(root.store, "put", lambda key, data, **kw: sent.append(key))
    long_path = "outputs/" + "x" * 600
    version = root.shard.commit_version
    with pytest.raises(KeyTooLong):
        namespace.put(root, WB, long_path, body(BLOCK + 1, "long"))
    assert sent == [] and publish_ops(root) == {} and root.shard.commit_version == version
    monkeypatch.undo()
    # The exact boundary: the longest key the final command writes is the Path RevisionRef,
    # 53 bytes plus the path; the engine's family-key limit is root.shard.max_family_key_bytes.
    longest = root.shard.max_family_key_bytes - 53
    with pytest.raises(KeyTooLong):
        namespace.put(root, WB, "outputs/" + "y" * (longest + 1 - 8), b"x")
    fits = "outputs/" + "y" * (longest - 8)
    namespace.put(root, WB, fits, b"fits")  # the engine accepts what the pre-check lets through
    assert get_bytes(root, fits) == b"fits"


def test_the_key_length_check_counts_what_encoding_the_keys_gives_for_every_kind_of_name(bench):
    """The pre-check adds a path's bytes to a fixed overhead instead of encoding its keys: for
    names of every byte width, control characters and depths it must equal the encoded keys'
    length, and refuse exactly what they would not fit."""
    root = bench
    names = ["x", "a b", "\u00e9t\u00e9", "\u65e5\u672c", "\U0001f600" * 3, "\x01\x7f", "-.._", "y" * 255]
    for depth in (1, 2, 5):
        for name in names:
            components = ("outputs",) + (name,) * depth
            assert publish._longest_path_key(root.root_id, components) == max(
                publish._path_key_lengths(root.root_id, components)
            ), components
    limit = root.shard.max_family_key_bytes
    four = "\U0001f600"  # 4 UTF-8 bytes
    fitting = ("outputs", four * ((limit - 53 - 8) // 4))
    publish.check_key_lengths(root, fitting)
    over = ("outputs", fitting[1] + "z" * (limit - publish._longest_path_key(root.root_id, fitting) + 1))
    assert max(publish._path_key_lengths(root.root_id, over)) == limit + 1
    with pytest.raises(KeyTooLong):
        publish.check_key_lengths(root, over)


def test_a_publish_whose_final_command_the_shard_refuses_is_cleaned(monkeypatch, bench):
    """Past the pre-check (switched off here), the engine itself refuses the over-long key in the
    final command: the operation is cleaned, not left Finalizing for recovery to retry forever."""
    root = bench
    monkeypatch.setattr(publish, "check_key_lengths", lambda root, components, index_fields=(): None)
    with pytest.raises(KeyTooLong):
        namespace.put(root, WB, "outputs/" + "x" * 600, body(BLOCK + 1, "long"))
    (op,) = publish_ops(root).values()
    assert op.phase == PublishPhase.Cleaned
    assert present_keys(root.store, block_keys(root, op.artifact_revision_id, 2)) == []
    with root.read() as view:
        assert publish.pending(view, root) == []


def test_a_final_command_that_fails_without_a_predicate_is_cleaned(monkeypatch, bench):
    """Not a lost CAS: the shard itself refuses the final command (its disk fails). The caller is
    told, so the publish is cleaned up at once."""
    root = bench
    namespace.put(root, WB, "outputs/f", b"old")
    real_apply, real_group = root.shard.apply, root.shard.apply_group

    def ours(command):
        return any(o.request_id == command.request_id for o in publish_ops(root).values())

    def apply(command, **kwargs):
        if ours(command):
            raise StoreError("mdb_put: disk I/O error")
        return real_apply(command, **kwargs)

    def apply_group(items):  # a failing disk fails the build inside the write transaction too
        raise StoreError("mdb_put: disk I/O error")

    monkeypatch.setattr(root.shard, "apply", apply)
    monkeypatch.setattr(root.shard, "apply_group", apply_group)
    with pytest.raises(StoreError):
        namespace.put(root, WB, "outputs/f", body(2 * BLOCK, "refused"))
    monkeypatch.setattr(root.shard, "apply", real_apply)
    monkeypatch.setattr(root.shard, "apply_group", real_group)
    (op,) = [o for o in publish_ops(root).values() if o.phase != PublishPhase.Published]
    assert op.phase == PublishPhase.Cleaned
    assert present_keys(root.store, block_keys(root, op.artifact_revision_id, 2)) == []
    assert get_bytes(root, "outputs/f") == b"old"
    assert publish.recover(root) == []


def test_a_command_whose_every_optimistic_build_goes_stale_is_built_inside_the_write_transaction(monkeypatch, bench):
    """A neighbour committing between every build and its apply cannot starve a command: after a
    few stale builds it is built where nothing else commits, and applied once."""
    root = bench
    namespace.put(root, WB, "outputs/f", b"old")
    real_apply = root.shard.apply
    stale = []

    def apply(command, **kwargs):
        stale.append(command.read_version)
        raise ReadVersionStale("moved on", expected=command.read_version, current=command.read_version + 1)

    monkeypatch.setattr(root.shard, "apply", apply)
    namespace.rename(root, WB, "outputs/f", "outputs/g")
    monkeypatch.setattr(root.shard, "apply", real_apply)
    assert len(stale) == root_module.OPTIMISTIC_BUILDS
    assert get_bytes(root, "outputs/g") == b"old"
    assert entry(root, "outputs/f") is None


_BUSY_WRITER = """
import os, sys
from nokvfs.workspace import datadir, namespace
root = datadir.open_root(sys.argv[1], verify=False)
n = 0
while not os.path.exists(sys.argv[2]):
    n += 1
    namespace.put(root, sys.argv[3], "outputs/busy", str(n).encode())
print(n)
"""


def test_renames_and_puts_succeed_while_another_process_commits_in_a_loop(tmp_path, data_dir):
    """What a mount met (EAGAIN from rename(2)) while a script put a file over and over."""
    holder = RootHolder(data_dir)
    root = holder.root
    try:
        wb.create(root, WB)
        namespace.put(root, WB, "outputs/a", b"moving")
        stop = tmp_path / "stop"
        writer = subprocess.Popen(
            [sys.executable, "-c", _BUSY_WRITER, data_dir, str(stop), WB], stdout=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 60
            while entry(root, "outputs/busy") is None and time.monotonic() < deadline:
                time.sleep(0.01)
            for i in range(40):
                namespace.rename(
                    root, WB, "outputs/a" if i % 2 == 0 else "outputs/b", "outputs/b" if i % 2 == 0 else "outputs/a"
                )
                namespace.put(root, WB, "outputs/mine", str(i).encode())
        finally:
            stop.touch()
            out, _ = writer.communicate(timeout=60)
        assert writer.returncode == 0
        assert int(out) >= 20  # the neighbour did commit throughout
        assert get_bytes(root, "outputs/a") == b"moving"
        assert get_bytes(root, "outputs/mine") == b"39"
    finally:
        holder.close()


@pytest.mark.xfail(
    strict=True,
    raises=KeyTooLong,
    reason="engine: LMDB keys are limited to 511 bytes (family keys to 498), so paths over ~440 bytes are KeyTooLong; "
    "the normalizer allows 4096",
)
def test_the_longest_normalized_path_can_be_published(bench):
    path = "outputs/" + "/".join(["y" * 63] * 63)
    path = path + "z" * (4096 - len(path.encode()))
    assert len(path.encode()) == 4096
    namespace.put(bench, WB, path, b"deep")
    assert get_bytes(bench, path) == b"deep"


def test_a_path_of_64_components_can_be_published(bench):
    path = "outputs/" + "/".join("c" for _ in range(63))
    namespace.put(bench, WB, path, b"deep")
    assert get_bytes(bench, path) == b"deep"


def test_publish_into_a_missing_workbench_is_refused_at_begin(root):
    with pytest.raises(NotFound):
        publish.run(root, _publication("outputs/x", b"x"))
    assert publish_ops(root) == {}


def test_a_body_larger_than_one_command_is_published_in_bounded_batches(tmp_path, monkeypatch):
    """Ledger and manifest rows go in batches while Uploading; the final command stays bounded."""
    from nokvfs.workspace import datadir as _datadir
    from nokvfs.workspace import listing as _listing
    from nokvfs.workspace import namespace as _namespace
    from nokvfs.workspace import publish as _publish
    from nokvfs.workspace import reading as _reading
    from nokvfs.workspace import workbench as _workbench

    monkeypatch.setattr(_publish, "ROW_BATCH", 8)
    _datadir.init(str(tmp_path / "d"), block_size=4096)
    root = _datadir.open_root(str(tmp_path / "d"))
    try:
        _workbench.create(root, "w")
        data = bytes(range(256)) * (16 * 40)  # 40 blocks of 4 KiB
        sizes = []
        original = root.shard.apply

        def counting(command, **kwargs):
            sizes.append(len(command.mutations))
            return original(command, **kwargs)

        monkeypatch.setattr(root.shard, "apply", counting)
        entry = _namespace.put(root, "w", "outputs/big", data)
        assert max(sizes) <= 8 + 1 + 16  # a batch plus the operation row, or the bounded final command
        with root.read() as view:
            assert _reading.read(root, _listing.stat(view, root, "w", "outputs/big").entry) == data
            assert view.seek("staged_object", root.root_id, within=root.root_id) is None  # ledger tidied
        assert entry.logical_size == len(data)
    finally:
        root.close()


def test_pending_decodes_phases_first_and_finds_what_a_whole_scan_finds(bench):
    """Recovery's scan passes over terminal operations by their phase alone: it finds exactly
    the operations a scan decoding every row finds, in every phase."""
    from nokvfs.workspace.operations import Rows

    root = bench
    for i in range(5):
        namespace.put(root, WB, f"outputs/done{i}", body(BLOCK, f"done{i}"))  # Published
    uploading = _publication("outputs/uploading", body(BLOCK, "u"))
    publish.begin(root, uploading)
    finalizing = _publication("outputs/finalizing", body(BLOCK, "f"))
    publish.begin(root, finalizing)
    publish.upload(root, finalizing)
    publish.finalize(root, finalizing.operation_id)
    aborted = _publication("outputs/aborted", body(BLOCK, "a"))
    publish.begin(root, aborted)
    publish.abort(root, aborted.operation_id, reason="test")
    rows = publish.ROWS
    with root.read() as view:
        found = rows.pending(view, root)
        whole = Rows.matching(rows, view, root, lambda op: op.phase not in rows.terminal)
        aborted_only = rows.matching(view, root, phases={PublishPhase.Cleaned})
    assert found == whole
    assert {op_id for op_id, _ in found} == {uploading.operation_id, finalizing.operation_id}
    assert {op.phase for _, op in found} == {PublishPhase.Uploading, PublishPhase.Finalizing}
    assert [op_id for op_id, _ in aborted_only] == [aborted.operation_id]  # aborted, then cleaned
    assert PublishPhase.Published not in rows.live and PublishPhase.Uploading in rows.live
