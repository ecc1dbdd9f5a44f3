"""The job lifecycle through the real processes: REST submissions per second, and the
time from `POST /v1/jobs` to the agent's `running`.

    python benchmarks/lifecycle_bench.py --backends sqlite,postgresql --clients 1,8 \
        --seconds 5 --runs 3 --latency-jobs 60

Submissions: `greenfed cloud` runs in its own process (scheduling loop on, no fleet);
`--clients` closed-loop clients POST 1-GPU training jobs, each with an idempotency
key, for `--seconds`; a submission counts when its 201 arrived (the job is committed
by then). Medians of `--runs` runs.

Latency: `greenfed up` (control plane + the 40-node simulated fleet, one process) on
the same backend; one 1-GPU job at a time on an otherwise idle fleet, each finishing
within a second, timed from just before the POST to the `work.state` event saying
`running` on the tenant's event stream (the agent has started the worker and said so).

MQTT: the Mosquitto at 127.0.0.1:1883 when reachable (`--mqtt-url`), else an
embedded broker in this process. PostgreSQL: a temporary schema of `--postgres-url`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

# The tests' ports: below the kernel's ephemeral range, so that no outgoing connection
# (database, broker) takes a server's port between the probe and the server's bind.
from tests.support.brokers import free_port

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MQTT_URL = "mqtt://127.0.0.1:1883"


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


@contextlib.asynccontextmanager
async def mqtt_broker(url: str) -> AsyncIterator[str]:
    host_port = url.removeprefix("mqtt://")
    host, _, port = host_port.partition(":")
    if reachable(host, int(port or 1883)):
        yield url
        return
    from greenfed.broker import EmbeddedBroker

    async with EmbeddedBroker(port=0) as broker:
        yield broker.url


@contextlib.asynccontextmanager
async def database_env(
    backend: str, postgres_url: str, data_dir: Path
) -> AsyncIterator[dict[str, str]]:
    env = {"GREENFED_STORE__DATA_DIR": str(data_dir)}
    if backend == "sqlite":
        yield env
        return
    schema = f"gfbench_{uuid.uuid4().hex[:10]}"
    env |= {"GREENFED_STORE__DATABASE_URL": postgres_url, "GREENFED_STORE__DATABASE_SCHEMA": schema}
    try:
        yield env
    finally:
        engine = create_async_engine(make_url(postgres_url).set(drivername="postgresql+asyncpg"))
        async with engine.begin() as connection:
            await connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        await engine.dispose()


@contextlib.asynccontextmanager
async def greenfed(
    args: list[str], env: dict[str, str], api: str, data_dir: Path
) -> AsyncIterator[str]:
    """Run `greenfed ARGS` until the block ends; yields the admin token."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GREENFED_")} | env
    full_env["GREENFED_LOG__LEVEL"] = "warning"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "greenfed.cli",
        *args,
        env=full_env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        token_file = data_dir / "admin-token"
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as http:
            while True:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"greenfed {' '.join(args)} did not come up")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{api}/healthz") as response:
                        if response.status == 200 and token_file.exists():
                            break
                await asyncio.sleep(0.1)
        yield token_file.read_text().split()[-1]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


async def new_tenant(http: aiohttp.ClientSession, api: str, admin: str) -> str:
    async with http.post(
        f"{api}/v1/tenants",
        json={"name": f"bench-{uuid.uuid4().hex[:6]}"},
        headers={"Authorization": f"Bearer {admin}"},
    ) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["token"])


def job_body(name: str, duration_s: float = 600.0) -> dict[str, Any]:
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": duration_s}


