"""Start-time windows in each node's local time ("20:00-06:00" = nights only)."""

from __future__ import annotations

from typing import Final

import numpy as np

from .arrays import BoolArray, FloatArray, IntArray
from .model import StartWindow

SECONDS_PER_DAY: Final = 86_400


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
    """0 where the window is open now, else the wait until it next opens."""
    wait: FloatArray = np.mod(window.start_minute * 60 - second_of_day, SECONDS_PER_DAY)
    result: FloatArray = np.where(is_open(window, second_of_day), 0.0, wait)
    return result
