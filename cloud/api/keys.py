"""Typed keys for what the aiohttp application holds (no module globals)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry

from cloud.ingest import Ingestor
from cloud.registry import NodeRegistry
from cloud.signals.service import SignalService
from shared.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", NodeRegistry)
INGESTOR = web.AppKey("ingestor", Ingestor)
METRICS = web.AppKey("metrics", CollectorRegistry)
SIGNALS = web.AppKey("signals", SignalService)
# Tasks the app runs in the background; a runner watches them to fail fast (e.g. MQTT auth).
BACKGROUND_TASKS: web.AppKey[list[asyncio.Task[None]]] = web.AppKey("background_tasks")
