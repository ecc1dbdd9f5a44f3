"""One scheduling pass's CPU at scale (issue 28), in this process: no agents, no MQTT.

    python benchmarks/pass_scale.py --nodes 10000 --jobs 10000 --runs 5
    python benchmarks/pass_scale.py --queue unplaceable --policy green --runs 7 --json

1. `--nodes` simulated nodes of the default fleet's mix (sim_devices/fleets/default.toml
   scaled, as `greenfed sim` runs them) are born in a `NodeRegistry` with one telemetry
   sample each (benchmarks/metrics_scrape.py `register_simulated`).
2. A `StoreSnapshot` holds `--jobs` pending work items of 4 tenants (two with GPU
   quotas in one cohort). `--queue mixed`: training of mixed shapes (1 to 8
   accelerators, gangs of 2 and 4, GPU, NPU and CPU, some with a deadline, a start
   window or a node selector the fleet has) and a tenth inference deployments;
   `--queue unplaceable`: every job asks for a node label no node has, as
   benchmarks/fleet_scale.py queues them, so the whole queue stays pending and every
   pass weighs it. The default runs both.
3. The pure parts of a pass, as cloud/loop/loop.py `run_pass` runs them: `build_inputs`
   (with the loop's conversion cache and node views), the running jobs that may move,
   `schedule_then_move` with the policy (the settings' default, `green`, unless
   `--policy`), the counterfactuals of what it placed, then `translate` and the pass's
   fresh explanations (which the loop does in the pass's thread too). Grid signals are the
   shipped 2023 traces, at a fixed instant of that year.
   - the first pass: cold caches, the whole queue decided (a new leader's first pass);
   - `--runs` steady passes: warm caches, the head of the queue decided
     (`scheduling.queue_depth`, 1000 by default) and, separately, the whole queue
     (`--full`, every `full_pass_interval_s`). Between passes: the last plan's
     placements are applied to the store (scheduled, with allocations), `--churn` jobs
     are submitted and as many cancelled, and `--telemetry-share` of the nodes send
     a new sample (telemetry every 5 s, a pass about every second).
   Medians are printed per step, in seconds.

The machine's other work disturbs single figures: compare medians, and run an old and a
new tree back to back.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from benchmarks.metrics_scrape import register_simulated_fleet
from cloud.fleet.registry import NodeRecord, NodeRegistry
from cloud.green.latency import default_latency_estimator
from cloud.green.pass_rule import schedule_then_move
from cloud.green.policies import (
    GreenInputs,
    build_migrator,
    build_policy,
    build_power_capper,
)
from cloud.loop.inputs import ConversionCache, PassInputs, build_inputs
from cloud.loop.moves import running_jobs
from cloud.loop.nodes import NodeViews
from cloud.loop.plans import translate
from cloud.scheduler import Plan
from cloud.signals.trace import TraceProvider
from cloud.store import AllocationRecord, StoreSnapshot, TenantRecord, WorkRecord
from cloud.usage.counterfactual import BASELINE, live_counterfactuals
from cloud.work.explain import explanations_for_plan
from shared.messages import Telemetry
from shared.settings import SchedulingSettings
from shared.work_literals import WorkKind
from sim_devices.probes import SimulatedNode

NOW_S = datetime(2023, 6, 14, 12, 0, tzinfo=UTC).timestamp()  # inside the shipped traces
MAX_ATTEMPTS = 3  # store.max_attempts' default


def _tenant(name: str, gpus: int | None) -> TenantRecord:
    """Two tenants with GPU quotas in one cohort (they borrow from each other), two
    unmanaged."""
    return TenantRecord(
        tenant_id=f"t-{name}",
        name=name,
        quotas={"gpu": gpus} if gpus else {},
        borrowing_limit={"gpu": gpus // 4} if gpus else {},
        cohort="lab" if gpus else None,
        allowed_priorities=("p0", "p1", "p2"),
        admin=False,
        created_at=0.0,
    )


TENANTS = (
    _tenant("research", 4000),
    _tenant("product", 2000),
    _tenant("edge", None),
    _tenant("batch", None),
)


# ---- the fleet -------------------------------------------------------------------------


class Fleet:
    """The registry and the simulated hardware behind it, for new samples."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.registry = NodeRegistry(max_nodes=nodes)
        self._simulated: list[SimulatedNode] = []
        self._seq: dict[str, int] = {}
        self._rng = random.Random(seed)
        now_s = time.time()
        for index, spec in enumerate(register_simulated_fleet(self.registry, nodes, now_s=now_s)):
            # The same simulated hardware (same seed) goes on sampling.
            node = SimulatedNode(spec.node_id, spec.profile, random.Random(index))
            node.advance()
            node.advance()
            self._simulated.append(node)
            self._seq[spec.node_id] = 0

    def sample(self, share: float) -> int:
        """New telemetry from `share` of the nodes; how many sent one."""
        chosen = self._rng.sample(self._simulated, round(share * len(self._simulated)))
        for node in chosen:
            node.advance()
            seq = self._seq[node.node_id] = self._seq[node.node_id] + 1
            host = node.host_sample()
            self.registry.apply_telemetry(
                Telemetry(
                    node_id=node.node_id,
                    instance_id=self._instance(node.node_id),
                    seq=seq,
                    sampled_at=time.time(),
                    interval_s=5.0,
                    cpu_utilization_pct=host.cpu_utilization_pct,
                    memory_used_bytes=host.memory_used_bytes,
                    memory_total_bytes=host.memory_total_bytes,
                    accelerators=tuple(node.accelerator_samples()),
                )
            )
        return len(chosen)

    def _instance(self, node_id: str) -> str:
        record = self.registry.get(node_id)
        assert record is not None
        return record.status.instance_id


