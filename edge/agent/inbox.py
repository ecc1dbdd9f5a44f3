"""The one reader of a connection's incoming messages: each goes, by its topic, to the
module that subscribed to it (the node's `desired` to edge/agent/desired.py, its own
`status` to edge/agent/birth.py). aiomqtt has one message queue per client, so two
modules iterating it would each see only part of the messages.

A handler that raises anything but an MQTT error (a bug, a resource the message asked
for and could not have) loses that one message: it is counted, logged with its
traceback at most once per `DROPPED_LOG_INTERVAL_S` per topic (the next line says how
many were dropped unlogged since: whoever can write a topic sets the pace of its
messages), and the next one is read. Otherwise the connection's tasks, and with them
the agent, would end; and a retained `desired` document would end it again at every
start."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import aiomqtt

from edge.agent.module import AgentModule
from shared.lean_logs import get_logger
from shared.logs import RateLimitedLog

# Handles one message; must not raise for anything a sender can put in it.
MessageHandler = Callable[[aiomqtt.Client, aiomqtt.Message], Awaitable[None]]

DROPPED_LOG_INTERVAL_S: Final = 10.0

_log = get_logger("greenfed.agent.inbox")


class Inbox(AgentModule):
    name = "inbox"

    def __init__(self, routes: Mapping[str, MessageHandler]) -> None:
        """`routes`: topic -> its handler; messages on other topics are dropped."""
        self._routes = dict(routes)
        self.failures = 0  # messages dropped because their handler raised
        self._dropped_log = RateLimitedLog(_log, DROPPED_LOG_INTERVAL_S)

    async def run(self, client: aiomqtt.Client) -> None:
        # Handled one at a time, in arrival order: a `desired` document is applied whole
        # before the next message is read.
        async for message in client.messages:
            handler = self._routes.get(message.topic.value)
            if handler is None:
                continue
            try:
                await handler(client, message)
            except aiomqtt.MqttError:
                raise  # the connection is lost: the session reconnects
            except Exception:
                self.failures += 1
                topic = message.topic.value  # one of `routes`: the keys are few
                self._dropped_log.warning(
                    topic,
                    "incoming message dropped: its handling failed",
                    topic=topic,
                    failures=self.failures,
                    exc_info=True,
                )
