"""Unit conversions and UTC time helpers shared by every provider.

All times inside greenfed are UTC: epoch seconds in arrays and scores, aware
`datetime`s in readings (`shared.clock.utc_from_epoch` turns one into the other).
Providers' timestamps are parsed here, once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from shared.clock import utc_from_epoch

HOUR_S = 3600.0

# 1 lb = 453.592 g and 1 MWh = 1000 kWh, so 1 lb/MWh = 0.453592 g/kWh (WattTime MOER units).
G_PER_KWH_PER_LB_PER_MWH = 0.453592

Clock = Callable[[], float]
"""Returns the current UTC time in epoch seconds; injected so tests and the simulator own time."""


def system_clock() -> float:
    return time.time()


def lb_per_mwh_to_g_per_kwh(value_lb_per_mwh: float) -> float:
    return value_lb_per_mwh * G_PER_KWH_PER_LB_PER_MWH


def epoch_s(at: datetime) -> float:
    return as_utc(at).timestamp()


def as_utc(at: datetime) -> datetime:
    """An aware UTC datetime; naive values are taken to be UTC already."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def parse_utc(text: str) -> datetime:
    """ISO 8601 with `Z`, an offset or none (UTC assumed), fractional seconds allowed."""
    return as_utc(datetime.fromisoformat(text.strip()))


def floor_hour(at: datetime) -> datetime:
    return as_utc(at).replace(minute=0, second=0, microsecond=0)


def floor_hour_s(at_s: float) -> float:
    return math.floor(at_s / HOUR_S) * HOUR_S


def ceil_hours(span: timedelta) -> int:
    return max(0, math.ceil(span.total_seconds() / HOUR_S))


def iso_z(at: datetime) -> str:
    """`2023-06-01T12:00:00Z`: the form every provider accepts."""
    return as_utc(at).strftime("%Y-%m-%dT%H:%M:%SZ")


def same_instant_in_year(at_s: float, year: int) -> float:
    """The same month, day and time of day in `year` (29 February becomes the 28th).

    Lets a live deployment replay a year of recorded data in step with the calendar.
    """
    at = utc_from_epoch(at_s)
    day = min(at.day, 28) if (at.month, at.day) == (2, 29) else at.day
    return at.replace(year=year, day=day).timestamp()


def replay_clock(year: int, clock: Clock = system_clock) -> Clock:
    """A clock that reads the wall clock's date and time, but in `year`."""

    def now() -> float:
        return same_instant_in_year(clock(), year)

    return now
