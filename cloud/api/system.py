"""Health, readiness, metrics and the published MQTT payload schemas."""

from __future__ import annotations

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cloud.api.keys import INGESTOR, METRICS
from cloud.api.problems import Problem
from shared.schemas import schema_catalog


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready once ingestion is subscribed to the broker."""
    if not request.app[INGESTOR].subscribed.is_set():
        raise Problem(503, "not-ready", "Not ready", "not subscribed to the MQTT broker")
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS])
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def schemas(request: web.Request) -> web.Response:
    body = schema_catalog(request.app[INGESTOR].topics)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/schemas", schemas)
