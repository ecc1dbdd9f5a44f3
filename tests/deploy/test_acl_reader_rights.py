"""deploy/mosquitto/mosquitto.conf as shipped (accounts made by hand, `broker_accounts =
"none"`), run on a real Mosquitto with only its paths and ports made the test's: a
third-party reader reads every node's status and telemetry and nothing else, whatever
its name. Mosquitto applies an ACL file's `pattern` lines to every account, so a reader
that logged in where greenfed.acl applies could act as the node named after it: publish
a birth and telemetry (the control plane then lists and schedules it) and read that
node's desired documents. Readers have a listener, password file and ACL file of their
own (greenfed-readers.acl), with no node rights."""

from __future__ import annotations

import asyncio
import getpass
import re
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttConnectError

from shared.mqtt import is_auth_failure
from tests.deploy.deploy_files import DEPLOY
from tests.support.brokers import (
    free_port,
    make_password_file,
    make_tls_files,
    mosquitto_binary,
    require_or_skip,
    tcp_reachable,
)

pytestmark = pytest.mark.timeout(60)

SHIPPED = DEPLOY / "mosquitto"
NODES = "greenfed/v1/nodes"
DIGEST = "greenfed/v1/cloud/telemetry-digest"
PASSWORD = "pw"
# The agents' listener's accounts, and the readers': `greenfed-reader` is the reader
# greenfed.acl named before readers had a listener of their own.
AGENTS_ACCOUNTS = ("greenfed-cloud", "orin-1")
READER_ACCOUNTS = ("greenfed-reader", "dashboard")
# The shipped listeners, by port: agents and the control plane, readers, loopback tools.
AGENTS_PORT, READERS_PORT, LOOPBACK_PORT = 8883, 8884, 1883


@dataclass(frozen=True)
class ShippedBroker:
    """The shipped configuration running: its listeners' ports here, and the CA."""

    ports: dict[int, int]
    ca_file: Path

    def client(self, listener: int, username: str) -> aiomqtt.Client:
        tls = None
        if listener != LOOPBACK_PORT:
            tls = aiomqtt.TLSParameters(ca_certs=str(self.ca_file), cert_reqs=ssl.CERT_REQUIRED)
        return aiomqtt.Client(
            "127.0.0.1",
            self.ports[listener],
            username=username,
            password=PASSWORD,
            identifier=f"greenfed-test-{username}",
            tls_params=tls,
            timeout=10,
        )


def _files(workdir: Path) -> dict[str, Path]:
    """The test's own file for each path the shipped configuration names."""
    tls = make_tls_files(workdir)
    agents = make_password_file(
        _directory(workdir / "agents"), AGENTS_ACCOUNTS[0], PASSWORD,
        *((user, PASSWORD) for user in AGENTS_ACCOUNTS[1:]),
    )  # fmt: skip
    readers = make_password_file(
        _directory(workdir / "readers"), READER_ACCOUNTS[0], PASSWORD,
        *((user, PASSWORD) for user in READER_ACCOUNTS[1:]),
    )  # fmt: skip
    return {
        "/etc/mosquitto/certs/ca.crt": tls.ca_cert,
        "/etc/mosquitto/certs/server.crt": tls.server_cert,
        "/etc/mosquitto/certs/server.key": tls.server_key,
        "/etc/mosquitto/greenfed.passwd": agents,
        "/etc/mosquitto/greenfed-readers.passwd": readers,
        "/etc/mosquitto/greenfed.acl": SHIPPED / "greenfed.acl",
        "/etc/mosquitto/greenfed-readers.acl": SHIPPED / "greenfed-readers.acl",
        "/var/lib/mosquitto/": workdir,
    }


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _run_here(config: str, files: dict[str, Path], ports: dict[int, int], log: Path) -> str:
    """The shipped configuration with the test's files, ports and user."""
    lines = [f"user {getpass.getuser()}", f"log_dest file {log}"]
    for line in config.splitlines():
        directive, _, value = line.partition(" ")
        if directive == "listener":
            line = f"listener {ports[int(value.split()[0])]} 127.0.0.1"
        elif value in files:
            line = f"{directive} {files[value]}{'/' if value.endswith('/') else ''}"
        else:
            assert not value.startswith("/"), f"a path the test does not make: {line}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.fixture
async def shipped(tmp_path: Path) -> AsyncIterator[ShippedBroker]:
    binary = mosquitto_binary()
    if binary is None:
        require_or_skip("the mosquitto binary is not installed")
    assert binary is not None
    config = (SHIPPED / "mosquitto.conf").read_text(encoding="utf-8")
    listeners = [int(port) for port in re.findall(r"^listener (\d+)", config, flags=re.M)]
    assert sorted(listeners) == sorted((AGENTS_PORT, READERS_PORT, LOOPBACK_PORT))
    log, files = tmp_path / "mosquitto.log", _files(tmp_path)
    # Three ports probed free, then bound by Mosquitto: another test process may take one
    # in between ("Address already in use"), and then other ports are tried.
    for _ in range(3):
        ports = {port: free_port() for port in listeners}
        path = tmp_path / "mosquitto.conf"
        path.write_text(_run_here(config, files, ports, log))
        log.unlink(missing_ok=True)
        process = await asyncio.to_thread(subprocess.Popen, [binary, "-c", str(path)])
        try:
            if await _listening(process, ports):
                yield ShippedBroker(ports, files["/etc/mosquitto/certs/ca.crt"])
                return
        finally:
            process.terminate()
            await asyncio.to_thread(process.wait, 10)
        assert "Address already in use" in log.read_text(), log.read_text()
    raise AssertionError(f"no free ports for Mosquitto: {log.read_text()}")


