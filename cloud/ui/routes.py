"""`/ui`: the dashboard page and its assets, served from a fixed table of file names.

A name from a request is only ever a key into that table, never a path: nothing a
caller sends reaches the file system, so `..`, encoded slashes and the like are plain
404s. The page holds no data and needs no token; the API calls it makes do.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from cloud.api.problems import Problem
from cloud.api.routes import Reply, Route

PAGE_PATH: Final = "/ui"

# The files under static/ that are served, by name, with their media types.
_MEDIA_TYPES: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
    "icon.svg": "image/svg+xml",
}
_PAGE: Final = "index.html"

SECURITY_HEADERS: Final = {
    # Scripts, styles, images and API calls from this origin only: no inline script, no
    # CDN, no framing; the token form is handled by the script and never submitted.
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load (a 304 with the ETag): a new release shows at once.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


@functools.cache
def static_file(name: str) -> StaticFile:
    """One of the packaged files (a few KiB each, read once per process)."""
    body = resources.files("cloud.ui").joinpath("static", name).read_bytes()
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    return StaticFile(body=body, media_type=_MEDIA_TYPES[name], etag=etag)


def _not_modified(request: web.Request, etag: str) -> bool:
    header = request.headers.get("If-None-Match", "")
    tags = {tag.strip().removeprefix("W/") for tag in header.split(",")}
    return etag in tags or "*" in tags


def _serve(request: web.Request, name: str) -> web.Response:
    file = static_file(name)
    if _not_modified(request, file.etag):
        response = web.Response(status=304)
    else:
        response = web.Response(body=file.body, content_type=file.media_type, charset="utf-8")
    response.headers.update(SECURITY_HEADERS)
    response.headers["ETag"] = file.etag
    return response


async def ui_page(request: web.Request) -> web.Response:
    return _serve(request, _PAGE)


async def ui_page_slash(request: web.Request) -> web.Response:
    # The browser keeps the #token=... fragment across the redirect.
    raise web.HTTPPermanentRedirect(PAGE_PATH)


async def ui_static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name == _PAGE or name not in _MEDIA_TYPES:
        raise Problem(404, "not-found", "Not Found", "no such file of the dashboard")
    return _serve(request, name)


_NOT_MODIFIED: Final = Reply(304, "Unchanged since the ETag sent in If-None-Match")

ROUTES: Final = (
    Route(
        "GET",
        PAGE_PATH,
        ui_page,
        "The dashboard: fleet, work, carbon intensity per zone, emissions avoided",
        "public",
        "ui",
        description=(
            "A static page; it asks for a token (or reads it from the URL fragment "
            "#token=...) and calls the API with it from the browser."
        ),
        replies=(Reply(200, "The page", str, "text/html"), _NOT_MODIFIED),
        ignores_query=True,
    ),
    Route(
        "GET",
        PAGE_PATH + "/",
        ui_page_slash,
        "Redirects to /ui",
        "public",
        "ui",
        replies=(Reply(308, "To /ui", headers=("Location",)),),
        ignores_query=True,
    ),
    Route(
        "GET",
        PAGE_PATH + "/static/{name}",
        ui_static,
        "A file of the dashboard: app.js, style.css or icon.svg",
        "public",
        "ui",
        replies=(Reply(200, "The file", str, "*/*"), _NOT_MODIFIED),
        ignores_query=True,
    ),
)
