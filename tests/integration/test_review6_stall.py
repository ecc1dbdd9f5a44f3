"""A stalled control-plane replica is not the nodes' silence (cloud/fleet/liveness.py,
cloud/fleet/digest.py `DigestPeers`), on the real Mosquitto.

Replicas share telemetry (`mqtt.shared_group`): the broker hands each node's samples to
one of them, and the others hear them only through its digests. A replica that stalls
(SIGSTOP: a GC pause, a frozen VM) keeps receiving its share until the broker gives it
up, so the leader must not mark the nodes of that share offline; a replica that stops
(cleanly, or killed) must not delay the leader seeing a real node go silent, nor must
the replicas when all of them are well."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import aiomqtt
import pytest

from cloud.fleet.ingest import Ingestor
from cloud.fleet.liveness import Liveness, LivenessSettings
from shared.messages import encode
from shared.settings import MqttSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.integration.test_shared_ingestion import (
    INTERVAL_S,
    NODES,
    DoomedReplica,
    birth,
    replica,
    running,
    sample,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)

DIGEST_INTERVAL_S = 0.1  # `replica`'s
# As `LivenessSettings.of` sets them for replicas that share telemetry: a node is stale
# after 3 of its digest intervals (0.3 s, longer than 3 of its own 0.05 s intervals).
LIVENESS = LivenessSettings(
    staleness_intervals=3,
    liveness_check_interval_s=0.1,
    node_lost_grace_s=30.0,
    min_staleness_s=3 * DIGEST_INTERVAL_S,
)
# Long beside every node's deadline (0.3 s), short beside the keep-alive (30 s): the
# broker goes on handing the stalled replica its share all along.
STALL_S = 5.0
# How soon a node that really went silent is offline: its deadline (0.3 s), plus a link
# probe's interval (1 s, silence is judged as far as the link is proven), a digest
# interval and the timer's, with room for a busy test machine.
USUAL_DETECTION_S = 4.0


def leader_liveness(leader: Ingestor) -> Liveness:
    """The leader's liveness, wired as cloud/app.py wires it."""
    return Liveness(
        leader.registry,
        LIVENESS,
        link_up=leader.link_probe.is_up,
        proven_until_s=leader.link_probe.proven_until_s,
        relayed_until_s=leader.digest_peers.relayed_until_s,
    )


class Fleet:
    """The nodes' agents, publishing a round of samples every `INTERVAL_S`; a node
    `silence`d sends nothing more."""

    def __init__(self, agent: aiomqtt.Client, topics: Topics) -> None:
        self._agent = agent
        self._topics = topics
        self.silenced: set[str] = set()
        self.rounds = 0

    async def births(self) -> None:
        for node_id in NODES:
            status = self._topics.node(node_id, Channel.STATUS)
            await self._agent.publish(status, encode(birth(node_id)), qos=1, retain=True)

    async def stream(self) -> None:
        seq = 0
        while True:
            seq += 1
            for node_id in NODES:
                if node_id not in self.silenced:
                    telemetry = sample(node_id, seq, time.time())
                    topic = self._topics.node(node_id, Channel.TELEMETRY)
                    await self._agent.publish(topic, encode(telemetry), qos=0)
            self.rounds += 1
            await asyncio.sleep(INTERVAL_S)


@contextlib.asynccontextmanager
async def fleet_heard_by(
    url: str, root: str, leader: Ingestor, peers: Sequence[DoomedReplica] = ()
) -> AsyncIterator[tuple[Fleet, Liveness, list[tuple[float, str, str]]]]:
    """Every node online at the leader, samples flowing, the leader's liveness running;
    yields the fleet, the liveness and every node the leader marked offline (when, node,
    reason)."""
    endpoint = parse_mqtt_url(url)
    liveness = leader_liveness(leader)
    offline: list[tuple[float, str, str]] = []

    def note_offline() -> None:  # the timer's listener: after each change it made
        for node_id in NODES:
            record = leader.registry.get(node_id)
            noted = {node for _, node, _ in offline}
            if record is not None and record.state != "online" and node_id not in noted:
                offline.append((time.monotonic(), node_id, str(record.offline_reason)))

    async with aiomqtt.Client(endpoint.host, endpoint.port) as agent:
        fleet = Fleet(agent, Topics(root))
        await fleet.births()
        async with asyncio.TaskGroup() as tasks:
            streaming = tasks.create_task(fleet.stream())
            await eventually(
                lambda: (
                    len(leader.registry) == len(NODES)
                    and all(peer.known_nodes == len(NODES) for peer in peers)
                    and all(peer.taken > 0 for peer in peers)
                    and all(_has_telemetry(leader, node_id) for node_id in NODES)
                ),
                timeout_s=30,  # a child process imports the control plane first
                message="every replica knows the fleet and the peers took a share",
            )
            judging = tasks.create_task(liveness.run(note_offline))
            try:
                yield fleet, liveness, offline
            finally:
                await stop_task(judging)
                await stop_task(streaming)


def _has_telemetry(ingestor: Ingestor, node_id: str) -> bool:
    record = ingestor.registry.get(node_id)
    return record is not None and record.telemetry_seq is not None


