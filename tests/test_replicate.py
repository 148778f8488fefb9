"""Replication of a logical shard to a bucket, against moto's S3 server on loopback.

Source shards are built with the engine directly (tests.conftest.make_shard_env); every write
kind of the recovery outbox is exercised (commands with every predicate kind, lease-clock
observations, owner-epoch advances). "Equal" always means every row of every LMDB tree (raw
cursors, System and the outbox included) and every family read through ReadView at every version.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from nokvfs.engine.command import Absent, Delete, Exists, Generation, Put, ValueEquals
from nokvfs.engine.history import CURRENT_ONLY_TREES
from nokvfs.engine.shard import Shard
from nokvfs.errors import (
    AlreadyExists,
    AmbiguousResult,
    IntegrityError,
    OwnerFenced,
    PreconditionFailed,
)
from nokvfs.objects.s3 import S3Store
from nokvfs.objects.store import ObjectStore
from nokvfs.replicate import Replicator, ShardBucket, restore
from nokvfs.replicate import manifest as mf
from nokvfs.replicate.errors import (
    ManifestError,
    ManifestGenerationInvalid,
    PackConflict,
    PackCorrupt,
    ReplicaDiverged,
)
from nokvfs.schema import keys as family_keys
from nokvfs.schema.enums import OutboxRecordKind, WorkspaceState
from nokvfs.schema.keys import RootFenceKey
from nokvfs.schema.records import RootFence, WorkspaceCurrent
from tests.conftest import make_shard_env, sigkill_once_ready

pytest_plugins = ["tests.s3_fixtures"]

FAST = {"retry_base_delay": 0.01, "retry_max_delay": 0.05}
PREFIX = "replica/test"


def s3_store(bucket, endpoint, prefix=PREFIX, **options) -> S3Store:
    return S3Store(bucket, prefix, endpoint_url=endpoint, **{**FAST, **options})


class Interposed(ObjectStore):
    """Delegates to `inner`; `before_put(key, kwargs)` and `after_put(key, kwargs)` hooks let a
    test pause, fail or inspect requests. Every request is recorded in `calls`."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner
        self.url = inner.url
        self.calls: list[tuple] = []
        self.before_put = None
        self.after_put = None
        self.before_head = None
        self.before_delete = None
        self._lock = threading.Lock()

    def _record(self, *call):
        with self._lock:
            self.calls.append(call)

    def put(self, key, data, **kw):
        self._record("put", key, {k: v for k, v in kw.items() if k != "metadata"})
        if self.before_put:
            self.before_put(key, kw)
        etag = self.inner.put(key, data, **kw)
        if self.after_put:
            self.after_put(key, kw)
        return etag

    def put_file(self, key, path, **kw):
        self._record("put_file", key, {k: v for k, v in kw.items() if k not in ("metadata", "on_multipart")})
        if self.before_put:
            self.before_put(key, kw)
        etag = self.inner.put_file(key, path, **kw)
        if self.after_put:
            self.after_put(key, kw)
        return etag

    def get(self, key, start=0, length=None):
        self._record("get", key)
        return self.inner.get(key, start, length)

    def head(self, key):
        self._record("head", key)
        if self.before_head:
            self.before_head(key)
        return self.inner.head(key)

    def delete(self, key):
        self._record("delete", key)
        if self.before_delete:
            self.before_delete(key)
        return self.inner.delete(key)

    def list(self, prefix=""):
        self._record("list", prefix)
        return self.inner.list(prefix)

    def multipart_uploads(self, key):
        self._record("multipart_uploads", key)
        return self.inner.multipart_uploads(key)

    def create_multipart(self, key, **kw):
        return self.inner.create_multipart(key, **kw)

    def upload_part(self, *a):
        return self.inner.upload_part(*a)

    def complete_multipart(self, *a, **kw):
        return self.inner.complete_multipart(*a, **kw)

    def abort_multipart(self, *a):
        return self.inner.abort_multipart(*a)

    def statfs(self):
        return self.inner.statfs()


# --- building source shards ------------------------------------------------------------------


def key(n: int) -> bytes:
    return b"\x01" * 16 + n.to_bytes(4, "big")


