"""Route declarations: one typed record per operation, the single source for the router,
authentication and the OpenAPI document.

Each API module declares its `ROUTES` (a tuple of `Route`) and registers them with
`add_routes`; the auth middleware reads the access level of the matched handler, and
`cloud.api.openapi` documents exactly what was registered, from the same msgspec types
the handlers decode and encode. A route that declares no query takes no parameter: any
is a 400 before its handler runs, as an unknown one is where a query is declared.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from aiohttp import hdrs, web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# public: anyone; tenant: any valid bearer token; admin: an admin tenant's token;
# signed: a tenant's token, or a `sig` query parameter the handler verifies;
# scrape: anyone, and a bearer token (the metrics scrape token or an admin's) shows more:
# the handler checks it (/metrics).
Access = Literal["public", "tenant", "admin", "signed", "scrape"]

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
class RequestHeader:
    """A request header an operation reads, documented with the schema it is held to."""

    name: str
    description: str
    schema: JsonObject  # a JSON Schema, e.g. {"type": "string", "pattern": "..."}


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
    body_required: bool = True  # False: the body may be left out (defaults apply)
    headers: tuple[RequestHeader, ...] = ()
    description: str = ""
    # GET routes also answer HEAD, except streams (a HEAD would hold a stream open).
    head: bool = True
    # A page a browser opens (the dashboard): a link's parameters (a campaign tag, a
    # cache buster) change nothing, so they are ignored rather than refused.
    ignores_query: bool = False


REGISTERED_ROUTES: web.AppKey[list[Route]] = web.AppKey("routes", list)
# By handler as declared, and as registered with the router where that differs (a route
# without a query is registered behind the check that it was given none).
ROUTE_ACCESS: web.AppKey[dict[Handler, Access]] = web.AppKey("route_access", dict)

# The parameters a route takes without declaring a query: a signed download's `sig`, its
# credential (read by the auth middleware and the handler; in the OpenAPI document, the
# `signature` security scheme).
_TAKEN_BY_ACCESS: Final[dict[Access, frozenset[str]]] = {"signed": frozenset({"sig"})}


def add_routes(app: web.Application, routes: Sequence[Route]) -> None:
    """Register each route with the router and remember it for auth and OpenAPI."""
    registered = app.setdefault(REGISTERED_ROUTES, [])
    access = app.setdefault(ROUTE_ACCESS, {})
    for route in routes:
        takes_any = route.query is not None or route.ignores_query
        handler = route.handler if takes_any else _taking_no_query(route)
        if route.method == "GET":
            app.router.add_get(route.path, handler, allow_head=route.head)
        else:
            app.router.add_route(route.method, route.path, handler)
        known = access.get(route.handler)
        if known is not None and known != route.access:
            raise ValueError(f"{route.handler.__name__} is registered with two access levels")
        access[route.handler] = access[handler] = route.access
        registered.append(route)


def _taking_no_query(route: Route) -> Handler:
    """The route's handler behind a 400 for any query parameter it does not take.

    Ignoring them was wrong, not lenient: `DELETE /v1/jobs/ID?dry_run=true` cancelled
    for real, and `GET /v1/jobs/ID?tenant=bob` answered with the caller's own job."""
    # Here, not at the top: cloud.api.query needs cloud.api.problems, which needs Reply.
    from cloud.api.query import refuse_undeclared

    taken = _TAKEN_BY_ACCESS.get(route.access, frozenset())
    handler = route.handler

    @functools.wraps(handler)
    async def taking_no_query(request: web.Request) -> web.StreamResponse:
        refuse_undeclared(request, taken)
        return await handler(request)

    return taking_no_query


def refuse_other_methods(app: web.Application) -> None:
    """Answer every method a registered path does not document with 405 and `Allow`
    naming exactly the methods it has (call once every route is registered).

    Without this, aiohttp tries the next resource whose pattern matches: a method that
    `/v1/nodes/enrol` lacks would reach `/v1/nodes/{node_id}` (as node "enrol"), and a
    405's `Allow` would list both paths' methods. OpenAPI matches a concrete path before
    a templated one; so does this."""
    access = app.setdefault(ROUTE_ACCESS, {})
    # A path's methods may sit on several resources (aiohttp starts a new one for a path
    # registered again later): the catch-all goes on its last, so the others are tried
    # first, and names the methods of all of them.
    last: dict[str, web.Resource] = {}
    methods: dict[str, set[str]] = {}
    for resource in app.router.resources():
        if isinstance(resource, web.Resource):
            last[resource.canonical] = resource
            methods.setdefault(resource.canonical, set()).update(r.method for r in resource)
    for path, resource in last.items():
        if hdrs.METH_ANY in methods[path]:
            continue
        handler = _method_not_allowed(", ".join(sorted(methods[path])))
        resource.add_route(hdrs.METH_ANY, handler)
        access[handler] = "public"  # before authentication, as aiohttp's own 405 was


def _method_not_allowed(allow: str) -> Handler:
    async def method_not_allowed(request: web.Request) -> web.StreamResponse:
        raise web.HTTPMethodNotAllowed(request.method, allow.split(", "))

    return method_not_allowed
