"""The publish pipeline: object-first, metadata-last.

    Uploading -> Finalizing -> Published
    Uploading -> Aborting -> Cleaning -> Cleaned | Quarantined
    Finalizing -> Aborting   (only with proof that no publication or dedupe row exists)
    Quarantined -> Cleaning  (reconciliation, once the store answers: `reconcile`)

1. One command creates the PublishOperation (Uploading) and the exact StagedObject ledger: every
   object key, length and digest the upload will write, before the first byte is sent.
2. The blocks are uploaded under those keys (multipart for blocks above the store's multipart
   threshold: the intent to upload in parts is recorded in the ledger before the upload is
   created, and its upload id before any part is sent). A one-block body on a local store is
   written under no key while step 1 commits, and linked at its key after.
3. One command CASes Uploading -> Finalizing and marks the ledger Uploaded. In `run` it is not
   flushed on its own (Shard.apply durable=False): step 4's flush makes both durable, and a power
   loss between them leaves Uploading, which recovery aborts and cleans.
4. One command creates the ArtifactRevision (Available), its manifest, the Path reference,
   PathCurrent, the workspace revision, index rows, the ChangeEvent and the dedupe result, and
   changes Finalizing -> Published. A lost race there takes the operation over to Aborting.

A body without blocks (an empty file, a directory's marker) has nothing to upload: its steps 1, 3
and 4 are one write transaction with one flush (`_run_bodiless`, Shard.apply_group), each command
applied as it would be alone.

A crash leaves the operation in its phase; `recover` (run when a root is opened for writing)
resumes Finalizing from the ledger and cleans everything else, but only for operations whose
owning process is gone (each live publish holds its operations.OperationLock).

The staging API (`begin`, `upload`, `finalize`, `read_ledger`, `manifest_rows`,
`object_present`, `abort`) is public: nokvfs.workspace.staging drives steps 1-3 for the typed
manifests of commit and restore, whose own state machine then publishes them.

A Quarantined publish is reconciled by `gc` (`reconcile`, README "Reconciliation").

Crash points (operations.crash_point): after-stage (a one-block body's object written under no
key, its fsync running, the begin not started: `_stage_during_begin`), after-begin, after-upload-<block index>,
after-multipart-create-<block index>, after-multipart-record-<block index>, after-finalize, before-publish-command,
after-publish-command, after-abort, after-cleaning, after-reconcile.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import threading
from dataclasses import dataclass, field

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import iter_prefix, scan_prefix
from nokvfs.errors import (
    AmbiguousResult,
    GenerationConflict,
    InvalidInput,
    NokvError,
    NotFound,
    ObjectMissing,
    PredicateFailed,
    StoreError,
)
from nokvfs.objects.keys import artifact_block_key
from nokvfs.objects.store import stage_put
from nokvfs.schema import keys
from nokvfs.schema.enums import (
    ChangeEventKind,
    OperationKind,
    PublishPhase,
    ReferenceKind,
    RevisionState,
    StagedCleanupState,
    StagedProviderState,
)
from nokvfs.schema.ids import new_id16
from nokvfs.schema.paths import join, normalize_path
from nokvfs.schema.records import (
    ArtifactManifest,
    ArtifactRevision,
    PathEntry,
    PublishOperation,
    SecondaryIndex,
    StagedObject,
)
from nokvfs.workspace import attributes, hashstates
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.body import Body
from nokvfs.workspace.operations import (
    CRASH_ENV,  # noqa: F401 - re-exported for callers
    Rows,
    crash_point,
    drive_each,
    driving,
)
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest

log = logging.getLogger(__name__)

RUN_MANIFEST = ("metadata", "run_manifest.json")
RESTORE_MANIFEST = ("metadata", "restore_manifest.json")
RESERVED_MANIFESTS = (RUN_MANIFEST, RESTORE_MANIFEST)
LEDGER_BATCH = 256  # objects deleted per cleanup command
UPLOAD_BLOCKS_IN_FLIGHT = 4  # blocks of one body sent at once (each held in memory while sent)
ROW_BATCH = 4096  # ledger or manifest rows per command (the engine bounds a command)
DEFAULT_CONTENT_TYPE = "application/octet-stream"
TERMINAL = (PublishPhase.Published, PublishPhase.Cleaned, PublishPhase.Quarantined)
ROWS = Rows(OperationKind.Publish, "publish", TERMINAL)


def check_publishable(components: tuple[str, ...], *, directory_marker: bool = False) -> None:
    """Artifact paths live below a section; sections and the typed manifests refuse generic writes.

    A directory's attribute marker (attributes.DIRECTORY_MARKER) is written only by the
    directory-attribute functions of namespace, which pass `directory_marker=True`; the name is
    refused anywhere else in a path.
    """
    from nokvfs.errors import ReservedPath

    if components[0] not in wb.SECTIONS:
        raise InvalidInput(f"artifact paths must start with a section {wb.SECTIONS}, not {components[0]!r}")
    if len(components) == 1:
        raise InvalidInput(f"{components[0]!r} is a section; it cannot be replaced or removed")
    if components in RESERVED_MANIFESTS:
        raise ReservedPath(f"{join(components)} is written only by its commit/restore state machine")
    if (
        attributes.DIRECTORY_MARKER in components[:-1]
        or (components[-1] == attributes.DIRECTORY_MARKER) != directory_marker
    ):
        if directory_marker:
            raise InvalidInput(f"{join(components)} is not a directory marker path")
        raise ReservedPath(
            f"{attributes.DIRECTORY_MARKER!r} is reserved for a directory's attributes: {join(components)}"
        )


def path_owner(incarnation: bytes, components: tuple[str, ...]) -> bytes:
    return keys.path_reference_owner(incarnation, components)


def manifest_digest(rows: list[ArtifactManifest]) -> bytes:
    h = hashlib.sha256(b"nokv.artifact_manifest.v1\0")
    for row in rows:
        encoded = row.encode()
        h.update(len(encoded).to_bytes(4, "big") + encoded)
    return h.digest()


@dataclass
class Publication:
    """Everything one publication needs; built by put or append, executed by `run`."""

    workbench_id: str
    components: tuple[str, ...]
    body: Body  # the bytes this revision uploads and owns
    logical_size: int  # of the complete resulting body
    body_digest_uri: str  # of the complete resulting body
    expected_generation: int | None = None  # None: unconditional; 0: must not exist
    expected_revision_id: bytes | None = None  # the exact revision the path must hold (ABA-safe)
    content_type: str = DEFAULT_CONTENT_TYPE
    producer: str = ""
    index_fields: tuple = ()
    reused: tuple = ()  # ArtifactManifest rows of a base revision, in body order (append)
    base_revision_id: bytes | None = None
    event_kind: ChangeEventKind = ChangeEventKind.PathPut
    revision_id: bytes = field(default_factory=new_id16)
    operation_id: bytes = field(default_factory=new_id16)
    # The request ids of the begin and finalize commands, minted before `request_id` (the final
    # command's): the three CommandDedupe keys of a publish are then written in key order and
    # appended, which fills their pages instead of splitting them in half.
    begin_request_id: bytes = field(default_factory=new_id16)
    finalize_request_id: bytes = field(default_factory=new_id16)
    request_id: bytes = field(default_factory=new_id16)
    # Called as progress(bytes_uploaded, bytes_total) after each block (not durable).
    progress: object = None


def _staged_key(root, operation_id: bytes, sequence: int) -> bytes:
    return keys.StagedObjectKey(root.root_id, operation_id, sequence).encode()


def read_operation(view, root, operation_id: bytes) -> tuple[bytes, PublishOperation]:
    return ROWS.read(view, root, operation_id)


def read_ledger(view, root, operation_id: bytes) -> list[tuple[bytes, StagedObject]]:
    """Every (key, StagedObject) row of the operation's ledger, in block order."""
    prefix = keys.staged_object_prefix(root.root_id, operation_id)
    rows, marker = [], None
    while True:
        page = scan_prefix(view, "staged_object", prefix, start_after=marker)
        rows += [(k, StagedObject.decode(v)) for k, v in page.items]
        if page.next_marker is None:
            return rows
        marker = page.next_marker


