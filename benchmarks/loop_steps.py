"""Two steps the scheduling leader runs on its event loop at 10,000 nodes (issue 28), in
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

Run from a copy of an older tree (PYTHONPATH=<that tree>, this file copied in), it times
that tree's way.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from benchmarks.metrics_scrape import register_simulated_fleet
from cloud.fleet.liveness import Liveness
from cloud.fleet.registry import NodeRegistry
from cloud.store import open_store
from cloud.usage.accountant import Accountant
from cloud.usage.meter import NodeMark
from shared.settings import StoreSettings, UsageSettings

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
    args = parser.parse_args()
    result: dict[str, Any] = {"nodes": args.nodes, "liveness": liveness(args.nodes)}
    for kind in args.backends:
        result[f"flush_{kind}"] = asyncio.run(flush(kind, args.nodes, args.runs, args.postgres_url))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
