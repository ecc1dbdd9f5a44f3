"""Turning reason codes into one sentence a person can act on.

The machine-readable reasons (rejection counts per filter, quota state,
reservation, retry time) are built by the core; this module only words them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from .filters import FilterName
from .model import KINDS
from .plan import Reservation
from .quota import QuotaState
from .shape import WorkShape


def _kinds(shape: WorkShape) -> str:
    return "/".join(KINDS[k].upper() for k in shape.kind_codes)


def filter_label(name: FilterName, shape: WorkShape) -> str:
    kinds = _kinds(shape)
    work = shape.work
    labels: dict[FilterName, str] = {
        "health": "not ready",
        "site": "not " + "/".join(work.sites),
        "kind": f"no {kinds}",
        "count": f"fewer than {shape.accelerators} {kinds}",
        "model": "wrong accelerator model",
        "memory": "too little accelerator memory",
        "provider": "no accepted ONNX provider",
        "selector": "labels do not match",
        "taint": "untolerated taint",
        "window": "outside start window",
        "deadline": "would miss deadline",
        "latency-slo": "over latency SLO",
        "anti-affinity": "anti-affinity conflict",
        "replica-limit": "already hold a replica",
        "busy": f"{kinds} busy",
        "host-memory": "host memory full",
        "reserved": "reserved for an earlier job",
    }
    return labels[name]


def summarise(counts: Mapping[FilterName, int], total: int, fitting: int, shape: WorkShape) -> str:
    """E.g. ``0/120 nodes fit: 80 no NPU, 40 over latency SLO``."""
    parts = ", ".join(f"{count} {filter_label(name, shape)}" for name, count in counts.items())
    head = f"{fitting}/{total} nodes fit"
    return f"{head}: {parts}" if parts else head


def utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%MZ")


def unschedulable(summary: str) -> str:
    return f"No node can run it: {summary}."


def window(shape: WorkShape, opens_at: float | None, summary: str) -> str:
    window = getattr(shape.work, "start_window", None)
    when = f" at {utc(opens_at)}" if opens_at is not None else ""
    return f"Deferred: start window {window} (node local time) opens{when}; {summary}."


def quota(state: QuotaState | None, summary: str) -> str:
    if state is None:
        return f"Quota exhausted; {summary}."
    limit = "unlimited" if state.borrowing_limit is None else str(state.borrowing_limit)
    cohort = (
        f", cohort {state.cohort} {state.cohort_usage}/{state.cohort_nominal}"
        if state.cohort is not None
        else ""
    )
    return (
        f"Over quota: tenant {state.tenant} uses {state.usage} {state.kind.upper()} "
        f"(nominal {state.nominal}, borrowing limit {limit}{cohort}) and asks for "
        f"{state.requested} more; nothing lower-priority to evict."
    )


def _held(reservation: Reservation | None) -> str:
    if reservation is None:
        return "; no reservation"
    return (
        f"; reserved {sum(reservation.accelerators)} {reservation.accelerator_kind.upper()} "
        f"on {len(reservation.nodes)} node(s) from {utc(reservation.start_at)}"
    )


def capacity(
    shape: WorkShape,
    summary: str,
    members_fit: int,
    reservation: Reservation | None,
    preempted_nothing: bool,
) -> str:
    noun = "workers" if shape.work_kind == "training" else "replicas"
    gang = (
        f"only {members_fit} of {shape.members} {noun} fit; "
        if shape.members > 1 and members_fit > 0
        else ""
    )
    evict = "; no lower-priority work to evict" if preempted_nothing else ""
    return f"Waiting for capacity: {gang}{summary}{evict}{_held(reservation)}."


def reserved(summary: str, reservation: Reservation | None) -> str:
    return (
        f"Held back so an earlier job's reservation is not delayed: {summary}{_held(reservation)}."
    )


def partial(shape: WorkShape, placed: int, summary: str) -> str:
    return f"Placed {placed} of {shape.members} replicas; the rest wait: {summary}."
