"""greenfed-cloud.service reads its settings file, which holds the database's and the
broker's passwords, as a systemd credential: /etc/greenfed/cloud.toml stays root's
alone (mode 0600, as docs/deploy.md installs it) and the service's dynamic user reads
the copy systemd makes for it. Run here as systemd would run it (its environment, the
credential in a directory of its own for `%d`): no systemd runs as PID 1 where greenfed
is tested (tests/deploy/test_systemd_units.py checks the unit offline)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from greenfed.arguments import settings_from_options
from greenfed.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "cloud" / "greenfed-cloud.service"
DEPLOY_GUIDE = REPO / "docs" / "deploy.md"
SETTINGS_FILE = "/etc/greenfed/cloud.toml"
SECRET_SETTINGS = """\
[store]
database_url = "postgresql://greenfed:db-secret@127.0.0.1:5432/greenfed"
[mqtt]
url = "mqtt://127.0.0.1:1883"
username = "greenfed-cloud"
password = "mqtt-secret"
"""


def unit_settings() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The unit's ExecStart (split), Environment and LoadCredential (name -> source)."""
    command: list[str] = []
    environment: dict[str, str] = {}
    credentials: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            command = shlex.split(value)
        elif key == "Environment":
            name, _, text = value.partition("=")
            environment[name] = text
        elif key == "LoadCredential":
            name, _, source = value.partition(":")
            credentials[name] = source
    return command, environment, credentials


def test_the_service_reads_a_root_only_settings_file_through_its_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, environment, credentials = unit_settings()
    # The root-only original, as the guide leaves it.
    original = tmp_path / "etc" / "cloud.toml"
    original.parent.mkdir()
    original.write_text(SECRET_SETTINGS)
    original.chmod(0o600)
    # What systemd does before the command starts: each LoadCredential= copied into a
    # directory of the service's own, which `%d` names.
    credentials_dir = tmp_path / "credentials"
    credentials_dir.mkdir(mode=0o500)
    named = [name for name, source in credentials.items() if source == SETTINGS_FILE]
    assert named, f"no LoadCredential= hands the service {SETTINGS_FILE}"
    for name in named:
        shutil.copy(original, credentials_dir / name)

    argv = [argument.replace("%d", str(credentials_dir)) for argument in command[1:]]
    args = build_parser().parse_args(argv)
    assert args.config is not None, "the unit names no settings file"
    assert args.config.parent == credentials_dir, (
        f"the unit reads {args.config}: its dynamic user can read that only if it is "
        "world-readable, passwords and all"
    )
    for name in list(environment):
        monkeypatch.setenv(name, environment[name])
    settings = settings_from_options(args)
    assert settings.store.database_url.endswith("greenfed:db-secret@127.0.0.1:5432/greenfed")
    assert settings.mqtt.password == "mqtt-secret"


def test_the_guide_makes_the_settings_file_root_only_before_it_is_written() -> None:
    guide = DEPLOY_GUIDE.read_text()
    start = guide.index("\n## systemd\n")
    systemd = guide[start : guide.index("\n## ", start + 1)]
    lines = systemd.splitlines()
    edit = next(i for i, line in enumerate(lines) if re.match(rf"\$EDITOR {SETTINGS_FILE}\b", line))
    before = "\n".join(lines[:edit])
    assert re.search(rf"(chmod 0?600|install -m 0?600)\b[^\n]*{SETTINGS_FILE}", before), (
        f"the guide writes passwords into {SETTINGS_FILE} without making it root's alone"
    )
