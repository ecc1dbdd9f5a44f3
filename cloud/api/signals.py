"""`/v1/signals`: the grid carbon intensity and price the scheduler sees, per zone.

A zone asked for by name is looked up only if it is one of the fleet's, one the static
table lists or one a provider has answered for; any other is a 404 at once, without a
provider request or per-zone state (a caller controls the string).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
import numpy as np
from aiohttp import web

from cloud.api.bodies import json_response
from cloud.api.problems import Problem
from cloud.api.query import parse_query
from cloud.api.routes import Reply, Route
from cloud.app_keys import REGISTRY, SIGNALS
from cloud.signals.grid import HOUR_S, ZoneSeries, extended_values
from cloud.signals.model import SignalType
from shared.clock import utc_from_epoch

SUMMARY_HORIZON_H = 24
MAX_ZONE_CHARS = 64  # Electricity Maps' longest zone names have about 15


def _zone_not_found(zone: str) -> Problem:
    shown = zone if len(zone) <= MAX_ZONE_CHARS else zone[:MAX_ZONE_CHARS] + "..."
    return Problem(
        404, "zone-not-found", "Zone not found", f"no signal provider knows zone {shown!r}"
    )


def _may_ask(request: web.Request, zone: str, fleet_zones: dict[str, int]) -> bool:
    return len(zone) <= MAX_ZONE_CHARS and (
        zone in fleet_zones or request.app[SIGNALS].knows_zone(zone)
    )


class HourlyPoint(msgspec.Struct, frozen=True, kw_only=True):
    at: datetime
    carbon_g_per_kwh: float
    price_per_mwh: float | None
    forecast: bool  # after the current hour: a forecast, not a record


class ZoneSignal(msgspec.Struct, frozen=True, kw_only=True):
    zone: str
    signal_type: SignalType
    source: str
    stale: bool
    currency: str
    carbon_g_per_kwh: float  # the current hour
    price_per_mwh: float | None
    next_24h_min_carbon_g_per_kwh: float
    next_24h_max_carbon_g_per_kwh: float
    next_24h_cleanest_hour: datetime
    nodes: int  # nodes of the fleet in this zone


class ZoneSignalDetail(ZoneSignal, frozen=True, kw_only=True):
    hourly: tuple[HourlyPoint, ...]


class SignalList(msgspec.Struct, frozen=True, kw_only=True):
    now: datetime
    zones: tuple[ZoneSignal, ...]


class SignalListQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    zone: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ZONE_CHARS)] | None = None


def _price(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 3)


def _summary_fields(series: ZoneSeries, now_s: float, nodes: int) -> dict[str, object]:
    current_hour = int((now_s - series.start_s) // HOUR_S)
    # Past the series' end, its last day repeated, as scoring assumes (cloud.signals.grid).
    hours = np.arange(current_hour, current_hour + SUMMARY_HORIZON_H)
    ahead = extended_values(series.carbon_g_per_kwh, hours)
    cleanest_s = series.start_s + (current_hour + int(np.argmin(ahead))) * HOUR_S
    index = int(hours[0])
    return {
        "zone": series.zone,
        "signal_type": series.signal_type,
        "source": series.source,
        "stale": series.stale,
        "currency": series.currency,
        "carbon_g_per_kwh": round(float(ahead[0]), 2),
        "price_per_mwh": _price(extended_values(series.price_per_mwh, [index])[0]),
        "next_24h_min_carbon_g_per_kwh": round(float(ahead.min()), 2),
        "next_24h_max_carbon_g_per_kwh": round(float(ahead.max()), 2),
        "next_24h_cleanest_hour": utc_from_epoch(cleanest_s),
        "nodes": nodes,
    }


def _zones_of_fleet(request: web.Request) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in request.app[REGISTRY].nodes():
        counts[record.status.zone] = counts.get(record.status.zone, 0) + 1
    return counts


async def list_signals(request: web.Request) -> web.Response:
    """Zones of the fleet's nodes (or the one asked for), current values and the day ahead."""
    query = parse_query(request, SignalListQuery)
    fleet_zones = _zones_of_fleet(request)
    if query.zone:
        wanted = [query.zone] if _may_ask(request, query.zone, fleet_zones) else []
    else:
        wanted = sorted(fleet_zones)
    grid = await request.app[SIGNALS].snapshot(wanted)
    zones = tuple(
        ZoneSignal(**_summary_fields(series, grid.now_s, fleet_zones.get(zone, 0)))  # type: ignore[arg-type]
        for zone, series in sorted(grid.zones.items())
    )
    body = SignalList(now=utc_from_epoch(grid.now_s), zones=zones)
    return json_response(body)


async def get_zone_signal(request: web.Request) -> web.Response:
    """One zone hour by hour: the recorded history and the forecast the scheduler uses."""
    zone = request.match_info["zone"]
    fleet_zones = _zones_of_fleet(request)
    if not _may_ask(request, zone, fleet_zones):
        raise _zone_not_found(zone)
    grid = await request.app[SIGNALS].snapshot([zone])
    series = grid.series(zone)
    if series is None:
        raise _zone_not_found(zone)
    current_hour_start = grid.now_s - grid.now_s % HOUR_S
    hourly = tuple(
        HourlyPoint(
            at=utc_from_epoch(series.start_s + hour * HOUR_S),
            carbon_g_per_kwh=round(float(carbon), 2),
            price_per_mwh=_price(series.price_per_mwh[hour]),
            forecast=series.start_s + hour * HOUR_S > current_hour_start,
        )
        for hour, carbon in enumerate(series.carbon_g_per_kwh)
    )
    nodes = fleet_zones.get(zone, 0)
    body = ZoneSignalDetail(**_summary_fields(series, grid.now_s, nodes), hourly=hourly)  # type: ignore[arg-type]
    return json_response(body)


ROUTES = (
    Route(
        "GET",
        "/v1/signals",
        list_signals,
        "Grid carbon intensity and price of the fleet's zones",
        "tenant",
        "signals",
        query=SignalListQuery,
        replies=(Reply(200, "Current values and the day ahead, per zone", SignalList),),
    ),
    Route(
        "GET",
        "/v1/signals/{zone}",
        get_zone_signal,
        "One zone hour by hour, recorded and forecast",
        "tenant",
        "signals",
        replies=(Reply(200, "The zone's series", ZoneSignalDetail),),
    ),
)
