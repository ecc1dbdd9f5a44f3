"""Explanations from a scheduling pass: what the scheduling loop stores with each plan.

`explanations_for_plan(plan)` makes one `Explanation` (cloud.work.explanation) per work
item the pass decided something about; the loop passes the result as
`cloud.store.PassWrite.explanations`, and `GET .../explain` shows the latest one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from cloud.green.migration import JobMove
from cloud.scheduler.plan import Pending, Placement, Plan, Preemption, Reservation, ScoreBreakdown
from cloud.work.convert import spec_field_name
from cloud.work.dependencies import Waiting
from cloud.work.explanation import (
    DeferralView,
    Explanation,
    MemberPlacementView,
    NodeScoreView,
    Outcome,
    PendingView,
    PreemptionView,
    QuotaView,
    ReservationView,
    TermScoreView,
    WaitingForView,
    encode_explanation,
    not_looked_at,
)
from shared.clock import utc_from_epoch
from shared.errors import json_path
from shared.work_literals import PriorityClass


def _score(breakdown: ScoreBreakdown) -> NodeScoreView:
    return NodeScoreView(
        node_id=breakdown.node_id,
        accelerator_kind=breakdown.accelerator_kind,
        total=round(breakdown.total, 6),
        terms=tuple(
            TermScoreView(name=term.name, value=round(term.value, 6), weight=term.weight)
            for term in breakdown.terms
        ),
    )


def _placement(placement: Placement) -> MemberPlacementView:
    return MemberPlacementView(
        member=placement.member,
        node_id=placement.node_id,
        accelerator_kind=placement.accelerator_kind,
        accelerators=placement.accelerators,
        provider=placement.provider,
        borrowed=placement.borrowed,
        start_at=utc_from_epoch(placement.start_at),
        expected_end=(
            None if placement.expected_end is None else utc_from_epoch(placement.expected_end)
        ),
        window_waived=placement.window_waived,
        chosen=_score(placement.chosen),
        runners_up=tuple(_score(runner) for runner in placement.runners_up),
    )


def _reservation(reservation: Reservation | None) -> ReservationView | None:
    if reservation is None:
        return None
    return ReservationView(
        start_at=utc_from_epoch(reservation.start_at),
        accelerator_kind=reservation.accelerator_kind,
        nodes=reservation.nodes,
        accelerators=reservation.accelerators,
    )


def _pending(pending: Pending) -> PendingView:
    quota = pending.quota
    deferral = pending.deferral
    never = pending.never_fits
    return PendingView(
        field=None if never is None else json_path((spec_field_name(never.field),)),
        code=pending.code,
        nodes_total=pending.nodes_total,
        fitting_nodes=pending.fitting_nodes,
        rejections=dict(pending.rejections),
        members_needed=pending.members_needed,
        members_placed=pending.members_placed,
        retry_at=None if pending.retry_at is None else utc_from_epoch(pending.retry_at),
        quota=None
        if quota is None
        else QuotaView(
            mode=quota.mode,
            kind=quota.kind,
            usage=quota.usage,
            requested=quota.requested,
            nominal=quota.nominal,
            borrowing_limit=quota.borrowing_limit,
            cohort=quota.cohort,
            cohort_usage=quota.cohort_usage,
            cohort_nominal=quota.cohort_nominal,
        ),
        reservation=_reservation(pending.reservation),
        deferral=None
        if deferral is None
        else DeferralView(
            start_at=utc_from_epoch(deferral.start_at),
            latest_start=utc_from_epoch(deferral.latest_start),
            zone=deferral.zone,
            saving_fraction=deferral.saving_fraction,
            expected_now=deferral.expected_now,
            expected_then=deferral.expected_then,
            quantity=deferral.quantity,
            unit=deferral.unit,
        ),
    )


def _placed_message(placements: Sequence[Placement]) -> str:
    nodes = ", ".join(f"{p.node_id} (score {p.chosen.total:.3f})" for p in placements)
    noun = "worker" if placements[0].work_kind == "training" else "replica"
    plural = "s" if len(placements) != 1 else ""
    if noun == "replica" and min(p.member for p in placements) > 0:
        # A deployment topped up (scaled up, or replacing lost replicas): the replicas
        # it already has keep serving; "Placed 1 replica" would read as its size.
        noun = "more replica"
    limits = sorted({p.power_limit_w for p in placements if p.power_limit_w is not None})
    capped = (
        f" Its GPUs are held to {'/'.join(f'{w:.0f}' for w in limits)} W for the run"
        " (power capping: less energy, a slower run; the expected end allows for it)."
        if limits
        else ""
    )
    # Flexible shapes: a job placed in one of its alternative shapes says which.
    reshaped = f", {placements[0].reshaped}" if placements[0].declared_shape is not None else ""
    return f"Placed {len(placements)} {noun}{plural} on {nodes}{reshaped}.{capped}"


def work_named(work_id: str, *, same_tenant: bool, priority: PriorityClass | None) -> str:
    """How a preemption names the work on its other side to a tenant: by its id within
    the tenant; across tenants (or where the other side is unknown) as "another tenant's
    p0 work", since a tenant learns nothing of another's work (cloud/api/scope.py: it is
    a 404, like work that does not exist) and the priority is what explains the
    preemption. The stored reason and the explanation are the same for every viewer,
    the admin included."""
    if same_tenant:
        return work_id
    return "another tenant's work" if priority is None else f"another tenant's {priority} work"


class WorkOwner(NamedTuple):
    """Whose a preemptor is, to tell a victim of another tenant's work from one of its own."""

    tenant: str  # as the scheduler names it (Placement.tenant, Preemption.tenant)
    priority: PriorityClass


