"""Put, remove and rename of paths, and the metadata-only attribute, link and directory-marker
commands: each one MetadataCommand over PathCurrent and references (a put or a new link or
marker goes through the publish pipeline).

Rename is one command: the new path takes a Path reference to the same revision (replacing and
releasing whatever the target held), the old path's entry and reference are removed.

Attributes (nokvfs.workspace.attributes) ride in the PathEntry's typed projection: a put stores
the ones it is given in the same command that creates the revision; set_attributes changes them
alone, with no upload and no new revision. Links are artifacts whose body is the target; a
directory's attributes are its marker artifact (DIRECTORY_MARKER), written only here.
"""

from __future__ import annotations

import dataclasses

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.errors import (
    AlreadyExists,
    CommandTooLarge,
    CorruptRecord,
    GenerationConflict,
    InvalidInput,
    IsADirectory,
    NokvError,
    NotADirectory,
    NotFound,
)
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, ReferenceKind
from nokvfs.schema.paths import join, normalize_path
from nokvfs.schema.records import PathEntry
from nokvfs.workspace import attributes as attrs
from nokvfs.workspace import body as bodies
from nokvfs.workspace import publish, reading
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.attributes import Attributes
from nokvfs.workspace.refs import References
from nokvfs.workspace.root import Built, intent_digest


def put(
    root,
    workbench_id: str,
    path: str,
    source,
    *,
    expected_generation: int | None = None,
    expected_revision_id: bytes | None = None,
    content_type: str = publish.DEFAULT_CONTENT_TYPE,
    producer: str = "",
    index_fields=(),
    progress=None,
    attributes: Attributes | None = None,
) -> PathEntry:
    """Publish `source` (bytes, a Body, or a readable binary stream) as a new revision of `path`.

    expected_generation: None replaces unconditionally, 0 requires the path to be absent, N
    requires the path to be at generation N; expected_revision_id requires it to hold exactly
    that revision (GenerationConflict otherwise). attributes: stored in the same command (None:
    nothing stored; the path then shows the defaults of attributes.shown).
    """
    if content_type in attrs.RESERVED_CONTENT_TYPES:
        raise InvalidInput(
            f"content type {content_type!r} is reserved: links are made by symlink, directory markers by "
            "set_directory_attributes"
        )
    components = normalize_path(path)
    publish.check_publishable(components)
    return _put(
        root,
        workbench_id,
        components,
        source,
        expected_generation=expected_generation,
        expected_revision_id=expected_revision_id,
        content_type=content_type,
        producer=producer,
        index_fields=check_index_fields(index_fields),
        progress=progress,
        attributes=attributes,
    )


def _put(
    root,
    workbench_id: str,
    components,
    source,
    *,
    expected_generation,
    expected_revision_id,
    content_type,
    producer="",
    index_fields=(),
    progress=None,
    attributes=None,
) -> PathEntry:
    if attributes is not None and not isinstance(attributes, Attributes):
        raise InvalidInput(f"attributes must be an Attributes, not {type(attributes).__name__}")
    if isinstance(source, (bytes, bytearray, memoryview)):
        body = bodies.from_bytes(bytes(source), root.block_size)
    elif isinstance(source, bodies.Body):
        body = source
    else:
        body = bodies.from_stream(source, root.spool_dir, root.block_size)
    try:
        return publish.run(
            root,
            publication(
                workbench_id,
                components,
                body,
                expected_generation=expected_generation,
                expected_revision_id=expected_revision_id,
                content_type=content_type,
                producer=producer,
                index_fields=index_fields,
                progress=progress,
                attributes=attributes,
            ),
        )
    finally:
        body.discard()


def publication(
    workbench_id: str,
    components,
    body,
    *,
    expected_generation=None,
    expected_revision_id=None,
    content_type=publish.DEFAULT_CONTENT_TYPE,
    producer="",
    index_fields=(),
    progress=None,
    attributes: Attributes | None = None,
) -> publish.Publication:
    """The Publication a put of `body` runs (or a group of them: publish.run_group)."""
    return publish.Publication(
        workbench_id=workbench_id,
        components=components,
        body=body,
        logical_size=body.size,
        body_digest_uri=body.digest_uri,
        expected_generation=expected_generation,
        expected_revision_id=expected_revision_id,
        content_type=content_type,
        producer=producer,
        index_fields=attrs.with_attributes(index_fields, attributes),
        progress=progress,
    )


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
        if attrs.is_reserved_field(field.name):
            raise IndexValueInvalid(f"index ids starting {attrs.RESERVED_FIELD_PREFIX!r} are reserved: {field.name!r}")
        names.add(field.name)
        try:
            index_codec.decode(bytes(field.encoded_value))
        except (FormatError, InvalidInput) as exc:
            raise IndexValueInvalid(f"index field {field.name!r} is not one encoded index value: {exc}") from None
    return fields


