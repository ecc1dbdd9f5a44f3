"""Header and body read timeouts: a half-open HTTP request is not held for ever.

aiohttp 3.14 has no read timeout of its own (`keepalive_timeout` only runs between
requests), so the protocol does it:

- `cloud.http_header_timeout_s`: from a connection's first byte (or a new request's
  first byte on a kept-alive connection) to the end of the request head; past it the
  connection is closed. A connection that sends nothing at all is closed too.
- `cloud.http_body_timeout_s`: the longest pause between two pieces of a request
  body. Past it, the handler's pending read raises `BodyReadTimeoutError`, which
  `body_timeout_middleware` answers with 408 problem+json (and the connection is
  closed). A slow upload that keeps moving is never cut off.

`TimedAppRunner` is `web.AppRunner` with these handlers, which also answer the HTTP
layer's own errors with problem bodies (cloud/api/http_errors.py); `cloud.app.serving`
uses it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from cloud.api.http_errors import ProblemRequestHandler
from cloud.api.problems import Problem
from shared.logs import RateLimitedLog


class BodyReadTimeoutError(Exception):
    """The client stopped sending the request body."""


class TimedRequestHandler(ProblemRequestHandler):
    __slots__ = (
        "_body_data_at",
        "_body_timeout_s",
        "_body_timer",
        "_header_timeout_s",
        "_header_timer",
    )

    def __init__(
        self, manager: Server, *, header_timeout_s: float, body_timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_data_at = 0.0  # loop time of the last bytes received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        heads_before = len(self._messages)
        busy_before = self._current_request is not None or heads_before > 0
        super().data_received(data)
        if len(self._messages) > heads_before:  # a request head is complete
            self._cancel_header_timer()
        elif not busy_before and self._current_request is None and not self._messages:
            self._arm_header_timer()  # part of a head: it must be complete in time
        self._arm_body_timer()

    # ---- timers --------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self._loop.call_later(self._header_timeout_s, self._head_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _head_late(self) -> None:
        self._header_timer = None
        if self._current_request is None and not self._messages:
            self.force_close()
            if self.transport is not None:
                self.transport.close()

    def _pending_body(self) -> Any:
        """The payload still being received: the current request's, or the next head's."""
        if self._current_request is not None:
            return self._current_request.content
        if self._messages:
            return self._messages[-1][1]
        return None

    def _arm_body_timer(self) -> None:
        """Note the bytes' arrival; one timer per pause, not one per chunk (a 2 GiB
        upload arrives in tens of thousands of chunks)."""
        self._body_data_at = self._loop.time()
        if self._body_timer is not None:
            return
        payload = self._pending_body()
        if payload is not None and not payload.is_eof():
            self._body_timer = self._loop.call_later(self._body_timeout_s, self._body_late)

    def _body_late(self) -> None:
        self._body_timer = None
        payload = self._pending_body()
        if payload is None or payload.is_eof():
            return
        paused_s = self._loop.time() - self._body_data_at
        if paused_s < self._body_timeout_s:  # data came since: wait out the rest
            self._body_timer = self._loop.call_later(
                self._body_timeout_s - paused_s, self._body_late
            )
            return
        payload.set_exception(
            BodyReadTimeoutError(f"no request body data for {self._body_timeout_s:g} s")
        )
        self.close()  # after the 408: the rest of the body could not be read in step


class _TimedServer:
    """aiohttp's Server, making `TimedRequestHandler`s; everything else it forwards."""

    def __init__(
        self,
        server: Server,
        header_timeout_s: float,
        body_timeout_s: float,
        malformed_log: RateLimitedLog,
    ) -> None:
        self._server = server
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._malformed_log = malformed_log

    def __call__(self) -> RequestHandler:
        server = self._server
        return TimedRequestHandler(
            server,
            loop=server._loop,
            header_timeout_s=self._header_timeout_s,
            body_timeout_s=self._body_timeout_s,
            malformed_log=self._malformed_log,
            **server._kwargs,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class TimedAppRunner(web.AppRunner):
    def __init__(
        self,
        app: web.Application,
        *,
        header_timeout_s: float,
        body_timeout_s: float,
        malformed_log_interval_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        """`malformed_log_interval_s`: at most one log line per kind of malformed
        request this often (`cloud.invalid_log_interval_s`)."""
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._malformed_log = RateLimitedLog(
            structlog.get_logger("greenfed.api"), malformed_log_interval_s
        )

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        # A Server in all but name: it makes the handlers and forwards the rest.
        return _TimedServer(  # type: ignore[return-value]
            server, self._header_timeout_s, self._body_timeout_s, self._malformed_log
        )


@web.middleware
async def body_timeout_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except BodyReadTimeoutError as error:
        raise Problem(408, "request-timeout", "Request Timeout", str(error)) from None
    return response
