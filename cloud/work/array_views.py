"""What a job array looks like over REST and in the CLI: one summary state, counts per
state, and every task's state (docs/rest.md#job-arrays).

The summary state of an array follows from its tasks' (`array_state`):
- `running` while any task runs; else `scheduled` while any is placed and starting;
- else `pending` while any waits;
- once every task has ended: `succeeded` when all succeeded, `failed` when any failed,
  else `cancelled` (some were cancelled, none failed).

Imports nothing of the database stack: the CLI decodes these types too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from shared.work_literals import WORK_STATES, WorkState

_WHILE_ANY: Final[tuple[WorkState, ...]] = ("running", "scheduled", "pending")


class ArrayTaskView(msgspec.Struct, frozen=True, kw_only=True):
    """One task of an array: an ordinary training job of its own."""

    index: int
    id: str  # the task's own job id; `ARRAYID_INDEX` names it too
    state: WorkState
    reason: str | None
    attempts: int


class JobArrayView(msgspec.Struct, frozen=True, kw_only=True):
    """A job array: its range as submitted, throttle, summary state and tasks."""

    id: str
    array: str  # as submitted, e.g. 0-99%10
    count: int  # tasks
    throttle: int | None  # at most this many placed at once; null: no limit
    state: WorkState  # the summary state (docs/rest.md#job-arrays)
    states: dict[WorkState, int]  # tasks per state, states with none left out
    tasks: tuple[ArrayTaskView, ...]  # by index


def array_state(states: Sequence[WorkState]) -> WorkState:
    """The summary state of an array whose tasks are in `states` (at least one)."""
    present = set(states)
    for state in _WHILE_ANY:
        if state in present:
            return state
    if present == {"succeeded"}:
        return "succeeded"
    return "failed" if "failed" in present else "cancelled"


def state_counts(states: Sequence[WorkState]) -> dict[WorkState, int]:
    """Tasks per state, in the order of the states' lifecycle."""
    counts = dict.fromkeys(WORK_STATES, 0)
    for state in states:
        counts[state] += 1
    return {state: count for state, count in counts.items() if count}


def counts_text(counts: dict[WorkState, int]) -> str:
    """E.g. ``2 running, 1 pending, 1 succeeded``."""
    return ", ".join(f"{count} {state}" for state, count in counts.items())
