"""`greenfed up`: the single-machine experience, end to end."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import aiomqtt
import jsonschema
import pytest
from aiomqtt.exceptions import MqttConnectError

from greenfed.data_dir_lock import data_dir_lock
from shared.settings import parse_mqtt_url
from tests.support.brokers import BrokerUnderTest, free_port
from tests.support.onnx_models import mlp
from tests.support.processes import GreenfedProcess, get_json, greenfed_env, run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.e2e


def _admin_token(data_dir: Path) -> str | None:
    """The token `greenfed up` wrote when it created the admin tenant of `data_dir`."""
    path = data_dir / "admin-token"
    return path.read_text().strip() if path.exists() else None


async def _all_online(api: str, expected: int, data_dir: Path) -> bool:
    token = _admin_token(data_dir)
    if token is None:
        return False
    try:
        body = await get_json(f"{api}/v1/nodes?state=online", token)
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


async def _subscribe_telemetry(url: str, topic_root: str, count: int) -> list[object]:
    """Ten telemetry payloads as `mosquitto_sub -C 10` prints them (the real tool when
    installed, a plain client otherwise)."""
    endpoint = parse_mqtt_url(url)
    topic = f"{topic_root}/v1/nodes/+/telemetry"
    tool = shutil.which("mosquitto_sub")
    if tool:
        process = await asyncio.create_subprocess_exec(
            tool,
            "-h",
            endpoint.host,
            "-p",
            str(endpoint.port),
            "-t",
            topic,
            "-C",
            str(count),
            "-W",
            "15",
            stdout=asyncio.subprocess.PIPE,
        )
        stdout, _ = await process.communicate()
        return [json.loads(line) for line in stdout.decode().splitlines()]
    payloads: list[object] = []
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client, asyncio.timeout(15):
        await client.subscribe(topic)
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            payloads.append(json.loads(message.payload))
            if len(payloads) == count:
                break
    return payloads


async def test_up_brings_forty_heterogeneous_nodes_online_and_stops_within_five_seconds(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    data_dir = tmp_path / "data"
    env = greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root, GREENFED_STORE__DATA_DIR=str(data_dir))
    # The acceptance run: 40 nodes online within 15 s.
    args = [
        "up",
        "--sim",
        "40",
        "--mqtt-url",
        broker.url,
        "--api-port",
        str(api_port),
        "--telemetry-interval",
        "0.5",
    ]
    async with GreenfedProcess(args, tmp_path, env) as up:
        await eventually_async(
            lambda: _all_online(api, 40, data_dir),
            timeout_s=15,
            message=lambda: up.stderr[-2000:],
        )
        token = _admin_token(data_dir)
        assert token is not None
        assert f"admin token: in {data_dir / 'admin-token'}" in up.stdout
        assert token not in up.stdout + up.stderr  # where it is, never the token itself
        body = await get_json(f"{api}/v1/nodes", token)
        assert isinstance(body, dict)
        nodes = body["items"]
        assert Counter(n["site"] for n in nodes).keys() == {"cloud", "edge"}
        kinds = {a["kind"] for n in nodes for a in n["accelerators"]}
        assert kinds == {"gpu", "npu", "cpu"}
        assert {n["zone"] for n in nodes} == {"CA-ON", "US-CAL-CISO", "DE", "ZA"}
        # Live telemetry validates against the schema the API publishes.
        catalog = await get_json(f"{api}/v1/schemas")  # public
        assert isinstance(catalog, dict)
        validator = jsonschema.Draft202012Validator(catalog["telemetry"]["schema"])
        payloads = await _subscribe_telemetry(broker.url, topic_root, count=10)
        assert len(payloads) == 10
        for payload in payloads:
            validator.validate(payload)
        # The fleet table and its JSON form, from a second process (the admin token found
        # in the same data directory).
        code, table, stderr = await run_greenfed(["nodes", "--api", api], env=env)
        assert code == 0, stderr
        assert "40/40 online" in table
        code, listing, _ = await run_greenfed(
            ["nodes", "--api", api, "--json", "--kind", "npu"], env=env
        )
        assert code == 0
        assert {n["node_id"] for n in json.loads(listing)["items"]} == {
            n["node_id"] for n in nodes if any(a["kind"] == "npu" for a in n["accelerators"])
        }
        code, elapsed_s = await up.stop(signal.SIGTERM)
        assert code == 0, up.stderr
        assert elapsed_s < 5.0
        assert "Traceback" not in up.stderr
        assert "fleet: 40/40 online" in up.stdout
        assert f"{api}/v1/nodes" in up.stdout
    if broker.kind == "mosquitto":
        statuses = await _retained_statuses(broker.url, topic_root, 40)
        assert {(s["state"], s["offline_reason"]) for s in statuses} == {("offline", "shutdown")}


async def test_after_sigkill_every_retained_status_turns_offline(
    mosquitto_root: tuple[str, str], tmp_path: Path
) -> None:
    mqtt_url, topic_root = mosquitto_root
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    data_dir = tmp_path / "data"
    env = greenfed_env(GREENFED_MQTT__TOPIC_ROOT=topic_root, GREENFED_STORE__DATA_DIR=str(data_dir))
    args = ["up", "--sim", "10", "--mqtt-url", mqtt_url, "--api-port", str(api_port)]
    async with GreenfedProcess(args, tmp_path, env) as up:
        await eventually_async(
            lambda: _all_online(api, 10, data_dir),
            timeout_s=30,
            message=lambda: up.stderr[-2000:],
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
    data_dir = tmp_path / "data"
    async with GreenfedProcess(
        args, tmp_path, greenfed_env(GREENFED_STORE__DATA_DIR=str(data_dir))
    ) as up:
        await eventually_async(
            lambda: _all_online(api, 6, data_dir),
            timeout_s=30,
            message=lambda: up.stderr[-2000:],
        )
        assert f"embedded MQTT broker mqtt://127.0.0.1:{broker_port}" in up.stdout
        # The embedded broker requires a login: the banner says how to get a read-only
        # one, and never shows the control plane's own.
        with pytest.raises(MqttConnectError):
            async with aiomqtt.Client("127.0.0.1", broker_port):
                pass
        assert "greenfed mqtt accounts create dashboard" in up.stdout
        client_id = "greenfed-reader-dashboard@greenfed"
        assert f"-u dashboard -P PASSWORD -i {client_id} -t" in up.stdout
        assert "-u greenfed-cloud" not in up.stdout
        code, out, err = await run_greenfed(
            ["mqtt", "accounts", "create", "dashboard", "--api", api, "--token-file",
             str(data_dir / "admin-token")],
        )  # fmt: skip
        assert code == 0, err
        username, password = "dashboard", out.splitlines()[1].strip()
        async with (
            aiomqtt.Client(
                "127.0.0.1",
                broker_port,
                username=username,
                password=password,
                identifier=client_id,
            ) as subscriber,
            asyncio.timeout(10),
        ):
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


async def _ready_endpoints(api: str, token: str, deployment_id: str) -> list[str] | None:
    """The endpoints of the deployment once every replica is ready, else None."""
    try:
        body = await get_json(f"{api}/v1/deployments/{deployment_id}", token)
    except OSError:
        return None
    assert isinstance(body, dict)
    replicas = body["replica_states"]
    if not replicas or any(r["state"] != "ready" or not r["endpoint"] for r in replicas):
        return None
    return [r["endpoint"] for r in replicas]


@pytest.mark.timeout(120)
async def test_a_person_follows_the_banner_of_up_on_another_api_port(tmp_path: Path) -> None:
    """`--api-port` moves the API: the banner's `export GREENFED_API=...` line is all the
    other commands need, and `greenfed deployment ID` shows each endpoint whole."""
    broker_port, api_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    data_dir = tmp_path / "data"
    args = ["up", "--sim", "4", "--broker-port", str(broker_port), "--api-port", str(api_port)]
    env = greenfed_env(GREENFED_STORE__DATA_DIR=str(data_dir))
    async with GreenfedProcess(args, tmp_path, env) as up:
        await eventually_async(
            lambda: _all_online(api, 4, data_dir), timeout_s=30, message=lambda: up.stderr[-2000:]
        )
        assert f"  cli        export GREENFED_API={api}   " in up.stdout
        # Pasted into another terminal: no --api anywhere from here on.
        cli_env = {**env, "GREENFED_API": api}
        code, table, stderr = await run_greenfed(["nodes"], env=cli_env)
        assert (code, stderr) == (0, "")
        assert "4/4 online" in table

        model_file = tmp_path / "detector.onnx"
        model_file.write_bytes(mlp())
        code, out, stderr = await run_greenfed(
            ["models", "upload", str(model_file), "--json"], cli_env
        )
        assert code == 0, stderr
        model_id = json.loads(out)["id"]
        serve = tmp_path / "serve.yaml"
        serve.write_text(f"kind: deployment\nname: detector\nmodel_id: {model_id}\n")
        code, out, stderr = await run_greenfed(["submit", str(serve), "--json"], cli_env)
        assert code == 0, stderr
        deployment_id = json.loads(out)["id"]
        token = _admin_token(data_dir)
        assert token is not None
        endpoints: list[str] = []

        async def ready() -> bool:
            found = await _ready_endpoints(api, token, deployment_id)
            endpoints[:] = found or []
            return found is not None

        await eventually_async(ready, timeout_s=30, message=lambda: up.stderr[-2000:])
        for columns in (80, 160):
            code, shown, stderr = await run_greenfed(
                ["deployment", deployment_id], env={**cli_env, "COLUMNS": str(columns)}
            )
            assert code == 0, stderr
            lines = shown.splitlines()
            for endpoint in endpoints:
                # Whole, on a line of its own: copied with a triple click.
                assert [line.split()[-1] for line in lines if endpoint in line] == [endpoint]
            assert all(len(line) <= columns for line in lines if "/v1/infer/" not in line)
        code, _ = await up.stop(signal.SIGINT)
        assert code == 0, up.stderr


@pytest.mark.timeout(120)
async def test_a_second_up_on_a_busy_port_or_data_directory_fails_in_one_line(
    tmp_path: Path,
) -> None:
    broker_port, api_port = free_port(), free_port()
    data_dir = tmp_path / "data"
    args = ["up", "--sim", "2", "--broker-port", str(broker_port), "--api-port", str(api_port)]
    env = greenfed_env(GREENFED_STORE__DATA_DIR=str(data_dir))
    async with GreenfedProcess(args, tmp_path, env) as up:
        await eventually_async(
            lambda: _all_online(f"http://127.0.0.1:{api_port}", 2, data_dir),
            timeout_s=30,
            message=lambda: up.stderr[-2000:],
        )
        elsewhere = greenfed_env(GREENFED_STORE__DATA_DIR=str(tmp_path / "elsewhere"))
        same_dir, same_dir_cloud, same_port = await asyncio.gather(
            run_greenfed(["up", "--sim", "2", "--api-port", str(free_port())], env=env),
            run_greenfed(["cloud", "--api-port", str(free_port())], env=env),
            run_greenfed(["up", "--sim", "2", "--api-port", str(api_port)], env=elsewhere),
        )
        for code, stdout, stderr in (same_dir, same_dir_cloud, same_port):
            assert code == 1
            assert stdout == ""  # no banner, no log lines
            assert stderr.startswith("greenfed: ")
            assert stderr.count("\n") == 1, stderr
        assert f"the data directory {data_dir} is in use" in same_dir[2]
        assert "greenfed up" in same_dir[2]  # who holds it
        assert f"the data directory {data_dir} is in use" in same_dir_cloud[2]
        assert (
            f"cannot serve the REST API on 127.0.0.1:{api_port}: the port is in use"
            in (same_port[2])
        )
        assert not (tmp_path / "elsewhere" / "admin-token").exists()  # refused before anything
        # The first one is unharmed, and its lock goes with it.
        code, _ = await up.stop(signal.SIGTERM)
        assert code == 0, up.stderr
    with data_dir_lock(data_dir, "test"):
        pass


@pytest.mark.timeout(60)
async def test_up_with_no_simulated_nodes_serves_until_stopped(tmp_path: Path) -> None:
    """`--sim 0`: the broker and the control plane alone, for real nodes to enrol with,
    until Ctrl-C."""
    broker_port, api_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    data_dir = tmp_path / "data"
    args = ["up", "--sim", "0", "--broker-port", str(broker_port), "--api-port", str(api_port)]
    env = greenfed_env(GREENFED_STORE__DATA_DIR=str(data_dir))
    async with GreenfedProcess(args, tmp_path, env) as up:
        assert up.process is not None

        async def ready() -> bool:
            assert up.process is not None
            assert up.process.returncode is None, up.stdout + up.stderr
            try:
                await get_json(f"{api}/readyz")
            except (OSError, aiohttp.ClientError):  # not up yet, or not subscribed yet (503)
                return False
            return True

        await eventually_async(ready, timeout_s=30, message=lambda: up.stderr[-2000:])
        assert "greenfed up: 0 simulated nodes" in up.stdout
        token = _admin_token(data_dir)
        assert token is not None
        nodes = await get_json(f"{api}/v1/nodes", token)
        assert isinstance(nodes, dict)
        assert nodes["total"] == 0
        assert up.process.returncode is None, up.stdout + up.stderr
        code, _ = await up.stop(signal.SIGINT)
        assert code == 0, up.stderr
        assert "greenfed stopped" in up.stdout
