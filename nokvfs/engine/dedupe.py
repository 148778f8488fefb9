"""The stored form of CommandDedupe rows (the result an exact request-id replay returns).

A command's result is stored in its dedupe row for as long as the row is retained; a publish's
final result (the published revision: ids, digest URIs, content type) is a few hundred bytes that
share most of their structure with the preset dictionary (nokvfs.engine.compression). So a row
whose result exceeds 128 bytes and deflates smaller is a DeflatedCommandDedupe (version 3: the
result as one zlib stream primed with the dictionary); any other is the seed's CommandDedupe
(version 2). Readers take either and see the same CommandDedupe.
"""

from __future__ import annotations

from nokvfs.engine import compression
from nokvfs.engine.records import DeflatedCommandDedupe
from nokvfs.errors import CorruptRecord
from nokvfs.schema.records import CommandDedupe


def encode(record: CommandDedupe) -> bytes:
    deflated = compression.deflate(record.result)
    if deflated is None:
        return record.encode()
    return DeflatedCommandDedupe(
        command_digest=record.command_digest,
        result_length=len(record.result),
        deflated_result=deflated,
        commit_version=record.commit_version,
        recovery_lsn=record.recovery_lsn,
    ).encode()


def decode(raw: bytes) -> CommandDedupe:
    """The CommandDedupe a stored row holds, or a FormatError (unknown versions included)."""
    if raw[:1] != bytes([DeflatedCommandDedupe.VERSION]):
        return CommandDedupe.decode(raw)
    stored = DeflatedCommandDedupe.decode(raw)
    try:
        result = compression.inflate(stored.deflated_result, stored.result_length)
    except ValueError as exc:
        raise CorruptRecord(f"DeflatedCommandDedupe: {exc}") from None
    return CommandDedupe(stored.command_digest, result, stored.commit_version, stored.recovery_lsn)
