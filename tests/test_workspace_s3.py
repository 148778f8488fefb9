"""The Workbench facade on the S3 store, against the loopback moto server: the same publish, get,
append and remove flow with multi-block bodies, the multipart path with the upload id in the
StagedObject ledger before any part is sent, and crash recovery that aborts uploads and deletes
objects by ledger (never by listing).
"""

from __future__ import annotations

import threading

import pytest

from nokvfs.errors import GenerationConflict, IntegrityError, ObjectMissing
from nokvfs.objects.s3 import S3Store
from nokvfs.objects.store import MIN_PART_SIZE, MiB
from nokvfs.schema.enums import PublishPhase, ReferenceKind, StagedProviderState
from nokvfs.workspace import append, datadir, namespace, reading
from nokvfs.workspace import workbench as wb
from tests.workspace_fixtures import (
    BLOCK,
    KILLED,
    WB,
    RootHolder,
    block_keys,
    body,
    crash_worker,
    entry,
    gc_candidates,
    get_bytes,
    ledger,
    manifest,
    present_keys,
    publish_ops,
    refs_to,
    revision,
    run_crash_child,
)

pytest_plugins = ["tests.s3_fixtures"]

PREFIX = "tenant/shard"


def _s3_data_dir(tmp_path, bucket, endpoint, *, block_size=BLOCK, name="data"):
    path = str(tmp_path / name)
    config = datadir.init(path, store=f"s3://{bucket}/{PREFIX}", endpoint_url=endpoint, block_size=block_size)
    assert config["store"] == f"s3://{bucket}/{PREFIX}" and config["endpoint_url"] == endpoint
    return path


@pytest.fixture
def s3_dir(tmp_path, s3_bucket, s3_endpoint):
    return _s3_data_dir(tmp_path, s3_bucket, s3_endpoint)


@pytest.fixture
def s3_holder(s3_dir):
    holder = RootHolder(s3_dir)
    wb.create(holder.root, WB)
    yield holder
    holder.close()


def _bucket_keys(client, bucket):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def _uploads(client, bucket):
    return client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def test_publish_get_append_remove_on_s3(s3_holder, s3_bucket, s3_client):
    root = s3_holder.root
    assert isinstance(root.store, S3Store)
    data = body(5 * BLOCK + 77, "s3-body")
    first = namespace.put(root, WB, "outputs/weights.bin", data)
    assert get_bytes(root, "outputs/weights.bin") == data
    keys_ = block_keys(root, first.artifact_revision_id, 6)
    assert _bucket_keys(s3_client, s3_bucket) == sorted(f"{PREFIX}/{k}" for k in keys_)
    assert reading.read(root, first, BLOCK - 3, BLOCK + 6) == data[BLOCK - 3 : 2 * BLOCK + 3]

    delta = body(2 * BLOCK, "s3-delta")
    appended = append.append(root, WB, "outputs/weights.bin", delta)
    assert get_bytes(root, "outputs/weights.bin") == data + delta
    assert (appended.dependency_count, appended.dependency_depth) == (1, 1)
    assert manifest(root, appended.artifact_revision_id)[:6] == manifest(root, first.artifact_revision_id)
    assert [k.reference_kind for k, _ in refs_to(root, first.artifact_revision_id)] == [
        ReferenceKind.RevisionDependency
    ]

    renamed = namespace.rename(root, WB, "outputs/weights.bin", "outputs/final.bin")
    assert get_bytes(root, "outputs/final.bin") == data + delta
    removed = namespace.remove(root, WB, "outputs/final.bin")
    assert removed == renamed
    assert entry(root, "outputs/final.bin") is None
    rev = revision(root, appended.artifact_revision_id)
    assert rev.strong_reference_count == 0 and rev.last_zero_ref_version == root.shard.commit_version
    assert rev.reference_epoch in gc_candidates(root, appended.artifact_revision_id)
    assert all(op.phase == PublishPhase.Published for op in publish_ops(root).values())

    # Everything survives a reopen (and recovery finds nothing to do).
    root = s3_holder.reopen()
    namespace.put(root, WB, "logs/after-reopen", b"ok")
    assert get_bytes(root, "logs/after-reopen") == b"ok"


