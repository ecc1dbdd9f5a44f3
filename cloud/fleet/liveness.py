"""Node liveness: where the control plane declares a node offline, and lost.

Two judgments of silence, each one rule, with their settings in `LivenessSettings`:

- **offline** (stale): an online node from which no telemetry arrived for
  `staleness_intervals` of its own telemetry intervals (and, where replicas share
  telemetry, at least that many digest intervals) goes offline with reason
  `telemetry-stale`. `Liveness.run` is the timer that looks every
  `liveness_check_interval_s`.
- **lost**: a node that holds work and has been unavailable (offline for any
  reason, or unknown to this control plane) for `node_lost_grace_s` is lost; the
  scheduling pass asks `Liveness.lost_nodes` and requeues what ran there
  (cloud/loop/reports.py). The grace clock of a node starts at the first pass of
  the current leader that sees it unavailable, so a control plane that just took
  over does not count a node lost sooner than one that watched it go.

What a node says of itself is the registry's to apply (cloud/fleet/registry.py):
its birth, its will (`connection-lost`), its goodbye (`shutdown`), and the
telemetry that brings a stale node back online. This module only judges what the
absence of messages means, and every such judgment is made here.

**Nodes are judged on their own silence, not the control plane's.** When the
control plane's event loop stalls (a long collection, a starved CPU), the liveness
timer runs late: the time it was late is time in which nobody could be heard (what
the nodes sent waits in the socket), so it is not counted in any node's silence, and
that round judges nobody, leaving ingestion a round to read what waited. While the
control plane is itself cut off from the broker, every node falls silent at once, and
that is no evidence about any of them. Its link is proven, not assumed: ingestion
sends itself a probe every `liveness_check_interval_s` (cloud/fleet/link_probe.py),
so a link that stalls without closing (half-open) is known within a few probes, long
before the MQTT client's keep-alive gives it up. Silence is judged only up to when the
link was last proven (``proven_until_s``: the newest probe that came back was sent
then), so no node is stale for what may still wait in a stalled link; while no probe
comes back (``link_up`` false), no node is declared offline or lost. When the link comes
back, every node's silence is counted from that moment (a fresh staleness deadline and
a fresh grace period), so the agents that kept working through a broker outage are not
restarted because of it. No setting has to outrun the link's detection:
`node_lost_grace_s` and the staleness deadlines may be as short as the fleet needs.

Nor on another replica's silence, where replicas share telemetry (`mqtt.shared_group`):
the broker hands each replica its share of the samples, and one that stalls (a GC pause,
a frozen VM, a half-open link) keeps receiving its share until the broker gives it up
(1.5 `mqtt.keepalive_s`), relaying none of it. Each replica's digests say until when its
share has been relayed (a heartbeat every digest interval, less how long its own link was
unproven then: back from a stall, it has not read its backlog yet; cloud/fleet/digest.py
`DigestPeers`), so silence is judged only up to the earliest latest heartbeat of the
replicas that send them (``relayed_until_s``), as it is up to the link's proof. A replica
that said goodbye (a clean stop, or its will when the broker gave it up) or has been
silent for twice the keep-alive is waited for no more; one of an earlier version, which
sends no heartbeats, never was.

Settings keep their keys for users: `[cloud] staleness_intervals`,
`[cloud] liveness_check_interval_s` and `[scheduling] node_lost_grace_s`
(docs/configuration.md); `LivenessSettings.of` gathers them.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from cloud.fleet.registry import NodeRecord, NodeRegistry, NodeStateChange
from shared.settings import Settings

# The liveness timer this late means the control plane was not hearing anyone.
STALL_S: Final = 1.0
# Heap keys are sums that `is_stale` does not round alike: nodes within this of their
# key are judged, so that none is judged later than a sweep over all of them would.
_KEY_ROUNDING_S: Final = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class LivenessSettings:
    """When a silent node is offline, and when its work is lost."""

    # A node is offline after this many of its own telemetry intervals without a sample.
    staleness_intervals: float = 3.0
    # How often the timer looks for stale nodes.
    liveness_check_interval_s: float = 1.0
    # Work on a node unavailable this long is requeued elsewhere.
    node_lost_grace_s: float = 30.0
    # No node is stale sooner than this. Replicas that share telemetry (`mqtt.
    # shared_group`) hear another replica's share of a node once per digest, so a node
    # sampling faster than that would go stale between digests: `staleness_intervals`
    # digest intervals.
    min_staleness_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.staleness_intervals >= 1:
            raise ValueError("staleness_intervals must be >= 1")
        if not self.liveness_check_interval_s > 0:
            raise ValueError("liveness_check_interval_s must be > 0")
        if not self.node_lost_grace_s >= 0:
            raise ValueError("node_lost_grace_s must be >= 0")

    @classmethod
    def of(cls, settings: Settings) -> LivenessSettings:
        return cls(
            staleness_intervals=settings.cloud.staleness_intervals,
            liveness_check_interval_s=settings.cloud.liveness_check_interval_s,
            node_lost_grace_s=settings.scheduling.node_lost_grace_s,
            min_staleness_s=(
                settings.cloud.staleness_intervals * settings.mqtt.digest_interval_s
                if settings.mqtt.shared_group
                else 0.0
            ),
        )


class Liveness:
    """Judges the registry's nodes; ``monotonic`` defaults to the registry's clock,
    which stamps when each node was last heard from."""

    def __init__(
        self,
        registry: NodeRegistry,
        settings: LivenessSettings | None = None,
        *,
        monotonic: Callable[[], float] | None = None,
        link_up: Callable[[], bool] = lambda: True,
        proven_until_s: Callable[[], float] | None = None,
        relayed_until_s: Callable[[], float] | None = None,
    ) -> None:
        """``link_up``: whether the control plane hears the broker now (a probe came
        back lately, `LinkProbe.is_up`); ``proven_until_s``: until when (``monotonic``)
        what the broker took has reached the control plane (`LinkProbe.proven_until_s`);
        ``relayed_until_s``: until when the other replicas that share telemetry have
        relayed their share (`DigestPeers.relayed_until_s`, +inf: no replica is waited
        for); None: always now."""
        self._registry = registry
        self.settings = settings or LivenessSettings()
        self._monotonic = monotonic or registry.monotonic
        self._link_up = link_up
        self._proven_until_s = proven_until_s
        self._relayed_until_s = relayed_until_s
        self._was_up = True
        self._ever_heard = False
        # When the link last came back (monotonic): silence before it does not count.
        self._heard_since_s = float("-inf")
        # Node id -> when the leader's passes first saw it unavailable (monotonic).
        self._unavailable_since: dict[str, float] = {}
        # The latest stalls of the event loop, (start, end) monotonic: not silence.
        self._stalls: deque[tuple[float, float]] = deque(maxlen=64)
        # Online nodes by the earliest time each can be stale (`_stale_after_s`), a heap
        # kept while the registry's version holds: a round judges only the nodes due,
        # not all 10,000 (`expire_stale`).
        self._due: list[tuple[float, str]] = []
        self._due_version: int | None = None
        self.stalls_total = 0
        self._log = structlog.get_logger("greenfed.liveness")

    # ---- offline -------------------------------------------------------------------

    def listening(self, now_s: float) -> bool:
        """Whether silence means anything now. False while the link is down; on the
        first call after it came back, every silence and grace clock starts again."""
        if not self._link_up():
            if self._was_up and self._ever_heard:  # not at start-up, before the first
                self._log.warning("broker link down: no node is judged until it returns")
            self._was_up = False
            return False
        if not self._was_up:
            self._was_up = True
            self._heard_since_s = now_s
            self._unavailable_since.clear()
            if self._ever_heard:
                self._log.info("broker link back: every node gets a fresh grace period")
        self._ever_heard = True
        return True

    def _judged_at_s(self, now_s: float) -> float:
        """When silence is judged up to: now, or if earlier when the link was last proven
        (what nodes sent since may still wait in a stalled link) or when the other
        replicas last relayed their share (a stalled one may hold what nodes sent since).
        Never goes back."""
        judged_s = now_s
        if self._proven_until_s is not None:
            judged_s = min(judged_s, self._proven_until_s())
        if self._relayed_until_s is not None:
            judged_s = min(judged_s, self._relayed_until_s())
        return judged_s

    def is_stale(self, record: NodeRecord, now_s: float) -> bool:
        """No telemetry for longer than `staleness_intervals` of the node's interval,
        counted from when this control plane could last hear it."""
        deadline_s = max(
            self.settings.staleness_intervals * record.status.telemetry_interval_s,
            self.settings.min_staleness_s,
        )
        heard_s = max(record.last_seen_monotonic, self._heard_since_s)
        return now_s - heard_s - self._deaf_s(heard_s) > deadline_s

    def _stale_after_s(self, record: NodeRecord) -> float:
        """When `is_stale` turns true for the node if nothing more is heard from it (up
        to rounding). Never sooner later on: a sample, the link's return and every
        stall of the loop only push it back, so it can key a heap until judged."""
        deadline_s = max(
            self.settings.staleness_intervals * record.status.telemetry_interval_s,
            self.settings.min_staleness_s,
        )
        heard_s = max(record.last_seen_monotonic, self._heard_since_s)
        stalls = self._stalls
        if stalls and stalls[-1][1] > heard_s:  # a stall since: rare
            return heard_s + self._deaf_s(heard_s) + deadline_s
        return heard_s + deadline_s

    def note_stall(self, duration_s: float) -> None:
        """The event loop ran nothing for `duration_s`, until now."""
        end_s = self._monotonic()
        self._stalls.append((end_s - duration_s, end_s))
        self.stalls_total += 1
        self._due_version = None  # keyed again: the oldest stall may have left the deque
        self._log.warning(
            "control plane stalled: that time is no node's silence",
            stalled_s=round(duration_s, 2),
        )

    def _deaf_s(self, since_s: float) -> float:
        """How long the control plane could hear nobody since `since_s`. Stalls are
        kept in order: only those after a node was last heard are looked at (usually
        none), so judging 10,000 nodes stays a pass over the nodes."""
        deaf_s = 0.0
        for start_s, end_s in reversed(self._stalls):
            if end_s <= since_s:
                break
            deaf_s += end_s - max(start_s, since_s)
        return deaf_s

    def expire_stale(self) -> list[NodeStateChange]:
        """Mark online nodes without recent telemetry offline (`telemetry-stale`), in node
        id order; nothing while the broker link is down. Every second at 10,000 nodes:
        it judges the nodes whose time may be up, not every node (5 ms of the event
        loop's CPU a round, 10-16 ms live beside a busy fleet, when it did)."""
        now_s = self._monotonic()
        if not self.listening(now_s):
            return []
        now_s = self._judged_at_s(now_s)  # silence counts only as far as the link is proven
        registry = self._registry
        if self._due_version != registry.version:
            # A birth, a node back online, a changed interval, ...: every online node
            # keyed again. Between such changes (a fleet at work) only the due are judged.
            self._due = [
                (self._stale_after_s(record), record.node_id)
                for record in registry
                if record.state == "online"
            ]
            heapq.heapify(self._due)
            self._due_version = registry.version
        stale: list[str] = []
        judged_again: list[tuple[float, str]] = []
        due = self._due
        # `is_stale` decides; the margin only keeps rounding in the keys from judging a
        # node a round late.
        while due and due[0][0] <= now_s + _KEY_ROUNDING_S:
            _, node_id = heapq.heappop(due)
            record = registry.get(node_id)
            if record is None or record.state != "online":
                continue  # gone or offline: the version moved, the next round rebuilds
            if self.is_stale(record, now_s):
                stale.append(node_id)
            else:  # heard from since it was keyed
                judged_again.append((self._stale_after_s(record), node_id))
        for entry in judged_again:
            heapq.heappush(due, entry)
        stale.sort()
        version = registry.version
        changes = registry.mark_offline(stale, "telemetry-stale")
        if self._due_version == version:
            self._due_version = registry.version  # those nodes left the heap already
        return changes

    async def run(self, on_change: Callable[[], None]) -> None:
        """The timer: expire stale nodes every `liveness_check_interval_s`; after any
        change, call ``on_change`` (ingestion's listeners: the scheduling loop)."""
        loop = asyncio.get_running_loop()
        interval_s = self.settings.liveness_check_interval_s
        while True:
            asked_s = loop.time()
            await asyncio.sleep(interval_s)
            late_s = loop.time() - asked_s - interval_s
            if late_s >= max(STALL_S, interval_s):
                self.note_stall(late_s)
                continue  # ingestion first reads what waited in the socket
            changes = self.expire_stale()
            for change in changes:
                self._log.info(
                    "node state", node_id=change.node_id, state=change.state, reason=change.reason
                )
            if changes:
                on_change()

    # ---- lost ----------------------------------------------------------------------

    def lost_nodes(self, holding: Iterable[str], nodes: Mapping[str, NodeRecord]) -> dict[str, str]:
        """Of the nodes ``holding`` work, those lost: unavailable in the pass's view of
        the fleet (``nodes``) for `node_lost_grace_s`. Node id -> why. Called once
        per pass by the leader, whose calls start and stop the grace clocks. None while
        the broker link is down; the clocks run only as far as the link is proven."""
        now_s = self._monotonic()
        if not self.listening(now_s):
            return {}
        # A clock starts when a pass sees the node unavailable, and runs only as far as
        # the link is proven: never ahead of the time that really passed.
        judged_s = self._judged_at_s(now_s)
        held = set(holding)
        lost: dict[str, str] = {}
        for node_id in sorted(held):
            record = nodes.get(node_id)
            if record is not None and record.state == "online":
                self._unavailable_since.pop(node_id, None)
                continue
            since_s = self._unavailable_since.setdefault(node_id, now_s)
            if judged_s - since_s >= self.settings.node_lost_grace_s:
                if record is None:
                    lost[node_id] = "not seen by this control plane"
                else:
                    lost[node_id] = f"offline: {record.offline_reason or 'unknown reason'}"
        for node_id in set(self._unavailable_since) - held:
            del self._unavailable_since[node_id]
        return lost

    def reset_grace(self) -> None:
        """Forget every grace clock (leadership ended: the next leader starts its own)."""
        self._unavailable_since.clear()
