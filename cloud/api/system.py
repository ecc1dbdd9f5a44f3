"""Health, readiness, metrics and the published MQTT payload schemas.

`/metrics` serves the fleet's series to anyone (a Prometheus without credentials, a
person with curl) and adds the series that name a tenant, a job or a deployment only
for `Authorization: Bearer <token>` with the metrics scrape token (cloud/scrape_token.py)
or an admin's token. A token that is sent must be right: an unknown or revoked one is a
401 and a tenant's a 403, so a misconfigured scrape shows as down rather than quietly
losing the tenant series.
"""

from __future__ import annotations

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cloud.api.auth import authenticated_tenant, bearer_token, invalid_token
from cloud.api.bodies import json_response
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import JsonObject, Reply, Route
from cloud.app_keys import INGESTOR, METRICS, SCRAPE_TOKEN
from cloud.scrape_token import is_scrape_token
from shared.schemas import schema_catalog


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready once ingestion is subscribed to the broker."""
    if not request.app[INGESTOR].subscribed.is_set():
        raise Problem(503, "not-ready", "Not ready", "not subscribed to the MQTT broker")
    return web.json_response({"status": "ready"})


async def _sees_tenant_series(request: web.Request) -> bool:
    """Whether the caller may see the series that name tenants, jobs and deployments."""
    if "Authorization" not in request.headers:
        return False
    token = bearer_token(request)
    if token is None:
        raise invalid_token("send Authorization: Bearer <the scrape token or an admin token>")
    if is_scrape_token(token, request.app[SCRAPE_TOKEN]):
        return True
    if not (await authenticated_tenant(request, token)).admin:
        raise Problem(
            403,
            "admin-only",
            "Forbidden",
            "the series that name tenants need the metrics scrape token or an admin token; "
            "without a token /metrics serves the fleet's series",
        )
    return True


async def metrics(request: web.Request) -> web.StreamResponse:
    registries = request.app[METRICS]
    tenant_series = (
        generate_latest(registries.tenants) if await _sees_tenant_series(request) else b""
    )
    # The fleet's tens of megabytes are written in a worker thread and sent a family at
    # a time, never joined into one body (cloud/metrics.py).
    chunks = [*await registries.fleet_exposition_chunks(), tenant_series]
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
    response.content_length = sum(len(chunk) for chunk in chunks)
    await response.prepare(request)
    if request.method != "HEAD":
        for chunk in chunks:
            await response.write(chunk)
    await response.write_eof()
    return response


async def schemas(request: web.Request) -> web.Response:
    body = schema_catalog(request.app[INGESTOR].topics)
    return json_response(body)


class Status(msgspec.Struct, frozen=True):
    status: str


ROUTES = (
    Route(
        "GET",
        "/healthz",
        healthz,
        "200 while the process runs",
        "public",
        "operations",
        replies=(Reply(200, "Alive", Status),),
    ),
    Route(
        "GET",
        "/readyz",
        readyz,
        "200 once subscribed to the MQTT broker",
        "public",
        "operations",
        replies=(
            Reply(200, "Ready", Status),
            problem_reply(503, "Not subscribed to the broker"),
        ),
    ),
    Route(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics",
        "scrape",
        "operations",
        description=(
            "Without a token, the fleet's series; with the metrics scrape token (written "
            "to <store data dir>/metrics-token) or an admin token, also the series that "
            "name a tenant, a job or a deployment."
        ),
        replies=(
            Reply(200, "Prometheus text exposition format", str, "text/plain"),
            problem_reply(403, "A tenant's token: the tenant series are not for it"),
        ),
    ),
    Route(
        "GET",
        "/v1/schemas",
        schemas,
        "JSON Schemas of the MQTT payloads, with topics, QoS and retain flags",
        "public",
        "operations",
        replies=(Reply(200, "One entry per MQTT channel", JsonObject),),
    ),
)
