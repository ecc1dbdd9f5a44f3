"""Scheduler core benchmark: a heterogeneous synthetic cluster and queue, one pass.

    greenfed bench scheduler --nodes 10000 --jobs 20000 --json
    greenfed bench scheduler --sweep
    python benchmarks/scheduler_bench.py ...   (the same, from a source checkout)

The cluster mixes 8xH100, 4xA100 and 8xV100 servers, T4 boxes and edge devices
(NPUs, small GPUs, CPU-only), about a fifth of it already busy with running
work of mixed priority; the queue mixes single-GPU to multi-node gang training with
multi-replica inference deployments from 20 tenants in 4 cohorts, with quotas.
The GPUs' figures come from shared.accelerators. The clock used for timing stays
here: the core itself never reads one.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Sequence

from cloud.scheduler import (
    AcceleratorPool,
    Allocation,
    InferenceDeployment,
    Node,
    Policy,
    Scheduler,
    Snapshot,
    StartWindow,
    Taint,
    Tenant,
    Toleration,
    TrainingJob,
    Work,
)
from shared.accelerators import ACCELERATORS, AcceleratorFacts, required
from shared.messages import AcceleratorKind
from shared.work_literals import PriorityClass

GIB = 1 << 30
NOW = 1_700_000_000.0
SWEEP_NODES = (1000, 5000, 10000, 50000)
CLOUD_REGIONS = tuple(f"cloud-{i}" for i in range(6))
EDGE_REGIONS = tuple(f"edge-{i}" for i in range(12))
ZONES = ("DE", "FR", "CA-ON", "US-CAL-CISO", "GB", "SE")
TENANTS = tuple(f"tenant-{i:02d}" for i in range(20))
PROVIDERS_NPU = ("QNNExecutionProvider", "CPUExecutionProvider")
PROVIDERS_GPU = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider")

# (share of nodes, site, pools factory)
_SERVER_TYPES = (
    (0.05, "h100"),
    (0.10, "a100"),
    (0.05, "v100"),
    (0.15, "t4"),
    (0.30, "edge-npu"),
    (0.15, "edge-gpu"),
    (0.20, "edge-cpu"),
)


_H100 = ACCELERATORS["NVIDIA H100 80GB HBM3"]
_A100 = ACCELERATORS["NVIDIA A100-SXM4-40GB"]
_V100 = ACCELERATORS["Tesla V100-SXM2-32GB"]
_T4 = ACCELERATORS["Tesla T4"]


def _gpu_pool(
    facts: AcceleratorFacts, count: int, utilisation: float, providers: tuple[str, ...] = ()
) -> AcceleratorPool:
    return AcceleratorPool(
        kind=facts.kind,
        count=count,
        model=facts.name,
        memory_bytes=required(facts.memory_bytes, facts, "memory"),
        relative_speed=required(facts.relative_speed, facts, "relative speed"),
        idle_power_w=required(facts.idle_power_w, facts, "idle power"),
        max_power_w=required(facts.max_power_w, facts, "maximum power"),
        onnx_providers=providers,
        utilisation=utilisation,
    )


def _pools(kind: str, rng: random.Random) -> tuple[AcceleratorPool, ...]:
    util = round(rng.random() * 0.9, 3)
    if kind == "h100":
        return (_gpu_pool(_H100, 8, util),)
    if kind == "a100":
        return (_gpu_pool(_A100, 4, util),)
    if kind == "v100":
        return (_gpu_pool(_V100, 8, util),)
    if kind == "t4":
        return (_gpu_pool(_T4, rng.choice((1, 2, 4)), util, PROVIDERS_GPU),)
    # The edge devices and CPUs below are synthetic classes rather than models:
    # their figures are the benchmark's own.
    if kind == "edge-npu":
        return (
            AcceleratorPool(
                kind="npu",
                count=rng.choice((1, 2)),
                model="synthetic edge NPU",
                memory_bytes=8 * GIB,
                relative_speed=0.2,
                idle_power_w=1,
                max_power_w=8,
                onnx_providers=PROVIDERS_NPU,
                utilisation=util,
            ),
            AcceleratorPool(
                kind="cpu",
                count=4,
                model="ARM",
                memory_bytes=8 * GIB,
                relative_speed=0.02,
                idle_power_w=2,
                max_power_w=10,
                onnx_providers=("CPUExecutionProvider",),
                utilisation=util,
            ),
        )
    if kind == "edge-gpu":
        return (
            AcceleratorPool(
                kind="gpu",
                count=1,
                model="synthetic edge GPU",
                memory_bytes=16 * GIB,
                relative_speed=0.15,
                idle_power_w=5,
                max_power_w=40,
                onnx_providers=PROVIDERS_GPU,
                utilisation=util,
            ),
            AcceleratorPool(
                kind="cpu",
                count=6,
                model="ARM",
                memory_bytes=16 * GIB,
                relative_speed=0.02,
                idle_power_w=2,
                max_power_w=15,
                onnx_providers=("CPUExecutionProvider",),
                utilisation=util,
            ),
        )
    return (
        AcceleratorPool(
            kind="cpu",
            count=rng.choice((4, 8, 16)),
            model="x86",
            memory_bytes=32 * GIB,
            relative_speed=0.05,
            idle_power_w=10,
            max_power_w=65,
            onnx_providers=("CPUExecutionProvider",),
            utilisation=util,
        ),
    )


def build_cluster(node_count: int, seed: int = 0) -> list[Node]:
    rng = random.Random(seed)
    nodes = []
    bounds = []
    acc = 0.0
    for share, kind in _SERVER_TYPES:
        acc += share
        bounds.append((acc, kind))
    for i in range(node_count):
        draw = rng.random()
        kind = next((k for bound, k in bounds if draw < bound), bounds[-1][1])
        edge = kind.startswith("edge")
        region = rng.choice(EDGE_REGIONS if edge else CLOUD_REGIONS)
        taints = (Taint("dedicated", "research"),) if not edge and rng.random() < 0.03 else ()
        nodes.append(
            Node(
                node_id=f"{kind}-{i:06d}",
                site="edge" if edge else "cloud",
                zone=rng.choice(ZONES),
                region=region,
                labels={"type": kind, "rack": f"r{i % 50}"},
                taints=taints,
                healthy=rng.random() > 0.01,
                host_memory_bytes=(16 if edge else 512) * GIB,
                utc_offset_minutes=rng.choice((-480, -300, 0, 60, 120, 330, 540)),
                pools=_pools(kind, rng),
            )
        )
    return nodes


def build_running(nodes: Sequence[Node], seed: int = 0) -> list[Allocation]:
    """About a quarter of the accelerators already busy, with mixed priorities."""
    rng = random.Random(seed + 1)
    running = []
    for node in nodes:
        if not node.healthy:
            continue
        pool = node.pools[0]
        if rng.random() > 0.30:
            continue
        used = rng.randint(1, max(1, pool.count // 2))
        priority: PriorityClass = rng.choice(("p1", "p2", "p2"))
        training = node.site == "cloud"
        running.append(
            Allocation(
                allocation_id=f"run-{node.node_id}",
                work_id=f"run-{node.node_id}",
                work_kind="training" if training else "inference",
                tenant=rng.choice(TENANTS),
                priority=priority,
                preemptible=rng.random() < 0.8,
                node_id=node.node_id,
                accelerator_kind=pool.kind,
                accelerators=used,
                started_at=NOW - rng.uniform(60, 7200),
                expected_end=NOW + rng.uniform(60, 14400) if training else None,
            )
        )
    return running


def build_tenants(nodes: Sequence[Node]) -> list[Tenant]:
    totals: dict[AcceleratorKind, int] = {"gpu": 0, "npu": 0, "cpu": 0}
    for node in nodes:
        for pool in node.pools:
            totals[pool.kind] += pool.count
    tenants = []
    for i, name in enumerate(TENANTS):
        # Nominal quotas add up to the cluster; each may borrow half as much again.
        nominal = {kind: total // len(TENANTS) for kind, total in totals.items()}
        limit = {kind: amount // 2 for kind, amount in nominal.items()}
        tenants.append(
            Tenant(name=name, cohort=f"cohort-{i % 4}", nominal=nominal, borrowing_limit=limit)
        )
    return tenants


def _priority(rng: random.Random, weights: tuple[float, float, float]) -> PriorityClass:
    draw = rng.random()
    if draw < weights[0]:
        return "p0"
    return "p1" if draw < weights[0] + weights[1] else "p2"


def build_queue(job_count: int, seed: int = 0) -> list[Work]:
    rng = random.Random(seed + 2)
    queue: list[Work] = []
    for i in range(job_count):
        tenant = rng.choice(TENANTS)
        submitted = NOW - rng.uniform(0, 3000)
        if rng.random() < 0.30:
            draw = rng.random()
            workers, per_worker = 1, 1
            if draw < 0.70:
                per_worker = 1
            elif draw < 0.85:
                per_worker = 2
            elif draw < 0.93:
                per_worker = 4
            elif draw < 0.98:
                per_worker = 8
            else:
                workers, per_worker = rng.choice((2, 4)), 8
            queue.append(
                TrainingJob(
                    work_id=f"train-{i:06d}",
                    tenant=tenant,
                    priority=_priority(rng, (0.1, 0.4, 0.5)),
                    submitted_at=submitted,
                    workers=workers,
                    accelerators_per_worker=per_worker,
                    memory_bytes=rng.choice((0, 16 * GIB, 32 * GIB)),
                    accelerator_models=(_H100.name, _A100.name) if rng.random() < 0.1 else (),
                    duration_s=rng.uniform(600, 36000),
                    start_window=StartWindow.parse("20:00-06:00") if rng.random() < 0.03 else None,
                    tolerations=(Toleration("dedicated"),) if rng.random() < 0.05 else (),
                )
            )
        else:
            draw = rng.random()
            kinds: tuple[AcceleratorKind, ...]
            providers: tuple[str, ...]
            if draw < 0.40:
                kinds, providers = ("npu", "gpu", "cpu"), ()
            elif draw < 0.70:
                kinds, providers = ("npu", "cpu"), PROVIDERS_NPU
            elif draw < 0.88:
                kinds, providers = ("cpu",), ("CPUExecutionProvider",)
            elif draw < 0.98:
                kinds, providers = ("gpu",), ("TensorrtExecutionProvider", "CUDAExecutionProvider")
            else:  # asks for what no edge device has: stays pending, with reasons
                kinds, providers = ("gpu",), ("ROCMExecutionProvider",)
            queue.append(
                InferenceDeployment(
                    work_id=f"infer-{i:06d}",
                    tenant=tenant,
                    priority=_priority(rng, (0.4, 0.4, 0.2)),
                    submitted_at=submitted,
                    replicas=rng.choice((1, 1, 2, 3)),
                    min_replicas=1,
                    accepted_kinds=kinds,
                    providers=providers,
                    memory_bytes=rng.choice((GIB, 2 * GIB, 4 * GIB)),
                    traffic_by_region={rng.choice(EDGE_REGIONS): 1.0},
                )
            )
    return queue


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def build_snapshot(node_count: int, job_count: int, seed: int = 0) -> Snapshot:
    """The benchmark's cluster, running work, queue and tenants for one seed."""
    nodes = build_cluster(node_count, seed)
    return Snapshot.build(
        now=NOW,
        nodes=nodes,
        allocations=build_running(nodes, seed),
        queue=build_queue(job_count, seed),
        tenants=build_tenants(nodes),
    )


