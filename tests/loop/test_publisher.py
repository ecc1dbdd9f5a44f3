"""`desired` publishing survives the broker going away: what the loop handed over while
it was down goes out when it returns, newest document per node, retained."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiomqtt
import pytest
from structlog.testing import capture_logs

from cloud.loop.publisher import DesiredPublisher
from greenfed.broker import EmbeddedBroker
from shared.messages import DESIRED_DECODER, DesiredState, DesiredTraining
from shared.settings import parse_mqtt_url
from shared.tasks import stop_task
from shared.topics import Channel, Topics
from tests.support.brokers import BrokerUnderTest, MosquittoProcess, free_port
from tests.support.fleet import TEST_SIGNING_KEY, mqtt_settings
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def document(node_id: str, generation: int) -> DesiredState:
    return DesiredState(node_id=node_id, generation=generation, issued_at=1.0)


async def retained(url: str, root: str, expected: int, *, wait_s: float = 10.0) -> dict[str, int]:
    """Generation per node from the broker's retained `desired` documents: as soon as
    `expected` nodes are found, else what arrived within `wait_s`."""
    host, port = url.removeprefix("mqtt://").split(":")
    found: dict[str, int] = {}
    async with aiomqtt.Client(host, int(port), identifier="test-reader") as client:
        await client.subscribe(Topics(root).all_nodes(Channel.DESIRED), qos=1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                async for message in client.messages:
                    assert isinstance(message.payload, bytes)
                    desired = DESIRED_DECODER.decode(message.payload)
                    found[desired.node_id] = desired.generation
                    if len(found) == expected:
                        return found
    return found


async def test_documents_handed_over_while_the_broker_is_down_go_out_when_it_returns() -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port)
    await broker.start()
    settings = mqtt_settings(broker.url, "publisher")
    publisher = DesiredPublisher(settings, signing_key=TEST_SIGNING_KEY, cluster_id="c1")
    task = asyncio.create_task(publisher.run())
    try:
        await eventually(publisher.connected.is_set, timeout_s=10)
        publisher.submit(document("n1", 1))
        await eventually(lambda: publisher.published_total == 1, timeout_s=10)

        await broker.stop()
        await eventually(lambda: not publisher.connected.is_set(), timeout_s=10)
        # The loop never waits for the broker: these return at once.
        for node_id, generation in (("n1", 2), ("n2", 1), ("n1", 3)):
            publisher.submit(document(node_id, generation))
        assert publisher.is_current("n1", 3)
        assert not publisher.is_current("n1", 4)

        broker = EmbeddedBroker(port=port)
        await broker.start()
        await eventually(lambda: publisher.published_total == 3, timeout_s=15)
        # The newest document per node, retained for agents that connect later.
        assert await retained(broker.url, "publisher", expected=2) == {"n1": 3, "n2": 1}
    finally:
        await stop_task(task)
        await broker.stop()


async def test_every_node_s_newest_document_is_back_after_a_broker_restart_that_lost_it(
    tmp_path: Path,
) -> None:
    """A broker restarted without persistence holds no retained `desired`: the publisher
    puts every node's newest document back on its own, with nothing new handed over."""
    mosquitto = MosquittoProcess(tmp_path)
    await mosquitto.start()
    settings = mqtt_settings(mosquitto.url, "republish")
    publisher = DesiredPublisher(settings, signing_key=TEST_SIGNING_KEY, cluster_id="c1")
    task = asyncio.create_task(publisher.run())
    try:
        await eventually(publisher.connected.is_set, timeout_s=10)
        for node_id, generation in (("n1", 1), ("n2", 4), ("n1", 2)):
            publisher.submit(document(node_id, generation))
        assert await retained(mosquitto.url, "republish", expected=2) == {"n1": 2, "n2": 4}

        await mosquitto.kill()
        await eventually(lambda: not publisher.connected.is_set(), timeout_s=10)
        await mosquitto.start()  # empty: no persistence
        assert await retained(mosquitto.url, "republish", expected=2) == {"n1": 2, "n2": 4}

        publisher.forget()  # leadership lost: nothing of this leader's goes out again
        await mosquitto.kill()
        await eventually(lambda: not publisher.connected.is_set(), timeout_s=10)
        await mosquitto.start()
        await eventually(publisher.connected.is_set, timeout_s=15)
        assert await retained(mosquitto.url, "republish", expected=0, wait_s=1.0) == {}
    finally:
        await stop_task(task)
        await mosquitto.stop()


def oversized(node_id: str, generation: int, payload_bytes: int) -> DesiredState:
    """A document whose payload is over `payload_bytes` (a job's big command)."""
    big = DesiredTraining(job_id="big", command=("python", "-c", "x" * payload_bytes))
    return DesiredState(node_id=node_id, generation=generation, issued_at=1.0, training=(big,))


