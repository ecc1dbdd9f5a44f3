"""The systemd units greenfed ships: accepted by `systemd-analyze verify`, and as
confined as `systemd-analyze security` can tell (offline: no systemd runs as PID 1
here, so no unit is started under systemd in these tests). The control plane's and the
Mosquitto bootstrap's score "OK"; the agent's needs root, namespaces and cgroups to
sandbox work (docs/isolation.md), so it is held to its current score, never worse."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.system_tools import require_tool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = {
    "greenfed-cloud.service": (DEPLOY / "cloud/greenfed-cloud.service", 3.0),
    "greenfed-agent.service": (DEPLOY / "edge/greenfed-agent.service", 7.4),
    # The one-time bootstrap of Mosquitto's dynamic security (docs/deploy.md).
    "greenfed-mosquitto-dynsec.service": (
        DEPLOY / "mosquitto/greenfed-mosquitto-dynsec.service",
        1.5,
    ),
}
# Where the units expect what they run; here, an executable that exists.
PROGRAMS = ("/opt/greenfed/venv/bin/greenfed", "/usr/local/lib/greenfed/dynsec-bootstrap.sh")


def installed(tmp_path: Path, name: str) -> Path:
    """The unit as installed, its command pointing at an executable that exists here."""
    program = tmp_path / "greenfed"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    unit = tmp_path / name
    source = UNITS[name][0].read_text()
    for expected in PROGRAMS:
        source = source.replace(expected, str(program))
    unit.write_text(source)
    return unit


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_accepts_the_unit(tmp_path: Path, name: str) -> None:
    analyze = require_tool("systemd-analyze", "systemd")
    result = subprocess.run(
        [analyze, "verify", str(installed(tmp_path, name))],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        # Outside a booted system systemd cannot load the default targets; that says
        # nothing about this unit.
        if line.strip() and "sysinit.target not found" not in line
    ]
    assert problems == []


@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_unit_is_as_confined_as_promised(tmp_path: Path, name: str) -> None:
    analyze = require_tool("systemd-analyze", "systemd")
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(installed(tmp_path, name))],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", result.stdout)
    assert found is not None, result.stdout + result.stderr
    score, limit = float(found.group(1)), UNITS[name][1]
    assert score <= limit, f"{name}: {score} {found.group(2)} (at most {limit})\n{result.stdout}"
    if name != "greenfed-agent.service":
        assert found.group(2) == "OK"