async def seen_offline(
    offline: list[tuple[float, str, str]], node_id: str, since_s: float, within_s: float
) -> float:
    """How long after `since_s` the leader marked `node_id` offline (within `within_s`)."""
    await eventually(
        lambda: any(node == node_id for _, node, _ in offline),
        timeout_s=within_s,
        message=lambda: f"{node_id} not offline within {within_s} s: {offline}",
    )
    return next(at_s for at_s, node, _ in offline if node == node_id) - since_s


async def test_a_stalled_replica_does_not_make_the_leader_mark_its_share_offline(
    mosquitto_root: tuple[str, str],
) -> None:
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader = replica(url, root, group)
    async with (
        DoomedReplica.started(url, root, group) as stalled,
        running(url, root, [leader]),
        fleet_heard_by(url, root, leader, [stalled]) as (fleet, liveness, offline),
    ):
        await eventually(lambda: len(leader.digest_peers) == 1, message="no heartbeat")
        stalled.process.send_signal(signal.SIGSTOP)
        try:
            rounds_at_stop = fleet.rounds
            # The broker still hands the stalled replica its share (half the nodes: each
            # node's samples go to the same replica round after round).
            await asyncio.sleep(STALL_S)  # the stall itself: nothing to wait for
            assert fleet.rounds > rounds_at_stop + 10, "the fleet stopped sending"
            assert offline == [], f"the leader took the stall for its nodes' silence: {offline}"
        finally:
            stalled.process.send_signal(signal.SIGCONT)
        # Back: its digests come again, with the latest of its share.
        await eventually(
            lambda: all(
                (record := leader.registry.get(node_id)) is not None
                and record.state == "online"
                and time.monotonic() - record.last_seen_monotonic < 1.0
                for node_id in NODES
            ),
            message="the leader hears every node again",
        )
        assert offline == []
        assert liveness.stalls_total == 0  # the leader itself never stalled


async def test_a_replica_that_stops_cleanly_does_not_delay_a_real_node_loss(
    mosquitto_root: tuple[str, str],
) -> None:
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader, leaving = replica(url, root, group), replica(url, root, group)
    async with running(url, root, [leader]), fleet_heard_by(url, root, leader) as fleet_etc:
        fleet, _, offline = fleet_etc
        leaving_task = asyncio.create_task(_run_replica(leaving, url, root), name="leaving-replica")
        try:
            await eventually(lambda: len(leader.digest_peers) == 1, message="no heartbeat")
        finally:
            await stop_task(leaving_task)  # a clean stop: its last digest says goodbye
        await eventually(lambda: len(leader.digest_peers) == 0, message="no goodbye")
        lost_node = NODES[1]
        fleet.silenced.add(lost_node)
        silenced_s = time.monotonic()
        took_s = await seen_offline(offline, lost_node, silenced_s, USUAL_DETECTION_S)
        assert took_s < USUAL_DETECTION_S
        assert [node for _, node, _ in offline] == [lost_node]


async def test_a_killed_replica_does_not_delay_a_real_node_loss(
    mosquitto_root: tuple[str, str],
) -> None:
    """SIGKILL: no last digest; the broker sees the socket close and publishes the
    replica's will, its goodbye."""
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader = replica(url, root, group)
    async with (
        DoomedReplica.started(url, root, group) as doomed,
        running(url, root, [leader]),
        fleet_heard_by(url, root, leader, [doomed]) as (fleet, _, offline),
    ):
        await eventually(lambda: len(leader.digest_peers) == 1, message="no heartbeat")
        await doomed.kill()
        await eventually(lambda: len(leader.digest_peers) == 0, message="no will")
        lost_node = NODES[2]
        fleet.silenced.add(lost_node)
        silenced_s = time.monotonic()
        took_s = await seen_offline(offline, lost_node, silenced_s, USUAL_DETECTION_S)
        assert took_s < USUAL_DETECTION_S
        assert [node for _, node, _ in offline] == [lost_node]


async def test_a_real_node_loss_is_seen_in_the_usual_time_while_every_replica_is_well(
    mosquitto_root: tuple[str, str],
) -> None:
    url, root = mosquitto_root
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader = replica(url, root, group)
    async with (
        DoomedReplica.started(url, root, group) as peer,
        running(url, root, [leader]),
        fleet_heard_by(url, root, leader, [peer]) as (fleet, _, offline),
    ):
        await eventually(lambda: len(leader.digest_peers) == 1, message="no heartbeat")
        # One node of each replica's share (each node's samples go to one replica).
        lost_nodes = sorted(NODES[4:6])
        fleet.silenced.update(lost_nodes)
        silenced_s = time.monotonic()
        for node_id in lost_nodes:
            took_s = await seen_offline(offline, node_id, silenced_s, USUAL_DETECTION_S)
            assert took_s < USUAL_DETECTION_S
        assert sorted(node for _, node, _ in offline) == lost_nodes
        assert len(leader.digest_peers) == 1  # the peer is still waited for, and heard


async def _run_replica(ingestor: Ingestor, url: str, root: str) -> None:
    settings = MqttSettings(url=url, topic_root=root)
    await ingestor.run(ingestor.session(settings, client_id=f"replica-{uuid.uuid4().hex}"))
