"""Edge serving: the endpoint's overhead over ONNX Runtime in-process, and what dynamic
batching buys at 32 concurrent clients.

    python benchmarks/inference_bench.py --requests 2000 --runs 3 --seconds 5

Real processes: `greenfed cloud` and one `greenfed edge run` agent (CPU probe only,
its own process), the model uploaded and deployed through the REST API, downloaded
and loaded by the agent exactly as in production. The client is this process.

Overhead (batch 1): the same small MLP (x[1, 4] -> y[1, 3]) called `--requests`
times in a row (a) with `session.run` in this process, with the agent's session
options, and (b) over loopback HTTP to the agent's endpoint, with a JSON body and
with a `.npy` body; overhead = p50(b) - p50(a). Medians of `--runs` runs.

Batching: a wider MLP (x[batch, 1024] -> four 1024x1024 MatMul+Relu layers), one
deployment switched between `batching = {max_batch_size = 32, max_wait_ms = 2}` and
no batching with `PATCH /v1/deployments/{id}`; 32 closed-loop clients POST
single-row `.npy` requests for `--seconds`; throughput with / without. Medians of
`--runs` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import io
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
from onnx import TensorProto, helper, numpy_helper

NPY = "application/x-npy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def small_mlp() -> bytes:
    rng = np.random.default_rng(7)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def wide_mlp(width: int = 1024, layers: int = 4) -> bytes:
    rng = np.random.default_rng(11)
    nodes, inits = [], []
    previous = "x"
    for i in range(layers):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"W{i}"))
        nodes.append(helper.make_node("MatMul", [previous, f"W{i}"], [f"h{i}"]))
        out = "y" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"h{i}"], [out]))
        previous = out
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@contextlib.asynccontextmanager
async def process(args: list[str], env: dict[str, str]) -> AsyncIterator[None]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GREENFED_")} | env
    full["GREENFED_LOG__LEVEL"] = "warning"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "greenfed.cli", *args, env=full,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), 15)
        except TimeoutError:
            child.kill()
            await child.wait()


async def until(condition: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, FileNotFoundError, KeyError):
            value = await condition()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting")
        await asyncio.sleep(0.2)


class Cloud:
    def __init__(self, http: aiohttp.ClientSession, api: str, token: str) -> None:
        self.http, self.api, self.headers = http, api, {"Authorization": f"Bearer {token}"}

    async def upload(self, body: bytes, name: str) -> str:
        async with self.http.post(
            f"{self.api}/v1/models?name={name}", data=body,
            headers=self.headers | {"Content-Type": "application/octet-stream"},
        ) as response:  # fmt: skip
            assert response.status == 201, await response.text()
            return str((await response.json())["id"])

    async def deploy(self, model_id: str, name: str, batching: dict[str, float] | None) -> str:
        spec: dict[str, Any] = {
            "name": name, "model_id": model_id, "accepted_kinds": ["cpu"], "priority": "p1",
        }  # fmt: skip
        if batching:
            spec["batching"] = batching
        async with self.http.post(
            f"{self.api}/v1/deployments", json=spec, headers=self.headers
        ) as response:
            assert response.status == 201, await response.text()
            deployment_id = str((await response.json())["id"])

        async def endpoint() -> str | None:
            async with self.http.get(
                f"{self.api}/v1/deployments/{deployment_id}", headers=self.headers
            ) as response:
                states = (await response.json())["replica_states"]
            ready = [s["endpoint"] for s in states if s["state"] == "ready"]
            return ready[0] if ready else None

        self.deployment_id = deployment_id
        return str(await until(endpoint))

    async def cancel(self) -> None:
        async with self.http.delete(
            f"{self.api}/v1/deployments/{self.deployment_id}", headers=self.headers
        ) as response:
            assert response.status == 200, await response.text()

    async def batching(self, settings: dict[str, float]) -> None:
        async with self.http.patch(
            f"{self.api}/v1/deployments/{self.deployment_id}",
            json={"batching": settings},
            headers=self.headers,
        ) as response:
            assert response.status == 200, await response.text()
        await asyncio.sleep(2.0)  # the agent applies it with the next desired document


def sequential_ms(url: str, n: int, body: bytes, headers: dict[str, str]) -> float:
    """p50 of `n` requests in a row on one kept-alive connection (a lean client, so the
    figure is the endpoint's, not the client library's)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    latencies = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            connection.request("POST", parts.path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        connection.close()
    return statistics.median(latencies)


def in_process_ms(path: Path, n: int) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(path), ort.SessionOptions(), providers=["CPUExecutionProvider"]
    )
    x = np.ones((1, 4), np.float32)
    session.run(None, {"x": x})
    latencies = []
    for _ in range(n):
        started = time.perf_counter()
        session.run(None, {"x": x})
        latencies.append((time.perf_counter() - started) * 1000)
    return statistics.median(latencies)


