"""The control plane proves its own link to the broker (cloud/fleet/link_probe.py): up
only while its probes come back, proven until the newest one that did was sent, and
nothing else on the topic proves anything."""

from __future__ import annotations

import asyncio
import math

import pytest

from cloud.fleet.link_probe import MIN_SILENT_S, LinkProbe
from shared.tasks import stop_task
from shared.topics import Topics
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, running_ingestion
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def monotonic(self) -> float:
        return self.now_s


class RecordingClient:
    """Takes the probes `LinkProbe.run` publishes, for the test to echo (or not)."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

    async def publish(self, topic: str, payload: bytes, *, qos: int) -> None:
        assert qos == 0
        self.sent.put_nowait((topic, payload))


async def sent_probes(probe: LinkProbe, clock: FakeClock, count: int) -> list[bytes]:
    """`count` probes sent, one a second by `clock`; their payloads."""
    client = RecordingClient()
    task = asyncio.create_task(probe.run(client))  # type: ignore[arg-type]
    payloads: list[bytes] = []
    try:
        for _ in range(count):
            async with asyncio.timeout(5):
                topic, payload = await client.sent.get()
            assert topic == probe.topic
            payloads.append(payload)
            clock.now_s += 1.0
    finally:
        await stop_task(task)
    return payloads


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def probe(clock: FakeClock) -> LinkProbe:
    return LinkProbe(Topics("probe-test"), interval_s=0.01, monotonic=clock.monotonic)


def test_the_probe_topic_is_the_control_plane_s_and_no_node_s() -> None:
    probe = LinkProbe(Topics("fleet"))
    assert probe.topic.startswith("fleet/v1/cloud/link-probe/")
    assert probe.topic != LinkProbe(Topics("fleet")).topic  # one per session
    with pytest.raises(ValueError, match="topic"):
        Topics("fleet").parse(probe.topic)  # never taken for a node's channel


async def test_the_link_is_up_only_while_its_probes_come_back(
    probe: LinkProbe, clock: FakeClock
) -> None:
    assert not probe.is_up()  # nothing proven yet
    assert probe.proven_until_s() == -math.inf
    first, second, third = await sent_probes(probe, clock, 3)  # sent at 100, 101, 102 s
    probe.echoed(second)  # the first was lost on the way (QoS 0)
    assert probe.is_up()
    assert probe.proven_until_s() == 101.0  # when it was sent, not when it came back
    probe.echoed(first)  # overtaken: it proves nothing any more
    assert probe.proven_until_s() == 101.0
    assert probe.echoes_total == 1
    clock.now_s += MIN_SILENT_S  # nothing since: still within the bound ...
    assert probe.is_up()
    clock.now_s += 0.001  # ... and no longer
    assert not probe.is_up()
    probe.echoed(third)  # late, but it came: the link carries
    assert probe.is_up()
    assert probe.proven_until_s() == 102.0


async def test_nothing_but_its_own_outstanding_probes_proves_the_link(
    probe: LinkProbe, clock: FakeClock
) -> None:
    (sent,) = await sent_probes(probe, clock, 1)
    for forged in (b"", b"abc", b"-1", b"99", b"1" * 64, b"\xff"):
        probe.echoed(forged)
    assert not probe.is_up()
    probe.echoed(sent)
    assert probe.is_up()
    probe.echoed(sent)  # a duplicate proves nothing more
    assert probe.echoes_total == 1


async def test_a_lost_connection_is_down_at_once_and_its_probes_prove_nothing_after(
    probe: LinkProbe, clock: FakeClock
) -> None:
    first, second = await sent_probes(probe, clock, 2)
    probe.echoed(first)
    assert probe.is_up()
    probe.lost()
    assert not probe.is_up()
    probe.echoed(second)  # of the connection that ended
    assert not probe.is_up()
    assert probe.proven_until_s() == 100.0  # what was proven stays proven


async def test_ingestion_proves_its_link_through_the_broker_and_counts_nothing_invalid(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    async with running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud:
        probe = cloud.ingestor.link_probe
        await eventually(lambda: probe.echoes_total >= 2 and probe.is_up(), timeout_s=10)
        assert probe.proven_until_s() <= cloud.registry.monotonic()
        assert cloud.ingestor.stats.invalid_total == 0
        assert cloud.ingestor.stats.failures == 0
