"""The agent's telemetry count (`AgentCounters.telemetry_sent`) is what it handed to its
MQTT connection: what a fleet's benchmark compares with what the control plane ingested
(benchmarks/fleet_scale.py), so nothing it handed over may go uncounted."""

from __future__ import annotations

import asyncio
import random
import time
from typing import cast

import aiomqtt
import paho.mqtt.client as paho
import pytest
import structlog

from edge.agent.context import AgentContext, AgentCounters, NodeIdentity
from edge.agent.inference_server import InferenceServer
from edge.agent.telemetry import TelemetrySampler
from edge.discovery import discover_all
from edge.inference.options import InferenceOptions
from shared.topics import Topics
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import PROFILES
from tests.support.waiting import eventually


class HandsOverThenWaits:
    """aiomqtt.Client's publish as it is: the message goes to the connection's outgoing
    queue at once (it will be written), then the call waits for the write; here that
    wait never ends, as on a loop too busy to get to it before the agent stops."""

    def __init__(self) -> None:
        self.handed_over: list[bytes] = []

    async def publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        self.handed_over.append(payload)
        await asyncio.Event().wait()


class SwallowsTheStop:
    """aiomqtt.Client's publish on Python 3.11 when the stop arrives as the write
    completes: `asyncio.wait_for` returns the result and drops the cancellation."""

    def __init__(self) -> None:
        self.handed_over: list[bytes] = []
        self.waiting = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        self.handed_over.append(payload)
        if len(self.handed_over) > 1:
            return
        self.waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return  # written meanwhile: wait_for returns, the stop is lost


class Refuses:
    """A publish the client refuses outright (not connected): nothing is handed over."""

    async def publish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        raise aiomqtt.MqttCodeError(paho.MQTT_ERR_NO_CONN, "Could not publish message")


def _sampler(interval_s: float = 60.0) -> tuple[TelemetrySampler, AgentCounters]:
    node = SimulatedNode("pi-count", PROFILES["raspberry-pi-5"], random.Random(1))
    counters = AgentCounters()
    context = AgentContext(
        identity=NodeIdentity(node_id="pi-count", site="edge", zone="DE", region="eu"),
        instance_id="instance-1",
        topics=Topics("gftest-count"),
        counters=counters,
        wall_clock=time.time,
        log=structlog.get_logger("test"),
    )
    probes = node.probes()
    discovery = discover_all(probes)
    inference = InferenceServer(
        context, InferenceOptions(), discovery.accelerators, on_change=lambda: None
    )
    sampler = TelemetrySampler(
        context,
        probes,
        discovery,
        inference,
        interval_s=interval_s,
        jitter_ratio=0.0,
        rng=random.Random(2),
        max_payload_bytes=1 << 20,
    )
    return sampler, counters


async def test_a_sample_handed_over_counts_though_the_agent_stops_while_it_is_written() -> None:
    sampler, counters = _sampler()
    client = HandsOverThenWaits()
    running = asyncio.ensure_future(sampler.run(cast(aiomqtt.Client, client)))
    try:
        await eventually(lambda: len(client.handed_over) == 1, timeout_s=10)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert running.cancelled()
    assert counters.telemetry_sent == len(client.handed_over) == 1


async def test_a_stop_that_the_publish_swallowed_still_stops_the_sampling() -> None:
    sampler, counters = _sampler(interval_s=0.01)
    client = SwallowsTheStop()
    running = asyncio.ensure_future(sampler.run(cast(aiomqtt.Client, client)))
    try:
        async with asyncio.timeout(10):
            await client.waiting.wait()
        running.cancel()
        async with asyncio.timeout(2):
            await asyncio.gather(running, return_exceptions=True)
    finally:
        running.cancel()
    assert running.cancelled()
    # Nothing sampled or sent after the stop, and what was sent is counted.
    assert counters.telemetry_sent == len(client.handed_over) == 1


async def test_a_sample_the_client_refuses_is_not_counted() -> None:
    sampler, counters = _sampler()
    with pytest.raises(aiomqtt.MqttCodeError):
        async with asyncio.timeout(10):
            await sampler.run(cast(aiomqtt.Client, Refuses()))
    assert counters.telemetry_sent == 0
