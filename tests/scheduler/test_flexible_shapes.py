"""Flexible shapes: a job that declares alternative gang shapes is placed in the one
whose placement scores best, and says so."""

from __future__ import annotations

import pytest

from cloud.green.latency import ServingLatency
from cloud.green.policies import GreenInputs, build_policy
from cloud.scheduler import GangShape, Placement, Policy, Snapshot, TrainingJob, schedule
from cloud.scheduler.unschedulable import never_fits
from shared.errors import FieldError
from tests.green.builders import T0, flat, gpu_server, grid, running_on, snapshot

INPUTS = GreenInputs(
    signals=grid(flat("CLEAN", 30.0), flat("DIRTY", 600.0)), latency=ServingLatency(rtt_ms={})
)
# One 8-GPU node in a dirty zone, two 4-GPU nodes in a clean one (one region).
NODES = [
    gpu_server("dirty-8", "DIRTY", count=8),
    gpu_server("clean-4a", "CLEAN", count=4),
    gpu_server("clean-4b", "CLEAN", count=4),
]
ONE_BY_EIGHT = GangShape(1, 8)
TWO_BY_FOUR = GangShape(2, 4)


def job(**kwargs: object) -> TrainingJob:
    fields: dict[str, object] = {"workers": 1, "accelerators_per_worker": 8}
    fields.update(kwargs)
    return TrainingJob(work_id="j", tenant="t", submitted_at=T0, **fields)  # type: ignore[arg-type]


def placements(work: TrainingJob, policy: Policy) -> tuple[Placement, ...]:
    return schedule(snapshot(NODES, [work]), policy).placements_for("j")


def test_green_reshapes_onto_the_clean_nodes_and_says_so() -> None:
    placed = placements(job(alternative_shapes=(TWO_BY_FOUR,)), build_policy("green", INPUTS))
    assert sorted(p.node_id for p in placed) == ["clean-4a", "clean-4b"]
    assert [p.accelerators for p in placed] == [4, 4]
    assert all(p.declared_shape == ONE_BY_EIGHT for p in placed)
    assert placed[0].reshaped == "reshaped to 2×4 (declared 1×8)"
    assert "reshaped to 2×4 (declared 1×8)" in placed[0].explain()


def test_without_alternatives_green_runs_the_declared_shape_on_the_dirty_node() -> None:
    placed = placements(job(), build_policy("green", INPUTS))
    assert [(p.node_id, p.accelerators, p.declared_shape) for p in placed] == [("dirty-8", 8, None)]
    assert "reshaped" not in placed[0].explain()


def test_a_carbon_blind_policy_keeps_the_declared_shape_when_packing_ties() -> None:
    # Both shapes fill their nodes exactly: packing cannot tell them apart, so the
    # declared shape (tried first) is kept.
    placed = placements(
        job(alternative_shapes=(TWO_BY_FOUR,)), build_policy("fifo-binpack", INPUTS)
    )
    assert [(p.node_id, p.declared_shape) for p in placed] == [("dirty-8", None)]


def test_the_declared_shape_busy_an_alternative_runs_at_once() -> None:
    busy = [*NODES[1:], gpu_server("dirty-8", "DIRTY", count=4)]  # no 8-GPU room anywhere
    plan = schedule(
        snapshot(busy, [job(alternative_shapes=(TWO_BY_FOUR,))]),
        build_policy("fifo-binpack", INPUTS),
    )
    placed = plan.placements_for("j")
    assert len(placed) == 2
    assert all(p.declared_shape == ONE_BY_EIGHT for p in placed)
    # Without the alternative the fleet could never run it: it waits, saying why.
    plan = schedule(snapshot(busy, [job()]), build_policy("fifo-binpack", INPUTS))
    assert not plan.placements
    assert plan.pending[0].code == "unschedulable"


