"""Command-line options that set a setting (`--telemetry-interval`, `--api-port`, ...) are
held to the same checks as the settings file: a value the file would refuse is a usage
or configuration error naming the option (exit status 2), never a fleet that runs and
that the control plane then refuses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest

import shared.runtime
from greenfed.arguments import settings_from_options
from greenfed.cli import main
from greenfed.edge_run import parse_plainly
from shared.settings import ConfigError

if TYPE_CHECKING:
    import argparse

EXIT_USAGE = 2
STARTED = 99  # what a command returns here where it got as far as running


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A command that gets past its settings returns STARTED instead of running (and
    keeps its data directory under tmp_path)."""
    monkeypatch.setattr(shared.runtime, "run_main", lambda main: STARTED)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for name in ("GREENFED_AGENT__TELEMETRY_INTERVAL_S", "GREENFED_CLOUD__API_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("command", [["up"], ["sim"], ["edge", "run"]])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0"])
def test_a_telemetry_interval_that_is_not_a_positive_finite_number_is_a_usage_error(
    command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, f"--telemetry-interval={value}"])
    assert exited.value.code == EXIT_USAGE
    assert "argument --telemetry-interval" in capsys.readouterr().err


def test_the_agent_command_line_read_without_argparse_refuses_an_infinite_interval() -> None:
    # None: argparse reads it instead, and says what is wrong.
    assert parse_plainly(["--telemetry-interval", "inf"]) is None


@pytest.mark.parametrize("command", [["up", "--api-port", "0"], ["sim", "--sim", "1"]])
@pytest.mark.usefixtures("nothing_runs")
def test_a_telemetry_interval_the_settings_refuse_is_a_configuration_error_naming_the_option(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # 0.01 s: below agent.telemetry_interval_s's 0.05, which a settings file may not set.
    assert main([*command, "--telemetry-interval", "0.01"]) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert err.startswith(
        "greenfed: configuration error: --telemetry-interval: agent.telemetry_interval_s: "
    )
    assert ">= 0.05" in err
    assert err.count("\n") == 1


def test_the_agent_checks_its_telemetry_interval_option_as_its_settings() -> None:
    plain = parse_plainly(["--no-supervisor", "--telemetry-interval", "0.01"])
    assert plain is not None
    args = cast("argparse.Namespace", SimpleNamespace(**plain))
    with pytest.raises(ConfigError) as caught:
        settings_from_options(args)
    assert caught.value.key == "agent.telemetry_interval_s"
    assert str(caught.value).startswith("--telemetry-interval: agent.telemetry_interval_s: ")


@pytest.mark.usefixtures("nothing_runs")
def test_options_that_pass_the_settings_checks_are_applied() -> None:
    args = cast(
        "argparse.Namespace",
        SimpleNamespace(
            **{
                **cast(dict[str, object], parse_plainly([])),
                "telemetry_interval": 0.5,
                "mqtt_url": "mqtt://broker:1884",
                "log_level": "debug",
            }
        ),
    )
    settings = settings_from_options(args)
    assert settings.agent.telemetry_interval_s == 0.5
    assert settings.mqtt.url == "mqtt://broker:1884"
    assert settings.log.level == "debug"


# -- greenfed up: the fleet reports to the control plane of the same settings ----------


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "up.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.usefixtures("nothing_runs")
def test_up_refuses_an_agent_interval_its_own_control_plane_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Within the agent's own bounds, beyond the cloud's max_telemetry_interval_s (3600):
    # every node's birth would be dropped (bad_interval), none ever online.
    config = write_config(tmp_path, "[agent]\ntelemetry_interval_s = 7200\n")
    assert main(["up", "--config", str(config), "--api-port", "0"]) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert err.startswith(f"greenfed: configuration error: {config}: agent.telemetry_interval_s: ")
    assert "cloud.max_telemetry_interval_s" in err


@pytest.mark.usefixtures("nothing_runs")
def test_up_names_the_option_that_set_an_interval_its_control_plane_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, "[cloud]\nmin_telemetry_interval_s = 1.0\n")
    argv = ["up", "--config", str(config), "--api-port", "0", "--telemetry-interval", "0.5"]
    assert main(argv) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert err.startswith(
        "greenfed: configuration error: --telemetry-interval: agent.telemetry_interval_s: "
    )
    assert "cloud.min_telemetry_interval_s" in err


@pytest.mark.usefixtures("nothing_runs")
def test_up_runs_an_interval_its_control_plane_accepts(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, "[agent]\ntelemetry_interval_s = 7200\n[cloud]\nmax_telemetry_interval_s = 7200\n"
    )
    assert main(["up", "--config", str(config), "--api-port", "0"]) == STARTED


@pytest.mark.usefixtures("nothing_runs")
def test_a_simulated_fleet_for_another_control_plane_is_not_held_to_this_files_cloud_limits(
    tmp_path: Path,
) -> None:
    # `greenfed sim` reports to a control plane elsewhere, whose limits this file's
    # [cloud] table need not describe.
    config = write_config(tmp_path, "[agent]\ntelemetry_interval_s = 7200\n")
    assert main(["sim", "--config", str(config), "--sim", "1"]) == STARTED
