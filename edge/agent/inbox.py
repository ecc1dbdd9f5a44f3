"""The one reader of a connection's incoming messages: each goes, by its topic, to the
module that subscribed to it (the node's `desired` to edge/agent/desired.py, its own
`status` to edge/agent/birth.py). aiomqtt has one message queue per client, so two
modules iterating it would each see only part of the messages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import aiomqtt

from edge.agent.module import AgentModule

# Handles one message; must not raise for anything a sender can put in it.
MessageHandler = Callable[[aiomqtt.Client, aiomqtt.Message], Awaitable[None]]


class Inbox(AgentModule):
    name = "inbox"

    def __init__(self, routes: Mapping[str, MessageHandler]) -> None:
        """`routes`: topic -> its handler; messages on other topics are dropped."""
        self._routes = dict(routes)

    async def run(self, client: aiomqtt.Client) -> None:
        # Handled one at a time, in arrival order: a `desired` document is applied whole
        # before the next message is read.
        async for message in client.messages:
            handler = self._routes.get(message.topic.value)
            if handler is not None:
                await handler(client, message)
