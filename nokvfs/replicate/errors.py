"""The typed errors of replication, each a subclass of the nokvfs.errors class it refines.

A malformed or inconsistent `current` manifest is a FormatError (the CLI's exit code 5) and is
always raised before any pack is read. A pack whose bytes do not match its descriptor, or that
does not replay to the manifest's chain, is an IntegrityError (also 5). A publisher whose owner
epoch is older than the manifest's is nokvfs.errors.OwnerFenced (7), raised as is.
"""

from __future__ import annotations

from nokvfs.engine import replay as _engine_replay
from nokvfs.errors import FormatError, IntegrityError, StoreError


class ManifestError(FormatError):
    """The `current` manifest is not a valid version 1 manifest for this shard."""


class ManifestMalformed(ManifestError):
    """Not strict JSON, or a duplicate name, an unknown or missing field, an explicit null, a
    value of the wrong type or range, a key outside its namespace pattern."""


class ManifestVersionUnsupported(ManifestError):
    """The manifest's `version` is not one this reader knows (it is checked before anything else)."""


class ManifestGenerationInvalid(ManifestError):
    """Generations do not increase strictly: inside the manifest (checkpoint cutoff, increments,
    retained generations) or from one read of `current` to the next."""


class ManifestChainBroken(ManifestError):
    """The descriptors do not form one chain: an LSN gap or overlap, a previous chain digest that
    is not the prior pack's last, a head that is not the tail's end, a duplicated key or id."""


class PackCorrupt(IntegrityError):
    """A pack's size or SHA-256 differs from its descriptor, or its framing does not parse."""


class PackMissing(IntegrityError):
    """A pack the validated manifest references is absent from the bucket."""


class PackConflict(IntegrityError):
    """A pack key already holds bytes whose recorded SHA-256 or size differ from ours."""


# A record of an increment that did not replay to the chain digest it carries (defined where
# replay is: nokvfs.engine.replay).
ReplayFailed = _engine_replay.ReplayFailed


class ReplicaDiverged(IntegrityError):
    """The local shard's outbox is not an extension of the bucket's chain (another shard, another
    history, or a local shard behind the bucket): nothing is published."""


class NotShipped(StoreError):
    """The increment holding an LSN did not reach the bucket within the time asked for."""
