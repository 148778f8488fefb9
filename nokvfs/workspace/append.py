"""Append: a new revision that reuses the base's blocks and adds the new segment.

The new revision's manifest lists the base's manifest rows unchanged (each names its physical
owner and that owner's object index) followed by rows for the objects it uploads itself, and it
takes one RevisionDependency reference to every distinct owner of a reused block. A revision may
depend on at most 64 owners and the dependency graph may be at most 8 deep; an append that would
exceed either rematerialises the complete body under the new revision with no dependencies. Either
way it is a generation CAS on the base, through the one publish pipeline.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from nokvfs import filemodes
from nokvfs.errors import InvalidInput, NotFound, StoreError, StoreFull
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind
from nokvfs.schema.paths import join, normalize_path
from nokvfs.schema.records import ArtifactRevision, PathEntry
from nokvfs.workspace import attributes as attrs
from nokvfs.workspace import body as bodies
from nokvfs.workspace import hashstates, namespace, publish, reading
from nokvfs.workspace import workbench as wb

MAX_DEPENDENCY_OWNERS = 64
MAX_DEPENDENCY_DEPTH = 8


def append(
    root,
    workbench_id: str,
    path: str,
    data,
    *,
    expected_generation: int | None = None,
    expected_revision_id: bytes | None = None,
    attributes: attrs.Attributes | None = None,
    progress=None,
) -> PathEntry:
    """Append `data` (bytes or a Body) to the file at `path`; NotFound if there is none.

    `attributes`: what the new revision stores (the mount's, with its writes' times); None keeps
    the base's, with mtime and ctime moved to now. `progress`: called as progress(done, total)
    while the base is read back and after each block stored (publish.Publication.progress).
    """
    components = normalize_path(path)
    publish.check_publishable(components)
    delta = data if isinstance(data, bodies.Body) else bodies.from_bytes(bytes(data), root.block_size)
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        _, raw = namespace.existing_file(view, root, workbench, components)
        base = PathEntry.decode(raw)
        publish.check_expectation(expected_generation, expected_revision_id, base, join(components))
        if attrs.is_symlink(base):
            raise InvalidInput(f"{workbench_id}:{join(components)} is a symbolic link; its target is not appended to")
        base_rows = publish.read_manifest(view, root, base.artifact_revision_id)
        owners = {row.physical_owner_revision_id for row in base_rows}
        depth = 0
        for owner in owners:
            owner_raw = view.get("artifact_revision", keys.ArtifactRevisionKey(root.root_id, owner).encode())
            if owner_raw is None:
                raise NotFound(f"owner revision {owner.hex()} of {join(components)} is missing")
            depth = max(depth, ArtifactRevision.decode(owner_raw).dependency_depth + 1)
    rematerialise = len(owners) > MAX_DEPENDENCY_OWNERS or depth > MAX_DEPENDENCY_DEPTH
    if rematerialise:
        full = _rematerialised_body(root, base, delta)
        reused, base_revision = (), None
        whole = hashlib.sha256()
        for block in full.blocks:
            whole.update(full.read_block(block))
        delta_body = full
    else:
        # The base's hash state if this process published it, else the base read back in full
        # (the seed's body digest covers every byte).
        whole = hashstates.STATES.resume(base.artifact_revision_id, base.logical_size)
        if whole is None:
            whole = hashlib.sha256()
            for chunk in reading.iter_body(root, base):
                whole.update(chunk)
                if progress is not None:
                    progress(0, delta.size)
        for block in delta.blocks:
            whole.update(delta.read_block(block))
        reused, base_revision, delta_body = tuple(base_rows), base.artifact_revision_id, delta
    digest_uri = "sha256:" + whole.hexdigest()
    try:
        entry = publish.run(
            root,
            publish.Publication(
                workbench_id=workbench_id,
                components=components,
                body=delta_body,
                logical_size=base.logical_size + delta.size,
                body_digest_uri=digest_uri,
                # The seed's append generation CAS, and the exact base the delta extends.
                expected_generation=base.generation,
                expected_revision_id=base.artifact_revision_id,
                content_type=base.content_type,
                producer=base.producer,
                index_fields=_appended_projection(base)
                if attributes is None
                else attrs.with_attributes(base.typed_index_projection, attributes),
                reused=reused,
                base_revision_id=base_revision,
                event_kind=ChangeEventKind.PathAppended,
                progress=progress,
            ),
        )
    finally:
        if rematerialise:
            delta_body.discard()
    if entry.logical_size == base.logical_size + delta.size:
        hashstates.STATES.remember(entry.artifact_revision_id, entry.logical_size, whole, digest_uri)
    return entry


def _appended_projection(base: PathEntry) -> tuple:
    """The base's projection; stored attributes keep mode and owner, and mtime and ctime move to
    now (the body changed), as a write does on a local file."""
    stored = attrs.of(base)
    if stored is None:
        return tuple(base.typed_index_projection)
    now = attrs.now_ns()
    return attrs.with_attributes(base.typed_index_projection, stored.replace(mtime_ns=now, ctime_ns=now))


def _rematerialised_body(root, base: PathEntry, delta: bodies.Body) -> bodies.Body:
    """The complete base body plus the delta in one spool file, owned by the new revision."""
    filemodes.makedirs(root.spool_dir)
    fd, path = tempfile.mkstemp(prefix="rematerialise-", dir=root.spool_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in reading.iter_body(root, base):
                out.write(chunk)
            for block in delta.blocks:
                out.write(delta.read_block(block))
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        os.unlink(path)
        if exc.errno == 28:
            raise StoreFull(f"no space left to rematerialise in {root.spool_dir}") from None
        raise StoreError(f"cannot rematerialise: {exc.strerror}") from None
    return bodies.from_file(path, root.block_size, owned_spool=True)
