"""Disaster recovery through the bucket, without a kernel: a data directory rebuilt by one
command, ownership taken over (the old owner fenced, its unshipped records named), followers
that bootstrap, catch up and re-bootstrap, and `wait_shipped` (the primitive of `--sync`).

The owner's artifact bytes and the replication prefix are both in one moto S3 server on
loopback (tests/s3_fixtures.py): the bucket is the only thing the "machines" share.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from nokvfs.cli import main as cli_main
from nokvfs.engine.shard import Shard
from nokvfs.errors import NotFound, OwnerFenced, ReadOnlyReplica
from nokvfs.replicate import Replicator, follower
from nokvfs.replicate.errors import NotShipped
from nokvfs.replicate.restore import restore_data_dir
from nokvfs.workspace import datadir, namespace, replica, workbench
from tests.test_mount_replicate import files_of
from tests.test_replicate import Interposed, s3_store

pytest_plugins = ["tests.s3_fixtures"]


@pytest.fixture
def owner(tmp_path, s3_bucket, s3_endpoint):
    """An owner data directory whose artifact bytes are in S3, with workbench `wb` and two files."""
    data_dir = str(tmp_path / "owner")
    datadir.init(data_dir, store=f"s3://{s3_bucket}/objects", endpoint_url=s3_endpoint)
    with datadir.open_root(data_dir) as root:
        workbench.create(root, "wb")
        namespace.put(root, "wb", "input/a.txt", b"alpha\n")
        namespace.put(root, "wb", "outputs/deep/b.bin", os.urandom(300_000))
    return data_dir


@pytest.fixture
def url(s3_bucket):
    return f"s3://{s3_bucket}/dr"


def cli(*argv, endpoint) -> int:
    return cli_main.main(["--endpoint-url", endpoint, *argv])


def put(data_dir: str, path: str, body: bytes):
    with datadir.open_root(data_dir) as root:
        return namespace.put(root, "wb", path, body)


def push(data_dir: str, url: str, endpoint: str, **options):
    with Shard.open(os.path.join(data_dir, "shard"), verify=False) as shard:
        replicator = Replicator.from_url(shard, url, endpoint_url=endpoint, data_dir=data_dir, **options)
        try:
            while replicator.push_once().lag:
                pass
            return replicator.bucket.read()[0]
        finally:
            replicator.bucket.store.close()


def tail(data_dir: str) -> int:
    with Shard.open(os.path.join(data_dir, "shard"), verify=False) as shard:
        return shard.recovery_tail.applied_lsn


# --- item 1 and 2: one command rebuilds a data directory -------------------------------------------


def test_one_command_restores_a_complete_data_directory_that_reads_at_once(owner, url, s3_endpoint, tmp_path, capsys):
    assert cli("--data-dir", owner, "shard", "push", "--to", url, endpoint=s3_endpoint) == 0
    capsys.readouterr()
    new = str(tmp_path / "new")
    assert cli("--data-dir", new, "shard", "restore", "--from", url, endpoint=s3_endpoint) == 0
    out = capsys.readouterr().out
    assert "restored data directory" in out and "read-only follower" in out
    assert files_of(new) == files_of(owner)
    assert datadir.read_config(new) == datadir.read_config(owner)
    assert datadir.describe(new)[1] == datadir.describe(owner)[1]
    # The read commands work on it at once.
    assert cli("--data-dir", new, "ls", "-R", "wb", endpoint=s3_endpoint) == 0
    assert capsys.readouterr().out.split() == ["input/a.txt", "outputs/deep/b.bin"]
    assert cli("--data-dir", new, "get", "wb:input/a.txt", str(tmp_path / "a.txt"), endpoint=s3_endpoint) == 0
    assert (tmp_path / "a.txt").read_bytes() == b"alpha\n"
    assert cli("--data-dir", new, "stat", "wb:outputs/deep/b.bin", endpoint=s3_endpoint) == 0


def test_a_restored_follower_refuses_every_write_before_anything_changes(owner, url, s3_endpoint, tmp_path, capsys):
    push(owner, url, s3_endpoint)
    new = str(tmp_path / "new")
    restore_data_dir(url, new, endpoint_url=s3_endpoint)
    before = tail(new)
    source = tmp_path / "x.txt"
    source.write_bytes(b"local write")
    assert cli("--data-dir", new, "put", "wb:input/x.txt", str(source), endpoint=s3_endpoint) == cli_main.EXIT_FENCED
    assert "follows s3://" in capsys.readouterr().err
    assert (
        cli("--data-dir", new, "snapshot", "mint", "wb", "--alias", "s", endpoint=s3_endpoint) == cli_main.EXIT_FENCED
    )
    assert cli("--data-dir", new, "shard", "push", endpoint=s3_endpoint) == cli_main.EXIT_FENCED
    with datadir.open_root(new) as root:  # writes through the facade meet the guard too
        with pytest.raises(ReadOnlyReplica):
            namespace.put(root, "wb", "input/y.txt", b"y")
        with pytest.raises(ReadOnlyReplica):  # its commands go as one group (publish._run_bodiless)
            namespace.put(root, "wb", "input/empty.txt", b"")
        with pytest.raises(ReadOnlyReplica):
            root.shard.apply_group([])
        with pytest.raises(ReadOnlyReplica):
            root.shard.observe_lease_clock(int(time.time() * 1000))
        with pytest.raises(ReadOnlyReplica):
            root.store.put("nokv/x", b"x")
    assert tail(new) == before
    assert replica.read_role(new).role == replica.FOLLOWER


def test_a_bucket_without_a_data_directory_record_says_how_to_restore_the_shard(owner, url, s3_endpoint, tmp_path):
    with Shard.open(os.path.join(owner, "shard"), verify=False) as shard:
        Replicator.from_url(shard, url, endpoint_url=s3_endpoint).push_once()  # a shard alone, no data dir
    with pytest.raises(NotFound, match="shard restore --from URL DIR/shard"):
        restore_data_dir(url, str(tmp_path / "new"), endpoint_url=s3_endpoint)
    assert not (tmp_path / "new").exists()


def test_a_record_that_disagrees_with_the_shard_materialises_nothing(owner, url, s3_endpoint, tmp_path, s3_bucket):
    from nokvfs.errors import IntegrityError
    from nokvfs.replicate.remote import open_remote

    push(owner, url, s3_endpoint)
    bucket = open_remote(url, endpoint_url=s3_endpoint)
    record, etag = bucket.read_datadir()
    import dataclasses

    from nokvfs.replicate.manifest import new_uuid7_hex

    moved = dataclasses.replace(
        record,
        generation=2,
        publication_id=new_uuid7_hex(),
        placement=dataclasses.replace(record.placement, placement_generation=record.placement.placement_generation + 1),
    )
    bucket.publish_datadir(moved, etag)
    (tmp_path / "new").mkdir()
    with pytest.raises(IntegrityError, match="fence"):
        restore_data_dir(url, str(tmp_path / "new"), endpoint_url=s3_endpoint)
    assert os.listdir(tmp_path / "new") == []


@pytest.mark.damages_store("the fenced owner's unshipped publication leaves blocks the new owner does not reference")
def test_take_ownership_fences_the_old_owners_pushes_and_commands_and_names_what_it_never_shipped(
    owner, url, s3_endpoint, tmp_path, capsys
):
    push(owner, url, s3_endpoint)
    shipped = tail(owner)
    put(owner, "input/late.txt", b"written on the old owner after its last push")
    unshipped = (shipped + 1, tail(owner))
    new = str(tmp_path / "new")
    assert cli("--data-dir", new, "shard", "restore", "--from", url, "--take-ownership", endpoint=s3_endpoint) == 0
    assert "took ownership at owner epoch 2" in capsys.readouterr().out
    assert replica.read_role(new).role == replica.OWNER
    # The old owner learns it at its next push: fenced, recorded in its directory, exit 7.
    assert cli("--data-dir", owner, "shard", "push", "--to", url, endpoint=s3_endpoint) == cli_main.EXIT_FENCED
    role = replica.read_role(owner)
    assert role.role == replica.FENCED and role.unshipped == unshipped and role.owned_epoch == 1
    assert f"LSNs {unshipped[0]}..{unshipped[1]} of this shard were never shipped" in role.reason
    # Every later command on it fails with OwnerFenced, in any process.
    source = tmp_path / "z.txt"
    source.write_bytes(b"z")
    capsys.readouterr()
    assert cli("--data-dir", owner, "put", "wb:input/z.txt", str(source), endpoint=s3_endpoint) == cli_main.EXIT_FENCED
    assert "owner fenced: this data directory is fenced" in capsys.readouterr().err
    with datadir.open_root(owner) as root, pytest.raises(OwnerFenced):
        namespace.put(root, "wb", "input/z.txt", b"z")
    assert cli("--data-dir", owner, "shard", "status", "--to", url, endpoint=s3_endpoint) == 0
    out = capsys.readouterr().out
    assert "FENCED" in out and f"LSNs {unshipped[0]}..{unshipped[1]}" in out
    # Its reads still work, and the new owner writes and ships; a third restore has its file.
    assert cli("--data-dir", owner, "ls", "wb:input", endpoint=s3_endpoint) == 0
    put(new, "input/after.txt", b"by the new owner")
    assert cli("--data-dir", new, "shard", "push", endpoint=s3_endpoint) == 0
    third = str(tmp_path / "third")
    restore_data_dir(url, third, endpoint_url=s3_endpoint)
    assert set(files_of(third)) == {"wb:input/a.txt", "wb:outputs/deep/b.bin", "wb:input/after.txt"}


def test_an_old_owner_that_shipped_everything_lost_nothing(owner, url, s3_endpoint, tmp_path):
    push(owner, url, s3_endpoint)
    from nokvfs.replicate.restore import take_ownership

    new = str(tmp_path / "new")
    restore_data_dir(url, new, endpoint_url=s3_endpoint)
    take_ownership(new, url, endpoint_url=s3_endpoint)
    with Shard.open(os.path.join(owner, "shard"), verify=False) as shard:
        old = Replicator.from_url(shard, url, endpoint_url=s3_endpoint, data_dir=owner)
        with pytest.raises(OwnerFenced):
            old.push_once()
        assert (
            old.fencing.unshipped is None
            and "every record of this shard is in the bucket" in old.fencing.describe_unshipped()
        )
    assert replica.read_role(owner).unshipped is None


# --- item 3: followers ------------------------------------------------------------------------------


def open_follower(data_dir: str, endpoint: str):
    """The follower of `data_dir` over a ReplicaShard of its shard (what the mount's Root holds)."""
    role = replica.read_role(data_dir)
    shard = replica.ReplicaShard(Shard.open(os.path.join(data_dir, "shard"), verify=False), role)
    return follower.Follower.attach(data_dir, shard, endpoint_url=endpoint), shard


def test_a_follower_bootstraps_then_applies_each_increment_and_reports_its_lag(owner, url, s3_endpoint, tmp_path):
    push(owner, url, s3_endpoint)
    cache = str(tmp_path / "cache" / "f")
    role = follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    assert role.role == replica.FOLLOWER and files_of(cache) == files_of(owner)
    f, shard = open_follower(cache, s3_endpoint)
    try:
        assert f.poll_once().records == 0
        put(owner, "outputs/new.txt", b"new")
        put(owner, "input/a.txt", b"alpha, rewritten\n")
        manifest = push(owner, url, s3_endpoint)
        lag = f.lag()
        assert lag.records_behind == 0  # not polled yet: it does not know
        result = f.poll_once()
        assert result.records > 0 and result.generation == manifest.generation and not result.rebootstrapped
        lag = f.lag()
        assert (lag.records_behind, lag.versions_behind, lag.seconds_behind) == (0, 0, 0.0)
        assert lag.local_lsn == manifest.head.lsn == tail(owner)
        status = follower.read_status(cache)
        assert status["pid"] == os.getpid() and status["lag"]["head_lsn"] == manifest.head.lsn
        assert status["lag"]["behind_ms"] == 0
    finally:
        f.stop()
        shard.close()
    assert files_of(cache) == files_of(owner)
    # Its directory answers the read commands, and the change feed carries the owner's events.
    with datadir.open_root(cache) as a, datadir.open_root(owner) as b:
        from nokvfs.workspace import changes

        assert changes.read_changes(a, workbench_id="wb", limit=1000) == changes.read_changes(
            b, workbench_id="wb", limit=1000
        )
    # A second bootstrap of the same directory reuses it; of another bucket is refused.
    assert follower.bootstrap(url, cache, endpoint_url=s3_endpoint) == role
    from nokvfs.errors import InvalidInput

    with pytest.raises(InvalidInput, match="choose another --cache-dir"):
        follower.bootstrap(url + "-other", cache, endpoint_url=s3_endpoint)


def test_a_follower_behind_is_measured_in_versions_and_seconds(owner, url, s3_endpoint, tmp_path):
    push(owner, url, s3_endpoint)
    cache = str(tmp_path / "f")
    follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    f, shard = open_follower(cache, s3_endpoint)
    try:
        f.poll_once()
        put(owner, "outputs/c.txt", b"c")
        push(owner, url, s3_endpoint)
        time.sleep(0.3)
        # Measured without applying: the manifest is read, the packs are not.
        f._manifest = f.bucket.read()[0]
        lag = f.lag()
        assert lag.versions_behind >= 1 and lag.records_behind >= 1 and lag.seconds_behind >= 0.3
    finally:
        f.stop()
        shard.close()


def test_a_follower_whose_increments_were_cleaned_up_re_bootstraps_in_place(owner, url, s3_endpoint, tmp_path):
    options = {"checkpoint_packs": 1, "retained_checkpoints": 0}
    push(owner, url, s3_endpoint, **options)
    cache = str(tmp_path / "f")
    follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    with datadir.open_root(cache) as root:  # the follower writes through the Root's ReplicaShard, as in a mount
        shard = root.shard
        f = follower.Follower.attach(cache, shard, endpoint_url=s3_endpoint)
        try:
            f.poll_once()
            old_inner = shard.inner
            # The owner moves on: each push checkpoints and cleans the increments up.
            for n in range(3):
                put(owner, f"outputs/gen{n}.txt", b"%d" % n)
                push(owner, url, s3_endpoint, **options)
            result = f.poll_once()
            assert result.rebootstrapped and f.rebootstraps == 1 and shard.inner is not old_inner
            assert f.lag().records_behind == 0
            with root.read() as view:  # the Root sees the new shard at once
                from nokvfs.workspace import listing

                assert listing.stat(view, root, "wb", "outputs/gen2.txt").entry is not None
            assert sorted(n for n in os.listdir(cache) if n.startswith(".shard-retired-"))
            f._retire_old(force=True)
            assert not [n for n in os.listdir(cache) if n.startswith(".shard")]
            put(owner, "outputs/after.txt", b"after")
            push(owner, url, s3_endpoint)  # an ordinary increment follows the new checkpoint
            assert not f.poll_once().rebootstrapped
        finally:
            f.stop()
    assert files_of(cache) == files_of(owner)


def test_a_follower_catches_up_through_a_retained_generation_without_re_bootstrapping(
    owner, url, s3_endpoint, tmp_path
):
    push(owner, url, s3_endpoint, checkpoint_packs=100)
    cache = str(tmp_path / "f")
    follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    f, shard = open_follower(cache, s3_endpoint)
    try:
        put(owner, "outputs/one.txt", b"1")
        push(owner, url, s3_endpoint, checkpoint_packs=100)
        with Shard.open(os.path.join(owner, "shard"), verify=False) as s:
            Replicator.from_url(s, url, endpoint_url=s3_endpoint).checkpoint_once()  # the tail is now retained
        put(owner, "outputs/two.txt", b"2")
        push(owner, url, s3_endpoint, checkpoint_packs=100)
        result = f.poll_once()
        assert not result.rebootstrapped and result.increments == 2
    finally:
        f.stop()
        shard.close()
    assert files_of(cache) == files_of(owner)


def test_a_follower_keeps_following_the_new_owner_after_a_takeover(owner, url, s3_endpoint, tmp_path):
    push(owner, url, s3_endpoint)
    cache = str(tmp_path / "f")
    follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    new = str(tmp_path / "new")
    from nokvfs.replicate.restore import take_ownership

    restore_data_dir(url, new, endpoint_url=s3_endpoint)
    take_ownership(new, url, endpoint_url=s3_endpoint)
    put(new, "outputs/by-new.txt", b"new owner")
    push(new, url, s3_endpoint)
    f, shard = open_follower(cache, s3_endpoint)
    try:
        assert not f.poll_once().rebootstrapped
        assert shard.owner_epoch == 2
    finally:
        f.stop()
        shard.close()
    assert files_of(cache) == files_of(new)
    with pytest.raises(OwnerFenced):  # the old owner learns it at its next push
        push(owner, url, s3_endpoint)


# --- item 4: wait_shipped --------------------------------------------------------------------------


def test_wait_shipped_returns_once_the_increment_is_in_the_bucket(owner, url, s3_endpoint):
    with datadir.open_root(owner) as root:
        replicator = Replicator.from_url(root.shard, url, endpoint_url=s3_endpoint)
        replicator.push_once()
        # Without a running loop the caller's thread pushes.
        namespace.put(root, "wb", "input/sync.txt", b"sync")
        lsn = root.shard.recovery_tail.applied_lsn
        assert replicator.wait_shipped(lsn, timeout=30) >= lsn
        assert replicator.bucket.read()[0].head.lsn >= lsn
        # With a loop that would sleep an hour, a waiter wakes it: shipped long before that.
        replicator.start(interval=3600)
        try:
            time.sleep(0.2)  # the loop's first push is done; it sleeps now
            waited = []

            def close_like(path):
                namespace.put(root, "wb", path, b"x")
                started = time.monotonic()
                replicator.wait_shipped(root.shard.recovery_tail.applied_lsn, timeout=30)
                waited.append(time.monotonic() - started)

            threads = [threading.Thread(target=close_like, args=(f"input/t{n}.txt",)) for n in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(waited) == 4 and max(waited) < 30
            assert replicator.bucket.read()[0].head.lsn == root.shard.recovery_tail.applied_lsn
        finally:
            replicator.stop()
            replicator.bucket.store.close()


def test_wait_shipped_raises_not_shipped_in_bounded_time_when_the_bucket_fails(owner, url, s3_endpoint, s3_bucket):
    from nokvfs.errors import StoreError

    with datadir.open_root(owner) as root:
        store = Interposed(s3_store(s3_bucket, s3_endpoint, prefix="dr"))
        replicator = Replicator(root.shard, store)
        replicator.push_once()
        namespace.put(root, "wb", "input/lost.txt", b"x")

        def unreachable(key, kw):
            raise StoreError("connection refused")

        store.before_put = unreachable
        started = time.monotonic()
        with pytest.raises(NotShipped, match="connection refused"):
            replicator.wait_shipped(root.shard.recovery_tail.applied_lsn, timeout=1.0)
        assert time.monotonic() - started < 10


def test_wait_shipped_raises_owner_fenced_once_another_owner_took_over(owner, url, s3_endpoint, tmp_path):
    push(owner, url, s3_endpoint)
    from nokvfs.replicate.restore import take_ownership

    new = str(tmp_path / "new")
    restore_data_dir(url, new, endpoint_url=s3_endpoint)
    take_ownership(new, url, endpoint_url=s3_endpoint)
    with datadir.open_root(owner) as root:
        replicator = Replicator.from_url(root.shard, url, endpoint_url=s3_endpoint, data_dir=owner)
        replicator.start(interval=0.05)
        try:
            with pytest.raises(OwnerFenced):
                replicator.wait_shipped(root.shard.recovery_tail.applied_lsn + 1, timeout=30)
        finally:
            replicator.stop()
            replicator.bucket.store.close()


@pytest.mark.parametrize("damage", ["interrupted re-bootstrap", "torn data file"])
def test_a_follower_whose_shard_is_missing_or_damaged_rebuilds_it_at_bootstrap(
    owner, url, s3_endpoint, tmp_path, damage
):
    push(owner, url, s3_endpoint)
    cache = str(tmp_path / "f")
    follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    shard_dir = os.path.join(cache, "shard")
    if damage == "interrupted re-bootstrap":  # the old shard renamed away, the new one not yet in place
        os.rename(shard_dir, os.path.join(cache, ".shard-retired-" + "0" * 32))
    else:
        with open(os.path.join(shard_dir, "data.mdb"), "r+b") as f:
            f.seek(8192)
            f.write(b"\xff" * 4096)
    put(owner, "outputs/since.txt", b"since")
    push(owner, url, s3_endpoint)
    follower.bootstrap(url, cache, endpoint_url=s3_endpoint)
    assert not [n for n in os.listdir(cache) if n.startswith(".shard")]
    assert files_of(cache) == files_of(owner)