def populate(env, commands: int, *, seed: int = 1) -> None:
    """Commands with puts, deletes, events and every predicate kind; lease-clock observations;
    one owner-epoch advance. Deterministic for a seed."""
    rng = random.Random(seed)
    fence_key = RootFenceKey(env.root_id).encode()
    for n in range(commands):
        shard = env.shard
        with shard.read() as view:
            fence_raw = view.get("root_fence", fence_key)
        predicates = [
            Exists("root_fence", fence_key),
            Generation("root_fence", fence_key, RootFence, "placement_generation", env.placement_generation),
            ValueEquals("root_fence", fence_key, fence_raw),
            Absent("path_current", b"\x7f" * 20),
        ][: rng.randint(0, 4)]
        mutations = [Put("path_current", key(rng.randrange(64)), b"\x02" + os.urandom(rng.randint(1, 300)))]
        if rng.random() < 0.3:
            mutations.append(Delete("path_current", key(rng.randrange(64))))
        if rng.random() < 0.2:
            marker = WorkspaceCurrent(bytes([n % 3]) * 16, n, rng.choice(list(WorkspaceState)), None, 1, n)
            mutations.append(Put("workspace_current", env.root_id + b"\x00\x03wb" + bytes([n % 7]), marker.encode()))
        env.apply(
            mutations=mutations,
            predicates=predicates,
            events=[b"\x02event-%d" % n] if rng.random() < 0.5 else [],
            result=b"r%d" % n,
        )
        if rng.random() < 0.15:
            shard.observe_lease_clock(1_700_000_000_000 + n * 1000)
        if n == commands // 2:
            shard.advance_owner_epoch(shard.owner_epoch + 1)


def raw_rows(shard: Shard) -> dict:
    """Every row of every named LMDB database, via raw cursors."""
    with shard._env.begin() as txn:
        return {name: list(txn.cursor(db).iternext()) for name, db in shard._dbs.items()}


def scan(view, tree: str) -> list:
    rows, position = [], b""
    while (found := view.seek(tree, position)) is not None:
        rows.append(found)
        position = found[0] + b"\x00"
    return rows


def assert_equal_shards(source: Shard, restored: Shard, *, versions=None) -> None:
    assert restored.logical_shard_id == source.logical_shard_id
    assert restored.recovery_tail == source.recovery_tail
    assert restored.commit_version == source.commit_version
    assert restored.owner_epoch == source.owner_epoch
    assert restored.lease_clock_ms == source.lease_clock_ms
    assert restored.history_floor == source.history_floor
    assert raw_rows(restored) == raw_rows(source)
    for version in versions or range(max(1, source.history_floor), source.commit_version + 1):
        with source.read(version) as a, restored.read(version) as b:
            for family in family_keys.FAMILIES:
                if family.name in CURRENT_ONLY_TREES and version != source.commit_version:
                    continue  # read at the current version only (they write no History)
                assert scan(a, family.name) == scan(b, family.name), (family.name, version)
                for n in range(64):
                    assert a.get("path_current", key(n)) == b.get("path_current", key(n))


def current_json(store: S3Store, shard) -> dict:
    from nokvfs.schema import canonical_json

    return canonical_json.loads(store.get(mf.shard_prefix(shard.logical_shard_id) + mf.CURRENT))


def pack_keys(store, shard) -> set[str]:
    prefix = mf.shard_prefix(shard.logical_shard_id)
    return {i.key[len(prefix) :] for i in store.list(prefix + "packs/")}


@pytest.fixture
def source(tmp_path):
    env = make_shard_env(tmp_path / "source")
    yield env
    env.shard.close()


@pytest.fixture
def store(s3_bucket, s3_endpoint):
    with s3_store(s3_bucket, s3_endpoint) as s:
        yield s


def restored_shard(store, tmp_path, name="restored", **kw):
    result = restore(store, str(tmp_path / name), **kw)
    return result, Shard.open(result.path, verify=True)


# --- push and restore -----------------------------------------------------------------------


def test_restore_on_an_empty_directory_equals_the_source(source, store, tmp_path):
    replicator = Replicator(source.shard, store, checkpoint_packs=4)
    first = replicator.push_once()
    assert first.kind == "checkpoint" and first.generation == 1
    for round_ in range(7):
        populate(source, 6, seed=round_)
        result = replicator.push_once()
        assert result.kind == "increment" and result.lag == 0
    manifest, _ = replicator.bucket.read()
    assert manifest.head.lsn == source.shard.recovery_tail.applied_lsn
    assert manifest.checkpoint.through_generation > 1, "a checkpoint was swapped in after 4 increments"
    os.makedirs(tmp_path / "empty")
    result, restored = restored_shard(store, tmp_path, "empty")
    with restored:
        assert result.applied_lsn == source.shard.recovery_tail.applied_lsn
        assert_equal_shards(source.shard, restored)


