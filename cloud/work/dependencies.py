"""When work that depends on other jobs may start (`depends_on`), decided in one place.

A dependency names one of the tenant's training jobs and how it must have ended:

- `succeeded`: holds once the job succeeded; can never hold once it failed or was
  cancelled;
- `failed`: holds once the job failed; can never hold once it succeeded or was
  cancelled;
- `ended`: holds once the job ended, whichever way.

Until then the dependent waits (pending reason `dependency`, naming what it waits for).
It is queued for the scheduler once every dependency holds, and cancelled, with the
reason, as soon as one can no longer hold. The scheduling loop asks `resolve` on every
pass with the dependencies of all pending work (cloud/loop/inputs.py); a cancellation
carries on down a chain in the same pass (A failed: B, which needs A to succeed, is
cancelled, and so is C, which needs B to succeed).

A dependency may only name a job that exists when the dependent is submitted, and
`depends_on` never changes, so the API cannot create a loop; it still refuses work
whose dependencies lead into one (`loop_from`), which only a store edited by other
means could hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from cloud.store.records import DependencyRecord
from shared.work_literals import DependencyCondition, WorkState

Verdict = Literal["holds", "waits", "never"]

_VERB: Final[Mapping[DependencyCondition, str]] = MappingProxyType(
    {"succeeded": "succeed", "failed": "fail", "ended": "end"}
)
_ENDED: Final[frozenset[WorkState]] = frozenset({"succeeded", "failed", "cancelled"})
_REASON_CHARS: Final = 300  # of the job's own reason, quoted in a cancellation


def verdict(condition: DependencyCondition, state: WorkState) -> Verdict:
    """Whether a dependency on a job in `state` holds, may still hold, or never will."""
    if state not in _ENDED:
        return "waits"
    if condition == "ended" or condition == state:
        return "holds"
    return "never"


@dataclass(frozen=True, slots=True)
class Waiting:
    """Pending work whose dependencies do not all hold yet."""

    message: str  # one line for a person
    waiting_for: tuple[DependencyRecord, ...]  # those that do not hold yet


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one pass does with pending work that has dependencies."""

    waiting: Mapping[str, Waiting]  # work id -> not queued yet, and why
    cancelled: Mapping[str, str]  # work id -> cancel it, for this reason

    def holds_back(self, work_id: str) -> bool:
        """Not to be queued in this pass."""
        return work_id in self.waiting or work_id in self.cancelled


NOTHING_WAITS: Final = Resolution(MappingProxyType({}), MappingProxyType({}))


def resolve(dependencies: Sequence[DependencyRecord]) -> Resolution:
    """Decide every dependent in `dependencies` (the dependencies of pending work, with
    the states of the jobs they name, as one read saw them)."""
    if not dependencies:
        return NOTHING_WAITS
    by_work: dict[str, list[DependencyRecord]] = {}
    for dependency in dependencies:
        by_work.setdefault(dependency.work_id, []).append(dependency)
    # Cancelled in this pass: what depends on them sees them cancelled at once.
    cancelled: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for work_id, needs in sorted(by_work.items()):
            if work_id in cancelled:
                continue
            for dependency in needs:
                state, reason = _state(dependency, cancelled)
                if verdict(dependency.condition, state) == "never":
                    cancelled[work_id] = _broken(dependency, state, reason)
                    changed = True
                    break
    waiting: dict[str, Waiting] = {}
    for work_id, needs in sorted(by_work.items()):
        if work_id in cancelled:
            continue
        open_ = tuple(d for d in needs if verdict(d.condition, _state(d, cancelled)[0]) != "holds")
        if open_:
            waiting[work_id] = Waiting(_waiting_message(open_, len(needs)), open_)
    return Resolution(MappingProxyType(waiting), MappingProxyType(cancelled))


def _state(
    dependency: DependencyRecord, cancelled: Mapping[str, str]
) -> tuple[WorkState, str | None]:
    if dependency.job_id in cancelled:
        return "cancelled", cancelled[dependency.job_id]
    return dependency.job_state, dependency.job_reason


def _broken(dependency: DependencyRecord, state: WorkState, reason: str | None) -> str:
    """E.g. "dependency can no longer hold: it needs job 01J... to succeed, which
    failed (exit code 3)"."""
    verb = _VERB[dependency.condition]
    became = "was cancelled" if state == "cancelled" else state
    detail = ""
    if reason:
        text = " ".join(reason.split())
        if len(text) > _REASON_CHARS:
            text = text[: _REASON_CHARS - 1] + "…"
        detail = f" ({text})"
    return (
        f"dependency can no longer hold: it needs job {dependency.job_id} to {verb}, "
        f"which {became}{detail}"
    )


def _waiting_message(open_: Sequence[DependencyRecord], total: int) -> str:
    """E.g. "Waiting for job 01J... to succeed (now running); 1 of 2 dependencies hold."."""
    parts = ", ".join(f"job {d.job_id} to {_VERB[d.condition]} (now {d.job_state})" for d in open_)
    holding = total - len(open_)
    tail = f"; {holding} of {total} dependencies hold" if holding else ""
    return f"Waiting for {parts}{tail}."


def loop_from(start: str, edges: Mapping[str, Sequence[str]]) -> tuple[str, ...] | None:
    """A dependency loop reachable from job `start` through `edges` (work id -> the job
    ids it waits for), as the ids around it, the first repeated at the end; None when
    there is none."""
    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()
    # Iterative depth-first search: a chain may be long.
    stack: list[tuple[str, int]] = [(start, 0)]
    while stack:
        node, next_child = stack.pop()
        if next_child == 0:
            if node in on_path:
                return (*path[path.index(node) :], node)
            if node in done:
                continue
            path.append(node)
            on_path.add(node)
        children = edges.get(node, ())
        if next_child < len(children):
            stack.append((node, next_child + 1))
            stack.append((children[next_child], 0))
        else:
            path.pop()
            on_path.discard(node)
            done.add(node)
    return None
