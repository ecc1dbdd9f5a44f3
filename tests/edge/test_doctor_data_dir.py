"""`greenfed edge doctor`'s data-dir check (edge/doctor.py): the data directory, its
state/ and agent-versions/ must be writable by the agent's user only. The upgrade
supervisor runs, as root, the code unpacked in agent-versions/ (it refuses a version
another user could have planted, tests/edge/test_upgrade_hardening.py): doctor says
so before an upgrade silently does not take."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge.doctor import check_data_dir
from shared.settings import AgentSettings, MqttSettings, Settings


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def settings(data_dir: Path) -> Settings:
    return Settings(
        mqtt=MqttSettings(url="mqtt://127.0.0.1:1"),
        agent=AgentSettings(node_id="doctor-1", data_dir=str(data_dir), probes=("cpu",)),
    )


def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    (directory / "state").mkdir(parents=True, mode=0o700)
    (directory / "agent-versions").mkdir(mode=0o755)
    return directory


def test_a_data_dir_only_its_user_can_write_is_ok(tmp_path: Path) -> None:
    check = check_data_dir(settings(data_dir(tmp_path)))
    assert check.verdict == "ok", check.detail


def _give_away(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    os.chown(path, 65534, 65534, follow_symlinks=False)


def _link(path: Path) -> None:
    path.rename(path.with_name(f"{path.name}.real"))
    path.symlink_to(f"{path.name}.real")


@pytest.mark.parametrize(
    "where", ["", "state", "agent-versions"], ids=["data", "state", "versions"]
)
@pytest.mark.parametrize(
    "tamper",
    [lambda path: path.chmod(0o777), lambda path: path.chmod(0o775), _give_away],
    ids=["world-writable", "group-writable", "another-users"],
)
def test_a_directory_another_user_could_write_fails_the_check(
    tmp_path: Path, where: str, tamper: Callable[[Path], None]
) -> None:
    directory = data_dir(tmp_path)
    tamper(directory / where if where else directory)
    check = check_data_dir(settings(directory))
    assert check.verdict == "FAIL"
    assert str(directory / where if where else directory) in check.detail
    assert f"chmod go-w {directory / where if where else directory}" in check.fix


def test_a_versions_directory_reached_through_a_link_fails_the_check(tmp_path: Path) -> None:
    """The supervisor ignores one; a data directory that is a link (to a larger disk)
    is fine."""
    directory = data_dir(tmp_path)
    _link(directory / "agent-versions")
    assert check_data_dir(settings(directory)).verdict == "FAIL"
    linked = tmp_path / "linked-data"
    linked.symlink_to(data_dir(tmp_path / "elsewhere"))
    assert check_data_dir(settings(linked)).verdict == "ok"


def test_the_owner_is_judged_for_the_agents_user(tmp_path: Path) -> None:
    """Run by another user than the agent's, doctor judges for the one it is told."""
    directory = data_dir(tmp_path)
    mine = check_data_dir(settings(directory), euid=os.geteuid())
    assert mine.verdict == "ok"
    if os.geteuid() != 0:  # root's directories are trusted by everyone
        assert check_data_dir(settings(directory), euid=os.geteuid() + 1).verdict == "FAIL"
