"""Where the birth is published: the node's retained `status`, and kept there.

Online with the full inventory on every connection; offline/shutdown as the
last word of a clean stop; offline/connection-lost as the will the broker
publishes when the connection drops without a goodbye.

**Whose birth is on the topic.** Anyone who can write the node's `status` (an
operator's account, a broker left open) can replace the birth with a copy from another
instance, a forged one, an offline status or nothing, and a control plane that starts
then, or any subscriber, would take it for the node's word. So the agent watches its
own `status` (the node's broker role lets it read that topic since 1.9; an older role
refuses, which the agent says once) and treats anything there that this instance did
not publish as its birth *superseded*: it counts it (`births_superseded`), logs it and
announces itself again (`births_repeated`). The control plane's `desired` documents
say the same thing another way: one issued for another instance, that no document for
this one follows (edge/agent/desired.py calls `unanswered`), means the control plane
has not taken this instance's birth, and the agent announces itself again too, a few
times, after `ANSWER_WAIT_S`.

Announcing again is paced (`ReannouncePacer`): at once after a quiet spell, then at
intervals that double while it goes on, up to `REANNOUNCE_MAX_INTERVAL_S`, so that an
attacker flooding the topic, or two agents configured with one node id, cannot make
the agent flood the broker. The last word is still the agent's: a birth superseded
during a pause is answered when the pause ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiomqtt

from edge.agent.context import AgentContext
from edge.agent.device_health import DeviceHealth
from edge.agent.module import AgentModule
from edge.agent.spool import CLOCK_STEP_TOLERANCE_S
from edge.discovery import DiscoveryResult
from shared import __version__
from shared.errors import MSGSPEC_DECODE_ERRORS
from shared.logs import RateLimitedLog
from shared.messages import (
    STATUS_DECODER,
    IsolationLevel,
    NodeStatus,
    OfflineReason,
    ResourceLimit,
    encode,
)
from shared.topics import Channel

if TYPE_CHECKING:
    from edge.agent.upgrades import AgentUpgrades
    from edge.enrolment_proof import EnrolmentProof

# Pacing of repeated births: the shortest and longest pause between two of them.
REANNOUNCE_MIN_INTERVAL_S: Final = 0.5
REANNOUNCE_MAX_INTERVAL_S: Final = 30.0
# How long the control plane has to answer this instance's birth with a `desired` document
# issued for it, once one issued for another instance has arrived, before we announce again.
ANSWER_WAIT_S: Final = 3.0
# Repeated births for want of an answer, per episode: a control plane that never answers
# (scheduling disabled, say) is not asked for ever.
MAX_UNANSWERED_REANNOUNCES: Final = 5
SUPERSEDED_LOG_INTERVAL_S: Final = 10.0
# Subscription return codes from 0x80 up are refusals (MQTT 3.1.1 and 5).
_REFUSED_SUBSCRIPTION: Final = 0x80
# Payloads published on one connection whose copy may still come back to us.
_ECHOES_KEPT: Final = 8


@dataclass(frozen=True, slots=True)
class ExecutionFacts:
    """What the birth says of how this node runs work (edge/sandbox/probe.py); a node
    that runs no training says nothing of isolation."""

    isolation: IsolationLevel | None = None
    isolation_note: str = ""
    resource_limits: tuple[ResourceLimit, ...] = ()
    container_runtimes: tuple[str, ...] = ()
    sealing_public_key: str | None = None
    # The enrolment certificate every birth shows, with its proof (edge/enrolment_proof.py).
    enrolment: EnrolmentProof | None = None


class ReannouncePacer:
    """When the next repeated birth may go: at once after a quiet spell (twice the longest
    interval without one), then after intervals that double up to `max_interval_s`."""

    def __init__(self, min_interval_s: float, max_interval_s: float) -> None:
        self._min_interval_s = min_interval_s
        self._max_interval_s = max_interval_s
        self._interval_s = min_interval_s
        self._last_s = float("-inf")

    def earliest_s(self, now_s: float) -> float:
        if self._quiet(now_s):
            return now_s
        return self._last_s + self._interval_s

    def sent(self, now_s: float) -> None:
        if self._quiet(now_s):
            self._interval_s = self._min_interval_s
        else:
            self._interval_s = min(self._max_interval_s, 2 * self._interval_s)
        self._last_s = now_s

    def _quiet(self, now_s: float) -> bool:
        return now_s - self._last_s > 2 * self._max_interval_s


class Birth(AgentModule):
    name = "birth"

    def __init__(
        self,
        context: AgentContext,
        discovery: DiscoveryResult,
        *,
        telemetry_interval_s: float,
        started_at: float,
        started_monotonic_s: float,
        announced: asyncio.Event,
        runs_training: bool,
        health: DeviceHealth | None = None,
        health_changed: asyncio.Event | None = None,
        execution: ExecutionFacts | None = None,
        upgrades: AgentUpgrades | None = None,
        pacer: ReannouncePacer | None = None,
        answer_wait_s: float = ANSWER_WAIT_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`started_at` and `started_monotonic_s`: the wall and monotonic clocks when the
        agent started (each birth says when that was by the wall clock as it reads then);
        `announced` is set once the first birth has been published (and stays set);
        `runs_training` is advertised so the scheduler never sends training here in vain;
        the inventory carries `health`, and a new birth goes out when `health_changed`;
        `upgrades` says whether this agent can upgrade itself and what became of the
        last upgrade that did not take (it sets `health_changed` when that changes).
        `pacer` and `answer_wait_s`: how soon a superseded or unanswered birth goes out
        again (`REANNOUNCE_*_INTERVAL_S`, `ANSWER_WAIT_S` unless given)."""
        self._context = context
        self._health = health or DeviceHealth(())
        self._health_changed = health_changed or asyncio.Event()
        self._upgrades = upgrades
        self._runs_training = runs_training
        self._execution = execution or ExecutionFacts()
        self._proof: str | None = None
        self._discovery = discovery
        self._telemetry_interval_s = telemetry_interval_s
        self._started_at = started_at
        self._started_monotonic_s = started_monotonic_s
        self._announced = announced
        self._pacer = pacer or ReannouncePacer(REANNOUNCE_MIN_INTERVAL_S, REANNOUNCE_MAX_INTERVAL_S)
        self._answer_wait_s = answer_wait_s
        self._monotonic = monotonic
        self._superseded_log = RateLimitedLog(context.log, SUPERSEDED_LOG_INTERVAL_S)
        # What this instance last put on its `status`, and what it published on this
        # connection whose copy has not come back yet (oldest first).
        self._latest: bytes | None = None
        self._echoes: deque[bytes] = deque(maxlen=_ECHOES_KEPT)
        # Why the birth must go out again: something else is on the topic; a `desired`
        # document for another instance is unanswered since then (monotonic).
        self._superseded = False
        self._unanswered_since_s: float | None = None
        self._unanswered_reannounces = 0
        self._wake = asyncio.Event()
        self._said_cannot_watch = False
        self._stopping = False

    @property
    def status_topic(self) -> str:
        return self._context.topic(Channel.STATUS)

    def will(self) -> aiomqtt.Will:
        return aiomqtt.Will(
            self.status_topic,
            self._status(offline_reason="connection-lost"),
            qos=1,
            retain=True,
        )

    async def on_connect(self, client: aiomqtt.Client) -> None:
        self._echoes.clear()  # copies of the last connection's messages never come now
        self._superseded = False  # this birth replaces whatever is there
        if self._unanswered_since_s is not None:
            self._unanswered_since_s = self._monotonic()  # this birth deserves its own wait
        await self._publish(client, self._status(offline_reason=None))
        self._context.counters.births += 1
        self._announced.set()

    async def _watch_own_status(self, client: aiomqtt.Client) -> None:
        granted = await client.subscribe(self.status_topic, qos=1)
        codes = [code if isinstance(code, int) else code.value for code in granted]
        if all(code < _REFUSED_SUBSCRIPTION for code in codes) or self._said_cannot_watch:
            return
        self._said_cannot_watch = True
        self._context.log.info(
            "own status not watched: the broker refuses this node reading it (a node role "
            "made before greenfed 1.9; enrolling again renews it); a superseded birth is "
            "noticed through desired documents only",
            topic=self.status_topic,
        )

    async def run(self, client: aiomqtt.Client) -> None:
        # Subscribed once every module has connected: the `desired` subscription, which
        # the control plane is waiting on, goes first. The broker then sends the retained
        # status, which must be our birth.
        await self._watch_own_status(client)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._announce_health_changes(client))
                tasks.create_task(self._announce_again_when_needed(client))
        except* aiomqtt.MqttError as group:
            # The session's reconnect loop must see the MQTT error itself.
            raise group.exceptions[0] from None

    async def goodbye(self, client: aiomqtt.Client) -> None:
        """A clean stop publishes offline/shutdown itself; the will is only for crashes."""
        self._stopping = True
        await self._publish(client, self._status(offline_reason="shutdown"))

    # ---- what others say on our topic --------------------------------------------------

    async def on_status(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        """A message on the node's own `status` (edge/agent/inbox.py): ours coming back, or
        something that supersedes our birth (announced again by `run`, paced)."""
        payload = message.payload
        received = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
        if self._stopping or self._is_ours(received):
            return
        self._context.counters.births_superseded += 1
        # Before anything looks into the payload: whatever it holds, it is not our birth,
        # and no way it fails to decode may keep the birth from going out again.
        self._superseded = True
        self._wake.set()
        what = self._describe(received)
        self._superseded_log.warning(
            what, "birth superseded on the status topic: announcing this instance again", found=what
        )

    def _is_ours(self, payload: bytes) -> bool:
        if payload in self._echoes:
            while self._echoes.popleft() != payload:
                pass  # earlier copies were lost or overtaken: none will come now
            return True
        return payload == self._latest

    def _describe(self, payload: bytes) -> str:
        if not payload:
            return "cleared"
        try:
            status: NodeStatus = STATUS_DECODER.decode(payload)
        except MSGSPEC_DECODE_ERRORS:  # nesting too deep included
            return "unreadable"
        if status.instance_id != self._context.instance_id:
            return f"{status.state} status of another instance"
        return f"{status.state} status of this instance that it did not publish"

    # ---- what the control plane's documents say ----------------------------------------

    def unanswered(self) -> None:
        """A `desired` document issued for another instance arrived: unless one issued
        for this instance follows within the answer wait, announce again."""
        if self._unanswered_since_s is None:
            self._unanswered_since_s = self._monotonic()
            self._wake.set()

    def answered(self) -> None:
        """A `desired` document issued for this instance arrived: the control plane took
        this birth."""
        self._unanswered_since_s = None
        self._unanswered_reannounces = 0

    # ---- publishing --------------------------------------------------------------------

    async def _announce_health_changes(self, client: aiomqtt.Client) -> None:
        while True:
            await self._health_changed.wait()
            self._health_changed.clear()
            await self._publish(client, self._status(offline_reason=None))
            self._context.counters.births += 1

    async def _announce_again_when_needed(self, client: aiomqtt.Client) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            due_s = self._reannounce_due_s()
            # Wait out the pause; a new reason may bring the birth forward or make it moot.
            while due_s is not None and (delay_s := due_s - self._monotonic()) > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), delay_s)
                    self._wake.clear()
                except TimeoutError:
                    pass
                due_s = self._reannounce_due_s()
            if due_s is None or self._stopping:
                continue
            await self._reannounce(client)

    def _reannounce_due_s(self) -> float | None:
        """When the birth must go out again (monotonic); None: it need not."""
        now_s = self._monotonic()
        wanted: list[float] = []
        if self._superseded:
            wanted.append(now_s)
        if (
            self._unanswered_since_s is not None
            and self._unanswered_reannounces < MAX_UNANSWERED_REANNOUNCES
        ):
            wanted.append(self._unanswered_since_s + self._answer_wait_s)
        if not wanted:
            return None
        return max(min(wanted), self._pacer.earliest_s(now_s))

    async def _reannounce(self, client: aiomqtt.Client) -> None:
        now_s = self._monotonic()
        because = "superseded" if self._superseded else "unanswered"
        self._superseded = False
        if self._unanswered_since_s is not None:
            self._unanswered_reannounces += 1
            self._unanswered_since_s = now_s
        self._pacer.sent(now_s)
        await self._publish(client, self._status(offline_reason=None))
        self._context.counters.births_repeated += 1
        self._context.log.info("birth published again", because=because)
        if self._unanswered_since_s is not None:
            self._wake.set()  # the next answer wait starts now

    async def _publish(self, client: aiomqtt.Client, payload: bytes) -> None:
        # Noted before publishing: its copy may come back before the publish returns.
        self._latest = payload
        self._echoes.append(payload)
        await self._context.publish(client, Channel.STATUS, payload)

    def _status(self, *, offline_reason: OfflineReason | None) -> bytes:
        identity = self._context.identity
        enrolment = self._execution.enrolment
        sent_at = self._context.wall_clock()
        return encode(
            NodeStatus(
                node_id=identity.node_id,
                state="offline" if offline_reason else "online",
                offline_reason=offline_reason,
                instance_id=self._context.instance_id,
                agent_version=__version__,
                site=identity.site,
                zone=identity.zone,
                region=identity.region,
                labels=identity.labels,
                host=self._discovery.host,
                accelerators=self._health.inventory(self._discovery.accelerators),
                telemetry_interval_s=self._telemetry_interval_s,
                started_at=self._started_at_by(sent_at),
                sent_at=sent_at,
                runs_training=self._runs_training,
                taints=identity.taints,
                isolation=self._execution.isolation,
                isolation_note=self._execution.isolation_note[:1024],
                resource_limits=self._execution.resource_limits,
                container_runtimes=self._execution.container_runtimes,
                sealing_public_key=self._execution.sealing_public_key,
                enrolment_certificate=enrolment.certificate if enrolment else None,
                identity_proof=self._identity_proof(),
                self_upgrade=self._upgrades is not None and self._upgrades.supervised,
                agent_upgrade=self._upgrades.report() if self._upgrades is not None else None,
            )
        )

    def _started_at_by(self, now_s: float) -> float:
        """When the agent started, by the wall clock that reads `now_s` now (never later).

        The time it has been running is counted on the monotonic clock, so a wall clock
        stepped since (a board that booted with a wrong clock, then NTP) moves the start
        with it: a start read off a clock that was ahead would otherwise lie in the
        future for ever after, and the control plane refuses such a birth
        (`clock_skew`). Drift smaller than `CLOCK_STEP_TOLERANCE_S` (NTP slewing) leaves
        it as it was, so births do not change it for nothing. The control plane tells
        agent instances apart by the instance id, never by `started_at`."""
        running_s = max(0.0, self._monotonic() - self._started_monotonic_s)
        if abs(now_s - running_s - self._started_at) > CLOCK_STEP_TOLERANCE_S:
            self._started_at = now_s - running_s
        return min(self._started_at, now_s)

    def _identity_proof(self) -> str | None:
        """The proof for this instance: made once (an X25519 agreement), kept."""
        enrolment = self._execution.enrolment
        if enrolment is None:
            return None
        if self._proof is None:
            self._proof = enrolment.proof(self._context.instance_id)
        return self._proof
