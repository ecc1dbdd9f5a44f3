"""The loop's migration step (cloud/loop/moves.py, plans.py): which running jobs
may move, and a move as an eviction plus a placement of the same job in one plan.
The pass rule itself (schedule, then move unless preempted) is tested directly in
test_pass_rule.py; here it runs on what the control plane knows."""

from __future__ import annotations

import dataclasses
from typing import Any

from cloud.green.latency import default_latency_estimator
from cloud.green.migration import Migrator
from cloud.green.pass_rule import PassDecision, schedule_then_move
from cloud.green.policies import GreenInputs, build_migrator, build_policy
from cloud.loop.inputs import PassInputs, build_inputs
from cloud.loop.moves import running_jobs
from cloud.loop.plans import translate
from cloud.scheduler import Policy
from cloud.store import AllocationRecord, StoreSnapshot, WorkRecord
from shared.work_literals import WorkState
from tests.green.builders import HOUR, T0, flat, grid
from tests.loop.builders import allocation, node, work

NOW = T0 + 2 * HOUR
GPUS = ("gpu0", "gpu1", "gpu2", "gpu3")


def green_policy() -> tuple[Policy, Migrator]:
    """The green policy and its migrator, on Johannesburg (dirty) and Toronto (clean)."""
    green = GreenInputs(
        signals=grid(flat("ZA", 700.0), flat("CA-ON", 50.0), now=NOW),
        latency=default_latency_estimator(),
        migration_cooldown_s=0.0,
    )
    migrator = build_migrator("green", green)
    assert migrator is not None
    return build_policy("green", green), migrator


def movable(
    work_id: str, *, state: WorkState = "running", attempts: int = 1, **spec: Any
) -> WorkRecord:
    """A 4-GPU job of 10 h that checkpoints every 10 min (``spec`` overrides)."""
    fields: dict[str, Any] = {
        "checkpoint_interval_s": 600.0,
        "estimated_duration_s": 36000.0,
        "accelerators_per_worker": 4,
    }
    return work(work_id, state=state, attempts=attempts, **(fields | spec))


def started(record: AllocationRecord) -> AllocationRecord:
    return dataclasses.replace(record, started_at=T0)


def live_pass(inputs: PassInputs, migrator: Migrator | None, policy: Policy) -> PassDecision:
    """The pass as loop.py runs it."""
    return schedule_then_move(
        inputs.snapshot, policy, migrator, running_jobs(inputs, max_attempts=3)
    )


def test_only_a_running_checkpointing_job_with_attempts_to_spare_moves() -> None:
    store = StoreSnapshot(
        tenants=(),
        work=(
            movable("mover"),
            movable("last-try", attempts=2),
            movable("plain", checkpoint_interval_s=None),
            movable("starting", state="scheduled"),
        ),
        allocations=tuple(
            started(allocation(work_id, 0, f"dirty-{n}", GPUS))
            for n, work_id in enumerate(("mover", "last-try", "plain", "starting"))
        ),
        node_generations={},
    )
    nodes = [node(f"dirty-{n}", zone="ZA") for n in range(4)] + [node("clean", zone="CA-ON")]
    inputs = build_inputs(NOW, nodes, store)
    assert [r.job.work_id for r in running_jobs(inputs, max_attempts=3)] == ["mover"]
    # With more attempts allowed, the job on its second one may move too.
    assert [r.job.work_id for r in running_jobs(inputs, max_attempts=4)] == ["last-try", "mover"]

    policy, migrator = green_policy()
    decision = live_pass(inputs, migrator, policy)
    plan = decision.plan
    [move] = decision.moves
    assert move.work_id == "mover"

    translation = translate(plan, inputs, {}, [move])
    [eviction] = translation.write.evictions
    [placement] = translation.write.placements
    assert eviction.work_id == placement.work_id == "mover"
    assert eviction.expected_version == placement.expected_version == 2
    assert eviction.reason.startswith("Moved from dirty-0 to clean for ")
    assert placement.reason == eviction.reason
    [moved] = placement.allocations
    assert (moved.node_id, moved.accelerator_ids) == ("clean", GPUS)
    assert [m.work_id for m in translation.moves] == ["mover"]
    assert (translation.placed, translation.evicted) == (0, 0)
    assert "mover" in translation.write.explanations


def test_a_pass_that_preempts_moves_nothing() -> None:
    def store(*extra_work: WorkRecord, squatting: bool = False) -> StoreSnapshot:
        squatter = (started(allocation("squatter", 0, "other", GPUS)),) if squatting else ()
        return StoreSnapshot(
            tenants=(),
            work=(movable("mover"), *extra_work),
            allocations=(started(allocation("mover", 0, "dirty", GPUS)), *squatter),
            node_generations={},
        )

    nodes = [
        node("dirty", zone="ZA"),
        node("clean", zone="CA-ON"),
        node("other", zone="ZA", labels={"pool": "other"}),
    ]
    policy, migrator = green_policy()
    assert len(live_pass(build_inputs(NOW, nodes, store()), migrator, policy).moves) == 1
    squatter = dataclasses.replace(
        work("squatter", state="running", accelerators_per_worker=4), priority="p2"
    )
    urgent = dataclasses.replace(
        work("urgent", state="pending", accelerators_per_worker=4, node_selector={"pool": "other"}),
        priority="p0",
    )
    inputs = build_inputs(NOW, nodes, store(squatter, urgent, squatting=True))
    decision = live_pass(inputs, migrator, policy)
    assert [p.work_id for p in decision.plan.preemptions] == ["squatter"]
    assert decision.moves == ()


def test_a_move_that_cannot_get_its_devices_is_not_made_and_its_devices_stay_its_own() -> None:
    eight = tuple(f"gpu{i}" for i in range(8))
    store = StoreSnapshot(
        tenants=(),
        work=(
            movable("mover"),
            work(
                "newcomer",
                state="pending",
                accelerators_per_worker=4,
                node_selector={"pool": "dirty"},
            ),
        ),
        allocations=(started(allocation("mover", 0, "dirty", GPUS)),),
        node_generations={},
    )
    dirty = node("dirty", gpus=8, zone="ZA", labels={"pool": "dirty"})
    inputs = build_inputs(NOW, [dirty, node("clean", gpus=8, zone="CA-ON")], store)
    policy, migrator = green_policy()
    decision = live_pass(inputs, migrator, policy)
    plan = decision.plan
    assert [(p.work_id, p.node_id) for p in plan.placements] == [("newcomer", "dirty")]
    [move] = decision.moves
    # Between planning and committing, the clean node re-registered with 2 GPUs.
    shrunk = dataclasses.replace(
        inputs, nodes={**inputs.nodes, "clean": node("clean", gpus=2, zone="CA-ON")}
    )
    translation = translate(plan, shrunk, {}, [move])
    assert translation.moves == ()
    assert "mover" in translation.skipped
    assert translation.write.evictions == ()
    [placed] = translation.write.placements
    assert placed.work_id == "newcomer"
    # The newcomer gets the free devices, not the ones the mover still runs on.
    assert placed.allocations[0].accelerator_ids == eight[4:]
    assert "mover" not in translation.write.explanations
