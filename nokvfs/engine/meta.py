"""LMDB's own file, checked where row checksums cannot reach: the meta pages and rollback.

LMDB keeps two meta pages at the start of data.mdb and, on every open and every transaction, uses
the one with the higher transaction id; each names the roots of the B-trees. Their bytes carry no
checksum, and a damaged one is not always an LMDB error: a changed transaction id makes LMDB
use the other, older meta page, which is a consistent but *earlier* shard (a rollback: rows
served intact, but stale); a changed page size, map size or version is an open error LMDB words
as EINVAL, ENOMEM or "version mismatch". So before LMDB opens the file, `check_meta_pages` parses
both meta pages (LMDB 0.9 layout, data version 1) and holds them to what LMDB itself writes:

* page p carries P_META, the magic 0xBEEFC0DE, data version 1, no fixed map address;
* both carry the same power-of-two page size, a map size below 2**47 and a last page inside the
  file; each B-tree root is P_INVALID (empty) or a page number in 2..last page; the free-page
  tree has MDB_INTEGERKEY and the main tree no flags, depths at most 32;
* the transaction id of the meta page written for commit t is in page t % 2, so page 0 holds an
  even and page 1 an odd id, and the two differ by exactly one (a compacted file: 0, 1; a file
  never committed to: 0, 0).

Anything else is ShardCorrupt naming the field. That leaves a damaged transaction id that still
keeps both rules (N becoming N - 2), and a data.mdb replaced by an older copy: both are a
rollback, which the commit witness catches. After every committed write the engine records the
recovery LSN it committed in `commit-witness` beside data.mdb (20 bytes: "NKW1", u64 LSN, u64
xxh3-64 of the first 12 bytes; written after LMDB's fsync'd commit, so it never runs ahead of
durable state; not fsync'd itself, so a crash can only leave it behind). Opening refuses a shard
whose recovery tail is older than its witness; a witness that does not verify is ignored (logged)
and rewritten by the next commit.
"""

from __future__ import annotations

import logging
import os
import struct

import xxhash

from nokvfs import filemodes
from nokvfs.errors import ShardCorrupt

log = logging.getLogger(__name__)

DATA_FILE = "data.mdb"
WITNESS_NAME = "commit-witness"

_PAGE_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_META_HEAD = struct.Struct("<IIQQ")  # magic, version, address, mapsize
_DB = struct.Struct("<IHHQQQQQ")  # pad (page size in FREE_DBI), flags, depth, branch, leaf, overflow, entries, root
_META_TAIL = struct.Struct("<QQ")  # last_pg, txnid
_P_META = 0x08
_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_INTEGERKEY = 0x08
_P_INVALID = (1 << 64) - 1
_MAX_MAPSIZE = 1 << 47
_MAX_DEPTH = 32
_WITNESS = struct.Struct(">4sQ")
_WITNESS_MAGIC = b"NKW1"


def _meta(raw: bytes, page: int, psize_at: int):
    offset = page * psize_at
    pgno, _, flags, _, _ = _PAGE_HEADER.unpack_from(raw, offset)
    magic, version, address, mapsize = _META_HEAD.unpack_from(raw, offset + 16)
    free = _DB.unpack_from(raw, offset + 40)
    main = _DB.unpack_from(raw, offset + 40 + _DB.size)
    last_pg, txnid = _META_TAIL.unpack_from(raw, offset + 40 + 2 * _DB.size)
    return dict(
        pgno=pgno,
        flags=flags,
        magic=magic,
        version=version,
        address=address,
        mapsize=mapsize,
        free=free,
        main=main,
        last_pg=last_pg,
        txnid=txnid,
    )