def test_history_pruning_replays_to_an_identical_replica(source, store, tmp_path):
    replicator = Replicator(source.shard, store, checkpoint_packs=100)
    replicator.push_once()  # an empty checkpoint: everything below is replayed from increments
    rng = random.Random(11)
    for round_ in range(6):
        populate(source, 25, seed=100 + round_)
        shard = source.shard
        start = b""
        while True:  # prune in small batches, each one outbox record
            outcome = shard.prune_history(
                owner_epoch=shard.owner_epoch,
                floor_version=shard.commit_version - rng.randrange(10),
                start_key=start,
                max_rows=rng.randint(3, 30),
            )
            if outcome.next_key is None:
                break
            start = outcome.next_key
        replicator.push_once()
    kinds = [e.header.record_kind for e in source.shard.outbox_entries()]
    assert kinds.count(OutboxRecordKind.HistoryPrune) >= 6 and source.shard.history_floor > 0
    manifest, _ = replicator.bucket.read()
    assert manifest.checkpoint.through_generation == 1 and len(manifest.increments) == 6
    result, restored = restored_shard(store, tmp_path)
    with restored:
        assert_equal_shards(source.shard, restored)


def test_the_first_write_is_if_none_match_and_every_later_one_if_match_the_read_etag(source, store):
    spy = Interposed(store)
    replicator = Replicator(source.shard, spy)
    replicator.push_once()
    populate(source, 2)
    replicator.push_once()
    populate(source, 2)
    replicator.push_once()
    current = mf.shard_prefix(source.shard.logical_shard_id) + mf.CURRENT
    writes = [c[2] for c in spy.calls if c[0] == "put" and c[1] == current]
    assert writes[0] == {"if_none_match": True}
    assert all(set(w) == {"if_match"} and w["if_match"] for w in writes[1:]) and len(writes) == 3
    packs = [c for c in spy.calls if c[0] in ("put", "put_file") and "/packs/" in c[1]]
    assert all(c[2] == {"if_none_match": True} for c in packs)
    # Every pack carries its SHA-256 and size as metadata, matching the manifest.
    manifest, _ = replicator.bucket.read()
    for d in (manifest.checkpoint, *manifest.increments):
        info = store.head(replicator.bucket.key(d.key))
        assert info.size == d.size
        assert info.metadata["nokvfs-sha256"] == d.sha256.hex() and info.metadata["nokvfs-size"] == str(d.size)


def test_a_push_with_nothing_new_publishes_nothing(source, store):
    replicator = Replicator(source.shard, store)
    replicator.push_once()
    assert replicator.push_once().kind == "none"
    assert replicator.bucket.read()[0].generation == 1


def test_pack_limits_split_a_backlog_and_push_all_bounds_the_lag(source, store, tmp_path):
    replicator = Replicator(source.shard, store, max_pack_records=5)
    replicator.push_once()
    populate(source, 12)
    result = replicator.push_once()
    assert result.records == 5 and result.lag > 0
    while result.lag:
        result = replicator.push_once()
    assert replicator.status()["lag"] == 0
    _, restored = restored_shard(store, tmp_path)
    with restored:
        assert_equal_shards(source.shard, restored)


def test_a_checkpoint_pack_large_enough_for_multipart_upload_restores(source, s3_bucket, s3_endpoint, tmp_path):
    with s3_store(s3_bucket, s3_endpoint, multipart_threshold=0) as store:  # every file in parts
        replicator = Replicator(source.shard, store)
        replicator.push_once()
        populate(source, 3)
        replicator.push_once()
        replicator.checkpoint_once()
        _, restored = restored_shard(store, tmp_path)
        with restored:
            assert_equal_shards(source.shard, restored)


def test_restore_refuses_a_directory_that_is_not_empty(source, store, tmp_path):
    Replicator(source.shard, store).push_once()
    target = tmp_path / "busy"
    target.mkdir()
    (target / "something").write_text("x")
    with pytest.raises(AlreadyExists):
        restore(store, str(target))


