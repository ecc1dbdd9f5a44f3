"""greenfed scheduler core: a pure, deterministic, vectorised placement engine.

``schedule(snapshot, policy) -> Plan``. No I/O, no asyncio, no wall clock: the
control plane, the tests and the simulator all drive this same code.

Where things are decided:

==================  ==========================================================
model.py            what work, tenants, allocations and constraints are
snapshot.py         the immutable, columnar view of the nodes
policy.py           weights, thresholds and switches
extensions.py       ScoreTerm, LatencyEstimator, StartAdvisor, CapacityValue; hook errors
shape.py            what one worker/replica needs, and cache keys
state.py            the working copy updated placement by placement
statement.py        tentative changes that commit or roll back as one unit
queue_order.py      which job goes next (priority, DRF share, submission)
fair_share.py       shares with decayed past usage, level by level in the tree
quota.py            whether a tenant may take more (nominal, borrow, reclaim)
array_cap.py        how many of a job array's tasks a pass may place (its throttle)
hierarchy.py        the cohort tree: borrowing and lending limits at every level
filters.py          which nodes are feasible, and why the others are not
windows.py          start-time windows in node local time
scoring.py          how feasible nodes are ranked (packing, load, speed, ...)
candidates.py       cached, incrementally re-scored candidate sets (speed)
gang.py             choosing nodes for gang workers and replicas
preemption.py       which running work to evict
backfill.py         reservations for blocked jobs; what may backfill
explain.py          reasons worded for people
plan.py             the output
core.py             schedule(): the pass, job by job
harness.py          simulated time driving the core (tests, simulator)
==================  ==========================================================
"""

from .array_cap import ArrayCap
from .core import Scheduler, schedule
from .extensions import (
    Booking,
    Candidates,
    CapacityValue,
    LatencyEstimator,
    ScoreTerm,
    StartAdvisor,
    StartCandidates,
    TermValues,
)
from .hierarchy import Cohort, CohortTreeError
from .model import (
    KINDS,
    Allocation,
    GangShape,
    InferenceDeployment,
    LabelRequirement,
    StartWindow,
    Taint,
    Tenant,
    Toleration,
    TrainingJob,
    Work,
)
from .plan import (
    Deferral,
    HookFailure,
    Pending,
    PendingCode,
    Placement,
    Plan,
    Preemption,
    Reservation,
    ScoreBreakdown,
    TermScore,
)
from .policy import DEFAULT_POLICY, Policy
from .quota import QuotaState
from .snapshot import AcceleratorPool, Node, NodeTableCache, Snapshot

__all__ = [
    "DEFAULT_POLICY",
    "KINDS",
    "AcceleratorPool",
    "Allocation",
    "ArrayCap",
    "Booking",
    "Candidates",
    "CapacityValue",
    "Cohort",
    "CohortTreeError",
    "Deferral",
    "GangShape",
    "HookFailure",
    "InferenceDeployment",
    "LabelRequirement",
    "LatencyEstimator",
    "Node",
    "NodeTableCache",
    "Pending",
    "PendingCode",
    "Placement",
    "Plan",
    "Policy",
    "Preemption",
    "QuotaState",
    "Reservation",
    "Scheduler",
    "ScoreBreakdown",
    "ScoreTerm",
    "Snapshot",
    "StartAdvisor",
    "StartCandidates",
    "StartWindow",
    "Taint",
    "Tenant",
    "TermScore",
    "TermValues",
    "Toleration",
    "TrainingJob",
    "Work",
    "schedule",
]
