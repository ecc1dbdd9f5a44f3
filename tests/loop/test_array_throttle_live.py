"""A job array's throttle counts placed tasks, not offered ones (cloud/work/array_throttle.py,
cloud/scheduler/array_cap.py), on SQLite and PostgreSQL: a low-index task that cannot be
placed (no node fits it) holds back none of its siblings. Passes built from the store as
the loop builds them, incrementally and from scratch, agree; and the live loop with a
real agent on the real Mosquitto runs the siblings one at a time under `%1`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from cloud.api.job_arrays import task_specs
from cloud.loop.inputs import ConversionCache, PassInputs, build_inputs
from cloud.loop.nodes import NodeViews
from cloud.loop.plans import translate
from cloud.scheduler import Plan, schedule
from cloud.store import (
    WORK_STATE_EVENT,
    LeadershipLease,
    NewTenant,
    Store,
    StoreSnapshot,
    WorkStateChanged,
    open_store,
)
from cloud.store.ids import IdGenerator
from cloud.work.specs import TrainingJobSpec, encode_spec
from tests.api.support import bearer
from tests.loop.builders import node
from tests.loop.test_incremental_inputs import assert_same
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)

T0 = 1_686_787_200.0
NODES = [node("n1", gpus=4)]


class _Passes:
    """Passes over one store as the loop makes them (caches carried from pass to pass),
    each checked against the same pass built from scratch."""

    def __init__(self, store: Store, lease: LeadershipLease) -> None:
        self.store = store
        self.lease = lease
        self.cache = ConversionCache()
        self.views = NodeViews()
        self.previous: StoreSnapshot | None = None

    async def run(self) -> tuple[PassInputs, Plan]:
        read = await self.store.load_snapshot(self.previous)
        inputs = build_inputs(T0, NODES, read, self.cache, node_views=self.views)
        scratch = build_inputs(
            T0,
            NODES,
            await self.store.load_snapshot(None),
            ConversionCache(),
            node_views=NodeViews(),
        )
        assert_same(inputs, scratch, "inputs")
        plan = schedule(inputs.snapshot)
        assert_same(plan, schedule(scratch.snapshot), "plan")
        write = translate(plan, inputs, {}).write
        await self.store.commit_pass(write, lease=self.lease)
        self.previous = read
        return inputs, plan


@pytest.fixture
async def store(database: DatabaseUnderTest) -> AsyncIterator[Store]:
    opened = await open_store(database.settings, clock=lambda: T0)
    try:
        yield opened
    finally:
        await opened.close()


async def _array(store: Store, text: str, *, unplaceable: int) -> tuple[str, list[str]]:
    """Submit the array `text` of 1-GPU tasks, its task `unplaceable` asking for 8 GPUs
    (no node has them): its id and its tasks' ids, by index."""
    tenant = (await store.create_tenant(NewTenant(name="acme"))).tenant
    array_id = IdGenerator().new_id()
    spec = TrainingJobSpec(name="sweep", command=("python",), array=text)
    tasks = [
        (
            index,
            encode_spec(
                msgspec.structs.replace(task, accelerators_per_worker=8)
                if index == unplaceable
                else task
            ),
        )
        for index, task in task_specs(spec, array_id)
    ]
    await store.submit_array(tenant.tenant_id, array_id, tasks=tasks, priority="p1")
    ids = [task.work.work_id for task in await store.array_tasks(tenant.tenant_id, array_id)]
    return array_id, ids


def _placed(plan: Plan) -> set[str]:
    return {placement.work_id for placement in plan.placements}


async def test_an_unplaceable_low_index_task_holds_back_none_of_its_siblings(
    store: Store,
) -> None:
    array_id, task = await _array(store, "0-4%2", unplaceable=0)
    lease = await store.try_acquire_leadership()
    assert lease is not None
    passes = _Passes(store, lease)

    # None placed: every ready task is offered with the array's cap; task 0 fits no node
    # and takes no slot, tasks 1 and 2 take the two.
    inputs, plan = await passes.run()
    assert _placed(plan) == {task[1], task[2]}
    pending = {item.work_id: item for item in plan.pending}
    assert pending[task[0]].code == "unschedulable"
    waits = (
        f"Array {array_id} places at most 2 of its tasks at once (%2): 2 placed (tasks 1, 2); "
        "this task waits its turn."
    )
    assert (pending[task[3]].code, pending[task[3]].message) == ("quota", waits)
    assert pending[task[4]].message == waits
    assert set(inputs.snapshot.array_caps) == {array_id}

    # At its throttle: the ready tasks wait out of the queue, naming the placed ones.
    inputs, plan = await passes.run()
    assert _placed(plan) == set()
    assert set(inputs.dependencies.waiting) == {task[0], task[3], task[4]}
    assert inputs.dependencies.waiting[task[3]].message == waits
    assert [d.job_id for d in inputs.dependencies.waiting[task[3]].waiting_for] == task[1:3]
    assert not {task[0], task[3], task[4]} & {w.work_id for w in inputs.snapshot.queue}

    # Task 1 ends: one slot, for task 3 (task 0 still fits nowhere).
    await store.transition(task[1], "running")
    await store.transition(task[1], "succeeded")
    inputs, plan = await passes.run()
    assert _placed(plan) == {task[3]}
    pending = {item.work_id: item for item in plan.pending}
    assert pending[task[0]].code == "unschedulable"
    assert pending[task[4]].message == (
        f"Array {array_id} places at most 2 of its tasks at once (%2): 2 placed (tasks 2, 3); "
        "this task waits its turn."
    )
    await lease.release()


async def test_a_throttled_array_runs_the_tasks_that_can_run_with_a_real_agent(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    """The review's case on a live loop: with `%1`, task 0 cannot be placed (its node has
    4 GPUs, it asks for 8) and tasks 1-3 can; they run, one at a time."""
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "sweep",
            "command": ["python", "sweep.py"],
            "estimated_duration_s": 1.0,  # an A100 runs it in about a second
            "accelerators_per_worker": 8,  # none fits until patched
            "allow_unschedulable": True,
            "array": "0-3%1",
        }
        response = await api.submit(token, spec)
        assert response.status == 201, await response.text()
        array_id = (await response.json())["id"]
        for index in (1, 2, 3):
            patched = await api.client.patch(
                f"/v1/jobs/{array_id}_{index}",
                json={"accelerators_per_worker": 1},
                headers=bearer(token),
            )
            assert patched.status == 200, await patched.text()

        for index in (1, 2, 3):
            await reaches(api, token, f"{array_id}_{index}", "succeeded", timeout_s=60.0)

        # Task 0 waits for a node that fits it, not for its turn.
        seen: dict[str, object] = {}

        async def own_reason() -> bool:
            seen.update(await work(api, token, f"{array_id}_0"))
            reason = str(seen.get("reason"))
            return seen["state"] == "pending" and "waits its turn" not in reason

        await eventually_async(
            own_reason, timeout_s=20.0, interval_s=0.05, message=lambda: f"task 0: {seen}"
        )

        # Never more than one placed at once: replay every committed state change.
        body = await work(api, token, array_id)
        tasks = {task["id"] for task in body["array"]["tasks"]}
        events = await api.store.list_events(tenant_id=await api.tenant_id(token), limit=1000)
        placed: set[str] = set()
        most = 0
        for event in events:
            if event.kind != WORK_STATE_EVENT or event.work_id not in tasks:
                continue
            change = msgspec.json.decode(event.payload, type=WorkStateChanged)
            if change.state in ("scheduled", "running"):
                placed.add(change.work_id)
            else:
                placed.discard(change.work_id)
            most = max(most, len(placed))
        assert most == 1