# --- contention ----------------------------------------------------------------------------


def test_two_writers_racing_on_current_one_wins_and_the_other_merges_and_retries(source, store, tmp_path):
    Replicator(source.shard, store).push_once()
    populate(source, 6)
    tail = source.shard.recovery_tail.applied_lsn
    current = mf.shard_prefix(source.shard.logical_shard_id) + mf.CURRENT
    barrier = threading.Barrier(2, timeout=30)
    first_write = threading.local()

    def hold_first_manifest_write(key_, kw):
        if key_ == current and not getattr(first_write, "done", False):
            first_write.done = True
            barrier.wait()  # both proposals were built from the same read

    spies = [Interposed(store), Interposed(store)]
    for spy in spies:
        spy.before_put = hold_first_manifest_write
    a = Replicator(source.shard, spies[0])
    b = Replicator(source.shard, spies[1])
    results = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("a", a.push_once(through_lsn=tail - 3))),
        threading.Thread(target=lambda: results.__setitem__("b", b.push_once())),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    manifest, _ = a.bucket.read()
    assert manifest.head.lsn == tail
    writes = {name: [c for c in spy.calls if c[0] == "put" and c[1] == current] for name, spy in zip("ab", spies)}
    # One proposal won the race; the loser reread, merged and (if anything was left) retried.
    if results["b"].generation == 2 or results["a"].kind == "none":
        assert results["a"].kind == "none" and len(writes["a"]) == 1
        assert [i.last_lsn for i in manifest.increments] == [tail]
    else:
        assert results["a"].generation == 2 and len(writes["b"]) == 2
        assert [(i.first_lsn, i.last_lsn) for i in manifest.increments] == [(3, tail - 3), (tail - 2, tail)]
        assert results["b"].generation == 3
    _, restored = restored_shard(store, tmp_path)
    with restored:
        assert_equal_shards(source.shard, restored)


def test_a_checkpoint_swap_that_loses_to_a_push_keeps_the_later_increment(source, store, tmp_path):
    replicator = Replicator(source.shard, store, auto_checkpoint=False)
    replicator.push_once()
    for seed in range(3):
        populate(source, 3, seed=seed)
        replicator.push_once()
    current = mf.shard_prefix(source.shard.logical_shard_id) + mf.CURRENT
    spy = Interposed(store)
    checkpointer = Replicator(source.shard, spy, auto_checkpoint=False)
    paused, release = threading.Event(), threading.Event()

    def pause_the_swap(key_, kw):
        if key_ == current and not paused.is_set():
            paused.set()
            release.wait(30)

    spy.before_put = pause_the_swap
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("r", checkpointer.checkpoint_once()))
    worker.start()
    assert paused.wait(30)
    populate(source, 3, seed=9)
    pushed = replicator.push_once()  # wins the race against the paused swap
    release.set()
    worker.join(60)
    result = outcome["r"]
    manifest, _ = replicator.bucket.read()
    assert result is not None and manifest.checkpoint.key == result.key
    assert [i.key for i in manifest.increments] == [pushed.key], "the increment published meanwhile is kept"
    assert manifest.retained and manifest.retained[0].head == manifest.checkpoint.through
    assert len([c for c in spy.calls if c[0] in ("put_file",) and "/checkpoints/" in c[1]]) == 1, "built once"
    _, restored = restored_shard(store, tmp_path)
    with restored:
        assert_equal_shards(source.shard, restored)


def test_an_ambiguous_manifest_write_that_landed_is_recognised_by_its_publication_id(source, store):
    spy = Interposed(store)
    replicator = Replicator(source.shard, spy)
    replicator.push_once()
    populate(source, 2)
    current = mf.shard_prefix(source.shard.logical_shard_id) + mf.CURRENT

    def lose_the_answer(key_, kw):
        if key_ == current:
            spy.after_put = None
            raise AmbiguousResult("sent, no answer")

    spy.after_put = lose_the_answer
    result = replicator.push_once()
    assert result.kind == "increment" and result.generation == 2
    assert replicator.bucket.read()[0].generation == 2
    assert len([c for c in spy.calls if c[0] == "put" and c[1] == current]) == 2, "no blind retry of the write"


