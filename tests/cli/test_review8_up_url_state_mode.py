"""`greenfed up` uses the broker `mqtt.url` names wherever it was set (the config file,
GREENFED_MQTT__URL or `--mqtt-url`), not the embedded one; and the agent's state
directory, as greenfed makes it, passes `greenfed edge doctor`'s private-files check
whatever the umask (0022 when an operator enrols as root, 0027 in the systemd unit)."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import greenfed.up
import shared.runtime
from edge.agent.state_files import AgentStateFiles
from edge.doctor import check_private_files
from edge.enrolment_proof import save_certificate
from edge.sealing_key import load_or_create_sealing_key
from greenfed.cli import main
from greenfed.up import UpOptions
from shared.settings import AgentSettings, Settings

# The real Mosquitto the suite runs beside (also mqtt.url's default address).
LOCAL_MOSQUITTO = "mqtt://127.0.0.1:1883"
STARTED = 0


@pytest.fixture
def up_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[UpOptions]:
    """The options `greenfed up` would run with, recorded instead of running (its data
    directory under tmp_path)."""
    seen: list[UpOptions] = []

    async def record(settings: Settings, options: UpOptions, stop: asyncio.Event) -> int:
        seen.append(options)
        return STARTED

    def run_main(start: Callable[[asyncio.Event], object]) -> int:
        coroutine = start(asyncio.Event())
        assert asyncio.iscoroutine(coroutine)
        return int(asyncio.run(asyncio.wait_for(coroutine, timeout=10)))

    monkeypatch.setattr(greenfed.up, "run_up", record)
    monkeypatch.setattr(shared.runtime, "run_main", run_main)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for name in list(os.environ):
        if name.startswith("GREENFED_"):
            monkeypatch.delenv(name)
    return seen


def test_the_broker_url_from_the_environment_is_the_external_broker(
    up_options: list[UpOptions], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GREENFED_MQTT__URL", LOCAL_MOSQUITTO)
    assert main(["up", "--sim", "1", "--api-port", "0"]) == STARTED
    assert up_options[0].external_mqtt_url == LOCAL_MOSQUITTO


def test_the_broker_url_from_the_config_file_is_the_external_broker(
    up_options: list[UpOptions], tmp_path: Path
) -> None:
    config = tmp_path / "up.toml"
    config.write_text(f'[mqtt]\nurl = "{LOCAL_MOSQUITTO}"\n', encoding="utf-8")
    assert main(["up", "--sim", "1", "--api-port", "0", "--config", str(config)]) == STARTED
    assert up_options[0].external_mqtt_url == LOCAL_MOSQUITTO


def test_the_option_still_names_the_external_broker_over_the_environment(
    up_options: list[UpOptions], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GREENFED_MQTT__URL", "mqtt://127.0.0.1:1884")
    argv = ["up", "--sim", "1", "--api-port", "0", "--mqtt-url", LOCAL_MOSQUITTO]
    assert main(argv) == STARTED
    assert up_options[0].external_mqtt_url == LOCAL_MOSQUITTO


def test_with_no_broker_url_set_anywhere_the_embedded_broker_starts(
    up_options: list[UpOptions], tmp_path: Path
) -> None:
    config = tmp_path / "up.toml"
    config.write_text('[mqtt]\ntopic_root = "elsewhere"\n', encoding="utf-8")
    assert main(["up", "--sim", "1", "--api-port", "0", "--config", str(config)]) == STARTED
    assert up_options[0].external_mqtt_url is None


# -- the state directory's mode --------------------------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    """An ordinary shell's umask (root's, as install.sh enrols): mkdir makes 0755."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _sealing_key(state: Path) -> None:
    load_or_create_sealing_key(state / "sealing.key")


def _certificate(state: Path) -> None:
    save_certificate(state / "enrolment.cert", "certificate")


def _agent_state(state: Path) -> None:
    AgentStateFiles(state)


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("create", [_sealing_key, _certificate, _agent_state])
def test_each_maker_of_the_state_directory_makes_it_private(
    create: Callable[[Path], None], tmp_path: Path
) -> None:
    data_dir = tmp_path / "agent"
    create(data_dir / "state")
    assert stat.S_IMODE((data_dir / "state").stat().st_mode) == 0o700
    settings = Settings(agent=AgentSettings(data_dir=str(data_dir)))
    assert check_private_files(settings, None).verdict == "ok"


def test_a_state_directory_already_there_is_left_as_it_is(tmp_path: Path) -> None:
    """One the operator made (and may share) is not greenfed's to change."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o750)
    AgentStateFiles(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o750
