"""`greenfed cloud`: the control plane as its own process."""

from __future__ import annotations

import asyncio

import structlog

from cloud.app import create_app, serving
from cloud.app_keys import BACKGROUND_TASKS
from shared.runtime import run_until_stopped
from shared.settings import Settings


async def run_cloud(settings: Settings, stop: asyncio.Event) -> int:
    log = structlog.get_logger("greenfed.cloud")
    app = create_app(settings)
    async with serving(app, settings.cloud.api_host, settings.cloud.api_port):
        log.info(
            "control plane listening",
            api=f"http://{settings.cloud.api_host}:{settings.cloud.api_port}",
            mqtt=settings.mqtt.url,
            topic_root=settings.mqtt.topic_root,
        )
        await run_until_stopped(stop, watch_background(app[BACKGROUND_TASKS]))
    return 0


async def watch_background(tasks: list[asyncio.Task[None]]) -> None:
    """Return (re-raising its error) as soon as one background task of the app ends."""
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
