"""Agents and cloud ingestion over a real broker (embedded amqtt and Mosquitto)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiomqtt
import jsonschema
import msgspec

from shared.messages import DesiredState
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import (
    mqtt_settings,
    running,
    running_ingestion,
    signed,
    simulated_agent,
)
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import eventually


async def test_birth_reaches_the_registry_with_the_full_inventory(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent(
        "h100-a", settings, "h100-8x", site="cloud", zone="US-CAL-CISO", region="us-west2"
    )
    async with running_ingestion(settings) as cloud, running(agent):
        await eventually(lambda: cloud.registry.get("h100-a") is not None)
        record = cloud.registry.get("h100-a")
        assert record is not None
        status = record.status
        assert (record.state, status.site, status.zone, status.region) == (
            "online",
            "cloud",
            "US-CAL-CISO",
            "us-west2",
        )
        assert status.labels == {"test": "yes"}
        assert status.instance_id == agent.instance_id
        gpus = [a for a in status.accelerators if a.kind == "gpu"]
        assert len(gpus) == 8
        assert {g.model for g in gpus} == {"NVIDIA H100 80GB HBM3"}
        assert all(g.memory_bytes == 80 * 1024**3 and g.max_power_w == 700.0 for g in gpus)
        assert all("CUDAExecutionProvider" in g.onnx_providers for g in gpus)
        assert len({g.uuid for g in gpus}) == 8
        assert [a.kind for a in status.accelerators].count("cpu") == 1
        assert status.host.cpu_logical_cores == 224
        # Telemetry follows, with one sample per accelerator and increasing sequence numbers.
        await eventually(lambda: record.telemetry is not None and record.telemetry.seq >= 3)
        assert record.telemetry is not None
        assert {s.id for s in record.telemetry.accelerators} == {a.id for a in status.accelerators}
        assert cloud.ingestor.stats.invalid_total == 0


async def test_a_lost_connection_marks_the_node_offline_through_its_will(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    endpoint = parse_mqtt_url(broker.url)
    proxy = TcpProxy(endpoint.host, endpoint.port)
    await proxy.start()
    try:
        agent = simulated_agent("orin-1", mqtt_settings(proxy.url, topic_root))
        async with (
            running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud,
            running(agent),
        ):
            await eventually(
                lambda: (r := cloud.registry.get("orin-1")) is not None and r.state == "online"
            )
            proxy.refuse = True  # the network stays down for a while
            assert proxy.cut() == 1
            await eventually(lambda: cloud.registry.get("orin-1").state == "offline")  # type: ignore[union-attr]
            assert cloud.registry.get("orin-1").offline_reason == "connection-lost"  # type: ignore[union-attr]
            # The network comes back: the agent reconnects and announces itself again.
            proxy.refuse = False
            await eventually(
                lambda: cloud.registry.get("orin-1").state == "online",  # type: ignore[union-attr]
                timeout_s=15,
            )
            # The cloud can see the new birth before the agent has its PUBACK and counts it.
            await eventually(lambda: agent.counters.births >= 2)
            assert agent.session is not None
            assert agent.session.connect_count >= 2
    finally:
        await proxy.stop()


async def test_desired_state_is_answered_with_reported_and_replayed_after_reconnect(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    endpoint = parse_mqtt_url(broker.url)
    proxy = TcpProxy(endpoint.host, endpoint.port)
    await proxy.start()
    topics = Topics(topic_root)
    try:
        settings = mqtt_settings(broker.url, topic_root)
        agent = simulated_agent("rpi-1", mqtt_settings(proxy.url, topic_root), "raspberry-pi-5")
        async with (
            running_ingestion(settings) as cloud,
            running(agent),
            aiomqtt.Client(endpoint.host, endpoint.port) as controller,
        ):
            await eventually(lambda: cloud.registry.get("rpi-1") is not None)
            desired = DesiredState(node_id="rpi-1", generation=7, issued_at=1.0)
            await controller.publish(
                topics.node("rpi-1", Channel.DESIRED), signed(desired), qos=1, retain=True
            )
            await eventually(
                lambda: (
                    (r := cloud.registry.get("rpi-1")) is not None
                    and r.reported is not None
                    and r.reported.observed_generation == 7
                )
            )
            # A newer generation published while the agent is cut off is applied on reconnect,
            # because the agent subscribes again and the broker replays the retained document.
            proxy.refuse = True
            proxy.cut()
            await eventually(
                lambda: agent.session is not None and not agent.session.connected.is_set()
            )
            newer = DesiredState(node_id="rpi-1", generation=8, issued_at=2.0)
            await controller.publish(
                topics.node("rpi-1", Channel.DESIRED), signed(newer), qos=1, retain=True
            )
            proxy.refuse = False
            await eventually(lambda: agent.observed_generation == 8, timeout_s=15)
            await eventually(lambda: cloud.registry.get("rpi-1").reported.observed_generation == 8)  # type: ignore[union-attr]
            # A malformed desired document is rejected without disturbing the agent.
            await controller.publish(
                topics.node("rpi-1", Channel.DESIRED), b"{not json", qos=1, retain=True
            )
            await eventually(lambda: agent.counters.desired_rejected == 1)
            assert agent.observed_generation == 8
    finally:
        await proxy.stop()


async def test_bad_payloads_are_counted_and_dropped_without_disturbing_ingestion(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    settings = mqtt_settings(broker.url, topic_root, max_payload_bytes=4096)
    topics = Topics(topic_root)
    endpoint = parse_mqtt_url(broker.url)
    agent = simulated_agent("good-1", settings)
    async with (
        running_ingestion(settings) as cloud,
        running(agent),
        aiomqtt.Client(endpoint.host, endpoint.port) as attacker,
    ):
        await eventually(
            lambda: (r := cloud.registry.get("good-1")) is not None and r.telemetry is not None
        )
        telemetry_topic = topics.node("bad-1", Channel.TELEMETRY)
        await attacker.publish(telemetry_topic, b"\xff\xfe not json", qos=1)
        await attacker.publish(telemetry_topic, b'{"node_id": "bad-1", "seq": -1}', qos=1)
        await attacker.publish(topics.node("bad-1", Channel.STATUS), b"x" * 5000, qos=1)
        good_status = json.dumps({"node_id": "someone-else"}).encode()
        await attacker.publish(topics.node("bad-1", Channel.REPORTED), good_status, qos=1)
        await attacker.publish(f"{topic_root}/v1/nodes/bad-1/nonsense", b"{}", qos=1)
        expected = {
            ("telemetry", "malformed_json"): 1,
            ("telemetry", "schema_violation"): 1,
            ("status", "oversized"): 1,
            ("reported", "schema_violation"): 1,
        }
        await eventually(
            lambda: all(
                cloud.ingestor.stats.invalid[key] == count for key, count in expected.items()
            ),
            message=lambda: f"invalid counters: {dict(cloud.ingestor.stats.invalid)}",
        )
        # The well-behaved node's telemetry keeps flowing and nothing else was touched.
        record = cloud.registry.get("good-1")
        assert record is not None
        assert record.telemetry is not None
        seq_before = record.telemetry.seq
        await eventually(
            lambda: record.telemetry is not None and record.telemetry.seq > seq_before + 2
        )
        assert record.state == "online"
        assert cloud.registry.get("bad-1") is None
        assert len(cloud.registry) == 1


async def test_a_third_party_client_validates_live_payloads_against_the_published_schema(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    schemas = {}
    for channel in ("telemetry", "status"):
        printed = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "greenfed.cli", "schema", channel],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        schemas[channel] = json.loads(printed.stdout)
    settings = mqtt_settings(broker.url, topic_root)
    endpoint = parse_mqtt_url(broker.url)
    agents = [
        simulated_agent("gw-1", settings, "intel-core-ultra-npu-gateway", seed=1),
        simulated_agent("a100-1", settings, "a100-4x", site="cloud", seed=2),
    ]
    received: dict[str, list[dict[str, object]]] = {"telemetry": [], "status": []}
    # A plain client, nothing from greenfed: what a third-party subscriber would write.
    async with aiomqtt.Client(endpoint.host, endpoint.port) as subscriber:
        await subscriber.subscribe(f"{topic_root}/v1/nodes/+/telemetry", qos=0)
        await subscriber.subscribe(f"{topic_root}/v1/nodes/+/status", qos=1)
        async with running(agents[0]), running(agents[1]), asyncio.timeout(20):
            async for message in subscriber.messages:
                channel = str(message.topic).rsplit("/", 1)[1]
                assert isinstance(message.payload, bytes)
                received[channel].append(json.loads(message.payload))
                if len(received["telemetry"]) >= 10 and len(received["status"]) >= 2:
                    break
    for channel, payloads in received.items():
        validator = jsonschema.Draft202012Validator(schemas[channel])
        for payload in payloads:
            validator.validate(payload)
    assert {p["node_id"] for p in received["telemetry"]} == {"gw-1", "a100-1"}
    # The schema is not vacuous: it rejects a payload with an impossible utilisation.
    broken = dict(received["telemetry"][0], cpu_utilization_pct=250)
    assert not jsonschema.Draft202012Validator(schemas["telemetry"]).is_valid(broken)


async def test_a_clean_stop_publishes_offline_with_reason_shutdown(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    settings = mqtt_settings(broker.url, topic_root)
    agent = simulated_agent("t4-1", settings, "t4-inference-server")
    async with running_ingestion(settings) as cloud:
        async with running(agent):
            await eventually(
                lambda: (r := cloud.registry.get("t4-1")) is not None and r.state == "online"
            )
        await eventually(lambda: cloud.registry.get("t4-1").state == "offline")  # type: ignore[union-attr]
        assert cloud.registry.get("t4-1").offline_reason == "shutdown"  # type: ignore[union-attr]
    # A subscriber arriving later sees the retained offline status.
    endpoint = parse_mqtt_url(broker.url)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as late, asyncio.timeout(10):
        await late.subscribe(Topics(topic_root).node("t4-1", Channel.STATUS), qos=1)
        message = await anext(aiter(late.messages))
        assert message.retain
        assert isinstance(message.payload, bytes)
        status = msgspec.json.decode(message.payload)
        assert (status["state"], status["offline_reason"]) == ("offline", "shutdown")
