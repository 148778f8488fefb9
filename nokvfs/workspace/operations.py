"""Operation rows shared by every state machine: finding the ones not yet terminal."""

from __future__ import annotations

from nokvfs.engine.scan import iter_prefix
from nokvfs.schema import keys
from nokvfs.schema.enums import OperationKind
from nokvfs.schema.records import OPERATION_RECORDS


def pending(view, root, kind: OperationKind, terminal) -> list[tuple[bytes, object]]:
    """(operation id, record) of every operation of `kind` whose phase is not in `terminal`."""
    record = OPERATION_RECORDS[kind]
    out = []
    for key, value in iter_prefix(view, "operation", keys.operation_prefix(root.root_id, kind)):
        operation = record.decode(value)
        if operation.phase not in terminal:
            out.append((keys.OperationKey.decode(key).operation_id, operation))
    return out
