"""Steps the scheduling leader runs on its event loop at 10,000 nodes (issue 28), in
this process: how long each holds the loop.

    python benchmarks/loop_steps.py --nodes 10000 --runs 5

- `liveness`: rounds of `Liveness.expire_stale` (every second in the control plane)
  over `--nodes` of the default fleet's mix, on a clock moved 1 s a round, a fifth of
  the nodes sending a new sample each round (a 5 s telemetry interval): the CPU of a
  round once the fleet is at work, median and max over 30 rounds after 20 of warm-up,
  and of a round after the registry changed (a birth: `version` moved).
- `flush`: an accounting flush (`Accountant.flush`) that moves `--nodes` marks (every
  node sampled since the last one, as at a 10 s flush interval), on PostgreSQL
  (`--postgres-url`, a schema of its own) and SQLite: its wall time, and the longest
  the event loop went without running a 1 ms timer meanwhile (the step that held it
  longest), medians of `--runs`.
- `scrape_head`: what a `/metrics` scrape does on the event loop with the leader's
  collectors (`GridCollector` with three quarters of the nodes running one allocation
  each): the loop thread's CPU over a whole `fleet_exposition_chunks` (the worker
  thread's share not counted), and `GridCollector.collect` alone; median and max of 30
  scrapes after 5 of warm-up.
- `node_admin`: a round of the node-admin refresh (every 2 s) after the store's read,
  nothing changed since the last round and after a change (`version` moved), for a
  fleet not enrolled with 100 cordoned nodes (the live benchmark's) and for one enrolled
  with every node's first claim recorded (10,000 settings); median and max of 30.

Run from a copy of an older tree (PYTHONPATH=<that tree>, this file copied in), it times
that tree's way.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from benchmarks.metrics_scrape import register_simulated_fleet
from cloud.fleet import node_admin as node_admin_refresh
from cloud.fleet.envelope import NodeEnvelope, claim_of
from cloud.fleet.ingest import Ingestor
from cloud.fleet.liveness import Liveness
from cloud.fleet.registry import NodeRegistry
from cloud.metrics import build_metrics_registry
from cloud.store import AllocationRecord, NodeAdminRecord, StoreSnapshot, open_store
from cloud.usage import metrics as usage_metrics
from cloud.usage.accountant import Accountant
from cloud.usage.meter import NodeMark
from shared.settings import StoreSettings, UsageSettings
from shared.topics import Topics

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


def liveness(nodes: int) -> dict[str, float]:
    clock = Clock()
    registry = NodeRegistry(monotonic=clock, max_nodes=nodes)
    register_simulated_fleet(registry, nodes, now_s=time.time())
    judge = Liveness(registry)
    records = list(registry)
    rounds_s: list[float] = []
    for number in range(50):
        clock.now_s += 1.0
        for record in records[number % 5 :: 5]:
            sample = record.telemetry
            assert sample is not None
            registry.apply_telemetry(msgspec.structs.replace(sample, seq=sample.seq + 1))
        gc.collect()
        started = time.process_time()
        changes = judge.expire_stale()
        if number >= 20:
            rounds_s.append(time.process_time() - started)
        assert not changes, "no node may go stale here"
    registry.version += 1  # as a birth does
    started = time.process_time()
    judge.expire_stale()
    changed_s = time.process_time() - started
    return {
        "round_cpu_ms_median": round(statistics.median(rounds_s) * 1000, 2),
        "round_cpu_ms_max": round(max(rounds_s) * 1000, 2),
        "round_after_a_change_cpu_ms": round(changed_s * 1000, 2),
    }


def _cpu_ms(samples_s: list[float]) -> dict[str, float]:
    return {
        "cpu_ms_median": round(statistics.median(samples_s) * 1000, 2),
        "cpu_ms_max": round(max(samples_s) * 1000, 2),
    }


def scrape_head(nodes: int) -> dict[str, Any]:
    registry = NodeRegistry(max_nodes=nodes)
    register_simulated_fleet(registry, nodes, now_s=time.time())
    metrics = build_metrics_registry(Ingestor(registry, Topics(), max_payload_bytes=1 << 20))
    accountant = Accountant(None, registry, UsageSettings())  # type: ignore[arg-type]
    allocations = tuple(
        AllocationRecord(
            work_id=f"job-{number}",
            member_index=0,
            node_id=record.node_id,
            accelerator_kind=record.status.accelerators[0].kind,
            accelerators=1,
            accelerator_ids=(record.status.accelerators[0].id,),
            host_memory_bytes=0,
            started_at=time.time(),
            expected_end=None,
            borrowed=False,
            state="running",
            tenant_id="t1",
            work_kind="training",
            priority="p1",
        )
        for number, record in enumerate(registry)
        if number % 4 != 0 and record.status.accelerators
    )
    accountant.note_pass(
        StoreSnapshot(tenants=(), work=(), allocations=allocations, node_generations={}),
        accountant.grid,
    )
    grid = usage_metrics.GridCollector(accountant, registry, lambda zone: None)
    metrics.fleet.register(grid)
    zone_power = getattr(usage_metrics, "ZonePower", None)
    if zone_power is not None:  # this tree sums power in the scrape's worker thread
        metrics.sampled.append(zone_power())

    async def loop_cpu_s() -> float:
        started = time.thread_time()  # the loop's thread: the worker's share not counted
        chunks = await metrics.fleet_exposition_chunks()
        spent = time.thread_time() - started
        body = b"".join(chunks)  # /metrics writes the chunks as they are
        assert b"greenfed_zone_power_watts{" in body
        assert b"greenfed_zone_accelerators_allocated{" in body
        return spent

    scrapes_s: list[float] = []
    collects_s: list[float] = []
    for number in range(35):
        gc.collect()
        spent = asyncio.run(loop_cpu_s())
        gc.collect()
        started = time.process_time()
        families = list(grid.collect())
        collected = time.process_time() - started
        assert families
        if number >= 5:
            scrapes_s.append(spent)
            collects_s.append(collected)
    return {
        "allocations": len(allocations),
        "scrape_loop_thread": _cpu_ms(scrapes_s),
        "grid_collect": _cpu_ms(collects_s),
    }


def _admin_round(registry: NodeRegistry) -> Callable[[dict[str, NodeAdminRecord]], object]:
    """A refresh round's steps after the store's read, as this tree makes them."""
    claims_of = getattr(node_admin_refresh, "FirstClaims", None)
    if claims_of is not None:  # this tree walks only after a change
        unclaimed = claims_of(registry)
        refreshed = node_admin_refresh.refreshed

        def round_of(admin: dict[str, NodeAdminRecord]) -> object:
            refreshed(registry, admin)
            return unclaimed.claims()

        return round_of

    def old_round_of(admin: dict[str, NodeAdminRecord]) -> object:
        registry.set_admin(admin)
        return node_admin_refresh.first_claims(registry)

    return old_round_of


def node_admin(nodes: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for fleet in ("not_enrolled", "enrolled_all_claimed"):
        registry = NodeRegistry(max_nodes=nodes)
        register_simulated_fleet(registry, nodes, now_s=time.time())
        if fleet == "not_enrolled":
            stored = {
                record.node_id: NodeAdminRecord(record.node_id, cordoned=True)
                for number, record in enumerate(registry)
                if number % (nodes // 100 or 1) == 0
            }
        else:
            registry.envelope_of = lambda node_id: NodeEnvelope()
            stored = {
                record.node_id: NodeAdminRecord(record.node_id, approved=claim_of(record.status))
                for record in registry
            }
        round_of = _admin_round(registry)
        quiet_s: list[float] = []
        changed_s: list[float] = []
        for number in range(70):
            # What the store's read gives each round: new records of the same settings.
            admin = {node_id: dataclasses.replace(one) for node_id, one in stored.items()}
            if number % 2 == 1:
                registry.version += 1  # as a birth or a node going offline does
            gc.collect()
            started = time.process_time()
            claims = round_of(admin)
            spent = time.process_time() - started
            assert claims == {}
            if number >= 10:
                (changed_s if number % 2 == 1 else quiet_s).append(spent)
        result[fleet] = {
            "admin_records": len(stored),
            "round_nothing_changed": _cpu_ms(quiet_s),
            "round_after_a_change": _cpu_ms(changed_s),
        }
    return result


async def _worst_lag_s(stop: asyncio.Event) -> float:
    loop = asyncio.get_running_loop()
    worst = 0.0
    while not stop.is_set():
        asked = loop.time()
        await asyncio.sleep(0.001)
        worst = max(worst, loop.time() - asked - 0.001)
    return worst


async def flush(kind: str, nodes: int, runs: int, postgres_url: str) -> dict[str, float]:
    data_dir = tempfile.mkdtemp()
    schema = f"gfbench_{uuid.uuid4().hex[:10]}"
    settings = (
        StoreSettings(data_dir=data_dir)
        if kind == "sqlite"
        else StoreSettings(database_url=postgres_url, database_schema=schema, data_dir=data_dir)
    )
    store = await open_store(settings)
    try:
        lease = None
        while lease is None:
            lease = await store.try_acquire_leadership()
        accountant = Accountant(store, NodeRegistry(), UsageSettings())
        await accountant.begin(lease)
        state = accountant._state  # what ingestion's samples leave for a flush
        assert state is not None
        walls_s, lags_s = [], []
        for run in range(runs):
            state.marks = {
                f"node-{number:05d}": NodeMark(
                    f"instance-{number}", 100 + run, 1.8e9 + run, {"gpu0": 1e3 * run + number}
                )
                for number in range(nodes)
            }
            state.dirty = set(state.marks)
            gc.collect()
            stop = asyncio.Event()
            lag = asyncio.ensure_future(_worst_lag_s(stop))
            await asyncio.sleep(0.01)
            started = time.perf_counter()
            await accountant.flush(lease)
            walls_s.append(time.perf_counter() - started)
            stop.set()
            lags_s.append(await lag)
        marks = await store.usage_marks()
        assert len(marks) == nodes
        assert {m.seq for m in marks.values()} == {100 + runs - 1}
    finally:
        await store.close()
        if kind == "postgresql":
            engine = create_async_engine(
                make_url(postgres_url).set(drivername="postgresql+asyncpg")
            )
            async with engine.begin() as connection:
                await connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            await engine.dispose()
    return {
        "wall_ms_median": round(statistics.median(walls_s) * 1000, 1),
        "longest_loop_step_ms_median": round(statistics.median(lags_s) * 1000, 1),
        "longest_loop_step_ms_max": round(max(lags_s) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--backends", nargs="+", default=["postgresql", "sqlite"])
    parser.add_argument(
        "--steps",
        nargs="+",
        default=["liveness", "flush", "scrape_head", "node_admin"],
        choices=["liveness", "flush", "scrape_head", "node_admin"],
    )
    args = parser.parse_args()
    result: dict[str, Any] = {"nodes": args.nodes}
    if "liveness" in args.steps:
        result["liveness"] = liveness(args.nodes)
    if "scrape_head" in args.steps:
        result["scrape_head"] = scrape_head(args.nodes)
    if "node_admin" in args.steps:
        result["node_admin"] = node_admin(args.nodes)
    for kind in args.backends if "flush" in args.steps else ():
        result[f"flush_{kind}"] = asyncio.run(flush(kind, args.nodes, args.runs, args.postgres_url))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
