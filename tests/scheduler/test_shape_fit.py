"""Shape fit (issue 30): packing that keeps free capacity in shapes the queue can use,
weighed by what each node's capacity is worth (``Policy.capacity_value``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cloud.scheduler import Policy, Snapshot
from cloud.scheduler.arrays import FloatArray
from cloud.scheduler.scoring import ShapeFit, shape_fit, shape_fit_one

from .builders import gpu_node, job, nodes_of, plan_for, running


class EveryNodeCounts:
    """A capacity value of 1 everywhere: fragmentation matters on every node alike."""

    def node_values(self, snapshot: Snapshot, column: int) -> FloatArray:
        return np.ones(snapshot.node_count)


def test_unusable_counts_the_free_accelerators_no_expected_member_can_use() -> None:
    # Members of 4 and 8 accelerators, equally wanted.
    fit = ShapeFit.for_demand({4: 8.0, 8: 8.0}, 8, np.ones(1))
    assert fit.unusable.tolist() == [0, 1, 2, 3, 2, 3, 4, 5, 0]
    # No demand: nothing is ever unusable, so shape fit is neutral.
    assert ShapeFit.for_demand({}, 8, np.ones(1)).unusable.tolist() == [0.0] * 9


def test_a_small_job_takes_the_awkward_remainder_so_two_4_gpu_jobs_still_fit() -> None:
    # Plain packing ties between the 4-GPU node (2 of 4 left) and the 8-GPU node with
    # 6 free (4 of 8 left) and breaks the tie by name: the 4-GPU node, after which only
    # one of the two 4-GPU jobs finds room. Shape fit puts the pair on the 8-GPU node.
    nodes = [gpu_node("a-four", 4), gpu_node("b-eight", 8)]
    allocations = [running("r", "b-eight", 2, priority="p1")]
    queue = [
        job("pair", 2, submitted_at=0),
        job("quad-1", 4, submitted_at=1),
        job("quad-2", 4, submitted_at=2),
    ]
    plain = plan_for(nodes, queue, allocations)
    assert nodes_of(plain, "pair") == ["a-four"]
    assert not nodes_of(plain, "quad-2")

    fitted = plan_for(nodes, queue, allocations, policy=Policy(capacity_value=EveryNodeCounts()))
    assert nodes_of(fitted, "pair") == ["b-eight"]
    assert sorted(nodes_of(fitted, "quad-1") + nodes_of(fitted, "quad-2")) == ["a-four", "b-eight"]
    # The explanation's packing figure is the blended one the choice was made on.
    chosen = fitted.placements_for("pair")[0].chosen
    runner_up = fitted.placements_for("pair")[0].runners_up[0]
    assert chosen.term("packing").value > runner_up.term("packing").value


@given(
    st.dictionaries(st.sampled_from([1, 2, 3, 4, 8]), st.floats(0.1, 100.0), max_size=5),
    st.lists(st.integers(0, 8), min_size=1, max_size=20),
    st.integers(1, 8),
    st.floats(0.0, 1.0),
)
def test_the_scalar_fit_gives_the_same_bits_as_the_vector_one(
    demand: dict[int, float], free: list[int], accelerators: int, value: float
) -> None:
    values = np.full(len(free), value)
    fit = ShapeFit.for_demand(demand, 8, values)
    frees = np.array(free)
    inv_capacity = np.full(len(free), 1.0 / 8)
    vector = shape_fit(fit, frees, accelerators, inv_capacity, slice(None))
    for node, count in enumerate(free):
        assert shape_fit_one(fit, count, accelerators, 1.0 / 8, node) == vector[node]
        assert 0.0 <= vector[node] <= 1.0


def test_a_node_running_more_than_its_healthy_capacity_never_breaks_the_pass() -> None:
    # Devices that fail under running work leave the node's pool smaller than what runs
    # there (free < 0 until the work ends). The fit must read that as "nothing free",
    # not index its table from the end, or raise once the deficit exceeds the table.
    nodes = [gpu_node("a-shrunk", 1), gpu_node("b-eight", 8), gpu_node("c-four", 4)]
    allocations = [
        running("r", "a-shrunk", 16, priority="p1"),
        running("s", "c-four", 6, priority="p1"),
    ]
    queue = [job("quad", 4, submitted_at=0), job("one", 1, submitted_at=1)]
    plan = plan_for(nodes, queue, allocations, policy=Policy(capacity_value=EveryNodeCounts()))
    assert nodes_of(plan, "quad") == ["b-eight"]
    assert nodes_of(plan, "one") == ["b-eight"]


def test_the_fit_of_an_overcommitted_node_is_that_of_a_full_one() -> None:
    fit = ShapeFit.for_demand({4: 1.0, 8: 1.0}, 8, np.ones(3))
    frees = np.array([-16, -3, 0])
    vector = shape_fit(fit, frees, 2, np.full(3, 1.0 / 8), slice(None))
    assert vector[0] == vector[1] == vector[2]
    assert shape_fit_one(fit, -16, 2, 1.0 / 8, 0) == vector[2]
