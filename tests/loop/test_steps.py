"""The scheduling loop's steps, one at a time: devices, nodes, desired documents,
agent reports, plan translation, and the agent's acceptance of replicas."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import msgspec
import numpy as np
import pytest

from cloud.loop.desired import desired_document, master_port
from cloud.loop.devices import NotEnoughDevices, pick_devices
from cloud.loop.inputs import build_inputs
from cloud.loop.nodes import TIMEZONE_LABEL, NodeViews, scheduler_node
from cloud.loop.plans import translate
from cloud.loop.reports import agent_outcomes
from cloud.scheduler import Plan, Preemption, Snapshot, schedule
from cloud.scheduler.model import KIND_INDEX
from cloud.scheduler.plan import PreemptionReason
from cloud.store import StoreSnapshot
from cloud.work.retries import MAX_BACKOFF_S, Retry, after_failure
from edge.inference.replicas import check_assignment
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    DesiredDeployment,
    ReportedDeployment,
    ReportedTraining,
    Telemetry,
)
from shared.settings import SchedulingSettings
from tests.loop.builders import allocation, device, node, work

SETTINGS = SchedulingSettings()


# ---- devices and nodes -----------------------------------------------------------------


def test_devices_are_handed_out_lowest_free_id_first_in_natural_order() -> None:
    inventory = [device("gpu", i) for i in (10, 2, 0, 1)] + [device("cpu", 0)]
    assert pick_devices(inventory, "gpu", 2, held={"gpu0"}) == ("gpu1", "gpu2")
    assert pick_devices(inventory, "gpu", 1, held={"gpu0", "gpu1", "gpu2"}) == ("gpu10",)
    with pytest.raises(NotEnoughDevices, match="3 gpu wanted, 2 free of 4"):
        pick_devices(inventory, "gpu", 3, held={"gpu0", "gpu1"})


def test_a_node_folds_its_devices_conservatively_and_keeps_a_valid_timezone_label() -> None:
    devices = (
        device("gpu", 0, memory_bytes=80 * 2**30, relative_speed=2.5),
        device("gpu", 1, memory_bytes=40 * 2**30, relative_speed=1.0),
    )
    folded = scheduler_node(node("n1", devices=devices, labels={TIMEZONE_LABEL: "Asia/Tokyo"}))
    (pool,) = folded.pools
    assert (pool.kind, pool.count, pool.memory_bytes) == ("gpu", 2, 40 * 2**30)
    assert pool.relative_speed == 1.0  # a job must finish on the slower device too
    assert folded.timezone == "Asia/Tokyo"
    broken = scheduler_node(node("n2", labels={TIMEZONE_LABEL: "Mars/Olympus"}))
    assert broken.timezone == "Europe/Berlin"  # the zone's, not a broken pass


def test_node_views_are_kept_while_their_record_holds_and_remade_when_it_changes() -> None:
    """A pass reuses each node's scheduler view unless something it is made from
    changed (a new state); gone nodes are dropped. A new sample remakes nothing: its
    utilisation comes beside the node (`measured`), and the snapshot built with it is
    the one of the node made afresh."""
    views = NodeViews()
    first, second = node("n1"), node("n2")
    n1, n2 = views.of([first, second])
    again = views.of([first, second])
    assert again[0] is n1
    assert again[1] is n2

    def sampled(utilisation: float, seq: int) -> Telemetry:
        return Telemetry(
            node_id="n1", instance_id="i1", seq=seq, sampled_at=float(seq), interval_s=1.0,
            cpu_utilization_pct=1.0, memory_used_bytes=1, memory_total_bytes=2,
            accelerators=(AcceleratorSample(id="gpu0", utilization_pct=utilisation,
                                            memory_used_bytes=0),),
        )  # fmt: skip

    assert views.measured() == {}
    first.telemetry = sampled(50.0, 1)
    busy = views.of([first, second])[0]
    assert busy is n1
    assert views.measured() == {"n1": tuple(0.5 if p.kind == "gpu" else 0.0 for p in n1.pools)}
    fresh = Snapshot.build(now=0.0, nodes=[scheduler_node(first), scheduler_node(second)])
    for tables in (None, views.tables):
        built = Snapshot.build(
            now=0.0, nodes=[busy, n2], utilisation=views.measured(), tables=tables
        )
        assert_same_table(built, fresh)
    first.telemetry = sampled(50.0, 2)  # another sample, the same utilisation
    assert views.of([first, second])[0] is n1
    second.state = "offline"
    kept, offline = views.of([first, second])
    assert kept is n1
    assert not offline.healthy
    assert [n.node_id for n in views.of([second])] == ["n2"]
    assert views.measured() == {}


def assert_same_table(built: Snapshot, fresh: Snapshot) -> None:
    """Every node column of the two snapshots, value for value."""
    for name in (f.name for f in dataclasses.fields(built.nodes) if f.name != "kinds"):
        value, expected = getattr(built.nodes, name), getattr(fresh.nodes, name)
        if isinstance(value, Mapping):  # label codes: arrays by key
            value, expected = dict(value), dict(expected)
        np.testing.assert_equal(value, expected, name)
    for column, expected in zip(built.nodes.kinds, fresh.nodes.kinds, strict=True):
        for field in dataclasses.fields(column):
            np.testing.assert_equal(getattr(column, field.name), getattr(expected, field.name))


def mixed_mig_node() -> tuple[Accelerator, ...]:
    """An A100 node: gpu0 and gpu1 whole (80 GiB), gpu2 split into seven 1g.10gb slices."""
    whole = tuple(
        device("gpu", i, model="A100-SXM4-80GB", memory_bytes=80 * 2**30, relative_speed=1.0)
        for i in range(2)
    )
    slices = tuple(
        msgspec.structs.replace(
            device("gpu", 0, model="A100-SXM4-80GB MIG 1g.10gb", memory_bytes=10 * 2**30),
            id=f"gpu2-mig{j}",
            parent_id="gpu2",
            relative_speed=1 / 7,
        )
        for j in range(7)
    )
    return (device("cpu", 0), *whole, *slices)


def test_a_node_mixing_mig_slices_with_whole_gpus_forms_one_pool_per_profile() -> None:
    pools = scheduler_node(node("n1", devices=mixed_mig_node())).pools
    gpu_pools = [(p.model, p.count, p.memory_bytes // 2**30, p.relative_speed) for p in pools]
    assert gpu_pools[1:] == [
        ("A100-SXM4-80GB", 2, 80, 1.0),  # the main pool: whole GPUs, not their smallest slice
        ("A100-SXM4-80GB MIG 1g.10gb", 7, 10, 1 / 7),
    ]
    inventory = mixed_mig_node()
    assert pick_devices(inventory, "gpu", 2, held=(), model="A100-SXM4-80GB") == ("gpu0", "gpu1")
    assert pick_devices(inventory, "gpu", 2, held={"gpu2-mig0"}, model=pools[2].model) == (
        "gpu2-mig1",
        "gpu2-mig2",
    )
    with pytest.raises(NotEnoughDevices, match="3 gpu A100-SXM4-80GB wanted, 2 free of 2"):
        pick_devices(inventory, "gpu", 3, held=(), model="A100-SXM4-80GB")


def test_work_on_a_mixed_mig_node_gets_devices_of_the_pool_it_was_placed_in() -> None:
    """A 40 GiB job goes to the whole GPUs, small replicas fill the slices, and a replica
    already on a slice counts against the slices only."""
    big = work("big", state="pending", workers=1, accelerators_per_worker=2, memory_gib=40)
    small = work(
        "small",
        kind="inference",
        state="pending",
        replicas=6,
        max_replicas_per_node=8,
        memory_gib=4,
        sites=["cloud"],
    )
    running = work("running", kind="inference", state="running", memory_gib=4, sites=["cloud"])
    store = StoreSnapshot(
        tenants=(),
        work=(big, small, running),
        allocations=(allocation("running", 0, "n1", ("gpu2-mig0",), kind="inference"),),
        node_generations={},
    )
    inputs = build_inputs(0.0, [node("n1", devices=mixed_mig_node())], store)
    gpu_columns = inputs.snapshot.nodes.kind_columns[KIND_INDEX["gpu"]]
    assert [int(inputs.snapshot.nodes.kinds[c].free[0]) for c in gpu_columns] == [2, 6]
    plan = schedule(inputs.snapshot)
    assert not plan.pending, [p.message for p in plan.pending]
    devices = {
        placement.work_id: sorted(i for a in placement.allocations for i in a.accelerator_ids)
        for placement in translate(plan, inputs, {}).write.placements
    }
    assert devices["big"] == ["gpu0", "gpu1"]
    assert devices["small"] == [f"gpu2-mig{j}" for j in range(1, 7)]
    # Before pools per profile every device was a 10 GiB slice and "big" never ran.


def test_a_cpu_pool_counts_cores_with_the_power_shared_out_per_core() -> None:
    cpu = device("cpu", 0, compute_units=4, idle_power_w=2.0, max_power_w=8.0, relative_speed=0.02)
    (pool,) = scheduler_node(node("pi", devices=(cpu,))).pools
    assert (pool.kind, pool.count) == ("cpu", 4)
    assert (pool.idle_power_w, pool.max_power_w) == (0.5, 2.0)
    assert pool.relative_speed == 0.02
    assert pick_devices((cpu,), "cpu", 3, held=()) == ()


def test_an_unhealthy_device_takes_no_work_and_moves_what_ran_on_it() -> None:
    failed = device("gpu", 1, healthy=False, health="GPU is lost")
    devices = (device("cpu", 0), device("gpu", 0), failed, device("gpu", 2))
    (_, pool) = scheduler_node(node("n1", devices=devices)).pools
    assert (pool.kind, pool.count) == ("gpu", 2)
    assert pick_devices(devices, "gpu", 2, held=()) == ("gpu0", "gpu2")
    with pytest.raises(NotEnoughDevices):
        pick_devices(devices, "gpu", 3, held=())
    job = work("job-1")
    deployment = work("dep-1", kind="inference", state="running")
    allocations = {
        "job-1": (allocation("job-1", 0, "n1", ("gpu1",)),),
        "dep-1": (
            allocation("dep-1", 0, "n1", ("gpu1",), kind="inference"),
            allocation("dep-1", 1, "n1", ("gpu2",), kind="inference"),
        ),
    }
    nodes = {"n1": node("n1", devices=devices)}
    outcome = agent_outcomes({"job-1": job, "dep-1": deployment}, allocations, nodes, {}, now=0.0)
    (eviction,) = outcome.evictions
    assert (eviction.work_id, eviction.reason) == ("job-1", "gpu1 on n1 failed: GPU is lost")
    (shrunk,) = outcome.placements
    assert [a.member_index for a in shrunk.allocations] == [1]  # the replica on gpu2 stays
    assert shrunk.reason == "gpu1 on n1 failed: GPU is lost"


# ---- desired documents -----------------------------------------------------------------


def test_a_gang_ranks_its_members_node_by_node_in_the_order_of_their_lowest_member() -> None:
    job = work("job-1", attempts=3)
    members = (
        allocation("job-1", 0, "b", ("gpu0",)),
        allocation("job-1", 1, "a", ("gpu2",)),
        allocation("job-1", 2, "b", ("gpu1",)),
    )
    nodes = {"a": node("a"), "b": node("b", labels={"greenfed.io/address": "10.0.0.7"})}
    documents = {
        node_id: desired_document(
            node_id,
            5,
            now=1.0,
            records={"job-1": job},
            allocations={"job-1": members},
            nodes=nodes,
            settings=SETTINGS,
        )
        for node_id in nodes
    }
    (on_b,) = documents["b"].training
    (on_a,) = documents["a"].training
    # b holds members 0 and 2 (ranks 0, 1), a member 1 (rank 2): three workers.
    assert (on_b.rank, on_b.processes, on_a.rank, on_a.processes) == (0, 2, 2, 1)
    assert on_b.world_size == on_a.world_size == 3
    assert (on_b.node_rank, on_a.node_rank, on_b.nodes, on_a.nodes) == (0, 1, 2, 2)
    assert on_b.accelerator_ids == ("gpu0", "gpu1")
    assert on_a.master_addr == on_b.master_addr == "10.0.0.7"
    assert on_a.master_port == on_b.master_port == master_port("job-1", 3, SETTINGS)
    assert SETTINGS.master_port_base <= on_a.master_port < 29500 + SETTINGS.master_port_span
    assert on_a.attempt == 3
    assert documents["a"].generation == 5
    assert on_a.cpu_cores is None  # no cores held beside the GPUs


def test_a_worker_is_told_the_cpu_cores_its_members_hold_on_its_node() -> None:
    job = work("job-1")
    gpu_members = (
        dataclasses.replace(allocation("job-1", 0, "a", ("gpu0",)), cpu_cores=4),
        dataclasses.replace(allocation("job-1", 1, "a", ("gpu1",)), cpu_cores=4),
        dataclasses.replace(allocation("job-1", 2, "b", ("gpu0",)), cpu_cores=4),
    )
    cpu_job = work("cpu-1")
    cpu_member = dataclasses.replace(
        allocation("cpu-1", 0, "b", ("cpu0", "cpu1", "cpu2")), accelerator_kind="cpu"
    )
    nodes = {"a": node("a"), "b": node("b")}

    def cores_on(node_id: str) -> dict[str, int | None]:
        document = desired_document(
            node_id,
            1,
            now=1.0,
            records={"job-1": job, "cpu-1": cpu_job},
            allocations={"job-1": gpu_members, "cpu-1": (cpu_member,)},
            nodes=nodes,
            settings=SETTINGS,
        )
        return {worker.job_id: worker.cpu_cores for worker in document.training}

    assert cores_on("a") == {"job-1": 8}
    assert cores_on("b") == {"job-1": 4, "cpu-1": 3}  # a CPU job's cores are its devices


def test_a_deployment_replica_carries_its_model_and_accepted_providers() -> None:
    deployment = work("dep-1", kind="inference", providers=["OpenVINOExecutionProvider"])
    document = desired_document(
        "edge-1",
        2,
        now=1.0,
        records={"dep-1": deployment},
        allocations={"dep-1": (allocation("dep-1", 4, "edge-1", kind="inference"),)},
        nodes={},
        settings=SETTINGS,
    )
    (replica,) = document.deployments
    assert (replica.replica, replica.model_id) == (4, "m1")
    assert replica.providers == ("OpenVINOExecutionProvider",)
    assert document.training == ()


# ---- agent reports ---------------------------------------------------------------------


def reported(job_id: str, attempt: int, state: str, reason: str = "") -> ReportedTraining:
    return ReportedTraining(job_id=job_id, attempt=attempt, state=state, reason=reason)  # type: ignore[arg-type]


def test_a_gang_succeeds_only_when_every_worker_has_and_fails_with_the_first_reason() -> None:
    job = work("job-1", attempts=2)
    members = {"job-1": (allocation("job-1", 0, "a"), allocation("job-1", 1, "b"))}
    half = {
        "a": node("a", training=(reported("job-1", 2, "succeeded"),)),
        "b": node("b", training=(reported("job-1", 2, "running"),)),
    }
    outcome = agent_outcomes({"job-1": job}, members, half, {}, now=0.0)
    assert [c.to_state for c in outcome.state_changes] == ["running"]
    assert {(c.member_index, c.state) for c in outcome.allocation_states} == {
        (0, "running"),
        (1, "running"),
    }

    done = {
        "a": node("a", training=(reported("job-1", 2, "succeeded"),)),
        "b": node("b", training=(reported("job-1", 2, "succeeded"),)),
    }
    outcome = agent_outcomes({"job-1": job}, members, done, {}, now=0.0)
    assert [c.to_state for c in outcome.state_changes] == ["running", "succeeded"]

    crashed = {
        "a": node("a", training=(reported("job-1", 2, "failed", "exit code 3"),)),
        "b": node("b", training=(reported("job-1", 2, "running"),)),
    }
    (change,) = agent_outcomes({"job-1": job}, members, crashed, {}, now=0.0).state_changes
    assert change.to_state == "failed"
    assert change.reason == "worker on a failed: exit code 3"

    stale = {"a": node("a", training=(reported("job-1", 1, "failed"),)), "b": node("b")}
    assert not agent_outcomes({"job-1": job}, members, stale, {}, now=0.0).changes_work


def test_a_lost_node_requeues_a_gang_but_only_shrinks_a_deployment() -> None:
    job = work("job-1")
    deployment = work("dep-1", kind="inference", state="running")
    allocations = {
        "job-1": (allocation("job-1", 0, "a"), allocation("job-1", 1, "lost")),
        "dep-1": tuple(
            allocation("dep-1", i, node_id, kind="inference")
            for i, node_id in enumerate(("lost", "e1", "e2"))
        ),
    }
    nodes = {"a": node("a"), "e1": node("e1"), "e2": node("e2")}
    outcome = agent_outcomes(
        {"job-1": job, "dep-1": deployment},
        allocations,
        nodes,
        {"lost": "offline: shutdown"},
        now=0.0,
    )
    (eviction,) = outcome.evictions
    assert eviction.work_id == "job-1"
    assert eviction.reason == "node lost lost (offline: shutdown)"
    (shrunk,) = outcome.placements
    assert shrunk.work_id == "dep-1"
    assert [a.member_index for a in shrunk.allocations] == [1, 2]


def test_a_deployment_runs_when_every_replica_is_ready_and_fails_with_a_replica() -> None:
    deployment = work("dep-1", kind="inference")
    allocations = {
        "dep-1": (
            allocation("dep-1", 0, "e1", kind="inference"),
            allocation("dep-1", 1, "e2", kind="inference"),
        )
    }

    def replica(index: int, state: str, reason: str = "") -> ReportedDeployment:
        return ReportedDeployment(deployment_id="dep-1", replica=index, state=state, reason=reason)  # type: ignore[arg-type]

    ready = {"e1": node("e1", deployments=(replica(0, "ready"),)), "e2": node("e2")}
    outcome = agent_outcomes({"dep-1": deployment}, allocations, ready, {}, now=0.0)
    assert outcome.state_changes == ()
    ready["e2"] = node("e2", deployments=(replica(1, "ready"),))
    (change,) = agent_outcomes({"dep-1": deployment}, allocations, ready, {}, now=0.0).state_changes
    assert change.to_state == "running"
    ready["e2"] = node("e2", deployments=(replica(1, "failed", "checksum mismatch"),))
    (change,) = agent_outcomes({"dep-1": deployment}, allocations, ready, {}, now=0.0).state_changes
    assert (change.to_state, change.reason) == (
        "failed",
        "replica 1 on e2 failed: checksum mismatch",
    )


# ---- plans -----------------------------------------------------------------------------


def test_a_preempted_replica_leaves_the_others_serving_and_a_preempted_gang_goes_whole() -> None:
    deployment = work("dep-1", kind="inference", state="running", replicas=2)
    job = work("job-1", state="running")
    urgent = work("urgent", state="pending")  # the same tenant's: its reason names it
    store = StoreSnapshot(
        tenants=(),
        work=(deployment, job, urgent),
        allocations=(
            allocation("dep-1", 0, "a", ("gpu0",), kind="inference"),
            allocation("dep-1", 1, "b", ("gpu0",), kind="inference"),
            allocation("job-1", 0, "a", ("gpu1",)),
            allocation("job-1", 1, "b", ("gpu1",)),
        ),
        node_generations={},
    )
    inputs = build_inputs(0.0, [node("a"), node("b")], store)

    def preempt(work_id: str, member: int, node_id: str) -> Preemption:
        return Preemption(
            allocation_id=f"{work_id}/{member}",
            work_id=work_id,
            node_id=node_id,
            tenant="t1",
            priority="p1",
            reason="priority",
            preempted_by="urgent",
        )

    plan = Plan(
        now=0.0,
        placements=(),
        preemptions=(preempt("dep-1", 1, "b"), preempt("job-1", 0, "a")),
        pending=(),
        reservations=(),
        order=(),
    )
    translation = translate(plan, inputs, {})
    (eviction,) = translation.write.evictions
    assert (eviction.work_id, eviction.reason) == ("job-1", "preempted by urgent (priority)")
    (kept,) = translation.write.placements
    assert kept.work_id == "dep-1"
    assert [(a.member_index, a.node_id) for a in kept.allocations] == [(0, "a")]
    assert translation.evicted == 2


@pytest.mark.parametrize("reason", ["priority", "reclaim", "deadline"])
def test_a_victim_of_another_tenants_work_is_not_told_its_id(reason: PreemptionReason) -> None:
    # Another tenant's work is a 404 to a tenant: its id must not turn up in the
    # victim's reason either (nor in the work.state event the reason goes out in).
    victim = work("job-1", state="running")
    mine = dataclasses.replace(work("mine", state="pending"), priority="p0")
    theirs = dataclasses.replace(mine, work_id="theirs", tenant_id="t2")
    store = StoreSnapshot(
        tenants=(),
        work=(victim, mine, theirs),
        allocations=(allocation("job-1", 0, "a", ("gpu0",)),),
        node_generations={},
    )
    inputs = build_inputs(0.0, [node("a")], store)

    def reason_given(preempted_by: str) -> str:
        preemption = Preemption(
            allocation_id="job-1/0",
            work_id="job-1",
            node_id="a",
            tenant="t1",
            priority="p1",
            reason=reason,
            preempted_by=preempted_by,
        )
        plan = Plan(
            now=0.0,
            placements=(),
            preemptions=(preemption,),
            pending=(),
            reservations=(),
            order=(),
        )
        (eviction,) = translate(plan, inputs, {}).write.evictions
        return eviction.reason

    assert reason_given("theirs") == f"preempted by another tenant's p0 work ({reason})"
    assert reason_given("mine") == f"preempted by mine ({reason})"


def test_a_placed_deployment_short_of_replicas_is_queued_for_the_missing_ones() -> None:
    deployment = work("dep-1", kind="inference", state="running", replicas=3)
    store = StoreSnapshot(
        tenants=(),
        work=(deployment,),
        allocations=(allocation("dep-1", 0, "a", kind="inference"),),
        node_generations={},
    )
    inputs = build_inputs(0.0, [node("a", site="edge")], store)
    (queued,) = inputs.snapshot.queue
    assert (queued.work_id, queued.replicas, queued.min_replicas) == ("dep-1", 2, 1)  # type: ignore[union-attr]


# ---- the agent's side ------------------------------------------------------------------


def test_the_agent_takes_a_replica_on_its_own_devices_with_the_first_usable_provider() -> None:
    inventory = (device("cpu", 0), device("gpu", 0))

    def desired(ids: tuple[str, ...], providers: tuple[str, ...]) -> DesiredDeployment:
        return DesiredDeployment(
            deployment_id="dep-1", accelerator_kind="gpu", accelerator_ids=ids, providers=providers
        )

    preferred = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
    assert check_assignment(desired(("gpu0",), preferred), inventory) == (
        "CUDAExecutionProvider",
        None,
    )
    assert check_assignment(desired(("gpu7",), ()), inventory) == (
        None,
        "accelerator gpu7 is not on this node",
    )
    provider, refusal = check_assignment(desired(("gpu0",), ("QNNExecutionProvider",)), inventory)
    assert provider is None
    assert refusal is not None
    assert "QNNExecutionProvider" in refusal
    assert (
        check_assignment(desired(("cpu0",), ()), inventory)[1]
        == "accelerator cpu0 is a cpu, not a gpu"
    )


def test_a_failed_jobs_retry_backs_off_doubling_to_the_cap_and_waits_out_of_the_queue() -> None:
    flaky = work("job-1", state="running", max_retries=12, retry_backoff_s=60)
    waits = []
    for failures in range(12):
        failed = dataclasses.replace(flaky, failures=failures)
        outcome = after_failure(failed, "exit code 3", 1000.0)
        assert isinstance(outcome, Retry)
        waits.append(outcome.not_before - 1000.0)
    assert waits[:6] == [60, 120, 240, 480, 960, 1920]
    assert set(waits[6:]) == {MAX_BACKOFF_S}
    used_up = after_failure(dataclasses.replace(flaky, failures=12), "exit code 3", 1000.0)
    assert used_up == "exit code 3 (failed 13 times, 12 retries used)"
    assert after_failure(work("job-2"), "exit code 3", 0.0) == "exit code 3"  # no policy

    waiting = dataclasses.replace(flaky, state="pending", failures=1, not_before=1060.0)
    store = StoreSnapshot(tenants=(), work=(waiting,), allocations=(), node_generations={})
    assert build_inputs(1059.0, [node("a")], store).snapshot.queue == ()
    assert [w.work_id for w in build_inputs(1060.0, [node("a")], store).snapshot.queue] == ["job-1"]