def test_an_ambiguous_manifest_write_that_did_not_land_is_merged_and_retried(source, store):
    spy = Interposed(store)
    replicator = Replicator(source.shard, spy)
    replicator.push_once()
    populate(source, 2)
    current = mf.shard_prefix(source.shard.logical_shard_id) + mf.CURRENT

    def fail_before_sending(key_, kw):
        if key_ == current:
            spy.before_put = None
            raise AmbiguousResult("connection reset")

    spy.before_put = fail_before_sending
    result = replicator.push_once()
    manifest, _ = replicator.bucket.read()
    assert result.generation == manifest.generation == 2
    assert manifest.head.lsn == source.shard.recovery_tail.applied_lsn


def test_a_pack_retry_accepts_existing_bytes_only_when_sha256_and_size_match(source, store):
    bucket = ShardBucket(store, source.shard.logical_shard_id)
    data = b"pack bytes"
    import hashlib

    sha = hashlib.sha256(data).digest()
    relative = mf.increment_key(2, mf.new_uuid7_hex())
    bucket.upload(relative, data=data, sha256=sha, size=len(data), kind="increment", generation=2)
    bucket.upload(relative, data=data, sha256=sha, size=len(data), kind="increment", generation=2)  # a retry
    other = b"other bytes"
    with pytest.raises(PackConflict):
        bucket.upload(
            relative, data=other, sha256=hashlib.sha256(other).digest(), size=len(other), kind="increment", generation=2
        )
    with pytest.raises(PackConflict):
        bucket.upload(relative, data=data + b"!", sha256=sha, size=len(data) + 1, kind="increment", generation=2)


# --- a killed pusher -----------------------------------------------------------------------


def _push_then_die(path, bucket, endpoint, uploaded):
    """Child: push one increment but block forever between the pack upload and the manifest write."""
    from nokvfs.replicate import remote

    def never_publish(self, proposal, etag):
        uploaded.set()
        time.sleep(600)

    remote.ShardBucket.publish = never_publish
    shard = Shard.open(path, verify=False)
    Replicator(shard, s3_store(bucket, endpoint)).push_once()


def test_a_pusher_killed_between_pack_upload_and_manifest_write(source, store, s3_bucket, s3_endpoint, tmp_path):
    replicator = Replicator(source.shard, store, auto_checkpoint=False)
    replicator.push_once()
    populate(source, 5)
    before = pack_keys(store, source.shard)
    sigkill_once_ready(_push_then_die, (source.path, s3_bucket, s3_endpoint), timeout=120)
    (orphan,) = pack_keys(store, source.shard) - before
    assert orphan.startswith(mf.INCREMENTS)
    assert replicator.bucket.read()[0].generation == 1, "the killed push published nothing"
    result = replicator.push_once()
    assert result.kind == "increment" and result.key != orphan
    manifest, _ = replicator.bucket.read()
    assert orphan not in manifest.live_keys()
    _, restored = restored_shard(store, tmp_path)
    with restored:
        assert_equal_shards(source.shard, restored)
    # Once a checkpoint's cutoff reaches the orphan's generation, cleanup removes it.
    populate(source, 2)
    replicator.push_once()
    report = replicator.checkpoint_once().cleanup
    assert orphan in report.deleted
    assert orphan not in pack_keys(store, source.shard)


# --- integrity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate"])
@pytest.mark.parametrize("which", ["checkpoint", "increment"])
def test_a_corrupt_or_truncated_pack_is_an_integrity_error_and_materialises_nothing(
    source, store, s3_client, s3_bucket, tmp_path, which, damage
):
    replicator = Replicator(source.shard, store)
    replicator.push_once()
    populate(source, 4)
    replicator.push_once()
    manifest, _ = replicator.bucket.read()
    descriptor = manifest.checkpoint if which == "checkpoint" else manifest.increments[0]
    full = f"{PREFIX}/{replicator.bucket.key(descriptor.key)}"
    obj = s3_client.get_object(Bucket=s3_bucket, Key=full)
    data = bytearray(obj["Body"].read())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        del data[-7:]
    s3_client.put_object(Bucket=s3_bucket, Key=full, Body=bytes(data), Metadata=obj["Metadata"])
    target = tmp_path / "restore-here"
    with pytest.raises(IntegrityError) as info:
        restore(store, str(target))
    assert isinstance(info.value, PackCorrupt)
    assert not target.exists()
    assert os.listdir(tmp_path) == ["source"], "no temporary directory is left behind"


