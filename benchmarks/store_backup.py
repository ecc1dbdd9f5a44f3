"""Backup and restore time of a store of 1,000 jobs and 100 nodes (SQLite and PostgreSQL).

The store is filled through the store's own API the way a day of work leaves it: 100
enrolled nodes (one join token), 10 tenants, 1,000 training jobs (~600-byte specs) of
which 600 ran and succeeded, 300 run now (allocations on the 100 nodes) and 100 wait,
with every `work.state` event that history wrote. Then, `--runs` times each:

- `greenfed store backup`'s work (`take_backup`): the consistent snapshot into the
  gzip file;
- `greenfed store restore`'s work (`restore_backup`) into an empty database of the same
  backend (a new SQLite file; a new PostgreSQL schema), migrations included;
- the first `open_store` of the restored database (what `greenfed cloud` then does);
- with `--across`, the restore of the same file into the other backend;
- the restore of an empty store's backup: what a restore costs whatever the size.

    python benchmarks/store_backup.py --backends sqlite,postgresql --runs 3 --across

Medians are printed; SQLite lives in temporary directories, PostgreSQL in temporary
schemas of `--postgres-url`, dropped afterwards.
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.store_bench import DEFAULT_POSTGRES_URL, drop_schema, job_spec
from cloud.store import (
    NewAllocation,
    NewTenant,
    PassWrite,
    PlacementWrite,
    StateWrite,
    open_store,
)
from cloud.store.backup import take_backup
from cloud.store.enrolment import NewJoinToken
from cloud.store.restore import restore_backup
from shared.settings import StoreSettings

NODES = 100
JOBS = 1000
SUCCEEDED = 600
RUNNING = 300  # the rest wait


@asynccontextmanager
async def empty_store(
    backend: str, postgres_url: str, workdir: Path
) -> AsyncIterator[StoreSettings]:
    if backend == "sqlite":
        yield StoreSettings(data_dir=str(workdir / uuid.uuid4().hex[:8]))
        return
    schema = f"gfbench_{uuid.uuid4().hex[:12]}"
    try:
        yield StoreSettings(database_url=postgres_url, database_schema=schema)
    finally:
        await drop_schema(postgres_url, schema)


def _allocation(node_index: int) -> NewAllocation:
    return NewAllocation(
        member_index=0,
        node_id=f"gpu-{node_index:03d}",
        accelerator_kind="gpu",
        accelerators=2,
        accelerator_ids=("0", "1"),
        host_memory_bytes=64 * 2**30,
    )


async def fill(settings: StoreSettings) -> None:
    """The store described above."""
    store = await open_store(settings)
    try:
        join = await store.create_join_token(NewJoinToken(ttl_s=3600, max_uses=NODES))
        for index in range(NODES):
            await store.redeem_join_token(join.token, f"gpu-{index:03d}")
        tenants = [
            (await store.create_tenant(NewTenant(name=f"tenant-{i}"))).tenant.tenant_id
            for i in range(10)
        ]
        work = [
            (
                await store.submit_work(
                    tenants[i % len(tenants)],
                    kind="training",
                    spec=job_spec(i),
                    priority="p1",
                    idempotency_key=f"job-{i}",
                )
            ).work
            for i in range(JOBS)
        ]
        lease = await store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            placed = work[: SUCCEEDED + RUNNING]
            for start in range(0, len(placed), 100):
                batch = placed[start : start + 100]
                await store.commit_pass(
                    PassWrite(
                        placements=tuple(
                            PlacementWrite(work_id=w.work_id, allocations=(_allocation(start + i),))
                            for i, w in enumerate(batch)
                        )
                    ),
                    lease=lease,
                )
                await store.commit_pass(
                    PassWrite(
                        state_changes=tuple(
                            StateWrite(work_id=w.work_id, to_state="running") for w in batch
                        )
                    ),
                    lease=lease,
                )
            await store.commit_pass(
                PassWrite(
                    state_changes=tuple(
                        StateWrite(work_id=w.work_id, to_state="succeeded")
                        for w in work[:SUCCEEDED]
                    )
                ),
                lease=lease,
            )
    finally:
        await store.close()


async def _restore_empty_store(
    backend: str, runs: int, postgres_url: str, root: Path
) -> list[float]:
    """What a restore costs whatever the store holds: that of a store with no rows."""
    backup = root / "empty.backup"
    async with empty_store(backend, postgres_url, root) as source:
        await (await open_store(source)).close()
        await take_backup(source, backup, greenfed_version="bench")
    elapsed_s = []
    for _ in range(runs):
        async with empty_store(backend, postgres_url, root) as target:
            elapsed_s.append((await restore_backup(target, backup)).elapsed_s)
    return elapsed_s


async def one_backend(
    backend: str, runs: int, postgres_url: str, across: str | None
) -> dict[str, Any]:
    """`across`: the other backend, to restore this one's backup into as well."""
    timings: dict[str, list[float]] = {"backup_s": [], "restore_s": [], "first_open_s": []}
    if across is not None:
        timings[f"restore_into_{across}_s"] = []
    with tempfile.TemporaryDirectory(prefix="greenfed-backup-bench-") as workdir:
        root = Path(workdir)
        timings["restore_empty_store_s"] = await _restore_empty_store(
            backend, runs, postgres_url, root
        )
        async with empty_store(backend, postgres_url, root) as source:
            await fill(source)
            backup = root / "greenfed.backup"
            for _ in range(runs):
                report = await take_backup(source, backup, greenfed_version="bench")
                timings["backup_s"].append(report.elapsed_s)
                async with empty_store(backend, postgres_url, root) as target:
                    restored = await restore_backup(target, backup)
                    timings["restore_s"].append(restored.elapsed_s)
                    started = time.perf_counter()
                    store = await open_store(target)
                    timings["first_open_s"].append(time.perf_counter() - started)
                    await store.close()
                if across is not None:
                    async with empty_store(across, postgres_url, root) as target:
                        restored = await restore_backup(target, backup)
                        timings[f"restore_into_{across}_s"].append(restored.elapsed_s)
    rows = report.rows
    return {
        "backend": backend,
        "runs": runs,
        "jobs": rows["work"],
        "enrolled_nodes": rows["enrolled_nodes"],
        "events": rows["events"],
        "rows": sum(count for name, count in rows.items() if name != "schema_version"),
        "file_bytes": report.size_bytes,
        **{f"median_{key}": round(statistics.median(values), 3) for key, values in timings.items()},
        "each_run": {key: [round(v, 3) for v in values] for key, values in timings.items()},
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    backends = args.backends.split(",")
    for backend in backends:
        others = [other for other in backends if other != backend]
        across = others[0] if args.across and others else None
        result = await one_backend(backend, args.runs, args.postgres_url, across)
        results.append(result)
        if not args.json:
            into = (
                f"restore into {across} {result[f'median_restore_into_{across}_s']:.3f} s, "
                if across
                else ""
            )
            print(
                f"{backend:<10} {result['jobs']} jobs, {result['enrolled_nodes']} nodes, "
                f"{result['events']} events ({result['rows']} rows, "
                f"{result['file_bytes'] / 1e3:.0f} kB): median of {args.runs}: "
                f"backup {result['median_backup_s']:.3f} s, "
                f"restore {result['median_restore_s']:.3f} s "
                f"(of an empty store {result['median_restore_empty_store_s']:.3f} s), {into}"
                f"first open {result['median_first_open_s']:.3f} s  (runs: {result['each_run']})",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--across", action="store_true", help="also restore each backup into the other backend"
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
