"""The work state machine, declared once; every state change in the store goes through it.

    pending -> scheduled -> running -> succeeded | failed
    scheduled | running -> pending      (requeue: preempted, node lost; bounded, see `requeue`)
    pending | scheduled -> failed       (cannot ever run, failed to start)
    any non-terminal    -> cancelled

Terminal states (succeeded, failed, cancelled) have no way out.

Beside the state, pending work may carry a hold that keeps it out of the queue until
a person lifts it (cloud/store/job_control.py): "held" (hold/release) or "suspended"
(suspend/resume).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, get_args

from shared.work_literals import WORK_STATES, WorkState

HoldKind = Literal["held", "suspended"]
HOLD_KINDS: Final[tuple[HoldKind, ...]] = get_args(HoldKind)

TERMINAL_STATES: Final[frozenset[WorkState]] = frozenset({"succeeded", "failed", "cancelled"})
# States in which work holds (or is about to hold) allocations.
PLACED_STATES: Final[frozenset[WorkState]] = frozenset({"scheduled", "running"})

TRANSITIONS: Final[Mapping[WorkState, frozenset[WorkState]]] = MappingProxyType(
    {
        "pending": frozenset({"scheduled", "failed", "cancelled"}),
        "scheduled": frozenset({"running", "pending", "failed", "cancelled"}),
        "running": frozenset({"succeeded", "failed", "pending", "cancelled"}),
        "succeeded": frozenset(),
        "failed": frozenset(),
        "cancelled": frozenset(),
    }
)


def is_legal(from_state: WorkState, to_state: WorkState) -> bool:
    return to_state in TRANSITIONS[from_state]


def parse_state(text: str) -> WorkState:
    for state in WORK_STATES:
        if state == text:
            return state
    raise ValueError(f"unknown work state {text!r}")


def parse_hold(text: str | None) -> HoldKind | None:
    for hold in HOLD_KINDS:
        if hold == text:
            return hold
    if text is None:
        return None
    raise ValueError(f"unknown hold {text!r}")


@dataclass(frozen=True, slots=True)
class Requeue:
    """Where a requeue request lands: back to pending, or failed once attempts are used up."""

    to_state: WorkState
    reason: str


def requeue(attempts: int, max_attempts: int, reason: str) -> Requeue:
    """`attempts` counts placements so far (each pending -> scheduled adds one)."""
    if attempts >= max_attempts:
        return Requeue("failed", f"{reason} (gave up after {attempts} attempts)")
    return Requeue("pending", reason)
