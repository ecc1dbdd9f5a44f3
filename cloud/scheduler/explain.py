"""Turning reason codes into one sentence a person can act on.

The machine-readable reasons (rejection counts per filter, quota state,
reservation, retry time) are built by the core; this module only words them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, Literal

from shared.clock import utc_from_epoch

from .filters import FilterName
from .model import KINDS, TrainingJob
from .plan import Deferral, HookFailure, HookKind, NeverFits, Reservation
from .quota import QuotaState
from .shape import WorkShape

# What preemption did for a job that still waits: switched off by the policy, found
# nothing the job may evict, or evicted tentatively and still could not place it.
PreemptionOutcome = Literal["off", "nothing-evictable", "tried"]

SLO_UNVERIFIABLE: Final = "latency SLO cannot be checked: no latency estimator configured"

_HOOK_LABELS: Final[Mapping[HookKind, str]] = {
    "score-term": "score term",
    "latency-estimator": "latency estimator",
    "start-advisor": "start advisor",
}
_DETAIL_CHARS: Final = 200  # of the error's text, so that the sentence stays one line
# Of a job array's placed tasks, named in its throttle's reason and waited for in its
# `waiting_for` (cloud/work/array_throttle.py): the same tasks.
SHOWN_TASKS: Final = 8


def _kinds(shape: WorkShape) -> str:
    return "/".join(KINDS[k].upper() for k in shape.kind_codes)


# Labels that do not depend on the work; the others are made by `filter_label`.
_FIXED_LABELS: Final[Mapping[FilterName, str]] = MappingProxyType(
    {
        "health": "not ready",
        "approval": "awaiting approval",
        "training": "runs no training",
        "runtime": "no container runtime",
        "sealing": "cannot receive sealed secrets",
        "model": "wrong accelerator model",
        "memory": "too little accelerator memory",
        "provider": "no accepted ONNX provider",
        "selector": "labels do not match",
        "taint": "untolerated taint",
        "window": "outside start window",
        "deadline": "would miss deadline",
        "slo-unverifiable": "latency SLO unverifiable",
        "latency-slo": "over latency SLO",
        "anti-affinity": "anti-affinity conflict",
        "replica-limit": "already hold a replica",
        "host-memory": "host memory full",
        "reserved": "reserved for an earlier job",
    }
)


def filter_label(name: FilterName, shape: WorkShape) -> str:
    # Every pending job's summary asks for a few labels: only those are made.
    fixed = _FIXED_LABELS.get(name)
    if fixed is not None:
        return fixed
    if name == "site":
        return "not " + "/".join(shape.work.sites)
    if name == "isolation":
        return _isolation_label(shape)
    if name == "kind":
        return f"no {_kinds(shape)}"
    if name == "count":
        return f"fewer than {shape.accelerators} {_kinds(shape)}"
    if name == "busy":
        return f"{_kinds(shape)} busy"
    if name == "cpus":
        return f"fewer than {shape.cpu_cores} CPU cores free"
    raise KeyError(name)


def _isolation_label(shape: WorkShape) -> str:
    """Work that asks for no isolation is refused only by nodes that cannot isolate."""
    need = shape.work.isolation if isinstance(shape.work, TrainingJob) else "none"
    return "cannot isolate work" if need == "none" else f"isolate work below {need}"


def summarise(counts: Mapping[FilterName, int], total: int, fitting: int, shape: WorkShape) -> str:
    """E.g. ``0/120 nodes fit: 80 no NPU, 40 over latency SLO``."""
    parts = ", ".join(f"{count} {filter_label(name, shape)}" for name, count in counts.items())
    head = f"{fitting}/{total} nodes fit"
    return f"{head}: {parts}" if parts else head


def utc(timestamp: float) -> str:
    return utc_from_epoch(timestamp).strftime("%Y-%m-%dT%H:%MZ")


def unschedulable(
    counts: Mapping[FilterName, int], summary: str, never: NeverFits | None = None
) -> str:
    if never is not None:
        return f"No node can run it: {never.reason}; {summary}."
    if counts.get("slo-unverifiable"):
        return f"No node can run it: {SLO_UNVERIFIABLE}; {summary}."
    return f"No node can run it: {summary}."


def window(shape: WorkShape, opens_at: float | None, summary: str) -> str:
    window = getattr(shape.work, "start_window", None)
    when = f" at {utc(opens_at)}" if opens_at is not None else ""
    return f"Deferred: start window {window} (node local time) opens{when}; {summary}."


def utc_minutes(timestamp: float) -> str:
    return utc_from_epoch(timestamp).strftime("%Y-%m-%d %H:%M UTC")


def deferred(deferral: Deferral, summary: str) -> str:
    """E.g. ``Deferred to 2023-06-02 02:00 UTC for 38% less CO2 (...); latest safe start ...``."""
    return (
        f"Deferred to {utc_minutes(deferral.start_at)} for {deferral.saving_fraction:.0%} less "
        f"{deferral.quantity} ({deferral.expected_then:,.0f} instead of "
        f"{deferral.expected_now:,.0f} {deferral.unit} now, best window in {deferral.zone}); "
        f"latest safe start {utc_minutes(deferral.latest_start)}; {summary}."
    )


def quota_reason(state: QuotaState | None, preemption: PreemptionOutcome) -> str:
    """Why quota stops the job, worded by how it was (not) admitted."""
    if state is None:
        return "Quota exhausted"
    # "MIG-1G.10GB" would read as a shout: a slice quota keeps its name.
    kind = state.kind.upper() if state.kind in KINDS else f"{state.kind} slices"
    if state.mode == "reclaim":
        # Within its own quota: the obstacle is what the cohort lent to others.
        lent = (
            "lent to other tenants and preemption is off, so it cannot be reclaimed"
            if preemption == "off"
            else "lent to non-preemptible work"
        )
        return (
            f"Waiting to reclaim: tenant {state.tenant} is within its quota (uses "
            f"{state.usage} {kind} of nominal {state.nominal}, asks for {state.requested} "
            f"more), but cohort {state.cohort} is full ({state.cohort_usage}/"
            f"{state.cohort_nominal}) and the cohort's capacity is {lent}"
        )
    limit = "unlimited" if state.borrowing_limit is None else str(state.borrowing_limit)
    cohort = (
        f", cohort {state.cohort} {state.cohort_usage}/{state.cohort_nominal}"
        if state.cohort is not None
        else ""
    )
    remedy = "preemption is off" if preemption == "off" else "nothing lower-priority to evict"
    return (
        f"Over quota: tenant {state.tenant} uses {state.usage} {kind} "
        f"(nominal {state.nominal}, borrowing limit {limit}{cohort}) and asks for "
        f"{state.requested} more; {remedy}"
    )


def quota(state: QuotaState | None, summary: str, preemption: PreemptionOutcome) -> str:
    return f"{quota_reason(state, preemption)}; {summary}."


def running_limit(tenant: str, running: int, limit: int) -> str:
    """E.g. ``Over quota: tenant acme runs 3 jobs and deployments, its max_running of 3;
    this waits until one of them ends.``"""
    items = "job or deployment" if running == 1 else "jobs and deployments"
    return (
        f"Over quota: tenant {tenant} runs {running} {items}, its max_running of {limit}; "
        "this waits until one of them ends."
    )


def array_throttle(array_id: str, throttle: int, placed: Sequence[int]) -> str:
    """E.g. ``Array 01J… places at most 2 of its tasks at once (%2): 2 placed (tasks 0,
    3); this task waits its turn.`` `placed`: the indices of its placed tasks, ascending
    (the first few are named). Said by the loop while the array is at its throttle
    (cloud/work/array_throttle.py) and by the core to a task its pass had no slot for."""
    shown = ", ".join(str(index) for index in placed[:SHOWN_TASKS])
    more = ", …" if len(placed) > SHOWN_TASKS else ""
    which = f" (tasks {shown}{more})" if placed else ""
    return (
        f"Array {array_id} places at most {throttle} of its tasks at once (%{throttle}): "
        f"{len(placed)} placed{which}; this task waits its turn."
    )


def _held(reservation: Reservation | None) -> str:
    if reservation is None:
        return "; no reservation"
    cores = f" and {sum(reservation.cpu_cores)} CPU cores" if reservation.cpu_cores else ""
    return (
        f"; reserved {sum(reservation.accelerators)} {reservation.accelerator_kind.upper()}"
        f"{cores} on {len(reservation.nodes)} node(s) from {utc(reservation.start_at)}"
    )


_EVICTION: Final[Mapping[PreemptionOutcome, str]] = {
    "off": "; preemption is off",
    "nothing-evictable": "; no lower-priority work to evict",
    "tried": "; evicting lower-priority work would not make room",
}


def capacity(
    shape: WorkShape,
    summary: str,
    fitting: int,
    members_fit: int,
    reservation: Reservation | None,
    preemption: PreemptionOutcome,
) -> str:
    noun = "workers" if shape.work_kind == "training" else "replicas"
    # Nodes that fit one member while the job waits: say that the whole job does not.
    gang = ""
    if fitting or (shape.members > 1 and members_fit > 0):
        limit = f" (at most {shape.max_per_node} per node)" if shape.max_per_node else ""
        gang = f"only {members_fit} of {shape.members} {noun} fit{limit}; "
    return f"Waiting for capacity: {gang}{summary}{_EVICTION[preemption]}{_held(reservation)}."


def reserved(summary: str, reservation: Reservation | None) -> str:
    return (
        f"Held back so an earlier job's reservation is not delayed: {summary}{_held(reservation)}."
    )


def partial(
    shape: WorkShape,
    placed: int,
    summary: str,
    state: QuotaState | None,
    preemption: PreemptionOutcome,
) -> str:
    why = f"{quota_reason(state, preemption)}; " if state is not None else ""
    return f"Placed {placed} of {shape.members} replicas; the rest wait: {why}{summary}."


def hook_failed(failure: HookFailure) -> str:
    """E.g. ``Not scheduled in this pass: score term 'carbon' failed for it (KeyError:
    'DE'); other work is unaffected ...``. One line, the error's text cut short."""
    detail = " ".join(failure.detail.split())
    if len(detail) > _DETAIL_CHARS:
        detail = detail[: _DETAIL_CHARS - 1] + "…"
    error = f"{failure.error}: {detail}" if detail else failure.error
    return (
        f"Not scheduled in this pass: {_HOOK_LABELS[failure.hook]} {failure.name!r} failed "
        f"for it ({error}); other work is unaffected and the next pass tries again."
    )