# --- the pipeline ---------------------------------------------------------------------------


def run(root, pub: Publication) -> PathEntry:
    """Drive one publication to Published, or clean it up and raise."""
    check_publishable(pub.components, directory_marker=pub.content_type == attributes.DIRECTORY_CONTENT_TYPE)
    check_key_lengths(root, pub.components, pub.index_fields)
    _precheck(root, pub)
    with driving(root, pub.operation_id, "publish"):
        if not pub.body.blocks and not pub.reused:
            return _run_bodiless(root, pub)
        staged = _stage_during_begin(root, pub)
        try:
            begin(root, pub)
        except BaseException:
            _drop_staged(staged)
            raise
        crash_point("after-begin")
        try:
            upload(root, pub, staged=staged)
            finalize(root, pub.operation_id, durable=False, request_id=pub.finalize_request_id)
            _settle_staged(staged)  # the object durable before the final command names it
        except BaseException as exc:
            _drop_staged(staged)
            _abort_after_failure(root, pub.operation_id, exc)
            raise
        crash_point("after-finalize")
        try:
            entry = _publish(root, pub.operation_id)
        except BaseException as exc:
            # Whatever refused the final command (a lost CAS, a key the shard cannot store, a
            # shard that kept moving), the caller is told the publish failed, so it must not be
            # left Finalizing for a later recovery to publish. The takeover is fenced by the
            # absence of the final command's dedupe row, so it can never undo a publication.
            _abort_after_failure(root, pub.operation_id, exc)
            raise
        _remember_hash(pub, entry)
        return entry


def _remember_hash(pub: Publication, entry: PathEntry) -> None:
    """Keep the whole-body hash state of a published body, for an append to continue
    (nokvfs.workspace.hashstates); an append's delta is not a whole body (it keeps its own)."""
    if not pub.reused and entry.artifact_revision_id == pub.revision_id and entry.logical_size == pub.body.size:
        hashstates.STATES.remember(pub.revision_id, pub.body.size, pub.body.hasher, pub.body_digest_uri)


def _run_bodiless(root, pub: Publication) -> PathEntry:
    """A body without blocks (an empty file, a directory's marker): nothing is uploaded, so the
    ledger-before-bytes order has nothing to order, and the three commands (begin, finalize, the
    final command) go in one write transaction with one flush (Shard.apply_group applies each
    exactly as alone: the outbox, a replica and a reader cannot tell). A crash leaves nothing or
    the publication. Each command stays atomic on its own: one refused after begin (a lost race
    at the final command) takes the operation through Aborting to Cleaned, as `run` does."""
    with root.read() as view:
        incarnation = wb.visible(view, root.root_id, pub.workbench_id)[1].incarnation_id
    results = root.apply_group(
        [
            (
                lambda view: _begin_built(root, pub, incarnation, view),
                intent_digest("publish.begin", pub.operation_id),
                pub.begin_request_id,
            ),
            (
                lambda view: _finalize_built(root, pub.operation_id, view),
                intent_digest("publish.finalize", pub.operation_id, 0),
                pub.finalize_request_id,
            ),
            (
                lambda view: _publish_built(root, pub.operation_id, pub.components, view),
                intent_digest("publish.final", pub.operation_id),
                pub.request_id,
            ),
        ]
    )
    (began, _), (finalized, _), (final, built) = results
    if isinstance(began, Exception):
        raise began  # nothing was created
    if not isinstance(final, Exception):
        # Applied, or replayed by its request id (a retry of a publication that completed: its
        # finalize, rebuilt on the Published operation, is refused and changes nothing).
        entry = PathEntry.decode(final.result) if final.replayed else built.value
        _remember_hash(pub, entry)
        return entry
    refused = finalized if isinstance(finalized, Exception) else final
    _abort_after_failure(root, pub.operation_id, refused)
    raise refused


def _stage_during_begin(root, pub: Publication):
    """A one-block body's object written under no key (objects.store.stage_put), its fsync left
    running while `begin` commits the ledger, so the two flushes overlap instead of one
    following the other. Nothing can name the bytes before the ledger that owns their key is
    durable (`upload` links them only after `begin` returned), and a crash before that leaves no
    object (an unnamed temp vanishes; a named one is swept as stale). None when there is nothing
    to overlap (several blocks, a multipart-sized block, a store that cannot stage, a block
    already staged)."""
    if len(pub.body.blocks) != 1 or getattr(type(root.store), "stage_put", None) is None:
        return None
    block = pub.body.blocks[0]
    ahead = pub.body.prestaged.get(block.index)
    if ahead is not None and ahead.matches(block):
        return None  # staged while the file was written (nokvfs.workspace.prestage): `upload` links it
    threshold = getattr(root.store, "multipart_threshold", None)
    if threshold is not None and block.length > threshold:
        return None
    key = artifact_block_key(root.logical_shard_id, root.root_id, pub.revision_id, block.index)
    # read_block has just checked the bytes against the plan's digest: the store may keep it.
    staged = stage_put(root.store, pub.body.read_block(block), key, block.sha256)
    crash_point("after-stage")
    return staged


def _settle_staged(staged) -> None:
    """Wait until a staged object `upload` linked is durable (its directory fsyncs, which ran
    beside the finalize command: Finalizing may be on disk before the object is, and recovery
    then finds the object missing and aborts, as it would for any lost upload)."""
    if staged is not None:
        staged.wait()


def _drop_staged(staged) -> None:
    """Discard a staged object that was not committed (after a failure)."""
    if staged is not None:
        staged.discard()


# --- group commit -------------------------------------------------------------------------------
#
# `run_group` drives several publications through the same state machine as `run`, each step one
# write transaction for all of them (nokvfs.engine.shard.Shard.apply_group): begin for N, the
# uploads, finalize for N, the final command for N. Each publication keeps its own operation,
# ledger, request id and commands, built by the same functions `run` uses, so a crash at any
# point leaves each one in a phase `recover` resumes or cleans exactly as after `run`. A
# publication refused at any step (a conflict, a failed upload) is aborted and cleaned alone; the
# others go on. The crash points are `run`'s, at the same boundaries of the state machine (each
# reached once per group). GROUP_MAX bounds a group (one transaction's size and the time it holds the writer).
# A group's uploads hold every block of it in memory at once (one put_many), so only small files
# join one (GROUP_FILE_MAX bytes) and a group holds at most GROUP_BYTES_MAX: a larger file runs
# alone through `run`, which streams its blocks (UPLOAD_BLOCKS_IN_FLIGHT at a time).

