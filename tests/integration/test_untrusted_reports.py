"""A node that lies, against a running control plane and fleet on the real Mosquitto.

One node's credentials are enough to publish anything in its own subtree (the broker
ACL allows no more): absurd inventory, success for another node's job or for one that
was never placed, log chunks for other jobs, timestamps of 1e300, a sequence number of
2^62. Every one is rejected and counted (`/metrics`), no work changes state, the API
keeps answering, and the real node stays online.

The broker is a private Mosquitto (anonymous, as the real one on 127.0.0.1:1883), so
that no other fleet with the same node ids shares it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import msgspec
import pytest

from cloud.app_keys import SCHEDULER
from shared.messages import (
    Accelerator,
    HostInfo,
    JobLogChunk,
    NodeStatus,
    ReportedState,
    ReportedTraining,
    Telemetry,
    encode,
)
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.api.support import Api
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import MosquittoProcess
from tests.support.control_plane import fleet, reaches, work
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def private_mosquitto(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    mosquitto = MosquittoProcess(tmp_path)
    await mosquitto.start()
    try:
        yield mosquitto.url, "untrusted"
    finally:
        await mosquitto.stop()


async def invalid_counts(api: Api) -> dict[tuple[str, str], float]:
    text = await (await api.client.get("/metrics")).text()
    pattern = re.compile(
        r'^greenfed_mqtt_messages_invalid_total\{channel="([^"]+)",reason="([^"]+)"\} (\S+)$',
        re.MULTILINE,
    )
    return {(channel, reason): float(value) for channel, reason, value in pattern.findall(text)}


async def node(api: Api, token: str, node_id: str) -> dict[str, Any]:
    response = await api.get(token, f"/v1/nodes/{node_id}")
    assert response.status == 200, await response.text()
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def fleet_answers(api: Api, token: str) -> list[str]:
    """GET /v1/nodes still answers 200; the node ids it lists."""
    response = await api.get(token, "/v1/nodes")
    assert response.status == 200, await response.text()
    return [item["node_id"] for item in (await response.json())["items"]]


async def passes_later(api: Api, count: int = 3) -> None:
    """Wait until the scheduling loop has run `count` more passes (reports are read on
    every pass: a lie that would change work has had its chance)."""
    loop = api.app[SCHEDULER]
    target = loop.stats.passes + count
    await eventually(lambda: loop.stats.passes >= target, timeout_s=20)


async def test_a_lying_node_changes_nothing_and_every_lie_is_counted(
    database: DatabaseUnderTest, private_mosquitto: tuple[str, str]
) -> None:
    url, root = private_mosquitto
    topics = Topics(root)
    async with fleet(database, private_mosquitto, cloud_nodes=2) as running:
        api = running.api
        token = await api.tenant("acme")
        # A long job on one node; a gang too big for the fleet, never placed (accepted
        # only because it says the fleet may grow).
        placed = await api.submitted(
            token,
            {"name": "long", "command": ["train"], "accelerators_per_worker": 4,
             "estimated_duration_s": 3600.0},
        )  # fmt: skip
        unplaced = await api.submitted(
            token,
            {"name": "too-big", "command": ["train"], "workers": 3,
             "accelerators_per_worker": 4, "estimated_duration_s": 60.0,
             "allow_unschedulable": True},
        )  # fmt: skip
        body = await reaches(api, token, placed, "running")
        (runner,) = body["nodes"]
        liar = next(node_id for node_id in running.agents if node_id != runner)
        await eventually(
            lambda: bool(running.launchers[runner].runs), timeout_s=10, message="no worker started"
        )
        liar_view = await node(api, token, liar)
        instance_id = liar_view["instance_id"]
        seq_before = liar_view["telemetry"]["seq"]

        async def publish(
            node_id: str, channel: Channel, message: msgspec.Struct, retain: bool = False
        ) -> None:
            payload = encode(message)  # type: ignore[arg-type]
            await client.publish(topics.node(node_id, channel), payload, qos=1, retain=retain)
            assert liar in await fleet_answers(api, token)

        endpoint = parse_mqtt_url(url)
        status = NodeStatus(
            node_id="impostor",
            state="online",
            instance_id="x",
            agent_version="0.1.0",
            site="cloud",
            zone="DE",
            region="europe-west3",
            host=msgspec.convert(liar_view["host"], HostInfo),
            accelerators=tuple(
                Accelerator(
                    id=f"gpu{index}",
                    kind="gpu",
                    vendor="nvidia",
                    model="H100",
                    memory_bytes=80 * 1024**3,
                    compute_units=132,
                )
                for index in range(689)
            ),
            telemetry_interval_s=0.2,
            started_at=1.0,
            sent_at=1.0,
        )
        async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
            # Success for the job another node runs, and for one never placed.
            await publish(
                liar,
                Channel.REPORTED,
                ReportedState(
                    node_id=liar,
                    instance_id=instance_id,
                    observed_generation=1,
                    reported_at=1.0,
                    training=(
                        ReportedTraining(job_id=placed, attempt=1, state="succeeded", exit_code=0),
                        ReportedTraining(
                            job_id=unplaced, attempt=1, state="succeeded", exit_code=0
                        ),
                    ),
                ),
                retain=True,
            )
            # Output for another node's job, for no job, and from no node.
            for node_id, job_id in ((liar, placed), (liar, "no-such-job"), ("ghost", placed)):
                await publish(
                    node_id,
                    Channel.LOGS,
                    JobLogChunk(
                        node_id=node_id,
                        job_id=job_id,
                        attempt=1,
                        offset=0,
                        text=f"forged by {node_id}\n",
                        sent_at=1.0,
                    ),
                )
            # 689 GPUs; a birth from the year 10^292; a sequence number of 2^62.
            await publish("impostor", Channel.STATUS, status)
            await publish(
                liar,
                Channel.STATUS,
                msgspec.structs.replace(
                    status, node_id=liar, instance_id=instance_id, accelerators=(),
                    started_at=1e300,
                ),
            )  # fmt: skip
            await publish(
                liar,
                Channel.TELEMETRY,
                Telemetry(
                    node_id=liar,
                    instance_id=instance_id,
                    seq=2**52,  # within the wire's bound (2**53), far ahead of time
                    sampled_at=liar_view["telemetry"]["sampled_at"],
                    interval_s=0.2,
                    cpu_utilization_pct=1.0,
                    memory_used_bytes=1,
                    memory_total_bytes=2,
                ),
            )

        expected = {
            ("reported", "not_assigned"): 2.0,
            ("logs", "not_assigned"): 3.0,
            ("status", "implausible_inventory"): 1.0,
            ("status", "clock_skew"): 1.0,
            ("telemetry", "seq_jump"): 1.0,
        }
        counted: dict[tuple[str, str], float] = {}

        async def all_counted() -> bool:
            counted.update(await invalid_counts(api))
            return all(counted.get(key, 0.0) >= value for key, value in expected.items())

        await eventually_async(all_counted, timeout_s=20, message=lambda: f"counted {counted}")
        await passes_later(api)

        # No work changed state.
        assert (await work(api, token, placed))["state"] == "running"
        assert (await work(api, token, unplaced))["state"] == "pending"
        # The log holds what the runner's worker printed, nothing forged.
        logs = await (await api.get(token, f"/v1/jobs/{placed}/logs")).text()
        assert f"of {placed} on" in logs
        assert "forged" not in logs
        no_logs = await api.get(token, "/v1/jobs/no-such-job/logs")
        assert no_logs.status == 404
        # The impostor is not in the fleet; the liar's real samples still count.
        assert sorted(await fleet_answers(api, token)) == sorted(running.agents)

        async def liar_still_reports() -> bool:
            view = await node(api, token, liar)
            return bool(view["state"] == "online" and view["telemetry"]["seq"] > seq_before + 5)

        await eventually_async(liar_still_reports, timeout_s=10)
        assert (await node(api, token, runner))["state"] == "online"
        assert (await node(api, token, liar))["started_at"] == liar_view["started_at"]
