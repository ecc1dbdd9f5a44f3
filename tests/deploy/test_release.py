"""Release artefacts and installing the agent from them (issue 27): deploy/release.sh
builds the wheel and sdist the standard way (`python -m build`), a wheelhouse of the
edge agent's dependencies and SHA256SUMS; deploy/edge/install.sh installs the agent
from that wheel with no package index at all, into a throwaway root."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.test_edge_install import ENROLLED, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=500, check=False, env=env
    )


def test_a_release_installs_the_agent_with_no_package_index(tmp_path: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    dist = tmp_path / "dist"
    built = run(
        "bash", str(REPO / "deploy/release.sh"), "--out", str(dist), "--wheelhouse",
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = dist / f"greenfed-{version}-py3-none-any.whl"
    assert wheel.is_file()
    assert (dist / f"greenfed-{version}.tar.gz").is_file()
    assert any((dist / "wheelhouse").glob("onnxruntime-*.whl"))
    sums = (dist / "SHA256SUMS").read_text().splitlines()
    assert f"  greenfed-{version}-py3-none-any.whl" in "\n".join(sums)
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=dist, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # An enrolled node (as `greenfed edge enrol` leaves it), installed from the wheel
    # with every index unreachable: the wheelhouse beside it is all pip may use.
    root = tmp_path / "root"
    (root / "etc" / "greenfed").mkdir(parents=True, mode=0o700)
    config = root / "etc" / "greenfed" / "agent.toml"
    config.write_text(ENROLLED)
    config.chmod(0o600)
    offline = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0"}
    installed = run(
        "bash", str(REPO / "deploy/edge/install.sh"), "--root", str(root),
        "--source", str(wheel), env=offline,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    greenfed = root / "opt" / "greenfed" / "venv" / "bin" / "greenfed"
    shown = run(str(greenfed), "--version")
    # From a wheel: the version, and no commit (there is no checkout to ask).
    assert shown.stdout.strip() == f"greenfed {version}", shown.stdout + shown.stderr
