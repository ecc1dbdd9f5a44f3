"""How many tasks of a job array may be placed at once: its throttle (`array = "0-99%10"`).

The scheduling loop asks `array_throttles` on every pass with the work it read
(cloud/loop/inputs.py). Of an array with a throttle of N and P tasks placed (scheduled
or running):

- at its throttle (P >= N), every ready task waits, like work waiting for its
  dependencies (pending reason code `dependency`), with a reason that names the
  throttle and the tasks holding it; the scheduler does not see them;
- with room for fewer tasks than it has ready, every ready task is queued with the
  array's cap (cloud/scheduler/array_cap.py): the core places at most N - P of them in
  the pass, lowest index first of those it can place. A task it cannot place (its start
  window is closed, no node fits it, its start is deferred) takes no slot, so it holds
  back none of the others.

So no more than N of its tasks are placed at once. Held, suspended or backing-off tasks
are pending but not queued: they take no slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import msgspec

from cloud.scheduler import ArrayCap
from cloud.scheduler.explain import SHOWN_TASKS, array_throttle
from cloud.store.records import DependencyRecord, WorkRecord
from cloud.store.states import PLACED_STATES
from cloud.work.dependencies import Resolution, Waiting
from cloud.work.specs import ArrayTaskSpec

# The canonical spec encoding writes every field: a task's holds this, other work's
# `"array_task":null` (or, written by an older greenfed, nothing).
_TASK_MARK: Final = b'"array_task":{'


class _ArrayTaskOf(msgspec.Struct, frozen=True):
    """Only the `array_task` of a training spec (the rest is skipped unread)."""

    array_task: ArrayTaskSpec | None = None


_DECODER: Final = msgspec.json.Decoder(_ArrayTaskOf)


@dataclass(frozen=True, slots=True)
class _Task:
    record: WorkRecord
    index: int


def _array_task(record: WorkRecord) -> ArrayTaskSpec | None:
    if record.kind != "training" or _TASK_MARK not in record.spec:
        return None
    try:
        return _DECODER.decode(record.spec).array_task
    except msgspec.DecodeError:
        return None  # the conversion sets it aside as unschedulable, with the reason


class ArrayTaskCache:
    """The `array_task` of each record by (work id, version), so that a pass looks into
    a spec only when it is new or changed (a version changes with its record)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, ArrayTaskSpec | None]] = {}

    def task_of(self, record: WorkRecord) -> ArrayTaskSpec | None:
        cached = self._entries.get(record.work_id)
        if cached is not None and cached[0] == record.version:
            return cached[1]
        task = _array_task(record)
        self._entries[record.work_id] = (record.version, task)
        return task

    def retain(self, work_ids: set[str]) -> None:
        for work_id in set(self._entries) - work_ids:
            del self._entries[work_id]


def _tasks_by_array(
    records: Iterable[WorkRecord], cache: ArrayTaskCache
) -> dict[str, tuple[int, list[_Task]]]:
    """Array id -> (throttle, its tasks among `records`), for throttled arrays only."""
    arrays: dict[str, tuple[int, list[_Task]]] = {}
    for record in records:
        task = cache.task_of(record)
        if task is None or task.throttle is None:
            continue
        arrays.setdefault(task.array_id, (task.throttle, []))[1].append(_Task(record, task.index))
    return arrays


def queueable(record: WorkRecord, now: float) -> bool:
    """Pending and offered to the scheduler this pass, but for the throttle."""
    if record.state != "pending" or record.hold is not None:
        return False
    return record.not_before is None or record.not_before <= now


@dataclass(frozen=True, slots=True)
class ArrayThrottles:
    """What the throttles of the job arrays among one pass's work do to it."""

    # Ready tasks of arrays at their throttle: kept out of the queue, and why.
    waiting: Mapping[str, Waiting]
    # Arrays with room for some tasks and more of them ready: the core's cap.
    caps: tuple[ArrayCap, ...]


NOTHING_THROTTLED: Final = ArrayThrottles(MappingProxyType({}), ())


def array_throttles(
    records: Iterable[WorkRecord], now: float, cache: ArrayTaskCache | None = None
) -> ArrayThrottles:
    """The throttles of the arrays among `records` (one pass's work, every state).
    `cache`: the loop's, kept from pass to pass (the caller retains its entries)."""
    waiting: dict[str, Waiting] = {}
    caps: list[ArrayCap] = []
    for array_id, (throttle, tasks) in _tasks_by_array(records, cache or ArrayTaskCache()).items():
        placed = sorted(
            (task for task in tasks if task.record.state in PLACED_STATES),
            key=lambda task: task.index,
        )
        ready = sorted(
            (task for task in tasks if queueable(task.record, now)), key=lambda task: task.index
        )
        slots = throttle - len(placed)
        if len(ready) <= slots:
            continue  # room for every one of them: nothing to cap
        if slots > 0:
            caps.append(
                ArrayCap(
                    array_id=array_id,
                    throttle=throttle,
                    placed=tuple(task.index for task in placed),
                    tasks={task.record.work_id: task.index for task in ready},
                )
            )
            continue
        message = array_throttle(array_id, throttle, [task.index for task in placed])
        for task in ready:
            waiting[task.record.work_id] = Waiting(
                message=message,
                waiting_for=tuple(
                    DependencyRecord(
                        work_id=task.record.work_id,
                        position=position,
                        job_id=sibling.record.work_id,
                        condition="ended",
                        job_state=sibling.record.state,
                        job_reason=sibling.record.state_reason,
                    )
                    for position, sibling in enumerate(placed[:SHOWN_TASKS])
                ),
            )
    if not waiting and not caps:
        return NOTHING_THROTTLED
    return ArrayThrottles(MappingProxyType(waiting), tuple(caps))


def with_throttled(resolution: Resolution, waiting: Mapping[str, Waiting]) -> Resolution:
    """`resolution` with the tasks the throttle holds back waiting too (a task that also
    waits for its dependencies says so: that reason comes first)."""
    if not waiting:
        return resolution
    return Resolution(
        waiting=MappingProxyType({**waiting, **resolution.waiting}),
        cancelled=resolution.cancelled,
    )
