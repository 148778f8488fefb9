"""Tags: named, movable references from a workbench incarnation to a Sealed commit.

Each tag owns exactly one CommitConsumer(commit, Tag, incarnation | u16 len | name). Setting a
tag is one command: it adds the consumer to the new commit (which must be Sealed: a Retiring
commit refuses new consumers, so a tag and a retirement have one CAS winner) and, when the tag
moves, removes the consumer from the old commit; tag_generation starts at 1 and advances on
every move. Deleting a tag removes its row and its consumer. Moving or deleting a tag never
retires a commit: a commit whose consumer count reaches zero is only recorded
(last_zero_consumer_version) and stays Sealed until an explicit commit.retire.

`expected_generation`: None is unconditional, 0 requires the tag to be absent, N requires it at
generation N (GenerationConflict otherwise). Setting a tag to the commit it already names
changes nothing and returns it.
"""

from __future__ import annotations

from dataclasses import dataclass

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import scan_prefix
from nokvfs.errors import GenerationConflict, NotFound
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, CommitConsumerKind
from nokvfs.schema.ids import check_commit_id, new_id16
from nokvfs.schema.names import check_tag_name
from nokvfs.schema.records import Tag
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.consumers import Consumers
from nokvfs.workspace.root import Built, intent_digest


@dataclass(frozen=True)
class TagInfo:
    name: str
    commit_id: bytes
    generation: int
    workbench: wb.Workbench


def tag_key(root_id: bytes, incarnation: bytes, name: str) -> bytes:
    return keys.TagKey(root_id, incarnation, name).encode()


def _check_generation(name: str, expected: int | None, current: Tag | None) -> None:
    if expected is None:
        return
    actual = 0 if current is None else current.tag_generation
    if actual != expected:
        raise GenerationConflict(f"tag {name!r} is at generation {actual}, expected {expected}")


def set(root, workbench_id: str, name: str, commit_id: bytes, expected_generation: int | None = None) -> TagInfo:
    """Point `name` at `commit_id` (creating or moving the tag)."""
    check_tag_name(name)
    check_commit_id(commit_id)

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        inc = workbench.incarnation_id
        key = tag_key(root.root_id, inc, name)
        raw = view.get("tag", key)
        current = None if raw is None else Tag.decode(raw)
        _check_generation(name, expected_generation, current)
        if current is not None and current.commit_id == commit_id:
            raise _Unchanged(TagInfo(name, commit_id, current.tag_generation, workbench))
        owner = keys.tag_consumer_owner(inc, name)
        consumers = Consumers(view, root.root_id)
        consumers.add(commit_id, CommitConsumerKind.Tag, owner)
        if current is not None:
            consumers.remove(current.commit_id, CommitConsumerKind.Tag, owner)
        tag = Tag(commit_id=commit_id, tag_generation=1 if current is None else current.tag_generation + 1)
        predicates, mutations = consumers.rows()
        predicates += [
            ValueEquals("workspace_current", wb.current_key(root.root_id, workbench_id), raw_wb),
            Absent("tag", key) if raw is None else ValueEquals("tag", key, raw),
        ]
        mutations.append(Put("tag", key, tag))
        before = None if current is None else current.commit_id
        return Built(
            predicates=predicates,
            mutations=mutations,
            events=[wb.event(workbench, ChangeEventKind.TagSet, name, before, commit_id)],
            value=TagInfo(name, commit_id, tag.tag_generation, workbench),
        )

    try:
        _, built = root.apply(build, digest=intent_digest("tag.set", new_id16(), workbench_id, name, commit_id))
    except _Unchanged as unchanged:
        return unchanged.info
    return built.value


def delete(root, workbench_id: str, name: str, expected_generation: int | None = None) -> TagInfo:
    """Remove the tag and its consumer; returns what it named. The commit stays Sealed."""
    check_tag_name(name)

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        inc = workbench.incarnation_id
        key = tag_key(root.root_id, inc, name)
        raw = view.get("tag", key)
        if raw is None:
            raise NotFound(f"no tag {name!r} in {workbench_id}")
        current = Tag.decode(raw)
        _check_generation(name, expected_generation, current)
        consumers = Consumers(view, root.root_id)
        consumers.remove(current.commit_id, CommitConsumerKind.Tag, keys.tag_consumer_owner(inc, name))
        predicates, mutations = consumers.rows()
        predicates += [
            ValueEquals("workspace_current", wb.current_key(root.root_id, workbench_id), raw_wb),
            ValueEquals("tag", key, raw),
        ]
        mutations.append(Delete("tag", key))
        return Built(
            predicates=predicates,
            mutations=mutations,
            events=[wb.event(workbench, ChangeEventKind.TagDeleted, name, current.commit_id, None)],
            value=TagInfo(name, current.commit_id, current.tag_generation, workbench),
        )

    _, built = root.apply(build, digest=intent_digest("tag.delete", new_id16(), workbench_id, name))
    return built.value


def resolve(root, workbench_id: str, name: str) -> TagInfo:
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        return resolve_in(view, root, workbench, name)


def resolve_in(view, root, workbench: wb.Workbench, name: str) -> TagInfo:
    """`resolve` within one read view, for a workbench already read from it."""
    check_tag_name(name)
    raw = view.get("tag", tag_key(root.root_id, workbench.incarnation_id, name))
    if raw is None:
        raise NotFound(f"no tag {name!r} in {workbench.workbench_id}")
    tag = Tag.decode(raw)
    return TagInfo(name, tag.commit_id, tag.tag_generation, workbench)


def list_tags(root, workbench_id: str) -> list[TagInfo]:
    """Every tag of the workbench, by name (UTF-8 byte order), read in bounded pages."""
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        prefix = keys.snapshot_ref_prefix(root.root_id, workbench.incarnation_id)  # root | incarnation
        out, marker = [], None
        while True:
            page = scan_prefix(view, "tag", prefix, start_after=marker)
            for key, value in page.items:
                tag = Tag.decode(value)
                out.append(TagInfo(keys.TagKey.decode(key).tag_name, tag.commit_id, tag.tag_generation, workbench))
            if page.next_marker is None:
                return sorted(out, key=lambda t: t.name.encode("utf-8"))
            marker = page.next_marker


list = list_tags


class _Unchanged(Exception):
    def __init__(self, info: TagInfo):
        super().__init__(info.name)
        self.info = info