# ---- the queue -------------------------------------------------------------------------


def _training(rng: random.Random, number: int) -> dict[str, Any]:
    shape = rng.random()
    spec: dict[str, Any] = {
        "name": f"job-{number}",
        "command": ["python", "train.py"],
        "estimated_duration_s": rng.choice((600.0, 1800.0, 3600.0, 4 * 3600.0)),
    }
    if shape < 0.45:
        spec["accelerators_per_worker"] = rng.choice((1, 1, 2, 4, 8))
    elif shape < 0.6:
        spec |= {"workers": rng.choice((2, 4)), "accelerators_per_worker": rng.choice((4, 8))}
    elif shape < 0.7:
        spec |= {"accelerator_kind": "npu"}
    elif shape < 0.8:
        spec |= {"accelerator_kind": "cpu", "accelerators_per_worker": rng.choice((1, 2))}
    else:
        spec |= {
            "memory_gib": rng.choice((24.0, 40.0, 80.0)),
            "node_selector": {"pool": "training"},
        }
    extra = rng.random()
    if extra < 0.1:
        spec["deadline"] = datetime.fromtimestamp(NOW_S + rng.choice((6, 12, 24)) * 3600, UTC)
    elif extra < 0.15:
        spec["start_window"] = "20:00-06:00"
    elif extra < 0.2:
        spec["max_delay_s"] = 4 * 3600.0
    return spec


def _deployment(rng: random.Random, number: int) -> dict[str, Any]:
    return {
        "kind": "deployment",
        "name": f"deployment-{number}",
        "model_id": f"model-{number % 50}",
        "replicas": rng.choice((1, 2, 4)),
        "accepted_kinds": rng.choice((["gpu"], ["npu", "gpu"], ["cpu", "npu", "gpu"])),
    }


def work_record(rng: random.Random, number: int, queue: str) -> WorkRecord:
    kind: WorkKind = "inference" if queue == "mixed" and rng.random() < 0.1 else "training"
    if kind == "inference":
        spec = _deployment(rng, number)
        priority = "p0"
    else:
        spec = _training(rng, number) if queue == "mixed" else _fleet_scale_job(number)
        priority = rng.choice(("p0", "p1", "p1", "p2"))
    return WorkRecord(
        work_id=f"w{number:07d}",
        tenant_id=TENANTS[number % len(TENANTS)].tenant_id,
        kind=kind,
        spec=msgspec.json.encode(spec),
        priority=priority,  # type: ignore[arg-type]
        state="pending",
        state_reason=None,
        attempts=0,
        submitted_at=NOW_S - 3600 + number * 0.1,
        updated_at=NOW_S,
        idempotency_key=None,
        version=1,
    )


