"""Live accounting end to end: a control plane on the real Mosquitto meters a job on a
simulated A100 server, and the figures reach the job's view, `GET /v1/usage`, the
`work.usage` event, `/metrics` and `greenfed job`."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
from collections.abc import AsyncIterator
from datetime import datetime

import aiomqtt
import msgspec
import numpy as np
import pytest

from cloud.app_keys import SETTINGS
from cloud.usage.views import WorkUsage
from cloud.work.views import JobView
from greenfed.work_commands import render_work
from shared.messages import Telemetry
from shared.settings import UsageSettings, parse_mqtt_url
from shared.topics import Channel, Topics
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.processes import run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)

FAST_USAGE = UsageSettings(flush_interval_s=0.2, final_delay_s=0.5)
TELEMETRY = msgspec.json.Decoder(Telemetry)


@contextlib.asynccontextmanager
async def node_power(url: str, root: str, node_id: str) -> AsyncIterator[list[tuple[float, float]]]:
    """(sampled_at, the node's total power) of every sample it publishes, from a subscriber
    of our own: the ground truth the accounting must agree with."""
    endpoint = parse_mqtt_url(url)
    samples: list[tuple[float, float]] = []
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.subscribe(Topics(root).node(node_id, Channel.TELEMETRY), qos=0)

        async def collect() -> None:
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                sample = TELEMETRY.decode(message.payload)
                power = sum(a.power_w or 0.0 for a in sample.accelerators)
                samples.append((sample.sampled_at, power))

        task = asyncio.create_task(collect())
        try:
            yield samples
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def integral_kwh(samples: list[tuple[float, float]], start_s: float, end_s: float) -> float:
    """∫ P dt over [start, end), P linear between samples (the simulator's own rule)."""
    times = np.array([t for t, _ in samples])
    power = np.array([p for _, p in samples])
    grid = np.linspace(start_s, end_s, 20_000)
    return float(np.trapezoid(np.interp(grid, times, power), grid)) / 3.6e6


def sample_bounds(
    samples: list[tuple[float, float]], start_s: float, end_s: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """([first sample at or after start, last at or before end], [last sample at or
    before start, first at or after end]): where a meter that sees an allocation's ends at
    samples may start and stop counting it."""
    times = sorted(t for t, _ in samples)
    before_start = max((t for t in times if t <= start_s), default=start_s)
    after_start = min((t for t in times if t >= start_s), default=start_s)
    before_end = max((t for t in times if t <= end_s), default=end_s)
    after_end = min((t for t in times if t >= end_s), default=end_s)
    return (after_start, before_end), (before_start, after_end)


async def test_a_jobs_usage_matches_its_nodes_power_and_reaches_every_view(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    url, root = mosquitto_root
    async with (
        node_power(url, root, "a100-0") as samples,
        fleet(database, mosquitto_root, cloud_nodes=1, usage=FAST_USAGE) as running,
    ):
        api = running.api
        token = await api.tenant("acme")
        spec = {
            "name": "finetune",
            "command": ["python", "train.py"],
            "accelerators_per_worker": 4,  # the whole node: its CPU is the job's host
            # Long enough that where each end of the allocation falls between two samples
            # (the meter's and this test's clocks for it differ by a sample or so, more on a
            # loaded machine) moves the total by well under the tolerance.
            "estimated_duration_s": 8.0,
        }
        job_id = await api.submitted(token, spec)
        placed = await reaches(api, token, job_id, "running")
        started = datetime.fromisoformat(placed["allocations"][0]["started_at"]).timestamp()
        finished = await reaches(api, token, job_id, "succeeded", timeout_s=45)
        ended = datetime.fromisoformat(finished["updated_at"]).timestamp()

        final_at: list[float] = []

        async def final_event() -> bool:
            events = await api.store.list_events(tenant_id=None, limit=1000)
            final_at.extend(e.at for e in events if e.kind == "work.usage" and e.work_id == job_id)
            return bool(final_at)

        await eventually_async(final_event, timeout_s=15, message="no work.usage event")
        body = await work(api, token, job_id)
        usage = msgspec.convert(body["usage"], WorkUsage)

        # Energy: the node's ∫P dt over the allocation, from the counters it reported. The
        # meter sees each end of the allocation at a sample, so its figure lies between
        # the integrals from the samples just inside both ends and just outside them,
        # and close to the integral over the allocation itself. Its end is when the
        # control plane learns that the allocation ended, after the job's state commits
        # (`ended`): a sample later, or several on a loaded machine, but never after the
        # final figures were written (the work.usage event).
        inside, _ = sample_bounds(samples, started, ended)
        _, outside = sample_bounds(samples, started, final_at[0])
        assert integral_kwh(samples, *inside) * 0.99 <= usage.energy_kwh
        assert usage.energy_kwh <= integral_kwh(samples, *outside) * 1.01
        assert usage.energy_kwh == pytest.approx(integral_kwh(samples, started, ended), rel=0.1)
        assert usage.measured_share == pytest.approx(1.0)
        assert usage.gap_filled_s == 0.0
        assert [m.node_id for m in usage.members] == ["a100-0"]
        # Emissions and cost: kWh × DE's recorded value of the hour (one hour here).
        signal = await (await api.get(token, "/v1/signals/DE")).json()
        assert usage.gco2eq_g / usage.energy_kwh == pytest.approx(
            signal["carbon_g_per_kwh"], rel=0.01
        )
        assert usage.currency == signal["currency"]
        # One node, so fifo-binpack would have chosen the same node; but it never caps
        # power, and green capped the job on this one-zone fleet (the node is its own
        # margin): what the cap saved is avoided, and no more than a cap can save.
        assert placed["allocations"][0]["power_limit_w"] is not None
        assert usage.avoided_gco2eq_g is not None
        assert 0 < usage.avoided_gco2eq_g < 0.25 * usage.gco2eq_g

        # The event carries the final figures; /v1/usage the same as JSON and CSV.
        events = await api.store.list_events(tenant_id=None, limit=1000)
        (final,) = [e for e in events if e.kind == "work.usage" and e.work_id == job_id]
        assert msgspec.json.decode(final.payload)["usage"]["energy_kwh"] == pytest.approx(
            usage.energy_kwh
        )
        report = await (await api.get(token, "/v1/usage?group_by=job")).json()
        (row,) = report["rows"]
        assert (row["job"], row["energy_kwh"]) == (job_id, pytest.approx(usage.energy_kwh))
        response = await api.get(token, "/v1/usage?group_by=tenant,day&format=csv")
        assert response.content_type == "text/csv"
        (line,) = list(csv.DictReader(io.StringIO(await response.text())))
        assert line["tenant"] == "acme"
        assert float(line["gco2eq_g"]) == pytest.approx(usage.gco2eq_g, rel=1e-4)
        # Another tenant sees none of it.
        other = await api.tenant("globex")
        assert (await (await api.get(other, "/v1/usage")).json())["rows"] == []

        # /metrics: the tenant's counters (for the admin; anyone else sees no tenant).
        text = await (await api.get(api.admin_token, "/metrics")).text()
        kwh_line = next(
            line
            for line in text.splitlines()
            if line.startswith('greenfed_usage_energy_kwh_total{tenant="acme",zone="DE"}')
        )
        assert float(kwh_line.split()[-1]) == pytest.approx(usage.energy_kwh)

        # greenfed job and greenfed usage show them.
        out = io.StringIO()
        render_work(msgspec.convert(body, JobView), None, out)
        assert "usage:" in out.getvalue()
        assert "100% measured" in out.getvalue()
        base = api.app[SETTINGS].cloud.public_url
        assert base is not None
        code, printed, errors = await run_greenfed(
            ["usage", "--by", "job,day", "--csv", "--api", base, "--token", token]
        )
        assert code == 0, errors
        (line,) = list(csv.DictReader(io.StringIO(printed)))
        assert line["job"] == job_id
        assert float(line["energy_kwh"]) == pytest.approx(usage.energy_kwh, rel=1e-4)
        code, printed, errors = await run_greenfed(
            ["usage", "--since", "2x", "--api", base, "--token", token]
        )
        assert code == 2
        assert "neither an ISO 8601 time nor a duration" in errors


async def test_bad_usage_queries_are_problems_naming_the_parameter(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, usage=FAST_USAGE) as running:
        api = running.api
        token = await api.tenant("acme")
        for query, field in (
            ("group_by=planet", "group_by"),
            ("from=yesterday", "from"),
            ("from=2026-12-01T00:00:00", "from"),
            ("from=2026-12-02T00:00:00Z&to=2026-12-01T00:00:00Z", "to"),
        ):
            response = await api.get(token, f"/v1/usage?{query}")
            assert response.status == 400, query
            problem = await response.json()
            assert [p["name"] for p in problem["invalid_params"]] == [field], query
        assert (await api.get(token, "/v1/usage?tenant=globex")).status == 403
