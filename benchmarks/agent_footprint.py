"""One edge agent's idle footprint: resident memory and CPU at a 1 s telemetry interval.

Runs `greenfed edge run` as its own process against a broker, lets it settle,
then samples its RSS and CPU time over a window.

    python benchmarks/agent_footprint.py --greenfed .venv/bin/greenfed --window 60

Pass the `greenfed` of a venv that installed only the `edge` extra to measure an
agent as deployed on a device (`pip install '.[edge]'`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil


def measure(
    greenfed: str, mqtt_url: str, interval_s: float, settle_s: float, window_s: float
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as workdir:
        config = Path(workdir) / "agent.toml"
        config.write_text(
            f'[mqtt]\nurl = "{mqtt_url}"\ntopic_root = "gfbench-{uuid.uuid4().hex[:8]}"\n'
            f'[agent]\nnode_id = "footprint"\ntelemetry_interval_s = {interval_s}\n'
            # Its own state directory (spool, desired and reported state), like a device's.
            f'data_dir = "{workdir}/data"\n'
            '[log]\nlevel = "warning"\n'
        )
        process = subprocess.Popen(
            [greenfed, "edge", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            time.sleep(settle_s)
            if process.poll() is not None:
                raise RuntimeError(
                    f"agent exited: {process.stderr.read().decode() if process.stderr else ''}"
                )
            agent = psutil.Process(process.pid)
            cpu_before = agent.cpu_times()
            started = time.monotonic()
            rss_samples = []
            while time.monotonic() - started < window_s:
                rss_samples.append(agent.memory_info().rss)
                time.sleep(1.0)
            cpu_after = agent.cpu_times()
            elapsed = time.monotonic() - started
            cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
            return {
                "rss_mb_median": round(statistics.median(rss_samples) / 1e6, 1),
                "rss_mb_max": round(max(rss_samples) / 1e6, 1),
                "uss_mb": round(agent.memory_full_info().uss / 1e6, 1),
                "cpu_pct_of_one_core": round(100 * cpu_s / elapsed, 2),
                "threads": agent.num_threads(),
            }
        finally:
            process.terminate()
            process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--greenfed", default=shutil.which("greenfed") or "greenfed")
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry interval, s")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = [
        measure(args.greenfed, args.mqtt_url, args.interval, args.settle, args.window)
        for _ in range(args.runs)
    ]
    summary = {
        "greenfed": args.greenfed,
        "telemetry_interval_s": args.interval,
        "runs": runs,
        "median_rss_mb": statistics.median(r["rss_mb_median"] for r in runs),
        "median_cpu_pct_of_one_core": statistics.median(r["cpu_pct_of_one_core"] for r in runs),
    }
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
