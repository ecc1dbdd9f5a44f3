"""A message whose handling raises (a bug in the control plane) is counted on /metrics
as `greenfed_mqtt_ingest_failures_total`, which the shipped alert reads
(deploy/prometheus/alerts.yml `GreenfedMqttIngestFailures`), and ingestion goes on."""

from __future__ import annotations

import aiomqtt
import pytest

from cloud.metrics import build_metrics_registry
from shared.messages import HostInfo, NodeStatus, encode
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, running_ingestion
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)


def birth(node_id: str) -> NodeStatus:
    return NodeStatus(
        node_id=node_id, state="online", instance_id="i1", agent_version="test", site="edge",
        zone="DE", region="eu",
        host=HostInfo(hostname=node_id, os="Linux", arch="x86_64", cpu_logical_cores=4,
                      memory_total_bytes=8 * 1024**3),
        accelerators=(), telemetry_interval_s=10.0, started_at=0.0, sent_at=0.0,
    )  # fmt: skip


def failures_line(exposition: bytes) -> str:
    (line,) = [
        line
        for line in exposition.decode().splitlines()
        if line.startswith("greenfed_mqtt_ingest_failures_total")
    ]
    return line


async def test_a_message_whose_handling_raised_is_counted_on_metrics(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    async with running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud:
        registries = build_metrics_registry(cloud.ingestor, accelerator_metrics=False)
        assert failures_line(registries.fleet_exposition()) == (
            "greenfed_mqtt_ingest_failures_total 0.0"
        )

        def buggy_listener() -> None:  # a component with a bug, handed the first birth
            cloud.ingestor.change_listeners.remove(buggy_listener)
            raise RuntimeError("a bug")

        cloud.ingestor.change_listeners.append(buggy_listener)
        endpoint = parse_mqtt_url(broker.url)
        topics = Topics(topic_root)
        async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
            for node_id in ("n1", "n2"):
                await client.publish(
                    topics.node(node_id, Channel.STATUS), encode(birth(node_id)), qos=1
                )
        # The second birth is applied: one failure stops nothing.
        await eventually(lambda: cloud.registry.get("n2") is not None, timeout_s=10)
        assert cloud.ingestor.stats.failures == 1
        assert failures_line(registries.fleet_exposition()) == (
            "greenfed_mqtt_ingest_failures_total 1.0"
        )
