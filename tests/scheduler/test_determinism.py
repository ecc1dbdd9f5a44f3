"""Behaviour 8: the same snapshot gives the same plan, whatever the input order or hash seed."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

from cloud.scheduler import Allocation, Node, Plan, Snapshot, Tenant, Work, schedule

from .builders import NOW, deployment, edge_node, gpu_node, job, running

ROOT = Path(__file__).resolve().parents[2]


def mixed_inputs() -> tuple[list[Node], list[Allocation], list[Work], list[Tenant]]:
    nodes = [gpu_node(f"g{i}", 8 if i % 2 else 4, utilisation=(i % 5) / 10) for i in range(12)]
    nodes += [edge_node(f"e{i}", region=f"r{i % 3}", cpu_cores=4) for i in range(12)]
    allocations = [
        running(f"r{i}", f"g{i}", 2, priority="p2", started_at=NOW - i) for i in range(0, 12, 3)
    ]
    queue: list[Work] = [
        job(
            f"t{i}",
            1 + i % 4,
            workers=1 + i % 2,
            tenant=f"t{i % 3}",
            priority="p1" if i % 3 else "p0",
            submitted_at=NOW - i,
        )
        for i in range(15)
    ]
    queue += [deployment(f"d{i}", replicas=1 + i % 3, tenant=f"t{i % 3}") for i in range(10)]
    tenants = [
        Tenant(name=f"t{i}", cohort="c", nominal={"gpu": 16, "npu": 6, "cpu": 20}) for i in range(3)
    ]
    return nodes, allocations, queue, tenants


def digest(plan: Plan) -> str:
    return hashlib.sha256(repr(plan).encode()).hexdigest()


def test_same_snapshot_same_plan() -> None:
    nodes, allocations, queue, tenants = mixed_inputs()
    snap = Snapshot.build(
        now=NOW, nodes=nodes, allocations=allocations, queue=queue, tenants=tenants
    )
    first, second = schedule(snap), schedule(snap)
    assert first == second
    assert first.placements  # a real plan, not an empty one


def test_input_order_does_not_matter() -> None:
    nodes, allocations, queue, tenants = mixed_inputs()
    reference = schedule(
        Snapshot.build(now=NOW, nodes=nodes, allocations=allocations, queue=queue, tenants=tenants)
    )
    rng = random.Random(7)
    for _ in range(3):
        for items in (nodes, allocations, queue, tenants):
            rng.shuffle(items)
        shuffled = schedule(
            Snapshot.build(
                now=NOW, nodes=nodes, allocations=allocations, queue=queue, tenants=tenants
            )
        )
        assert shuffled == reference


_CHILD = """
import hashlib, sys
sys.path.insert(0, sys.argv[1])
from tests.scheduler.test_determinism import digest, mixed_inputs, NOW
from cloud.scheduler import Snapshot, schedule
nodes, allocations, queue, tenants = mixed_inputs()
snap = Snapshot.build(now=NOW, nodes=nodes, allocations=allocations, queue=queue, tenants=tenants)
print(digest(schedule(snap)))
"""


def test_plan_does_not_depend_on_the_hash_seed() -> None:
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", _CHILD, str(ROOT)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_a_what_if_snapshot_plans_like_one_built_from_scratch() -> None:
    # Snapshot.with_work (the migrator's trial passes) recounts free capacity: a plan on
    # it equals the plan on a snapshot built from the same inputs.
    nodes, allocations, queue, tenants = mixed_inputs()
    base = Snapshot.build(now=NOW, nodes=nodes, allocations=[], queue=[], tenants=tenants)
    derived = base.with_work(allocations=allocations, queue=queue)
    built = Snapshot.build(
        now=NOW, nodes=nodes, allocations=allocations, queue=queue, tenants=tenants
    )
    for kind in ("gpu", "npu", "cpu"):
        assert (derived.nodes.kind(kind).free == built.nodes.kind(kind).free).all()
    assert (derived.nodes.host_memory_free == built.nodes.host_memory_free).all()
    assert schedule(derived) == schedule(built)
