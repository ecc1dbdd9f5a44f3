"""The command line as a user runs it: separate processes, real exit codes and output."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared import __version__
from tests.support.brokers import BrokerUnderTest
from tests.support.fleet import mqtt_settings, running_ingestion
from tests.support.processes import GreenfedProcess, greenfed_env, run_greenfed
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_discover_works_on_a_machine_without_a_gpu() -> None:
    code, stdout, stderr = await run_greenfed(["edge", "discover", "--json"])
    assert code == 0, stderr
    report = json.loads(stdout)
    kinds = [accelerator["kind"] for accelerator in report["accelerators"]]
    assert kinds.count("cpu") == 1
    cpu = next(a for a in report["accelerators"] if a["kind"] == "cpu")
    assert cpu["compute_units"] >= 1
    assert cpu["memory_bytes"] > 0
    assert report["host"]["cpu_logical_cores"] >= 1
    # No NVIDIA driver here: an empty GPU list, not a failed probe and not a traceback.
    if shutil.which("nvidia-smi") is None:
        assert "gpu" not in kinds
        assert report["failed_probes"] == []
    assert "Traceback" not in stderr
    code, table, _ = await run_greenfed(["edge", "discover"])
    assert code == 0
    assert "cpu0" in table


@pytest.mark.parametrize("command", [["edge", "run"], ["cloud"], ["up"]])
async def test_a_config_with_an_unknown_key_fails_naming_the_key(
    tmp_path: Path, command: list[str]
) -> None:
    config = tmp_path / "greenfed.toml"
    config.write_text('[agent]\nsite = "edge"\ntelemetry_intervall_s = 2\n')
    code, _, stderr = await run_greenfed([*command, "--config", str(config)])
    assert code == 2
    assert "agent.telemetry_intervall_s" in stderr
    assert str(config) in stderr
    assert "Traceback" not in stderr


async def test_an_unknown_environment_override_fails_naming_the_variable() -> None:
    env = greenfed_env(GREENFED_MQTT__HOSTNAME="broker.example")
    code, _, stderr = await run_greenfed(["edge", "run"], env=env)
    assert code == 2
    assert "GREENFED_MQTT__HOSTNAME" in stderr
    assert "mqtt.hostname" in stderr


async def test_schema_prints_every_payload_schema() -> None:
    code, stdout, _ = await run_greenfed(["schema"])
    assert code == 0
    catalog = json.loads(stdout)
    assert set(catalog) == {"status", "telemetry", "desired", "reported", "events", "logs"}
    assert catalog["desired"]["topic"] == "greenfed/v1/nodes/{node_id}/desired"


async def test_nodes_without_a_control_plane_says_so_without_a_traceback() -> None:
    from tests.support.brokers import free_port

    code, _, stderr = await run_greenfed(["nodes", "--api", f"http://127.0.0.1:{free_port()}"])
    assert code == 1
    assert "cannot reach the greenfed API" in stderr
    assert "Traceback" not in stderr


async def test_an_unreachable_api_says_where_its_url_came_from() -> None:
    from greenfed.api_client import DEFAULT_API
    from greenfed.ports import port_is_free
    from tests.support.brokers import free_port

    given, from_env = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    runs = [
        run_greenfed(["jobs", "--api", given]),
        run_greenfed(["jobs"], env=greenfed_env(GREENFED_API=from_env)),
    ]
    default_free = port_is_free("127.0.0.1", 8700)  # a real control plane on this machine?
    if default_free:
        runs.append(run_greenfed(["jobs"]))
    results = await asyncio.gather(*runs)
    for code, _, stderr in results:
        assert code == 1
        assert stderr.count("\n") == 1, stderr
        assert "Traceback" not in stderr
    assert (
        f"cannot reach the greenfed API at {given} (from --api): connection refused"
        in (results[0][2])
    )
    assert f"at {from_env} (from GREENFED_API): connection refused" in results[1][2]
    if default_free:
        stderr = results[2][2]
        assert f"at {DEFAULT_API} (the default): connection refused" in stderr
        assert "set GREENFED_API" in stderr


def _checkout_head() -> str:
    found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    return found.stdout.strip()


@pytest.mark.parametrize("flag", [["--version"], ["version"]])
async def test_the_version_is_printed(flag: list[str]) -> None:
    code, stdout, stderr = await run_greenfed(flag)
    assert (code, stderr) == (0, "")
    # The package's version, and the commit of the checkout it runs from (this one).
    shown = rf"greenfed {re.escape(__version__)} \(commit ([0-9a-f]{{12}})(\+dirty)?\)\n"
    match = re.fullmatch(shown, stdout)
    assert match is not None, stdout
    head = _checkout_head()
    assert head.startswith(match.group(1))


@pytest.mark.parametrize(
    "command",
    [["schema"], ["edge", "discover", "--json"], ["edge", "discover"]],
    ids=["schema", "json", "table"],
)
async def test_a_reader_that_left_ends_the_command_quietly(command: list[str]) -> None:
    """`greenfed ... | head -1`: head exits after one line. Here the reading end is closed
    before greenfed writes at all, so every write meets the broken pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "greenfed.cli",
            *command,
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
            env=greenfed_env(),
        )
    finally:
        os.close(write_end)
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert stderr.decode() == ""  # no "Broken pipe", no "Exception ignored", no traceback
    assert process.returncode == 1


async def test_the_agent_runs_from_a_config_file_and_stops_cleanly(
    broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[mqtt]\nurl = "{broker.url}"\ntopic_root = "{topic_root}"\n'
        '[agent]\nnode_id = "edge-box-7"\nsite = "edge"\nzone = "DE"\nregion = "europe-west3"\n'
        'labels = { line = "3" }\ntelemetry_interval_s = 0.2\n'
    )
    async with (
        running_ingestion(mqtt_settings(broker.url, topic_root)) as cloud,
        GreenfedProcess(["edge", "run", "--config", str(config)], tmp_path) as agent,
    ):
        await eventually(
            lambda: (r := cloud.registry.get("edge-box-7")) is not None and r.telemetry is not None,
            timeout_s=30,
            message=lambda: agent.stderr[-2000:],
        )
        record = cloud.registry.get("edge-box-7")
        assert record is not None
        assert (record.status.zone, record.status.labels) == ("DE", {"line": "3"})
        assert any(a.kind == "cpu" for a in record.status.accelerators)
        code, elapsed_s = await agent.stop(signal.SIGTERM)
        assert code == 0, agent.stderr
        assert elapsed_s < 5
        assert "Traceback" not in agent.stderr
        await eventually(lambda: cloud.registry.get("edge-box-7").state == "offline")  # type: ignore[union-attr]
        assert cloud.registry.get("edge-box-7").offline_reason == "shutdown"  # type: ignore[union-attr]