def test_a_malformed_current_fails_before_any_pack_is_read(source, store, tmp_path):
    replicator = Replicator(source.shard, store)
    replicator.push_once()
    current = replicator.bucket.key(mf.CURRENT)
    body = store.get(current).replace(b'"retained":[]', b'"retained":[],"extra":1')
    store.put(current, body)
    spy = Interposed(store)
    with pytest.raises(ManifestError):
        restore(spy, str(tmp_path / "r"))
    with pytest.raises(ManifestError):
        Replicator(source.shard, spy).push_once()
    assert not [c for c in spy.calls if "/packs/" in str(c[1])]
    assert not (tmp_path / "r").exists()


def test_a_current_whose_generation_goes_back_is_refused(source, store):
    replicator = Replicator(source.shard, store)
    replicator.push_once()
    current = replicator.bucket.key(mf.CURRENT)
    old = store.get(current)
    populate(source, 2)
    replicator.push_once()
    store.put(current, old)  # generation 2 replaced by generation 1 behind our back
    with pytest.raises(ManifestGenerationInvalid):
        replicator.push_once()
    store.delete(current)
    with pytest.raises(ManifestGenerationInvalid):
        replicator.push_once()


def test_a_restored_replica_that_has_not_claimed_ownership_cannot_publish(source, store, tmp_path):
    Replicator(source.shard, store).push_once()
    _, restored = restored_shard(store, tmp_path)
    with restored:
        assert not os.path.exists(os.path.join(restored.path, "replica-owner.json"))
        restored.observe_lease_clock(42)
        with pytest.raises(OwnerFenced):
            Replicator(restored, store).push_once()
        assert Replicator(source.shard, store).bucket.read()[0].generation == 1


def test_a_local_shard_with_another_history_is_never_published(source, store, tmp_path):
    Replicator(source.shard, store).push_once()
    _, restored = restored_shard(store, tmp_path)
    with restored:
        source.apply(mutations=[Put("path_current", key(1), b"\x02source")])
        Replicator(source.shard, store).push_once()
        generation = Replicator(source.shard, store).status()["generation"]
        restored.observe_lease_clock(42)  # another record at the same LSN
        with pytest.raises(ReplicaDiverged):
            Replicator(restored, store).claim_ownership()
        restored.observe_lease_clock(43)  # and ahead of the bucket: still another history
        with pytest.raises(ReplicaDiverged):
            Replicator(restored, store).claim_ownership()
        assert Replicator(source.shard, store).status()["generation"] == generation


# --- checkpoints, retention, cleanup -------------------------------------------------------------


def test_a_checkpoint_after_n_increments_and_cleanup_deletes_only_older_keys_never_current(
    source, store, s3_client, s3_bucket
):
    replicator = Replicator(source.shard, store, checkpoint_packs=3, retained_checkpoints=1)
    bucket = replicator.bucket
    replicator.push_once()
    first = bucket.read()[0].checkpoint.key
    # Keys cleanup must leave alone: a foreign key, and an orphan after any cutoff so far.
    foreign = f"{PREFIX}/{bucket.key('packs/increments/not-a-protocol-key.pack')}"
    s3_client.put_object(Bucket=s3_bucket, Key=foreign, Body=b"x")
    late_orphan = mf.increment_key(10_000, mf.new_uuid7_hex())
    store.put(bucket.key(late_orphan), b"orphan")
    early_orphan = mf.increment_key(2, mf.new_uuid7_hex())
    store.put(bucket.key(early_orphan), b"orphan")
    checkpoints = []
    for round_ in range(9):
        populate(source, 2, seed=round_)
        replicator.push_once()
        manifest, _ = bucket.read()
        if manifest.checkpoint.key not in checkpoints + [first]:
            checkpoints.append(manifest.checkpoint.key)
            # The threshold is counted on the active tail only.
            assert len(manifest.retained[0].increments) == 3
    manifest, _ = bucket.read()
    assert len(checkpoints) == 3
    live = manifest.live_keys()
    present = pack_keys(store, source.shard)
    assert live <= present
    assert manifest.retained and len(manifest.retained) == 1
    # C0 (the first checkpoint) and its tail were deleted once C2 replaced C1; so was the
    # early orphan; the late orphan and the foreign key stay; current is never deleted.
    assert first not in present and early_orphan not in present
    assert late_orphan in present and "packs/increments/not-a-protocol-key.pack" in present
    assert present - live == {late_orphan, "packs/increments/not-a-protocol-key.pack"}
    assert store.head(bucket.key(mf.CURRENT)) is not None


