"""The commands docs/monitoring.md gives an operator work as written: the promtool
checks of "Testing the rules" pass when run from the repository root, and the scrape
token is copied from where the shipped systemd unit's control plane writes it."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from shared.settings import load_settings
from shared.token_files import metrics_token_path
from tests.support.system_tools import require_tool

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "docs" / "monitoring.md"
CLOUD_UNIT = REPO / "deploy" / "cloud" / "greenfed-cloud.service"
_SHELL_BLOCK = re.compile(r"^[ \t]*```sh\n(?P<body>.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


def shell_commands(markdown: str) -> list[list[str]]:
    """Every command of the ```sh blocks of `markdown`, continuation lines joined."""
    commands: list[list[str]] = []
    for block in _SHELL_BLOCK.finditer(markdown):
        text = block.group("body").replace("\\\n", " ")
        commands += [shlex.split(line, comments=True) for line in text.splitlines()]
    return [command for command in commands if command]


def section(markdown: str, title: str) -> str:
    start = markdown.index(f"\n## {title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else len(markdown)]


def test_the_rule_checks_pass_as_written_from_the_repository_root() -> None:
    promtool = require_tool("promtool", "prometheus")
    commands = shell_commands(section(MONITORING.read_text(), "Testing the rules"))
    assert [command[:3] for command in commands] == [
        ["promtool", "check", "config"],
        ["promtool", "check", "rules"],
        ["promtool", "test", "rules"],
    ]
    for command in commands:
        result = subprocess.run(
            [promtool, *command[1:]],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"{shlex.join(command)}:\n{result.stdout}{result.stderr}"


def test_the_scrape_token_is_copied_from_the_systemd_units_data_directory() -> None:
    environment = {}
    for line in CLOUD_UNIT.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "Environment":
            name, _, text = value.partition("=")
            environment[name] = text
    settings = load_settings(None, environ=environment)
    written = metrics_token_path(settings.store)

    [copy] = [
        command
        for command in shell_commands(section(MONITORING.read_text(), "Scraping"))
        if command[-1] == "/etc/prometheus/greenfed-metrics-token"
    ]
    assert copy[:2] == ["sudo", "install"]
    assert copy[-2] == str(written)
