"""How long the migrator takes to look at a large cluster (docs/green.md#migration).

    python benchmarks/migration_bench.py                        # 10,000 nodes, 2,000 running
    python benchmarks/migration_bench.py --nodes 1000 --running 200 --runs 5
    python benchmarks/migration_bench.py --waiting 10000     # and making room (room.py)

A synthetic cluster: ``--nodes`` 8-GPU nodes spread over four zones of flat
intensity (600, 300, 100 and 50 gCO2eq/kWh), every node running one 4-GPU job
(so half of every node is free), of which ``--running`` checkpoint and may move.
One look is ``Migrator.propose`` with the green policy: the cheap filter over
every running job, then trial placements on the real core for the dirtiest. Prints
the median, fastest and slowest look over ``--runs`` and how many moves it found.

``--waiting N`` also times one look of the room maker (``RoomMaker.propose``,
docs/green.md#making-room) with N queued 8-GPU jobs that the pass left waiting for
room (every node has 4 GPUs free, none 8): the worst case for it, every waiting job
a candidate and every node one to make room on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from cloud.green import GreenInputs, Migrator, RunningJob, build_policy, default_latency_estimator
from cloud.green.room import RoomMaker
from cloud.scheduler import AcceleratorPool, Allocation, Node, Snapshot, TrainingJob, schedule
from cloud.signals.grid import GridSignals, ZoneSeries

NOW = 1_686_794_400.0  # 2023-06-15T02:00:00Z
HOUR = 3600.0
ZONES = {"A": 600.0, "B": 300.0, "C": 100.0, "D": 50.0}


def node(index: int) -> Node:
    zone = tuple(ZONES)[index % len(ZONES)]
    return Node(
        node_id=f"n{index:05d}",
        site="cloud",
        zone=zone,
        region="r",
        pools=(
            AcceleratorPool(
                kind="gpu", count=8, model="A100", idle_power_w=50.0, max_power_w=400.0
            ),
            AcceleratorPool(kind="cpu", count=1, idle_power_w=100.0, max_power_w=500.0),
        ),
    )


def job(index: int, gpus: int = 4, prefix: str = "j") -> TrainingJob:
    return TrainingJob(
        work_id=f"{prefix}{index:05d}",
        tenant="t",
        submitted_at=NOW - 2 * HOUR,
        accelerators_per_worker=gpus,
        duration_s=10 * HOUR,
        checkpoint_interval_s=1800.0,
    )


def running_on(node_id: str, work: TrainingJob) -> Allocation:
    return Allocation(
        allocation_id=f"{work.work_id}/0",
        work_id=work.work_id,
        work_kind="training",
        tenant=work.tenant,
        priority=work.priority,
        preemptible=True,
        node_id=node_id,
        accelerator_kind="gpu",
        accelerators=4,
        started_at=NOW - 2 * HOUR,
        expected_end=NOW + 8 * HOUR,
    )


def signals() -> GridSignals:
    start = NOW - 24 * HOUR
    return GridSignals(
        now_s=NOW,
        zones={
            zone: ZoneSeries(
                zone=zone,
                start_s=start,
                carbon_g_per_kwh=np.full(96, value),
                price_per_mwh=np.full(96, 50.0),
                currency="USD",
            )
            for zone, value in ZONES.items()
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=2_000, help="jobs that may move")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--waiting", type=int, default=0, help="queued 8-GPU jobs for the room maker to time"
    )
    args = parser.parse_args(argv)
    nodes = [node(i) for i in range(args.nodes)]
    jobs = [job(i) for i in range(args.nodes)]
    snapshot = Snapshot.build(
        now=NOW,
        nodes=nodes,
        allocations=[running_on(n.node_id, j) for n, j in zip(nodes, jobs, strict=True)],
    )
    grid = signals()
    inputs = GreenInputs(signals=grid, latency=default_latency_estimator())
    policy = build_policy("green", inputs)
    migrator = Migrator(grid)
    running = [RunningJob(job=j, started_s=NOW - 2 * HOUR, speed=1.0) for j in jobs[: args.running]]
    times, moves = [], 0
    for _ in range(args.runs):
        began = time.perf_counter()
        moves = len(migrator.propose(snapshot, running, policy))
        times.append(time.perf_counter() - began)
    print(
        f"nodes {args.nodes}, running jobs that may move {args.running}: "
        f"median {statistics.median(times):.3f} s (fastest {min(times):.3f}, "
        f"slowest {max(times):.3f}) over {args.runs} looks; {moves} moves found"
    )
    if args.waiting:
        queue = [job(i, gpus=8, prefix="w") for i in range(args.waiting)]
        queued = Snapshot.build(now=NOW, nodes=nodes, allocations=snapshot.allocations, queue=queue)
        plan = schedule(queued, policy)
        maker = RoomMaker(migrator)
        times = []
        for _ in range(args.runs):
            began = time.perf_counter()
            moves = len(maker.propose(snapshot, queue, plan, running, policy))
            times.append(time.perf_counter() - began)
        print(
            f"room maker, {args.waiting} waiting for room: median "
            f"{statistics.median(times):.3f} s (fastest {min(times):.3f}, slowest "
            f"{max(times):.3f}) over {args.runs} looks; {moves} moves found"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
