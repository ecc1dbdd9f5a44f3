"""Route declarations: one typed record per operation, the single source for the router,
authentication and the OpenAPI document.

Each API module declares its `ROUTES` (a tuple of `Route`) and registers them with
`add_routes`; the auth middleware reads the access level of the matched handler, and
`cloud.api.openapi` documents exactly what was registered, from the same msgspec types
the handlers decode and encode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# public: anyone; tenant: any valid bearer token; admin: an admin tenant's token;
# signed: a tenant's token, or a `sig` query parameter the handler verifies.
Access = Literal["public", "tenant", "admin", "signed"]

JSON = "application/json"
# A reply documented only as "a JSON object" (its shape is described elsewhere).
JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """One documented answer of an operation (errors are added by the generator)."""

    status: int
    description: str
    body: object = None  # a msgspec-compatible type; None: no JSON body
    content_type: str = JSON
    headers: tuple[str, ...] = ()  # names of response headers worth documenting


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    access: Access
    tag: str
    replies: tuple[Reply, ...]
    query: type | None = None  # a msgspec Struct: its fields are the query parameters
    body: object = None  # the request body's type (JSON)
    body_media_type: str = JSON  # anything else: a raw body (documented as binary)
    headers: tuple[tuple[str, str], ...] = ()  # (request header, description)
    description: str = ""
    # GET routes also answer HEAD, except streams (a HEAD would hold a stream open).
    head: bool = True


REGISTERED_ROUTES: web.AppKey[list[Route]] = web.AppKey("routes", list)
ROUTE_ACCESS: web.AppKey[dict[Handler, Access]] = web.AppKey("route_access", dict)


def add_routes(app: web.Application, routes: Sequence[Route]) -> None:
    """Register each route with the router and remember it for auth and OpenAPI."""
    registered = app.setdefault(REGISTERED_ROUTES, [])
    access = app.setdefault(ROUTE_ACCESS, {})
    for route in routes:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler, allow_head=route.head)
        else:
            app.router.add_route(route.method, route.path, route.handler)
        known = access.get(route.handler)
        if known is not None and known != route.access:
            raise ValueError(f"{route.handler.__name__} is registered with two access levels")
        access[route.handler] = route.access
        registered.append(route)
