"""Autoscaling on a load step, through the real processes: the time from a step in a
deployment's load to its new replicas serving.

    python benchmarks/autoscale_step.py --steps 3 --rate 40 --target 5

`greenfed up --sim N` (control plane + simulated fleet, one process; telemetry every
`--telemetry-interval` s) runs an autoscaled deployment on the edge devices:
`min_replicas` 1, `max_replicas` `--max`, `--target` requests/s per replica, the
default stabilisation (scale up at once, down after 300 s; shortened here to
`--down-window` so that the steps repeat). Each step drives `--rate` requests/s at its
ready replicas (re-read four times a second) and times, from the first request of the step:

- `decided_s`: until the deployment's desired replicas rose (the scheduler decided);
- `ready_s`: until the wanted replicas all serve (placed, model downloaded and
  loaded, reported ready);

then stops the load and waits for it to shrink back to one. Medians over `--steps`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.inference_bench import small_mlp
from benchmarks.lifecycle_bench import greenfed, new_tenant
from tests.support.brokers import free_port

X = [[1.0, -2.0, 0.5, 3.0]]


async def deployment(http: aiohttp.ClientSession, api: str, token: str, work_id: str) -> Any:
    async with http.get(
        f"{api}/v1/deployments/{work_id}", headers={"Authorization": f"Bearer {token}"}
    ) as response:
        return await response.json()


def ready(body: Any) -> list[str]:
    return [r["endpoint"] for r in body["replica_states"] if r["state"] == "ready"]


async def until(check: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout_s:
            raise RuntimeError("timed out")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="greenfed-autoscale-") as data:
        data_dir = Path(data)
        env = {"GREENFED_STORE__DATA_DIR": data}
        up = [
            "up",
            "--sim",
            str(args.nodes),
            "--api-port",
            str(port),
            "--broker-port",
            str(free_port()),
            "--telemetry-interval",
            str(args.telemetry_interval),
        ]
        async with greenfed(up, env, api, data_dir) as admin, aiohttp.ClientSession() as http:
            token = await new_tenant(http, api, admin)
            headers = {"Authorization": f"Bearer {token}"}
            async with http.post(
                f"{api}/v1/models?name=mlp",
                data=small_mlp(),
                headers=headers | {"Content-Type": "application/octet-stream"},
            ) as response:
                model_id = (await response.json())["id"]
            spec = {
                "name": "risk",
                "model_id": model_id,
                "accepted_kinds": ["cpu"],  # every edge device has one
                "autoscale": {
                    "min_replicas": 1,
                    "max_replicas": args.max,
                    "target_requests_per_s": args.target,
                    "scale_down_stabilization_s": args.down_window,
                },
            }
            async with http.post(f"{api}/v1/deployments", json=spec, headers=headers) as response:
                assert response.status == 201, await response.text()
                work_id = (await response.json())["id"]
            wanted = min(args.max, math.ceil(args.rate / args.target))

            async def one_ready() -> bool:
                return len(ready(await deployment(http, api, token, work_id))) == 1

            await until(one_ready, 120)
            steps = []
            for _ in range(args.steps):
                stop = asyncio.Event()

                async def drive(stop: asyncio.Event = stop) -> None:
                    sent = 0
                    endpoints: list[str] = []
                    begun = time.monotonic()
                    while not stop.is_set():
                        if sent % 10 == 0:  # the ready replicas, four times a second
                            endpoints = ready(await deployment(http, api, token, work_id))
                        if endpoints:
                            with contextlib.suppress(aiohttp.ClientError):
                                url = endpoints[sent % len(endpoints)]
                                async with http.post(url, json={"inputs": {"x": X}}) as answer:
                                    await answer.read()
                        sent += 1
                        # Paced on the clock, so the rate holds whatever a request costs.
                        pause = begun + sent / args.rate - time.monotonic()
                        if pause > 0:
                            await asyncio.sleep(pause)

                load = asyncio.create_task(drive())
                started = time.monotonic()

                async def decided() -> bool:
                    return int((await deployment(http, api, token, work_id))["replicas"]) > 1

                seen: dict[str, Any] = {}

                async def all_ready(seen: dict[str, Any] = seen) -> bool:
                    seen.update(await deployment(http, api, token, work_id))
                    return bool(seen["replicas"] >= wanted and len(ready(seen)) >= wanted)

                await until(decided, 120)
                decided_s = time.monotonic() - started
                try:
                    await until(all_ready, 120)
                except RuntimeError:
                    states = [(r["node_id"], r["state"]) for r in seen["replica_states"]]
                    raise RuntimeError(
                        f"{wanted} wanted, {seen['replicas']} desired: {states}, {seen['reason']}"
                    ) from None
                steps.append({"decided_s": decided_s, "ready_s": time.monotonic() - started})
                stop.set()
                await load
                await until(one_ready, 120 + args.down_window)
    return {
        "nodes": args.nodes,
        "rate_per_s": args.rate,
        "target_per_replica": args.target,
        "wanted_replicas": wanted,
        "telemetry_interval_s": args.telemetry_interval,
        "steps": steps,
        "median_decided_s": round(statistics.median(s["decided_s"] for s in steps), 2),
        "median_ready_s": round(statistics.median(s["ready_s"] for s in steps), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--target", type=float, default=5.0)
    parser.add_argument("--max", type=int, default=8)
    parser.add_argument("--down-window", type=float, default=5.0)
    parser.add_argument("--telemetry-interval", type=float, default=1.0)
    json.dump(asyncio.run(run(parser.parse_args())), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
