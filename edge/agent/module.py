"""The one interface every agent module has, and when the agent calls each hook.

==================  ============================================================
start(work)         once, after discovery and before the first connection, in
                    registration order; `work` owns the tasks that outlive a
                    connection (training workers, inference replicas)
on_connect(client)  on every connection, in registration order, before any run
run(client)         for as long as the connection lives, every module at once;
                    returning early is fine, an MqttError ends the connection
goodbye(client)     the agent is stopping while connected: in reverse order, all
                    of them within GOODBYE_TIMEOUT_S
stop()              the agent is stopping: in reverse order, after the connection
==================  ============================================================

Each hook does nothing unless a module overrides it, so a module subclasses
`AgentModule` and writes only the hooks it needs.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import aiomqtt

# How long a stopping agent waits for the broker to take its goodbye.
GOODBYE_TIMEOUT_S = 1.0


class AgentModule(Protocol):
    name: str

    async def start(self, work: asyncio.TaskGroup) -> None:
        return None

    async def on_connect(self, client: aiomqtt.Client) -> None:
        return None

    async def run(self, client: aiomqtt.Client) -> None:
        return None

    async def goodbye(self, client: aiomqtt.Client) -> None:
        return None

    async def stop(self) -> None:
        return None
