"""Launchers for tests of the worker lifecycle (not of isolation): workers run as the
test's own user with no limits, so that any command the test runs (this Python,
under a home only its user may enter) works. tests/edge/test_hostile_jobs.py is where
isolation itself is tried."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge.sandbox.launcher import Sandbox
from edge.sandbox.probe import NodeIsolation
from edge.training.process import ProcessLauncher
from edge.training.runs import LauncherFactory, TrainingLauncher
from shared.messages import Accelerator

UNISOLATED = NodeIsolation("none", "tests of the worker lifecycle: the test's own user")


def plain_launcher(
    directory: Path, inventory: Sequence[Accelerator] = (), **options: Any
) -> ProcessLauncher:
    """Logs and records in `directory`/jobs, work directories in `directory`/work."""
    sandbox = Sandbox(
        UNISOLATED,
        inventory=inventory,
        work_root=directory / "work",
        credentials_dir=directory / "credentials",
    )
    return ProcessLauncher(directory / "jobs", sandbox=sandbox, **options)


def plain_launchers(directory: Path, **options: Any) -> LauncherFactory:
    """What an Agent takes: the launcher made once the node's accelerators are known."""

    def make(inventory: Sequence[Accelerator]) -> TrainingLauncher:
        return plain_launcher(directory, inventory, **options)

    return make
