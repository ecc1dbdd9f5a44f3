"""`greenfed sim` at scale: N real agents in one process, one MQTT connection each.

Reports how long the whole fleet takes to connect and announce itself, and the
process's steady CPU and memory while the fleet runs.

    python benchmarks/sim_scale.py --nodes 1000 --mqtt-url mqtt://127.0.0.1:1883 --window 60
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import uuid

import psutil

CONNECTED = re.compile(r"simulated fleet: (\d+) nodes connected to .* in ([\d.]+) s")


def measure(
    greenfed: str,
    mqtt_url: str,
    nodes: int,
    interval_s: float,
    connect_rate: float,
    window_s: float,
) -> dict[str, float]:
    env = {
        "GREENFED_MQTT__TOPIC_ROOT": f"gfbench-{uuid.uuid4().hex[:8]}",
        "PYTHONUNBUFFERED": "1",
        "PATH": "/usr/bin:/bin",
    }
    command = [
        greenfed,
        "sim",
        "--sim",
        str(nodes),
        "--mqtt-url",
        mqtt_url,
        "--telemetry-interval",
        str(interval_s),
        "--connect-rate",
        str(connect_rate),
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = CONNECTED.search(line)
        if not match:
            raise RuntimeError(f"unexpected output: {line!r}")
        wall_to_connected = time.monotonic() - started
        sim = psutil.Process(process.pid)
        time.sleep(5.0)  # let the first telemetry round settle
        cpu_before = sim.cpu_times()
        window_start = time.monotonic()
        time.sleep(window_s)
        cpu_after = sim.cpu_times()
        elapsed = time.monotonic() - window_start
        cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
        return {
            "nodes": int(match.group(1)),
            "connect_s_reported": float(match.group(2)),
            "process_start_to_connected_s": round(wall_to_connected, 2),
            "steady_cpu_pct_of_one_core": round(100 * cpu_s / elapsed, 1),
            "rss_mb": round(sim.memory_info().rss / 1e6, 1),
            "telemetry_msgs_per_s": round(nodes / interval_s, 1),
        }
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--greenfed", default=shutil.which("greenfed") or "greenfed")
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0, help="telemetry interval, s")
    parser.add_argument("--connect-rate", type=float, default=200.0)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    result = measure(
        args.greenfed, args.mqtt_url, args.nodes, args.interval, args.connect_rate, args.window
    )
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
