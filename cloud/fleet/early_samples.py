"""Telemetry that arrives before its node's birth, held for the birth to apply it.

A node announces itself with a retained QoS 1 birth, then sends QoS 0 samples. At a
busy broker the birth can reach the control plane after the first samples (a QoS 1
message waits for the subscriber's in-flight window; QoS 0 does not), and a fleet
starting at once loses the first sample of hundreds of nodes as `unknown_node`. So the
newest sample of a node not known yet is held for `hold_s`: its birth applies it as if
it had just arrived (checked then like any sample). One sample per node, at most
`max_nodes` nodes: a sample given up (held `hold_s` with no birth, pushed out, or
superseded by a newer one) is refused as `unknown_node` then, as it would have been
at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from shared.messages import Telemetry

DEFAULT_HOLD_S: Final = 10.0
DEFAULT_MAX_NODES: Final = 4096


class EarlySamples:
    def __init__(
        self,
        *,
        hold_s: float = DEFAULT_HOLD_S,
        max_nodes: int = DEFAULT_MAX_NODES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hold_s = hold_s
        self._max_nodes = max_nodes
        self._monotonic = monotonic
        # Node id -> (sample, its topic, when it arrived); oldest arrival first.
        self._held: dict[str, tuple[Telemetry, str, float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, telemetry: Telemetry, topic: str) -> list[tuple[Telemetry, str]]:
        """Hold the node's newest sample; the samples given up, to be refused now."""
        now_s = self._monotonic()
        given_up = self._expired(now_s)
        earlier = self._held.pop(telemetry.node_id, None)
        if earlier is not None:
            older, newer = (earlier[0], earlier[1]), (telemetry, topic)
            if earlier[0].seq > telemetry.seq:
                older, newer = newer, older
            given_up.append(older)
            telemetry, topic = newer
        if len(self._held) >= self._max_nodes:
            oldest = next(iter(self._held))
            sample, oldest_topic, _ = self._held.pop(oldest)
            given_up.append((sample, oldest_topic))
        self._held[telemetry.node_id] = (telemetry, topic, now_s)
        return given_up

    def take(self, node_id: str) -> tuple[Telemetry, str] | None:
        """The node's held sample, if any (its birth is here): checked again as it is
        applied, so an old one is refused then for what it is."""
        held = self._held.pop(node_id, None)
        if held is None:
            return None
        return (held[0], held[1])

    def _expired(self, now_s: float) -> list[tuple[Telemetry, str]]:
        expired = []
        while self._held:
            node_id, (sample, topic, arrived_s) = next(iter(self._held.items()))
            if now_s - arrived_s <= self._hold_s:
                break
            del self._held[node_id]
            expired.append((sample, topic))
        return expired
