"""The scheduler's explanation of a work item: the stored document and what
`GET .../explain` shows (`cloud.work.explain` builds it from a scheduling pass).

Why work waits (reason code, nodes rejected per filter, quota position, reservation,
deferral), or where it was placed and why there (the score breakdown of the chosen
node and of the runners-up). Fields are only ever added, with defaults, so that
stored explanations stay readable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

import msgspec

from shared.messages import AcceleratorKind
from shared.work_literals import DependencyCondition, WorkState

Outcome = Literal["placed", "partial", "pending", "preempted", "moved"]


class TermScoreView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    value: float  # normalised, 0..1
    weight: float


class NodeScoreView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    accelerator_kind: AcceleratorKind
    total: float  # sum of weight x value over the terms
    terms: tuple[TermScoreView, ...]


class MemberPlacementView(msgspec.Struct, frozen=True, kw_only=True):
    member: int  # worker rank or replica number
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    provider: str | None = None  # ONNX Runtime execution provider (deployments)
    borrowed: bool = False  # admitted on capacity borrowed from the tenant's cohort
    start_at: datetime
    expected_end: datetime | None = None
    window_waived: bool = False  # the start window was waived to meet the deadline
    chosen: NodeScoreView
    runners_up: tuple[NodeScoreView, ...] = ()


class QuotaView(msgspec.Struct, frozen=True, kw_only=True):
    mode: str  # "denied" (over quota) or "reclaim" (within quota, the cohort lent it out)
    kind: str  # gpu, npu, cpu, or a MIG slice quota such as mig-1g.10gb
    usage: int
    requested: int
    nominal: int
    borrowing_limit: int | None
    cohort: str | None
    cohort_usage: int
    cohort_nominal: int


class ReservationView(msgspec.Struct, frozen=True, kw_only=True):
    start_at: datetime
    accelerator_kind: AcceleratorKind
    nodes: tuple[str, ...]
    accelerators: tuple[int, ...]  # per node


class DeferralView(msgspec.Struct, frozen=True, kw_only=True):
    start_at: datetime
    latest_start: datetime
    zone: str
    saving_fraction: float
    expected_now: float
    expected_then: float
    quantity: str
    unit: str


class WaitingForView(msgspec.Struct, frozen=True, kw_only=True):
    """A dependency that does not hold yet (pending code `dependency`)."""

    job: str  # the job's id
    condition: DependencyCondition
    job_state: WorkState  # as the scheduler last saw it


class PendingView(msgspec.Struct, frozen=True, kw_only=True):
    # unschedulable, window, deferred, quota, capacity, reserved, partial, hook-failed,
    # dependency
    code: str
    nodes_total: int
    fitting_nodes: int
    rejections: dict[str, int]  # nodes rejected per filter, in filter-chain order
    members_needed: int
    members_placed: int
    retry_at: datetime | None = None
    quota: QuotaView | None = None
    reservation: ReservationView | None = None
    deferral: DeferralView | None = None
    # unschedulable, where no node of the fleet could ever run it: the spec's field at
    # fault, e.g. "$.accelerators_per_worker" (the message says why)
    field: str | None = None
    waiting_for: tuple[WaitingForView, ...] = ()  # dependency: what it waits for


class PreemptionView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str  # priority, reclaim, quota, deadline
    # The work id that needed the room; None in a victim's own explanation where that
    # was another tenant's work (a tenant learns nothing of another's work).
    preempted_by: str | None
    # The work evicted: set in the preemptor's explanation, which lists its victims
    # (a victim's own lists what it lost, with `preempted_by`); None there too where
    # the victim was another tenant's.
    work_id: str | None = None
    # The other side (the victim in a preemptor's list, the preemptor in a victim's)
    # is another tenant's work: its id is left out, the message gives its priority.
    another_tenant: bool = False


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """One scheduling decision about one work item."""

    outcome: Outcome
    message: str  # one line for a person
    decided_at: datetime
    placements: tuple[MemberPlacementView, ...] = ()
    pending: PendingView | None = None
    preemptions: tuple[PreemptionView, ...] = ()


def not_looked_at(
    code: str,
    message: str,
    decided_at: datetime,
    *,
    retry_at: datetime | None = None,
    waiting_for: tuple[WaitingForView, ...] = (),
) -> Explanation:
    """Why pending work waits where the scheduler did not look at it (its dependencies,
    its retry backoff): no node counted, no member needed or placed."""
    return Explanation(
        outcome="pending",
        message=message,
        decided_at=decided_at,
        pending=PendingView(
            code=code,
            nodes_total=0,
            fitting_nodes=0,
            rejections={},
            members_needed=0,
            members_placed=0,
            retry_at=retry_at,
            waiting_for=waiting_for,
        ),
    )


EXPLANATION_DECODER: Final = msgspec.json.Decoder(Explanation)
EXPLANATION_ENCODER: Final = msgspec.json.Encoder()


def encode_explanation(explanation: Explanation) -> bytes:
    return EXPLANATION_ENCODER.encode(explanation)


def decode_explanation(document: bytes) -> Explanation:
    return EXPLANATION_DECODER.decode(document)
