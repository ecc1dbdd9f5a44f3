"""Errors the HTTP layer answers before (or beside) any handler: they are problem+json
too, and a malformed request is logged as what it is.

aiohttp answers a request it cannot parse (a malformed request line, a URL or header
field over 8190 bytes, too many headers, a bad `Content-Length` or `Transfer-Encoding`,
a broken chunk, HTTPS on the HTTP port) from `RequestHandler.handle_error`, in plain
text, logging each at error level with a traceback; and an `HTTPException` raised
outside the middlewares (an unknown `Expect:`) it sends as plain text too.
`ProblemRequestHandler` answers all of them with greenfed's problem body, and logs a
client's malformed request as a warning without a traceback, at most one line per
kind every `cloud.invalid_log_interval_s` (an outside party controls the rate).

A body that turns out malformed while a handler reads it (a bad chunk arriving late, a
`Content-Encoding` that does not decode) reaches the handler as an exception, which
the problem middleware answers (cloud/api/problems.py).
"""

from __future__ import annotations

import itertools
from http import HTTPStatus
from typing import Any, Final

import structlog
from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidURLError,
    LineTooLong,
)
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from cloud.api.problems import Problem, first_line, problem_of
from shared.logs import RateLimitedLog

# A request-target starts so (origin-form, asterisk-form, absolute-form); a header
# field that long almost never does. aiohttp's LineTooLong says only which bytes.
_REQUEST_TARGET_STARTS: Final = (b"/", b"*", b"http://", b"https://")


def parse_error_problem(error: BaseException | None) -> Problem:
    """The problem for a request aiohttp's parser refused with `error`."""
    if isinstance(error, LineTooLong):
        line, limit = error.args[0], error.args[1]
        if isinstance(line, bytes | bytearray) and bytes(line).startswith(_REQUEST_TARGET_STARTS):
            return Problem(
                414, "uri-too-long", "URI Too Long", f"the request line exceeds {limit} bytes"
            )
        return Problem(
            431,
            "header-too-large",
            "Request Header Fields Too Large",
            f"a header field exceeds {limit} bytes",
        )
    if isinstance(error, BadHttpMessage) and error.message == "Too many headers received":
        return Problem(
            431, "too-many-headers", "Request Header Fields Too Large", "too many headers"
        )
    if isinstance(error, BadHttpMethod) and error.message.startswith("Received HTTPS"):
        return Problem(400, "bad-request-line", "Bad Request", "HTTPS on an HTTP port")
    if isinstance(error, InvalidURLError):  # its message is the URL: not echoed back
        return Problem(400, "bad-request-line", "Bad Request", "invalid request target")
    if isinstance(error, BadStatusLine):
        detail = first_line(error.message).removeprefix("Bad status line").strip(" :\n")
        return Problem(400, "bad-request-line", "Bad Request", detail or "malformed request line")
    if isinstance(error, HttpProcessingError):
        return Problem(400, "malformed-request", "Bad Request", first_line(error.message))
    return Problem(400, "malformed-request", "Bad Request", "malformed request")


def _http_exception_problem(error: web.HTTPException) -> Problem:
    reason = error.reason or HTTPStatus(error.status).phrase
    slug = reason.lower().replace(" ", "-")
    return Problem(error.status, slug, reason, error.text or "")


class ProblemRequestHandler(RequestHandler):
    """aiohttp's request handler, with greenfed's problem bodies and log lines for the
    errors it makes itself. `malformed_log`: shared by every connection of a server."""

    __slots__ = ("_malformed_log",)

    def __init__(self, manager: Server, *, malformed_log: RateLimitedLog, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._malformed_log = malformed_log

    def data_received(self, data: bytes) -> None:
        body = self._reading_body()
        queued = len(self._messages)
        super().data_received(data)
        if body is None or body.is_eof():
            return
        for message, _ in itertools.islice(self._messages, queued, None):
            if not isinstance(message, RawRequestMessage):  # aiohttp's parse error
                # The parser gave up inside the body being read: the handler's read
                # fails now (a 400) instead of waiting out the body timeout, and the
                # connection closes after that answer (the stream is out of step).
                body.set_exception(RequestPayloadError(getattr(message, "message", "")))
                self.close()
                return

    def _reading_body(self) -> Any:
        request = self._current_request
        return request.content if request is not None else None

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp's log of an exception it caught itself. A client's malformed body, or
        the client gone, is no failure of ours: such a one was answered (or could not
        be) already, so it leaves a debug line, never a traceback."""
        error = kwargs.get("exc_info")
        if isinstance(error, RequestPayloadError | HttpProcessingError | ConnectionResetError):
            structlog.get_logger("greenfed.api").debug(
                "request body abandoned", error=first_line(str(error))
            )
            return
        super().log_exception(*args, **kwargs)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # Part of an answer is out: the connection is broken (as aiohttp does).
            raise ConnectionError("the response is sent already; cannot send an error")
        if status >= 500:
            # Never a client's doing: a handler's exception that escaped the middlewares.
            structlog.get_logger("greenfed.api").error(
                "unhandled error", status=status, exc_info=exc
            )
            problem = Problem(
                status, "internal-error", HTTPStatus(status).phrase, "see the server log"
            )
        else:
            problem = parse_error_problem(exc)
            self._malformed_log.warning(
                problem.slug,
                "malformed request",
                status=problem.status,
                detail=problem.detail,
                remote=request.remote,
            )
        response = problem_of(problem)
        response.force_close()
        return response

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if isinstance(resp, web.HTTPException) and resp.status >= 400:
            # Raised outside the middlewares (an unknown Expect: header's 417).
            problem = problem_of(_http_exception_problem(resp), instance=request.path)
            for header in ("Allow", "Retry-After"):
                if header in resp.headers:
                    problem.headers[header] = resp.headers[header]
            resp = problem
        return await super().finish_response(request, resp, start_time)
