"""Header and body read timeouts for aiohttp's request handler: a half-open HTTP request
is not held for ever. The control plane's API (cloud/api/http_timeouts.py) and the edge's
inference endpoint (edge/agent/inference_server.py) both keep their connections by it.

aiohttp 3.14 has no read timeout of its own (`keepalive_timeout` only runs between
requests), so `ReadTimeouts` watches the handler's parser state as bytes arrive:

- the header timeout: from a connection's opening (or a new request's first byte on a
  kept-alive connection) to the end of the request head; past it the connection is
  aborted (not closed: a client that reads nothing would keep the file open for ever);
- the body timeout: the longest pause between two pieces of a request body; past it the
  handler's pending read raises `BodyReadTimeoutError` (which the app answers 408) and
  the connection is closed after that answer. A slow upload that keeps moving is never
  cut off.

It reads two private attributes of aiohttp's `RequestHandler` (`_messages`, the request
heads parsed and not yet handled, and `_current_request`), as aiohttp 3.x keeps them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiohttp is imported by whoever serves, not by this module
    from aiohttp.streams import StreamReader
    from aiohttp.web_protocol import RequestHandler


class BodyReadTimeoutError(Exception):
    """The client stopped sending the request body."""


class ReadTimeouts:
    """The two timers of one connection's `handler`: `opened` when it is made, `feed`
    with each piece of data (around the handler's own `data_received`), `closed` when
    it is lost."""

    __slots__ = (
        "_body_data_at_s",
        "_body_timeout_s",
        "_body_timer",
        "_handler",
        "_header_timeout_s",
        "_header_timer",
        "_loop",
    )

    def __init__(
        self,
        handler: RequestHandler,
        loop: asyncio.AbstractEventLoop,
        *,
        header_timeout_s: float,
        body_timeout_s: float,
    ) -> None:
        self._handler = handler
        self._loop = loop
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_data_at_s = 0.0  # loop time of the last bytes received

    def opened(self) -> None:
        self._arm_header_timer()

    def closed(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def feed(self, data: bytes, receive: Callable[[bytes], None]) -> None:
        """`receive(data)` (the handler's `data_received`), then the timers."""
        handler = self._handler
        heads_before = len(handler._messages)
        busy_before = handler._current_request is not None or heads_before > 0
        receive(data)
        if len(handler._messages) > heads_before:  # a request head is complete
            self._cancel_header_timer()
        elif not busy_before and handler._current_request is None and not handler._messages:
            self._arm_header_timer()  # part of a head: it must be complete in time
        self._arm_body_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self._loop.call_later(self._header_timeout_s, self._head_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _head_late(self) -> None:
        self._header_timer = None
        handler = self._handler
        if handler._current_request is not None or handler._messages:
            return
        handler.force_close()
        transport = handler.transport
        if transport is not None:
            transport.abort()  # a client that reads nothing would hold a close() open

    def _pending_body(self) -> StreamReader | None:
        """The body still being received: the current request's, or the next head's."""
        handler = self._handler
        if handler._current_request is not None:
            return handler._current_request.content
        if handler._messages:
            body: StreamReader = handler._messages[-1][1]
            return body
        return None

    def _arm_body_timer(self) -> None:
        """Note the bytes' arrival; one timer per pause, not one per chunk (a 2 GiB
        upload arrives in tens of thousands of chunks)."""
        self._body_data_at_s = self._loop.time()
        if self._body_timer is not None:
            return
        body = self._pending_body()
        if body is not None and not body.is_eof():
            self._body_timer = self._loop.call_later(self._body_timeout_s, self._body_late)

    def _body_late(self) -> None:
        self._body_timer = None
        body = self._pending_body()
        if body is None or body.is_eof():
            return
        paused_s = self._loop.time() - self._body_data_at_s
        if paused_s < self._body_timeout_s:  # data came since: wait out the rest
            self._body_timer = self._loop.call_later(
                self._body_timeout_s - paused_s, self._body_late
            )
            return
        body.set_exception(
            BodyReadTimeoutError(f"no request body data for {self._body_timeout_s:g} s")
        )
        self._handler.close()  # after the 408: the rest of the body cannot be read in step
