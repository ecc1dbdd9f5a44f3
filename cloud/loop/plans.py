"""The scheduler core's plan -> the store's plan.

The core decides counts ("2 GPUs on node a"); the store records which devices
(`pick_devices`), whole sets of allocations per work item, and requeues:

- a preempted training job is requeued whole (a gang never runs short);
- a deployment that loses replicas to preemption keeps the others, and the lost
  ones are queued again by the next pass;
- a deployment topped up with more replicas keeps the ones it has;
- a migrated training job (moves.py) is evicted and placed again in the same
  transaction: the store applies evictions first, so it goes straight back to
  `scheduled` on its new nodes with the next attempt number;
- pending work ends: failed when its spec can no longer be read or its deadline can
  no longer be met on any registered node (unless its spec says `on_deadline_missed:
  keep`), cancelled when a dependency can no longer hold; work waiting for its
  dependencies gets their sentence as its pending reason; a preempted job keeps
  "preempted by X (reason)" as its reason until it is placed again (X: the preemptor's
  id, or "another tenant's p0 work" where it is another tenant's).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
import structlog

from cloud.green.migration import JobMove
from cloud.loop.allocations import as_new_allocation
from cloud.loop.devices import NotEnoughDevices, pick_devices
from cloud.loop.inputs import PassInputs
from cloud.scheduler import Placement, Plan, Preemption
from cloud.store import (
    EvictionWrite,
    NewAllocation,
    PassWrite,
    PlacementWrite,
    StateWrite,
    WorkRecord,
)
from cloud.work.convert import spec_of
from cloud.work.explain import explanations_for_moves, work_named
from cloud.work.specs import TrainingJobSpec
from shared.work_literals import WorkState

_log = structlog.get_logger("greenfed.loop")
# How a preempted job's state reason begins: it keeps it until it is placed again.
PREEMPTED_BY = "preempted by "


@dataclass(frozen=True, slots=True)
class Translation:
    write: PassWrite
    placed: int  # work items that got allocations
    evicted: int  # work items that lost allocations to preemption
    moves: tuple[JobMove, ...]  # the moves made (a move whose devices ran out is not)
    skipped: Mapping[str, str]  # work id -> why its placement was dropped

    @property
    def changes_work(self) -> bool:
        write = self.write
        return bool(write.placements or write.evictions or write.state_changes)


def _preempted(
    preemptions: tuple[Preemption, ...], inputs: PassInputs
) -> tuple[list[EvictionWrite], dict[str, list[NewAllocation]], set[str]]:
    """Evictions, the replicas each shrunk deployment keeps, and the allocation ids
    whose devices are free from now on."""
    by_work: dict[str, list[Preemption]] = {}
    for preemption in preemptions:
        by_work.setdefault(preemption.work_id, []).append(preemption)
    evictions: list[EvictionWrite] = []
    kept: dict[str, list[NewAllocation]] = {}
    freed: set[str] = set()
    for work_id, victims in sorted(by_work.items()):
        record = inputs.records[work_id]
        members = inputs.allocations.get(work_id, ())
        victim_ids = {victim.allocation_id for victim in victims}
        by = ", ".join(
            sorted({_preemptor_named(victim.preempted_by, record, inputs) for victim in victims})
        )
        why = ", ".join(sorted({victim.reason for victim in victims}))
        reason = f"{PREEMPTED_BY}{by} ({why})"
        remaining = [m for m in members if m.allocation_id not in victim_ids]
        if record.kind == "training" or not remaining:
            evictions.append(
                EvictionWrite(work_id=work_id, reason=reason, expected_version=record.version)
            )
            freed.update(m.allocation_id for m in members)
        else:
            kept[work_id] = [as_new_allocation(m) for m in remaining]
            freed.update(victim_ids)
    return evictions, kept, freed


def _preemptor_named(preempted_by: str, victim: WorkRecord, inputs: PassInputs) -> str:
    """The preemptor as the victim's reason names it: by its id within the tenant, as
    "another tenant's p0 work" across tenants (a tenant learns nothing of another's
    work; the reason is shown to the victim's tenant and goes out in its events)."""
    preemptor = inputs.records.get(preempted_by)
    return work_named(
        preempted_by,
        same_tenant=preemptor is not None and preemptor.tenant_id == victim.tenant_id,
        priority=None if preemptor is None else preemptor.priority,
    )


def _missed_deadlines(plan: Plan, inputs: PassInputs) -> dict[str, str]:
    """Pending jobs whose deadline no registered node could meet any more (the core's
    `NeverFits` on `deadline`), to fail unless their spec says `on_deadline_missed:
    keep`: they would wait for ever."""
    missed: dict[str, str] = {}
    for pending in plan.pending:
        never = pending.never_fits
        record = inputs.records.get(pending.work_id)
        if never is None or never.field != "deadline" or record is None:
            continue
        if record.state != "pending" or record.kind != "training":
            continue
        spec = spec_of(record)  # readable: the scheduler got it from this record
        if isinstance(spec, TrainingJobSpec) and spec.on_deadline_missed == "fail":
            missed[pending.work_id] = f"deadline missed: {never.reason}"
    return missed


def translate(
    plan: Plan,
    inputs: PassInputs,
    explanations: Mapping[str, bytes],
    moves: Sequence[JobMove] = (),
) -> Translation:
    evictions, kept, freed = _preempted(plan.preemptions, inputs)
    by_preempted = {preemption.work_id for preemption in plan.preemptions}
    moved = {move.work_id: move for move in moves}
    held: dict[str, set[str]] = {}
    for allocation in inputs.store.allocations:
        if allocation.allocation_id not in freed:
            held.setdefault(allocation.node_id, set()).update(allocation.accelerator_ids)
    # A moving job keeps its devices until its own new ones are picked: the pass's
    # other placements never get them, and a move that cannot be made leaves it as is.
    own: dict[str, dict[str, set[str]]] = {}
    for move in moves:
        for held_now in inputs.allocations.get(move.work_id, ()):
            own.setdefault(move.work_id, {}).setdefault(held_now.node_id, set()).update(
                held_now.accelerator_ids
            )

    by_work: dict[str, list[Placement]] = {}
    for placement in plan.placements:
        by_work.setdefault(placement.work_id, []).append(placement)
    for move in moves:
        by_work[move.work_id] = list(move.placements)
    placements: list[PlacementWrite] = []
    skipped: dict[str, str] = {}
    made: list[JobMove] = []
    # Moves get their devices after the queue's placements, in work id order each.
    for work_id, members in sorted(by_work.items(), key=lambda item: (item[0] in moved, item[0])):
        record = inputs.records[work_id]
        mine = own.get(work_id, {})
        picked: dict[str, set[str]] = {}
        new: list[NewAllocation] = []
        try:
            for member in sorted(members, key=lambda m: m.member):
                node = inputs.nodes[member.node_id]
                taken = (
                    held.get(member.node_id, set()) - mine.get(member.node_id, set())
                ) | picked.get(member.node_id, set())
                ids = pick_devices(
                    node.status.accelerators,
                    member.accelerator_kind,
                    member.accelerators,
                    taken,
                    member.accelerator_model,
                )
                picked.setdefault(member.node_id, set()).update(ids)
                new.append(
                    NewAllocation(
                        member_index=member.member,
                        node_id=member.node_id,
                        accelerator_kind=member.accelerator_kind,
                        accelerators=member.accelerators,
                        accelerator_ids=ids,
                        host_memory_bytes=member.host_memory_bytes,
                        expected_end=member.expected_end,
                        borrowed=member.borrowed,
                        power_limit_w=member.power_limit_w,
                        cpu_cores=member.cpu_cores,
                    )
                )
        except NotEnoughDevices as error:
            # The registry's inventory and the store disagree (a node re-registered with
            # fewer devices): leave the work queued rather than double-book a device.
            skipped[work_id] = f"{member.node_id}: {error}"
            _log.warning(
                "placement dropped", work_id=work_id, node_id=member.node_id, error=str(error)
            )
            continue
        for node_id, node_ids in mine.items():
            held[node_id] -= node_ids
        for node_id, node_ids in picked.items():
            held.setdefault(node_id, set()).update(node_ids)
        if record.kind == "inference" and record.state != "pending":
            existing = kept.pop(work_id, None)
            if existing is None:
                existing = [
                    as_new_allocation(m)
                    for m in inputs.allocations.get(work_id, ())
                    if m.allocation_id not in freed
                ]
            new = existing + _numbered_past(new, {a.member_index for a in existing})
        nodes = ", ".join(dict.fromkeys(member.node_id for member in members))
        reason = f"placed on {nodes}"
        moving = moved.get(work_id)
        if moving is not None:
            reason = moving.explain()
            made.append(moving)
            evictions.append(
                EvictionWrite(work_id=work_id, reason=reason, expected_version=record.version)
            )
        placements.append(
            PlacementWrite(
                work_id=work_id,
                allocations=tuple(new),
                reason=reason,
                expected_version=record.version,
            )
        )
    for work_id, remaining in sorted(kept.items()):
        record = inputs.records[work_id]
        placements.append(
            PlacementWrite(
                work_id=work_id,
                allocations=tuple(remaining),
                reason="replicas preempted; the rest keep serving",
                expected_version=record.version,
            )
        )

    failing = {
        **_missed_deadlines(plan, inputs),
        **{
            work_id: reason
            for work_id, reason in inputs.unschedulable.items()
            # Placed work too when its spec cannot be read at all: no node can be told
            # about it. Placed work a stricter scheduler would refuse keeps running.
            if inputs.records[work_id].state == "pending" or not _readable(inputs.records[work_id])
        },
    }
    ending: list[tuple[str, WorkState, str]] = [
        (work_id, "failed", reason) for work_id, reason in sorted(failing.items())
    ]
    ending.extend(
        (work_id, "cancelled", reason)
        for work_id, reason in sorted(inputs.dependencies.cancelled.items())
        if work_id not in failing and work_id in inputs.records
    )
    state_changes = [
        StateWrite(
            work_id=work_id,
            to_state=to_state,
            reason=reason,
            expected_version=inputs.records[work_id].version,
        )
        for work_id, to_state, reason in ending
    ]
    # Only what changed: an unchanged reason is not worth a write on every tick.
    # A victim of preemption keeps "preempted by X (reason)": why it waits is in its
    # explanation, and the pending sentence would hide why it stopped.
    pending_reasons = {
        pending.work_id: pending.message
        for pending in plan.pending
        if pending.work_id not in by_work
        and pending.work_id not in failing
        and inputs.records[pending.work_id].state == "pending"
        and inputs.records[pending.work_id].state_reason != pending.message
        and not (inputs.records[pending.work_id].state_reason or "").startswith(PREEMPTED_BY)
    }
    pending_reasons.update(
        (work_id, waiting.message)
        for work_id, waiting in inputs.dependencies.waiting.items()
        if work_id in inputs.records and inputs.records[work_id].state_reason != waiting.message
    )
    return Translation(
        write=PassWrite(
            placements=tuple(placements),
            evictions=tuple(evictions),
            state_changes=tuple(state_changes),
            pending_reasons=pending_reasons,
            explanations={**explanations, **explanations_for_moves(plan.now, made)},
        ),
        placed=len(set(by_work) - set(moved)) - len(set(skipped) - set(moved)),
        evicted=len(by_preempted),
        moves=tuple(made),
        skipped=skipped,
    )


def _numbered_past(new: list[NewAllocation], taken: set[int]) -> list[NewAllocation]:
    """A deployment's new replicas, each with a number no kept replica has. The core
    numbers them after the replicas it sees, and it does not see one on a node the
    registry does not know (after a restart, or once forgotten: build_inputs leaves it
    out), which still holds its number until that node is declared lost."""
    numbered = []
    used = set(taken)
    for allocation in new:
        if allocation.member_index in used:
            free = next(index for index in itertools.count() if index not in used)
            allocation = dataclasses.replace(allocation, member_index=free)
        used.add(allocation.member_index)
        numbered.append(allocation)
    return numbered


def _readable(record: WorkRecord) -> bool:
    try:
        spec_of(record)
    except (msgspec.DecodeError, ValueError):
        return False
    return True
