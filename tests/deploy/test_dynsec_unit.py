"""greenfed-mosquitto-dynsec.service does what docs/deploy.md says, against a real
Mosquitto with its dynamic security plugin: its command, run as systemd runs it (the
unit's environment, its credentials in a directory of their own for `%d`), gives the
control plane an account that provisions nodes; a second run, or a refused admin
password, fails instead of being recorded as done (mosquitto_ctrl itself exits 0)."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import pytest

from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts
from shared.settings import MqttSettings
from tests.support.brokers import DYNSEC_BOOTSTRAP, DynamicSecurity, MosquittoProcess

pytestmark = pytest.mark.timeout(60)

UNIT = Path(__file__).resolve().parents[2] / "deploy/mosquitto/greenfed-mosquitto-dynsec.service"
CLOUD_PASSWORD = "a-cloud-password"


def unit_settings() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The unit's ExecStart (split), Environment and LoadCredential (name -> source)."""
    command: list[str] = []
    environment: dict[str, str] = {}
    credentials: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            command = shlex.split(value)
        elif key == "Environment":
            name, _, text = value.partition("=")
            environment[name] = text
        elif key == "LoadCredential":
            name, _, source = value.partition(":")
            credentials[name] = source
    return command, environment, credentials


async def run_as_systemd(credentials_dir: Path) -> tuple[int, str]:
    command, environment, _ = unit_settings()
    # Here the script is the checkout's, where the unit runs the installed copy.
    argv = [str(DYNSEC_BOOTSTRAP), *(a.replace("%d", str(credentials_dir)) for a in command[1:])]
    env = {k: v.replace("%d", str(credentials_dir)) for k, v in environment.items()}
    process = await asyncio.create_subprocess_exec(
        "sh",
        *argv,
        env={"PATH": os.environ["PATH"], **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output.decode()


def credentials(directory: Path, port: int, admin_password: str) -> Path:
    """What systemd copies from /etc/greenfed for `LoadCredential=`."""
    _, _, wanted = unit_settings()
    assert set(wanted) == {"mosquitto_ctrl", "cloud-mqtt-password"}
    directory.mkdir()
    (directory / "mosquitto_ctrl").write_text(
        f"-h 127.0.0.1\n-p {port}\n-u admin\n-P {admin_password}\n"
    )
    (directory / "cloud-mqtt-password").write_text(CLOUD_PASSWORD)
    return directory


async def test_the_unit_gives_the_control_plane_its_account_once(tmp_path: Path) -> None:
    admin = DynamicSecurity()
    broker = MosquittoProcess(tmp_path, dynamic_security=admin)
    await broker.start()
    try:
        directory = credentials(tmp_path / "credentials", broker.port, admin.admin_password)
        code, output = await run_as_systemd(directory)
        assert code == 0, output
        _, environment, _ = unit_settings()
        cloud = MqttSettings(
            url=broker.url,
            username=environment["GREENFED_CLOUD_USER"],
            password=CLOUD_PASSWORD,
            topic_root=environment["GREENFED_TOPIC_ROOT"],
        )
        accounts = DynamicSecurityAccounts(cloud, timeout_s=10)
        try:
            node = await accounts.provision("node-1")
            assert node.username == "node-1"
        finally:
            await accounts.close()
        # Run again (no mark, as if its state were lost): the broker refuses to create the
        # role twice, and the script says so with its exit code.
        code, output = await run_as_systemd(directory)
        assert code != 0, output
        assert "Error" in output
    finally:
        await broker.stop()


async def test_a_refused_admin_password_fails_the_unit(tmp_path: Path) -> None:
    broker = MosquittoProcess(tmp_path, dynamic_security=DynamicSecurity())
    await broker.start()
    try:
        directory = credentials(tmp_path / "credentials", broker.port, "not-the-password")
        code, output = await run_as_systemd(directory)
        assert code != 0, output
    finally:
        await broker.stop()
