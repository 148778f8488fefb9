"""The `current` manifest is read strictly and validated as a whole chain: each kind of
malformation is its own typed error, raised before any pack could be read."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from nokvfs.errors import FormatError
from nokvfs.replicate import manifest as mf
from nokvfs.replicate.errors import (
    ManifestChainBroken,
    ManifestGenerationInvalid,
    ManifestMalformed,
    ManifestVersionUnsupported,
)
from nokvfs.schema import canonical_json
from nokvfs.schema.ids import new_id16

SHARD = new_id16()


def digest(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def checkpoint(through_generation, through_lsn, chain, commit_version):
    cid = mf.new_uuid7_hex()
    return mf.CheckpointDescriptor(
        id=cid,
        publication=mf.new_uuid7_hex(),
        through_generation=through_generation,
        through_lsn=through_lsn,
        commit_version=commit_version,
        chain_digest=chain,
        key=mf.checkpoint_key(through_generation, cid),
        sha256=digest(f"cp{through_generation}"),
        size=4096,
    )


def increments(start_generation, start_lsn, previous, count, per=3):
    out = []
    for n in range(count):
        pub = mf.new_uuid7_hex()
        first = start_lsn + n * per
        chain = digest(f"chain{first + per - 1}")
        out.append(
            mf.IncrementDescriptor(
                generation=start_generation + n,
                publication=pub,
                first_lsn=first,
                last_lsn=first + per - 1,
                previous_chain_digest=previous,
                chain_digest=chain,
                commit_version=first + per - 1,
                key=mf.increment_key(start_generation + n, pub),
                sha256=digest(pub),
                size=100 + n,
            )
        )
        previous = chain
    return tuple(out)


def valid_manifest() -> mf.Manifest:
    """Generation 9: checkpoint through generation 6 (LSN 10) with 3 increments after it, and
    one retained generation (checkpoint through 2, its 4 increments through generation 6)."""
    old = checkpoint(2, 1, digest("chain1"), 1)
    old_tail = increments(3, 2, old.chain_digest, 3)
    active = checkpoint(5, old_tail[-1].last_lsn, old_tail[-1].chain_digest, old_tail[-1].commit_version)
    tail = increments(7, active.through_lsn + 1, active.chain_digest, 3)
    return mf.Manifest(
        logical_shard_id=SHARD,
        generation=9,
        owner_epoch=3,
        owner_id=mf.new_uuid7_hex(),
        publication_id=tail[-1].publication,
        head=tail[-1].end,
        checkpoint=active,
        increments=tail,
        retained=(mf.Retained(old, old_tail, active.through),),
    )


def valid_json() -> dict:
    return valid_manifest().to_json()


def load(obj) -> mf.Manifest:
    data = obj if isinstance(obj, bytes) else canonical_json.dumps(obj)
    return mf.loads(data, logical_shard_id=SHARD)


def test_a_valid_manifest_round_trips_canonically():
    m = valid_manifest()
    data = m.dumps()
    assert canonical_json.is_canonical(data)
    assert load(data) == m
    assert m.live_keys() >= {m.checkpoint.key, m.retained[0].checkpoint.key}


# --- shape: unknown, duplicate, missing, null ---------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [(), ("head",), ("checkpoint",), ("increments", 0), ("retained", 0), ("retained", 0, "increments", 2)],
)
def test_an_unknown_field_at_any_level_is_refused(path):
    obj = valid_json()
    target = obj
    for step in path:
        target = target[step]
    target["surprise"] = 1
    with pytest.raises(ManifestMalformed, match="unknown field"):
        load(obj)


@pytest.mark.parametrize("name", ["generation", "sha256", "chainDigest"])
def test_a_duplicate_member_name_is_refused_before_any_value_is_decoded(name):
    data = valid_manifest().dumps()
    needle = f'"{name}":'.encode()
    at = data.index(needle)
    end = data.index(b",", at)
    duplicated = data[:end] + b"," + data[at:end] + data[end:]
    with pytest.raises(ManifestMalformed, match="duplicate"):
        load(duplicated)
    escaped = data[:end] + b',"\\u0067eneration":1' + data[end:] if name == "generation" else None
    if escaped:
        with pytest.raises(ManifestMalformed, match="duplicate"):
            load(escaped)


@pytest.mark.parametrize(
    "path, name",
    [
        ((), "ownerEpoch"),
        ((), "ownerId"),
        ((), "retained"),
        (("head",), "lsn"),
        (("checkpoint",), "size"),
        (("increments", 1), "previousChainDigest"),
        (("retained", 0), "head"),
    ],
)
def test_a_missing_field_is_refused(path, name):
    obj = valid_json()
    target = obj
    for step in path:
        target = target[step]
    del target[name]
    with pytest.raises(ManifestMalformed, match="missing"):
        load(obj)


@pytest.mark.parametrize(
    "path, name",
    [
        ((), "publicationId"),
        ((), "version"),
        (("head",), "chainDigest"),
        (("checkpoint",), "key"),
        (("increments", 2), "size"),
        (("retained", 0, "checkpoint"), "id"),
    ],
)
def test_an_explicit_null_is_refused(path, name):
    obj = valid_json()
    target = obj
    for step in path:
        target = target[step]
    target[name] = None
    with pytest.raises(ManifestMalformed, match="null"):
        load(obj)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o.update(generation=-1),
        lambda o: o.update(generation=True),
        lambda o: o.update(generation="9"),
        lambda o: o["head"].update(chainDigest="AB" * 32),
        lambda o: o["checkpoint"].update(sha256="00" * 31),
        lambda o: o["checkpoint"].update(id="0" * 32),  # not a UUIDv7
        lambda o: o.update(ownerId=mf.new_uuid7_hex()[:-1] + "-"),
        lambda o: o["increments"][0].update(publication=new_id16().hex().upper()),
        lambda o: o.update(increments={}),
        lambda o: o.update(logicalShardId=new_id16().hex()),
        lambda o: o.update(head=[]),
    ],
)
def test_wrong_types_ranges_and_id_forms_are_malformed(mutate):
    obj = valid_json()
    mutate(obj)
    with pytest.raises(ManifestMalformed):
        load(obj)


def test_a_manifest_that_is_not_strict_json_is_malformed():
    for data in (
        b"",
        b"[]",
        b"{",
        valid_manifest().dumps() + b"x",
        b'{"version": 1.0}',
        '{"version":1}'.encode("utf-16"),
    ):
        with pytest.raises(FormatError):
            load(data)


# --- version --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, 99, "1", [1]])
def test_a_wrong_version_is_refused_before_any_other_check(version):
    obj = {"version": version, "whatever": "a future schema"}
    with pytest.raises(ManifestVersionUnsupported):
        load(obj)
    obj = valid_json()
    obj["version"] = version
    with pytest.raises(ManifestVersionUnsupported):
        load(obj)


# --- generations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o.update(generation=8),  # below the last increment's generation 9
        lambda o: o.update(generation=0),
        lambda o: _regenerate(o["increments"][1], 7),  # repeats generation 7
        lambda o: _regenerate(o["increments"][0], 5),  # not above the checkpoint cutoff 5
        lambda o: _recheckpoint(o["checkpoint"], 10),  # cutoff beyond the manifest's generation
        lambda o: _recheckpoint(o["retained"][0]["checkpoint"], 5),  # retained not older
    ],
)
def test_non_monotonic_generations_are_refused(mutate):
    obj = valid_json()
    mutate(obj)
    with pytest.raises(ManifestGenerationInvalid):
        load(obj)


def _regenerate(inc: dict, generation: int) -> None:
    inc["generation"] = generation
    inc["key"] = mf.increment_key(generation, inc["publication"])


def _recheckpoint(cp: dict, through_generation: int) -> None:
    cp["throughGeneration"] = through_generation
    cp["key"] = mf.checkpoint_key(through_generation, cp["id"])


# --- the chain ------------------------------------------------------------------------------


def test_a_gap_in_lsns_is_a_broken_chain():
    obj = valid_json()
    obj["increments"][1]["firstLsn"] += 1
    with pytest.raises(ManifestChainBroken, match="gap"):
        load(obj)


def test_overlapping_lsns_are_a_broken_chain():
    obj = valid_json()
    obj["increments"][2]["firstLsn"] -= 1
    with pytest.raises(ManifestChainBroken, match="overlap"):
        load(obj)


def test_the_first_increment_must_follow_the_checkpoint_through_lsn():
    obj = valid_json()
    obj["checkpoint"]["throughLsn"] += 1
    with pytest.raises(ManifestChainBroken):
        load(obj)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_broken_chain_digest_link_is_refused(index):
    obj = valid_json()
    obj["increments"][index]["previousChainDigest"] = "ee" * 32
    with pytest.raises(ManifestChainBroken, match="previousChainDigest"):
        load(obj)


def test_a_retained_chain_is_validated_on_its_own_and_must_end_at_the_newer_checkpoint():
    obj = valid_json()
    obj["retained"][0]["increments"][1]["previousChainDigest"] = "ee" * 32
    with pytest.raises(ManifestChainBroken):
        load(obj)
    obj = valid_json()
    obj["retained"][0]["head"]["lsn"] += 1
    with pytest.raises(ManifestChainBroken):
        load(obj)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o["head"].update(lsn=o["head"]["lsn"] + 1),
        lambda o: o["head"].update(chainDigest="dd" * 32),
        lambda o: o["head"].update(commitVersion=1),
        lambda o: o["increments"][1].update(commitVersion=0),  # goes back
        lambda o: o["increments"][1].update(lastLsn=o["increments"][1]["firstLsn"] - 1),
        lambda o: o.update(publicationId=mf.new_uuid7_hex()),
        lambda o: o["increments"][1].update(key=o["increments"][0]["key"]),
    ],
)
def test_a_head_range_or_publication_that_does_not_follow_is_a_broken_chain(mutate):
    obj = valid_json()
    mutate(obj)
    with pytest.raises((ManifestChainBroken, ManifestMalformed)):
        load(obj)


@pytest.mark.parametrize(
    "key",
    [
        "packs/increments/../current",
        "packs/increments//7-x.pack",
        "packs\\increments\\7.pack",
        "packs/checkpoints/7-{pub}.pack",  # the wrong namespace
        "packs/increments/8-{pub}.pack",  # the wrong generation
        "/packs/increments/7-{pub}.pack",
    ],
)
def test_a_key_outside_its_exact_pattern_is_refused(key):
    obj = valid_json()
    inc = obj["increments"][0]
    inc["key"] = key.format(pub=inc["publication"])
    with pytest.raises(ManifestMalformed, match="key"):
        load(obj)


def test_ids_and_keys_are_unique_across_the_manifest():
    obj = valid_json()
    retained_cp = obj["retained"][0]["checkpoint"]
    obj["checkpoint"]["id"] = retained_cp["id"]
    obj["checkpoint"]["key"] = mf.checkpoint_key(obj["checkpoint"]["throughGeneration"], retained_cp["id"])
    with pytest.raises(ManifestChainBroken, match="checkpoint id"):
        load(obj)
    obj = valid_json()
    dup = obj["retained"][0]["increments"][0]["publication"]
    _set_pub(obj["increments"][0], dup)
    with pytest.raises(ManifestChainBroken, match="publication"):
        load(obj)


def _set_pub(inc: dict, pub: str) -> None:
    inc["publication"] = pub
    inc["key"] = mf.increment_key(inc["generation"], pub)


def test_a_manifest_for_another_shard_is_refused():
    with pytest.raises(ManifestMalformed, match="logical shard"):
        mf.loads(valid_manifest().dumps(), logical_shard_id=new_id16())


def test_the_next_generation_never_overflows():
    m = dataclasses.replace(valid_manifest(), generation=(1 << 64) - 1)
    with pytest.raises(ManifestGenerationInvalid, match="overflow"):
        m.next_generation()


def test_pack_keys_parse_only_in_their_exact_form():
    pub = mf.new_uuid7_hex()
    assert mf.parse_pack_key(f"packs/increments/12-{pub}.pack") == ("increment", 12, pub)
    assert mf.parse_pack_key(f"packs/checkpoints/0-{pub}.pack") == ("checkpoint", 0, pub)
    for bad in (
        f"packs/increments/012-{pub}.pack",
        f"packs/increments/12-{pub.upper()}.pack",
        f"packs/increments/12-{'0' * 32}.pack",
        f"packs/increments/12-{pub}.pack.tmp",
        f"packs/increments/{1 << 64}-{pub}.pack",
        "current",
        f"packs/other/12-{pub}.pack",
    ):
        assert mf.parse_pack_key(bad) is None, bad
