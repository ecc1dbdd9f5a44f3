"""The event loop beside a busy worker thread: database round trips per second and
their latency, at Python's default GIL switch interval (5 ms) and at the control
plane's while it schedules (`cloud.interpreter_tuning.SWITCH_INTERVAL_S`).

    python benchmarks/gil_convoy.py --runs 3

Each sample is five `SELECT 1` round trips to PostgreSQL on one asyncpg connection,
timed on the event loop for `--seconds` while a thread burns CPU in pure Python, as a
scheduling pass does. Every socket call releases the GIL; taking it back from the busy
thread waits for the switch interval (the "convoy effect").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from benchmarks.lifecycle_bench import DEFAULT_POSTGRES_URL
from cloud.interpreter_tuning import SWITCH_INTERVAL_S


def burn(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for value in range(10_000):
            total += value * value


async def sample(url: str, switch_interval_s: float, seconds: float) -> dict[str, float]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval_s)
    stop = threading.Event()
    worker = threading.Thread(target=burn, args=(stop,))
    connection = await asyncpg.connect(url)
    latencies_ms: list[float] = []
    try:
        worker.start()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            for _ in range(5):
                await connection.fetchval("SELECT 1")
            latencies_ms.append((time.perf_counter() - started) * 1000)
    finally:
        stop.set()
        worker.join()
        await connection.close()
        sys.setswitchinterval(previous)
    latencies_ms.sort()
    return {
        "samples_per_s": len(latencies_ms) / seconds,
        "p50_ms": latencies_ms[len(latencies_ms) // 2],
        "p99_ms": latencies_ms[int(len(latencies_ms) * 0.99)],
    }


async def main_async(args: argparse.Namespace) -> None:
    intervals = (0.005, SWITCH_INTERVAL_S)
    results: dict[float, list[dict[str, float]]] = {interval: [] for interval in intervals}
    for _ in range(args.runs):
        for interval in intervals:  # interleaved: the machine's load hits both alike
            result = await sample(args.postgres_url, interval, args.seconds)
            results[interval].append(result)
            print(f"switch interval {interval * 1000:.1f} ms: {result}", flush=True)
    medians = {
        interval: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for interval, runs in results.items()
    }
    default, ours = medians[intervals[0]], medians[intervals[1]]
    print(f"median of {args.runs}: default {default}, control plane {ours}")
    print(
        f"round trips per s: {ours['samples_per_s'] / default['samples_per_s']:.2f}x; "
        f"p99: {ours['p99_ms'] / default['p99_ms']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