def _entry(view, root, incarnation: bytes, components) -> tuple[bytes, bytes | None]:
    key = keys.path_current_key(root.root_id, incarnation, components)
    return key, view.get("path_current", key)


def existing_file(view, root, workbench, components, *, hint: str = "") -> tuple[bytes, bytes]:
    """(key, raw PathEntry) of the file at `components`: IsADirectory if a directory is there
    (one bounded probe), NotFound if nothing is."""
    key, raw = _entry(view, root, workbench.incarnation_id, components)
    if raw is None:
        prefix = keys.path_subtree_prefix(root.root_id, workbench.incarnation_id, components)
        if view.seek("path_current", prefix, within=prefix) is not None:
            raise IsADirectory(f"{workbench.workbench_id}:{join(components)} is a directory{hint}")
        raise NotFound(f"{workbench.workbench_id}:{join(components)} does not exist")
    return key, raw


def remove(
    root,
    workbench_id: str,
    path: str,
    *,
    expected_generation: int | None = None,
    expected_revision_id: bytes | None = None,
) -> PathEntry:
    components = normalize_path(path)
    publish.check_publishable(components)
    return _remove(
        root,
        workbench_id,
        components,
        expected_generation=expected_generation,
        expected_revision_id=expected_revision_id,
    )


def _remove(root, workbench_id: str, components, *, expected_generation=None, expected_revision_id=None) -> PathEntry:
    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        key, raw = _entry(view, root, workbench.incarnation_id, components)
        if raw is None:
            raise NotFound(f"{workbench_id}:{join(components)} does not exist")
        entry = PathEntry.decode(raw)
        publish.check_expectation(expected_generation, expected_revision_id, entry, join(components))
        version = view.version + 1
        refs = References(view, root.root_id)
        refs.remove(
            ReferenceKind.Path, publish.path_owner(workbench.incarnation_id, components), entry.artifact_revision_id
        )
        predicates, mutations = refs.rows()
        wb_predicate, wb_mutation = wb.advance_revision(root.root_id, workbench_id, raw_wb, version)
        predicates += [ValueEquals("path_current", key, raw), wb_predicate]
        mutations += [Delete("path_current", key), wb_mutation]
        mutations += publish.index_mutations(root.root_id, workbench.incarnation_id, components, entry, None)
        return Built(
            predicates=predicates,
            mutations=mutations,
            events=[
                wb.event(workbench, ChangeEventKind.PathRemoved, join(components), entry.artifact_revision_id, None)
            ],
            value=entry,
        )

    _, built = root.apply(
        build,
        digest=intent_digest("path.remove", workbench_id, join(components), expected_generation, expected_revision_id),
    )
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
            events=[
                wb.event(
                    workbench, ChangeEventKind.PathRenamed, join(dst), join(src).encode(), entry.artifact_revision_id
                )
            ],
            value=moved,
        )

    _, built = root.apply(build, digest=intent_digest("path.rename", workbench_id, join(src), join(dst)))
    return built.value


# Paths one directory rename moves in its one command: each is a PathRenamed event, and a
# command carries at most nokvfs.engine.command.MAX_EVENTS (1,024) events.
MAX_DIRECTORY_RENAME = 1000


def paths_below(view, root, incarnation: bytes, components, limit: int) -> list[tuple[bytes, bytes, tuple]]:
    """(key, raw PathEntry, components) of up to `limit` paths strictly below `components`, in
    key order (a bounded ordered scan)."""
    prefix = keys.path_subtree_prefix(root.root_id, incarnation, components)
    found, probe = [], prefix
    while len(found) < limit:
        hit = view.seek("path_current", probe, within=prefix)
        if hit is None:
            break
        key, raw = hit
        found.append((key, raw, tuple(keys.PathCurrentKey.decode(key).path)))
        probe = key + b"\x00"
    return found


