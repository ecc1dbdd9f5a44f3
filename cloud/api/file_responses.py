"""Files served with aiohttp's `FileResponse` (Range, If-Range and conditional requests
answered by aiohttp), whose error answers are problem+json like every other.

`FileResponse` decides some answers itself, after the handler and its middlewares have
returned: 416 for a Range it cannot serve, 412 for a failed If-Match or
If-Unmodified-Since, 403 or 404 when the file cannot be opened; each went out with an
empty body. It ends each such path by calling the next class's `prepare`, so a class
placed between it and `StreamResponse` sees the status it chose and writes the problem
body then.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest

from cloud.api.problems import Problem, problem_of

_DETAILS: Final = {
    403: "the file cannot be read",
    404: "the file is gone",
    412: "a precondition (If-Match or If-Unmodified-Since) does not hold for the file",
    416: "the Range does not fit the file",
}


class _ProblemBodyOnError(web.StreamResponse):
    async def prepare(self, request: BaseRequest) -> AbstractStreamWriter | None:
        if self.status < 400:
            return await super().prepare(request)
        reason = HTTPStatus(self.status).phrase
        detail = _DETAILS.get(self.status, reason)
        if self.status == 416 and "Content-Range" in self.headers:
            detail += f" ({self.headers['Content-Range']})"
        problem = problem_of(
            Problem(self.status, reason.lower().replace(" ", "-"), reason, detail),
            instance=request.path,
        )
        assert isinstance(problem.body, bytes)
        self.headers.pop("Content-Disposition", None)  # the problem is no attachment
        self.content_type = problem.content_type
        self.content_length = len(problem.body)
        writer = await super().prepare(request)
        if request.method != "HEAD":
            await self.write(problem.body)
        return writer


class ProblemFileResponse(web.FileResponse, _ProblemBodyOnError):
    """`web.FileResponse` with problem+json error answers."""
