"""A gang stays within one region by default (or one zone or rack, or spans when it
says so), and never mixes speed classes when one class would finish it sooner: on
the plain path and on the preemption path (cloud/scheduler/topology.py,
cloud/scheduler/speed_mixing.py)."""

from __future__ import annotations

from .builders import NOW, gpu_node, job, nodes_of, plan_for, running


def three_sites() -> list:  # type: ignore[type-arg]
    # The quiet Frankfurt node scores below the other two, so a placement that ignored
    # topology would take Los Angeles and the first Frankfurt node.
    return [
        gpu_node("la-0", 4, region="us-west2", zone="US-CAL-CISO"),
        gpu_node("fra-0", 4, region="europe-west3", zone="DE"),
        gpu_node("fra-1", 4, region="europe-west3", zone="DE", utilisation=0.95),
    ]


def test_a_gang_stays_within_one_region_by_default() -> None:
    plan = plan_for(three_sites(), [job("gang", 4, workers=2)])
    assert sorted(nodes_of(plan, "gang")) == ["fra-0", "fra-1"]


def test_a_gang_that_no_region_holds_now_waits_and_says_why() -> None:
    # Frankfurt's second node is busy: one free node per region, two workers.
    busy = [running("busy", "fra-1", 4, priority="p0", preemptible=False)]
    plan = plan_for(three_sites(), [job("gang", 4, workers=2)], busy)
    assert nodes_of(plan, "gang") == []
    pending = plan.pending_for("gang")
    assert pending is not None
    assert pending.code == "capacity"
    assert pending.message.startswith(
        "needs 2 workers × 4 GPU within one region (topology): the roomiest region, "
    )
    assert "has room for 1 now" in pending.message


def test_a_gang_no_region_could_ever_hold_is_unschedulable_naming_topology() -> None:
    plan = plan_for(three_sites()[:2], [job("gang", 4, workers=2)])
    pending = plan.pending_for("gang")
    assert pending is not None
    assert pending.code == "unschedulable"
    assert pending.never_fits is not None
    assert pending.never_fits.field == "topology"
    assert "no one region could ever hold the gang's 2 workers of 4 GPU" in (
        pending.never_fits.reason
    )


def test_a_gang_may_span_regions_when_it_asks() -> None:
    plan = plan_for(three_sites()[:2], [job("gang", 4, workers=2, topology="any")])
    assert sorted(nodes_of(plan, "gang")) == ["fra-0", "la-0"]


def test_a_gang_asks_for_one_zone() -> None:
    nodes = [
        gpu_node("de-0", 4, region="eu", zone="DE"),
        gpu_node("fr-0", 4, region="eu", zone="FR", utilisation=0.9),
        gpu_node("fr-1", 4, region="eu", zone="FR", utilisation=0.9),
    ]
    plan = plan_for(nodes, [job("gang", 4, workers=2, topology="zone")])
    assert sorted(nodes_of(plan, "gang")) == ["fr-0", "fr-1"]
    # By region (the default) the quieter node in the other zone is fine.
    plan = plan_for(nodes, [job("gang", 4, workers=2)])
    assert "de-0" in nodes_of(plan, "gang")


def test_a_gang_asks_for_one_rack_and_nodes_without_a_rack_are_no_rack() -> None:
    nodes = [
        gpu_node("bare", 4),
        gpu_node("r1-a", 4, labels={"rack": "r1"}),
        gpu_node("r2-a", 4, labels={"rack": "r2"}, utilisation=0.9),
        gpu_node("r2-b", 4, labels={"rack": "r2"}, utilisation=0.9),
    ]
    plan = plan_for(nodes, [job("gang", 4, workers=2, topology="rack")])
    assert sorted(nodes_of(plan, "gang")) == ["r2-a", "r2-b"]
    unracked = [gpu_node("a", 4), gpu_node("b", 4)]
    plan = plan_for(unracked, [job("gang", 4, workers=2, topology="rack")])
    pending = plan.pending_for("gang")
    assert pending is not None
    assert pending.never_fits is not None
    assert "no node has a rack label" in pending.never_fits.reason


def test_a_single_worker_ignores_topology() -> None:
    plan = plan_for(three_sites()[:1], [job("solo", 4, topology="rack")])
    assert nodes_of(plan, "solo") == ["la-0"]


def test_a_gang_placed_by_preemption_keeps_to_one_speed_class() -> None:
    # The case: eight H100s held by lower-priority work, four V100s free. Mixed,
    # the gang would run at the V100s' pace (8,000 s); on the H100s alone, 1,440 s.
    nodes = [
        gpu_node("h100", 8, model="H100", speed=2.5),
        gpu_node("v100", 4, model="V100", speed=0.45),
    ]
    holders = [running(f"low-{i}", "h100", 1, priority="p2") for i in range(8)]
    plan = plan_for(nodes, [job("gang", 1, workers=8, priority="p0")], holders)
    assert nodes_of(plan, "gang") == ["h100"] * 8
    assert {p.expected_end for p in plan.placements} == {NOW + 3600.0 / 2.5}
    assert len(plan.preemptions) == 8


def test_a_gang_waits_for_one_speed_class_when_that_finishes_sooner() -> None:
    # Six H100s free and two ending in ten minutes; two V100s free. Mixed now: done in
    # 8,000 s (V100 pace); waiting ten minutes for eight H100s: done in 2,040 s.
    nodes = [
        gpu_node("h100", 8, model="H100", speed=2.5),
        gpu_node("v100", 2, model="V100", speed=0.45),
    ]
    busy = [running("busy", "h100", 2, preemptible=False, expected_end=NOW + 600)]
    plan = plan_for(nodes, [job("gang", 1, workers=8)], busy)
    assert nodes_of(plan, "gang") == []
    pending = plan.pending_for("gang")
    assert pending is not None
    assert pending.code in ("capacity", "reserved")
    assert pending.message.startswith(
        "waiting for one speed class: all workers on H100 would finish in 0.6 h "
        "(starting in 0.2 h), sooner than a mixed placement at its slowest member's pace "
        "(2.2 h)"
    )


def test_a_gang_mixes_classes_when_waiting_would_finish_later() -> None:
    nodes = [
        gpu_node("h100", 8, model="H100", speed=2.5),
        gpu_node("v100", 2, model="V100", speed=0.45),
    ]
    busy = [running("busy", "h100", 2, preemptible=False, expected_end=NOW + 20_000)]
    plan = plan_for(nodes, [job("gang", 1, workers=8)], busy)
    assert sorted(nodes_of(plan, "gang")) == ["h100"] * 6 + ["v100"] * 2


def test_a_gang_goes_where_its_best_member_goes_when_that_region_holds_it() -> None:
    # The best node is in a small region with room for exactly the gang; four roomier
    # regions score a little lower. The gang keeps to the best node's region, however
    # many roomier regions there are (the domain search alone tries the roomiest four).
    nodes = [
        gpu_node("best-0", 4, region="small"),
        gpu_node("best-1", 4, region="small", utilisation=0.9),
    ]
    for region in ("r1", "r2", "r3", "r4"):
        nodes += [gpu_node(f"{region}-{i}", 4, region=region, utilisation=0.5) for i in range(3)]
    plan = plan_for(nodes, [job("gang", 4, workers=2)])
    assert sorted(nodes_of(plan, "gang")) == ["best-0", "best-1"]
