"""Behaviour 3: weighted, normalised scoring; per-job weights; the ScoreTerm hook."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cloud.scheduler import Candidates, Policy, Snapshot, TermValues, Work
from cloud.scheduler.arrays import FloatArray
from cloud.scheduler.scoring import packing_and_load, packing_and_load_one

from .builders import deployment, edge_node, gpu_node, job, nodes_of, plan_for, running


def test_packing_keeps_a_free_8_gpu_node_whole_when_a_fragment_fits() -> None:
    nodes = [gpu_node("empty-8"), gpu_node("fragment-8"), gpu_node("empty-4", 4)]
    allocations = [running("r", "fragment-8", 6, priority="p1")]
    plan = plan_for(nodes, [job("one-gpu", 1)], allocations)
    assert nodes_of(plan, "one-gpu") == ["fragment-8"]
    # And then the 8-GPU job still has its whole node.
    plan = plan_for(
        nodes, [job("big", 8, submitted_at=0), job("one-gpu", 1, submitted_at=1)], allocations
    )
    assert nodes_of(plan, "big") == ["empty-8"]
    assert nodes_of(plan, "one-gpu") == ["fragment-8"]


def test_packing_prefers_the_smaller_empty_node() -> None:
    plan = plan_for([gpu_node("eight"), gpu_node("two", 2)], [job("j", 1)])
    assert nodes_of(plan, "j") == ["two"]


def test_load_prefers_nodes_under_the_threshold() -> None:
    nodes = [gpu_node("hot", utilisation=0.9), gpu_node("warm", utilisation=0.5)]
    plan = plan_for(nodes, [job("j", 1)])
    assert nodes_of(plan, "j") == ["warm"]
    chosen = plan.placements[0].chosen
    assert chosen.term("load").value == 1.0
    runner = plan.placements[0].runners_up[0]
    assert runner.node_id == "hot"
    assert runner.term("load").value == (1 - 0.9) / (1 - 0.6)


def test_load_threshold_is_a_policy_setting() -> None:
    nodes = [gpu_node("a", utilisation=0.5), gpu_node("b", utilisation=0.3)]
    relaxed = plan_for(nodes, [job("j", 1)], policy=Policy(load_threshold=0.6))
    # Both under 60%: a tie on load, broken by node order.
    assert nodes_of(relaxed, "j") == ["a"]
    strict = plan_for(nodes, [job("j", 1)], policy=Policy(load_threshold=0.4))
    assert nodes_of(strict, "j") == ["b"]


def test_speed_prefers_faster_accelerators() -> None:
    nodes = [gpu_node("v100", model="V100", speed=0.6), gpu_node("h100", model="H100", speed=2.5)]
    plan = plan_for(nodes, [job("j", 8)])
    assert nodes_of(plan, "j") == ["h100"]
    assert plan.placements[0].expected_end is not None
    assert plan.placements[0].expected_end - plan.now == 3600 / 2.5


def test_per_job_weights_override_the_policy() -> None:
    nodes = [gpu_node("fast-empty", speed=2.0), gpu_node("slow-fragment", speed=0.5)]
    allocations = [running("r", "slow-fragment", 7, priority="p1")]
    packer = plan_for(
        nodes, [job("j", 1)], allocations, policy=Policy(weights={"packing": 1.0, "speed": 0.1})
    )
    assert nodes_of(packer, "j") == ["slow-fragment"]
    racer = plan_for(
        nodes,
        [job("j", 1, score_weights={"packing": 0.0, "speed": 5.0})],
        allocations,
        policy=Policy(weights={"packing": 1.0, "speed": 0.1}),
    )
    assert nodes_of(racer, "j") == ["fast-empty"]


def test_kind_preference_order_for_inference() -> None:
    nodes = [
        edge_node("gpu-box", kind="gpu", providers=("CUDAExecutionProvider",)),
        edge_node("npu-box"),
    ]
    assert nodes_of(plan_for(nodes, [deployment("d", kinds=("npu", "gpu"))]), "d") == ["npu-box"]
    assert nodes_of(plan_for(nodes, [deployment("d", kinds=("gpu", "npu"))]), "d") == ["gpu-box"]


@dataclass(frozen=True)
class FakeCarbon:
    """Lower is better: grams of CO2 per zone, from a table."""

    grams: dict[str, float]

    @property
    def name(self) -> str:
        return "carbon"

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues:
        zones = snapshot.nodes.zone_code[candidates.nodes]
        table = np.array([self.grams[z] for z in snapshot.nodes.zones])
        raw: FloatArray = table[zones] * candidates.accelerators
        return TermValues(self.name, raw, higher_is_better=False)


def test_score_term_extension_point() -> None:
    nodes = [gpu_node("coal", zone="PL"), gpu_node("hydro", zone="NO")]
    carbon = FakeCarbon({"PL": 700.0, "NO": 20.0})
    plan = plan_for(nodes, [job("j", 8)], policy=Policy(score_terms=(carbon,)))
    placement = plan.placements[0]
    assert placement.node_id == "hydro"
    assert placement.chosen.term("carbon").value == 1.0  # normalised: best = 1
    assert placement.runners_up[0].term("carbon").value == 0.0
    assert placement.chosen.term("carbon").weight == 1.0
    # Weight 0 per job: the term no longer decides (node order does).
    plan = plan_for(
        nodes, [job("j", 8, score_weights={"carbon": 0.0})], policy=Policy(score_terms=(carbon,))
    )
    assert plan.placements[0].node_id == "coal"


def test_breakdown_total_is_the_weighted_sum() -> None:
    plan = plan_for([gpu_node("a", utilisation=0.7), gpu_node("b", 4)], [job("j", 2)])
    for breakdown in (plan.placements[0].chosen, *plan.placements[0].runners_up):
        total = sum(t.value * t.weight for t in breakdown.terms)
        assert abs(total - breakdown.total) < 1e-9


def test_scalar_and_vectorised_packing_and_load_are_bit_identical() -> None:
    # One formula for scoring (vectorised), re-scoring one node and explaining.
    rng = np.random.default_rng(3)
    capacity = rng.choice([1, 2, 4, 8, 16], size=500)
    free = rng.integers(0, capacity + 1)
    inv_capacity = 1.0 / capacity
    base = rng.random(500)
    delta = rng.integers(-4, 5, size=500)
    packing, load = packing_and_load(free, 1, inv_capacity, base, delta, 0.6)
    for i in range(500):
        one = packing_and_load_one(
            int(free[i]), 1, float(inv_capacity[i]), float(base[i]), int(delta[i]), 0.6
        )
        assert one == (float(packing[i]), float(load[i]))
    assert load.min() >= 0.0
    assert load.max() <= 1.0
