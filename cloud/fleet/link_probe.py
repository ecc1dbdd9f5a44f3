"""Proving the control plane's own link to the broker: probes it sends to itself.

A half-open link (a NAT or firewall that dropped the connection's state, a broker host
that froze) delivers nothing and closes nothing: the MQTT client gives it up only when
its keep-alive runs out (up to twice `mqtt.keepalive_s`, a minute by default), and until
then every node falls silent to the control plane at once. That silence is the control
plane's, never evidence about the nodes (cloud/fleet/liveness.py), so the link is proven
rather than assumed: every `interval_s` the ingesting session publishes a probe to a
topic of its own, `{root}/v1/cloud/link-probe/{probe id}` (QoS 0, not retained), to
which it is subscribed. The topic is under the control plane's part of the root, which
only it may read or write (deploy/mosquitto/greenfed.acl, dynsec-bootstrap.sh); no node
or third-party reader sees it, and ingestion takes nothing else from it.

- `proven_until_s`: when the newest probe that came back was sent. A broker hands a
  subscriber messages in the order it took them, so what it took before that moment
  has reached the control plane: silence is judged up to then, never later, however
  short a node's telemetry interval.
- `is_up`: a probe came back within `silent_after_s` (`PROBES_MISSED` intervals, at
  least `MIN_SILENT_S`). While none has, no node is judged at all, and when one does
  every node's silence counts from then, as after an outage the client noticed
  (`Liveness.listening`).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Final

import aiomqtt

from shared.topics import TOPIC_VERSION, Topics

# The link is down once this many probes in a row have not come back ...
PROBES_MISSED: Final = 3
# ... and never sooner than this: one echo late (a busy broker) is no outage, and each
# outage restarts every node's staleness deadline and grace period.
MIN_SILENT_S: Final = 1.0
# Probes remembered until their echo comes: round trips of many intervals (a WAN, a
# busy broker) still prove the link.
_OUTSTANDING: Final = 256
# A probe's payload is its sequence number, in decimal.
_MAX_PAYLOAD_BYTES: Final = 20


class LinkProbe:
    """The proof that the control plane hears the broker; `monotonic` is the clock that
    liveness judges by."""

    def __init__(
        self,
        topics: Topics,
        *,
        interval_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        # Its own topic per probe: replicas (and tests) on one root do not answer for
        # each other's links.
        self.topic = f"{topics.root}/{TOPIC_VERSION}/cloud/link-probe/{uuid.uuid4().hex}"
        self.interval_s = interval_s
        self.silent_after_s = max(PROBES_MISSED * interval_s, MIN_SILENT_S)
        self._monotonic = monotonic
        self._seq = 0
        # (sequence number, when sent) of the probes not back yet, oldest first.
        self._outstanding: deque[tuple[int, float]] = deque(maxlen=_OUTSTANDING)
        self._echoed_s = -math.inf  # when the latest probe came back
        self._proven_until_s = -math.inf
        self.echoes_total = 0

    def is_up(self) -> bool:
        """Whether a probe came back within `silent_after_s`."""
        return self._monotonic() - self._echoed_s <= self.silent_after_s

    def proven_until_s(self) -> float:
        """When the newest probe that came back was sent (monotonic): everything the
        broker took before then has reached the control plane."""
        return self._proven_until_s

    def unproven_s(self) -> float:
        """How long ago the newest probe that came back was sent (+inf: none has): what
        the broker took since may not have reached the control plane yet."""
        return self._monotonic() - self._proven_until_s

    def echoed(self, payload: bytes | bytearray) -> None:
        """A message on the probe's topic. Only a probe sent on this connection and not
        back yet proves anything (its sequence number); the probes sent before it that
        have not come back never will."""
        if len(payload) > _MAX_PAYLOAD_BYTES:
            return
        try:
            seq = int(payload)
        except ValueError:
            return
        outstanding = self._outstanding
        position = next((n for n, (sent, _) in enumerate(outstanding) if sent == seq), None)
        if position is None:
            return
        for _ in range(position):  # older, not back: lost on the way (QoS 0)
            outstanding.popleft()
        _, sent_s = outstanding.popleft()
        self._echoed_s = self._monotonic()
        self._proven_until_s = max(self._proven_until_s, sent_s)
        self.echoes_total += 1

    def lost(self) -> None:
        """The connection ended: nothing is proven until a probe comes back on the next."""
        self._echoed_s = -math.inf
        self._outstanding.clear()

    async def run(self, client: aiomqtt.Client) -> None:
        """Send a probe every `interval_s` on `client`'s connection (subscribed to
        `topic`), until cancelled or a publish fails (`aiomqtt.MqttError`)."""
        self._outstanding.clear()
        while True:
            self._seq += 1
            # Stamped before it leaves: what proves the link is never later than it is.
            self._outstanding.append((self._seq, self._monotonic()))
            await client.publish(self.topic, str(self._seq).encode(), qos=0)
            await asyncio.sleep(self.interval_s)
