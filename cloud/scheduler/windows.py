"""Start-time windows in each node's local time ("20:00-06:00" = nights only).

Nodes with a fixed UTC offset use plain arithmetic on the second of the day. For a
node in an IANA time zone the offset at ``now`` says whether the window is open
now, but the next opening is computed in the zone itself: a daylight-saving change
before it moves the opening by an hour.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo

import numpy as np

from .arrays import BoolArray, FloatArray, IntArray
from .model import StartWindow

SECONDS_PER_DAY: Final = 86_400


@lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def local_second_of_day(now: float, utc_offset_s: IntArray) -> FloatArray:
    result: FloatArray = np.mod(now + utc_offset_s, SECONDS_PER_DAY)
    return result


def is_open(window: StartWindow, second_of_day: FloatArray) -> BoolArray:
    start, end = window.start_minute * 60, window.end_minute * 60
    if start < end:
        result: BoolArray = (second_of_day >= start) & (second_of_day < end)
    else:  # wraps midnight
        result = (second_of_day >= start) | (second_of_day < end)
    return result


def seconds_until_open(window: StartWindow, second_of_day: FloatArray) -> FloatArray:
    """0 where the window is open now, else the wait until it next opens (fixed offset)."""
    wait: FloatArray = np.mod(window.start_minute * 60 - second_of_day, SECONDS_PER_DAY)
    result: FloatArray = np.where(is_open(window, second_of_day), 0.0, wait)
    return result


@lru_cache(maxsize=1024)
def seconds_until_open_in_zone(window: StartWindow, now: float, zone_name: str) -> float:
    """0 if the window is open now in ``zone_name``, else the wait until its next
    opening there, with the zone's UTC offset at that moment.

    An opening time that does not exist that day (skipped by a spring-forward
    change) opens when the clocks jump past it.
    """
    tz = zone(zone_name)
    local = datetime.fromtimestamp(now, tz)
    second = local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
    if bool(is_open(window, np.array([second]))[0]):
        return 0.0
    hour, minute = divmod(window.start_minute, 60)
    for days in range(3):
        opening = datetime.combine(local.date() + timedelta(days=days), time(hour, minute), tz)
        opens_at = opening.timestamp()
        if opens_at > now:
            return opens_at - now
    raise AssertionError("a daily window opens within two days")  # pragma: no cover
