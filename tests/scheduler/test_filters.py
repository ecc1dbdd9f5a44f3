"""Behaviour 2: vectorised feasibility filters, one reason code per rejected node."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cloud.scheduler import (
    LabelRequirement,
    Node,
    Pending,
    Policy,
    StartWindow,
    Taint,
    Toleration,
)

from .builders import (
    NOW,
    LatencyByRegion,
    deployment,
    edge_node,
    gpu_node,
    job,
    plan_for,
    running,
)


def pending(plan_pending: Pending | None) -> Pending:
    assert plan_pending is not None
    return plan_pending


def test_reason_counts_add_up_and_read_well() -> None:
    nodes = [
        gpu_node("cloud-1"),  # wrong site for inference
        edge_node("cpu-only", kind="cpu", count=4, providers=("CPUExecutionProvider",)),
        edge_node("far-npu", region="edge-far"),
        edge_node("near-npu", region="edge-near", healthy=False),
    ]
    latency = LatencyByRegion({"edge-far": 80.0})
    plan = plan_for(
        nodes,
        [
            deployment(
                "vision",
                kinds=("npu",),
                latency_slo_ms=50,
                traffic_by_region={"edge-near": 1.0},
            )
        ],
        policy=Policy(latency_estimator=latency),
    )
    reason = pending(plan.pending_for("vision"))
    assert reason.code == "unschedulable"
    assert dict(reason.rejections) == {"health": 1, "site": 1, "kind": 1, "latency-slo": 1}
    assert sum(reason.rejections.values()) == reason.nodes_total == 4
    assert "0/4 nodes fit: 1 not ready, 1 not edge, 1 no NPU, 1 over latency SLO" in reason.message


@pytest.mark.parametrize(
    ("work_extra", "node", "code"),
    [
        ({}, gpu_node("n", healthy=False), "health"),
        ({"sites": ("edge",)}, gpu_node("n"), "site"),
        ({"accelerator_kind": "npu"}, gpu_node("n"), "kind"),
        ({"accelerator_models": ("H100",)}, gpu_node("n", model="A100"), "model"),
        ({"memory_bytes": 100 << 30}, gpu_node("n", memory_gib=80), "memory"),
        (
            {"node_selector": {"pool": "research"}},
            gpu_node("n", labels={"pool": "prod"}),
            "selector",
        ),
        ({}, gpu_node("n", taints=(Taint("dedicated", "ml"),)), "taint"),
        ({"host_memory_bytes": 64 << 30}, gpu_node("n", host_memory_gib=32), "host-memory"),
    ],
)
def test_each_training_filter_names_its_reason(
    work_extra: dict[str, Any], node: Node, code: str
) -> None:
    plan = plan_for([node], [job("j", 1, **work_extra)])
    reason = pending(plan.pending_for("j"))
    assert dict(reason.rejections) == {code: 1}


def test_count_filter_rejects_nodes_too_small_for_one_worker() -> None:
    plan = plan_for([gpu_node("small", 4), gpu_node("big", 8)], [job("j", 8)])
    assert [p.node_id for p in plan.placements] == ["big"]
    blocked = plan_for([gpu_node("small", 4)], [job("j", 8)])
    assert dict(pending(blocked.pending_for("j")).rejections) == {"count": 1}


def test_busy_nodes_are_counted_separately_from_unfit_ones() -> None:
    plan = plan_for(
        [gpu_node("full", 4), gpu_node("tiny", 1)],
        [job("j", 2, priority="p2")],
        allocations=[running("r", "full", 4, priority="p1")],
    )
    reason = pending(plan.pending_for("j"))
    assert reason.code == "capacity"
    assert dict(reason.rejections) == {"count": 1, "busy": 1}
    assert "0/2 nodes fit: 1 fewer than 2 GPU, 1 GPU busy" in reason.message


@pytest.mark.parametrize(
    ("requirement", "fits"),
    [
        (LabelRequirement("tier", "In", ("gold", "silver")), {"gold"}),
        (LabelRequirement("tier", "NotIn", ("gold",)), {"bronze", "plain"}),
        (LabelRequirement("tier", "Exists"), {"gold", "bronze"}),
        (LabelRequirement("tier", "DoesNotExist"), {"plain"}),
    ],
)
def test_affinity_operators(requirement: LabelRequirement, fits: set[str]) -> None:
    nodes = [
        gpu_node("gold", labels={"tier": "gold"}),
        gpu_node("bronze", labels={"tier": "bronze"}),
        gpu_node("plain"),
    ]
    plan = plan_for(nodes, [job(f"j{i}", 8, affinity=(requirement,)) for i in range(3)])
    assert {p.node_id for p in plan.placements} == fits


def test_toleration_lets_work_onto_a_tainted_node() -> None:
    node = gpu_node("n", taints=(Taint("dedicated", "ml"),))
    assert plan_for([node], [job("j", tolerations=(Toleration("dedicated"),))]).placements
    assert plan_for([node], [job("j", tolerations=(Toleration("dedicated", "ml"),))]).placements
    assert not plan_for([node], [job("j", tolerations=(Toleration("dedicated", "db"),))]).placements


def test_a_prefer_no_schedule_taint_is_avoided_while_anything_else_fits() -> None:
    soft = (Taint("dedicated", "camera", effect="PreferNoSchedule"),)
    nodes = [gpu_node("fenced", taints=soft), gpu_node("open")]
    plan = plan_for(nodes, [job("j", 8)])
    assert [p.node_id for p in plan.placements] == ["open"]
    # Tolerated, it is an ordinary node again; alone, it still takes the work.
    tolerated = plan_for(nodes, [job("j", 8, tolerations=(Toleration("dedicated"),))])
    assert {p.node_id for p in tolerated.placements} <= {"fenced", "open"}
    assert plan_for([gpu_node("fenced", taints=soft)], [job("j", 8)]).placements
    both = plan_for(nodes, [job("a", 8), job("b", 8)])
    assert {p.node_id for p in both.placements} == {"fenced", "open"}


def test_provider_filter_and_preference() -> None:
    nodes = [
        edge_node("qnn", providers=("QNNExecutionProvider",)),
        edge_node("cpu", kind="cpu", count=2, providers=("CPUExecutionProvider",)),
    ]
    plan = plan_for(nodes, [deployment("d", providers=("TensorrtExecutionProvider",))])
    assert dict(pending(plan.pending_for("d")).rejections) == {"provider": 2}
    plan = plan_for(
        nodes,
        [deployment("d", providers=("QNNExecutionProvider", "CPUExecutionProvider"), replicas=2)],
    )
    by_node = {p.node_id: p.provider for p in plan.placements}
    assert by_node == {"qnn": "QNNExecutionProvider", "cpu": "CPUExecutionProvider"}


def _hour(timestamp: float) -> int:
    return datetime.fromtimestamp(timestamp, UTC).hour


def test_start_window_uses_node_local_time() -> None:
    # NOW is 22:13 UTC: inside 20:00-06:00 in UTC, but 07:13 next day in Tokyo (UTC+9).
    assert _hour(NOW) == 22
    window = StartWindow.parse("20:00-06:00")
    nodes = [
        gpu_node("tokyo", timezone="Asia/Tokyo"),
        gpu_node("berlin-offset", utc_offset_minutes=60),
    ]
    plan = plan_for(
        nodes, [job("night", 8, start_window=window), job("night2", 8, start_window=window)]
    )
    assert [p.node_id for p in plan.placements] == ["berlin-offset"]
    reason = pending(plan.pending_for("night2"))
    assert reason.code == "capacity"  # Berlin is taken; Tokyo is outside its window
    assert reason.rejections["window"] == 1


def test_closed_window_defers_with_the_opening_time() -> None:
    window = StartWindow.parse("02:00-05:00")  # 02:00 UTC is 3h46m40s after NOW
    plan = plan_for([gpu_node("n")], [job("batch", start_window=window)])
    deferred = plan.deferrals
    assert [d.work_id for d in deferred] == ["batch"]
    assert deferred[0].retry_at is not None
    assert deferred[0].retry_at - NOW == 3 * 3600 + 46 * 60 + 40
    assert "opens at" in deferred[0].message


def test_window_is_waived_when_waiting_would_miss_the_deadline() -> None:
    window = StartWindow.parse("02:00-05:00")
    urgent = job("urgent", start_window=window, duration_s=3600, deadline=NOW + 4 * 3600)
    assert plan_for([gpu_node("n")], [urgent]).placements


def test_deadline_filter_rejects_slow_nodes() -> None:
    nodes = [gpu_node("slow", speed=0.5), gpu_node("fast", speed=2.0)]
    plan = plan_for(nodes, [job("j", 8, duration_s=3600, deadline=NOW + 5000)])
    assert [p.node_id for p in plan.placements] == ["fast"]
    impossible = plan_for(nodes, [job("k", 8, duration_s=3600, deadline=NOW + 600)])
    assert dict(pending(impossible.pending_for("k")).rejections) == {"deadline": 2}


def test_anti_affinity_is_symmetric() -> None:
    nodes = [gpu_node("n1"), gpu_node("n2")]
    database = [running("db", "n1", 1, priority="p0", preemptible=False, group="database")]
    plan = plan_for(nodes, [job("j", 1, anti_affinity_groups=("database",))], database)
    assert [p.node_id for p in plan.placements] == ["n2"]
    # Running work that avoids "noisy" keeps new "noisy" work away from its node too.
    quiet = [running("q", "n1", 1, priority="p0", anti_affinity_groups=("noisy",))]
    plan = plan_for(nodes, [job("k", 1, group="noisy")], quiet)
    assert [p.node_id for p in plan.placements] == ["n2"]
    both = plan_for([gpu_node("n1")], [job("k", 1, group="noisy")], quiet)
    assert dict(pending(both.pending_for("k")).rejections) == {"anti-affinity": 1}


def test_replica_limit_and_reason() -> None:
    plan = plan_for([edge_node("e1"), edge_node("e2", count=2)], [deployment("d", replicas=3)])
    reason = pending(plan.pending_for("d"))
    assert reason.code == "capacity"
    assert not plan.placements  # all-or-nothing by default
    assert reason.members_needed == 3
    assert "only 2 of 3 replicas fit" in reason.message


def _utc(iso: str) -> float:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("now", "window", "zone", "opens"),
    [
        # 00:00 EST; the window opens at 08:00 local, which is EDT by then (12:00Z).
        ("2024-03-10T05:00:00", "08:00-10:00", "America/New_York", "2024-03-10T12:00:00"),
        # 00:00 EDT; 08:00 local is EST again by then (13:00Z).
        ("2024-11-03T04:00:00", "08:00-10:00", "America/New_York", "2024-11-03T13:00:00"),
        # 00:30 CET; Berlin springs forward at 02:00, so 10:00 local is CEST (08:00Z).
        ("2024-03-30T23:30:00", "10:00-12:00", "Europe/Berlin", "2024-03-31T08:00:00"),
        # No change in Tokyo.
        ("2024-01-10T01:00:00", "20:00-06:00", "Asia/Tokyo", "2024-01-10T11:00:00"),
    ],
)
def test_window_opening_is_exact_across_daylight_saving_changes(
    now: str, window: str, zone: str, opens: str
) -> None:
    node = gpu_node("n", timezone=zone)
    plan = plan_for([node], [job("j", start_window=StartWindow.parse(window))], now=_utc(now))
    reason = pending(plan.pending_for("j"))
    assert reason.code == "window"
    assert reason.retry_at == _utc(opens)


def test_a_latency_slo_without_an_estimator_is_never_silently_ignored() -> None:
    d = deployment("d", kinds=("npu",), latency_slo_ms=20.0, traffic_by_region={"eu": 1.0})
    plan = plan_for([edge_node("far", region="ap")], [d])
    assert plan.placements == ()
    reason = pending(plan.pending_for("d"))
    assert reason.code == "unschedulable"
    assert dict(reason.rejections) == {"slo-unverifiable": 1}
    assert "latency SLO cannot be checked: no latency estimator configured" in reason.message
    # Without an SLO nothing needs checking.
    assert plan_for([edge_node("far", region="ap")], [deployment("d", kinds=("npu",))]).placements


def test_a_waived_window_is_recorded_and_explained() -> None:
    window = StartWindow.parse("02:00-05:00")
    urgent = job("urgent", start_window=window, duration_s=3600, deadline=NOW + 4 * 3600)
    (placement,) = plan_for([gpu_node("n")], [urgent]).placements
    assert placement.window_waived
    assert "start window 02:00-05:00 waived to meet the deadline" in placement.explain()
    # Inside its window (22:13 UTC is within 20:00-06:00) nothing is waived.
    relaxed = job("relaxed", start_window=StartWindow.parse("20:00-06:00"), deadline=NOW + 7200)
    (placement,) = plan_for([gpu_node("n")], [relaxed]).placements
    assert not placement.window_waived
    assert "waived" not in placement.explain()
