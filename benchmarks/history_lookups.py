"""Two reads whose cost must not grow with history: work found by its name, and where
an event stream that starts at a time (`GET /v1/events?since=`) begins.

The store is filled with `--jobs` finished jobs of one tenant (names reused, as runs
of a training script are: `--names` distinct names) and `--events` events spread over
the past 30 days, written straight into the tables (the API would take hours). Then
each read is timed `--repeats` times and its median printed:

- `by name`: `Store.work_matching(tenant, "training", name=...)`, the newest run of a
  name (what `greenfed logs NAME` and every `/v1/jobs/{name}` route read first);
- `by name, active`: the same for the runs that have not ended (there are none);
- `unknown name`: a name never used (a typo, answered 404): every row is a candidate;
- `events since 1 h ago`: `Store.last_event_seq(before=...)`, where a stream of the
  last hour's events starts.

    python benchmarks/history_lookups.py --backends sqlite,postgresql --jobs 200000 --events 1000000

SQLite lives in a temporary directory; PostgreSQL in a temporary schema of
`--postgres-url`, dropped afterwards.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert, text

from benchmarks.store_bench import DEFAULT_POSTGRES_URL, drop_schema
from cloud.store import NewTenant, Store, open_store
from cloud.store.schema import events, work
from shared.settings import StoreSettings

_ROWS_PER_INSERT = 5_000
_DAY_S = 86_400.0


def _work_rows(
    tenant_id: str, first: int, count: int, names: int, now: float
) -> list[dict[str, Any]]:
    rows = []
    for index in range(first, first + count):
        at = now - 30 * _DAY_S + index  # one a second, oldest first: ids sort as time
        spec = {"name": f"train-{index % names}", "command": ["python", "train.py"]}
        rows.append(
            {
                # 26 characters of Crockford base 32 that sort by index, as ULIDs do.
                "id": f"0{index:025d}",
                "tenant_id": tenant_id,
                "kind": "training",
                "spec": msgspec.json.encode(spec),
                "priority": "p1",
                "state": "succeeded",
                "attempts": 1,
                "submitted_at": at,
                "updated_at": at,
                "version": 1,
                "failures": 0,
                "requeues": 0,
            }
        )
    return rows


def _event_rows(
    tenant_id: str, first: int, count: int, total: int, now: float
) -> list[dict[str, Any]]:
    step_s = 30 * _DAY_S / total
    return [
        {
            "tenant_id": tenant_id,
            "work_id": None,
            "kind": "work.state",
            "payload": b'{"state":"succeeded"}',
            "at": now - 30 * _DAY_S + index * step_s,
        }
        for index in range(first, first + count)
    ]


async def _fill(store: Store, tenant_id: str, args: argparse.Namespace, now: float) -> None:
    # Straight into the tables: the API would take hours to write this history.
    engine = store._engine
    for first in range(0, args.jobs, _ROWS_PER_INSERT):
        count = min(_ROWS_PER_INSERT, args.jobs - first)
        async with engine.begin() as connection:
            await connection.execute(
                insert(work), _work_rows(tenant_id, first, count, args.names, now)
            )
    for first in range(0, args.events, _ROWS_PER_INSERT):
        count = min(_ROWS_PER_INSERT, args.events - first)
        async with engine.begin() as connection:
            await connection.execute(
                insert(events), _event_rows(tenant_id, first, count, args.events, now)
            )
    if store.backend == "postgresql":
        async with engine.connect() as connection:
            await connection.execute(text("COMMIT"))
            await connection.execute(text("ANALYZE"))


async def _median_ms(read: Callable[[], Awaitable[object]], repeats: int) -> float:
    await read()  # a warm cache, as a serving control plane has
    times_ms = []
    for _ in range(repeats):
        started = time.perf_counter()
        await read()
        times_ms.append(1000 * (time.perf_counter() - started))
    return statistics.median(times_ms)


async def one_backend(settings: StoreSettings, args: argparse.Namespace) -> dict[str, float]:
    store = await open_store(settings)
    try:
        tenant = await store.create_tenant(NewTenant(name=f"bench-{uuid.uuid4().hex[:8]}"))
        tenant_id = tenant.tenant.tenant_id
        now = time.time()
        started = time.perf_counter()
        await _fill(store, tenant_id, args, now)
        fill_s = time.perf_counter() - started
        name = f"train-{args.names // 2}"
        newest = await store.work_matching(tenant_id, "training", name=name, limit=1)
        assert newest, name
        assert msgspec.json.decode(newest[0].spec)["name"] == name, newest
        return {
            "fill_s": round(fill_s, 1),
            "by_name_ms": await _median_ms(
                lambda: store.work_matching(tenant_id, "training", name=name, limit=1),
                args.repeats,
            ),
            "by_name_active_ms": await _median_ms(
                lambda: store.work_matching(
                    tenant_id, "training", name=name, active_only=True, limit=10
                ),
                args.repeats,
            ),
            "unknown_name_ms": await _median_ms(
                lambda: store.work_matching(tenant_id, "training", name="trian-1", limit=1),
                args.repeats,
            ),
            "events_since_1h_ms": await _median_ms(
                lambda: store.last_event_seq(before=now - 3600), args.repeats
            ),
        }
    finally:
        await store.close()


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for backend in args.backends.split(","):
        if backend == "sqlite":
            with tempfile.TemporaryDirectory(prefix="greenfed-bench-") as data_dir:
                figures = await one_backend(StoreSettings(data_dir=data_dir), args)
        else:
            schema = f"gfbench_{uuid.uuid4().hex[:12]}"
            settings = StoreSettings(database_url=args.postgres_url, database_schema=schema)
            try:
                figures = await one_backend(settings, args)
            finally:
                await drop_schema(args.postgres_url, schema)
        row = {"backend": backend, "jobs": args.jobs, "events": args.events, **figures}
        rows.append(row)
        if not args.json:
            print(
                f"{backend:<10} jobs={args.jobs} events={args.events} (filled in "
                f"{figures['fill_s']} s): by name {figures['by_name_ms']:.2f} ms, "
                f"by name, active {figures['by_name_active_ms']:.2f} ms, "
                f"unknown name {figures['unknown_name_ms']:.2f} ms, "
                f"events since 1 h ago {figures['events_since_1h_ms']:.2f} ms "
                f"(medians of {args.repeats})",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--names", type=int, default=2_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
