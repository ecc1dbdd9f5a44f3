"""A node's clock stepped while its agent runs (a board whose clock was wrong at boot,
then NTP): every birth says when the agent started by the clock as it reads now
(edge/agent/birth.py), so the control plane takes it, and takes it as the same agent
instance, whose `started_at` only moved with the clock."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from edge.agent import Agent, NodeIdentity
from shared.settings import MqttSettings
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from tests.support.fleet import TEST_PUBLIC_KEY, mqtt_settings, running, running_ingestion
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


class SteppedClock:
    """The node's wall clock: `offset_s` off the real time until a test steps it."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s
        self.reads_while_offset = 0

    def __call__(self) -> float:
        if self.offset_s:
            self.reads_while_offset += 1
        return time.time() + self.offset_s


def agent_with(
    node_id: str, settings: MqttSettings, clock: SteppedClock
) -> tuple[Agent, SimulatedNode]:
    node = SimulatedNode(node_id, get_profile("jetson-orin-nano"), random.Random(1))
    agent = Agent(
        NodeIdentity(node_id=node_id, site="edge", zone="CA-ON", region="northamerica-northeast2"),
        node.probes(),
        settings,
        telemetry_interval_s=0.1,
        telemetry_jitter_ratio=0.0,
        wall_clock=clock,
        control_plane_public_key=TEST_PUBLIC_KEY,
    )
    return agent, node


async def test_node_admitted_when_its_clock_is_stepped_back_after_the_agent_started(
    mosquitto_root: tuple[str, str],
) -> None:
    url, topic_root = mosquitto_root
    settings = mqtt_settings(url, topic_root)
    clock = SteppedClock(offset_s=3600.0)  # an hour ahead while the agent starts
    agent, _ = agent_with("clock-back-1", settings, clock)
    real_start_s = time.time()
    async with running_ingestion(settings) as cloud, running(agent):
        await asyncio.sleep(0)  # the agent reads its start time before anything else
        assert clock.reads_while_offset, "the agent did not read the clock while it was ahead"
        clock.offset_s = 0.0  # NTP steps it back before the agent connects

        await eventually(
            lambda: cloud.registry.get("clock-back-1") is not None,
            message=lambda: f"node not admitted: {dict(cloud.ingestor.stats.invalid)}",
        )
        record = cloud.registry.get("clock-back-1")
        assert record is not None
        assert record.status.instance_id == agent.instance_id
        assert real_start_s - 1.0 <= record.status.started_at <= time.time()


async def test_birth_after_a_clock_step_is_taken_as_the_same_instance(
    mosquitto_root: tuple[str, str],
) -> None:
    url, topic_root = mosquitto_root
    settings = mqtt_settings(url, topic_root)
    clock = SteppedClock(offset_s=0.0)
    agent, node = agent_with("clock-back-2", settings, clock)
    async with running_ingestion(settings) as cloud, running(agent):
        registry = cloud.registry
        await eventually(
            lambda: (
                (record := registry.get("clock-back-2")) is not None and registry.holds_node(record)
            ),
            message="the node's telemetry was never taken",
        )
        first = registry.get("clock-back-2")
        assert first is not None
        first_started_at = first.status.started_at

        step_s = 120.0  # back, within the control plane's clock skew allowance
        clock.offset_s = -step_s
        node.fail("gpu0")  # a device's health changes: a new birth goes out

        def corrected_birth_taken() -> bool:
            record = registry.get("clock-back-2")
            return record is not None and record.status.started_at < first_started_at - step_s / 2

        await eventually(corrected_birth_taken, message="no birth with a corrected started_at")
        record = registry.get("clock-back-2")
        assert record is not None
        assert record.status.instance_id == agent.instance_id
        assert record.state == "online"
        assert registry.instance_conflicts == 0
        assert not record.candidates
        # Its samples still count as the current instance's.
        seq = record.telemetry_seq
        assert seq is not None
        await eventually(
            lambda: (
                (now := registry.get("clock-back-2")) is not None
                and (now.telemetry_seq or 0) > seq
                and registry.holds_node(now)
            ),
            message=lambda: f"samples no longer taken: {dict(cloud.ingestor.stats.invalid)}",
        )
