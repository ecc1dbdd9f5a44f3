"""RFC 9457 problem details: every API error is `application/problem+json`.

Handlers raise `Problem`; the middleware also turns aiohttp's own HTTP errors
(unknown route, wrong method), a body the client broke while it was read (a warning,
not a traceback) and unexpected exceptions into problem bodies, so a client never has
to parse an HTML error page. What the HTTP layer answers before any handler runs is
cloud/api/http_errors.py's. `problem_of` is the one builder of such a response
(`problem_response` for a request's path); `problem_reply` the one way a route (or the
OpenAPI generator, for the errors every route can give) documents one.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping

import msgspec
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from cloud.api.routes import Reply
from shared.problems import PROBLEM_CONTENT_TYPE, InvalidParam, ProblemBody

PROBLEM_TYPE_BASE = "https://greenfed.dev/problems/"


class Problem(Exception):
    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str = "",
        invalid_params: tuple[InvalidParam, ...] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail or title)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.invalid_params = invalid_params
        self.headers = dict(headers or {})  # e.g. WWW-Authenticate, Retry-After


def problem_response(request: web.Request, problem: Problem) -> web.Response:
    return problem_of(problem, instance=request.path)


def problem_of(problem: Problem, *, instance: str = "") -> web.Response:
    """The response for `problem`; `instance`: the path it is about ("" for none, as for
    a request too malformed to have one)."""
    body = ProblemBody(
        type=PROBLEM_TYPE_BASE + problem.slug,
        title=problem.title,
        status=problem.status,
        detail=problem.detail,
        instance=instance,
        invalid_params=problem.invalid_params,
    )
    response = web.Response(
        status=problem.status, body=msgspec.json.encode(body), content_type=PROBLEM_CONTENT_TYPE
    )
    response.headers.update(problem.headers)
    return response


def problem_reply(status: int, description: str) -> Reply:
    """A documented error answer of a route: a problem+json body."""
    return Reply(status, description, ProblemBody, PROBLEM_CONTENT_TYPE)


def invalid_query(*params: InvalidParam) -> Problem:
    return Problem(
        400,
        "invalid-query",
        "Invalid query parameters",
        "; ".join(f"{param.name}: {param.reason}" for param in params),
        params,
    )


_HTTP_SLUGS = {
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
    415: "unsupported-media-type",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_STATUS_PREFIX = re.compile(r"^\d{3}, message:\s*")


def first_line(message: str) -> str:
    """aiohttp's message about a malformed request, up to where it quotes the request's
    bytes back (they stay out of answers and logs)."""
    text = _STATUS_PREFIX.sub("", message.strip())
    return text.split(":\n", 1)[0].strip().rstrip(".") or "malformed request"


def malformed_body_problem(error: RequestPayloadError | HttpProcessingError) -> Problem:
    """The problem for a body that could not be read as sent (chunks, encoding)."""
    message = error.message if isinstance(error, HttpProcessingError) else str(error)
    return Problem(400, "malformed-body", "Bad Request", first_line(message))


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as problem:
        return problem_response(request, problem)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        slug = _HTTP_SLUGS.get(error.status, "http-error")
        if error.status == 404:
            detail = f"no route {request.method} {request.path}"
        elif error.status == 405:
            detail = f"{request.method} is not allowed here; Allow: {error.headers.get('Allow')}"
        else:
            detail = error.text or ""
        response = problem_response(request, Problem(error.status, slug, error.reason, detail))
        for header in ("Allow", "Retry-After"):
            if header in error.headers:
                response.headers[header] = error.headers[header]
        return response
    except (RequestPayloadError, HttpProcessingError) as error:
        # The client's malformed body, not our failure: a warning without a traceback.
        refusal = malformed_body_problem(error)
        structlog.get_logger("greenfed.api").warning(
            "malformed request body", path=request.path, detail=refusal.detail
        )
        response = problem_response(request, refusal)
        response.force_close()  # what is left of the body cannot be read in step
        return response
    except ConnectionResetError:
        if request.transport is not None and not request.transport.is_closing():
            raise  # not the client's connection: a failure (a 500 from ProblemRequestHandler)
        # The client went away mid-request (aiohttp's "Connection lost"): no one to answer.
        structlog.get_logger("greenfed.api").info("client went away", path=request.path)
        return problem_response(
            request, Problem(499, "client-closed", "Client Closed Request", "connection lost")
        )
    except Exception:
        structlog.get_logger("greenfed.api").exception("unhandled error", path=request.path)
        return problem_response(
            request, Problem(500, "internal-error", "Internal Server Error", "see the server log")
        )