def check_meta_pages(directory: str) -> int:
    """ShardCorrupt unless both meta pages of the environment in `directory` are what LMDB
    writes; returns the transaction id LMDB will open at."""
    path = os.path.join(directory, DATA_FILE)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(4096)
            if len(head) < 40 + 2 * _DB.size + _META_TAIL.size:
                raise ShardCorrupt(f"{path} is too short to hold LMDB's meta pages ({size} bytes)")
            psize = _DB.unpack_from(head, 40)[0]
            if psize < 512 or psize > 65536 or psize & (psize - 1):
                raise ShardCorrupt(f"{path}: meta page 0 records a page size of {psize}")
            f.seek(0)
            raw = f.read(2 * psize)
    except OSError as exc:
        raise ShardCorrupt(f"cannot read LMDB's meta pages from {path}: {exc}") from None
    if len(raw) < 2 * psize:
        raise ShardCorrupt(f"{path} is too short to hold LMDB's two meta pages ({size} bytes)")
    pages = size // psize
    metas = [_meta(raw, page, psize) for page in (0, 1)]
    for page, meta in enumerate(metas):
        where = f"{path}: meta page {page}"
        problems = []
        if meta["pgno"] != page or meta["flags"] != _P_META:
            problems.append(f"page header (number {meta['pgno']}, flags {meta['flags']:#x})")
        if meta["magic"] != _MAGIC or meta["version"] != _DATA_VERSION:
            problems.append(f"magic {meta['magic']:#x} / data version {meta['version']}")
        if meta["address"] != 0:
            problems.append(f"a fixed map address {meta['address']:#x}")
        if meta["free"][0] != psize:
            problems.append(f"page size {meta['free'][0]}, not {psize}")
        if not 0 < meta["mapsize"] <= _MAX_MAPSIZE:
            problems.append(f"map size {meta['mapsize']}")
        if not 1 <= meta["last_pg"] < pages:
            problems.append(f"last page {meta['last_pg']} of a {pages}-page file")
        for name, db, flags in (("free-page", meta["free"], _INTEGERKEY), ("main", meta["main"], 0)):
            _, db_flags, depth, branch, leaf, overflow, _, root = db
            if db_flags != flags or depth > _MAX_DEPTH:
                problems.append(f"{name} tree flags {db_flags:#x} / depth {depth}")
            if root != _P_INVALID and not 2 <= root <= meta["last_pg"]:
                problems.append(f"{name} tree root page {root}")
            if (root == _P_INVALID) != (depth == 0) or branch + leaf + overflow > meta["last_pg"]:
                problems.append(f"{name} tree shape (depth {depth}, {branch}+{leaf}+{overflow} pages, root {root})")
        if meta["txnid"] % 2 != page and (metas[0]["txnid"], metas[1]["txnid"]) != (0, 0):
            problems.append(f"transaction id {meta['txnid']} of the wrong parity")
        if problems:
            raise ShardCorrupt(f"{where} is damaged: " + "; ".join(problems))
    t0, t1 = metas[0]["txnid"], metas[1]["txnid"]
    if abs(t0 - t1) != 1 and (t0, t1) != (0, 0):
        raise ShardCorrupt(f"{path}: the meta pages' transaction ids {t0} and {t1} are not consecutive: one is damaged")
    return max(t0, t1)


class CommitWitness:
    """The last recovery LSN this shard's directory saw committed (see the module docstring)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, WITNESS_NAME)
        self._fd: int | None = None

    def read(self) -> int | None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(64)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("commit witness %s unreadable (%s): ignored", self.path, exc)
            return None
        if len(raw) != _WITNESS.size + 8 or raw[_WITNESS.size :] != xxhash.xxh3_64_digest(raw[: _WITNESS.size]):
            log.warning("commit witness %s does not verify: ignored (the next commit rewrites it)", self.path)
            return None
        magic, lsn = _WITNESS.unpack_from(raw)
        return lsn if magic == _WITNESS_MAGIC else None

    def check(self, applied_lsn: int) -> None:
        """ShardCorrupt if the shard's recovery tail is older than the last commit witnessed."""
        witnessed = self.read()
        if witnessed is not None and applied_lsn < witnessed:
            raise ShardCorrupt(
                f"{os.path.dirname(self.path)} holds the shard as of recovery LSN {applied_lsn}, but LSN "
                f"{witnessed} was committed here: LMDB opened an older state (a damaged meta page, or "
                "data.mdb replaced by an older copy)"
            )

    def record(self, applied_lsn: int) -> None:
        """Write the witness (one pwrite, no fsync). Never raises: losing it only weakens a check."""
        body = _WITNESS.pack(_WITNESS_MAGIC, applied_lsn)
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, filemodes.FILE_MODE)
            os.pwrite(self._fd, body + xxhash.xxh3_64_digest(body), 0)
        except OSError as exc:
            log.warning("commit witness %s not written: %s", self.path, exc)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
