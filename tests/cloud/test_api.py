"""The control plane's REST API, with real agents publishing through the embedded broker."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiomqtt
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from cloud.app import create_app
from cloud.loop.signing import load_or_create_signing_key, public_key_base64
from greenfed.broker import EmbeddedBroker
from shared.messages import HostInfo, NodeStatus, encode
from shared.settings import CloudSettings, MqttSettings, Settings, StoreSettings, parse_mqtt_url
from shared.token_files import admin_token_path, read_token_file
from shared.topics import Channel, Topics
from tests.support.fleet import mqtt_settings, running, simulated_agent
from tests.support.waiting import eventually_async

PROBLEM = "application/problem+json"
Client = TestClient[web.Request, web.Application]


def cloud_settings(mqtt: MqttSettings, data_dir: Path) -> Settings:
    return Settings(
        mqtt=mqtt,
        cloud=CloudSettings(liveness_check_interval_s=0.05, invalid_log_interval_s=0),
        store=StoreSettings(data_dir=str(data_dir)),
    )


@contextlib.asynccontextmanager
async def api_client(settings: Settings) -> AsyncIterator[Client]:
    """A client of the app that sends the admin token the app bootstrapped."""
    async with TestClient(TestServer(create_app(settings))) as client:
        token = read_token_file(admin_token_path(settings.store))
        client.session.headers["Authorization"] = f"Bearer {token}"
        yield client


@pytest.fixture
async def embedded() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker(port=0) as broker:
        yield broker


@pytest.fixture
async def fleet_api(embedded: EmbeddedBroker, tmp_path: Path) -> AsyncIterator[Client]:
    """An API whose registry holds three live simulated nodes."""
    mqtt = mqtt_settings(embedded.url, "apitest")
    settings = cloud_settings(mqtt, tmp_path)
    key = public_key_base64(load_or_create_signing_key(settings))
    agents = [
        simulated_agent(
            "a100-1",
            mqtt,
            "a100-4x",
            site="cloud",
            zone="CA-ON",
            seed=1,
            control_plane_public_key=key,
        ),
        simulated_agent(
            "npu-gw-1",
            mqtt,
            "intel-core-ultra-npu-gateway",
            zone="DE",
            region="europe-west3",
            seed=2,
            control_plane_public_key=key,
        ),
        simulated_agent(
            "rpi-1",
            mqtt,
            "raspberry-pi-5",
            zone="US-CAL-CISO",
            region="us-west2",
            seed=3,
            control_plane_public_key=key,
        ),
    ]
    async with (
        api_client(settings) as client,
        contextlib.AsyncExitStack() as stack,
    ):
        for agent in agents:
            await stack.enter_async_context(running(agent))

        async def all_online() -> bool:
            body = await (await client.get("/v1/nodes?state=online")).json()
            return bool(body["count"] == 3)

        async def ready() -> bool:
            return (await client.get("/readyz")).status == 200

        await eventually_async(ready)
        await eventually_async(all_online)
        yield client


async def node_ids(client: Client, query: str = "") -> list[str]:
    response = await client.get(f"/v1/nodes{query}")
    assert response.status == 200, await response.text()
    return [item["node_id"] for item in (await response.json())["items"]]


async def test_nodes_are_listed_with_their_inventory_and_filtered(fleet_api: Client) -> None:
    assert await node_ids(fleet_api) == ["a100-1", "npu-gw-1", "rpi-1"]
    assert await node_ids(fleet_api, "?site=cloud") == ["a100-1"]
    assert await node_ids(fleet_api, "?site=edge") == ["npu-gw-1", "rpi-1"]
    assert await node_ids(fleet_api, "?kind=npu") == ["npu-gw-1"]
    assert await node_ids(fleet_api, "?kind=gpu") == ["a100-1"]
    assert await node_ids(fleet_api, "?kind=cpu") == ["a100-1", "npu-gw-1", "rpi-1"]
    assert await node_ids(fleet_api, "?zone=DE&kind=npu&state=online") == ["npu-gw-1"]
    assert await node_ids(fleet_api, "?region=us-west2") == ["rpi-1"]
    assert await node_ids(fleet_api, "?state=offline") == []
    body = await (await fleet_api.get("/v1/nodes?site=cloud")).json()
    node = body["items"][0]
    assert node["accelerator_counts"] == {"cpu": 1, "gpu": 4}
    assert node["state"] == "online"
    assert node["labels"]["test"] == "yes"
    assert {a["model"] for a in node["accelerators"] if a["kind"] == "gpu"} == {
        "NVIDIA A100-SXM4-80GB"
    }


async def test_pages_follow_the_cursor_without_gaps(fleet_api: Client) -> None:
    first = await (await fleet_api.get("/v1/nodes?limit=2")).json()
    assert [n["node_id"] for n in first["items"]] == ["a100-1", "npu-gw-1"]
    assert (first["count"], first["total"], first["next_cursor"]) == (2, 3, "npu-gw-1")
    second = await (await fleet_api.get(f"/v1/nodes?limit=2&cursor={first['next_cursor']}")).json()
    assert [n["node_id"] for n in second["items"]] == ["rpi-1"]
    assert second["next_cursor"] is None


async def test_one_node_shows_inventory_host_and_latest_telemetry(fleet_api: Client) -> None:
    response = await fleet_api.get("/v1/nodes/npu-gw-1")
    assert response.status == 200
    node = await response.json()
    assert node["host"]["cpu_logical_cores"] == 22
    npu = next(a for a in node["accelerators"] if a["kind"] == "npu")
    assert npu["onnx_providers"] == ["OpenVINOExecutionProvider"]
    telemetry = node["telemetry"]
    assert telemetry["node_id"] == "npu-gw-1"
    assert {s["id"] for s in telemetry["accelerators"]} == {"cpu0", "npu0"}
    assert node["power_w"] > 0


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("?site=moon", "site"),
        ("?kind=tpu", "kind"),
        ("?state=sleeping", "state"),
        ("?limit=0", "limit"),
        ("?limit=many", "limit"),
        ("?sight=edge", "sight"),
    ],
)
async def test_bad_query_values_are_problems_naming_the_parameter(
    fleet_api: Client, query: str, parameter: str
) -> None:
    response = await fleet_api.get(f"/v1/nodes{query}")
    assert response.status == 400
    assert response.content_type == PROBLEM
    problem = await response.json(content_type=PROBLEM)
    assert problem["status"] == 400
    assert problem["type"].endswith("/invalid-query")
    assert [p["name"] for p in problem["invalid_params"]] == [parameter]
    assert parameter in problem["detail"]


async def test_unknown_nodes_routes_and_methods_are_problems(fleet_api: Client) -> None:
    missing = await fleet_api.get("/v1/nodes/nope")
    assert (missing.status, missing.content_type) == (404, PROBLEM)
    assert "nope" in (await missing.json(content_type=PROBLEM))["detail"]
    route = await fleet_api.get("/v1/nothing-here")
    assert (route.status, route.content_type) == (404, PROBLEM)
    method = await fleet_api.delete("/v1/nodes")
    assert (method.status, method.content_type) == (405, PROBLEM)
    assert "GET" in method.headers["Allow"]


async def test_schemas_are_published_with_topics_qos_and_retain(fleet_api: Client) -> None:
    catalog = await (await fleet_api.get("/v1/schemas")).json()
    assert set(catalog) == {"status", "telemetry", "desired", "reported", "events", "logs"}
    assert catalog["telemetry"]["topic"] == "apitest/v1/nodes/{node_id}/telemetry"
    assert (catalog["telemetry"]["qos"], catalog["telemetry"]["retained"]) == (0, False)
    assert (catalog["status"]["qos"], catalog["status"]["retained"]) == (1, True)
    assert catalog["status"]["schema"]["$schema"].endswith("2020-12/schema")


async def test_health_readiness_and_metrics(fleet_api: Client, embedded: EmbeddedBroker) -> None:
    assert (await fleet_api.get("/healthz")).status == 200
    assert (await fleet_api.get("/readyz")).status == 200
    endpoint = parse_mqtt_url(embedded.url)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.publish("apitest/v1/nodes/x/telemetry", b"garbage", qos=1)

    async def metrics_text() -> str:
        response = await fleet_api.get("/metrics")
        assert response.status == 200
        return await response.text()

    await eventually_async(lambda: _contains(metrics_text(), 'reason="malformed_json"'))
    text = await metrics_text()
    assert 'greenfed_nodes{site="cloud",state="online"} 1.0' in text
    assert 'greenfed_nodes{site="edge",state="online"} 2.0' in text
    assert 'greenfed_accelerators{kind="gpu",state="online"} 4.0' in text
    assert 'greenfed_nodes_with_accelerator{kind="npu",state="online"} 1.0' in text
    assert (
        'greenfed_mqtt_messages_invalid_total{channel="telemetry",reason="malformed_json"} 1.0'
        in text
    )
    assert 'greenfed_mqtt_messages_ingested_total{channel="telemetry"}' in text
    # How long requests and messages wait for the event loop: sampled from the start.
    assert "greenfed_event_loop_lag_seconds_count" in text


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def _contains(text: Awaitable[str], fragment: str) -> bool:
    return fragment in await text


async def test_not_ready_while_the_broker_is_unreachable(tmp_path: Path) -> None:
    from tests.support.brokers import free_port

    settings = cloud_settings(
        mqtt_settings(f"mqtt://127.0.0.1:{free_port()}", "nobroker"), tmp_path
    )
    async with api_client(settings) as client:
        response = await client.get("/readyz")
        assert (response.status, response.content_type) == (503, PROBLEM)
        assert (await client.get("/healthz")).status == 200


async def test_a_node_that_stops_sending_telemetry_goes_offline_then_recovers(
    embedded: EmbeddedBroker, tmp_path: Path
) -> None:
    mqtt = mqtt_settings(embedded.url, "stale")
    topics = Topics("stale")
    status = NodeStatus(
        node_id="quiet-1",
        state="online",
        instance_id="i1",
        agent_version="test",
        site="edge",
        zone="ZA",
        region="africa-south1",
        host=HostInfo(
            hostname="q", os="linux", arch="x86_64", cpu_logical_cores=4, memory_total_bytes=1
        ),
        accelerators=(),
        telemetry_interval_s=0.05,
        started_at=1.0,
        sent_at=1.0,
    )
    endpoint = parse_mqtt_url(embedded.url)
    async with (
        api_client(cloud_settings(mqtt, tmp_path)) as client,
        aiomqtt.Client(endpoint.host, endpoint.port) as node,
    ):

        async def state() -> tuple[str, str | None] | None:
            response = await client.get("/v1/nodes/quiet-1")
            if response.status != 200:
                return None
            body = await response.json()
            return body["state"], body["offline_reason"]

        await node.publish(
            topics.node("quiet-1", Channel.STATUS), encode(status), qos=1, retain=True
        )
        await eventually_async(lambda: _equals(state(), ("offline", "telemetry-stale")))
        telemetry = msgspec.json.encode(
            {
                "node_id": "quiet-1",
                "instance_id": "i1",
                "seq": 1,
                "sampled_at": time.time(),  # a sample is taken just now (plausibility.py)
                "interval_s": 0.05,
                "cpu_utilization_pct": 1.0,
                "memory_used_bytes": 1,
                "memory_total_bytes": 2,
            }
        )
        await node.publish(topics.node("quiet-1", Channel.TELEMETRY), telemetry, qos=1)
        await eventually_async(lambda: _equals(state(), ("online", None)))
        await node.publish(topics.node("quiet-1", Channel.STATUS), b"", qos=1, retain=True)
