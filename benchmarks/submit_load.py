"""Submissions while scheduling: REST submissions acknowledged per second, and their
latency, while a simulated fleet is connected and the scheduler is placing work.

    python benchmarks/submit_load.py --nodes 1000 --queued 10000 --clients 32 \
        --seconds 60 --runs 3

Each run starts afresh: a temporary PostgreSQL schema (`--backend sqlite` for the
embedded store), `greenfed cloud` in its own process, `greenfed sim` with `--nodes`
real agents (their own MQTT connections) in another, both on the Mosquitto at
`--mqtt-url`. The queue is first filled with `--queued` 1-GPU training jobs; then
`--clients` closed-loop clients POST more of them, each with an idempotency key, for
`--seconds`. Every job runs `--job-seconds` on its simulated GPU, so capacity frees
and the scheduler keeps placing all along. A submission counts when its 201 arrived
(sent only after the commit); afterwards the store must hold exactly the jobs
acknowledged. Figures: acknowledged/s, p50/p99 of the acknowledgement, the passes
and placements the control plane made in the window and its CPU.

`--api-replicas N` (PostgreSQL) starts N more `greenfed cloud` processes on the same
schema with scheduling off, and the clients submit through them (round robin): the
first process, the leader, only schedules. Before the queue is filled, `--probes`
jobs are submitted one at a time through them, each timed from its 201 to the moment
it is out of the queue (placed by the leader): with nothing queued, that is how soon
the leader hears of a submission made in another process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from benchmarks.api_replicas import api_replicas, cloud_process
from benchmarks.lifecycle_bench import (
    DEFAULT_MQTT_URL,
    DEFAULT_POSTGRES_URL,
    database_env,
    greenfed,
    mqtt_broker,
    new_tenant,
)
from shared.desired_signature import public_key_base64
from tests.support.brokers import free_port

_METRIC = re.compile(
    r"^(greenfed_scheduling_(?:passes_total|placements_total|last_pass_seconds)"
    r"|greenfed_event_loop_lag_(?:max_seconds|seconds_count"
    r'|seconds_bucket\{le="0\.1"\})) ([0-9.e+-]+)$',
    re.M,
)
_LAG_UNDER_100_MS = 'greenfed_event_loop_lag_seconds_bucket{le="0.1"}'


async def post_jobs(
    http: aiohttp.ClientSession,
    apis: list[str],
    token: str,
    *,
    clients: int,
    job_seconds: float,
    count: int | None = None,
    seconds: float | None = None,
) -> tuple[list[float], int]:
    """Closed-loop clients POSTing jobs until `count` were acknowledged or `seconds`
    passed, client i through `apis[i % len(apis)]`; returns the latencies of the 201s
    (s) and the number of failures."""
    latencies: list[float] = []
    failures = 0
    stop_at = time.perf_counter() + (seconds if seconds is not None else 1e9)
    headers = {"Authorization": f"Bearer {token}"}
    body: dict[str, Any] = {"command": ["python", "train.py"], "estimated_duration_s": job_seconds}

    async def client(api: str) -> None:
        nonlocal failures
        while time.perf_counter() < stop_at and (count is None or len(latencies) < count):
            started = time.perf_counter()
            key = uuid.uuid4().hex
            async with http.post(
                f"{api}/v1/jobs",
                json=body | {"name": f"load-{key[:12]}"},
                headers=headers | {"Idempotency-Key": key},
            ) as response:
                answer = await response.read()
                if response.status != 201:
                    failures += 1
                    if failures > 100:
                        raise RuntimeError(f"submissions failing: {response.status} {answer!r}")
                    continue
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client(apis[index % len(apis)]) for index in range(clients)))
    return latencies, failures


async def placement_probes(
    http: aiohttp.ClientSession, apis: list[str], token: str, probes: int, job_seconds: float
) -> list[float]:
    """Jobs submitted one at a time, each through the next of `apis`; for each, the
    seconds from its 201 until that API shows it out of the queue."""
    headers = {"Authorization": f"Bearer {token}"}
    body = {"command": ["python", "train.py"], "estimated_duration_s": job_seconds}
    waits: list[float] = []
    for index in range(probes):
        api = apis[index % len(apis)]
        async with http.post(
            f"{api}/v1/jobs", json=body | {"name": f"probe-{index}"}, headers=headers
        ) as response:
            assert response.status == 201, await response.text()
            job_id = (await response.json())["id"]
        acknowledged = time.perf_counter()
        async with asyncio.timeout(60):
            while True:
                async with http.get(f"{api}/v1/jobs/{job_id}", headers=headers) as response:
                    state = (await response.json())["state"]
                if state != "pending":
                    break
                await asyncio.sleep(0.005)
        waits.append(time.perf_counter() - acknowledged)
    return sorted(waits)


async def scheduling_counters(
    http: aiohttp.ClientSession, api: str, admin: str
) -> dict[str, float]:
    async with http.get(f"{api}/metrics", headers={"Authorization": f"Bearer {admin}"}) as response:
        text = await response.text()
    return {name: float(value) for name, value in _METRIC.findall(text)}


async def stored_jobs(http: aiohttp.ClientSession, api: str, token: str) -> Counter[str]:
    """The tenant's jobs by state, walking `/v1/jobs` page by page."""
    states: Counter[str] = Counter()
    cursor = None
    while True:
        params = {"limit": "500"} | ({"cursor": cursor} if cursor else {})
        async with http.get(
            f"{api}/v1/jobs", params=params, headers={"Authorization": f"Bearer {token}"}
        ) as response:
            page = await response.json()
        states.update(item["state"] for item in page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return states


def control_plane_key(data_dir: Path) -> str:
    """The public half of the key `greenfed cloud` signs `desired` documents with."""
    pem = (data_dir / "desired-signing.key").read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return public_key_base64(key)


def cpu_s(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


async def one_run(args: argparse.Namespace, mqtt_url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        root = f"bench-{uuid.uuid4().hex[:8]}"
        async with database_env(args.backend, args.postgres_url, data_dir) as store_env:
            env = store_env | {
                "GREENFED_CLOUD__API_PORT": str(port),
                "GREENFED_MQTT__URL": mqtt_url,
                "GREENFED_MQTT__TOPIC_ROOT": root,
                "GREENFED_MQTT__SHARED_GROUP": args.shared_group,
            }
            sim_args = ["sim", "--sim", str(args.nodes), "--mqtt-url", mqtt_url]
            sim_env = {"GREENFED_MQTT__TOPIC_ROOT": root, "GREENFED_STORE__DATA_DIR": tmp}
            connector = aiohttp.TCPConnector(limit=args.clients)
            async with contextlib.AsyncExitStack() as stack:
                admin = await stack.enter_async_context(greenfed(["cloud"], env, api, data_dir))
                started = await stack.enter_async_context(
                    api_replicas(env, args.api_replicas, data_dir)
                )
                replica_apis = [replica.api for replica in started]
                serving = replica_apis or [api]  # where the clients submit
                http = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
                cloud = cloud_process(port)
                replicas = [replica.process for replica in started]
                # The agents apply only documents this control plane signed.
                sim_env["GREENFED_AGENT__CONTROL_PLANE_PUBLIC_KEY"] = control_plane_key(data_dir)
                sim = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "greenfed.cli",
                    *sim_args,
                    env=os.environ | sim_env,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    token = await new_tenant(http, api, admin)
                    await online(http, api, admin, args.nodes)
                    print(f"{args.nodes} nodes online", file=sys.stderr, flush=True)
                    probes = await placement_probes(
                        http, serving, token, args.probes, args.job_seconds
                    )
                    began = time.perf_counter()
                    filled, fill_failures = await post_jobs(
                        http,
                        serving,
                        token,
                        clients=args.clients,
                        job_seconds=args.job_seconds,
                        count=args.queued,
                    )
                    fill_s = time.perf_counter() - began
                    print(f"{len(filled)} queued in {fill_s:.1f} s", file=sys.stderr, flush=True)
                    before = await scheduling_counters(http, api, admin)
                    replicas_before = [
                        await scheduling_counters(http, replica_api, admin)
                        for replica_api in replica_apis
                    ]
                    cpu_before = cpu_s([cloud]), cpu_s(replicas)
                    began = time.perf_counter()
                    latencies, failures = await post_jobs(
                        http,
                        serving,
                        token,
                        clients=args.clients,
                        job_seconds=args.job_seconds,
                        seconds=args.seconds,
                    )
                    elapsed = time.perf_counter() - began
                    cpu_after = cpu_s([cloud]), cpu_s(replicas)
                    after = await scheduling_counters(http, api, admin)
                    replicas_after = [
                        await scheduling_counters(http, replica_api, admin)
                        for replica_api in replica_apis
                    ]
                    stored = await stored_jobs(http, api, token)
                finally:
                    sim.terminate()
                    await sim.wait()
    latencies.sort()
    acknowledged = len(probes) + len(filled) + len(latencies)
    replica_lags = [
        lag_over_100_ms(late) - lag_over_100_ms(early)
        for early, late in zip(replicas_before, replicas_after, strict=True)
    ]
    return {
        "api_replicas": args.api_replicas,
        "probe_p50_ms": round(probes[len(probes) // 2] * 1000, 1) if probes else None,
        "probe_p90_ms": round(probes[int(len(probes) * 0.9)] * 1000, 1) if probes else None,
        "probe_max_ms": round(probes[-1] * 1000, 1) if probes else None,
        "fill_per_s": round(len(filled) / fill_s, 1),
        "per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
        "failures": failures + fill_failures,
        "acknowledged": acknowledged,
        "stored": stored.total(),
        "states": dict(stored),
        "passes": after.get("greenfed_scheduling_passes_total", 0)
        - before.get("greenfed_scheduling_passes_total", 0),
        "placements": after.get("greenfed_scheduling_placements_total", 0)
        - before.get("greenfed_scheduling_placements_total", 0),
        # The leader's CPU, and the API replicas' together.
        "cloud_cpu_pct": round(100 * (cpu_after[0] - cpu_before[0]) / elapsed, 1),
        "replicas_cpu_pct": round(100 * (cpu_after[1] - cpu_before[1]) / elapsed, 1),
        "last_pass_ms": round(after.get("greenfed_scheduling_last_pass_seconds", 0) * 1000, 1),
        # The event loop's timer samples (every 50 ms) that ran over 100 ms late, and
        # the worst lag, over the window.
        "loop_lag_over_100ms": lag_over_100_ms(after) - lag_over_100_ms(before),
        "loop_lag_max_ms": round(after.get("greenfed_event_loop_lag_max_seconds", 0) * 1000, 1),
        # The same for the replicas' loops (they serve the submissions): summed, worst.
        "replica_lag_over_100ms": sum(replica_lags),
        "replica_lag_max_ms": max(
            (
                round(late.get("greenfed_event_loop_lag_max_seconds", 0) * 1000, 1)
                for late in replicas_after
            ),
            default=0.0,
        ),
    }


def lag_over_100_ms(counters: dict[str, float]) -> float:
    return counters.get("greenfed_event_loop_lag_seconds_count", 0) - counters.get(
        _LAG_UNDER_100_MS, 0
    )


async def online(http: aiohttp.ClientSession, api: str, admin: str, nodes: int) -> None:
    """Wait until `nodes` nodes are online."""
    headers = {"Authorization": f"Bearer {admin}"}
    params = {"state": "online", "limit": "1"}
    async with asyncio.timeout(300):
        while True:
            async with http.get(f"{api}/v1/nodes", params=params, headers=headers) as response:
                total = (await response.json())["total"]
                if total >= nodes:
                    return
            print(f"{total} of {nodes} nodes online", file=sys.stderr, flush=True)
            await asyncio.sleep(1.0)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    async with mqtt_broker(args.mqtt_url) as mqtt_url:
        for index in range(args.runs):
            result = await one_run(args, mqtt_url)
            print(f"run {index + 1}: {json.dumps(result)}", flush=True)
            runs.append(result)
    summary = {
        key: statistics.median(run[key] for run in runs)
        for key in (
            "per_s",
            "p50_ms",
            "p99_ms",
            "fill_per_s",
            "passes",
            "placements",
            "cloud_cpu_pct",
            "replicas_cpu_pct",
            "loop_lag_over_100ms",
            "loop_lag_max_ms",
            "replica_lag_over_100ms",
            "replica_lag_max_ms",
        )
    }
    for key in ("probe_p50_ms", "probe_p90_ms", "probe_max_ms"):
        probes = [run[key] for run in runs if run[key] is not None]
        summary[key] = statistics.median(probes) if probes else None
    summary["lost_or_extra"] = sum(abs(run["stored"] - run["acknowledged"]) for run in runs)
    summary["failures"] = sum(run["failures"] for run in runs)
    print(f"median of {len(runs)}: {json.dumps(summary)}", flush=True)
    return {"runs": runs, "median": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="postgresql", choices=("postgresql", "sqlite"))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=10000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--job-seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--api-replicas",
        type=int,
        default=0,
        help="API-only `greenfed cloud` processes the clients submit through (0: the leader)",
    )
    parser.add_argument(
        "--shared-group",
        default="",
        help="mqtt.shared_group of every control-plane process (replicas split telemetry)",
    )
    parser.add_argument(
        "--probes", type=int, default=20, help="jobs timed from their 201 to their placement"
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--mqtt-url", default=DEFAULT_MQTT_URL)
    args = parser.parse_args()
    if args.api_replicas and args.backend != "postgresql":
        parser.error("--api-replicas needs PostgreSQL (one SQLite writer process)")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
