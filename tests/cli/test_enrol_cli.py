"""`greenfed edge enrol` (and `greenfed nodes join-token create`) against a running
control plane over real HTTP and HTTPS: a 0600 settings file the agent loads,
idempotent re-runs, TLS verified against --ca."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestServer

from cloud.app import create_app
from cloud.fleet.enrolment_views import sealing_key_fingerprint
from edge.agent.birth import ExecutionFacts
from edge.main import with_enrolment_proof
from edge.sealing_key import load_or_create_sealing_key
from greenfed.cli import main
from shared import secret_hashes
from shared.enrolment_certificate import certificate_head
from shared.sealing import public_key_text
from shared.settings import CloudSettings, SchedulingSettings, Settings, load_settings
from shared.token_files import admin_token_path, read_token_file
from tests.store.databases import sqlite_database
from tests.support.brokers import free_port, make_tls_files
from tests.support.fleet import mqtt_settings


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture(autouse=True)
def agent_data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where an agent without `agent.data_dir` keeps its state (the node's sealing key
    among it): in the test's directory, never the home of whoever runs the tests."""
    home = tmp_path / "xdg-data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home


@contextlib.asynccontextmanager
async def control_plane(tmp_path: Path, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """The real app on a free port (https with `tls`); yields its URL. No broker is
    needed for enrolment (the MQTT session retries in the background)."""
    database = sqlite_database(tmp_path)
    port = free_port()
    scheme = "https" if tls else "http"
    settings = Settings(
        mqtt=mqtt_settings(f"mqtt://cloud:secret@127.0.0.1:{free_port()}", "enrolcli"),
        cloud=CloudSettings(public_url=f"{scheme}://127.0.0.1:{port}"),
        store=database.settings,
        scheduling=SchedulingSettings(enabled=False),
    )
    server = TestServer(create_app(settings), host="127.0.0.1", port=port)
    await server.start_server(ssl=tls)
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        await server.close()


def admin_token(tmp_path: Path) -> str:
    token = read_token_file(admin_token_path(sqlite_database(tmp_path).settings))
    assert token is not None
    return token


async def greenfed(*argv: str) -> int:
    """The real command line, in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(main, list(argv))


async def join_token(api: str, admin: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = await greenfed(
        "nodes", "join-token", "create", "--api", api, "--token", admin, "--json", *extra
    )
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()  # the app logs to the same stdout: take the JSON document
    document = lines[lines.index("{") : lines.index("}") + 1]
    created: dict[str, Any] = msgspec.json.decode("\n".join(document))
    return str(created["token"])


async def test_enrol_writes_a_private_settings_file_the_agent_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "etc" / "agent.toml"
    config.parent.mkdir()
    # Keys enrolment does not set stay as they were.
    config.write_text('[log]\nformat = "json"\n\n[agent]\ntelemetry_interval_s = 2.5\n')
    async with control_plane(tmp_path) as api:
        token = await join_token(
            api, admin_token(tmp_path), capsys, "--zone", "DE", "--labels", "rack=r1,row=2"
        )
        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(config),
            "--node-id", "orin-1",
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0, out
        assert "enrolled node orin-1" in out
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        settings = load_settings(config, environ={})
        assert settings.agent.node_id == "orin-1"
        assert settings.agent.zone == "DE"
        assert settings.agent.labels == {"rack": "r1", "row": "2"}
        assert len(settings.agent.control_plane_public_key) == 44  # base64 of 32 bytes
        assert settings.mqtt.url.startswith("mqtt://127.0.0.1:")
        assert "secret" not in settings.mqtt.url  # the cloud's own credentials stay home
        assert settings.mqtt.topic_root == "enrolcli"
        assert settings.mqtt.username == "orin-1"
        assert settings.agent.telemetry_interval_s == 2.5
        assert settings.log.format == "json"

        # A re-run (an install script run twice) changes nothing, not even the mtime.
        before = (config.read_bytes(), config.stat().st_mtime_ns)
        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(config)
        )
        assert code == 0
        assert "nothing changed" in capsys.readouterr().out
        assert (config.read_bytes(), config.stat().st_mtime_ns) == before


async def test_a_spent_token_fails_clearly_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with control_plane(tmp_path) as api:
        token = await join_token(api, admin_token(tmp_path), capsys)
        first = tmp_path / "first.toml"
        assert await greenfed("edge", "enrol", "--api", api, "--token", token,
                              "--config", str(first), "--node-id", "a") == 0  # fmt: skip
        capsys.readouterr()
        second = tmp_path / "second.toml"
        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(second),
            "--node-id", "b",
        )  # fmt: skip
        assert code != 0
        assert "join token" in capsys.readouterr().err.lower()
        assert not second.exists()


async def test_https_is_verified_against_the_ca_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    right = make_tls_files(_directory(tmp_path / "right-ca"))
    wrong = make_tls_files(_directory(tmp_path / "wrong-ca"))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(right.server_cert, right.server_key)
    config = tmp_path / "agent.toml"
    async with control_plane(tmp_path) as plain:  # the same store, served over http first
        token = await join_token(plain, admin_token(tmp_path), capsys)
    async with control_plane(tmp_path, tls) as api:
        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(config),
            "--ca", str(wrong.ca_cert),
        )  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1
        assert "TLS: the certificate of the API" in err
        assert "certificate verify failed" in err
        assert not config.exists()

        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(config),
            "--node-id", "tls-1", "--ca", str(right.ca_cert),
        )  # fmt: skip
        assert code == 0, capsys.readouterr().err
        assert load_settings(config, environ={}).agent.node_id == "tls-1"


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


async def enrolled_fingerprints(api: str, admin: str) -> dict[str, str | None]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{api}/v1/nodes/enrolled", headers={"Authorization": f"Bearer {admin}"}) as reply,
    ):
        assert reply.status == 200
        body = await reply.json()
    return {item["node_id"]: item["sealing_key_fingerprint"] for item in body["items"]}


async def test_enrol_sends_the_sealing_key_the_agent_will_use(
    tmp_path: Path, agent_data_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # With the file's agent.data_dir, the key goes there; without, to the default.
    configured = tmp_path / "configured.toml"
    configured.write_text(f'[agent]\ndata_dir = "{tmp_path / "agent-data"}"\n')
    plain = tmp_path / "plain.toml"
    async with control_plane(tmp_path) as api:
        admin = admin_token(tmp_path)
        token = await join_token(api, admin, capsys, "--uses", "3")
        for config, node_id in ((configured, "orin-1"), (plain, "orin-2")):
            code = await greenfed(
                "edge", "enrol", "--api", api, "--token", token, "--config", str(config),
                "--node-id", node_id,
            )  # fmt: skip
            out = capsys.readouterr().out
            assert code == 0, out
            assert "sealing key sha256:" in out
        fingerprints = await enrolled_fingerprints(api, admin)
        # An enrolment older than certificates has none: enrolling again gets one.
        certificate_file = tmp_path / "agent-data" / "state" / "enrolment.cert"
        certificate_file.unlink()
        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(configured)
        )  # fmt: skip
        assert code == 0
        assert "enrolled node orin-1" in capsys.readouterr().out
    for data_dir, node_id in (
        (tmp_path / "agent-data", "orin-1"),
        (agent_data_home / "greenfed" / "agent", "orin-2"),
    ):
        key_file = data_dir / "state" / "sealing.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        public_key = public_key_text(load_or_create_sealing_key(key_file))
        assert fingerprints[node_id] == sealing_key_fingerprint(public_key)
        # The certificate is kept beside the key it names, and the agent shows it.
        head = certificate_head((data_dir / "state" / "enrolment.cert").read_text().strip())
        assert (head.node_id, head.sealing_public_key) == (node_id, public_key)
    facts = with_enrolment_proof(load_settings(configured, environ={}).agent, ExecutionFacts())
    assert facts.enrolment is not None
    assert (
        facts.sealing_public_key == certificate_head(facts.enrolment.certificate).sealing_public_key
    )
    assert load_settings(configured, environ={}).agent.data_dir == str(tmp_path / "agent-data")


async def test_enrol_keeps_the_agents_own_placement_unless_the_token_sets_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent's site, zone, region and labels already in its settings file are sent
    and kept; what the token fixes (here the region and one label) wins; the token's
    limits (--work, --max-accelerators, --model, --max-memory) become the node's."""
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nsite = "cloud"\nzone = "FR"\nregion = "europe-west9"\n'
        'labels = {rack = "r7", pool = "batch"}\n'
    )
    async with control_plane(tmp_path) as api:
        admin = admin_token(tmp_path)
        token = await join_token(
            api, admin, capsys,
            "--region", "europe-west1", "--labels", "pool=training",
            "--work", "training", "--max-accelerators", "gpu=8,cpu=2",
            "--model", "NVIDIA H100 80GB HBM3", "--max-memory", "80GiB",
        )  # fmt: skip
        code = await greenfed(
            "edge", "enrol", "--api", api, "--token", token, "--config", str(config),
            "--node-id", "h100-1",
        )  # fmt: skip
        assert code == 0, capsys.readouterr().out
        capsys.readouterr()
        agent = load_settings(config, environ={}).agent
        assert (agent.site, agent.zone, agent.region) == ("cloud", "FR", "europe-west1")
        assert agent.labels == {"rack": "r7", "pool": "training"}
        code = await greenfed("nodes", "enrolled", "--api", api, "--token", admin, "--json")
        out = capsys.readouterr().out
        assert code == 0, out
        lines = out.splitlines()
        listed = msgspec.json.decode("\n".join(lines[lines.index("{") : lines.index("}") + 1]))
        (node,) = listed["items"]
        assert node["envelope"] == {
            "site": "cloud",
            "zone": "FR",
            "region": "europe-west1",
            "work": "training",
            "max_accelerators": {"gpu": 8, "cpu": 2},
            "accelerator_models": ["NVIDIA H100 80GB HBM3"],
            "max_accelerator_memory_bytes": 80 * 1024**3,
            # The token's labels, which the node is held to ("rack" is its own).
            "labels": {"pool": "training"},
        }


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-accelerators", "tpu=4", "KIND=N"),
        ("--max-memory", "lots", "not a size"),
        ("--work", "mining", "invalid choice"),
    ],
)
async def test_bad_token_limits_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        await greenfed(
            "nodes", "join-token", "create", "--api", "http://127.0.0.1:9", "--token", "t",
            flag, value,
        )  # fmt: skip
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
