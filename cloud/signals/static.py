"""A fixed table of carbon intensity and price per zone: the last line of the fallback chain.

The table comes from settings (`[signals] static_table`). Zones it does not name
fall back to a built-in table:

* carbon intensity: the 2022 annual mean of `umassos_mean_stats.csv` (123
  Electricity Maps zones, gCO2eq/kWh, believed life-cycle; Electricity Maps data,
  ODbL — see data/ATTRIBUTION.md). Australian zones are also listed under the
  `AUS-…` ids that `umassos_gcp_dc_zonecode_mapper.json` uses for them.
* price: for the four shipped zones, the 2023 annual mean of their shipped price
  file (USD/MWh); other zones have no price.

Values are annual averages, so they say nothing about the hour: a zone served
from this table competes on its yearly mean only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from types import MappingProxyType

from cloud.signals.datasets import annual_mean_stats, shipped_traces
from cloud.signals.model import (
    Forecast,
    GridReading,
    SignalType,
    SignalUnavailable,
)
from cloud.signals.units import Clock, floor_hour, system_clock
from shared.clock import utc_from_epoch

BUILTIN_CARBON_YEAR = "2022"


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticEntry:
    carbon_g_per_kwh: float
    price_per_mwh: float | None = None
    currency: str = "USD"
    signal_type: SignalType = "average"

    def __post_init__(self) -> None:
        if not math.isfinite(self.carbon_g_per_kwh) or self.carbon_g_per_kwh < 0:
            raise ValueError("carbon_g_per_kwh must be finite and >= 0")


@cache
def builtin_static_table() -> Mapping[str, StaticEntry]:
    """The documented built-in table (see the module docstring)."""
    prices: dict[str, float] = {}
    for zone, trace in shipped_traces().items():
        finite = [p for p in trace.price_per_mwh.tolist() if math.isfinite(p)]
        if finite:
            prices[zone] = sum(finite) / len(finite)
    table: dict[str, StaticEntry] = {}
    for zone, by_year in annual_mean_stats().items():
        if BUILTIN_CARBON_YEAR not in by_year:
            continue
        entry = StaticEntry(
            carbon_g_per_kwh=by_year[BUILTIN_CARBON_YEAR], price_per_mwh=prices.get(zone)
        )
        table[zone] = entry
        if zone.startswith("AU-"):
            table.setdefault("AUS-" + zone.removeprefix("AU-"), entry)
    return MappingProxyType(table)


class StaticProvider:
    """Serves a table as a SignalProvider: the same value at every hour, no forecast."""

    def __init__(
        self,
        table: Mapping[str, StaticEntry] | None = None,
        *,
        use_builtin: bool = True,
        clock: Clock = system_clock,
        name: str = "static",
    ) -> None:
        self._table = dict(table or {})
        self._use_builtin = use_builtin
        self._clock = clock
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def entry(self, zone: str) -> StaticEntry:
        found = self._table.get(zone)
        if found is None and self._use_builtin:
            found = builtin_static_table().get(zone)
        if found is None:
            raise SignalUnavailable(f"{self._name}: no static value for zone {zone!r}")
        return found

    def knows(self, zone: str) -> bool:
        try:
            self.entry(zone)
        except SignalUnavailable:
            return False
        return True

    def reading(self, zone: str, at: datetime) -> GridReading:
        entry = self.entry(zone)
        return GridReading(
            zone=zone,
            at=floor_hour(at),
            carbon_g_per_kwh=entry.carbon_g_per_kwh,
            signal_type=entry.signal_type,
            price_per_mwh=entry.price_per_mwh,
            currency=entry.currency if entry.price_per_mwh is not None else None,
            source=self._name,
            estimated=True,
        )

    async def latest(self, zone: str) -> GridReading:
        return self.reading(zone, utc_from_epoch(self._clock()))

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]:
        self.entry(zone)
        readings = []
        hour = floor_hour(start)
        if hour < start:
            hour += timedelta(hours=1)
        while hour < end:
            readings.append(self.reading(zone, hour))
            hour += timedelta(hours=1)
        return readings

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        return None