async def test_a_document_over_the_limit_is_not_sent_and_every_other_is() -> None:
    async with EmbeddedBroker(port=0) as broker:
        settings = mqtt_settings(broker.url, "oversized")
        publisher = DesiredPublisher(
            settings, signing_key=TEST_SIGNING_KEY, cluster_id="c1", max_payload_bytes=4096
        )
        task = asyncio.create_task(publisher.run())
        try:
            await eventually(publisher.connected.is_set, timeout_s=10)
            with capture_logs() as logs:
                publisher.submit(oversized("n1", 1, 8000))
                publisher.submit(document("n2", 1))
                await eventually(lambda: publisher.published_total == 1, timeout_s=10)
            assert publisher.oversized_total == 1
            (refused,) = [log for log in logs if log["log_level"] == "error"]
            assert refused["node_id"] == "n1"
            assert refused["payload_bytes"] > refused["limit_bytes"] == 4096
            assert await retained(broker.url, "oversized", expected=2, wait_s=1.0) == {"n2": 1}
            # Nothing of it comes back: not on the next connection, nor for the node's
            # next document, which goes out as ever.
            publisher.submit(document("n1", 2))
            await eventually(lambda: publisher.published_total == 2, timeout_s=10)
            assert await retained(broker.url, "oversized", expected=2) == {"n1": 2, "n2": 1}
            assert publisher.oversized_total == 1
        finally:
            await stop_task(task)


async def test_a_document_the_broker_would_refuse_breaks_no_other_node_s(tmp_path: Path) -> None:
    """greenfed's own Mosquitto configuration (max_packet_size 1048576): a bigger packet
    made the broker drop the publisher, which sent it again on every connection, and no
    node got a document any more."""
    mosquitto = MosquittoProcess(tmp_path)
    with mosquitto.config.open("a") as config:
        config.write("max_packet_size 1048576\n")  # as deploy/mosquitto/mosquitto.conf
    await mosquitto.start()
    settings = mqtt_settings(mosquitto.url, "packets")
    publisher = DesiredPublisher(settings, signing_key=TEST_SIGNING_KEY, cluster_id="c1")
    task = asyncio.create_task(publisher.run())
    try:
        with capture_logs() as logs:
            await eventually(publisher.connected.is_set, timeout_s=10)
            publisher.submit(oversized("n1", 1, 1024 * 1024))
            publisher.submit(document("n2", 1))
            assert await retained(mosquitto.url, "packets", expected=1) == {"n2": 1}
            publisher.submit(document("n2", 2))
            await eventually(lambda: publisher.published_total == 2, timeout_s=10)
            assert await retained(mosquitto.url, "packets", expected=1) == {"n2": 2}
        assert publisher.oversized_total == 1
        # One connection all along: the broker never had a reason to drop it.
        assert [log["event"] for log in logs].count("mqtt connected") == 1
        assert publisher.connected.is_set()
    finally:
        await stop_task(task)
        await mosquitto.stop()


class LatencyProxy:
    """A TCP proxy that delays every byte by `delay_s` each way, throughput unlimited: a
    WAN link whose round trip is 2 x `delay_s`."""

    def __init__(self, target_url: str, delay_s: float) -> None:
        endpoint = parse_mqtt_url(target_url)
        self._target = (endpoint.host, endpoint.port)
        self._delay_s = delay_s
        self._server: asyncio.Server | None = None
        self._sockets: set[asyncio.StreamWriter] = set()
        self._links: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"mqtt://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> LatencyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for socket in self._sockets:
            socket.transport.abort()  # every link then ends on its own
        async with asyncio.timeout(10):
            await asyncio.gather(*self._links, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = asyncio.current_task()
        assert link is not None
        self._links.add(link)
        self._sockets.add(writer)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
            self._sockets.add(upstream_writer)
            async with asyncio.TaskGroup() as pumps:
                pumps.create_task(self._pump(reader, upstream_writer))
                pumps.create_task(self._pump(upstream_reader, writer))
        except* OSError:
            pass  # a side went away: so does the link
        finally:
            writer.transport.abort()
            self._links.discard(link)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Each chunk goes on `delay_s` after it was read, in order; the end too."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due_s, chunk = await chunks.get()
                await asyncio.sleep(due_s - loop.time())
                if not chunk:
                    sink.transport.abort()
                    return
                sink.write(chunk)

        async with asyncio.TaskGroup() as delivery:
            delivery.create_task(deliver())
            while True:
                chunk = await source.read(65536)
                chunks.put_nowait((loop.time() + self._delay_s, chunk))
                if not chunk:
                    return


async def test_a_backlog_longer_than_the_publish_timeout_goes_out_over_a_slow_link(
    broker: BrokerUnderTest, topic_root: str
) -> None:
    """paho keeps 20 QoS 1 messages unacknowledged; each publish times out
    `connect_timeout_s` after it was called. 1,000 documents take 50 round trips of
    50 ms, longer than that 2 s: sent all at once, the last ones timed out, the
    connection was dropped and everything went out again, for ever. Each must wait for
    its turn before its timeout starts."""
    documents = 1000
    async with LatencyProxy(broker.url, delay_s=0.025) as slow_link:
        settings = mqtt_settings(slow_link.url, topic_root, connect_timeout_s=2.0)
        publisher = DesiredPublisher(settings, signing_key=TEST_SIGNING_KEY, cluster_id="c1")
        for index in range(documents):
            publisher.submit(document(f"n{index}", 1))
        with capture_logs() as logs:
            task = asyncio.create_task(publisher.run())
            try:
                await eventually(
                    lambda: publisher.published_total == documents,
                    timeout_s=30,
                    message=lambda: f"{publisher.published_total} of {documents} published",
                )
            finally:
                await stop_task(task)
        # On the first connection: nothing timed out, nothing was sent twice.
        events = [log["event"] for log in logs]
        assert events.count("mqtt connected") == 1
        assert "mqtt connection lost" not in events
    assert len(await retained(broker.url, topic_root, expected=documents)) == documents