def _fleet_scale_job(number: int) -> dict[str, Any]:
    return {
        "name": f"fleet-{number}",
        "command": ["python", "train.py"],
        "estimated_duration_s": 600.0,
        # No node has it: the job stays queued, weighed against every node.
        "node_selector": {"fleet-scale": "nowhere"},
    }


def apply_plan(store: StoreSnapshot, inputs: PassInputs, plan: Plan) -> StoreSnapshot:
    """The store after the loop commits `plan`'s placements (devices as the loop picks them)."""
    write = translate(plan, inputs, {}).write
    if not write.placements:
        return store
    placed = {p.work_id: p for p in write.placements}
    work = tuple(
        dataclasses.replace(r, state="scheduled", attempts=r.attempts + 1, version=r.version + 1)
        if r.work_id in placed
        else r
        for r in store.work
    )
    kept = [a for a in store.allocations if a.work_id not in placed]
    records = {r.work_id: r for r in store.work}
    for placement in write.placements:
        record = records[placement.work_id]
        kept.extend(
            AllocationRecord(
                work_id=placement.work_id,
                member_index=a.member_index,
                node_id=a.node_id,
                accelerator_kind=a.accelerator_kind,
                accelerators=a.accelerators,
                accelerator_ids=a.accelerator_ids,
                host_memory_bytes=a.host_memory_bytes,
                started_at=NOW_S,
                expected_end=a.expected_end,
                borrowed=a.borrowed,
                state="assigned",
                tenant_id=record.tenant_id,
                work_kind=record.kind,
                priority=record.priority,
                power_limit_w=a.power_limit_w,
                cpu_cores=a.cpu_cores,
            )
            for a in placement.allocations
        )
    return dataclasses.replace(store, work=work, allocations=tuple(kept))


def churn(
    store: StoreSnapshot, rng: random.Random, count: int, next_number: int, queue: str
) -> StoreSnapshot:
    """`count` pending jobs cancelled (gone from the snapshot) and as many submitted."""
    pending = [r.work_id for r in store.work if r.state == "pending"]
    cancelled = set(rng.sample(pending, min(count, len(pending))))
    work = [r for r in store.work if r.work_id not in cancelled]
    work.extend(work_record(rng, next_number + i, queue) for i in range(count))
    return dataclasses.replace(store, work=tuple(work))


# ---- one pass --------------------------------------------------------------------------


