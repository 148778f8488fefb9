"""The write-back acceptance journal (nokvfs.fs.writeback): its bytes, its torn tail, the
versions it refuses, and how the next mount turns a dead daemon's journal back into spools."""

from __future__ import annotations

import json
import os

import pytest

from nokvfs.errors import CorruptRecord, UnknownVersion
from nokvfs.fs import spools, writeback

ACCEPTED_META = {"spool": "wb--a--00.spool", "path": "outputs/a", "state": "pending"}
GOLDEN_ACCEPTED = (
    "4e4b5742"
    "01"
    "01"
    "00000040" + b'{"path":"outputs/a","spool":"wb--a--00.spool","state":"pending"}'.hex() + "01"
    "0000000000000002"
    "6869" + "6e316ebd76f5911c"
)
GOLDEN_PUBLISHED = (
    "4e4b574201020000001b" + b'{"spool":"wb--a--00.spool"}'.hex() + "000000000000000000" + "85f835325176d189"
)


def test_golden_bytes():
    assert writeback.encode_record(writeback.ACCEPTED, ACCEPTED_META, b"hi").hex() == GOLDEN_ACCEPTED
    assert writeback.encode_record(writeback.PUBLISHED, {"spool": "wb--a--00.spool"}).hex() == GOLDEN_PUBLISHED
    data = bytes.fromhex(GOLDEN_ACCEPTED + GOLDEN_PUBLISHED)
    assert writeback.decode_records(data) == [(1, ACCEPTED_META, b"hi"), (2, {"spool": "wb--a--00.spool"}, None)]


DIRECTORY_META = {
    "spool": "directory-00ff",
    "workbench": "wb",
    "incarnation": "0a0b",
    "path": "outputs/d",
    "changes": {"mode": 448},
    "made_ns": 5,
    "changed_ns": 7,
}
GOLDEN_DIRECTORY = (
    "4e4b5742"
    "01"
    "03"
    "00000085"
    + b'{"changed_ns":7,"changes":{"mode":448},"incarnation":"0a0b","made_ns":5,"path":"outputs/d",'
    b'"spool":"directory-00ff","workbench":"wb"}'.hex()
    + "00"
    "0000000000000000"
    "d9a205a6ed2da691"
)


def test_golden_bytes_of_a_directory_change():
    raw = writeback.encode_record(writeback.DIRECTORY, DIRECTORY_META)
    assert raw.hex() == GOLDEN_DIRECTORY
    assert writeback.decode_records(bytes.fromhex(GOLDEN_DIRECTORY)) == [(3, DIRECTORY_META, None)]


@pytest.mark.parametrize(
    "change",
    [
        {"changes": {"mode": "700"}},
        {"changes": {"size": 1}},
        {"changes": []},
        {"incarnation": "not hex"},
        {"path": 7},
        {"made_ns": 1.5},
        {"changed_ns": None},
        {"workbench": None},
    ],
)
def test_a_directory_change_with_unreadable_fields_is_refused(change):
    with pytest.raises(CorruptRecord):
        writeback.decode_records(writeback.encode_record(writeback.DIRECTORY, dict(DIRECTORY_META, **change)))
    missing = {k: v for k, v in DIRECTORY_META.items() if k not in change}
    with pytest.raises(CorruptRecord):
        writeback.decode_records(writeback.encode_record(writeback.DIRECTORY, missing))
    with pytest.raises(CorruptRecord):  # a directory change has no body
        writeback.decode_records(writeback.encode_record(writeback.DIRECTORY, DIRECTORY_META, b"x"))


def test_restore_returns_the_directory_changes_in_queue_order(tmp_path):
    # A change accepted again moves to the end (as in the publisher's queue); a published one is done.
    data = str(tmp_path)

    def change(name, path, **changes):
        return dict(DIRECTORY_META, spool=name, path=path, changes=changes)

    path = _journal(
        data,
        [
            writeback.encode_record(writeback.DIRECTORY, change("directory-1", "outputs/a", mode=0o700)),
            writeback.encode_record(writeback.DIRECTORY, change("directory-2", "outputs/b", mode=0o755)),
            writeback.encode_record(writeback.DIRECTORY, change("directory-3", "outputs/c", mode=0o711)),
            writeback.encode_record(writeback.PUBLISHED, {"spool": "directory-2"}),
            writeback.encode_record(writeback.DIRECTORY, change("directory-1", "outputs/a", mode=0o700, mtime_ns=9)),
        ],
    )
    restored, directories, journals = writeback.restore_journals(data)
    assert (restored, journals) == (0, [path])
    assert [(d["path"], d["changes"]) for d in directories] == [
        ("outputs/c", {"mode": 0o711}),
        ("outputs/a", {"mode": 0o700, "mtime_ns": 9}),
    ]


