"""The durable formats that make a data directory rebuildable: the bucket's `datadir` record
(configuration and the root's placement, beside `current`) and a restored directory's
`replica.json`. Both are strict: golden bytes, unknown / duplicate / missing / null refused, an
unknown version refused before anything else; the record is replaced only by conditional writes."""

from __future__ import annotations

import pytest

from nokvfs.errors import FormatError, OwnerFenced, PreconditionFailed, ReadOnlyReplica
from nokvfs.replicate import datadir_record as dr
from nokvfs.replicate.errors import (
    ManifestGenerationInvalid,
    ManifestMalformed,
    ManifestVersionUnsupported,
)
from nokvfs.replicate.remote import Contention, ShardBucket
from nokvfs.schema import canonical_json
from nokvfs.schema.enums import RootPlacementLifecycle
from nokvfs.schema.records import RootPlacement
from nokvfs.workspace import replica
from tests.test_replicate import Interposed, s3_store

pytest_plugins = ["tests.s3_fixtures"]

SHARD = bytes.fromhex("0123456789abcdef0123456789abcdef")
ROOT = bytes.fromhex("fedcba9876543210fedcba9876543210")
PUBLICATION = "0190a1b2c3d47e5f8a1b2c3d4e5f6a7b"


def record(**changes) -> dr.DataDirRecord:
    fields = dict(
        logical_shard_id=SHARD,
        generation=3,
        publication_id=PUBLICATION,
        root_id=ROOT,
        placement=RootPlacement(SHARD, 2, RootPlacementLifecycle.Active),
        store="s3://artifacts/lab",
        endpoint_url="http://127.0.0.1:9000",
        region=None,
        block_size=4 * 1024 * 1024,
        cache_bytes=512 * 1024 * 1024,
        history_retention_versions=0,
    )
    fields.update(changes)
    return dr.DataDirRecord(**fields)


GOLDEN = (
    b'{"config":{"blockSize":4194304,"cacheBytes":536870912,"endpointUrl":"http://127.0.0.1:9000",'
    b'"historyRetentionVersions":0,"region":"","store":"s3://artifacts/lab"},"generation":3,'
    b'"logicalShardId":"0123456789abcdef0123456789abcdef","placement":{"generation":2,"lifecycle":"Active"},'
    b'"publicationId":"0190a1b2c3d47e5f8a1b2c3d4e5f6a7b","rootId":"fedcba9876543210fedcba9876543210","version":1}'
)


def test_the_record_has_golden_bytes_and_round_trips():
    assert record().dumps() == GOLDEN
    assert dr.loads(GOLDEN, logical_shard_id=SHARD) == record()
    assert record().config() == {
        "root_id": ROOT.hex(),
        "logical_shard_id": SHARD.hex(),
        "store": "s3://artifacts/lab",
        "endpoint_url": "http://127.0.0.1:9000",
        "region": None,
        "block_size": 4194304,
        "cache_bytes": 536870912,
        "history_retention_versions": 0,
    }


@pytest.mark.parametrize("path", [(), ("placement",), ("config",)])
def test_an_unknown_field_at_any_level_is_refused(path):
    obj = canonical_json.loads(GOLDEN)
    target = obj
    for step in path:
        target = target[step]
    target["surprise"] = 1
    with pytest.raises(ManifestMalformed, match="unknown field"):
        dr.loads(canonical_json.dumps(obj))


@pytest.mark.parametrize(
    "path, name", [((), "rootId"), (("placement",), "lifecycle"), (("config",), "store"), (("config",), "region")]
)
def test_a_missing_or_null_field_is_refused(path, name):
    for value in ("missing", None):
        obj = canonical_json.loads(GOLDEN)
        target = obj
        for step in path:
            target = target[step]
        if value == "missing":
            del target[name]
        else:
            target[name] = None
        with pytest.raises(ManifestMalformed, match="missing" if value == "missing" else "null"):
            dr.loads(canonical_json.dumps(obj))


def test_a_duplicate_name_is_refused_while_parsing():
    duplicated = GOLDEN.replace(b'"generation":3,', b'"generation":3,"generation":4,')
    with pytest.raises(ManifestMalformed, match="duplicate"):
        dr.loads(duplicated)


@pytest.mark.parametrize("version", [2, 0, "1", True])
def test_another_version_is_refused_before_anything_else(version):
    obj = canonical_json.loads(GOLDEN)
    obj["version"] = version
    obj["surprise"] = 1  # would be malformed, but the version is checked first
    with pytest.raises(ManifestVersionUnsupported):
        dr.loads(canonical_json.dumps(obj))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o["placement"].update(lifecycle="Moving"),
        lambda o: o["placement"].update(generation=0),
        lambda o: o["config"].update(blockSize=4095),
        lambda o: o["config"].update(blockSize=(1 << 30) + 1),
        lambda o: o["config"].update(store=""),
        lambda o: o["config"].update(cacheBytes=-1),
        lambda o: o["config"].update(historyRetentionVersions=1 << 63),
        lambda o: o.update(generation=0),
        lambda o: o.update(publicationId="0190a1b2c3d44e5f8a1b2c3d4e5f6a7b"),  # a UUIDv4
        lambda o: o.update(rootId=ROOT.hex().upper()),
    ],
)
def test_values_out_of_range_are_malformed(mutate):
    obj = canonical_json.loads(GOLDEN)
    mutate(obj)
    with pytest.raises(ManifestMalformed):
        dr.loads(canonical_json.dumps(obj))


