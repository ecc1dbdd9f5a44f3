"""What a node's outage most likely is: where the control plane tells a node that
crashed from one that is cut off (and may be working on alone), as far as it can.

While a node is offline, from how its connection ended:

- **stopped**: it said goodbye (`shutdown`);
- **crashed**: the broker published its will while it was still talking (within
  `ABRUPT_INTERVALS` of its telemetry interval of its last message): its connection
  was closed, which is what the operating system does when the agent or its host
  goes down;
- **partitioned**: it went silent (the will came only after the broker's keep-alive
  ran out, or its telemetry stopped): the node or its link is unreachable, and its
  agent may be running alone (edge agents keep serving and training from disk);
- **broker**: the broker ended its connection, not the node: its will came as the
  control plane's own connection to the broker ended too (a broker shutting down
  cleanly publishes every client's will, then closes every connection: Mosquitto
  does), or came back from the broker's retained state for a node last heard before
  that loss, so its timing says nothing of the node. `BrokerOutageJudge` makes this
  call, after `offline_cause` judged the will alone.

A host that loses power looks partitioned until it comes back: that is the "as far as
it can". When the node is back, its birth settles it: the same agent instance means
it was partitioned and kept running; a new one means its agent restarted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import structlog

from shared.messages import OfflineReason

if TYPE_CHECKING:  # the registry imports this module
    from cloud.fleet.registry import NodeRegistry, NodeStateChange

OutageCause = Literal["stopped", "crashed", "partitioned", "broker"]
OutageEnd = Literal["partition", "restart"]

# A will within this many telemetry intervals of the last message: the link was closed.
ABRUPT_INTERVALS = 2.0
# Wills that reached the control plane at most this long before its own connection to
# the broker ended came with the broker's shutdown. Mosquitto sends every will and
# then closes every connection within milliseconds; the margin covers working through
# a large fleet's burst of wills (10,000 in well under a second) on a busy process.
BROKER_SHUTDOWN_WINDOW_S = 5.0


def offline_cause(
    reason: OfflineReason, silent_for_s: float, telemetry_interval_s: float
) -> OutageCause:
    """The likely cause of going offline for `reason`, `silent_for_s` after the node's
    last message."""
    if reason == "shutdown":
        return "stopped"
    if reason == "connection-lost" and silent_for_s <= ABRUPT_INTERVALS * telemetry_interval_s:
        return "crashed"
    return "partitioned"


@dataclass(frozen=True, slots=True)
class Outage:
    """The node's latest outage, once it ended."""

    cause: OutageCause  # as judged while it lasted
    ended_by: OutageEnd  # "partition": the same agent came back; "restart": a new one
    offline_s: float
    ended_at: float  # UTC epoch seconds


def ended_by(old_instance_id: str, new_instance_id: str) -> OutageEnd:
    return "partition" if old_instance_id == new_instance_id else "restart"


class BrokerOutageJudge:
    """Tells a clean broker shutdown from a crash: a will judged `crashed` (the node's
    connection closed while it talked) is the broker's doing when the control plane
    lost the broker at the same moment; any will of a node last heard before that loss
    is too (it says nothing of when the node's connection ended). Told of every node
    state change (`Ingestor`'s `on_state_change`) and of every loss of the control
    plane's own connection (`MqttSession.link_lost_listeners`); both run on the event
    loop, synchronously, in the order things happened."""

    def __init__(self, registry: NodeRegistry) -> None:
        self._registry = registry
        # (when, node id) of recent `crashed` verdicts, oldest first (registry monotonic).
        self._recent_crashes: deque[tuple[float, str]] = deque()
        # When the control plane's own connection last ended (registry monotonic).
        self._link_lost_at: float | None = None
        self._log = structlog.get_logger("greenfed.liveness")

    def note_state_change(self, change: NodeStateChange) -> None:
        if change.state != "offline" or change.reason != "connection-lost":
            return
        record = self._registry.get(change.node_id)
        if record is None or record.offline_cause not in ("crashed", "partitioned"):
            return
        if self._link_lost_at is not None and record.last_seen_monotonic < self._link_lost_at:
            # Last heard before the control plane lost the broker: the will (kept by the
            # broker, sent again when the control plane subscribed anew) may come from
            # any time since, the broker's own shutdown most likely. Neither a crash nor
            # a partition can be told from it.
            self._blame_broker([change.node_id])
            return
        if record.offline_cause != "crashed":
            return
        now = self._registry.monotonic()
        self._recent_crashes.append((now, change.node_id))
        while self._recent_crashes and now - self._recent_crashes[0][0] > BROKER_SHUTDOWN_WINDOW_S:
            self._recent_crashes.popleft()

    def link_lost(self) -> None:
        """The control plane's connection to the broker ended."""
        now = self._registry.monotonic()
        self._link_lost_at = now
        together = [
            node_id for at, node_id in self._recent_crashes if now - at <= BROKER_SHUTDOWN_WINDOW_S
        ]
        self._recent_crashes.clear()
        self._blame_broker(together)

    def _blame_broker(self, node_ids: list[str]) -> None:
        blamed = 0
        for node_id in node_ids:
            record = self._registry.get(node_id)
            if record is None or record.state != "offline":
                continue  # back already: its birth settled the outage
            if record.offline_cause in ("crashed", "partitioned"):  # judged by its will
                record.offline_cause = "broker"
                blamed += 1
        if blamed:
            self._registry.version += 1
            self._log.info("wills blamed on the broker, not the nodes", nodes=blamed)