def test_a_torn_or_damaged_tail_ends_the_journal():
    first = bytes.fromhex(GOLDEN_ACCEPTED)
    second = writeback.encode_record(writeback.ACCEPTED, dict(ACCEPTED_META, spool="wb--b--01.spool"), b"x" * 100)
    for cut in range(1, len(second)):
        assert writeback.decode_records(first + second[:cut]) == [(1, ACCEPTED_META, b"hi")]
    damaged = bytearray(second)
    damaged[40] ^= 0xFF
    assert writeback.decode_records(first + bytes(damaged)) == [(1, ACCEPTED_META, b"hi")]


def _resealed(raw: bytes, position: int, value: int) -> bytes:
    """`raw` with one byte changed and its checksum made right again: a whole record of a kind
    or version this build does not know."""
    import xxhash

    body = bytearray(raw[:-8])
    body[position] = value
    return bytes(body) + xxhash.xxh3_64_intdigest(bytes(body)).to_bytes(8, "big")


def test_unknown_versions_and_kinds_are_refused():
    raw = bytes.fromhex(GOLDEN_ACCEPTED)
    with pytest.raises(UnknownVersion):
        writeback.decode_records(_resealed(raw, 4, 2))
    with pytest.raises(CorruptRecord):
        writeback.decode_records(_resealed(raw, 5, 9))
    with pytest.raises(CorruptRecord):
        writeback.decode_records(writeback.encode_record(writeback.ACCEPTED, {"spool": "../escape"}, b""))


def _journal(data_dir: str, records: list[bytes]) -> str:
    directory = spools.spool_dir(data_dir)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "writeback-00ff.journal")
    with open(path, "wb") as f:
        f.write(b"".join(records))
    return path


def test_restore_turns_a_dead_daemons_journal_into_pending_spools(tmp_path):
    data = str(tmp_path)
    directory = spools.spool_dir(data)

    def meta(name, path):
        return {"spool": name, "path": path, "workbench": "wb", "state": "pending", "size": 2}

    os.makedirs(directory)
    with open(os.path.join(directory, "big.spool"), "wb") as f:
        f.write(b"BIG")
    path = _journal(
        data,
        [
            writeback.encode_record(writeback.ACCEPTED, meta("small.spool", "outputs/small"), b"v1"),
            writeback.encode_record(writeback.ACCEPTED, meta("gone.spool", "outputs/gone"), b"g1"),
            writeback.encode_record(writeback.ACCEPTED, meta("big.spool", "outputs/big"), None),
            writeback.encode_record(writeback.PUBLISHED, {"spool": "gone.spool"}),
            writeback.encode_record(writeback.ACCEPTED, meta("small.spool", "outputs/small"), b"v2"),
            writeback.encode_record(writeback.ACCEPTED, meta("never.spool", "outputs/never"), b"torn")[:-3],
        ],
    )
    restored, directories, journals = writeback.restore_journals(data)
    assert (restored, directories, journals) == (2, [], [path])  # replay removes it once all is stored
    with open(os.path.join(directory, "small.spool"), "rb") as f:
        assert f.read() == b"v2"  # the last acceptance of a file wins
    assert not os.path.exists(os.path.join(directory, "gone.spool"))  # published
    assert not os.path.exists(os.path.join(directory, "never.spool"))  # its close never returned
    for name in ("small", "big"):
        with open(os.path.join(directory, f"{name}.spool.json")) as f:
            record = json.load(f)
        assert record["state"] == "pending" and record["path"] == f"outputs/{name}" and "spool" not in record
    assert [s.record["path"] for s in spools.scan(data)] == ["outputs/big", "outputs/small"]


def test_a_journal_this_build_cannot_read_is_left_in_place(tmp_path):
    data = str(tmp_path)
    raw = _resealed(writeback.encode_record(writeback.ACCEPTED, {"spool": "a.spool", "path": "outputs/a"}, b"x"), 4, 7)
    path = _journal(data, [raw])
    assert writeback.restore_journals(data) == (0, [], [])
    with open(path, "rb") as f:
        assert f.read() == raw