async def throughput(url: str, clients: int, seconds: float) -> float:
    body = npy(np.random.default_rng(3).standard_normal((1, 1024)).astype(np.float32))
    headers = {"Content-Type": NPY, "Accept": NPY}
    done = 0
    stop_at = time.perf_counter() + seconds

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            async with http.post(url, data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, response.status
            done += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return done / (time.perf_counter() - began)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from greenfed.broker import EmbeddedBroker

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        api_port, agent_port = free_port(), free_port()
        api = f"http://127.0.0.1:{api_port}"
        async with EmbeddedBroker(port=0) as broker:
            common = {"GREENFED_MQTT__URL": broker.url, "GREENFED_MQTT__TOPIC_ROOT": "bench"}
            cloud_env = common | {
                "GREENFED_STORE__DATA_DIR": str(root / "cloud"),
                "GREENFED_CLOUD__API_PORT": str(api_port),
            }
            agent_env = common | {
                "GREENFED_AGENT__NODE_ID": "bench-edge",
                "GREENFED_AGENT__SITE": "edge",
                "GREENFED_AGENT__ZONE": "CA-ON",
                "GREENFED_AGENT__REGION": "northamerica-northeast2",
                "GREENFED_AGENT__PROBES": '["cpu"]',
                "GREENFED_AGENT__DATA_DIR": str(root / "agent"),
                "GREENFED_AGENT__INFERENCE_PORT": str(agent_port),
                "GREENFED_AGENT__TELEMETRY_INTERVAL_S": "1",
            }
            async with (
                process(["cloud"], cloud_env),
                process(["edge", "run"], agent_env),
                aiohttp.ClientSession() as http,
            ):
                token_file = root / "cloud" / "admin-token"

                async def healthy() -> bool:
                    async with http.get(f"{api}/healthz") as response:
                        return response.status == 200 and await asyncio.to_thread(token_file.exists)

                await until(healthy)
                admin = token_file.read_text().split()[-1]
                async with http.post(
                    f"{api}/v1/tenants", json={"name": "bench"},
                    headers={"Authorization": f"Bearer {admin}"},
                ) as response:  # fmt: skip
                    token = (await response.json())["token"]
                cloud = Cloud(http, api, token)
                small = small_mlp()
                (root / "small.onnx").write_bytes(small)
                small_url = await cloud.deploy(await cloud.upload(small, "small"), "small", None)

                x = np.ones((1, 4), np.float32)
                overhead = []
                for _ in range(args.runs):
                    local = in_process_ms(root / "small.onnx", args.requests)
                    as_json = await asyncio.to_thread(
                        sequential_ms,
                        small_url,
                        args.requests,
                        json.dumps({"inputs": {"x": x.tolist()}}).encode(),
                        {"Content-Type": "application/json"},
                    )
                    as_npy = await asyncio.to_thread(
                        sequential_ms,
                        small_url,
                        args.requests,
                        npy(x),
                        {"Content-Type": NPY, "Accept": NPY},
                    )
                    overhead.append((local, as_json, as_npy))
                    print(
                        f"batch 1: in-process p50 {local * 1000:.0f} µs, HTTP JSON p50 "
                        f"{as_json * 1000:.0f} µs, HTTP .npy p50 {as_npy * 1000:.0f} µs",
                        flush=True,
                    )
                # The node has one CPU: one deployment at a time; batching is switched on
                # and off on the same deployment (PATCH) between measurements.
                await cloud.cancel()
                wide_id = await cloud.upload(wide_mlp(), "wide")
                batched: dict[str, float] = {"max_batch_size": 32, "max_wait_ms": 2}
                wide_url = await cloud.deploy(wide_id, "wide", batched)
                ratios = []
                for _ in range(args.runs):
                    await cloud.batching(batched)
                    with_batching = await throughput(wide_url, args.clients, args.seconds)
                    await cloud.batching({"max_batch_size": 1, "max_wait_ms": 0})
                    without = await throughput(wide_url, args.clients, args.seconds)
                    ratios.append((with_batching, without))
                    print(
                        f"{args.clients} clients: batching {with_batching:.0f} req/s, "
                        f"without {without:.0f} req/s ({with_batching / without:.2f}x)",
                        flush=True,
                    )
    local_p50 = statistics.median(o[0] for o in overhead)
    json_p50 = statistics.median(o[1] for o in overhead)
    npy_p50 = statistics.median(o[2] for o in overhead)
    result = {
        "in_process_p50_us": local_p50 * 1000,
        "http_json_p50_us": json_p50 * 1000,
        "http_npy_p50_us": npy_p50 * 1000,
        "overhead_json_p50_us": (json_p50 - local_p50) * 1000,
        "overhead_npy_p50_us": (npy_p50 - local_p50) * 1000,
        "batched_req_per_s": statistics.median(r[0] for r in ratios),
        "unbatched_req_per_s": statistics.median(r[1] for r in ratios),
        "batching_speedup": statistics.median(r[0] / r[1] for r in ratios),
    }
    print(
        f"overhead p50: JSON {result['overhead_json_p50_us']:.0f} µs, "
        f".npy {result['overhead_npy_p50_us']:.0f} µs; batching speed-up "
        f"{result['batching_speedup']:.2f}x "
        f"({result['batched_req_per_s']:.0f} vs {result['unbatched_req_per_s']:.0f} req/s)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="also print one JSON document")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