GROUP_MAX = 64
GROUP_FILE_MAX = 16 * 1024 * 1024
GROUP_BYTES_MAX = 64 * 1024 * 1024


def groupable(root, pub: Publication) -> bool:
    """Whether a publication fits the group path: its ledger and manifest in one command each,
    no multipart upload, no reused rows (an append's own pipeline runs alone)."""
    threshold = getattr(root.store, "multipart_threshold", None)
    return (
        not pub.reused
        and pub.body.size <= GROUP_FILE_MAX
        and 2 * len(pub.body.blocks) <= ROW_BATCH
        and (threshold is None or all(block.length <= threshold for block in pub.body.blocks))
    )


def run_group(root, pubs: list[Publication]) -> list:
    """Drive publications to Published with group commit, in order: per publication its
    PathEntry, or the error that refused it (its operation aborted and cleaned, as `run` does).
    Publications `groupable` refuses run alone through `run`, in their place."""
    results: list = [None] * len(pubs)
    group: list[int] = []
    group_bytes = 0
    for index, pub in enumerate(pubs):
        if groupable(root, pub) and len(group) < GROUP_MAX and group_bytes + pub.body.size <= GROUP_BYTES_MAX:
            group.append(index)
            group_bytes += pub.body.size
            continue
        _run_group_part(root, pubs, group, results)
        group, group_bytes = [], 0
        if groupable(root, pub):
            group.append(index)
            group_bytes = pub.body.size
        else:
            try:
                results[index] = run(root, pub)
            except NokvError as exc:
                results[index] = exc
    _run_group_part(root, pubs, group, results)
    return results


def _run_group_part(root, pubs: list[Publication], indexes: list[int], results: list) -> None:
    live = []
    for index in indexes:
        pub = pubs[index]
        try:
            check_publishable(pub.components, directory_marker=pub.content_type == attributes.DIRECTORY_CONTENT_TYPE)
            check_key_lengths(root, pub.components, pub.index_fields)
            _precheck(root, pub)
        except NokvError as exc:
            results[index] = exc
            continue
        live.append(index)
    if not live:
        return
    with contextlib.ExitStack() as locks:
        for index in live:
            locks.enter_context(driving(root, pubs[index].operation_id, "publish"))
        incarnations: dict = {}
        with root.read() as view:
            for index in list(live):
                workbench_id = pubs[index].workbench_id
                try:
                    if workbench_id not in incarnations:
                        incarnations[workbench_id] = wb.visible(view, root.root_id, workbench_id)[1].incarnation_id
                except NokvError as exc:
                    results[index] = exc
                    live.remove(index)
        live = _group_step(
            root,
            live,
            results,
            lambda index: (
                lambda view: _begin_built(root, pubs[index], incarnations[pubs[index].workbench_id], view),
                intent_digest("publish.begin", pubs[index].operation_id),
                None,
            ),
            abort_refused=False,  # nothing was created for a refused begin
            pubs=pubs,
        )
        crash_point("after-begin")
        for index, exc in _upload_group(root, [pubs[index] for index in live], live):
            _abort_after_failure(root, pubs[index].operation_id, exc)
            results[index] = exc
            live.remove(index)
        live = _group_step(
            root,
            live,
            results,
            lambda index: (
                lambda view: _finalize_built(root, pubs[index].operation_id, view),
                intent_digest("publish.finalize", pubs[index].operation_id, 0),
                None,
            ),
            pubs=pubs,
        )
        crash_point("after-finalize")
        crash_point("before-publish-command")
        live = _group_step(
            root,
            live,
            results,
            lambda index: (
                lambda view: _publish_built(root, pubs[index].operation_id, pubs[index].components, view),
                intent_digest("publish.final", pubs[index].operation_id),
                pubs[index].request_id,
            ),
            pubs=pubs,
            final=True,
        )
        crash_point("after-publish-command")


def _upload_group(root, pubs: list[Publication], indexes: list[int]) -> list:
    """Step 2 for a group: every block of every publication under its ledger key in one
    `put_many` (the store syncs them together: one lock round and one sync per directory
    locally, parallel PUTs on S3). Returns (index, error) of each publication a block of which
    was refused."""
    items, owners, digests = [], [], []
    for index, pub in zip(indexes, pubs):
        for block in pub.body.blocks:
            key = artifact_block_key(root.logical_shard_id, root.root_id, pub.revision_id, block.index)
            try:
                items.append((key, pub.body.read_block(block)))  # checked against block.sha256
            except Exception as exc:  # noqa: BLE001 - that publication's error (its body unreadable)
                items.append((key, exc))
            owners.append(index)
            digests.append(block.sha256)
    readable, readable_owners, readable_digests = [], [], []
    for (key, data), index, digest in zip(items, owners, digests):
        if not isinstance(data, Exception):
            readable.append((key, data))
            readable_owners.append(index)
            readable_digests.append(digest)
    by_index = dict(zip(indexes, pubs))
    uploaded = dict.fromkeys(indexes, 0)
    lock = threading.Lock()

    def stored_one(position: int) -> None:
        # A group's upload can outlast a syscall deadline (S3 over a slow link): each block
        # stored is progress of its publication (nokvfs.fs.threads), not only the whole group.
        index = readable_owners[position]
        pub = by_index[index]
        with lock:
            uploaded[index] += len(readable[position][1])
            if pub.progress is not None:
                pub.progress(uploaded[index], pub.body.size)

    stored = iter(_put_many_parallel(root.store, readable, readable_digests, stored_one))
    failed: dict = {}
    for (_key, data), index, digest in zip(items, owners, digests):
        outcome = data if isinstance(data, Exception) else next(stored)
        if isinstance(outcome, Exception):
            failed.setdefault(index, outcome)
        else:
            root.blocks.keep_written(digest, data)
    for index, pub in zip(indexes, pubs):
        if index in failed:
            continue
        for block in pub.body.blocks:
            crash_point(f"after-upload-{block.index}")
            if pub.progress is not None:
                pub.progress(block.offset + block.length, pub.body.size)
    return list(failed.items())


UPLOAD_STREAMS = 4  # concurrent put_many calls of one group: their syncs overlap (the disk batches them)


