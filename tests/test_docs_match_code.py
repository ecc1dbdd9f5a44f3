"""The documents users rely on stay true to the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from cloud.fleet.ingest import InvalidReason
from shared.messages import (
    Accelerator,
    AcceleratorSample,
    DesiredTraining,
    HostInfo,
    ReportedTraining,
)
from shared.schemas import PAYLOAD_TYPES
from shared.settings import Settings, load_settings
from sim_devices.profiles import PROFILES

ROOT = Path(__file__).resolve().parent.parent


def read(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "struct",
    [
        *PAYLOAD_TYPES.values(),
        Accelerator,
        AcceleratorSample,
        HostInfo,
        DesiredTraining,
        ReportedTraining,
    ],
)
def test_the_mqtt_contract_documents_every_payload_field(struct: type[msgspec.Struct]) -> None:
    text = read("docs/mqtt.md")
    missing = [f.name for f in msgspec.structs.fields(struct) if f"`{f.name}`" not in text]
    assert missing == [], f"docs/mqtt.md does not document {struct.__name__} fields {missing}"


def test_the_configuration_guide_documents_every_setting() -> None:
    text = read("docs/configuration.md")
    for section in msgspec.structs.fields(Settings):
        assert f"## `[{section.name}]`" in text
        for key in msgspec.structs.fields(section.type):
            assert f"`{key.name}`" in text, f"{section.name}.{key.name} is undocumented"


def test_the_rest_guide_names_every_reason_a_payload_is_dropped() -> None:
    text = read("docs/rest.md")
    assert [r.value for r in InvalidReason if f"`{r.value}`" not in text] == []


def test_the_simulation_guide_lists_every_device_profile() -> None:
    text = read("docs/simulation.md")
    assert [name for name in PROFILES if f"`{name}`" not in text] == []


def test_the_example_agent_configuration_is_valid() -> None:
    settings = load_settings(ROOT / "deploy/edge/agent.example.toml", environ={})
    assert settings.agent.node_id == settings.mqtt.username == "orin-nano-toronto-1"


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```sh\n(.+?)\n```", read("README.md"))
    test_command = next(command for command in commands if "pytest" in command)
    assert test_command in read(".ci/run").splitlines()
