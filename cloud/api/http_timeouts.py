"""Header and body read timeouts: a half-open HTTP request is not held for ever.

aiohttp 3.14 has no read timeout of its own (`keepalive_timeout` only runs between
requests), so the protocol does it (shared/http_read_timeouts.py, as the edge's
inference endpoint does):

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
from shared.http_read_timeouts import BodyReadTimeoutError, ReadTimeouts
from shared.logs import RateLimitedLog


class TimedRequestHandler(ProblemRequestHandler):
    __slots__ = ("_timeouts",)

    def __init__(
        self, manager: Server, *, header_timeout_s: float, body_timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._timeouts = ReadTimeouts(
            self, self._loop, header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._timeouts.opened()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._timeouts.closed()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._timeouts.feed(data, super().data_received)


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
