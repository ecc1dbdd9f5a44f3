"""Whether a gang may mix speed classes: only when waiting for one class would not
finish it sooner.

A gang steps in lockstep, so it runs at its slowest member's pace: eight H100s with
one V100 finish when eight V100s would. The core (core.py) therefore never keeps a
placement that mixes classes when a placement on one class that finishes no later
fits now (gang.speed_classes; on the preemption path counting what could be
evicted). When none fits now, the mixed placement is taken only if it finishes
before the earliest single-class placement would, estimated from running work's
expected ends:

    mixed finish   = now + run time on the slowest class in the placement
    single finish  = min over faster classes c of (t_c + run time on c)

where ``t_c`` is the first time enough members fit on c's candidates (in the gang's
topology domain, if it keeps to one) as running allocations end. Work with no
expected end (a deployment) never frees its devices in this estimate; quota, host
memory and reservations are left out, as in ``gang.speed_classes``: it is an
estimate of when to stop waiting, not a promise. A refused mix leaves the gang
pending for capacity, its explanation saying which class it waits for
(``speed_class_note``). A kept mix has every member's expected end the gang's (the
slowest member's): that is when a fast member's accelerators free, for reservations
and deadline rescues alike (``Scheduler._at_gang_pace``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gang import JobContext

# Run times closer than this are one class (they came from end times: now + t - now).
_SAME_S = 1e-6


@dataclass(frozen=True, slots=True)
class SingleClassWait:
    """The earliest single-class placement: when it could start and its run time."""

    model: str
    start_at: float
    runtime_s: float

    @property
    def finish_at(self) -> float:
        return self.start_at + self.runtime_s


def earliest_single_class(job: JobContext, mixed_runtime_s: float) -> SingleClassWait | None:
    """The single-class placement of the whole gang that would finish first, among
    classes faster than ``mixed_runtime_s`` (the mixed placement's pace); None where no
    such class could ever hold it from running work's expected ends."""
    state = job.state
    shape = job.shape
    nodes_table = state.snapshot.nodes
    need = shape.accelerators
    cap = shape.max_per_node
    best: SingleClassWait | None = None

    def members(available: int) -> int:
        count = max(available, 0) // need
        return count if cap is None else min(count, cap)

    for option in job.options:
        k = option.k
        runtime = option.runtime_s
        candidates = option.cand.nodes
        for runtime_s in np.unique(runtime[runtime < mixed_runtime_s - _SAME_S]).tolist():
            class_nodes = candidates[runtime == runtime_s]
            if job.within is not None:
                class_nodes = class_nodes[job.within[class_nodes]]
            if class_nodes.size == 0:
                continue
            available = {node: state.free[k].item(node) for node in class_nodes.tolist()}
            total = sum(members(free) for free in available.values())
            start_at: float | None = state.now if total >= shape.members else None
            if start_at is None:
                ends = sorted(
                    (alloc.expected_end, node, alloc.accelerators)
                    for node in available
                    for alloc in state.node_allocs.get(node, {}).values()
                    if alloc.expected_end is not None
                    and nodes_table.column_of(node, alloc.accelerator_kind, alloc.accelerator_model)
                    == k
                )
                for end, node, accelerators in ends:
                    before = members(available[node])
                    available[node] += accelerators
                    total += members(available[node]) - before
                    if total >= shape.members:
                        start_at = max(end, state.now)
                        break
            if start_at is None:
                continue
            model = nodes_table.model_at(k, class_nodes.item(0)) or nodes_table.kinds[k].kind
            found = SingleClassWait(model, start_at, float(runtime_s))
            if best is None or found.finish_at < best.finish_at:
                best = found
    return best


def speed_class_note(wait: SingleClassWait, mixed_runtime_s: float, now: float) -> str:
    """Why a gang waits: "waiting for one speed class: all workers on H100 would finish
    in 0.6 h (starting in 0.2 h), sooner than a mixed placement at its slowest member's
    pace (2.2 h)"."""
    return (
        f"waiting for one speed class: all workers on {wait.model} would finish in "
        f"{_hours(wait.finish_at - now)} (starting in {_hours(wait.start_at - now)}), "
        f"sooner than a mixed placement at its slowest member's pace ({_hours(mixed_runtime_s)})"
    )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 360 else f"{seconds:.0f} s"
