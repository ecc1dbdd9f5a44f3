"""What every HTTP signal client shares: one GET, typed decoding, and errors mapped once.

Mapping (the same for every provider):

* 401, 403 → `SignalAuthError` (credentials refused, or the plan does not cover it)
* 429 → `SignalRateLimited`, with `Retry-After` read as seconds or an HTTP date
* 400, 404 → `SignalUnavailable` (unknown zone or region, or no data for it)
* 5xx, any other non-2xx, timeouts, connection errors and bodies that do not
  match the documented format (JSON nested too deeply to read among them)
  → `SignalUnavailable`

Bodies are decoded straight into frozen msgspec Structs that mirror the
provider's documented JSON, so a renamed field is an error here, not a silent
zero somewhere else. Nulls are declared (`float | None`) and skipped by callers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from email.utils import parsedate_to_datetime
from typing import TypeVar

import aiohttp
import msgspec

from cloud.signals.model import SignalAuthError, SignalRateLimited, SignalUnavailable
from cloud.signals.units import Clock, system_clock
from shared.errors import MSGSPEC_DECODE_ERRORS

T = TypeVar("T")

QueryValue = str | int | float
Query = Mapping[str, QueryValue] | list[tuple[str, QueryValue]]


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date (RFC 9110)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        at = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if at.tzinfo is None:
        return None
    return max(0.0, at.timestamp() - now_s)


class HttpSource:
    """GET JSON from one provider's base URL with one timeout, mapping failures to SignalErrors."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        provider: str,
        base_url: str,
        timeout_s: float,
        clock: Clock = system_clock,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self._session = session
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    async def get(
        self,
        path: str,
        decoder: msgspec.json.Decoder[T],
        *,
        params: Query | None = None,
        headers: Mapping[str, str] | None = None,
        none_for_statuses: Collection[int] = (),
    ) -> T | None:
        """The decoded body; None for 204 No Content or a status in `none_for_statuses`."""
        url = self.url(path)
        try:
            async with self._session.get(
                url, params=params, headers=headers, timeout=self._timeout
            ) as response:
                body = await response.read()
                if response.status in none_for_statuses:
                    return None
                self._raise_for_status(response.status, response.headers, path, body)
        except TimeoutError:
            raise SignalUnavailable(f"{self.provider}: {path} timed out") from None
        except aiohttp.ClientError as error:
            raise SignalUnavailable(f"{self.provider}: {path} failed: {error}") from None
        if response.status == 204 or not body.strip():
            return None
        try:
            return decoder.decode(body)
        except MSGSPEC_DECODE_ERRORS as error:  # nested too deeply included
            raise SignalUnavailable(
                f"{self.provider}: {path} answered in an unexpected format: {error}"
            ) from None

    def _raise_for_status(
        self, status: int, headers: Mapping[str, str], path: str, body: bytes
    ) -> None:
        if 200 <= status < 300:
            return
        detail = body[:200].decode("utf-8", errors="replace").strip()
        message = f"{self.provider}: {path} answered HTTP {status}" + (
            f": {detail}" if detail else ""
        )
        if status in (401, 403):
            raise SignalAuthError(message)
        if status == 429:
            raise SignalRateLimited(
                message, parse_retry_after(headers.get("Retry-After"), self._clock())
            )
        raise SignalUnavailable(message)
