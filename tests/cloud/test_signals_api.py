"""`/v1/signals`: what the scheduler knows about the grid, served from the shipped 2023 trace."""

from __future__ import annotations

import contextlib
import csv
import time
from collections.abc import AsyncIterator
from datetime import datetime
from importlib import resources
from itertools import pairwise
from pathlib import Path

import pytest
import structlog
import structlog.testing
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from cloud.app import create_app
from cloud.app_keys import REGISTRY, SIGNALS
from cloud.signals.model import SignalUnavailable
from cloud.signals.units import same_instant_in_year
from greenfed.broker import EmbeddedBroker
from shared.clock import utc_from_epoch
from shared.messages import HostInfo, NodeStatus
from shared.settings import Settings, StoreSettings
from shared.token_files import admin_token_path, read_token_file
from tests.support.fleet import mqtt_settings

Client = TestClient[web.Request, web.Application]
PROBLEM = "application/problem+json"


def recorded_intensity(zone_file: str, hour: datetime) -> float:
    """The LCA intensity of one hour, read straight from the shipped CSV."""
    text = resources.files("cloud.signals").joinpath(f"data/{zone_file}_2023_hourly.csv")
    with text.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["Datetime (UTC)"] == hour.strftime("%Y-%m-%d %H:%M:%S"):
                return float(row["Carbon Intensity gCO₂eq/kWh (LCA)"])
    raise AssertionError(f"no {hour} in {zone_file}")


def status(node_id: str, zone: str) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id="i",
        agent_version="t",
        site="cloud",
        zone=zone,
        region="r",
        host=HostInfo(
            hostname=node_id, os="linux", arch="x86_64", cpu_logical_cores=8, memory_total_bytes=1
        ),
        accelerators=(),
        telemetry_interval_s=5.0,
        started_at=1.0,
        sent_at=1.0,
    )


@contextlib.asynccontextmanager
async def signals_api(data_dir: Path) -> AsyncIterator[Client]:
    async with EmbeddedBroker(port=0) as broker:
        settings = Settings(
            mqtt=mqtt_settings(broker.url, "signals"), store=StoreSettings(data_dir=str(data_dir))
        )
        app = create_app(settings)
        registry = app[REGISTRY]
        registry.apply_status(status("a100-1", "CA-ON"))
        registry.apply_status(status("a100-2", "CA-ON"))
        registry.apply_status(status("v100-1", "DE"))
        async with TestClient(TestServer(app)) as client:
            token = read_token_file(admin_token_path(settings.store))
            client.session.headers["Authorization"] = f"Bearer {token}"
            yield client


async def test_the_fleets_zones_are_listed_with_current_values_and_the_day_ahead(
    tmp_path: Path,
) -> None:
    async with signals_api(tmp_path) as client:
        response = await client.get("/v1/signals")
        assert response.status == 200
        body = await response.json()
    zones = {zone["zone"]: zone for zone in body["zones"]}
    assert set(zones) == {"CA-ON", "DE"}
    assert (zones["CA-ON"]["nodes"], zones["DE"]["nodes"]) == (2, 1)
    # The default chain replays 2023 at today's date and hour, told on the wall clock the
    # loop plans by (one "now"): the values are the ones recorded at that hour of 2023.
    now = datetime.fromisoformat(body["now"])
    assert abs(now.timestamp() - time.time()) < 60
    replayed = utc_from_epoch(same_instant_in_year(now.timestamp(), 2023))
    hour = replayed.replace(minute=0, second=0, microsecond=0).replace(tzinfo=None)
    assert zones["DE"]["carbon_g_per_kwh"] == pytest.approx(
        recorded_intensity("DE-LU", hour), abs=0.01
    )
    assert zones["CA-ON"]["carbon_g_per_kwh"] == pytest.approx(
        recorded_intensity("CA-ON", hour), abs=0.01
    )
    for zone in zones.values():
        assert zone["signal_type"] == "average"
        assert zone["currency"] == "USD"
        assert zone["price_per_mwh"] is not None
        assert zone["next_24h_min_carbon_g_per_kwh"] <= zone["next_24h_max_carbon_g_per_kwh"]
        assert zone["stale"] is False


