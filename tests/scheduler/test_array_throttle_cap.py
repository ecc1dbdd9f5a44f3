"""A job array's throttle inside the core (cloud/scheduler/array_cap.py): of an array's
ready tasks the pass places at most its free slots, lowest index first of the tasks it
can place; a task it cannot place takes no slot and holds back none of its siblings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from cloud.scheduler import (
    Allocation,
    ArrayCap,
    Plan,
    Policy,
    Scheduler,
    Snapshot,
    StartWindow,
    Work,
)
from tests.scheduler.builders import NOW, gpu_node, job, running

ARRAY = "01J0000000000000000000ARRY"
CLOSED = StartWindow.parse("08:00-09:00")  # NOW is 22:13 UTC, the node's local time


def _task(index: int, gpus: int = 1, **extra: Any) -> Work:
    # Ids in index order and one submission time, as the store gives an array's tasks.
    return job(f"task-{index}", gpus, submitted_at=NOW - 60, **extra)


def _cap(throttle: int, tasks: Sequence[Work], placed: tuple[int, ...] = ()) -> ArrayCap:
    return ArrayCap(
        array_id=ARRAY,
        throttle=throttle,
        placed=placed,
        tasks={work.work_id: int(work.work_id.removeprefix("task-")) for work in tasks},
    )


def _plan(
    queue: Sequence[Work], caps: Sequence[ArrayCap], allocations: Sequence[Allocation] = ()
) -> Plan:
    built = Snapshot.build(
        now=NOW, nodes=[gpu_node("n0", 8)], allocations=allocations, queue=queue, array_caps=caps
    )
    return Scheduler(built, Policy()).run()


def _placed(plan: Plan) -> list[str]:
    return sorted({placement.work_id for placement in plan.placements})


def _pending(plan: Plan) -> Mapping[str, tuple[str, str]]:
    return {item.work_id: (item.code, item.message) for item in plan.pending}


@pytest.mark.parametrize(
    ("blocked", "code"),
    [
        ({"start_window": CLOSED}, "window"),  # its start window is closed for hours
        ({"gpus": 16}, "unschedulable"),  # patched to a shape no node has
    ],
)
def test_a_low_index_task_that_cannot_be_placed_takes_no_slot(
    blocked: dict[str, Any], code: str
) -> None:
    tasks = [_task(0, **blocked), _task(1), _task(2), _task(3)]
    plan = _plan(tasks, [_cap(1, tasks)])

    assert _placed(plan) == ["task-1"]  # the lowest index of those that can run now
    pending = _pending(plan)
    assert pending["task-0"][0] == code  # its own reason, not the throttle
    waits = (
        "quota",
        f"Array {ARRAY} places at most 1 of its tasks at once (%1): 1 placed (tasks 1); "
        "this task waits its turn.",
    )
    assert pending["task-2"] == waits
    assert pending["task-3"] == waits
    assert plan.preemptions == ()


def test_a_task_that_waits_for_capacity_takes_no_slot_either() -> None:
    busy = [running("other", "n0", 6, priority="p0", preemptible=False)]
    tasks = [_task(0, gpus=4), _task(1), _task(2)]
    plan = _plan(tasks, [_cap(1, tasks)], allocations=busy)
    assert _placed(plan) == ["task-1"]
    assert _pending(plan)["task-0"][0] in ("capacity", "reserved")
    assert _pending(plan)["task-2"][0] == "quota"


def test_the_cap_counts_the_tasks_already_placed_and_takes_the_lowest_index_first() -> None:
    tasks = [_task(index) for index in range(4)]  # room for all four on the node
    plan = _plan(tasks, [_cap(3, tasks, placed=(5, 7))])

    assert _placed(plan) == ["task-0"]  # 3 - 2 placed: one slot
    assert _pending(plan)["task-1"] == (
        "quota",
        f"Array {ARRAY} places at most 3 of its tasks at once (%3): 3 placed (tasks 0, 5, 7); "
        "this task waits its turn.",
    )
    assert sorted(_pending(plan)) == ["task-1", "task-2", "task-3"]


def test_a_gang_task_takes_one_slot_and_other_work_is_not_capped() -> None:
    tasks = [_task(0, workers=2), _task(1, workers=2), _task(2)]
    solo = job("solo", 1, submitted_at=NOW)
    plan = _plan([*tasks, solo], [_cap(2, tasks)])
    assert _placed(plan) == ["solo", "task-0", "task-1"]
    assert len(plan.placements) == 5  # two gangs of two, and solo
    assert _pending(plan)["task-2"][0] == "quota"


def test_without_a_cap_every_task_that_fits_is_placed() -> None:
    tasks = [_task(0, start_window=CLOSED), _task(1), _task(2), _task(3)]
    plan = _plan(tasks, [])
    assert _placed(plan) == ["task-1", "task-2", "task-3"]


def test_a_bounded_pass_decides_the_head_of_the_queue_as_the_whole_pass_does() -> None:
    tasks = [_task(0, start_window=CLOSED), *(_task(index) for index in range(1, 5))]
    caps = [_cap(2, tasks)]
    snapshot = Snapshot.build(now=NOW, nodes=[gpu_node("n0", 8)], queue=tasks, array_caps=caps)
    whole = Scheduler(snapshot, Policy()).run()
    for decisions in range(len(tasks) + 1):
        bounded = Scheduler(snapshot, Policy()).run(decisions)
        decided = set(bounded.order)
        assert bounded.order == whole.order[:decisions]
        assert bounded.placements == tuple(p for p in whole.placements if p.work_id in decided)
        assert bounded.pending == tuple(p for p in whole.pending if p.work_id in decided)


def test_the_snapshot_keeps_caps_in_one_order_whatever_the_input_order() -> None:
    tasks = [_task(index) for index in range(3)]
    one = _cap(1, tasks, placed=(9, 4))
    other = ArrayCap(array_id="01J0000000000000000000AAAA", throttle=2, placed=(), tasks={})
    a = Snapshot.build(now=NOW, nodes=[gpu_node("n0")], array_caps=[one, other])
    b = Snapshot.build(now=NOW, nodes=[gpu_node("n0")], array_caps=[other, one])
    assert a.array_caps == b.array_caps
    assert list(a.array_caps) == sorted([ARRAY, other.array_id])
    assert a.array_caps[ARRAY].placed == (4, 9)
    with pytest.raises(ValueError, match="duplicate job array"):
        Snapshot.build(now=NOW, nodes=[gpu_node("n0")], array_caps=[one, one])
