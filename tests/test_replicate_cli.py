"""`nokvfs shard push|status|restore|checkpoint`, through the real parser and the handlers."""

from __future__ import annotations

import pytest

from nokvfs.cli import main as cli_main
from nokvfs.cli import shard_commands
from nokvfs.cli.common import UsageError
from nokvfs.engine.command import Put
from nokvfs.engine.shard import Shard
from nokvfs.errors import OwnerFenced
from nokvfs.replicate import Replicator
from nokvfs.replicate.errors import ManifestError
from tests.conftest import make_shard_env
from tests.test_replicate import assert_equal_shards, s3_store

pytest_plugins = ["tests.s3_fixtures"]


@pytest.fixture
def source(tmp_path):
    env = make_shard_env(tmp_path / "data")
    yield env
    env.shard.close()


@pytest.fixture
def cli(s3_endpoint, monkeypatch, source):
    """Run `nokvfs --endpoint-url ... ARGV` through the real parser and handler. The handlers open
    the source shard themselves (LMDB allows one environment per path and process), so the
    test's handle is closed around each call and reopened after it."""
    monkeypatch.delenv(shard_commands.URL_ENV, raising=False)
    parser = cli_main.build_parser(modules=[shard_commands])

    def run(*argv):
        args = parser.parse_args(["--endpoint-url", s3_endpoint, *argv])
        source.shard.close()
        try:
            return args.func(args)
        finally:
            source.shard = Shard.open(source.path)

    return run


def test_push_status_checkpoint_and_restore_from_the_command_line(
    cli, source, s3_bucket, s3_endpoint, tmp_path, capsys
):
    url = f"s3://{s3_bucket}/backups/prod"
    data_dir = str(tmp_path / "data")
    assert cli("--data-dir", data_dir, "shard", "push", "--to", url) == 0
    assert "published checkpoint" in capsys.readouterr().out
    for n in range(3):
        source.apply(mutations=[Put("path_current", b"\x01" * 16 + bytes([n]), b"\x02v")])
    assert cli("--data-dir", data_dir, "shard", "status", "--to", url) == 0
    out = capsys.readouterr().out
    assert "generation:          1" in out and "lag:                 3 records" in out
    assert cli("--data-dir", data_dir, "shard", "push", "--to", url) == 0
    assert "as generation 2" in capsys.readouterr().out
    assert cli("--data-dir", data_dir, "shard", "checkpoint", "--to", url) == 0
    assert "replacing 1 increments" in capsys.readouterr().out
    assert cli("--data-dir", data_dir, "shard", "status", "--to", url, "--json") == 0
    from nokvfs.schema import canonical_json

    status = canonical_json.loads(capsys.readouterr().out.strip().encode())
    assert status["generation"] == 3 and status["increments"] == 0 and status["lag"] == 0
    assert status["checkpoint_through_lsn"] == source.shard.recovery_tail.applied_lsn
    target = tmp_path / "fresh" / "shard"
    assert cli("shard", "restore", "--from", url, str(target)) == 0
    assert "restored shard" in capsys.readouterr().out
    with Shard.open(str(target)) as restored:
        assert_equal_shards(source.shard, restored)


def test_restore_take_ownership_fences_the_old_owner(cli, source, s3_bucket, s3_endpoint, tmp_path, capsys):
    url = f"s3://{s3_bucket}/p"
    store = s3_store(s3_bucket, s3_endpoint, prefix="p")
    old = Replicator(source.shard, store)
    old.push_once()
    shard_url = f"{url}/shards/{source.shard.logical_shard_id.hex()}"
    assert cli("shard", "restore", "--from", shard_url, "--take-ownership", str(tmp_path / "new")) == 0
    assert "took ownership at owner epoch 2" in capsys.readouterr().out
    with pytest.raises(OwnerFenced) as info:
        cli("--data-dir", str(tmp_path / "data"), "shard", "push", "--to", url)
    assert cli_main.exit_code(info.value) == cli_main.EXIT_FENCED
    assert cli("--data-dir", str(tmp_path / "data"), "shard", "status", "--to", url) == 0
    assert "FENCED" in capsys.readouterr().out


def test_usage_errors_and_a_malformed_current_map_to_their_exit_codes(cli, source, s3_bucket, s3_endpoint, tmp_path):
    with pytest.raises(UsageError) as info:
        cli("--data-dir", str(tmp_path / "data"), "shard", "push")
    assert cli_main.exit_code(info.value) == cli_main.EXIT_USAGE
    store = s3_store(s3_bucket, s3_endpoint, prefix="p")
    Replicator(source.shard, store).push_once()
    key = f"shards/{source.shard.logical_shard_id.hex()}/current"
    store.put(key, store.get(key).replace(b'"version":1', b'"version":2'))
    with pytest.raises(ManifestError) as info:
        cli("shard", "restore", "--from", f"s3://{s3_bucket}/p", str(tmp_path / "r"))
    assert cli_main.exit_code(info.value) == cli_main.EXIT_INTEGRITY
    assert not (tmp_path / "r").exists()
