"""Time as greenfed keeps it: UTC epoch seconds inside (records, arrays, scores), aware
UTC `datetime`s where people and other systems read it (REST views, readings)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

_LATEST_S = datetime.max.replace(tzinfo=UTC).timestamp()
_EARLIEST_S = datetime.min.replace(tzinfo=UTC).timestamp()


def utc_from_epoch(epoch_s: float) -> datetime:
    """The aware UTC datetime of `epoch_s` seconds since 1970-01-01T00:00:00Z; a time
    past what a datetime holds (year 9999: a run expected to take millennia on a node that
    says it is that slow) is its last moment, one before year 1 its first. Raises
    ValueError for NaN."""
    if math.isnan(epoch_s):
        raise ValueError("a time that is not a number")
    if epoch_s >= _LATEST_S:
        return datetime.max.replace(tzinfo=UTC)
    if epoch_s <= _EARLIEST_S:
        return datetime.min.replace(tzinfo=UTC)
    return datetime.fromtimestamp(epoch_s, tz=UTC)
