"""Sustained work submissions per second into the store (SQLite and PostgreSQL).

Each submission is what `POST /v1/jobs` will do: one committed transaction that
inserts a training job (a ~600-byte JSON spec) with an idempotency key and appends
its `work.state` event. `--writers` concurrent writers share one store (one
connection each); each run lasts `--seconds`, and the medians of `--runs` runs are
printed.

    python benchmarks/store_bench.py --backends sqlite,postgresql --writers 1,4 --seconds 5 --runs 3

SQLite lives in a temporary directory (WAL, synchronous=NORMAL, the defaults);
PostgreSQL in a temporary schema of `--postgres-url`, dropped afterwards.
`client_cpu_ms_per_insert` is this process's CPU time per insert: on a small
machine shared with the database server it bounds the rate more than the database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from cloud.store import NewTenant, Store, open_store
from shared.settings import StoreSettings

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def job_spec(index: int) -> bytes:
    return msgspec.json.encode(
        {
            "name": f"bench-{index}",
            "command": ["torchrun", "--nproc-per-node", "2", "train.py", "--epochs", "3"],
            "workers": 2,
            "accelerators_per_worker": 2,
            "accelerator_kind": "gpu",
            "memory_bytes": 40 * 2**30,
            "host_memory_bytes": 64 * 2**30,
            "duration_s": 3600,
            "priority": "p1",
            "preemptible": True,
            "sites": ["cloud"],
            "node_selector": {"pool": "a100"},
            "env": {"WANDB_PROJECT": "greenfed", "SEED": str(index)},
            "score_weights": {"carbon": 0.5, "price": 0.3, "latency": 0.2},
        }
    )


async def _writer(
    store: Store, tenant_id: str, prefix: str, deadline: float, latencies_s: list[float]
) -> int:
    count = 0
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        result = await store.submit_work(
            tenant_id,
            kind="training",
            spec=job_spec(count),
            priority="p1",
            idempotency_key=f"{prefix}-{count}",
        )
        latencies_s.append(time.perf_counter() - started)
        assert result.created
        count += 1
    return count


async def one_run(settings: StoreSettings, writers: int, seconds: float) -> dict[str, float]:
    store = await open_store(settings)
    try:
        tenant = await store.create_tenant(NewTenant(name=f"bench-{uuid.uuid4().hex[:8]}"))
        latencies_s: list[float] = []
        cpu_started = time.process_time()
        started = time.perf_counter()
        counts = await asyncio.gather(
            *(
                _writer(
                    store,
                    tenant.tenant.tenant_id,
                    f"w{index}",
                    started + seconds,
                    latencies_s,
                )
                for index in range(writers)
            )
        )
        elapsed = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
    finally:
        await store.close()
    latencies_s.sort()
    return {
        "inserts_per_s": sum(counts) / elapsed,
        "latency_p50_ms": 1000 * latencies_s[len(latencies_s) // 2],
        "latency_p99_ms": 1000 * latencies_s[int(len(latencies_s) * 0.99)],
        # This process only (the benchmark's client side: greenfed's store code).
        "client_cpu_ms_per_insert": 1000 * cpu_s / sum(counts),
    }


async def drop_schema(url: str, schema: str) -> None:
    engine = create_async_engine(make_url(url).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.begin() as connection:
            await connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        await engine.dispose()


async def bench_backend(
    backend: str, writers: int, seconds: float, runs: int, postgres_url: str
) -> dict[str, Any]:
    results: list[dict[str, float]] = []
    for _ in range(runs):
        if backend == "sqlite":
            with tempfile.TemporaryDirectory(prefix="greenfed-bench-") as data_dir:
                settings = StoreSettings(data_dir=data_dir)
                results.append(await one_run(settings, writers, seconds))
        else:
            schema = f"gfbench_{uuid.uuid4().hex[:12]}"
            settings = StoreSettings(database_url=postgres_url, database_schema=schema)
            try:
                results.append(await one_run(settings, writers, seconds))
            finally:
                await drop_schema(postgres_url, schema)
    return {
        "backend": backend,
        "writers": writers,
        "runs": runs,
        "seconds": seconds,
        **{
            f"median_{key}": round(statistics.median(r[key] for r in results), 2)
            for key in results[0]
        },
        "inserts_per_s_each_run": [round(r["inserts_per_s"], 1) for r in results],
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for backend in args.backends.split(","):
        for writers in (int(w) for w in args.writers.split(",")):
            row = await bench_backend(backend, writers, args.seconds, args.runs, args.postgres_url)
            rows.append(row)
            if not args.json:
                print(
                    f"{backend:<10} writers={writers:<3} "
                    f"median {row['median_inserts_per_s']:>8.1f} inserts/s  "
                    f"p50 {row['median_latency_p50_ms']:.2f} ms  "
                    f"p99 {row['median_latency_p99_ms']:.2f} ms  "
                    f"client CPU {row['median_client_cpu_ms_per_insert']:.2f} ms/insert  "
                    f"(runs: {row['inserts_per_s_each_run']})",
                    flush=True,
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--writers", default="1,4")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
