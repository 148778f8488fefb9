"""Put, remove and rename of paths: each one MetadataCommand over PathCurrent and references.

Rename is one command: the new path takes a Path reference to the same revision (replacing and
releasing whatever the target held), the old path's entry and reference are removed.
"""

from __future__ import annotations

import dataclasses

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.errors import GenerationConflict, InvalidInput, NotFound
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, ReferenceKind
from nokvfs.schema.paths import join, normalize_path
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import body as bodies
from nokvfs.workspace import publish, workbench as wb
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest


def put(root, workbench_id: str, path: str, source, *, expected_generation: int | None = None, expected_revision_id: bytes | None = None, content_type: str = publish.DEFAULT_CONTENT_TYPE, producer: str = "", index_fields=(), progress=None) -> PathEntry:
    """Publish `source` (bytes, a Body, or a readable binary stream) as a new revision of `path`.

    expected_generation: None replaces unconditionally, 0 requires the path to be absent, N
    requires the path to be at generation N; expected_revision_id requires it to hold exactly
    that revision (GenerationConflict otherwise).
    """
    components = normalize_path(path)
    publish.check_publishable(components)
    index_fields = check_index_fields(index_fields)
    if isinstance(source, (bytes, bytearray, memoryview)):
        body = bodies.from_bytes(bytes(source), root.block_size)
    elif isinstance(source, bodies.Body):
        body = source
    else:
        body = bodies.from_stream(source, root.spool_dir, root.block_size)
    try:
        return publish.run(
            root,
            publish.Publication(
                workbench_id=workbench_id,
                components=components,
                body=body,
                logical_size=body.size,
                body_digest_uri=body.digest_uri,
                expected_generation=expected_generation,
                expected_revision_id=expected_revision_id,
                content_type=content_type,
                producer=producer,
                index_fields=tuple(index_fields),
                progress=progress,
            ),
        )
    finally:
        body.discard()


def check_index_fields(index_fields) -> tuple:
    """The typed projection as given, if every field is one valid index-codec value under a
    distinct, valid index id; IndexValueInvalid otherwise (before anything is uploaded)."""
    from nokvfs.errors import FormatError, IndexValueInvalid
    from nokvfs.schema import index_codec
    from nokvfs.schema.records import IndexField

    fields = tuple(index_fields)
    names = set()
    for field in fields:
        if not isinstance(field, IndexField):
            raise IndexValueInvalid(f"an index field must be an IndexField, got {type(field).__name__}")
        raw = field.name.encode("utf-8", "surrogatepass") if isinstance(field.name, str) else b""
        if not raw or len(raw) > 0xFFFF or b"\x00" in raw:
            raise IndexValueInvalid(f"index id {field.name!r} must be 1..65535 UTF-8 bytes without NUL")
        if field.name in names:
            raise IndexValueInvalid(f"index id {field.name!r} is given twice")
        names.add(field.name)
        try:
            index_codec.decode(bytes(field.encoded_value))
        except (FormatError, InvalidInput) as exc:
            raise IndexValueInvalid(f"index field {field.name!r} is not one encoded index value: {exc}") from None
    return fields


def _entry(view, root, incarnation: bytes, components) -> tuple[bytes, bytes | None]:
    key = keys.path_current_key(root.root_id, incarnation, components)
    return key, view.get("path_current", key)


def remove(root, workbench_id: str, path: str, *, expected_generation: int | None = None, expected_revision_id: bytes | None = None) -> PathEntry:
    components = normalize_path(path)
    publish.check_publishable(components)

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        key, raw = _entry(view, root, workbench.incarnation_id, components)
        if raw is None:
            raise NotFound(f"{workbench_id}:{join(components)} does not exist")
        entry = PathEntry.decode(raw)
        publish.check_expectation(expected_generation, expected_revision_id, entry, join(components))
        version = view.version + 1
        refs = References(view, root.root_id)
        refs.remove(ReferenceKind.Path, publish.path_owner(workbench.incarnation_id, components), entry.artifact_revision_id)
        predicates, mutations = refs.rows()
        wb_predicate, wb_mutation = wb.advance_revision(root.root_id, workbench_id, raw_wb, version)
        predicates += [ValueEquals("path_current", key, raw), wb_predicate]
        mutations += [Delete("path_current", key), wb_mutation]
        mutations += publish.index_mutations(root.root_id, workbench.incarnation_id, components, entry, None)
        return Built(
            predicates=predicates,
            mutations=mutations,
            events=[wb.event(workbench, ChangeEventKind.PathRemoved, join(components), entry.artifact_revision_id, None)],
            value=entry,
        )

    _, built = root.apply(build, digest=intent_digest("path.remove", workbench_id, join(components), expected_generation, expected_revision_id))
    return built.value


def rename(root, workbench_id: str, source: str, target: str, *, replace: bool = True) -> PathEntry:
    src, dst = normalize_path(source), normalize_path(target)
    publish.check_publishable(src)
    publish.check_publishable(dst)
    if src == dst:
        raise InvalidInput("rename source and target are the same path")

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        inc = workbench.incarnation_id
        src_key, src_raw = _entry(view, root, inc, src)
        if src_raw is None:
            raise NotFound(f"{workbench_id}:{join(src)} does not exist")
        dst_key, dst_raw = _entry(view, root, inc, dst)
        if dst_raw is not None and not replace:
            raise GenerationConflict(f"{join(dst)} exists")
        if dst_raw is None:
            publish._check_no_file_ancestor_or_descendant(view, root, inc, dst)
        entry = PathEntry.decode(src_raw)
        old_dst = None if dst_raw is None else PathEntry.decode(dst_raw)
        version = view.version + 1
        refs = References(view, root.root_id)
        refs.add(ReferenceKind.Path, publish.path_owner(inc, dst), entry.artifact_revision_id)
        if old_dst is not None:
            refs.remove(ReferenceKind.Path, publish.path_owner(inc, dst), old_dst.artifact_revision_id)
        refs.remove(ReferenceKind.Path, publish.path_owner(inc, src), entry.artifact_revision_id)
        moved = dataclasses.replace(
            entry,
            generation=1 if old_dst is None else old_dst.generation + 1,
            created_version=version,
            modified_version=version,
        )
        predicates, mutations = refs.rows()
        wb_predicate, wb_mutation = wb.advance_revision(root.root_id, workbench_id, raw_wb, version)
        predicates += [
            ValueEquals("path_current", src_key, src_raw),
            Absent("path_current", dst_key) if dst_raw is None else ValueEquals("path_current", dst_key, dst_raw),
            wb_predicate,
        ]
        mutations += [Delete("path_current", src_key), Put("path_current", dst_key, moved), wb_mutation]
        mutations += publish.index_mutations(root.root_id, inc, src, entry, None)
        mutations += publish.index_mutations(root.root_id, inc, dst, old_dst, moved)
        return Built(
            predicates=predicates,
            mutations=mutations,
            events=[wb.event(workbench, ChangeEventKind.PathRenamed, join(dst), join(src).encode(), entry.artifact_revision_id)],
            value=moved,
        )

    _, built = root.apply(build, digest=intent_digest("path.rename", workbench_id, join(src), join(dst)))
    return built.value