async def _listening(process: subprocess.Popen[bytes], ports: dict[int, int]) -> bool:
    """Whether Mosquitto listens on every port (False: it exited)."""
    async with asyncio.timeout(10):
        while not all(tcp_reachable(f"mqtt://127.0.0.1:{port}", 0.2) for port in ports.values()):
            if process.poll() is not None:
                return False
            await asyncio.sleep(0.02)
    return True


async def collect_until(subscriber: aiomqtt.Client, sentinel_topic: str) -> list[str]:
    """Topics received up to and including `sentinel_topic`: a publisher's later message
    shows that everything it published earlier was delivered or dropped."""
    seen: list[str] = []
    async with asyncio.timeout(10):
        async for message in subscriber.messages:
            seen.append(message.topic.value)
            if message.topic.value == sentinel_topic:
                return seen
    return seen


async def check_a_reader_cannot_act_as_a_node(
    cloud: aiomqtt.Client, reader: aiomqtt.Client, agent: aiomqtt.Client, reader_name: str
) -> None:
    """A reader publishes nothing (no birth, telemetry or report as the node named after
    it) and gets no node's desired document, its namesake's included."""
    await cloud.subscribe(f"{NODES}/#", qos=1)
    await reader.subscribe(f"{NODES}/{reader_name}/desired", qos=1)
    await reader.subscribe(f"{NODES}/+/status", qos=1)
    for channel in ("status", "telemetry", "reported", "events", "logs"):
        await reader.publish(f"{NODES}/{reader_name}/{channel}", b"{}", qos=1)
    await agent.publish(f"{NODES}/orin-1/telemetry", b"{}", qos=1)
    assert await collect_until(cloud, f"{NODES}/orin-1/telemetry") == [f"{NODES}/orin-1/telemetry"]
    await cloud.publish(f"{NODES}/{reader_name}/desired", b"{}", qos=1)
    await cloud.publish(f"{NODES}/orin-1/status", b"{}", qos=1)
    assert await collect_until(reader, f"{NODES}/orin-1/status") == [f"{NODES}/orin-1/status"]


@pytest.mark.parametrize("reader_name", READER_ACCOUNTS)
async def test_a_reader_cannot_act_as_the_node_named_after_it(
    shipped: ShippedBroker, reader_name: str
) -> None:
    async with (
        shipped.client(AGENTS_PORT, "greenfed-cloud") as cloud,
        shipped.client(READERS_PORT, reader_name) as reader,
        shipped.client(AGENTS_PORT, "orin-1") as agent,
    ):
        await check_a_reader_cannot_act_as_a_node(cloud, reader, agent, reader_name)


async def test_a_reader_reads_status_and_telemetry_and_nothing_else(
    shipped: ShippedBroker,
) -> None:
    async with (
        shipped.client(AGENTS_PORT, "greenfed-cloud") as cloud,
        shipped.client(READERS_PORT, "dashboard") as reader,
        shipped.client(AGENTS_PORT, "orin-1") as agent,
    ):
        await reader.subscribe("greenfed/v1/#", qos=1)
        await cloud.publish(f"{NODES}/orin-1/desired", b"{}", qos=1)
        await cloud.publish(DIGEST, b"{}", qos=1)
        for channel in ("status", "reported", "events", "logs", "telemetry"):
            await agent.publish(f"{NODES}/orin-1/{channel}", b"{}", qos=1)
        seen = await collect_until(reader, f"{NODES}/orin-1/telemetry")
        assert seen == [f"{NODES}/orin-1/status", f"{NODES}/orin-1/telemetry"]
        # Nor may it publish what the control plane reads: a digest, another node's birth.
        await cloud.subscribe("greenfed/v1/#", qos=1)
        await reader.publish(DIGEST, b"forged", qos=1)
        await reader.publish(f"{NODES}/orin-1/status", b"forged", qos=1)
        await agent.publish(f"{NODES}/orin-1/logs", b"{}", qos=1)
        assert await collect_until(cloud, f"{NODES}/orin-1/logs") == [f"{NODES}/orin-1/logs"]


@pytest.mark.parametrize(
    ("listener", "username"),
    [
        (AGENTS_PORT, "greenfed-reader"),
        (LOOPBACK_PORT, "dashboard"),
        (READERS_PORT, "orin-1"),
        (READERS_PORT, "greenfed-cloud"),
    ],
)
async def test_each_listener_takes_only_its_own_accounts(
    shipped: ShippedBroker, listener: int, username: str
) -> None:
    """A reader's account logs in nowhere greenfed.acl applies; a node's or the control
    plane's logs in nowhere the readers' rights apply."""
    with pytest.raises(MqttConnectError) as refused:
        async with shipped.client(listener, username):
            pass
    assert is_auth_failure(refused.value), refused.value
