"""`greenfed up`: the single-machine experience, end to end."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

import aiomqtt
import pytest

from shared.settings import parse_mqtt_url
from tests.support.brokers import BrokerUnderTest, free_port
from tests.support.processes import GreenfedProcess, get_json, greenfed_env, run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.e2e


async def _all_online(api: str, expected: int) -> bool:
    try:
        body = await get_json(f"{api}/v1/nodes?state=online")
    except OSError:
        return False
    assert isinstance(body, dict)
    return bool(body["count"] == expected)


async def _retained_statuses(url: str, topic_root: str, expected: int) -> list[dict[str, object]]:
    endpoint = parse_mqtt_url(url)
    statuses: list[dict[str, object]] = []
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client, asyncio.timeout(15):
        await client.subscribe(f"{topic_root}/v1/nodes/+/status", qos=1)
        async for message in client.messages:
            assert message.retain
            assert isinstance(message.payload, bytes)
            statuses.append(json.loads(message.payload))
            if len(statuses) == expected:
                break
    return statuses


async def test_up_brings_a_heterogeneous_fleet_online_and_stops_within_five_seconds(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    env = greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root)
    args = [
        "up",
        "--sim",
        "16",
        "--mqtt-url",
        broker.url,
        "--api-port",
        str(api_port),
        "--telemetry-interval",
        "0.5",
    ]
    async with GreenfedProcess(args, tmp_path, env) as up:
        await eventually_async(
            lambda: _all_online(api, 16), timeout_s=30, message=lambda: up.stderr[-2000:]
        )
        body = await get_json(f"{api}/v1/nodes")
        assert isinstance(body, dict)
        nodes = body["items"]
        assert Counter(n["site"] for n in nodes).keys() == {"cloud", "edge"}
        kinds = {a["kind"] for n in nodes for a in n["accelerators"]}
        assert kinds == {"gpu", "npu", "cpu"}
        assert {n["zone"] for n in nodes} == {"CA-ON", "US-CAL-CISO", "DE", "ZA"}
        # The fleet table and its JSON form, from a second process.
        code, table, stderr = await run_greenfed(["nodes", "--api", api])
        assert code == 0, stderr
        assert "16/16 online" in table
        code, listing, _ = await run_greenfed(["nodes", "--api", api, "--json", "--kind", "npu"])
        assert code == 0
        assert {n["node_id"] for n in json.loads(listing)["items"]} == {
            n["node_id"] for n in nodes if any(a["kind"] == "npu" for a in n["accelerators"])
        }
        code, elapsed_s = await up.stop(signal.SIGTERM)
        assert code == 0, up.stderr
        assert elapsed_s < 5.0
        assert "Traceback" not in up.stderr
        assert "fleet: 16/16 online" in up.stdout
        assert f"{api}/v1/nodes" in up.stdout
    if broker.kind == "mosquitto":
        statuses = await _retained_statuses(broker.url, topic_root, 16)
        assert {(s["state"], s["offline_reason"]) for s in statuses} == {("offline", "shutdown")}


async def test_after_sigkill_every_retained_status_turns_offline(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    mqtt_url, topic_root = mosquitto_root
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    env = greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root)
    args = ["up", "--sim", "10", "--mqtt-url", mqtt_url, "--api-port", str(api_port)]
    async with GreenfedProcess(args, tmp_path, env) as up:
        await eventually_async(
            lambda: _all_online(api, 10), timeout_s=30, message=lambda: up.stderr[-2000:]
        )
        code, _ = await up.stop(signal.SIGKILL)
        assert code == -signal.SIGKILL
    statuses = await _retained_statuses(mqtt_url, topic_root, 10)
    assert Counter((s["state"], s["offline_reason"]) for s in statuses) == {
        ("offline", "connection-lost"): 10
    }


async def test_up_with_its_embedded_broker_serves_third_party_subscribers(tmp_path: Path) -> None:
    broker_port, api_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    args = [
        "up",
        "--sim",
        "6",
        "--broker-port",
        str(broker_port),
        "--api-port",
        str(api_port),
        "--telemetry-interval",
        "0.2",
    ]
    async with GreenfedProcess(args, tmp_path) as up:
        await eventually_async(
            lambda: _all_online(api, 6), timeout_s=30, message=lambda: up.stderr[-2000:]
        )
        assert f"embedded MQTT broker mqtt://127.0.0.1:{broker_port}" in up.stdout
        async with aiomqtt.Client("127.0.0.1", broker_port) as subscriber, asyncio.timeout(10):
            await subscriber.subscribe("greenfed/v1/nodes/+/telemetry")
            received = set()
            async for message in subscriber.messages:
                received.add(str(message.topic).split("/")[3])
                if len(received) == 6:
                    break
        code, elapsed_s = await up.stop(signal.SIGINT)
        assert code == 0, up.stderr
        assert elapsed_s < 5.0
        assert "Traceback" not in up.stderr
