"""The control plane's own link to the broker goes half-open: a NAT or firewall on the
path drops the connection's state, and from then on nothing passes and nothing closes.
The control plane notices only when its keep-alive runs out; until then every node is
silent to it at once, while each is alive and talking to the broker. That silence is
the control plane's, never the nodes': no node is declared offline, no work is
requeued, and once the link is back every node is online with its work running where
it was, started once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from cloud.app_keys import INGESTOR, REGISTRY
from shared.settings import CloudSettings, parse_mqtt_url
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import BrokerUnderTest
from tests.support.control_plane import (
    FAST_LOOP,
    RecordingLauncher,
    control_plane_public_key,
    reaches,
    work,
)
from tests.support.fleet import mqtt_settings, running, simulated_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)

NODE_ID = "a100-0"
# The control plane's keep-alive: its client gives a silent link up after about twice this.
KEEPALIVE_S = 2


@dataclass
class _Link:
    sockets: list[asyncio.StreamWriter] = field(default_factory=list)
    stalled: bool = False


class StallingProxy:
    """A TCP proxy that, once `stall()` is called, forwards nothing more on the links open
    then, in either direction, and closes none of them. New links pass as ever."""

    def __init__(self, target_url: str) -> None:
        endpoint = parse_mqtt_url(target_url)
        self._target = (endpoint.host, endpoint.port)
        self._server: asyncio.Server | None = None
        self._links: dict[asyncio.Task[Any], _Link] = {}
        self._closing = asyncio.Event()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"mqtt://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def stall(self) -> int:
        """Stall every open link; how many."""
        for link in self._links.values():
            link.stalled = True
        return len(self._links)

    async def __aenter__(self) -> StallingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        self._closing.set()
        for link in self._links.values():
            for socket in link.sockets:
                socket.transport.abort()  # every link then ends on its own
        async with asyncio.timeout(10):
            await asyncio.gather(*self._links, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        link = self._links[task] = _Link([writer])
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
            link.sockets.append(upstream_writer)
            async with asyncio.TaskGroup() as pumps:
                pumps.create_task(self._pump(reader, upstream_writer, link))
                pumps.create_task(self._pump(upstream_reader, writer, link))
        except* OSError:
            pass  # a side went away: so does the link
        finally:
            for socket in link.sockets:
                socket.transport.abort()
            del self._links[task]

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link
    ) -> None:
        while chunk := await source.read(65536):
            if not link.stalled:  # stalled: swallowed, as by a path that lost its state
                sink.write(chunk)
        if link.stalled:  # nor does a stalled link tell one end that the other left
            await self._closing.wait()
        sink.transport.abort()


def long_job(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": 3600.0}


# The link is the broker's and the control plane's; the store plays no part in it.
@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_a_half_open_control_plane_link_loses_no_node_and_requeues_no_work(
    database: DatabaseUnderTest, broker: BrokerUnderTest, topic_root: str
) -> None:
    launcher = RecordingLauncher(NODE_ID, "a100-4x")
    agent = simulated_agent(
        NODE_ID,
        mqtt_settings(broker.url, topic_root),  # straight to the broker, never stalled
        "a100-4x",
        site="cloud",
        zone="DE",
        region="europe-west3",
        telemetry_interval_s=0.2,  # stale after 0.6 s of silence; lost 0.3 s later
        training_launcher=launcher,
        execution=launcher.execution,
        control_plane_public_key=control_plane_public_key(database),
    )
    async with StallingProxy(broker.url) as proxy:
        cloud_mqtt = mqtt_settings(proxy.url, topic_root, keepalive_s=KEEPALIVE_S)
        cloud = CloudSettings(liveness_check_interval_s=0.1, invalid_log_interval_s=0)
        async with (
            running_api(database, mqtt=cloud_mqtt, scheduling=FAST_LOOP, cloud=cloud) as api,
            running(agent),
        ):
            registry, ingestion = api.app[REGISTRY], api.app[INGESTOR]
            token = await api.tenant("acme")
            job_id = await api.submitted(token, long_job("survivor"))
            started = await reaches(api, token, job_id, "running")

            assert proxy.stall() >= 1
            stalled_at_s = registry.monotonic()
            # The control plane knows within a few of its probes, its client still
            # connected and subscribed ...
            await eventually(lambda: not ingestion.link_probe.is_up(), timeout_s=KEEPALIVE_S)
            assert ingestion.subscribed.is_set()
            # ... until that client gives the link up (its keep-alive ran out) ...
            await eventually(lambda: not ingestion.subscribed.is_set(), timeout_s=6 * KEEPALIVE_S)
            # ... connects again (a new link passes), and hears the node again.
            await eventually(
                lambda: (
                    (record := registry.get(NODE_ID)) is not None
                    and record.last_seen_monotonic > stalled_at_s
                    and ingestion.subscribed.is_set()
                ),
                timeout_s=15,
            )
            record = registry.get(NODE_ID)
            assert record is not None
            # Never offline: no outage ended, none going on.
            assert (record.state, record.offline_reason) == ("online", None)
            assert record.last_outage is None
            now = await work(api, token, job_id)
            assert (now["state"], now["attempts"]) == ("running", started["attempts"])
            assert [spec.job_id for spec, _, _ in launcher.runs] == [job_id]  # started once
