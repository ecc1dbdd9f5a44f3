"""The rules of job arrays without a database (issue 29): which indices an `array` text
names (Slurm's syntax), the summary state of an array, and which pending tasks the
throttle lets the scheduler see (cloud/work/array_throttle.py)."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from cloud.api.job_arrays import submitted_form, task_specs
from cloud.store import WorkRecord
from cloud.work.array_ranges import parse_array, split_task_name, task_name
from cloud.work.array_throttle import NOTHING_THROTTLED, ArrayTaskCache, array_throttles
from cloud.work.array_views import array_state
from cloud.work.specs import TrainingJobSpec, encode_spec
from shared.errors import FieldError
from shared.work_literals import WorkState

ARRAY = "01JDZ8M3QX7A0B9C2D4E6F8G0H"


@pytest.mark.parametrize(
    ("text", "indices", "throttle"),
    [
        ("0-99%10", tuple(range(100)), 10),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("7", (7,), None),
        ("9,2-3%1", (2, 3, 9), 1),
        ("0-9999", tuple(range(10_000)), None),
    ],
)
def test_an_array_text_names_its_indices_and_throttle(
    text: str, indices: tuple[int, ...], throttle: int | None
) -> None:
    asked = parse_array(text)
    assert (asked.indices, asked.throttle, asked.count) == (indices, throttle, len(indices))


@pytest.mark.parametrize(
    "text", ["", "a", "1-", "-1", "1--3", "3-1", "0-3:0", "%2", "0-3%", "0-3%0", "1,1", "0-10000"]
)
def test_a_bad_array_text_is_a_field_error_on_array(text: str) -> None:
    with pytest.raises(FieldError) as refused:
        parse_array(text)
    assert refused.value.path == ("array",)


def test_a_task_is_named_by_its_array_and_index() -> None:
    assert task_name(ARRAY, 7) == f"{ARRAY}_7"
    assert split_task_name(f"{ARRAY}_7") == (ARRAY, 7)
    assert split_task_name(ARRAY) is None
    assert split_task_name(f"{ARRAY}_x") is None


@pytest.mark.parametrize(
    ("states", "summary"),
    [
        (["pending", "running", "succeeded"], "running"),
        (["pending", "scheduled"], "scheduled"),
        (["pending", "succeeded", "failed"], "pending"),
        (["succeeded", "succeeded"], "succeeded"),
        (["succeeded", "failed", "cancelled"], "failed"),
        (["succeeded", "cancelled"], "cancelled"),
    ],
)
def test_the_summary_state_follows_the_tasks(states: list[WorkState], summary: WorkState) -> None:
    assert array_state(states) == summary


def test_a_task_spec_carries_its_index_and_gives_back_the_submission() -> None:
    spec = TrainingJobSpec(name="sweep", command=("python",), env={"SEED": "1"}, array="2-4%2")
    tasks = task_specs(spec, ARRAY)
    assert [index for index, _ in tasks] == [2, 3, 4]
    _, third = tasks[1]
    assert third.array is None
    assert third.array_task is not None
    assert (third.array_task.index, third.array_task.count, third.array_task.throttle) == (3, 3, 2)
    assert third.env["GREENFED_ARRAY_TASK_ID"] == "3"
    assert third.env["SEED"] == "1"
    assert submitted_form(third) == spec
    # A stored task decodes again, its GREENFED_ARRAY_* variables included.
    assert msgspec.json.decode(encode_spec(third), type=TrainingJobSpec) == third


def _tasks(states: list[WorkState], throttle: str = "%2") -> list[WorkRecord]:
    spec = TrainingJobSpec(
        name="sweep", command=("python",), array=f"0-{len(states) - 1}{throttle}"
    )
    return [
        WorkRecord(
            work_id=f"task-{index}",
            tenant_id="t",
            kind="training",
            spec=encode_spec(task),
            priority="p1",
            state=states[index],
            state_reason=None,
            attempts=0,
            submitted_at=0.0,
            updated_at=0.0,
            idempotency_key=None,
            version=1,
        )
        for index, task in task_specs(spec, ARRAY)
    ]


def test_an_array_at_its_throttle_keeps_its_ready_tasks_out_of_the_queue() -> None:
    records = _tasks(["succeeded", "running", "scheduled", "pending", "pending"])
    throttles = array_throttles(records, now=0.0)
    waiting = throttles.waiting
    assert sorted(waiting) == ["task-3", "task-4"]
    assert waiting["task-3"].message == (
        f"Array {ARRAY} places at most 2 of its tasks at once (%2): 2 placed (tasks 1, 2); "
        "this task waits its turn."
    )
    assert [(d.job_id, d.condition) for d in waiting["task-3"].waiting_for] == [
        ("task-1", "ended"),
        ("task-2", "ended"),
    ]
    assert throttles.caps == ()


def test_an_array_with_room_offers_every_ready_task_with_its_cap() -> None:
    # One placed, one slot: every ready task is queued, the core places at most one
    # (cloud/scheduler/array_cap.py), whichever of them it can place.
    throttles = array_throttles(_tasks(["succeeded", "running", "pending", "pending"]), now=0.0)
    assert throttles.waiting == {}
    (cap,) = throttles.caps
    assert (cap.array_id, cap.throttle, cap.placed, cap.slots) == (ARRAY, 2, (1,), 1)
    assert cap.tasks == {"task-2": 2, "task-3": 3}
    # Room for every ready task: nothing to cap.
    assert array_throttles(_tasks(["running", "pending"]), now=0.0).caps == ()


def test_held_or_backing_off_tasks_take_no_slot_and_no_throttle_holds_nothing() -> None:
    records = _tasks(["pending", "pending", "pending"])
    records[0] = replace(records[0], hold="held")
    records[1] = replace(records[1], not_before=60.0)  # a retry's backoff
    assert array_throttles(records, now=0.0) == NOTHING_THROTTLED  # only task-2 is queueable
    assert array_throttles(_tasks(["pending"] * 4, throttle=""), now=0.0) == NOTHING_THROTTLED


def test_the_cache_reads_a_spec_again_only_when_its_record_changed() -> None:
    cache = ArrayTaskCache()
    records = _tasks(["running", "running", "pending"])
    assert sorted(array_throttles(records, 0.0, cache).waiting) == ["task-2"]
    cache.retain({"task-0"})
    assert sorted(array_throttles(records, 0.0, cache).waiting) == ["task-2"]