def half_used_and_empty() -> Snapshot:
    """Two 8-GPU nodes in the clean zone, one with 3 GPUs busy and one empty, and two
    4-GPU nodes in the dirty zone (as the evaluation's fleet was when a 1×8 job split
    over its two Los Angeles H100 nodes and the next 8-GPU jobs waited for hours)."""
    nodes = [
        gpu_server("clean-8a", "CLEAN", count=8),
        gpu_server("clean-8b", "CLEAN", count=8),
        gpu_server("dirty-4a", "DIRTY", count=4),
        gpu_server("dirty-4b", "DIRTY", count=4),
    ]
    busy = TrainingJob(
        work_id="busy", tenant="t", submitted_at=T0, accelerators_per_worker=3, duration_s=7200
    )
    return Snapshot.build(
        now=T0,
        nodes=nodes,
        allocations=[running_on("clean-8a", busy)],
        queue=[job(alternative_shapes=(TWO_BY_FOUR,))],
    )


def test_green_keeps_the_declared_shape_where_it_fits_whole_on_capacity_as_clean() -> None:
    # The job fits whole on the empty node, as clean and as fast as two halves: the
    # declared shape wins on packing. Its carbon is judged against the same dirtiest
    # node as the 2×4's (the 4-GPU nodes it cannot use count for its scale), so the
    # dirty 4-GPU nodes that only the halves could use do not make the halves look
    # cleaner than the whole (they did: carbon 0.00 for the 1×8 on the clean node,
    # whose own candidates were all as clean, 0.95 for each half).
    placed = schedule(half_used_and_empty(), build_policy("green", INPUTS)).placements_for("j")
    assert [(p.node_id, p.accelerators, p.declared_shape) for p in placed] == [
        ("clean-8b", 8, None)
    ]
    assert placed[0].chosen.term("carbon").value > 0.9


def test_no_shape_fits_the_job_waits_as_declared() -> None:
    work = job(workers=1, accelerators_per_worker=16, alternative_shapes=(GangShape(2, 8),))
    plan = schedule(snapshot(NODES, [work]), build_policy("green", INPUTS))
    assert not plan.placements
    # The 2×8 alternative could never fit either (one 8-GPU node), so the declared
    # shape's verdict is the one given.
    assert plan.pending[0].code == "unschedulable"
    assert plan.pending[0].members_needed == 1


@pytest.mark.parametrize(
    ("alternatives", "reason"),
    [
        ((GangShape(1, 8),), "repeats the declared shape"),
        ((TWO_BY_FOUR, TWO_BY_FOUR), "repeats the declared shape or another"),
        ((GangShape(2, 2),), "asks for 4 accelerators in all; the declared 1×8 asks for 8"),
        ((GangShape(0, 8),), "workers and accelerators_per_worker are >= 1"),
        (tuple(GangShape(8 // n, n) for n in (1, 2, 4)) + (GangShape(8, 1),) * 2, "at most 4"),
    ],
)
def test_bad_alternatives_are_refused_naming_the_field(
    alternatives: tuple[GangShape, ...], reason: str
) -> None:
    with pytest.raises(FieldError, match=reason) as refused:
        job(alternative_shapes=alternatives)
    assert refused.value.path == ("alternative_shapes",)


def test_the_reshaped_copy_records_the_declared_shape() -> None:
    declared = job(alternative_shapes=(TWO_BY_FOUR, GangShape(4, 2)))
    copy = declared.reshaped(TWO_BY_FOUR)
    assert (copy.workers, copy.accelerators_per_worker) == (2, 4)
    assert copy.alternative_shapes == ()
    assert copy.declared_shape == ONE_BY_EIGHT
    assert declared.shape == ONE_BY_EIGHT
    assert str(TWO_BY_FOUR) == "2×4"


def test_the_fleet_could_run_a_job_when_any_of_its_shapes_could() -> None:
    four_gpu_servers = snapshot([gpu_server(name, "CLEAN", count=4) for name in ("a", "b")])
    declared_only = never_fits(four_gpu_servers, job())
    assert declared_only is not None
    assert declared_only.field == "accelerators_per_worker"
    assert never_fits(four_gpu_servers, job(alternative_shapes=(TWO_BY_FOUR,))) is None
