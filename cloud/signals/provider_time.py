"""Times in a provider's answer: parsed once, and a malformed one is a broken answer.

`units.parse_utc` raises `ValueError` on text that is no ISO 8601 time. Inside a
client that would escape as a bug (`SignalService` tolerates only `SignalError`
from a provider), so one bad timestamp in a forecast would cost the zone its good
history. A time not in the documented format is a body not in the documented
format: `SignalUnavailable`, as `http_client` makes of a body msgspec refuses.
"""

from __future__ import annotations

from datetime import datetime

from cloud.signals.model import SignalUnavailable
from cloud.signals.units import parse_utc

_QUOTED_CHARS = 64  # enough to recognise the value; a hostile body must not fill the log


def provider_time(text: str, *, provider: str) -> datetime:
    """`text` as an aware UTC datetime, or `SignalUnavailable` naming the provider."""
    try:
        return parse_utc(text)
    except (ValueError, OverflowError):
        # OverflowError: a valid time whose offset moves it outside datetime's range.
        raise SignalUnavailable(
            f"{provider}: a time in an unexpected format: {text[:_QUOTED_CHARS]!r}"
        ) from None