def test_concurrent_replacers_on_s3_have_one_winner_and_the_loser_is_cleaned(s3_holder):
    root = s3_holder.root
    namespace.put(root, WB, "outputs/hot", b"v1")
    barrier = threading.Barrier(2)
    outcomes = {}

    def replace(tag):
        barrier.wait()
        try:
            outcomes[tag] = namespace.put(root, WB, "outputs/hot", body(3 * BLOCK, tag), expected_generation=1)
        except GenerationConflict as exc:
            outcomes[tag] = exc

    threads = [threading.Thread(target=replace, args=(t,)) for t in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(o).__name__ for o in outcomes.values()) == ["GenerationConflict", "PathEntry"]
    (lost,) = [op for op in publish_ops(root).values() if op.phase == PublishPhase.Cleaned]
    assert present_keys(root.store, block_keys(root, lost.artifact_revision_id, 3)) == []


@pytest.mark.damages_store("corrupts and deletes objects")
def test_a_corrupt_or_missing_object_on_s3(s3_holder, s3_bucket, s3_client):
    root = s3_holder.root
    data = body(3 * BLOCK, "s3-damage")
    found = namespace.put(root, WB, "outputs/d", data)
    keys_ = block_keys(root, found.artifact_revision_id, 3)
    damaged = bytearray(data[BLOCK : 2 * BLOCK])
    damaged[5] ^= 1
    s3_client.put_object(Bucket=s3_bucket, Key=f"{PREFIX}/{keys_[1]}", Body=bytes(damaged))
    with pytest.raises(IntegrityError):
        reading.read(root, found)
    s3_client.delete_object(Bucket=s3_bucket, Key=f"{PREFIX}/{keys_[2]}")
    with pytest.raises(ObjectMissing):
        reading.read(root, found, 2 * BLOCK, 1)
    assert reading.read(root, found, 0, BLOCK) == data[:BLOCK]


