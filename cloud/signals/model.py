"""What a grid signal is, and the one interface every provider implements.

Units are in the names: carbon intensity in gCO2eq/kWh, price per MWh in the
reading's currency. `signal_type` says whether intensity is the *average* of the
generation mix (Electricity Maps, UK Carbon Intensity) or the *marginal* emission
rate (WattTime); the two must never be compared as if they were the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

SignalType = Literal["average", "marginal"]

# The largest carbon intensity that can be a reading. Lignite plants emit about
# 1,100–1,300 gCO2eq/kWh and marginal rates stay under about 2,000, so anything above
# (or below 0) is a broken file or answer: one such value would otherwise make every
# window mean that includes it meaningless (or the series unusable).
MAX_CARBON_G_PER_KWH = 10_000.0
# The largest price, either sign, that can be a reading. Markets cap theirs at a few
# thousand per MWh (EPEX day-ahead -500 to 4,000 EUR, ERCOT 5,000 USD, Australia's
# NEM about 17,500 AUD); prices may be negative, so only their size is bounded.
MAX_ABS_PRICE_PER_MWH = 100_000.0


def plausible_carbon(value_g_per_kwh: float) -> bool:
    """A carbon intensity that can be a reading: finite, 0 to MAX_CARBON_G_PER_KWH."""
    return math.isfinite(value_g_per_kwh) and 0.0 <= value_g_per_kwh <= MAX_CARBON_G_PER_KWH


def plausible_price(value_per_mwh: float) -> bool:
    """A price that can be a reading: finite, at most MAX_ABS_PRICE_PER_MWH either way."""
    return math.isfinite(value_per_mwh) and abs(value_per_mwh) <= MAX_ABS_PRICE_PER_MWH


@dataclass(frozen=True, slots=True, kw_only=True)
class GridReading:
    zone: str
    at: datetime  # UTC; start of the interval the value describes
    carbon_g_per_kwh: float
    signal_type: SignalType
    price_per_mwh: float | None = None
    currency: str | None = None
    source: str = ""
    estimated: bool = False  # the provider's own estimate rather than a measurement
    stale: bool = False  # served from a fallback because live data was unavailable or old


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastPoint:
    at: datetime  # UTC
    carbon_g_per_kwh: float
    price_per_mwh: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    zone: str
    issued_at: datetime  # UTC
    signal_type: SignalType
    points: Sequence[ForecastPoint]
    source: str = ""


class SignalError(RuntimeError):
    """A provider could not answer."""


class SignalUnavailable(SignalError):
    """No data for this zone or time from this provider (unknown zone, outage, timeout)."""


class SignalAuthError(SignalError):
    """The provider refused our credentials (HTTP 401/403)."""


class SignalRateLimited(SignalError):
    def __init__(self, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SignalProvider(Protocol):
    """A source of grid signals. Methods raise SignalError subclasses, never return junk."""

    @property
    def name(self) -> str: ...

    async def latest(self, zone: str) -> GridReading: ...

    async def history(self, zone: str, start: datetime, end: datetime) -> list[GridReading]: ...

    async def forecast(self, zone: str, start: datetime, end: datetime) -> Forecast | None:
        """The provider's own forecast, or None when it offers none."""
        ...