def rename_directory(
    root, workbench_id: str, source: str, target: str, *, limit: int = MAX_DIRECTORY_RENAME
) -> list[tuple[tuple, tuple, PathEntry]]:
    """rename(2) of a directory: every path below `source` (files, links, attribute markers)
    moves below `target` in ONE command, one PathRenamed event per path, so every other reader
    sees the whole subtree move at once or not at all. Returns (old components, new components,
    new PathEntry) of each path moved.

    `target` must not exist or be an empty directory: its attribute marker, if any, is replaced
    by the source's (or removed). NotFound if nothing durable is below `source`; NotADirectory if
    either side is a file (or below one); AlreadyExists if `target` has entries; CommandTooLarge
    beyond `limit` paths (a bigger tree is moved by copying, as `mv` does across devices)."""
    src, dst = normalize_path(source), normalize_path(target)
    publish.check_publishable(src)
    publish.check_publishable(dst)
    if dst[: len(src)] == src:
        raise InvalidInput(f"cannot move {join(src)} into itself ({join(dst)})")

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        inc = workbench.incarnation_id
        for depth in range(2, max(len(src), len(dst)) + 1):
            for side in (src, dst):
                if depth <= len(side) and _entry(view, root, inc, side[:depth])[1] is not None:
                    raise NotADirectory(f"{workbench_id}:{join(side[:depth])} is a file")
        moving = paths_below(view, root, inc, src, limit + 1)
        if not moving:
            raise NotFound(f"{workbench_id}:{join(src)} holds no published path")
        if len(moving) > limit:
            raise CommandTooLarge(
                f"{workbench_id}:{join(src)} holds more than {limit} paths: one rename moves at most {limit}"
            )
        marker = dst + (attrs.DIRECTORY_MARKER,)
        replaced = {}
        for key, raw, components in paths_below(view, root, inc, dst, 2):
            if components != marker:
                raise AlreadyExists(f"{workbench_id}:{join(dst)} is not empty")
            replaced[components] = (key, raw)
        version = view.version + 1
        refs = References(view, root.root_id)
        predicates, mutations, events, done = [], [], [], []
        for key, raw, components in moving:
            new = dst + components[len(src) :]
            entry = PathEntry.decode(raw)
            new_key = keys.path_current_key(root.root_id, inc, new)
            old_key, old_raw = replaced.pop(new, (new_key, None))
            old = None if old_raw is None else PathEntry.decode(old_raw)
            refs.remove(ReferenceKind.Path, publish.path_owner(inc, components), entry.artifact_revision_id)
            refs.add(ReferenceKind.Path, publish.path_owner(inc, new), entry.artifact_revision_id)
            if old is not None:
                refs.remove(ReferenceKind.Path, publish.path_owner(inc, new), old.artifact_revision_id)
            moved = dataclasses.replace(
                entry,
                generation=1 if old is None else old.generation + 1,
                created_version=version,
                modified_version=version,
            )
            predicates += [
                ValueEquals("path_current", key, raw),
                Absent("path_current", new_key) if old_raw is None else ValueEquals("path_current", new_key, old_raw),
            ]
            mutations += [Delete("path_current", key), Put("path_current", new_key, moved)]
            mutations += publish.index_mutations(root.root_id, inc, components, entry, None)
            mutations += publish.index_mutations(root.root_id, inc, new, old, moved)
            events.append(
                wb.event(
                    workbench,
                    ChangeEventKind.PathRenamed,
                    join(new),
                    join(components).encode(),
                    entry.artifact_revision_id,
                )
            )
            done.append((components, new, moved))
        for components, (key, raw) in replaced.items():  # the target's marker, not replaced by one
            old = PathEntry.decode(raw)
            refs.remove(ReferenceKind.Path, publish.path_owner(inc, components), old.artifact_revision_id)
            predicates.append(ValueEquals("path_current", key, raw))
            mutations.append(Delete("path_current", key))
            mutations += publish.index_mutations(root.root_id, inc, components, old, None)
            events.append(
                wb.event(workbench, ChangeEventKind.PathRemoved, join(components), old.artifact_revision_id, None)
            )
        ref_predicates, ref_mutations = refs.rows()
        wb_predicate, wb_mutation = wb.advance_revision(root.root_id, workbench_id, raw_wb, version)
        return Built(
            predicates=ref_predicates + predicates + [wb_predicate],
            mutations=ref_mutations + mutations + [wb_mutation],
            events=events,
            value=done,
        )

    _, built = root.apply(build, digest=intent_digest("path.rename_directory", workbench_id, join(src), join(dst)))
    return built.value


# --- attributes, links and directory markers ---------------------------------------------------


def set_attributes(
    root,
    workbench_id: str,
    path: str,
    *,
    mode: int | None = None,
    uid: int | None = None,
    gid: int | None = None,
    mtime_ns: int | None = None,
    atime_ns: int | None = None,
    expected_revision_id: bytes | None = None,
) -> PathEntry:
    """chmod/chown/utime of an existing file or link: ONE metadata-only command.

    The entry keeps its revision, body, size and generation; its projection gets the merged
    attributes (fields not given keep their stored or shown value) with ctime = now;
    modified_version and the workspace revision advance; the event is PathAttributesChanged
    (before = after = the revision id). Nothing is uploaded and no revision is created.
    GenerationConflict if `expected_revision_id` is given and the path holds another revision.
    """
    components = normalize_path(path)
    publish.check_publishable(components)
    return _set_attributes(
        root,
        workbench_id,
        components,
        dict(mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns),
        expected_revision_id,
    )