def test_a_record_for_another_shard_is_refused():
    with pytest.raises(ManifestMalformed, match="expected"):
        dr.loads(GOLDEN, logical_shard_id=ROOT)


def test_the_record_is_created_if_none_match_then_replaced_only_if_match(s3_bucket, s3_endpoint):
    store = Interposed(s3_store(s3_bucket, s3_endpoint))
    bucket = ShardBucket(store, SHARD)
    assert bucket.read_datadir() == (None, None)
    first = bucket.publish_datadir(record(generation=1), None)
    assert store.calls[-1][2] == {"if_none_match": True}
    with pytest.raises(Contention):
        ShardBucket(store, SHARD).publish_datadir(
            record(generation=1, publication_id="0190a1b2c3d47e5f8a1b2c3d4e5f6a7c"), None
        )
    read, etag = bucket.read_datadir()
    assert read == first
    second = record(generation=2, publication_id="0190a1b2c3d47e5f8a1b2c3d4e5f6a7d", block_size=65536)
    bucket.publish_datadir(second, etag)
    assert store.calls[-1][2] == {"if_match": etag}
    with pytest.raises(Contention):  # the etag of generation 1 no longer matches
        bucket.publish_datadir(record(generation=3), etag)
    assert bucket.read_datadir()[0] == second
    # A reader that saw generation 2 refuses a record that goes back to generation 1.
    store.inner.put(bucket.key(dr.DATADIR), first.dumps())
    with pytest.raises(ManifestGenerationInvalid):
        bucket.read_datadir()


# --- replica.json -------------------------------------------------------------------------------

ROLE_GOLDEN = (
    b'{"bucket":"s3://dr/lab/","endpointUrl":"","format":1,"logicalShardId":"0123456789abcdef0123456789abcdef",'
    b'"ownedEpoch":2,"reason":"taken over","role":"fenced","unshipped":[41,57]}'
)


def test_the_role_file_has_golden_bytes_and_is_written_atomically(tmp_path):
    role = replica.ReplicaRole(
        replica.FENCED, "s3://dr/lab/", None, SHARD, owned_epoch=2, unshipped=(41, 57), reason="taken over"
    )
    replica.write_role(str(tmp_path), role)
    assert (tmp_path / "replica.json").read_bytes() == ROLE_GOLDEN
    assert replica.read_role(str(tmp_path)) == role
    assert not (tmp_path / "replica.json.tmp").exists()
    assert isinstance(role.refusal(), OwnerFenced) and "taken over" in str(role.refusal())
    follower = replica.ReplicaRole(replica.FOLLOWER, "s3://dr/lab/", "http://e", SHARD)
    assert isinstance(follower.refusal(), ReadOnlyReplica) and not follower.writable
    assert replica.read_role(str(tmp_path / "absent")) is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o.update(surprise=1),
        lambda o: o.pop("reason"),
        lambda o: o.update(reason=None),
        lambda o: o.update(format=2),
        lambda o: o.update(role="leader"),
        lambda o: o.update(ownedEpoch=0),  # a fenced directory names the epoch it owned
        lambda o: o.update(unshipped=[57, 41]),
        lambda o: o.update(unshipped=[1]),
        lambda o: o.update(logicalShardId="xyz"),
        lambda o: o.update(role="follower"),  # a follower owns no epoch and lost no records
    ],
)
def test_a_malformed_role_file_is_a_format_error(tmp_path, mutate):
    obj = canonical_json.loads(ROLE_GOLDEN)
    mutate(obj)
    (tmp_path / "replica.json").write_bytes(canonical_json.dumps(obj))
    with pytest.raises(FormatError):
        replica.read_role(str(tmp_path))


def test_a_duplicate_name_in_the_role_file_is_refused(tmp_path):
    (tmp_path / "replica.json").write_bytes(ROLE_GOLDEN.replace(b'"format":1,', b'"format":1,"format":1,'))
    with pytest.raises(FormatError, match="duplicate"):
        replica.read_role(str(tmp_path))


def test_the_owner_republishes_the_record_only_when_the_directory_changed_and_gives_up_on_endless_races(
    tmp_path, s3_bucket, s3_endpoint
):
    from nokvfs.replicate import Replicator
    from nokvfs.workspace import datadir

    data_dir = str(tmp_path / "data")
    datadir.init(data_dir)
    root = datadir.open_root(data_dir, recover=False)
    try:
        store = Interposed(s3_store(s3_bucket, s3_endpoint))
        replicator = Replicator(root.shard, store, data_dir=data_dir, max_attempts=2)
        replicator.push_once()
        first = replicator.bucket.read_datadir()[0]
        assert (
            first.generation == 1
            and first.root_id == root.root_id
            and first.store == datadir.read_config(data_dir)["store"]
        )
        assert replicator.sync_datadir() == first  # nothing changed: nothing written
        assert sum(1 for call in store.calls if call[0] == "put" and call[1].endswith("/datadir")) == 1
        config = datadir.read_config(data_dir)
        datadir._write_config(data_dir, {**config, "history_retention_versions": 7})
        assert replicator.sync_datadir().generation == 2
        datadir._write_config(data_dir, {**config, "history_retention_versions": 8})

        def lose(key, kw):
            if key.endswith("/datadir"):
                raise PreconditionFailed("412")

        store.before_put = lose
        with pytest.raises(PreconditionFailed):
            replicator.sync_datadir()
        assert replicator.bucket.read_datadir()[0].history_retention_versions == 7
    finally:
        root.close()
