"""Leased snapshots: SnapshotRef, an optional SnapshotAlias and a HistoryHold, created atomically.

    Active -> ReapClaimed -> Reaped      (the reaper, after the lease deadline plus skew grace;
                                          a later reaper finishes a claim a killed one left)
    Active -> Retired                    (explicit retirement)

A SnapshotId is the commit version of the command that minted it: unique within the root,
monotonic, and exactly the numeric facade id. The snapshot reads at the version it was minted
at. Minting a name again advances alias_generation and moves the name; renewal and retirement
never move it, and a terminal latest snapshot does not fall back to an earlier mint. Name-based
commands predicate the exact alias row together with the SnapshotRef, so a concurrent remint
cannot redirect them. Renewal is extend-only and may revive an expired snapshot the reaper has
not claimed. Retire and reap predicate zero consumers at the expected epoch: a live restore/fork
consumer fails them with ForkRetentionActive. Lease deadlines use the shard's persisted lease
clock, which never moves backwards.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from nokvfs.engine.command import Absent, Delete, Put, ValueEquals
from nokvfs.engine.scan import scan_prefix
from nokvfs.errors import IntegrityError, InvalidInput, NotFound, PredicateFailed
from nokvfs.schema import keys
from nokvfs.schema.enums import ChangeEventKind, HistoryHoldKind, HistoryHoldState, SnapshotState
from nokvfs.schema.names import check_snapshot_alias
from nokvfs.schema.records import HistoryHold, SnapshotAlias, SnapshotRef
from nokvfs.workspace import workbench as wb
from nokvfs.workspace.operations import crash_point
from nokvfs.workspace.root import Built, intent_digest

DEFAULT_LEASE_SECONDS = 3600
DEFAULT_SKEW_GRACE_MS = 5_000
MAX_LEASE_SECONDS = 10 * 365 * 86400


class ForkRetentionActive(PredicateFailed):
    """A restore/fork still consumes the snapshot: it cannot be retired or reaped."""


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: int
    workbench: wb.Workbench
    ref: SnapshotRef
    lease_clock_ms: int

    @property
    def read_version(self) -> int:
        return self.ref.read_version

    @property
    def expired(self) -> bool:
        """Derived: the durable lifecycle stays Active until the reaper claims it."""
        return self.ref.state == SnapshotState.Active and self.ref.lease_deadline <= self.lease_clock_ms


def _ref_key(root, incarnation: bytes, snapshot_id: int) -> bytes:
    return keys.SnapshotRefKey(root.root_id, incarnation, snapshot_id).encode()


def _alias_key(root, incarnation: bytes, alias: str) -> bytes:
    return keys.SnapshotAliasKey(root.root_id, incarnation, alias).encode()


def _hold_key(root, snapshot_id: int) -> bytes:
    return keys.HistoryHoldKey(root.root_id, HistoryHoldKind.Snapshot, snapshot_id.to_bytes(8, "big")).encode()


def _lease_ms(seconds: float) -> int:
    if not 0 < seconds <= MAX_LEASE_SECONDS:
        raise InvalidInput(f"a lease is 0 < seconds <= {MAX_LEASE_SECONDS}")
    return int(seconds * 1000)


def observe_clock(root) -> int:
    """Persist the wall clock into the lease clock (it only moves forward) and return it."""
    return root.shard.observe_lease_clock(time.time_ns() // 1_000_000)


def _resolve(view, root, workbench: wb.Workbench, selector: int | str):
    """(snapshot id, ref key, raw ref, alias predicate or None) for a numeric id or an alias."""
    alias_predicate = None
    if isinstance(selector, int) and not isinstance(selector, bool):
        snapshot_id = selector
    else:
        alias = check_snapshot_alias(selector)
        alias_key = _alias_key(root, workbench.incarnation_id, alias)
        raw_alias = view.get("snapshot_alias", alias_key)
        if raw_alias is None:
            raise NotFound(f"no snapshot named {alias!r} in {workbench.workbench_id}")
        snapshot_id = SnapshotAlias.decode(raw_alias).snapshot_id
        alias_predicate = ValueEquals("snapshot_alias", alias_key, raw_alias)
    ref_key = _ref_key(root, workbench.incarnation_id, snapshot_id)
    raw = view.get("snapshot_ref", ref_key)
    if raw is None:
        raise NotFound(f"no snapshot {selector!r} in {workbench.workbench_id}")
    return snapshot_id, ref_key, raw, alias_predicate


def get(root, workbench_id: str, selector: int | str) -> Snapshot:
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        return find(view, root, workbench, selector)


def find(view, root, workbench: wb.Workbench, selector: int | str) -> Snapshot:
    """`get` within one read view, for a workbench already read from it."""
    snapshot_id, _, raw, _ = _resolve(view, root, workbench, selector)
    return Snapshot(snapshot_id, workbench, SnapshotRef.decode(raw), root.shard.lease_clock_ms)


def list_snapshots(root, workbench_id: str) -> list[Snapshot]:
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        prefix = keys.snapshot_ref_prefix(root.root_id, workbench.incarnation_id)
        out, marker = [], None
        clock = root.shard.lease_clock_ms
        while True:
            page = scan_prefix(view, "snapshot_ref", prefix, start_after=marker)
            for key, value in page.items:
                out.append(
                    Snapshot(keys.SnapshotRefKey.decode(key).snapshot_id, workbench, SnapshotRef.decode(value), clock)
                )
            if page.next_marker is None:
                return out
            marker = page.next_marker


def mint(
    root,
    workbench_id: str,
    *,
    alias: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    annotation: str | None = None,
) -> Snapshot:
    if alias is not None:
        check_snapshot_alias(alias)
    lease = _lease_ms(lease_seconds)
    clock = observe_clock(root)

    def build(view):
        raw_wb, workbench = wb.visible(view, root.root_id, workbench_id)
        snapshot_id = view.version + 1
        ref = SnapshotRef(
            read_version=view.version,
            alias=alias,
            lease_deadline=clock + lease,
            state=SnapshotState.Active,
            consumer_count=0,
            consumer_epoch=0,
            annotation=annotation,
        )
        ref_key = _ref_key(root, workbench.incarnation_id, snapshot_id)
        hold_key = _hold_key(root, snapshot_id)
        predicates = [
            ValueEquals("workspace_current", wb.current_key(root.root_id, workbench_id), raw_wb),
            Absent("snapshot_ref", ref_key),
            Absent("history_hold", hold_key),
        ]
        mutations = [
            Put("snapshot_ref", ref_key, ref),
            Put("history_hold", hold_key, HistoryHold(view.version, snapshot_id, HistoryHoldState.Active, snapshot_id)),
        ]
        if alias is not None:
            alias_key = _alias_key(root, workbench.incarnation_id, alias)
            raw_alias = view.get("snapshot_alias", alias_key)
            generation = 1 if raw_alias is None else SnapshotAlias.decode(raw_alias).alias_generation + 1
            predicates.append(
                Absent("snapshot_alias", alias_key)
                if raw_alias is None
                else ValueEquals("snapshot_alias", alias_key, raw_alias)
            )
            mutations.append(Put("snapshot_alias", alias_key, SnapshotAlias(snapshot_id, generation, None)))
        return Built(
            predicates=predicates,
            mutations=mutations,
            events=[wb.event(workbench, ChangeEventKind.SnapshotMinted, alias, None, snapshot_id.to_bytes(8, "big"))],
            value=Snapshot(snapshot_id, workbench, ref, clock),
        )

    from nokvfs.schema.ids import new_id16

    _, built = root.apply(build, digest=intent_digest("snapshot.mint", new_id16(), workbench_id, alias))
    return built.value


def _pin(root, workbench_id: str, selector: int | str):
    """Resolve a selector once: (snapshot id, alias predicate or None).

    Commands then predicate that exact alias row, so a concurrent remint makes them fail
    instead of redirecting them to the newer snapshot when they are rebuilt.
    """
    with root.read() as view:
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        snapshot_id, _, _, alias_predicate = _resolve(view, root, workbench, selector)
    return snapshot_id, alias_predicate


def _check_pin(view, alias_predicate) -> None:
    if alias_predicate is not None and view.get("snapshot_alias", alias_predicate.key) != alias_predicate.value:
        raise PredicateFailed("the snapshot name was reminted concurrently")


def renew(root, workbench_id: str, selector: int | str, *, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Snapshot:
    """Extend the lease (never shorten it). An expired snapshot the reaper has not claimed revives."""
    lease = _lease_ms(lease_seconds)
    clock = observe_clock(root)
    snapshot_id, alias_predicate = _pin(root, workbench_id, selector)

    def build(view):
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        _check_pin(view, alias_predicate)
        _, ref_key, raw, _ = _resolve(view, root, workbench, snapshot_id)
        ref = SnapshotRef.decode(raw)
        if ref.state != SnapshotState.Active:
            raise PredicateFailed(f"snapshot {snapshot_id} is {ref.state.name}: it cannot be renewed")
        renewed = dataclasses.replace(ref, lease_deadline=max(ref.lease_deadline, clock + lease))
        predicates = [ValueEquals("snapshot_ref", ref_key, raw)] + ([alias_predicate] if alias_predicate else [])
        return Built(
            predicates=predicates,
            mutations=[Put("snapshot_ref", ref_key, renewed)],
            value=Snapshot(snapshot_id, workbench, renewed, clock),
        )

    _, built = root.apply(build, digest=intent_digest("snapshot.renew", workbench_id, snapshot_id, lease, clock))
    return built.value


def _terminal(
    view,
    root,
    workbench,
    snapshot_id: int,
    ref_key: bytes,
    raw: bytes,
    alias_predicate,
    state: SnapshotState,
    kind: ChangeEventKind | None,
):
    ref = SnapshotRef.decode(raw)
    if ref.state != SnapshotState.Active:
        raise PredicateFailed(f"snapshot {snapshot_id} is {ref.state.name}")
    if ref.consumer_count != 0:
        raise ForkRetentionActive(f"snapshot {snapshot_id} has {ref.consumer_count} live restore/fork consumer(s)")
    predicates = [ValueEquals("snapshot_ref", ref_key, raw)] + ([alias_predicate] if alias_predicate else [])
    mutations = [
        Put("snapshot_ref", ref_key, dataclasses.replace(ref, state=state)),
        Delete("history_hold", _hold_key(root, snapshot_id)),
    ]
    raw_hold = view.get("history_hold", _hold_key(root, snapshot_id))
    if raw_hold is None:
        raise IntegrityError(f"Active snapshot {snapshot_id} has no HistoryHold")
    predicates.append(ValueEquals("history_hold", _hold_key(root, snapshot_id), raw_hold))
    if ref.alias is not None:
        # The alias keeps naming its latest mint; if that is this snapshot, project its end.
        alias_key = _alias_key(root, workbench.incarnation_id, ref.alias)
        raw_alias = view.get("snapshot_alias", alias_key)
        if raw_alias is not None:
            current = SnapshotAlias.decode(raw_alias)
            if current.snapshot_id == snapshot_id:
                terminal = SnapshotState.Reaped if state == SnapshotState.ReapClaimed else state
                mutations.append(
                    Put("snapshot_alias", alias_key, dataclasses.replace(current, terminal_state=terminal))
                )
                if alias_predicate is None:
                    predicates.append(ValueEquals("snapshot_alias", alias_key, raw_alias))
    events = [] if kind is None else [wb.event(workbench, kind, ref.alias, snapshot_id.to_bytes(8, "big"), None)]
    return Built(predicates=predicates, mutations=mutations, events=events)


def retire(root, workbench_id: str, selector: int | str) -> int:
    snapshot_id, alias_predicate = _pin(root, workbench_id, selector)

    def build(view):
        _, workbench = wb.visible(view, root.root_id, workbench_id)
        _check_pin(view, alias_predicate)
        _, ref_key, raw, _ = _resolve(view, root, workbench, snapshot_id)
        built = _terminal(
            view,
            root,
            workbench,
            snapshot_id,
            ref_key,
            raw,
            alias_predicate,
            SnapshotState.Retired,
            ChangeEventKind.SnapshotRetired,
        )
        built.value = snapshot_id
        return built

    _, built = root.apply(build, digest=intent_digest("snapshot.retire", workbench_id, snapshot_id))
    return built.value


def reap(root, *, skew_grace_ms: int = DEFAULT_SKEW_GRACE_MS, now_ms: int | None = None) -> list[int]:
    """Claim every Active snapshot whose deadline plus the skew grace is behind the lease clock,
    and finish every reap a killed reaper left ReapClaimed. Returns the ids reaped.

    The lease clock is persisted and only moves forward: a wall clock that went backwards is
    ignored until it catches up, so it can never reap early (finishing a claimed reap needs no
    clock: the claim already released the hold).
    """
    observed = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    clock = root.shard.observe_lease_clock(observed)
    reaped = []
    with root.read() as view:
        workbenches = wb.list_visible(view, root.root_id)
    for workbench in workbenches:
        for snapshot in list_snapshots(root, workbench.workbench_id):
            ref = snapshot.ref
            try:
                if ref.state == SnapshotState.ReapClaimed:
                    _finish_reap(root, workbench, snapshot.snapshot_id)
                elif (
                    ref.state != SnapshotState.Active
                    or observed < clock
                    or ref.lease_deadline + skew_grace_ms > clock
                    or ref.consumer_count
                ):
                    continue  # live, terminal, or the wall clock regressed below the high water
                else:
                    _claim_reap(root, workbench, snapshot.snapshot_id)
                    crash_point("reap-after-claim")
                    _finish_reap(root, workbench, snapshot.snapshot_id)
            except (PredicateFailed, NotFound):
                continue  # renewed, retired, attached or finished concurrently: the CAS loser moves on
            reaped.append(snapshot.snapshot_id)
    return reaped


def _claim_reap(root, workbench: wb.Workbench, snapshot_id: int) -> None:
    """Active -> ReapClaimed, the hold released (and the alias's terminal state projected)."""
    ref_key = _ref_key(root, workbench.incarnation_id, snapshot_id)

    def claim(view):
        raw = view.get("snapshot_ref", ref_key)
        if raw is None:
            raise NotFound(f"snapshot {snapshot_id} vanished")
        ref = SnapshotRef.decode(raw)
        if ref.lease_deadline > root.shard.lease_clock_ms:
            raise PredicateFailed(f"snapshot {snapshot_id} was renewed")
        return _terminal(view, root, workbench, snapshot_id, ref_key, raw, None, SnapshotState.ReapClaimed, None)

    root.apply(claim, digest=intent_digest("snapshot.reap-claim", workbench.incarnation_id, snapshot_id))


def _finish_reap(root, workbench: wb.Workbench, snapshot_id: int) -> None:
    """ReapClaimed -> Reaped, with its SnapshotRetired event."""
    ref_key = _ref_key(root, workbench.incarnation_id, snapshot_id)

    def finish(view):
        raw = view.get("snapshot_ref", ref_key)
        ref = SnapshotRef.decode(raw)
        if ref.state != SnapshotState.ReapClaimed:
            raise PredicateFailed(f"snapshot {snapshot_id} is {ref.state.name}")
        return Built(
            predicates=[ValueEquals("snapshot_ref", ref_key, raw)],
            mutations=[Put("snapshot_ref", ref_key, dataclasses.replace(ref, state=SnapshotState.Reaped))],
            events=[
                wb.event(workbench, ChangeEventKind.SnapshotRetired, ref.alias, snapshot_id.to_bytes(8, "big"), None)
            ],
        )

    root.apply(finish, digest=intent_digest("snapshot.reap", workbench.incarnation_id, snapshot_id))


def view_at(view, root, snapshot: Snapshot):
    """The read view of a snapshot: MVCC at its held read version (the hold keeps it retained)."""
    if snapshot.ref.state != SnapshotState.Active:
        raise NotFound(f"snapshot {snapshot.snapshot_id} is {snapshot.ref.state.name}")
    return view.at(snapshot.ref.read_version)