def test_multipart_blocks_record_the_upload_id_before_parts(monkeypatch, tmp_path, s3_bucket, s3_endpoint, s3_client):
    block_size = MIN_PART_SIZE + MiB  # a block of two parts
    holder = RootHolder(_s3_data_dir(tmp_path, s3_bucket, s3_endpoint, block_size=block_size))
    try:
        root = holder.root
        wb.create(root, WB)
        assert "multipart_threshold" in vars(root.store)  # what publish._upload reads
        root.store.multipart_threshold = 64 * 1024
        root.store.part_size = MIN_PART_SIZE
        seen = []
        real_part = root.store.upload_part

        def checked_part(key, upload_id, number, data):
            (op_id,) = [i for i, o in publish_ops(root).items() if o.phase == PublishPhase.Uploading]
            (row,) = [r for r in ledger(root, op_id) if r.object_key == key]
            assert row.upload_id == upload_id, "a part was sent before the ledger owned its upload id"
            assert row.provider_state == StagedProviderState.Uploading
            assert [u["UploadId"] for u in _uploads(s3_client, s3_bucket)] == [upload_id]
            seen.append((key, number, len(data)))
            return real_part(key, upload_id, number, data)

        monkeypatch.setattr(root.store, "upload_part", checked_part)
        data = body(block_size + MiB // 2, "multipart") + body(100, "small tail")
        found = namespace.put(root, WB, "outputs/big", data)
        k0, k1 = block_keys(root, found.artifact_revision_id, 2)
        assert seen == [(k0, 1, MIN_PART_SIZE), (k0, 2, MiB), (k1, 1, MiB // 2 + 100)]
        assert _uploads(s3_client, s3_bucket) == []
        assert get_bytes(root, "outputs/big") == data
    finally:
        holder.close()


def test_a_crash_between_create_and_record_leaks_no_upload(monkeypatch, tmp_path, s3_bucket, s3_endpoint, s3_client):
    """Issue 13: "Any S3 multipart upload you create is recorded before its first part so cleanup
    can abort it without listing the bucket" -- here the process dies after CreateMultipartUpload
    and before the upload id reached the ledger: the recorded intent (Uploading, no id) is enough
    for recovery to abort the upload to that exact key."""
    path = _s3_data_dir(tmp_path, s3_bucket, s3_endpoint)
    holder = RootHolder(path)
    wb.create(holder.root, WB)
    before = set(publish_ops(holder.root))
    holder.close()
    new = body(3 * BLOCK, "s3-new")
    options = {"multipart_threshold": 1024}
    assert run_crash_child(crash_worker, path, "outputs/m", new, None, "after-multipart-create-1", options) == KILLED

    holder = RootHolder(path, recover=False)
    (op_id,) = set(publish_ops(holder.root)) - before
    rows = ledger(holder.root, op_id)
    assert rows[1].upload_id is None and rows[1].provider_state == StagedProviderState.Uploading
    (leaked,) = _uploads(s3_client, s3_bucket)
    assert leaked["Key"] == f"{PREFIX}/{rows[1].object_key}"
    listed = []
    real_list = S3Store.list
    monkeypatch.setattr(S3Store, "list", lambda self, *a, **kw: listed.append(a) or real_list(self, *a, **kw))
    root = holder.reopen(recover=True)
    try:
        assert _uploads(s3_client, s3_bucket) == []  # aborted from the ledger's intent
        assert publish_ops(root)[op_id].phase == PublishPhase.Cleaned and ledger(root, op_id) == []
        assert _bucket_keys(s3_client, s3_bucket) == []
    finally:
        holder.close()
    assert listed == []  # the bucket's objects were never listed
    monkeypatch.undo()


@pytest.mark.parametrize(
    "crash_at, published",
    [
        ("after-multipart-record-0", False),
        ("after-multipart-record-1", False),
        ("after-upload-1", False),
        ("after-finalize", True),
        ("before-publish-command", True),
    ],
)
def test_sigkill_on_s3_then_recovery(tmp_path, s3_bucket, s3_endpoint, s3_client, crash_at, published):
    path = _s3_data_dir(tmp_path, s3_bucket, s3_endpoint)
    holder = RootHolder(path)
    wb.create(holder.root, WB)
    old = body(BLOCK + 1, "s3-old")
    namespace.put(holder.root, WB, "outputs/m", old)
    before = set(publish_ops(holder.root))
    holder.close()
    new = body(3 * BLOCK, "s3-new")
    options = {"multipart_threshold": 1024} if "multipart" in crash_at else None
    assert run_crash_child(crash_worker, path, "outputs/m", new, None, crash_at, options) == KILLED

    holder = RootHolder(path, recover=False)
    (op_id,) = set(publish_ops(holder.root)) - before
    keys_ = block_keys(holder.root, publish_ops(holder.root)[op_id].artifact_revision_id, 3)
    assert get_bytes(holder.root, "outputs/m") == old
    if "multipart" in crash_at:
        index = int(crash_at.rsplit("-", 1)[1])
        rows = ledger(holder.root, op_id)
        assert rows[index].upload_id and rows[index].provider_state == StagedProviderState.Uploading
        assert [u["UploadId"] for u in _uploads(s3_client, s3_bucket)] == [rows[index].upload_id]
        assert present_keys(holder.root.store, keys_) == keys_[:index]
    root = holder.reopen(recover=True)
    try:
        op = publish_ops(root)[op_id]
        assert _uploads(s3_client, s3_bucket) == []  # aborted from the ledger
        assert ledger(root, op_id) == []
        if published:
            assert op.phase == PublishPhase.Published
            assert get_bytes(root, "outputs/m") == new
        else:
            assert op.phase == PublishPhase.Cleaned
            assert present_keys(root.store, keys_) == []
            assert get_bytes(root, "outputs/m") == old
    finally:
        holder.close()


def test_the_store_deadlines_are_part_of_the_data_directory(tmp_path, s3_bucket, s3_endpoint):
    """Issue 11: store-call deadlines are configurable: the data directory records them
    ("store_options") and every process opening it uses them; bad values are refused at init."""
    from nokvfs.errors import InvalidInput

    options = {"connect_timeout": 1, "read_timeout": 2.5, "max_attempts": 2, "deadline": 6}
    path = str(tmp_path / "data")
    config = datadir.init(path, store=f"s3://{s3_bucket}/{PREFIX}", endpoint_url=s3_endpoint, store_options=options)
    assert config["store_options"] == options == datadir.read_config(path)["store_options"]
    holder = RootHolder(path)
    try:
        assert holder.root.store.deadline == 6.0 and holder.root.store._max_attempts == 2
    finally:
        holder.close()
    for bad, target in (
        ({"deadline": 1, "read_timeout": 5}, f"s3://{s3_bucket}/x"),
        ({"retries": 3}, f"s3://{s3_bucket}/x"),
        ({"deadline": 5}, None),
    ):
        with pytest.raises(InvalidInput):
            datadir.init(
                str(tmp_path / f"bad-{len(str(bad))}-{target is None}"),
                store=target,
                endpoint_url=s3_endpoint if target else None,
                store_options=bad,
            )
