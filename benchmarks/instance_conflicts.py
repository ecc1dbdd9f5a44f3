"""Births, replays, retained state (issue 25): how soon a running agent wins its node back
after someone with write access to its `status` copies or forges a birth.

    python benchmarks/instance_conflicts.py --runs 7

One real agent (edge.agent.Agent, simulated `jetson-orin-nano`, telemetry every
`--interval` seconds) and the control plane's registry and ingestion (cloud/fleet) in this
process, on the local Mosquitto (`--mqtt-url`, anonymous: as a broker left open, or any
account allowed to write the node's topics). Each run, a fresh agent and topic root, the
node online with its telemetry accepted, then three attacks, each timed from its publish:

- **forged birth**: a birth with another instance id, retained on the node's `status`:
  until the agent's repeated birth reaches the control plane (the broker retained it
  before passing it on), until the agent has the broker's acknowledgement of it, and
  until another subscriber of the topic sees it; and whether the registry's current
  instance ever changed;
- **copied will**: the agent's own birth copied with `state: offline`: until the registry
  has the node online again (the agent's re-announced birth or its next sample,
  whichever comes first);
- **copied will, then forged birth** (a takeover: the will makes the node offline so the
  forged birth becomes current): until the registry's current instance is the agent's
  again and online.

Medians (and maxima) over the runs, in milliseconds; the registry's instance conflicts
and the agent's counters are summed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.fleet.ingest import Ingestor
from cloud.fleet.registry import NodeRegistry, NodeStateChange
from edge.agent import Agent, NodeIdentity
from shared.logs import configure_logging
from shared.messages import STATUS_DECODER, NodeStatus, encode
from shared.settings import MqttSettings, parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile

NODE_ID = "orin-conflicts"


@dataclass
class Figures:
    forged_birth_ms: list[float] = field(default_factory=list)
    forged_birth_acked_ms: list[float] = field(default_factory=list)
    forged_birth_seen_ms: list[float] = field(default_factory=list)
    copied_will_ms: list[float] = field(default_factory=list)
    takeover_ms: list[float] = field(default_factory=list)
    current_changed_by_forged_birth: int = 0
    takeovers_undone: int = 0  # runs where the impostor did become current for a moment
    conflicts: int = 0
    superseded: int = 0
    repeated: int = 0


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(0.001)


def agent_for(settings: MqttSettings, interval_s: float) -> Agent:
    node = SimulatedNode(NODE_ID, get_profile("jetson-orin-nano"), random.Random(1))
    identity = NodeIdentity(
        node_id=NODE_ID, site="edge", zone="CA-ON", region="northamerica-northeast2"
    )
    return Agent(
        identity,
        node.probes(),
        settings,
        telemetry_interval_s=interval_s,
        telemetry_jitter_ratio=0.0,
        rng=random.Random(1),
    )


class OwnBirthWatch:
    """A subscriber on the node's `status`: when the agent's own birth last arrived."""

    def __init__(self, client: aiomqtt.Client, instance_id: str) -> None:
        self._client = client
        self._instance_id = instance_id
        self.own_birth_at = 0.0

    async def run(self) -> None:
        async for message in self._client.messages:
            if not isinstance(message.payload, bytes) or not message.payload:
                continue
            status: NodeStatus = STATUS_DECODER.decode(message.payload)
            if status.instance_id == self._instance_id and status.state == "online":
                self.own_birth_at = time.monotonic()


async def one_run(url: str, interval_s: float, figures: Figures) -> None:
    root = f"gfbench-{uuid.uuid4().hex[:8]}"
    settings = MqttSettings(
        url=url, topic_root=root, reconnect_initial_s=0.05, reconnect_max_s=0.5, keepalive_s=5
    )
    topics = Topics(root)
    status_topic = topics.node(NODE_ID, Channel.STATUS)
    registry = NodeRegistry()
    switches: list[str] = []
    registry.instance_listeners.append(lambda _, instance: switches.append(instance))
    changes: list[tuple[float, NodeStateChange]] = []
    ingestor = Ingestor(
        registry,
        topics,
        max_payload_bytes=settings.max_payload_bytes,
        on_state_change=lambda change: changes.append((time.monotonic(), change)),
    )
    ingestion = asyncio.create_task(ingestor.run(ingestor.session(settings, f"bench-{root}")))
    agent = agent_for(settings, interval_s)
    running = asyncio.create_task(agent.run())
    endpoint = parse_mqtt_url(url)
    try:
        await until(lambda: (r := registry.get(NODE_ID)) is not None and r.telemetry is not None)
        async with (
            aiomqtt.Client(endpoint.host, endpoint.port) as attacker,
            aiomqtt.Client(endpoint.host, endpoint.port) as observer,
        ):
            await observer.subscribe(status_topic, qos=1)
            watcher = OwnBirthWatch(observer, agent.instance_id)
            watcher_task = asyncio.create_task(watcher.run())
            try:
                await attacks(
                    registry, agent, attacker, watcher, status_topic, switches, changes, figures
                )
            finally:
                await stop_task(watcher_task)
        figures.conflicts += registry.instance_conflicts
        figures.superseded += agent.counters.births_superseded
        figures.repeated += agent.counters.births_repeated
    finally:
        await stop_task(running)
        await stop_task(ingestion)
        async with aiomqtt.Client(endpoint.host, endpoint.port) as cleaner:
            await cleaner.publish(status_topic, b"", qos=1, retain=True)
            await cleaner.publish(topics.node(NODE_ID, Channel.REPORTED), b"", qos=1, retain=True)


async def attacks(
    registry: NodeRegistry,
    agent: Agent,
    attacker: aiomqtt.Client,
    watcher: OwnBirthWatch,
    status_topic: str,
    switches: list[str],
    changes: list[tuple[float, NodeStateChange]],
    figures: Figures,
) -> None:
    await until(lambda: watcher.own_birth_at > 0)  # the retained one
    record = registry.get(NODE_ID)
    assert record is not None
    own = record.status

    # A forged birth: until the broker holds the agent's own birth again (the agent has
    # the broker's acknowledgement of its repeated birth), and until a subscriber sees it.
    switches_before = len(switches)
    repeated_before = agent.counters.births_repeated
    sent_before = record.status.sent_at
    forged = msgspec.structs.replace(own, instance_id=uuid.uuid4().hex)
    started = time.monotonic()
    await attacker.publish(status_topic, encode(forged), qos=1, retain=True)
    # The control plane has the repeated birth: the broker retained it before passing it on.
    await until(lambda: record.status.sent_at > sent_before)
    figures.forged_birth_ms.append((time.monotonic() - started) * 1000)
    await until(lambda: agent.counters.births_repeated > repeated_before)
    figures.forged_birth_acked_ms.append((time.monotonic() - started) * 1000)
    await until(lambda: watcher.own_birth_at > started)
    figures.forged_birth_seen_ms.append((watcher.own_birth_at - started) * 1000)
    figures.current_changed_by_forged_birth += len(switches) - switches_before
    await asyncio.sleep(1.0)  # past the agent's pause between repeated births

    # A copy of its will: until the registry has the node online again.
    will = msgspec.structs.replace(own, state="offline", offline_reason="connection-lost")
    started = time.monotonic()
    await attacker.publish(status_topic, encode(will), qos=1, retain=True)

    def back_online_at() -> float | None:
        """When the node came online again after the will took it offline."""
        went_offline = False
        for at, change in changes:
            if at < started:
                continue
            went_offline = went_offline or change.state == "offline"
            if went_offline and change.state == "online":
                return at
        return None

    await until(lambda: back_online_at() is not None)
    back_at = back_online_at()
    assert back_at is not None
    figures.copied_will_ms.append((back_at - started) * 1000)
    await asyncio.sleep(2.0)

    # A takeover: the copied will, then a forged birth.
    impostor = uuid.uuid4().hex
    forged = msgspec.structs.replace(own, instance_id=impostor)
    started = time.monotonic()
    await attacker.publish(status_topic, encode(will), qos=1, retain=True)
    await attacker.publish(status_topic, encode(forged), qos=1, retain=True)
    await until(lambda: record.status.instance_id == agent.instance_id and record.state == "online")
    await until(lambda: record.telemetry is not None)  # holding it again, not just current
    figures.takeover_ms.append((time.monotonic() - started) * 1000)
    if impostor in switches:  # else the agent's repeated birth came before the forged one
        figures.takeovers_undone += 1


def summary(name: str, values: list[float]) -> str:
    return f"| {name} | {statistics.median(values):.1f} | {max(values):.1f} |"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry interval, s")
    args = parser.parse_args()
    configure_logging("error")
    figures = Figures()
    for _ in range(args.runs):
        await one_run(args.mqtt_url, args.interval, figures)
    print(f"{args.runs} runs, telemetry every {args.interval:g} s")
    print("| attack | median ms | max ms |")
    print("|---|---|---|")
    print(
        summary(
            "forged birth: the agent's own birth retained again (the control plane has it)",
            figures.forged_birth_ms,
        )
    )
    print(summary("... the agent has the broker's PUBACK", figures.forged_birth_acked_ms))
    print(summary("... a subscriber of the topic sees it", figures.forged_birth_seen_ms))
    print(summary("copied will: the node online again", figures.copied_will_ms))
    if figures.takeover_ms:
        print(
            summary(
                f"copied will + forged birth ({figures.takeovers_undone} of {args.runs} runs the "
                "impostor was current for a moment): the agent's instance holds it again",
                figures.takeover_ms,
            )
        )
    changed = figures.current_changed_by_forged_birth
    print(f"current instance changed by a forged birth alone: {changed}")
    print(
        f"instance conflicts counted: {figures.conflicts}; agents: {figures.superseded} "
        f"superseded births seen, {figures.repeated} births repeated"
    )


if __name__ == "__main__":
    asyncio.run(main())
