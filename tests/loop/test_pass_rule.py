"""The pass rule the live loop and the simulation share
(`cloud.green.pass_rule.schedule_then_move`): schedule, then move unless the pass
preempted, on the cluster as the plan leaves it."""

from __future__ import annotations

import dataclasses

from cloud.green.energy import EnergyModel
from cloud.green.latency import default_latency_estimator
from cloud.green.migration import Migrator, RunningJob
from cloud.green.pass_rule import schedule_then_move, with_placements
from cloud.green.policies import GreenInputs, build_policy
from cloud.scheduler import Allocation, Node, Plan, Policy, Snapshot, TrainingJob, schedule
from tests.green.builders import HOUR, T0, flat, gpu_server, grid, running_on

NOW = T0 + 2 * HOUR
SIGNALS = grid(flat("DIRTY", 600.0), flat("CLEAN", 60.0), now=NOW)
POLICY: Policy = build_policy(
    "green", GreenInputs(signals=SIGNALS, latency=default_latency_estimator())
)
MIGRATOR = Migrator(SIGNALS, EnergyModel(), cooldown_s=0.0)


def training(work_id: str, **fields: object) -> TrainingJob:
    defaults: dict[str, object] = {
        "tenant": "t",
        "submitted_at": T0,
        "accelerators_per_worker": 4,
        "duration_s": 10 * HOUR,
        "checkpoint_interval_s": 1800.0,
        "priority": "p2",
    }
    return TrainingJob(work_id=work_id, **(defaults | fields))  # type: ignore[arg-type]


MOVER = training("mover")
NODES: list[Node] = [
    gpu_server("dirty", "DIRTY"),
    gpu_server("clean", "CLEAN"),
    dataclasses.replace(gpu_server("other", "DIRTY"), labels={"pool": "other"}),
]


def cluster(*queue: TrainingJob, others: tuple[Allocation, ...] = ()) -> Snapshot:
    return Snapshot.build(
        now=NOW, nodes=NODES, allocations=[running_on("dirty", MOVER), *others], queue=queue
    )


RUNNING = [RunningJob(job=MOVER, started_s=T0, speed=1.0)]


def test_with_nothing_queued_a_job_moves_to_free_clean_capacity() -> None:
    decision = schedule_then_move(cluster(), POLICY, MIGRATOR, RUNNING)
    assert decision.plan == Plan(
        now=NOW, placements=(), preemptions=(), pending=(), reservations=(), order=()
    )
    assert decision.plan == schedule(cluster(), POLICY)  # what the core says of no queue
    [move] = decision.moves
    assert (move.work_id, [p.node_id for p in move.placements]) == ("mover", ["clean"])


def test_queued_work_is_placed_first_and_a_move_takes_only_what_it_left() -> None:
    newcomer = training("newcomer", priority="p1", checkpoint_interval_s=None)
    decision = schedule_then_move(cluster(newcomer), POLICY, MIGRATOR, RUNNING)
    assert [(p.work_id, p.node_id) for p in decision.plan.placements] == [("newcomer", "clean")]
    assert decision.moves == ()  # the clean node is the newcomer's now


def test_a_pass_that_preempted_moves_nothing() -> None:
    squatter = training("squatter", checkpoint_interval_s=None)
    urgent = training("urgent", priority="p0", node_selector={"pool": "other"})
    snapshot = cluster(urgent, others=(running_on("other", squatter),))

    decision = schedule_then_move(snapshot, POLICY, MIGRATOR, RUNNING)

    assert [p.work_id for p in decision.plan.preemptions] == ["squatter"]
    assert [(p.work_id, p.node_id) for p in decision.plan.placements] == [("urgent", "other")]
    assert decision.moves == ()
    # The clean node stayed free: without the preemption the mover would have gone.
    after = with_placements(snapshot, decision.plan)
    assert [m.work_id for m in MIGRATOR.propose(after, RUNNING, POLICY)] == ["mover"]


def test_without_a_migrator_or_running_jobs_the_pass_only_schedules() -> None:
    newcomer = training("newcomer", priority="p1")
    for migrator, running in ((None, RUNNING), (MIGRATOR, [])):
        decision = schedule_then_move(cluster(newcomer), POLICY, migrator, running)
        assert decision.plan == schedule(cluster(newcomer), POLICY)
        assert decision.moves == ()


def test_moves_are_looked_for_on_the_cluster_the_caller_says_the_plan_leaves() -> None:
    seen: list[tuple[Snapshot, Plan]] = []

    def full(snapshot: Snapshot, plan: Plan) -> Snapshot:
        seen.append((snapshot, plan))
        # As if the clean node filled up the moment the plan ran.
        return snapshot.with_work(
            allocations=[*snapshot.allocations, running_on("clean", training("filler"))]
        )

    snapshot = cluster()
    decision = schedule_then_move(snapshot, POLICY, MIGRATOR, RUNNING, cluster_after=full)
    assert decision.moves == ()
    assert seen == [(snapshot, decision.plan)]
