"""docs/deploy.md's TLS walk-through for the broker, run as written: its openssl
commands make a CA, the broker's certificate and a node's client certificate; a private
Mosquitto with that listener and `require_certificate true` then takes greenfed's own
MQTT client with the CA and the client certificate (its `[mqtt] tls_*` settings),
refuses it without the certificate, and the client refuses the broker by a name the
certificate does not hold."""

from __future__ import annotations

import asyncio
import getpass
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from shared.mqtt import MqttSession
from shared.settings import load_settings
from tests.deploy.deploy_files import REPO
from tests.support.brokers import free_port, mosquitto_binary, require_or_skip, tcp_reachable
from tests.support.system_tools import require_tool

GUIDE = REPO / "docs" / "deploy.md"
NODE_ID = "orin-nano-toronto-1"


def broker_blocks() -> list[str]:
    """The shell blocks of the guide's "### The broker" section, in order."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("### The broker", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture
def made(tmp_path: Path) -> Path:
    """The guide's certificates, made by its own commands for the name `localhost`."""
    require_tool("openssl", "openssl")
    server, client = broker_blocks()
    first, _, rest = server.partition("\n")
    assert first == "BROKER_HOST=broker.example.com"
    outputs = []
    for block in ("BROKER_HOST=localhost\n" + rest, client):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        outputs.append(done.stdout)
    # The guide's last command: openssl verifies the broker's certificate.
    assert "certs/server.crt: OK" in outputs[0]
    assert (tmp_path / f"{NODE_ID}.crt").exists()
    return tmp_path


@pytest.fixture
async def broker(made: Path) -> AsyncIterator[int]:
    binary = mosquitto_binary()
    if binary is None:
        require_or_skip("the mosquitto binary is not installed")
    assert binary is not None
    port = free_port()
    config = made / "mosquitto.conf"
    config.write_text(
        "\n".join(
            [
                # As ourselves: as root it would read the key as its own user (the guide
                # says to give it the key; the test's directory is private).
                f"user {getpass.getuser()}",
                "per_listener_settings false",
                f"listener {port} 127.0.0.1",
                f"cafile {made / 'certs' / 'ca.crt'}",
                f"certfile {made / 'certs' / 'server.crt'}",
                f"keyfile {made / 'certs' / 'server.key'}",
                "require_certificate true",
                "allow_anonymous true",
                f"log_dest file {made / 'mosquitto.log'}",
            ]
        )
        + "\n"
    )
    process = await asyncio.to_thread(subprocess.Popen, [binary, "-c", str(config)])
    try:
        for _ in range(250):
            if tcp_reachable(f"mqtts://127.0.0.1:{port}", timeout_s=0.2):
                break
            assert process.poll() is None, (made / "mosquitto.log").read_text()
            await asyncio.sleep(0.02)
        yield port
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 10)


async def connect(environment: dict[str, str], timeout_s: float = 5.0) -> None:
    limit = {"GREENFED_MQTT__CONNECT_TIMEOUT_S": str(timeout_s)}
    settings = load_settings(None, environ={**limit, **environment})
    client = MqttSession(settings.mqtt, client_id="tls-guide").new_client()
    async with asyncio.timeout(10), client:
        pass


async def test_the_guides_certificates_secure_the_broker(made: Path, broker: int) -> None:
    trusted = {
        "GREENFED_MQTT__URL": f"mqtts://localhost:{broker}",
        "GREENFED_MQTT__TLS_CA_FILE": str(made / "certs" / "ca.crt"),
    }
    with_certificate = {
        **trusted,
        "GREENFED_MQTT__TLS_CERT_FILE": str(made / f"{NODE_ID}.crt"),
        "GREENFED_MQTT__TLS_KEY_FILE": str(made / f"{NODE_ID}.key"),
    }
    await connect(with_certificate)
    # No client certificate: the broker ends the handshake.
    with pytest.raises((aiomqtt.MqttError, TimeoutError)):
        await connect(trusted, timeout_s=1.0)
    # A name the broker's certificate does not hold: the client refuses the broker.
    by_address = {**with_certificate, "GREENFED_MQTT__URL": f"mqtts://127.0.0.1:{broker}"}
    with pytest.raises(aiomqtt.MqttError, match="certificate"):
        await connect(by_address)