def _put_many_parallel(store, items: list, digests: list, on_stored=None) -> list:
    """store.put_many over `items` (for a local store split into up to UPLOAD_STREAMS slices run
    at once), `digests` their checked SHA-256s; the results in item order.
    `on_stored(position)`: each item stored."""
    if len(items) <= 1 or getattr(store, "multipart_threshold", None) is not None:
        # A store that uploads in parts (S3) sends a put_many's PUTs in parallel itself.
        return store.put_many(items, on_stored=on_stored, content_sha256s=digests) if items else []
    size = -(-len(items) // UPLOAD_STREAMS)
    starts = range(0, len(items), size)

    def put_slice(start: int) -> list:
        heard = None if on_stored is None else (lambda index: on_stored(start + index))
        return store.put_many(
            items[start : start + size], on_stored=heard, content_sha256s=digests[start : start + size]
        )

    with concurrent.futures.ThreadPoolExecutor(len(starts), thread_name_prefix="nokvfs-upload") as pool:
        return [result for part in pool.map(put_slice, starts) for result in part]


def _group_step(root, live, results, item, *, pubs, abort_refused=True, final=False) -> list[int]:
    """One group command step for the publications still live; those refused are aborted (the
    operation cleaned as after a failed `run`) and leave the group with their error."""
    try:
        outcomes = root.apply_group([item(index) for index in live])
    except BaseException as exc:
        # The whole step failed (damage, a full shard): nothing of it applied; as `run` does, no
        # operation is left for a later recovery to finish behind its caller's back.
        if abort_refused:
            for index in live:
                _abort_after_failure(root, pubs[index].operation_id, exc)
        raise
    still = []
    for index, (outcome, built) in zip(live, outcomes):
        if isinstance(outcome, Exception):
            if abort_refused:
                _abort_after_failure(root, pubs[index].operation_id, outcome)
            results[index] = outcome
            continue
        still.append(index)
        if final:
            results[index] = PathEntry.decode(outcome.result) if outcome.replayed else built.value
            _remember_hash(pubs[index], results[index])
    return still


def _finalize_built(root, operation_id: bytes, view) -> Built:
    """Step 3 as one command (a ledger that fits one, as `groupable` ensures)."""
    raw, operation, puts = _finalize_rows(view, root, operation_id)
    op_key = ROWS.key(root, operation_id)
    puts.append(Put("operation", op_key, dataclasses.replace(operation, phase=PublishPhase.Finalizing)))
    return Built(predicates=[ValueEquals("operation", op_key, raw)], mutations=puts)


def _precheck(root, pub: Publication) -> None:
    """Fail fast, before a byte is uploaded, on what the final command would refuse now.

    The final command checks the same conditions again at its own version: this only spares a
    doomed upload, it guards no race.
    """
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, pub.workbench_id)
        raw = view.get("path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, pub.components))
        old = None if raw is None else PathEntry.decode(raw)
        check_expectation(pub.expected_generation, pub.expected_revision_id, old, join(pub.components))
        if old is None:
            _check_no_file_ancestor_or_descendant(view, root, workbench.incarnation_id, pub.components)


def _path_key_lengths(root_id: bytes, components: tuple[str, ...]) -> list[int]:
    """The lengths of the longest keys (other than SecondaryIndex rows) a publish at the path
    writes, by encoding them."""
    placeholder = bytes(16)
    reference = keys.RevisionRefKey(root_id, ReferenceKind.Path, path_owner(placeholder, components), placeholder)
    return [len(reference.encode()), len(keys.path_current_key(root_id, placeholder, components))]


_PROBE = ("p",)
_path_key_overhead: dict = {}  # root id -> what a path's keys add to its ordered bytes (_path_key_lengths)


def _longest_path_key(root_id: bytes, components: tuple[str, ...]) -> int:
    """max(_path_key_lengths(root_id, components)) without encoding the keys: the ordered path
    bytes are the components' UTF-8 bytes shifted byte for byte (schema.paths.ordered_component)
    and NUL-separated, so every such key is a fixed overhead plus the path's own byte length
    (measured once per root on a one-component probe). A create's check costs a sum, not two
    key encodings (tests/test_workspace_publish.py compares both on every kind of name)."""
    overhead = _path_key_overhead.get(root_id)
    if overhead is None:
        overhead = _path_key_overhead[root_id] = max(_path_key_lengths(root_id, _PROBE)) - len(_PROBE[0])
    return overhead + sum(len(c.encode("utf-8")) for c in components) + len(components) - 1


def check_key_lengths(root, components: tuple[str, ...], index_fields=()) -> None:
    """KeyTooLong, before a byte is uploaded, for a path whose final command the shard could not
    store (the shard bounds family keys; the longest ones a publish writes name the path)."""
    limit = getattr(root.shard, "max_family_key_bytes", None)
    if limit is None:
        return
    placeholder = bytes(16)
    fields = attributes.user_fields(index_fields)
    if not fields and components and all(isinstance(c, str) for c in components):
        size = _longest_path_key(root.root_id, components)
        if size <= limit:
            return
    longest = _path_key_lengths(root.root_id, components)
    longest += [
        len(keys.SecondaryIndexKey(root.root_id, f.name, f.encoded_value, placeholder, components).encode())
        for f in fields
    ]
    size = max(longest)
    if size > limit:
        from nokvfs.errors import KeyTooLong

        raise KeyTooLong(
            f"{join(components)} is too long for this shard: its keys would be {size} bytes, the limit is {limit}"
        )


def begin(root, pub: Publication, incarnation: bytes | None = None) -> None:
    """Step 1: the PublishOperation (Uploading) and its exact StagedObject ledger.

    The incarnation is the Visible workbench's, or `incarnation` when given: a restore stages
    its manifest into a destination that is still Staging.
    """
    if incarnation is None:
        with root.read() as view:
            _, workbench = wb.visible(view, root.root_id, pub.workbench_id)
        incarnation = workbench.incarnation_id
    op_key = ROWS.key(root, pub.operation_id)
    _, built = root.apply(
        lambda view: _begin_built(root, pub, incarnation, view),
        digest=intent_digest("publish.begin", pub.operation_id),
        request_id=pub.begin_request_id,
    )
    # The rest of the ledger in bounded batches, all before the first byte is uploaded. A crash
    # here leaves an Uploading operation whose partial ledger cleanup removes.
    for start in range(ROW_BATCH, len(pub.body.blocks), ROW_BATCH):
        batch = _staged_rows(root, pub, pub.body.blocks[start : start + ROW_BATCH])
        root.apply(
            lambda view, batch=batch: Built(
                predicates=[ValueEquals("operation", op_key, built.value)], mutations=batch
            ),
            digest=intent_digest("publish.ledger", pub.operation_id, start),
        )


def _begin_built(root, pub: Publication, incarnation: bytes, view) -> Built:
    """The command of step 1: the PublishOperation (Uploading) and the first ledger batch."""
    op_key = ROWS.key(root, pub.operation_id)
    version = view.version + 1
    operation = PublishOperation(
        workbench_id=pub.workbench_id,
        workspace_incarnation_id=incarnation,
        path=join(pub.components),
        artifact_revision_id=pub.revision_id,
        expected_generation=pub.expected_generation,
        base_revision_id=pub.base_revision_id,
        phase=PublishPhase.Uploading,
        object_count=len(pub.body.blocks),
        reused_count=len(pub.reused),
        logical_size=pub.logical_size,
        body_digest_uri=pub.body_digest_uri,
        content_type=pub.content_type,
        producer=pub.producer,
        index_fields=tuple(pub.index_fields),
        event_kind=pub.event_kind,
        request_id=pub.request_id,
        created_version=version,
        result=None,
        terminal_error=None,
        cleanup_cursor=b"",
        expected_revision_id=pub.expected_revision_id,
    )
    mutations = [Put("operation", op_key, operation)] + _staged_rows(root, pub, pub.body.blocks[:ROW_BATCH])
    return Built(predicates=[Absent("operation", op_key)], mutations=mutations, value=operation.encode())


def _staged_rows(root, pub: Publication, blocks) -> list:
    return [
        Put(
            "staged_object",
            _staged_key(root, pub.operation_id, block.index),
            StagedObject(
                artifact_revision_id=pub.revision_id,
                object_key=artifact_block_key(root.logical_shard_id, root.root_id, pub.revision_id, block.index),
                upload_id=None,
                expected_length=block.length,
                expected_digest_uri="sha256:" + block.sha256.hex(),
                provider_state=StagedProviderState.Planned,
                cleanup_state=StagedCleanupState.Owned,
            ),
        )
        for block in blocks
    ]


def upload(root, pub: Publication, *, staged=None) -> None:
    """Step 2: every block under its ledger key (multipart above the store's threshold), up to
    UPLOAD_BLOCKS_IN_FLIGHT blocks at once (each read and re-checked from the body by the thread
    that sends it). A block 0 already `staged` (see `_stage_during_begin`) is only linked at its
    key, its directory fsyncs left running: the caller waits for them (`_settle_staged`) before
    anything may rely on the object being durable. Crash points and progress follow block
    order; a failure stops further blocks and is raised once those in flight have ended (the
    ledger owns every key, so cleanup removes whatever reached the store)."""
    store = root.store
    threshold = getattr(store, "multipart_threshold", None)
    linked = []  # blocks staged ahead (body.prestaged) and linked here: their directory fsyncs

    def send(block) -> None:
        key = artifact_block_key(root.logical_shard_id, root.root_id, pub.revision_id, block.index)
        ahead = pub.body.prestaged.get(block.index)
        if staged is not None and block.index == 0:
            staged.commit(key, wait=False)
        elif ahead is not None and ahead.matches(block):
            # Staged while the file was written; exactly this block's bytes (the digest of what
            # was staged is the plan's), so only the link is left.
            ahead.staged.commit(key, wait=False)
            ahead.linked = True
            linked.append(ahead.staged)
        elif threshold is not None and block.length > threshold:
            data = pub.body.read_block(block)
            _upload_multipart(root, pub.operation_id, block.index, key, data)
            root.blocks.keep_written(block.sha256, data)
        else:
            data = pub.body.read_block(block)
            store.put(key, data, content_sha256=block.sha256)
            root.blocks.keep_written(block.sha256, data)

    def sent(block) -> None:
        crash_point(f"after-upload-{block.index}")
        if pub.progress is not None:
            pub.progress(block.offset + block.length, pub.body.size)

    blocks = list(pub.body.blocks)
    if len(blocks) <= 1 or (threshold is not None and any(block.length > threshold for block in blocks)):
        # One block, or multipart ones (each records its upload in the ledger first): in order.
        for block in blocks:
            send(block)
            sent(block)
        _settle_linked(linked)
        return
    in_flight = collections.deque()

    def settle_oldest() -> None:
        block, future = in_flight.popleft()
        future.result()
        sent(block)

    with concurrent.futures.ThreadPoolExecutor(UPLOAD_BLOCKS_IN_FLIGHT, thread_name_prefix="nokvfs-block") as pool:
        try:
            for block in blocks:
                if len(in_flight) >= UPLOAD_BLOCKS_IN_FLIGHT:
                    settle_oldest()
                in_flight.append((block, pool.submit(send, block)))
            while in_flight:
                settle_oldest()
        except BaseException:
            for _, future in in_flight:
                future.cancel()  # not started: never sent; the running ones end before the raise
            _settle_linked(linked, quiet=True)
            raise
    _settle_linked(linked)


def _settle_linked(linked: list, *, quiet: bool = False) -> None:
    """Wait until the blocks staged ahead and linked by `upload` are durable (the directory
    fsyncs of their links), as a put would before returning."""
    errors = []
    for staged in linked:
        try:
            staged.wait()
        except Exception as exc:  # noqa: BLE001 - the first is raised once all are settled
            errors.append(exc)
    if errors and not quiet:
        raise errors[0]


def _upload_multipart(root, operation_id: bytes, sequence: int, key: str, data: bytes) -> None:
    store = root.store
    staged_key = _staged_key(root, operation_id, sequence)

    def record(upload_id: str | None):
        def build(view):
            raw = view.get("staged_object", staged_key)
            row = StagedObject.decode(raw)
            updated = dataclasses.replace(row, upload_id=upload_id, provider_state=StagedProviderState.Uploading)
            return Built(
                predicates=[ValueEquals("staged_object", staged_key, raw)],
                mutations=[Put("staged_object", staged_key, updated)],
            )

        root.apply(build, digest=intent_digest("publish.multipart", operation_id, sequence, upload_id))

    # The intent first (Uploading, no upload id yet): a crash between CreateMultipartUpload and
    # recording its id leaves a row from which cleanup aborts every upload to this exact key
    # (the ledger's own key, embedding a never-reused revision id), without listing the bucket.
    record(None)
    upload_id = store.create_multipart(key)
    crash_point(f"after-multipart-create-{sequence}")
    # The upload id is in the ledger before any part is sent, so cleanup can abort it.
    record(upload_id)
    crash_point(f"after-multipart-record-{sequence}")
    part_size = getattr(store, "part_size", 8 * 1024 * 1024)
    parts = []
    for number, offset in enumerate(range(0, len(data), part_size), start=1):
        parts.append((number, store.upload_part(key, upload_id, number, data[offset : offset + part_size])))
    store.complete_multipart(key, upload_id, parts)


def finalize(root, operation_id: bytes, *, durable: bool = True, request_id: bytes | None = None) -> None:
    """Step 3: mark the ledger Uploaded and write the new revision's manifest rows, in bounded batches;
    the last batch CASes Uploading -> Finalizing. Manifest rows of a revision that does not
    exist yet are invisible; cleanup removes them if the publication never happens.

    `durable=False` (run, whose final command follows at once and is durable) spares the
    commands' last flush: a power loss before the final command may take the operation back to
    Uploading, which recovery aborts and cleans like any upload its process did not finish."""
    op_key = ROWS.key(root, operation_id)
    with root.read() as view:
        raw, operation, puts = _finalize_rows(view, root, operation_id)
    batches = [puts[i : i + ROW_BATCH] for i in range(0, len(puts), ROW_BATCH)] or [[]]
    for number, batch in enumerate(batches):
        last = number == len(batches) - 1
        mutations = list(batch)
        if last:
            mutations.append(Put("operation", op_key, dataclasses.replace(operation, phase=PublishPhase.Finalizing)))
        root.apply(
            lambda view, mutations=mutations: Built(
                predicates=[ValueEquals("operation", op_key, raw)], mutations=mutations
            ),
            digest=intent_digest("publish.finalize", operation_id, number),
            request_id=request_id if number == 0 else None,
            durable=durable,
        )


def _finalize_rows(view, root, operation_id: bytes):
    """(raw operation, the operation, the ledger marked Uploaded and the manifest rows): what
    step 3 writes before it CASes Uploading -> Finalizing."""
    raw, operation = read_operation(view, root, operation_id)
    ledger = read_ledger(view, root, operation_id)
    rows = manifest_rows(view, root, operation, ledger)
    if operation.phase != PublishPhase.Uploading:
        raise PredicateFailed(f"publish {operation_id.hex()} is {operation.phase.name}, not Uploading")
    puts = [
        Put("staged_object", key, dataclasses.replace(row, provider_state=StagedProviderState.Uploaded))
        for key, row in ledger
    ]
    puts += [
        Put(
            "artifact_manifest",
            keys.ArtifactManifestKey(root.root_id, operation.artifact_revision_id, index).encode(),
            row,
        )
        for index, row in enumerate(rows)
    ]
    return raw, operation, puts


def _publish(root, operation_id: bytes) -> PathEntry:
    with root.read() as view:
        _, operation = read_operation(view, root, operation_id)
    components = normalize_path(operation.path)
    crash_point("before-publish-command")
    outcome, built = root.apply(
        lambda view: _publish_built(root, operation_id, components, view),
        digest=intent_digest("publish.final", operation_id),
        request_id=operation.request_id,
    )
    crash_point("after-publish-command")
    if operation.object_count > ROW_BATCH:
        _tidy_ledger(root, operation_id)
    if outcome.replayed:
        return PathEntry.decode(outcome.result)
    return built.value


def _publish_built(root, operation_id: bytes, components: tuple, view) -> Built:
    """The command of step 4: the revision, its references, PathCurrent, the workspace revision,
    index rows, the ChangeEvent, Finalizing -> Published (a Published one: its entry)."""
    op_key = ROWS.key(root, operation_id)
    raw_op, op = read_operation(view, root, operation_id)
    if op.phase == PublishPhase.Published:
        return Built(value=PathEntry.decode(op.result))
    if op.phase != PublishPhase.Finalizing:
        raise PredicateFailed(f"publish {operation_id.hex()} is {op.phase.name}, not Finalizing")
    raw_wb, workbench = wb.visible(view, root.root_id, op.workbench_id)
    if workbench.incarnation_id != op.workspace_incarnation_id:
        raise NotFound(f"workbench {op.workbench_id!r} is another incarnation now")
    version = view.version + 1
    path_key = keys.path_current_key(root.root_id, workbench.incarnation_id, components)
    old_raw = view.get("path_current", path_key)
    old = None if old_raw is None else PathEntry.decode(old_raw)
    check_expectation(op.expected_generation, op.expected_revision_id, old, op.path)
    if old is None:
        _check_no_file_ancestor_or_descendant(view, root, workbench.incarnation_id, components)
    ledger = read_ledger(view, root, operation_id)
    rows = read_manifest(view, root, op.artifact_revision_id)
    if rows != manifest_rows(view, root, op, ledger):
        raise PredicateFailed(f"publish {op.path}: the manifest rows written at finalize are incomplete")
    dependencies = sorted({r.physical_owner_revision_id for r in rows} - {op.artifact_revision_id})
    refs = References(view, root.root_id)
    depth = 0
    for owner in dependencies:
        depth = max(depth, refs.revision(owner).dependency_depth + 1)
    revision = available_revision(op, rows, dependencies, depth, version)
    refs.create(op.artifact_revision_id, revision)
    owner_id = path_owner(workbench.incarnation_id, components)
    refs.add(ReferenceKind.Path, owner_id, op.artifact_revision_id)
    for dependency in dependencies:
        refs.add(ReferenceKind.RevisionDependency, op.artifact_revision_id, dependency)
    if old is not None:
        refs.remove(ReferenceKind.Path, owner_id, old.artifact_revision_id)
    entry = PathEntry(
        generation=1 if old is None else old.generation + 1,
        artifact_revision_id=op.artifact_revision_id,
        logical_size=op.logical_size,
        body_digest_uri=op.body_digest_uri,
        manifest_digest_uri=revision.manifest_digest_uri,
        dependency_count=len(dependencies),
        dependency_depth=depth,
        content_type=op.content_type,
        producer=op.producer,
        manifest_id=op.artifact_revision_id,  # the revision whose manifest rows describe the body
        created_version=version if old is None else old.created_version,
        modified_version=version,
        typed_index_projection=op.index_fields,
    )
    predicates, mutations = refs.rows()
    predicates.append(ValueEquals("operation", op_key, raw_op))
    predicates.append(
        Absent("path_current", path_key) if old_raw is None else ValueEquals("path_current", path_key, old_raw)
    )
    wb_predicate, wb_mutation = wb.advance_revision(root.root_id, op.workbench_id, raw_wb, version)
    predicates.append(wb_predicate)
    mutations += [Put("path_current", path_key, entry), wb_mutation]
    mutations += index_mutations(root.root_id, workbench.incarnation_id, components, old, entry)
    mutations.append(
        Put("operation", op_key, dataclasses.replace(op, phase=PublishPhase.Published, result=entry.encode()))
    )
    if len(ledger) <= ROW_BATCH:
        # A bounded ledger goes with the publication; a larger one is tidied afterwards.
        mutations += [Delete("staged_object", key) for key, _ in ledger]
    before = None if old is None else old.artifact_revision_id
    return Built(
        predicates=predicates,
        mutations=mutations,
        events=[wb.event(workbench, op.event_kind, op.path, before, op.artifact_revision_id)],
        result=entry.encode(),
        value=entry,
    )


def _tidy_ledger(root, operation_id: bytes) -> None:
    """After publication the manifest owns the objects: drop the ledger rows in bounded batches.

    Best effort: rows a crash leaves behind only record ownership the manifest also records.
    """
    op_key = ROWS.key(root, operation_id)
    while True:
        with root.read() as view:
            raw, op = read_operation(view, root, operation_id)
            page = scan_prefix(
                view, "staged_object", keys.staged_object_prefix(root.root_id, operation_id), limit=min(255, ROW_BATCH)
            )
        if op.phase != PublishPhase.Published or not page.items:
            return
        deletes = [Delete("staged_object", key) for key, _ in page.items]
        try:
            root.apply(
                lambda view, deletes=deletes, raw=raw: Built(
                    predicates=[ValueEquals("operation", op_key, raw)], mutations=deletes
                ),
                digest=intent_digest("publish.tidy", operation_id, page.items[0][0]),
            )
        except NokvError as exc:
            log.warning("publish %s: ledger tidy-up deferred: %s", operation_id.hex(), exc)
            return


def check_expectation(generation: int | None, revision_id: bytes | None, old: PathEntry | None, path: str) -> None:
    """What a conditional write expects of the path: GenerationConflict unless it holds.

    `generation`: None is unconditional, 0 requires absence, N generation N. `revision_id`: the
    path must hold exactly that revision. Revision ids are never reused, so unlike a generation
    (which restarts at 1 when a path is removed and created again) it cannot be fooled by ABA.
    """
    if generation is not None:
        actual = 0 if old is None else old.generation
        if actual != generation:
            raise GenerationConflict(f"{path} is at generation {actual}, expected {generation}")
    if revision_id is not None:
        if old is None:
            raise GenerationConflict(f"{path} does not exist, expected revision {revision_id.hex()}")
        if old.artifact_revision_id != revision_id:
            raise GenerationConflict(
                f"{path} holds revision {old.artifact_revision_id.hex()}, expected {revision_id.hex()}"
            )


def _check_no_file_ancestor_or_descendant(view, root, incarnation: bytes, components) -> None:
    """A path cannot be both a file and a directory: no file at an ancestor, nothing below it."""
    for depth in range(2, len(components)):
        ancestor = components[:depth]
        if view.get("path_current", keys.path_current_key(root.root_id, incarnation, ancestor)) is not None:
            raise InvalidInput(f"{join(ancestor)} is a file, so {join(components)} cannot be created")
    prefix = keys.path_subtree_prefix(root.root_id, incarnation, components)
    if view.seek("path_current", prefix, within=prefix) is not None:
        raise InvalidInput(f"{join(components)} is a directory")


def manifest_rows(view, root, op: PublishOperation, ledger) -> list[ArtifactManifest]:
    rows = []
    if op.reused_count:
        base = read_manifest(view, root, op.base_revision_id)
        if len(base) < op.reused_count:
            raise NotFound(f"base revision {op.base_revision_id.hex()} lost manifest rows")
        rows = list(base[: op.reused_count])
    offset = sum(r.length for r in rows)
    for sequence, (_, staged) in enumerate(ledger):
        rows.append(
            ArtifactManifest(
                physical_owner_revision_id=op.artifact_revision_id,
                physical_object_index=sequence,
                object_key=staged.object_key,
                logical_offset=offset,
                object_offset=0,
                length=staged.expected_length,
                digest_uri=staged.expected_digest_uri,
                append_segment=None,
            )
        )
        offset += staged.expected_length
    if offset != op.logical_size or len(ledger) != op.object_count:
        raise PredicateFailed(f"publish {op.path}: the ledger does not cover the body")
    return rows


def available_revision(
    op: PublishOperation, rows: list[ArtifactManifest], dependencies, depth: int, version: int
) -> ArtifactRevision:
    """The ArtifactRevision (Available, no references yet) the final command creates."""
    return ArtifactRevision(
        logical_size=op.logical_size,
        body_digest_uri=op.body_digest_uri,
        manifest_digest_uri="sha256:" + manifest_digest(rows).hex(),
        block_count=len(rows),
        dependency_count=len(dependencies),
        dependency_depth=depth,
        dependency_digest=hashlib.sha256(b"".join(dependencies)).digest(),
        content_type=op.content_type,
        state=RevisionState.Available,
        reference_epoch=0,
        strong_reference_count=0,
        last_zero_ref_version=0,
        created_version=version,
    )


def read_manifest(view, root, revision_id: bytes) -> list[ArtifactManifest]:
    prefix = keys.artifact_manifest_prefix(root.root_id, revision_id)
    rows, marker = [], None
    while True:
        page = scan_prefix(view, "artifact_manifest", prefix, start_after=marker)
        rows += [ArtifactManifest.decode(v) for _, v in page.items]
        if page.next_marker is None:
            return rows
        marker = page.next_marker


def index_mutations(root_id, incarnation, components, old: PathEntry | None, new: PathEntry | None):
    """SecondaryIndex rows follow the PathEntry's typed projection in the same command: its user
    fields only (reserved fields such as the POSIX attributes are projection-only)."""
    mutations = []
    old_fields = (
        {} if old is None else {f.name: f.encoded_value for f in attributes.user_fields(old.typed_index_projection)}
    )
    new_fields = (
        {} if new is None else {f.name: f.encoded_value for f in attributes.user_fields(new.typed_index_projection)}
    )
    for name, value in old_fields.items():
        if new_fields.get(name) != value or new is None:
            mutations.append(
                Delete(
                    "secondary_index", keys.SecondaryIndexKey(root_id, name, value, incarnation, components).encode()
                )
            )
    for name, value in new_fields.items():
        if old is not None and old.generation == new.generation and old_fields.get(name) == value:
            continue  # the same row (a metadata-only change): nothing to write
        key = keys.SecondaryIndexKey(root_id, name, value, incarnation, components).encode()
        mutations.append(Put("secondary_index", key, SecondaryIndex(path_generation=new.generation, projection=b"")))
    return mutations


# --- abort, cleanup and recovery --------------------------------------------------------------


def _abort_after_failure(root, operation_id: bytes, cause: BaseException) -> None:
    try:
        abort(root, operation_id, reason=f"{type(cause).__name__}: {cause}")
    except NokvError as exc:
        log.error("publish %s: cleanup after %r failed: %s", operation_id.hex(), cause, exc)


def abort(root, operation_id: bytes, *, reason: str) -> PublishPhase:
    """Take the operation to Aborting (if it can still be), then clean its ledger."""
    with root.read() as view:
        _, operation = read_operation(view, root, operation_id)
    if operation.phase in TERMINAL:
        return operation.phase
    if operation.phase in (PublishPhase.Uploading, PublishPhase.Finalizing):

        def take_over(view, op):
            if op.phase not in (PublishPhase.Uploading, PublishPhase.Finalizing):
                raise PredicateFailed(f"publish {operation_id.hex()} moved to {op.phase.name}")
            predicates = []
            if op.phase == PublishPhase.Finalizing:
                # Fenced proof that the publication did not happen: no dedupe row for its request.
                predicates.append(Absent("command_dedupe", keys.CommandDedupeKey(root.root_id, op.request_id).encode()))
            return predicates, [], dataclasses.replace(op, phase=PublishPhase.Aborting, terminal_error=reason[:1024])

        try:
            ROWS.step(
                root, operation_id, "publish.abort", take_over, digest=intent_digest("publish.abort", operation_id)
            )
        except PredicateFailed:
            with root.read() as view:
                _, operation = read_operation(view, root, operation_id)
            if operation.phase == PublishPhase.Published:
                return operation.phase
            raise
        crash_point("after-abort")
    return _clean(root, operation_id)


def _set_phase(root, operation_id: bytes, expected: PublishPhase, new: PublishPhase, *, extra=()) -> None:
    ROWS.set_phase(
        root,
        operation_id,
        expected,
        new,
        label="publish.phase",
        extra=lambda view, op: ([], list(extra)),
        digest=intent_digest("publish.phase", operation_id, int(expected), int(new)),
    )


def _clean(root, operation_id: bytes) -> PublishPhase:
    with root.read() as view:
        _, operation = read_operation(view, root, operation_id)
    if operation.phase == PublishPhase.Aborting:
        _set_phase(root, operation_id, PublishPhase.Aborting, PublishPhase.Cleaning)
        crash_point("after-cleaning")
    with root.read() as view:
        ledger = read_ledger(view, root, operation_id)
        _, op = read_operation(view, root, operation_id)
        # A revision of this id exists only when another attempt staged the same revision (a
        # restore's manifest) and published it: its manifest owns the objects now.
        published = (
            view.get("artifact_revision", keys.ArtifactRevisionKey(root.root_id, op.artifact_revision_id).encode())
            is not None
        )
    quarantined = False
    for start in range(0, len(ledger), LEDGER_BATCH):
        updates = []
        for key, row in ledger[start : start + LEDGER_BATCH]:
            if row.cleanup_state in (StagedCleanupState.Deleted, StagedCleanupState.Quarantined):
                quarantined |= row.cleanup_state == StagedCleanupState.Quarantined
                continue
            if published:
                state, provider = StagedCleanupState.Deleted, row.provider_state  # released, not deleted
            else:
                state, provider = _delete_staged(root, row)
            quarantined |= state == StagedCleanupState.Quarantined
            updates.append(
                Put("staged_object", key, dataclasses.replace(row, cleanup_state=state, provider_state=provider))
            )
        if updates:
            _apply_ledger_updates(root, operation_id, updates, start)
    _drop_unpublished_manifest(root, operation_id)
    final = PublishPhase.Quarantined if quarantined else PublishPhase.Cleaned
    deletes = [] if quarantined else [Delete("staged_object", key) for key, _ in ledger]
    _set_phase(root, operation_id, PublishPhase.Cleaning, final, extra=deletes)
    return final


def reconcile(root, operation_id: bytes) -> PublishPhase:
    """Reconcile a Quarantined publish (README, "Reconciliation"); the caller holds its lock.

    Every object its ledger still owns is probed; while any probe fails nothing changes. Once
    the store answers for all of them (present or absent), the explicit transition
    Quarantined -> Cleaning, the quarantined ledger rows DeletePending, and cleanup runs again:
    Cleaned (ledger gone) when every delete succeeds, Quarantined again otherwise. Returns the
    phase it ends in.
    """
    with root.read() as view:
        _, operation = read_operation(view, root, operation_id)
        ledger = read_ledger(view, root, operation_id)
    if operation.phase != PublishPhase.Quarantined:
        return operation.phase
    try:
        for _, row in ledger:
            if row.cleanup_state != StagedCleanupState.Deleted:
                root.store.head(row.object_key)  # present or absent: either is an answer
    except StoreError as exc:
        log.info("publish %s stays quarantined: %s", operation_id.hex(), exc)
        return PublishPhase.Quarantined
    _set_phase(root, operation_id, PublishPhase.Quarantined, PublishPhase.Cleaning)
    crash_point("after-reconcile")
    in_doubt = [(key, row) for key, row in ledger if row.cleanup_state == StagedCleanupState.Quarantined]
    for start in range(0, len(in_doubt), LEDGER_BATCH):
        batch = in_doubt[start : start + LEDGER_BATCH]
        due = [
            Put("staged_object", key, dataclasses.replace(row, cleanup_state=StagedCleanupState.DeletePending))
            for key, row in batch
        ]
        _apply_ledger_updates(root, operation_id, due, -1 - start)
    return _clean(root, operation_id)


def _drop_unpublished_manifest(root, operation_id: bytes) -> None:
    """Manifest rows finalize wrote for a revision the publication never created."""
    with root.read() as view:
        _, op = read_operation(view, root, operation_id)
        revision_key = keys.ArtifactRevisionKey(root.root_id, op.artifact_revision_id).encode()
        if view.get("artifact_revision", revision_key) is not None:
            return
        keys_to_drop = [
            k
            for k, _ in iter_prefix(
                view, "artifact_manifest", keys.artifact_manifest_prefix(root.root_id, op.artifact_revision_id)
            )
        ]
    for start in range(0, len(keys_to_drop), ROW_BATCH):
        batch = [Delete("artifact_manifest", k) for k in keys_to_drop[start : start + ROW_BATCH]]
        root.apply(
            lambda view, batch=batch: Built(predicates=[Absent("artifact_revision", revision_key)], mutations=batch),
            digest=intent_digest("publish.drop-manifest", operation_id, start),
        )


def _delete_staged(root, row: StagedObject):
    """Delete one ledger-owned object; an ambiguous result is quarantined, never guessed."""
    try:
        if row.upload_id:
            upload_ids = [row.upload_id]
        elif row.provider_state in (StagedProviderState.Uploading, StagedProviderState.Ambiguous):
            # The intent was recorded, the id maybe not (or an earlier cleanup lost its answer):
            # every unfinished upload to this exact key is ours.
            upload_ids = root.store.multipart_uploads(row.object_key)
        else:
            upload_ids = []
        for upload_id in upload_ids:
            try:
                root.store.abort_multipart(row.object_key, upload_id)
            except ObjectMissing:
                pass
        root.store.delete(row.object_key)
        return StagedCleanupState.Deleted, row.provider_state
    except AmbiguousResult as exc:
        log.warning("delete of %s is ambiguous, quarantined: %s", row.object_key, exc)
        return StagedCleanupState.Quarantined, StagedProviderState.Ambiguous
    except StoreError as exc:
        log.warning("delete of %s failed, quarantined: %s", row.object_key, exc)
        return StagedCleanupState.Quarantined, row.provider_state


def _apply_ledger_updates(root, operation_id: bytes, updates, start: int) -> None:
    def change(view, op):
        ROWS.require(operation_id, op, PublishPhase.Cleaning)
        return [], list(updates), None

    ROWS.step(root, operation_id, "publish.clean", change, digest=intent_digest("publish.clean", operation_id, start))


def pending(view, root) -> list[tuple[bytes, PublishOperation]]:
    """Every publish operation not yet in a terminal phase."""
    return ROWS.pending(view, root)


def recover(root) -> list[tuple[str, str]]:
    """Resume or clean every publish whose owning process is gone. Returns (op hex, outcome).

    Staged run and restore manifests are left alone: their commit or restore state machine owns
    them and resumes them (a generic resume would make them visible outside that machine).
    """
    return drive_each(
        root,
        ROWS,
        lambda operation_id, operation: _recover_one(root, operation_id, operation),
        wanted=lambda op: normalize_path(op.path) not in RESERVED_MANIFESTS,
        phases=ROWS.live,
    )


def _recover_one(root, operation_id: bytes, operation: PublishOperation) -> str:
    if operation.phase == PublishPhase.Finalizing:
        with root.read() as view:
            ledger = read_ledger(view, root, operation_id)
        if all(object_present(root, row) for _, row in ledger):
            try:
                _publish(root, operation_id)
                return "published"
            except (PredicateFailed, NotFound, InvalidInput) as exc:
                return abort(root, operation_id, reason=f"resume failed: {exc}").name.lower()
        return abort(root, operation_id, reason="an uploaded object is missing").name.lower()
    if operation.phase == PublishPhase.Uploading:
        # The bytes were in the lost process's hands: the publication cannot be finished.
        return abort(root, operation_id, reason="the uploading process was lost").name.lower()
    return _clean(root, operation_id).name.lower()


def object_present(root, row: StagedObject) -> bool:
    """Whether the store holds the object at its ledger length (a probe that fails says no)."""
    try:
        info = root.store.head(row.object_key)
    except StoreError:
        return False
    return info is not None and info.size == row.expected_length
