"""deploy/edge/install.sh into a throwaway root (`--root`): what it creates and with
which permissions, only the edge extra installed, a re-run that changes nothing, the
unit (systemd-analyze checks it: tests/deploy/test_systemd_units.py), and an uninstall
that keeps (or, with --purge, removes) the settings and state."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "deploy" / "edge" / "install.sh"
UNIT = REPO / "deploy" / "edge" / "greenfed-agent.service"
ENROLLED = (
    "# greenfed enrolment: api=http://127.0.0.1:8700 cluster_id=c1 node_id=orin-9\n"
    '[mqtt]\nurl = "mqtt://127.0.0.1:1883"\n[agent]\nnode_id = "orin-9"\nprobes = ["cpu"]\n'
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def install(root: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), "--root", str(root), "--source", str(REPO), *options],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def manifest(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `root`: (mode, size, modification time)."""
    found = {}
    for directory, names, files in os.walk(root):
        for name in [*names, *files]:
            path = Path(directory, name)
            info = path.lstat()
            found[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_install_creates_the_agent_and_a_rerun_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    refused = install(root)
    assert refused.returncode == 2
    assert "missing --api (the node is not enrolled)" in refused.stderr

    (root / "etc" / "greenfed").mkdir(parents=True, mode=0o700)
    config = root / "etc" / "greenfed" / "agent.toml"
    config.write_text(ENROLLED)  # as `greenfed edge enrol` leaves it
    config.chmod(0o600)
    first = install(root)
    assert first.returncode == 0, first.stderr
    venv = root / "opt" / "greenfed" / "venv"
    assert os.access(venv / "bin" / "greenfed", os.X_OK)
    unit = root / "etc" / "systemd" / "system" / "greenfed-agent.service"
    assert unit.read_text() == UNIT.read_text()
    assert mode(unit) == 0o644
    assert mode(root / "etc" / "greenfed") == 0o700
    assert mode(config) == 0o600
    assert mode(root / "var" / "lib" / "greenfed") == 0o711  # passable, not listable
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert "onnxruntime==" in installed
    assert "aiomqtt==" in installed
    for server_only in ("sqlalchemy", "asyncpg", "aiosqlite", "amqtt", "playwright"):
        assert f"{server_only}==" not in installed, f"{server_only} is not for devices"

    before = manifest(root)
    again = install(root)
    assert again.returncode == 0, again.stderr
    assert "installed" not in again.stdout  # neither the package nor the unit again
    assert manifest(root) == before

    kept = install(root, "--uninstall")
    assert kept.returncode == 0, kept.stderr
    assert not (root / "opt" / "greenfed").exists()
    assert not unit.exists()
    assert config.read_text() == ENROLLED  # settings and state stay
    assert (root / "var" / "lib" / "greenfed").is_dir()
    purged = install(root, "--uninstall", "--purge")
    assert purged.returncode == 0, purged.stderr
    assert not (root / "etc" / "greenfed").exists()
    assert not (root / "var" / "lib" / "greenfed").exists()


def test_the_unit_is_hardened_and_stops_only_the_agent() -> None:
    lines = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in UNIT.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    # Root, to run workers as users of their own (docs/isolation.md), never as itself.
    assert lines["User"] == "root"
    assert lines["Environment"].startswith("GREENFED_")
    assert "GREENFED_AGENT__DATA_DIR=/var/lib/greenfed" in UNIT.read_text()
    assert lines["NoNewPrivileges"] == "true"
    assert lines["ProtectSystem"] == "strict"
    assert lines["ProtectHome"] == "true"
    assert lines["KillMode"] == "process"  # training workers outlive a restart
    assert lines["ReadWritePaths"].split()[0] == "/var/lib/greenfed"
