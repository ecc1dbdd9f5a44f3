"""The control-plane application: REST API plus the background work it owns.

`create_app` wires the registry, MQTT ingestion and the liveness checker into one
aiohttp application. The background tasks start and stop with the app through
`cleanup_ctx`, so whoever runs the app (`greenfed cloud`, `greenfed up`, tests)
gets a bounded, complete shutdown for free.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator

import aiohttp
import structlog
from aiohttp import web

from cloud.api import nodes, signals, system
from cloud.api.keys import BACKGROUND_TASKS, INGESTOR, METRICS, REGISTRY, SETTINGS, SIGNALS
from cloud.api.problems import problem_middleware
from cloud.ingest import Ingestor
from cloud.metrics import build_metrics_registry
from cloud.registry import NodeRegistry
from cloud.signals.factory import build_signal_service
from shared.settings import Settings
from shared.tasks import stop_task
from shared.topics import Topics

# Requests bodies are small JSON documents; anything bigger is a mistake or abuse.
MAX_REQUEST_BYTES = 1024 * 1024


async def _liveness_loop(registry: NodeRegistry, interval_s: float) -> None:
    log = structlog.get_logger("greenfed.liveness")
    while True:
        await asyncio.sleep(interval_s)
        for change in registry.expire_stale():
            log.info("node state", node_id=change.node_id, state=change.state, reason=change.reason)


async def _background(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    session = app[INGESTOR].session(
        settings.mqtt, client_id=f"greenfed-cloud-{socket.gethostname()}-{os.getpid()}"
    )
    ingestion = asyncio.create_task(app[INGESTOR].run(session), name="mqtt-ingestion")
    liveness = asyncio.create_task(
        _liveness_loop(app[REGISTRY], settings.cloud.liveness_check_interval_s), name="liveness"
    )
    app[BACKGROUND_TASKS] = [ingestion, liveness]
    try:
        yield
    finally:
        for task in (ingestion, liveness):
            # Cancellation is the expected end; any other failure surfaces here.
            await stop_task(task)


async def _signal_service(app: web.Application) -> AsyncIterator[None]:
    """The grid signal chain, with one HTTP session for every live provider."""
    async with aiohttp.ClientSession() as http:
        app[SIGNALS] = build_signal_service(app[SETTINGS].signals, session=http)
        yield


def create_app(settings: Settings, registry: NodeRegistry | None = None) -> web.Application:
    registry = registry or NodeRegistry(staleness_intervals=settings.cloud.staleness_intervals)
    ingestor = Ingestor(
        registry,
        Topics(settings.mqtt.topic_root),
        max_payload_bytes=settings.mqtt.max_payload_bytes,
        invalid_log_interval_s=settings.cloud.invalid_log_interval_s,
    )
    app = web.Application(middlewares=[problem_middleware], client_max_size=MAX_REQUEST_BYTES)
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[INGESTOR] = ingestor
    app[METRICS] = build_metrics_registry(ingestor)
    nodes.add_routes(app)
    signals.add_routes(app)
    system.add_routes(app)
    app.cleanup_ctx.append(_signal_service)
    app.cleanup_ctx.append(_background)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[web.AppRunner]:
    """Serve `app` on host:port for the duration of the block."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        yield runner
    finally:
        await runner.cleanup()
