"""Health, readiness, metrics and the published MQTT payload schemas."""

from __future__ import annotations

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cloud.api.bodies import json_response
from cloud.api.problems import Problem, problem_reply
from cloud.api.routes import JsonObject, Reply, Route
from cloud.app_keys import INGESTOR, METRICS
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
        "public",
        "operations",
        replies=(Reply(200, "Prometheus text exposition format", str, "text/plain"),),
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
