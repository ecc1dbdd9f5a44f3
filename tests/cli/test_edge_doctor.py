"""`greenfed edge doctor`: each check against the real thing (the broker, a file
system, an HTTP server's clock) finds what it is for and says the fix."""

from __future__ import annotations

import email.utils
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from aiohttp import web

from edge.doctor import (
    Check,
    check_broker,
    check_clock,
    check_containers,
    check_data_dir,
    check_enrolment,
    check_isolation,
    check_power_limits,
    check_private_files,
    node_isolation,
    print_checks,
    run_checks,
)
from edge.sandbox.cgroup_files import remove_groups
from edge.sandbox.containers import ContainerRuntime
from edge.sandbox.probe import NodeIsolation
from greenfed.cli import main
from shared.settings import AgentSettings, MqttSettings, Settings
from tests.support.brokers import BrokerUnderTest, MosquittoProcess, make_password_file
from tests.support.fleet import TEST_PUBLIC_KEY
from tests.support.sandboxed_node import require_isolation_tools

pytestmark = pytest.mark.timeout(30)


def settings(tmp_path: Path, url: str, **agent: object) -> Settings:
    fields: dict[str, object] = {
        "node_id": "doctor-1",
        "data_dir": str(tmp_path / "data"),
        "control_plane_public_key": TEST_PUBLIC_KEY,
        "probes": ("cpu",),
    }
    return Settings(
        mqtt=MqttSettings(url=url),
        agent=AgentSettings(**(fields | agent)),  # type: ignore[arg-type]
    )


@pytest.fixture
async def api_clock() -> AsyncIterator[tuple[str, list[float]]]:
    """An HTTP server with /healthz whose Date header runs `offset[0]` seconds off."""
    offset = [0.0]

    async def healthz(request: web.Request) -> web.Response:
        date = email.utils.formatdate(time.time() + offset[0], usegmt=True)
        return web.Response(text="ok", headers={"Date": date})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", offset
    await runner.cleanup()


async def test_a_healthy_node_passes_every_check(
    tmp_path: Path, broker: BrokerUnderTest, api_clock: tuple[str, list[float]]
) -> None:
    url, _ = api_clock
    checks = await run_checks(settings(tmp_path, broker.url), url)
    verdicts = {check.name: check.verdict for check in checks}
    assert verdicts == {
        "data-dir": "ok",
        "private-files": "ok",
        "desired-key": "ok",
        "broker": "ok",
        "nvml": "skip",  # the nvidia probe is off
        "power-limits": "skip",  # so no GPUs to cap
        "isolation": "skip",  # an edge node: it runs no training
        "work-dir": "skip",  # nor any training worker's work directory
        "containers": "skip",
        "onnxruntime": "ok",
        "clock": "ok",
    }
    out = io.StringIO()
    assert print_checks(checks, out) == 0
    assert "ok    broker" in out.getvalue()


