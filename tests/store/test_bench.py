"""The store benchmark runs end to end and reports what RESULTS.md records."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "store_bench.py"


async def test_the_store_benchmark_reports_medians() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(BENCH),
        "--backends",
        "sqlite",
        "--writers",
        "1,2",
        "--seconds",
        "0.2",
        "--runs",
        "1",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    rows = json.loads(stdout)
    assert [(row["backend"], row["writers"]) for row in rows] == [("sqlite", 1), ("sqlite", 2)]
    for row in rows:
        assert row["median_inserts_per_s"] > 0
        assert row["median_latency_p50_ms"] <= row["median_latency_p99_ms"]