def _same_tenant(preemption: Preemption, preemptor: WorkOwner | None) -> bool:
    return preemptor is not None and preemptor.tenant == preemption.tenant


def _victim_named(victim: Preemption, preemptor: WorkOwner | None) -> str:
    same = _same_tenant(victim, preemptor)
    return work_named(victim.work_id, same_tenant=same, priority=victim.priority)


def _preemptor_named(lost: Preemption, preemptor: WorkOwner | None) -> str:
    same = _same_tenant(lost, preemptor)
    priority = None if preemptor is None else preemptor.priority
    return work_named(lost.preempted_by, same_tenant=same, priority=priority)


def _victims_message(victims: Sequence[Preemption], preemptor: WorkOwner | None) -> str:
    """E.g. `` It preempted job-a on gpu-1 (priority).``: what made room for the work
    (another tenant's work by its priority, not its id: `work_named`)."""
    if not victims:
        return ""
    by_work: dict[str, list[Preemption]] = {}
    for victim in victims:
        by_work.setdefault(_victim_named(victim, preemptor), []).append(victim)
    each = ", ".join(
        f"{named} on {', '.join(sorted({v.node_id for v in lost}))} "
        f"({', '.join(sorted({v.reason for v in lost}))})"
        for named, lost in sorted(by_work.items())
    )
    return f" It preempted {each}."


def _lost_view(lost: Preemption, preemptor: WorkOwner | None) -> PreemptionView:
    """What the work lost, in its own explanation."""
    same = _same_tenant(lost, preemptor)
    return PreemptionView(
        node_id=lost.node_id,
        reason=lost.reason,
        preempted_by=lost.preempted_by if same else None,
        another_tenant=not same,
    )


def _victim_view(victim: Preemption, preemptor: WorkOwner | None) -> PreemptionView:
    """What the work evicted, in the preemptor's explanation."""
    same = _same_tenant(victim, preemptor)
    return PreemptionView(
        node_id=victim.node_id,
        reason=victim.reason,
        preempted_by=victim.preempted_by,
        work_id=victim.work_id if same else None,
        another_tenant=not same,
    )