@pytest.mark.long
def test_cleanup_rereads_current_before_each_batch_of_at_most_1000_and_follows_continuations(
    source, store, s3_client, s3_bucket
):
    replicator = Replicator(source.shard, store, auto_checkpoint=False)
    replicator.push_once()
    prefix = f"{PREFIX}/{replicator.bucket.prefix}"
    orphans = [mf.increment_key(1, mf.new_uuid7_hex()) for _ in range(1_003)]
    for relative in orphans:
        s3_client.put_object(Bucket=s3_bucket, Key=prefix + relative, Body=b"")
    spy = Interposed(store)
    bucket = ShardBucket(spy, source.shard.logical_shard_id)
    report = bucket.cleanup(1)
    assert sorted(report.deleted) == sorted(orphans) and not report.errors
    current = bucket.key(mf.CURRENT)
    reads, deletes = [], 0
    for call in spy.calls:
        if call[0] == "get" and call[1] == current:
            reads.append(deletes)
        elif call[0] == "delete":
            assert call[1] != current
            deletes += 1
    # current was reread before each batch, and a batch is at most 1,000 keys
    assert len(reads) == 2 and reads[0] == 0 and 999 <= reads[1] <= 1000 and deletes == 1_003
    assert bucket.read()[0].checkpoint.key in pack_keys(store, source.shard)


def test_a_checkpoint_while_writers_run_restores_to_the_same_shard(source, store, tmp_path):
    replicator = Replicator(source.shard, store, auto_checkpoint=False)
    replicator.push_once()
    populate(source, 10)
    replicator.push_once()
    stop = threading.Event()
    writes = []

    def writer():
        n = 0
        while not stop.is_set() and n < 200:
            writes.append(source.apply(mutations=[Put("path_current", key(1000 + n), b"\x02w")]))
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        result = replicator.checkpoint_once()
    finally:
        stop.set()
        thread.join(60)
    assert result is not None and writes
    while replicator.push_once().kind != "none":
        pass
    _, restored = restored_shard(store, tmp_path)
    with restored:
        assert_equal_shards(
            source.shard, restored, versions=range(source.shard.commit_version - 5, source.shard.commit_version + 1)
        )


def test_a_failed_cleanup_never_fails_the_push_and_is_retried_later(source, store):
    from nokvfs.errors import StoreError

    spy = Interposed(store)
    replicator = Replicator(source.shard, spy, checkpoint_packs=2, retained_checkpoints=0)
    replicator.push_once()
    first = replicator.bucket.read()[0].checkpoint.key

    def refuse(key_):
        raise StoreError("delete refused")

    spy.before_delete = refuse
    for seed in range(2):
        populate(source, 2, seed=seed)
        result = replicator.push_once()  # the second push triggers a checkpoint and its cleanup
        assert result.kind == "increment"
    manifest, _ = replicator.bucket.read()
    assert manifest.checkpoint.key != first and not manifest.retained
    assert first in pack_keys(store, source.shard), "the refused delete left the old checkpoint"
    spy.before_delete = None
    replicator.push_once()  # nothing new to push: the pending cleanup is retried
    assert first not in pack_keys(store, source.shard)
    assert pack_keys(store, source.shard) == manifest.live_keys()


def test_a_stale_restore_that_finds_a_pack_removed_rereads_current_and_restarts(source, store, tmp_path):
    replicator = Replicator(source.shard, store, auto_checkpoint=False, retained_checkpoints=0)
    replicator.push_once()
    populate(source, 3)
    replicator.push_once()
    spy = Interposed(store)
    moved = []

    def compact_meanwhile(key_):
        if "/packs/" in key_ and not moved:
            moved.append(key_)
            populate(source, 2, seed=7)
            replicator.push_once()
            replicator.checkpoint_once()  # retains nothing: cleanup removes what restore was reading

    spy.before_head = compact_meanwhile
    result, restored = restored_shard(spy, tmp_path)
    with restored:
        assert moved and result.generation == replicator.bucket.read()[0].generation
        assert_equal_shards(source.shard, restored)