async def test_each_usual_failure_is_found_with_its_fix(
    tmp_path: Path, api_clock: tuple[str, list[float]]
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    data = check_data_dir(settings(tmp_path, "mqtt://127.0.0.1:1", data_dir=str(blocked)))
    assert (data.verdict, "chown -R greenfed:" in data.fix) == ("FAIL", True)
    for key, words in (("", "no control-plane public key"), ("bm90IGEga2V5", "public key")):
        enrolment = check_enrolment(
            settings(tmp_path, "mqtt://127.0.0.1:1", control_plane_public_key=key)
        )
        assert enrolment.verdict == "FAIL"
        assert words in enrolment.detail
        assert "greenfed edge enrol" in enrolment.fix
    unreachable = await check_broker(settings(tmp_path, "mqtt://127.0.0.1:1"))
    assert unreachable.verdict == "FAIL"
    assert "not reachable" in unreachable.detail
    url, offset = api_clock
    offset[0] = -90.0
    clock = await check_clock(url)
    assert clock.verdict == "FAIL"
    skew_s, _, words = clock.detail.partition(" s ")
    assert words == "off the control plane's clock"
    assert -91 <= int(skew_s) <= -89  # the Date header counts whole seconds
    assert "timedatectl set-ntp true" in clock.fix
    assert (await check_clock(None)).verdict == "skip"


async def test_refused_credentials_are_told_from_an_unreachable_broker(tmp_path: Path) -> None:
    passwords = make_password_file(tmp_path, "node", "right")
    mosquitto = MosquittoProcess(tmp_path, password_file=passwords)
    await mosquitto.start()
    try:
        base = settings(tmp_path, mosquitto.url)
        wrong = msgspec.structs.replace(
            base, mqtt=msgspec.structs.replace(base.mqtt, username="node", password="wrong")
        )
        refused = await check_broker(wrong)
        assert refused.verdict == "FAIL"
        assert "credentials refused" in refused.detail
        right = msgspec.structs.replace(
            base, mqtt=msgspec.structs.replace(base.mqtt, username="node", password="right")
        )
        assert (await check_broker(right)).verdict == "ok"
    finally:
        await mosquitto.stop()


def test_the_command_prints_one_line_per_check_and_fails_on_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[mqtt]\nurl = "mqtt://127.0.0.1:1"\n[agent]\nnode_id = "doctor-2"\n'
        f'data_dir = "{tmp_path / "data"}"\nprobes = ["cpu"]\n'
    )
    config.chmod(0o600)
    assert main(["edge", "doctor", "--config", str(config)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines if not line.startswith(" ")] == [
        ["ok", "data-dir"],
        ["ok", "private-files"],
        ["FAIL", "desired-key"],
        ["FAIL", "broker"],
        ["skip", "nvml"],
        ["skip", "power-limits"],
        ["skip", "isolation"],
        ["skip", "work-dir"],
        ["skip", "containers"],
        ["ok", "onnxruntime"],
        ["skip", "clock"],
    ]
    assert any("fix: enrol the node" in line for line in lines)


def test_warnings_print_their_fix_but_do_not_fail() -> None:
    out = io.StringIO()
    checks = [Check("nvml", "warn", "no NVIDIA driver", "install the NVIDIA driver")]
    assert print_checks(checks, out) == 0
    assert out.getvalue().splitlines()[1].strip() == "fix: install the NVIDIA driver"


def test_power_capping_needs_root_to_hold_gpu_power_limits(tmp_path: Path) -> None:
    cloud = settings(tmp_path, "mqtt://127.0.0.1:1", site="cloud")
    refused = check_power_limits(cloud, gpus=4, euid=1000)
    assert refused.verdict == "warn"
    assert "not root" in refused.detail
    assert "power_capping = false" in refused.fix
    assert check_power_limits(cloud, gpus=4, euid=0).verdict == "ok"
    assert check_power_limits(cloud, gpus=None, euid=1000).verdict == "skip"
    edge = settings(tmp_path, "mqtt://127.0.0.1:1", site="edge")
    assert check_power_limits(edge, gpus=1, euid=1000).verdict == "skip"


def test_isolation_is_said_with_what_it_is_and_the_fix_when_work_would_be_refused(
    tmp_path: Path,
) -> None:
    cloud = settings(tmp_path, "mqtt://127.0.0.1:1", site="cloud")
    refused = check_isolation(
        cloud, NodeIsolation("unavailable", "cannot isolate work: the agent is not root")
    )
    assert refused.verdict == "FAIL"
    assert refused.detail == "training refused: cannot isolate work: the agent is not root"
    assert 'agent.isolation = "none"' in refused.fix
    assert "root" in refused.fix
    unisolated = check_isolation(cloud, NodeIsolation("none", "agent.isolation = none"))
    assert (unisolated.verdict, unisolated.fix) == ("warn", refused.fix)
    no_sandbox = check_isolation(cloud, NodeIsolation("user", "a user of their own"))
    assert (no_sandbox.verdict, no_sandbox.fix) == (
        "warn",
        "apt install bubblewrap, for a sandbox too",
    )
    assert check_isolation(cloud, None).verdict == "skip"


def test_a_container_runtime_is_checked_for_what_this_host_needs(tmp_path: Path) -> None:
    missing = NodeIsolation("sandbox", "", runtime_note="podman is not installed")
    check = check_containers(missing)
    assert check.verdict == "warn"
    assert "work that names an image is not placed here" in check.detail
    assert "podman" in check.fix
    without_init = NodeIsolation(
        "sandbox",
        "",
        runtime=ContainerRuntime(name="podman", binary="/usr/bin/podman", version="4.3.1"),
        runtime_note="podman 4.3.1",
    )
    check = check_containers(without_init)
    assert (check.verdict, check.fix) == ("warn", "apt install catatonit")


def test_a_settings_file_others_can_read_fails_the_private_files_check(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[mqtt]\npassword = "x"\n')
    config.chmod(0o644)
    check = check_private_files(settings(tmp_path, "mqtt://127.0.0.1:1"), config)
    assert check.verdict == "FAIL"
    assert str(config) in check.detail
    assert "chmod 600" in check.fix
    config.chmod(0o600)
    assert check_private_files(settings(tmp_path, "mqtt://127.0.0.1:1"), config).verdict == "ok"


async def test_a_training_node_with_the_platforms_tools_is_said_to_sandbox(
    tmp_path: Path,
) -> None:
    require_isolation_tools()
    cloud = settings(tmp_path, "mqtt://127.0.0.1:1", site="cloud", cgroup_root="greenfed-doctor")
    try:
        isolation = node_isolation(cloud)
        check = check_isolation(cloud, isolation)
        assert check.verdict == "ok"
        assert check.detail.startswith("sandbox: bubblewrap namespaces")
        assert "memory" in check.detail
        assert "pids" in check.detail
    finally:
        assert isolation is not None
        assert isolation.cgroups is not None
        remove_groups([str(root) for root in isolation.cgroups.roots])