async def test_one_zone_is_served_hour_by_hour_with_its_forecast(tmp_path: Path) -> None:
    async with signals_api(tmp_path) as client:
        response = await client.get("/v1/signals/ZA")
        assert response.status == 200
        body = await response.json()
        missing = await client.get("/v1/signals/XX-NOWHERE")
        assert (missing.status, missing.content_type) == (404, PROBLEM)
        bad = await client.get("/v1/signals?zoen=DE")
        assert (bad.status, bad.content_type) == (400, PROBLEM)
    assert body["zone"] == "ZA"
    assert body["nodes"] == 0
    hourly = body["hourly"]
    recorded = [point for point in hourly if not point["forecast"]]
    ahead = [point for point in hourly if point["forecast"]]
    assert len(recorded) >= 24
    assert len(ahead) >= 24
    times = [datetime.fromisoformat(point["at"]) for point in hourly]
    assert all(later - earlier == times[1] - times[0] for earlier, later in pairwise(times))
    # South Africa's grid is coal-heavy: every hour, recorded or forecast, is above 500 g/kWh.
    assert min(point["carbon_g_per_kwh"] for point in hourly) > 500
    cleanest = datetime.fromisoformat(body["next_24h_cleanest_hour"])
    assert cleanest in times


async def test_thousands_of_unknown_zones_leave_no_state_behind_and_log_a_few_lines(
    tmp_path: Path,
) -> None:
    """Every distinct made-up zone used to leave a lock and a 4 KB warning behind."""
    async with signals_api(tmp_path) as client:
        service = client.app[SIGNALS]
        before = service.state_entries
        with structlog.testing.capture_logs() as logged:
            for i in range(2000):
                response = await client.get(f"/v1/signals/NO-SUCH-ZONE-{i}")
                assert response.status == 404
                assert response.content_type == PROBLEM
            listed = await client.get("/v1/signals?zone=NO-SUCH-ZONE-x")
            assert listed.status == 200
            assert (await listed.json())["zones"] == []
        assert service.state_entries <= before + 2
        # The app's own start-up lines may land in the window on a slow machine; every
        # other line counts.
        startup = {
            "mqtt connected",
            "ingestion subscribed",
            "retained desired documents swept",
            "usage metering started",
        }
        lines = [entry for entry in logged if entry.get("event") not in startup]
        assert len(lines) <= 3, lines[:5]
        # and the real zones still answer
        assert (await client.get("/v1/signals/DE")).status == 200


async def test_the_service_itself_bounds_per_zone_state_for_zones_nobody_knows() -> None:
    """Asked directly (the scheduler's own zones, a bad config): locks live only while a
    question is in flight, answers are bounded, the warning is one line per interval."""
    from cloud.signals.service import SignalService
    from cloud.signals.static import StaticProvider

    class Failing:
        name = "failing"

        async def latest(self, zone: str) -> object:
            raise SignalUnavailable(f"no zone {zone} " + "x" * 4000)

        async def history(self, zone: str, start: object, end: object) -> list[object]:
            raise SignalUnavailable(f"no zone {zone} " + "x" * 4000)

        async def forecast(self, zone: str, start: object, end: object) -> None:
            return None

    service = SignalService(
        [Failing()],  # type: ignore[list-item]
        static=StaticProvider({}, use_builtin=False),
        max_cached_answers=16,
    )
    with structlog.testing.capture_logs() as logged:
        grid = await service.snapshot(f"ZZ-{i}" for i in range(2000))
    assert grid.zones == {}
    assert service.state_entries == 0
    assert len(logged) <= 3, logged[:5]
