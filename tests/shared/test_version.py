"""`shared.__version__`, read from the installed metadata without importlib.metadata
(shared/__init__.py): the same answer, including for an upgraded agent, whose version's
own code and metadata come first on its path (edge/upgrade/supervisor.py)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import shared

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_version_is_the_installed_distributions() -> None:
    assert shared.__version__ == importlib.metadata.version("greenfed")


def test_a_version_first_on_the_path_is_the_one_reported(tmp_path: Path) -> None:
    metadata = tmp_path / "greenfed-9.8.7.dist-info" / "METADATA"
    metadata.parent.mkdir()
    metadata.write_text("Metadata-Version: 2.3\nName: greenfed\nVersion: 9.8.7\n\nVersion: 0\n")
    (tmp_path / "unrelated-1.0.dist-info").mkdir()
    script = "import importlib.metadata, shared\n"
    script += "print(shared.__version__, importlib.metadata.version('greenfed'))\n"
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["9.8.7", "9.8.7"]