@dataclasses.dataclass
class PassClock:
    steps_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def time(self, step: str, call: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        result = call()
        self.steps_s[step] = time.perf_counter() - began
        return result


class Pass:
    """The loop's caches across passes, and one pass's pure steps."""

    def __init__(self, policy_name: str, green: GreenInputs) -> None:
        settings = SchedulingSettings()
        self.policy_name = policy_name
        self.green = green
        self.converted = ConversionCache(settings.min_isolation)
        self.node_views = NodeViews()
        self.explained: dict[str, tuple[str, str, int]] = {}

    def run(
        self, store: StoreSnapshot, nodes: Sequence[NodeRecord], max_decisions: int | None
    ) -> tuple[PassInputs, Plan, PassClock]:
        clock = PassClock()
        inputs: PassInputs = clock.time(
            "build_inputs",
            lambda: build_inputs(
                NOW_S, nodes, store, self.converted, {}, node_views=self.node_views
            ),
        )
        policy = build_policy(self.policy_name, self.green)
        migrator = build_migrator(self.policy_name, self.green)
        capper = build_power_capper(self.policy_name, self.green)
        running = clock.time(
            "running_jobs", lambda: running_jobs(inputs, MAX_ATTEMPTS) if migrator else []
        )
        decision = clock.time(
            "schedule_then_move",
            lambda: schedule_then_move(
                inputs.snapshot,
                policy,
                migrator,
                running,
                capper=capper,
                max_decisions=max_decisions,
            ),
        )
        plan: Plan = decision.plan
        clock.time("counterfactuals", lambda: self._counterfactuals(inputs, plan))
        explanations = clock.time("explanations", lambda: self._fresh_explanations(plan))
        clock.time("translate", lambda: translate(plan, inputs, explanations, decision.moves))
        clock.steps_s["total"] = sum(clock.steps_s.values())
        return inputs, plan, clock

    def _counterfactuals(self, inputs: PassInputs, plan: Plan) -> int:
        placed = sorted(
            {
                p.work_id
                for p in plan.placements
                if p.work_id in inputs.works and inputs.records[p.work_id].state == "pending"
            }
        )
        if not placed:
            return 0
        works = [(inputs.works[w], inputs.records[w].tenant_id) for w in placed]
        baseline = build_policy(BASELINE, self.green)
        return len(live_counterfactuals(inputs.snapshot, works, plan, baseline, self.green.energy))

    def _fresh_explanations(self, plan: Plan) -> dict[str, bytes]:
        """As loop.py's `fresh_explanations`: placements, and pending work whose reason
        changed since the last pass."""
        wanted = {placement.work_id for placement in plan.placements}
        for pending in plan.pending:
            key = (pending.code, pending.message, pending.members_placed)
            if self.explained.get(pending.work_id) != key:
                wanted.add(pending.work_id)
            self.explained[pending.work_id] = key
        return explanations_for_plan(plan, wanted)


# ---- the benchmark ---------------------------------------------------------------------


def green_inputs(registry: NodeRegistry) -> GreenInputs:
    zones = {record.status.zone for record in registry.nodes()}
    settings = SchedulingSettings()
    return GreenInputs(
        signals=TraceProvider(None).grid_signals(zones, NOW_S),
        latency=default_latency_estimator(),
        min_saving=settings.shifting_min_saving,
        migration=settings.migration,
        migration_min_saving=settings.migration_min_saving,
        migration_cooldown_s=settings.migration_cooldown_s,
        power_capping=settings.power_capping,
        power_cap_min_saving=settings.power_capping_min_saving,
    )


def medians(clocks: Sequence[PassClock]) -> dict[str, float]:
    steps = clocks[0].steps_s
    return {step: round(statistics.median(c.steps_s[step] for c in clocks), 4) for step in steps}


def case(args: argparse.Namespace, fleet: Fleet, queue: str, policy_name: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    store = StoreSnapshot(
        tenants=TENANTS,
        work=tuple(work_record(rng, number, queue) for number in range(args.jobs)),
        allocations=(),
        node_generations={},
    )
    next_number = args.jobs
    runner = Pass(policy_name, green_inputs(fleet.registry))
    gc.collect()
    inputs, plan, first = runner.run(store, fleet.registry.nodes(), None)  # a leader's first
    placed = len({p.work_id for p in plan.placements})
    result: dict[str, Any] = {
        "queue": queue,
        "policy": policy_name,
        "nodes": len(fleet.registry),
        "jobs": args.jobs,
        "first_pass_s": medians([first]),
        "first_placed": placed,
        "first_pending": len(plan.pending),
    }
    for label, depth in (("steady_pass_s", args.queue_depth), ("steady_full_pass_s", None)):
        if label == "steady_full_pass_s" and not args.full:
            continue
        clocks = []
        for _ in range(args.runs):
            store = apply_plan(store, inputs, plan)
            store = churn(store, rng, args.churn, next_number, queue)
            next_number += args.churn
            fleet.sample(args.telemetry_share)
            gc.collect()
            inputs, plan, clock = runner.run(store, fleet.registry.nodes(), depth or None)
            clocks.append(clock)
        result[label] = medians(clocks)
        result[label.replace("_s", "_queued")] = len(inputs.snapshot.queue)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="steady passes (median)")
    parser.add_argument(
        "--queue", choices=("mixed", "unplaceable"), action="append", help="default: both"
    )
    parser.add_argument("--policy", action="append", help="default: the settings' and green")
    parser.add_argument("--queue-depth", type=int, default=SchedulingSettings().queue_depth)
    parser.add_argument("--full", action=argparse.BooleanOptionalAction, default=True,
                        help="also steady passes that decide the whole queue")  # fmt: skip
    parser.add_argument(
        "--churn", type=int, default=20, help="jobs submitted and cancelled per pass"
    )
    parser.add_argument("--telemetry-share", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object per line only")
    args = parser.parse_args(argv)
    policies = list(dict.fromkeys(args.policy or [SchedulingSettings().policy, "green"]))
    began = time.perf_counter()
    fleet = Fleet(args.nodes, args.seed)
    if not args.json:
        print(f"# {len(fleet.registry)} nodes born in {time.perf_counter() - began:.1f} s")
    for queue in args.queue or ["unplaceable", "mixed"]:
        for policy_name in policies:
            result = case(args, fleet, queue, policy_name)
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