# --- ownership ---------------------------------------------------------------------------------


def test_a_fenced_old_owner_cannot_publish_and_its_commands_fail(source, store, tmp_path):
    old = Replicator(source.shard, store)
    old.push_once()
    populate(source, 3)
    old.push_once()
    _, new_shard = restored_shard(store, tmp_path, "new-owner")
    with new_shard:
        new = Replicator(new_shard, store)
        new.claim_ownership()
        claimed = new.bucket.read()[0]
        assert claimed.owner_epoch == source.shard.owner_epoch + 1 == new_shard.owner_epoch
        stale_command = source.command(mutations=[Put("path_current", key(5), b"\x02stale")])
        source.apply(mutations=[Put("path_current", key(6), b"\x02written before the fence was seen")])
        with pytest.raises(OwnerFenced):
            old.push_once()
        assert old.fenced and old.status()["fenced"]
        assert new.bucket.read()[0].generation == claimed.generation, "the old owner published nothing"
        # The stale owner's shard now fences every command built at its old epoch.
        with pytest.raises(OwnerFenced):
            source.shard.apply(stale_command)
        with pytest.raises(OwnerFenced):
            old.push_once()
        with pytest.raises(OwnerFenced):
            old.checkpoint_once()
        # A process started later on the fenced machine is fenced too, although its local epoch
        # now equals the bucket's: the owner id it keeps is not the one `current` names.
        assert source.shard.owner_epoch == claimed.owner_epoch
        with pytest.raises(OwnerFenced):
            Replicator(source.shard, store).push_once()
        # The new owner goes on publishing.
        new_shard.observe_lease_clock(1_800_000_000_000)
        assert new.push_once().kind == "increment"
        assert new.bucket.read()[0].owner_epoch == claimed.owner_epoch
        _, again = restored_shard(store, tmp_path, "third")
        with again:
            assert again.recovery_tail == new_shard.recovery_tail
            assert again.owner_epoch == new_shard.owner_epoch


def test_a_claim_that_races_the_old_owner_diverges_and_publishes_nothing(source, store, tmp_path):
    old = Replicator(source.shard, store)
    old.push_once()
    _, candidate = restored_shard(store, tmp_path)
    with candidate:
        populate(source, 2)
        old.push_once()  # the old owner publishes after the candidate restored
        generation = old.bucket.read()[0].generation
        with pytest.raises(ReplicaDiverged):
            Replicator(candidate, store).claim_ownership()
        assert old.bucket.read()[0].generation == generation
        assert old.push_once().kind in ("none", "increment")


# --- the loop -------------------------------------------------------------------------------------


def test_run_forever_keeps_the_lag_bounded_and_status_reports_it(source, store):
    replicator = Replicator(source.shard, store, max_pack_records=3)
    replicator.start(interval=0.05)
    try:
        populate(source, 10)
        deadline = time.monotonic() + 60
        while replicator.status()["lag"] and time.monotonic() < deadline:
            time.sleep(0.05)
        status = replicator.status()
        assert status["lag"] == 0 and status["head_lsn"] == source.shard.recovery_tail.applied_lsn
        assert status["last_error"] is None and status["generation"] > 1
    finally:
        replicator.stop()


def test_run_forever_stops_when_the_owner_is_fenced(source, store, tmp_path):
    replicator = Replicator(source.shard, store)
    replicator.push_once()
    _, other = restored_shard(store, tmp_path)
    with other:
        Replicator(other, store).claim_ownership()
        thread = replicator.start(interval=0.05)
        thread.join(30)
        assert not thread.is_alive() and isinstance(replicator.last_error, OwnerFenced)


def test_push_gives_up_after_bounded_contention(source, store):
    spy = Interposed(store)
    replicator = Replicator(source.shard, spy, max_attempts=3)
    replicator.push_once()
    populate(source, 1)
    current = replicator.bucket.key(mf.CURRENT)

    def always_lose(key_, kw):
        if key_ == current:
            raise PreconditionFailed("412")

    spy.before_put = always_lose
    with pytest.raises(PreconditionFailed):
        replicator.push_once()
