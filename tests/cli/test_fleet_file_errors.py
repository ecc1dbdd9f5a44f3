"""`greenfed sim` and `greenfed up` with a fleet file they cannot run: a configuration
error (exit status 2, one line naming the file), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

import shared.runtime
from greenfed.cli import main

EXIT_USAGE = 2


@pytest.fixture
def data_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


@pytest.mark.usefixtures("data_home")
@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"group = []\n", "cannot scale to 3 nodes (--sim): the fleet has no nodes"),
        (b"\xff\xfe[[group]]\n", "is not UTF-8 text (line 1)"),
    ],
)
def test_sim_with_a_fleet_file_it_cannot_run_is_a_configuration_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    said: str,
) -> None:
    # Refused before any agent starts: a fleet that got as far returns 99 here.
    monkeypatch.setattr(shared.runtime, "run_main", lambda main: 99)
    fleet = tmp_path / "fleet.toml"
    fleet.write_bytes(content)
    assert main(["sim", "--fleet", str(fleet), "--sim", "3"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("greenfed: configuration error: ")
    assert str(fleet) in err
    assert said in err
    assert err.count("\n") == 1


@pytest.mark.usefixtures("data_home")
def test_up_with_a_fleet_file_without_nodes_to_scale_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("group = []\n", encoding="utf-8")
    argv = ["up", "--fleet", str(fleet), "--sim", "2", "--api-port", "0", "--broker-port", "0"]
    assert main(argv) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"greenfed: configuration error: {fleet}: cannot scale to 2 nodes (--sim): "
        "the fleet has no nodes\n"
    )
