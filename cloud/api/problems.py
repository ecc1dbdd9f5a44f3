"""RFC 9457 problem details: every API error is `application/problem+json`.

Handlers raise `Problem`; the middleware also turns aiohttp's own HTTP errors
(unknown route, wrong method) and unexpected exceptions into problem bodies, so
a client never has to parse an HTML error page. `problem_response` is the one builder of
such a response; `problem_reply` the one way a route (or the OpenAPI generator, for the
errors every route can give) documents one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import msgspec
import structlog
from aiohttp import web

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
    body = ProblemBody(
        type=PROBLEM_TYPE_BASE + problem.slug,
        title=problem.title,
        status=problem.status,
        detail=problem.detail,
        instance=request.path,
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
        detail = (
            f"no route {request.method} {request.path}" if error.status == 404 else error.text or ""
        )
        response = problem_response(request, Problem(error.status, slug, error.reason, detail))
        for header in ("Allow", "Retry-After"):
            if header in error.headers:
                response.headers[header] = error.headers[header]
        return response
    except Exception:
        structlog.get_logger("greenfed.api").exception("unhandled error", path=request.path)
        return problem_response(
            request, Problem(500, "internal-error", "Internal Server Error", "see the server log")
        )
