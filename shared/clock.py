"""Time as greenfed keeps it: UTC epoch seconds inside (records, arrays, scores), aware
UTC `datetime`s where people and other systems read it (REST views, readings)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_from_epoch(epoch_s: float) -> datetime:
    """The aware UTC datetime of `epoch_s` seconds since 1970-01-01T00:00:00Z."""
    return datetime.fromtimestamp(epoch_s, tz=UTC)
