"""The agent runs with only the `edge` extra installed: no database stack, ever; and
until a node is given an inference deployment, no web server, numpy or ONNX Runtime
either (they are loaded with the first deployment). A child interpreter that refuses
to import those proves it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CLOUD_ONLY_MODULES = [
    "sqlalchemy",
    "asyncpg",
    "aiosqlite",
    "numpy",
    "prometheus_client",
    "rich",
    "amqtt",
    "aiohttp",
    "onnxruntime",
]

BLOCKER = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {CLOUD_ONLY_MODULES!r}:
            raise ImportError(f"the edge agent imported {{name}}")
        return None
sys.meta_path.insert(0, Refuse())
"""


def test_the_edge_extra_does_not_pull_the_cloud_stack() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    edge = " ".join(project["optional-dependencies"]["edge"] + project["dependencies"]).lower()
    for package in ("sqlalchemy", "asyncpg", "aiosqlite", "prometheus", "rich", "amqtt"):
        assert package not in edge


def test_discovery_and_the_agent_import_nothing_from_the_cloud_stack() -> None:
    script = BLOCKER + (
        "import edge.agent, edge.main\n"
        "from greenfed.cli import main\n"
        "raise SystemExit(main(['edge', 'discover', '--json']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert '"kind": "cpu"' in result.stdout