def _set_attributes(
    root, workbench_id: str, components, changes: dict, expected_revision_id: bytes | None = None
) -> PathEntry:
    ctime = attrs.now_ns()  # taken once, so a rebuilt command stores the same time
    attrs.merged(Attributes(0, None, None, 0, 0, 0), **changes)  # bad values fail here, before any read

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        key, raw = existing_file(
            view, root, workbench, components, hint=": set its attributes with set_directory_attributes"
        )
        entry = PathEntry.decode(raw)
        publish.check_expectation(None, expected_revision_id, entry, join(components))
        stored = attrs.merged(attrs.shown(entry), **changes, ctime_ns=ctime)
        version = view.version + 1
        updated = dataclasses.replace(
            entry,
            modified_version=version,
            typed_index_projection=attrs.with_attributes(entry.typed_index_projection, stored),
        )
        wb_predicate, wb_mutation = wb.advance_revision(root.root_id, workbench_id, raw_wb, version)
        mutations = [Put("path_current", key, updated), wb_mutation]
        mutations += publish.index_mutations(root.root_id, workbench.incarnation_id, components, entry, updated)
        revision = entry.artifact_revision_id
        return Built(
            predicates=[ValueEquals("path_current", key, raw), wb_predicate],
            mutations=mutations,
            events=[wb.event(workbench, ChangeEventKind.PathAttributesChanged, join(components), revision, revision)],
            value=updated,
        )

    parts = [changes[name] for name in ("mode", "uid", "gid", "mtime_ns", "atime_ns")]
    _, built = root.apply(
        build,
        digest=intent_digest("path.attributes", workbench_id, join(components), *parts, expected_revision_id, ctime),
    )
    return built.value


def symlink(
    root,
    workbench_id: str,
    path: str,
    target: str,
    *,
    attributes: Attributes | None = None,
    expected_generation: int | None = None,
    expected_revision_id: bytes | None = None,
) -> PathEntry:
    """A symbolic link at `path`: an artifact (SYMLINK_CONTENT_TYPE) whose body is the target's
    UTF-8 bytes (1..MAX_LINK_TARGET, no NUL; InvalidInput otherwise), with mode LINK_MODE and
    the current time unless `attributes` are given. The target is never resolved."""
    raw = attrs.link_target_bytes(target)
    components = normalize_path(path)
    publish.check_publishable(components)
    if attributes is None:
        now = attrs.now_ns()
        attributes = Attributes(attrs.LINK_MODE, None, None, now, now, now)
    return _put(
        root,
        workbench_id,
        components,
        raw,
        expected_generation=expected_generation,
        expected_revision_id=expected_revision_id,
        content_type=attrs.SYMLINK_CONTENT_TYPE,
        attributes=attributes,
    )


def read_link(root, entry: PathEntry, *, view=None) -> str:
    """The target of a link entry (one bounded read; `view` for a snapshot or commit whose
    revision the live rows may no longer name). InvalidInput if the entry is not a link."""
    if not attrs.is_symlink(entry):
        raise InvalidInput(f"revision {entry.artifact_revision_id.hex()} is not a symbolic link ({entry.content_type})")
    if not 1 <= entry.logical_size <= attrs.MAX_LINK_TARGET:
        raise CorruptRecord(f"link revision {entry.artifact_revision_id.hex()} has a {entry.logical_size}-byte target")
    raw = reading.read(root, entry, 0, entry.logical_size, view=view)
    if b"\x00" in raw:
        raise CorruptRecord(f"link revision {entry.artifact_revision_id.hex()} has a NUL in its target")
    return attrs.link_target_text(raw)


def _marker(dir_path: str) -> tuple[str, ...]:
    """The marker path of a directory below a section (a section itself included)."""
    if dir_path in ("", "."):
        raise InvalidInput("the workbench itself has no stored attributes; name a section or a directory below one")
    components = normalize_path(dir_path) + (attrs.DIRECTORY_MARKER,)
    publish.check_publishable(components, directory_marker=True)
    return components