def run_benchmark(node_count: int, job_count: int, seed: int = 0) -> dict[str, float | int]:
    """Build the synthetic inputs, then time one scheduling pass over them.

    The timed region (``elapsed_s`` and every rate) is the pass alone: the
    ``Scheduler`` set-up plus one ``step`` per job, with the snapshot already built
    and ``gc.freeze()`` applied to it, as a control plane that keeps its snapshot
    between passes would run it. ``snapshot_build_ms`` reports, separately, what
    ``Snapshot.build`` costs at this size (building the node objects and the queue
    is not counted anywhere). ``placements_per_s`` counts allocations (gang workers
    and replicas); ``jobs_placed_per_s`` counts jobs with at least one placement.
    """
    nodes = build_cluster(node_count, seed)
    running = build_running(nodes, seed)
    queue = build_queue(job_count, seed)
    tenants = build_tenants(nodes)
    build_started = time.perf_counter()
    snapshot = Snapshot.build(
        now=NOW, nodes=nodes, allocations=running, queue=queue, tenants=tenants
    )
    snapshot_build_s = time.perf_counter() - build_started
    # The snapshot is long-lived state, as in the control plane: keep the collector
    # from rescanning it during the pass (the objects the pass creates still count).
    gc.collect()
    gc.freeze()
    decisions: list[float] = []
    started = time.perf_counter()
    scheduler = Scheduler(snapshot, Policy())
    setup_s = time.perf_counter() - started
    while True:
        before = time.perf_counter_ns()
        if not scheduler.step():
            break
        decisions.append((time.perf_counter_ns() - before) / 1000.0)
    plan = scheduler.plan()
    elapsed = time.perf_counter() - started
    gc.unfreeze()
    # A placement is one allocation (gang worker or replica), as in Nomad's C1M and
    # kube-scheduler's pods/s; jobs_placed counts whole jobs.
    placed = len(plan.placements)
    jobs_placed = len({p.work_id for p in plan.placements})
    return {
        "nodes": node_count,
        "jobs": job_count,
        "placed": placed,
        "jobs_placed": jobs_placed,
        "pending": len(plan.pending),
        "preemptions": len(plan.preemptions),
        "reservations": len(plan.reservations),
        "placements_per_s": round(placed / elapsed, 1),
        "jobs_placed_per_s": round(jobs_placed / elapsed, 1),
        "decisions_per_s": round(len(decisions) / elapsed, 1),
        "decision_p50_us": round(_percentile(decisions, 0.50), 1),
        "decision_p99_us": round(_percentile(decisions, 0.99), 1),
        "decision_max_us": round(max(decisions, default=0.0), 1),
        "setup_ms": round(setup_s * 1000, 1),
        "snapshot_build_ms": round(snapshot_build_s * 1000, 1),
        "elapsed_s": round(elapsed, 3),
        "seed": seed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="greenfed bench scheduler",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one compact JSON object")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help=f"run {', '.join(map(str, SWEEP_NODES))} nodes with twice as many jobs",
    )
    args = parser.parse_args(argv)
    result: dict[str, object]
    if args.sweep:
        runs = [run_benchmark(n, 2 * n, args.seed) for n in SWEEP_NODES]
        result = {"sweep": runs}
    else:
        result = dict(run_benchmark(args.nodes, args.jobs, args.seed))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
