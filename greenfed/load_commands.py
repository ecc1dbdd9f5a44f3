"""`greenfed load`: drive a deployment's real inference endpoints at a rate that follows a
curve, so autoscaling, tidal preemption and model updates can be watched live.

Curves (requests per second over all replicas):
- `200`: constant;
- `ramp:50-400`: linear from the first rate to the second over `--duration`;
- `diurnal:500-2000`: one day compressed into `--period` (default: `--duration`), the
  low rate at its ends and the high one at its middle, a half-sine between.

Requests go round-robin to the ready replicas, whose list is read from the API every
second, with an input of zeros shaped like the model's (symbolic sizes become 1). Each
second prints what was sent, answered, refused (429) and failed, and the latency
quantiles; the end prints the totals.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import aiohttp
import msgspec

from cloud.models.views import ModelView, TensorView
from cloud.work.views import DeploymentView
from greenfed.api_client import ApiClient, CliError, path_segment
from greenfed.arguments import EXIT_OK

_CURVE = re.compile(r"^(?:(ramp|diurnal):)?(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?$")
Curve = Callable[[float], float]  # seconds since the start -> requests per second
MAX_IN_FLIGHT = 512


def parse_curve(text: str, duration_s: float, period_s: float | None = None) -> Curve:
    """The rate at each second of the run; ValueError says what is wrong."""
    found = _CURVE.match(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a rate: 200, ramp:50-400 or diurnal:500-2000")
    shape, low_text, high_text = found.groups()
    low = float(low_text)
    if shape is None:
        if high_text is not None:
            raise ValueError(f"{text!r}: a constant rate is one number")
        return lambda _: low
    if high_text is None:
        raise ValueError(f"{text!r}: {shape} needs two rates, LOW-HIGH")
    high = float(high_text)
    if shape == "ramp":
        return lambda t: low + (high - low) * min(1.0, max(0.0, t / duration_s))
    day_s = period_s or duration_s
    return lambda t: low + (high - low) * math.sin(math.pi * ((t % day_s) / day_s))


def sample_inputs(tensors: tuple[TensorView, ...]) -> dict[str, Any]:
    """Zeros of each input's shape (unknown or symbolic sizes: 1)."""

    def zeros(shape: tuple[int | str | None, ...]) -> Any:
        if not shape:
            return 0
        size = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
        return [zeros(shape[1:]) for _ in range(size)]

    return {tensor.name: zeros(tensor.shape) for tensor in tensors}


@dataclass(slots=True)
class _Second:
    sent: int = 0
    ok: int = 0
    refused: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _line(second: int, rate: float, stats: _Second, replicas: int) -> str:
    p50, p95 = _quantile(stats.latencies_ms, 0.5), _quantile(stats.latencies_ms, 0.95)
    latency = "" if p50 is None or p95 is None else f"  p50 {p50:.1f} ms  p95 {p95:.1f} ms"
    return (
        f"{second:4d}s  target {rate:7.1f}/s  sent {stats.sent:5d}  ok {stats.ok:5d}  "
        f"429 {stats.refused:4d}  failed {stats.failed:4d}  replicas {replicas}{latency}"
    )


async def drive_load(
    client: ApiClient,
    deployment_id: str,
    curve: Curve,
    duration_s: float,
    out: TextIO = sys.stdout,
) -> int:
    path = f"/v1/deployments/{path_segment(deployment_id)}"
    deployment = await client.get(path, DeploymentView)
    if deployment.model_id is None:
        raise CliError(f"deployment {deployment.id} names no model: nothing to send it")
    model = await client.get(f"/v1/models/{path_segment(deployment.model_id)}", ModelView)
    body = msgspec.json.encode({"inputs": sample_inputs(model.inputs)})
    endpoints: list[str] = []
    seconds: list[_Second] = []
    in_flight: set[asyncio.Task[None]] = set()

    async def refresh() -> None:
        nonlocal endpoints
        current = await client.get(path, DeploymentView)
        endpoints = [r.endpoint for r in current.replica_states if r.endpoint]

    async def one(http: aiohttp.ClientSession, url: str, stats: _Second) -> None:
        started = time.perf_counter()
        try:
            async with http.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as answer:
                await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        if status == 200:
            stats.ok += 1
            stats.latencies_ms.append((time.perf_counter() - started) * 1000.0)
        elif status == 429:
            stats.refused += 1
        else:
            stats.failed += 1

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        start = time.monotonic()
        sent_total = 0
        wanted = 0.0  # requests the curve asked for so far: fractional rates add up
        for second in range(math.ceil(duration_s)):
            await refresh()
            stats = _Second()
            rate = curve(float(second))
            wanted += rate
            count = math.floor(wanted) - sum(s.sent for s in seconds)
            for number in range(count):
                due = start + second + number / max(rate, 1e-9)
                pause = due - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                if not endpoints or len(in_flight) >= MAX_IN_FLIGHT:
                    stats.sent += 1
                    stats.failed += 1
                    continue
                task = asyncio.create_task(one(http, endpoints[sent_total % len(endpoints)], stats))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                stats.sent += 1
                sent_total += 1
            pause = start + second + 1 - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            # Answers still on their way count in their second's totals at the end.
            out.write(_line(second, rate, stats, len(endpoints)) + "\n")
            out.flush()
            seconds.append(stats)
        if in_flight:
            await asyncio.wait(in_flight, timeout=30)
    total = _Second(
        sent=sum(s.sent for s in seconds),
        ok=sum(s.ok for s in seconds),
        refused=sum(s.refused for s in seconds),
        failed=sum(s.failed for s in seconds),
        latencies_ms=[v for s in seconds for v in s.latencies_ms],
    )
    p95 = _quantile(total.latencies_ms, 0.95)
    out.write(
        f"total: sent {total.sent}, ok {total.ok}, 429 {total.refused}, failed {total.failed}"
        + ("" if p95 is None else f", p95 {p95:.1f} ms")
        + "\n"
    )
    if total.sent and not total.ok:
        raise CliError("no request was answered")
    return EXIT_OK