def explain_work(
    now: float,
    placements: Sequence[Placement],
    pending: Pending | None,
    preemptions: Sequence[Preemption] = (),
    victims: Sequence[Preemption] = (),
    owners: Mapping[str, WorkOwner] = MappingProxyType({}),
) -> Explanation | None:
    """The explanation of one work item's part of a pass; None when nothing was decided.
    `preemptions`: what the work lost; `victims`: what it evicted to make room (the
    preemptor lists them, e.g. ``It preempted job-a on gpu-1 (priority).``); `owners`:
    the tenant and priority of each work id the pass placed (every preemptor), which
    decide whether the other side of a preemption is named by its id (`work_named`)."""
    decided_at = utc_from_epoch(now)
    members = tuple(_placement(p) for p in sorted(placements, key=lambda p: p.member))
    # Every victim names this work as its preemptor.
    this_work = owners.get(victims[0].preempted_by) if victims else None
    evicted = tuple(_lost_view(p, owners.get(p.preempted_by)) for p in preemptions) + tuple(
        _victim_view(p, this_work)
        for p in sorted(victims, key=lambda p: (p.work_id, p.node_id, p.allocation_id))
    )
    if pending is not None:
        outcome: Outcome = "partial" if placements else "pending"
        return Explanation(
            outcome=outcome,
            message=pending.message + _victims_message(victims, this_work),
            decided_at=decided_at,
            placements=members,
            pending=_pending(pending),
            preemptions=evicted,
        )
    if placements:
        return Explanation(
            outcome="placed",
            message=_placed_message(placements) + _victims_message(victims, this_work),
            decided_at=decided_at,
            placements=members,
            preemptions=evicted,
        )
    if preemptions:
        by = ", ".join(
            sorted({_preemptor_named(p, owners.get(p.preempted_by)) for p in preemptions})
        )
        reasons = ", ".join(sorted({p.reason for p in preemptions}))
        return Explanation(
            outcome="preempted",
            message=f"Preempted ({reasons}) to make room for {by}.",
            decided_at=decided_at,
            preemptions=evicted,
        )
    return None


def explanations_for_plan(plan: Plan, work_ids: Collection[str] | None = None) -> dict[str, bytes]:
    """Work id -> encoded `Explanation` for every work item the pass decided about (or
    only those in `work_ids`): what the scheduling loop passes as
    `cloud.store.PassWrite.explanations`."""
    placements: dict[str, list[Placement]] = {}
    for placement in plan.placements:
        placements.setdefault(placement.work_id, []).append(placement)
    preemptions: dict[str, list[Preemption]] = {}
    victims: dict[str, list[Preemption]] = {}  # by the work that needed the room
    for preemption in plan.preemptions:
        preemptions.setdefault(preemption.work_id, []).append(preemption)
        victims.setdefault(preemption.preempted_by, []).append(preemption)
    pending = {item.work_id: item for item in plan.pending}
    # Every preemptor is placed in the pass that evicts for it.
    owners = {p.work_id: WorkOwner(p.tenant, p.priority) for p in plan.placements}
    documents: dict[str, bytes] = {}
    decided = {*placements, *preemptions, *pending}
    for work_id in decided if work_ids is None else decided.intersection(work_ids):
        explanation = explain_work(
            plan.now,
            placements.get(work_id, ()),
            pending.get(work_id),
            preemptions.get(work_id, ()),
            victims.get(work_id, ()),
            owners,
        )
        if explanation is not None:
            documents[work_id] = encode_explanation(explanation)
    return documents


def explanation_for_waiting(now: float, waiting: Waiting) -> bytes:
    """The encoded `Explanation` of pending work waiting for its dependencies (code
    `dependency`): the scheduler did not look at it."""
    waiting_for = tuple(
        WaitingForView(job=d.job_id, condition=d.condition, job_state=d.job_state)
        for d in waiting.waiting_for
    )
    return encode_explanation(
        not_looked_at("dependency", waiting.message, utc_from_epoch(now), waiting_for=waiting_for)
    )


def explanation_for_scaling(now: float, nodes: Sequence[str]) -> bytes:
    """The encoded `Explanation` of a deployment that gave back replicas (a scale-down,
    or replicas moved off a drained node): its explanation must not keep saying how
    many it placed before. `nodes`: the node of each replica it keeps."""
    count = len(nodes)
    plural = "s" if count != 1 else ""
    where = ", ".join(sorted(set(nodes))) or "no node"
    return encode_explanation(
        Explanation(
            outcome="placed",
            message=f"Scaled to {count} replica{plural}: kept on {where}.",
            decided_at=utc_from_epoch(now),
        )
    )


def explanations_for_moves(now: float, moves: Sequence[JobMove]) -> dict[str, bytes]:
    """Work id -> encoded `Explanation` (outcome "moved") for each migrated job."""
    return {
        move.work_id: encode_explanation(
            Explanation(
                outcome="moved",
                message=move.explain(),
                decided_at=utc_from_epoch(now),
                placements=tuple(
                    _placement(p) for p in sorted(move.placements, key=lambda p: p.member)
                ),
            )
        )
        for move in moves
    }