def directory_attributes(view, root, incarnation: bytes, components: tuple) -> Attributes | None:
    """The stored attributes of a directory: one PathCurrent point read of its marker."""
    raw = view.get(
        "path_current", keys.path_current_key(root.root_id, incarnation, tuple(components) + (attrs.DIRECTORY_MARKER,))
    )
    return None if raw is None else attrs.shown(PathEntry.decode(raw))


def set_directory_attributes(
    root,
    workbench_id: str,
    dir_path: str,
    *,
    mode: int | None = None,
    uid: int | None = None,
    gid: int | None = None,
    mtime_ns: int | None = None,
    atime_ns: int | None = None,
) -> PathEntry:
    """chmod/chown/utime of a directory: creates its marker (an empty-body artifact) with these
    attributes if it has none (unset fields: DIRECTORY_MODE, no owner, now), else one
    metadata-only change of the marker. A directory that does not exist yet comes into being
    with its marker (the mount's mkdir + chmod); a file at `dir_path` is NotADirectory."""
    components = _marker(dir_path)
    changes = dict(mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns)
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        if (
            view.get("path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, components[:-1]))
            is not None
        ):
            raise NotADirectory(f"{workbench_id}:{join(components[:-1])} is a file")
        exists = (
            view.get("path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, components))
            is not None
        )
    if not exists:
        now = attrs.now_ns()
        fresh = attrs.merged(Attributes(attrs.DIRECTORY_MODE, None, None, now, now, now), **changes)
        try:
            return _put(
                root,
                workbench_id,
                components,
                b"",
                expected_generation=0,
                expected_revision_id=None,
                content_type=attrs.DIRECTORY_CONTENT_TYPE,
                attributes=fresh,
            )
        except GenerationConflict:
            pass  # another writer created the marker first: change it instead
    return _set_attributes(root, workbench_id, components, changes)


def set_directories_attributes(root, items) -> list:
    """Several directories' attribute changes, in order (the write-back mount's publisher).
    Each item is (workbench_id, dir_path, changes, made_ns, changed_ns): as
    set_directory_attributes, except that a marker made here takes its times from when the change
    was accepted (mtime and atime `made_ns`, ctime `changed_ns`, then `changes`), and consecutive
    new markers are published as one group (publish.run_group). Per item its PathEntry, or the
    NokvError that refused it."""
    results: list = [None] * len(items)
    run: list = []  # (index, Publication) of new markers, published together

    def flush() -> None:
        if not run:
            return
        try:
            outcomes = publish.run_group(root, [pub for _, pub in run])
        finally:
            for _, pub in run:
                pub.body.discard()
        for (index, _), outcome in zip(run, outcomes):
            if isinstance(outcome, GenerationConflict):  # another writer made the marker first
                workbench_id, dir_path, given, _, _ = items[index]
                try:
                    outcome = set_directory_attributes(root, workbench_id, dir_path, **given)
                except NokvError as exc:
                    outcome = exc
            results[index] = outcome
        run.clear()

    for index, (workbench_id, dir_path, given, made_ns, changed_ns) in enumerate(items):
        changes = {**dict.fromkeys(("mode", "uid", "gid", "mtime_ns", "atime_ns")), **given}
        try:
            components = _marker(dir_path)
            with root.read() as view:
                _, workbench = wb.visible(view, root.root_id, workbench_id)
                incarnation = workbench.incarnation_id
                if view.get("path_current", keys.path_current_key(root.root_id, incarnation, components[:-1])):
                    raise NotADirectory(f"{workbench_id}:{join(components[:-1])} is a file")
                exists = view.get("path_current", keys.path_current_key(root.root_id, incarnation, components))
            if exists is not None:
                flush()
                results[index] = _set_attributes(root, workbench_id, components, changes)
                continue
            fresh = attrs.merged(Attributes(attrs.DIRECTORY_MODE, None, None, made_ns, made_ns, changed_ns), **changes)
            body = bodies.from_bytes(b"", root.block_size)
            run.append(
                (
                    index,
                    publication(
                        workbench_id,
                        components,
                        body,
                        expected_generation=0,
                        content_type=attrs.DIRECTORY_CONTENT_TYPE,
                        attributes=fresh,
                    ),
                )
            )
        except NokvError as exc:
            results[index] = exc
    flush()
    return results


def remove_directory_attributes(root, workbench_id: str, dir_path: str) -> PathEntry | None:
    """Remove a directory's marker (the mount's rmdir); None if it has none (idempotent)."""
    components = _marker(dir_path)
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        if view.get("path_current", keys.path_current_key(root.root_id, workbench.incarnation_id, components)) is None:
            return None
    try:
        return _remove(root, workbench_id, components)
    except NotFound:
        return None  # removed by another writer in between