async def submission_run(api: str, token: str, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {token}"}

    async def client(http: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            key = uuid.uuid4().hex
            async with http.post(
                f"{api}/v1/jobs",
                json=job_body(f"s-{key[:8]}"),
                headers=headers | {"Idempotency-Key": key},
            ) as response:
                assert response.status == 201, await response.text()
                await response.read()
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "per_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
    }


async def submissions(
    args: argparse.Namespace, backend: str, mqtt_url: str
) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        async with database_env(backend, args.postgres_url, data_dir) as store_env:
            env = store_env | {
                "GREENFED_CLOUD__API_PORT": str(port),
                "GREENFED_MQTT__URL": mqtt_url,
                "GREENFED_MQTT__TOPIC_ROOT": f"bench-{uuid.uuid4().hex[:8]}",
            }
            async with (
                greenfed(["cloud"], env, api, data_dir) as admin,
                aiohttp.ClientSession() as http,
            ):
                token = await new_tenant(http, api, admin)
                for clients in args.clients:
                    runs = [
                        await submission_run(api, token, clients, args.seconds)
                        for _ in range(args.runs)
                    ]
                    result = {
                        "backend": backend,
                        "clients": clients,
                        "submissions_per_s": statistics.median(r["per_s"] for r in runs),
                        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                        "runs_per_s": [round(r["per_s"], 1) for r in runs],
                    }
                    print(
                        f"submit  {backend:10} clients {clients:2}: "
                        f"{result['submissions_per_s']:7.1f}/s "
                        f"(runs {result['runs_per_s']}), p50 {result['p50_ms']:.1f} ms, "
                        f"p99 {result['p99_ms']:.1f} ms",
                        flush=True,
                    )
                    results.append(result)
    return results


async def running_latency(args: argparse.Namespace, backend: str, mqtt_url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        async with database_env(backend, args.postgres_url, data_dir) as store_env:
            env = store_env | {"GREENFED_MQTT__TOPIC_ROOT": f"bench-{uuid.uuid4().hex[:8]}"}
            up = ["up", "--mqtt-url", mqtt_url, "--api-port", str(port)]
            async with greenfed(up, env, api, data_dir) as admin, aiohttp.ClientSession() as http:
                token = await new_tenant(http, api, admin)
                headers = {"Authorization": f"Bearer {token}"}
                running_at: dict[str, float] = {}
                changed = asyncio.Event()
                opened = asyncio.Event()

                async def follow() -> None:
                    forever = aiohttp.ClientTimeout(total=None)
                    async with http.get(
                        f"{api}/v1/events", headers=headers, timeout=forever
                    ) as stream:
                        opened.set()
                        async for raw in stream.content:
                            line = raw.decode().strip()
                            if not line.startswith("data: "):
                                continue
                            payload = json.loads(line[6:])["payload"]
                            if payload.get("state") == "running":
                                running_at.setdefault(payload["work_id"], time.perf_counter())
                                changed.set()

                follower = asyncio.create_task(follow())
                await asyncio.wait_for(opened.wait(), 10)
                await asyncio.sleep(2.0)  # let the fleet's births and first telemetry land
                latencies = []
                for index in range(args.latency_jobs):
                    started = time.perf_counter()
                    async with http.post(
                        f"{api}/v1/jobs", json=job_body(f"l-{index}", 1.0), headers=headers
                    ) as response:
                        assert response.status == 201, await response.text()
                        work_id = (await response.json())["id"]
                    async with asyncio.timeout(30):
                        while work_id not in running_at:
                            changed.clear()
                            await changed.wait()
                    latencies.append((running_at[work_id] - started) * 1000)
                    await asyncio.sleep(0.1)
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
    latencies.sort()
    result = {
        "backend": backend,
        "jobs": len(latencies),
        "p50_ms": statistics.median(latencies),
        "p90_ms": latencies[int(len(latencies) * 0.9)],
        "max_ms": latencies[-1],
    }
    print(
        f"running {backend:10} {result['jobs']} jobs: p50 {result['p50_ms']:.0f} ms, "
        f"p90 {result['p90_ms']:.0f} ms, max {result['max_ms']:.0f} ms",
        flush=True,
    )
    return result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"submissions": [], "running": []}
    async with mqtt_broker(args.mqtt_url) as mqtt_url:
        for backend in args.backends:
            out["submissions"] += await submissions(args, backend, mqtt_url)
            if args.latency_jobs:
                out["running"].append(await running_latency(args, backend, mqtt_url))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql", type=lambda s: s.split(","))
    parser.add_argument("--clients", default="1,8", type=lambda s: [int(c) for c in s.split(",")])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-jobs", type=int, default=60)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--mqtt-url", default=DEFAULT_MQTT_URL)
    parser.add_argument("--json", action="store_true", help="also print one JSON document")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
