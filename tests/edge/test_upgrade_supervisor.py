"""The upgrade supervisor (edge/upgrade/supervisor.py) with real child processes: a
version on trial stays only if it announces itself in time; one that exits first, or
stays silent past the bound, is stopped, reported and replaced by the version before.

The child here is a small script standing in for `greenfed edge run`, told by its
version what to do: what the supervisor decides depends only on its exit and its
health file (the real agent is upgraded end to end in tests/e2e/test_agent_upgrade.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from edge.upgrade.supervisor import Supervisor, parse_arguments
from edge.upgrade.versions import RESTART_EXIT_CODE, Trial, VersionsDir

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The unit's files are made under a umask that writes for no group (0027); under
    0002 every version made here would be one the supervisor refuses to run."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


# Each version's behaviour: "healthy" writes the health file, then exits 0 once it sees
# the file `stop` (or at once if it says "exit"); "crash" exits 1; "silent" sleeps.
CHILD = textwrap.dedent(
    """
    import os, sys, time, pathlib
    version, behaviour, log = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    with log.open("a") as f:
        f.write(version + " " + os.environ.get("PYTHONPATH", "") + "\\n")
    if behaviour == "crash":
        sys.exit(1)
    if behaviour == "silent":
        time.sleep(60)
    pathlib.Path(os.environ["GREENFED_SUPERVISOR_HEALTH_FILE"]).write_text(version)
    if behaviour == "restart":
        sys.exit(75)
    sys.exit(0)
    """
)


class Fleet:
    """A versions directory with unpacked (empty) versions and how each behaves."""

    def __init__(self, root: Path) -> None:
        self.versions = VersionsDir(root / "agent-versions")
        self.script = root / "child.py"
        self.script.write_text(CHILD)
        self.log = root / "started.log"
        self.behaviour: dict[str | None, str] = {None: "healthy"}

    def install(self, version: str, behaviour: str) -> None:
        self.versions.site(version).mkdir(parents=True)
        self.behaviour[version] = behaviour

    def command(self, version: str | None) -> Sequence[str]:
        behaviour = self.behaviour[version]
        return [sys.executable, str(self.script), version or "installed", behaviour, str(self.log)]

    def started(self) -> list[tuple[str, str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [tuple(line.split(" ", 1)) for line in lines]  # type: ignore[misc]

    def supervisor(self) -> Supervisor:
        return Supervisor(self.versions, self.command, clock=lambda: 1000.0, log=lambda _: None)


def trial(version: str, previous: str | None = None, timeout_s: float = 30.0) -> Trial:
    return Trial(version=version, rollout_id="r1", previous=previous, health_timeout_s=timeout_s)


def test_a_version_that_announces_itself_becomes_the_active_one(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("2.0", "healthy")
    fleet.versions.start_trial(trial("2.0"))
    assert fleet.supervisor().round() == 0
    assert fleet.versions.active() == "2.0"
    assert fleet.versions.trial() is None
    assert fleet.versions.failure() is None
    ((version, path),) = fleet.started()
    assert version == "2.0"
    assert path.split(os.pathsep)[0] == str(fleet.versions.site("2.0"))  # its code comes first


def test_a_version_that_exits_before_announcing_itself_is_rolled_back(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("1.0", "healthy")
    fleet.install("2.0", "crash")
    fleet.versions.set_active("1.0")
    fleet.versions.start_trial(trial("2.0", previous="1.0"))
    assert fleet.supervisor().round() == 0  # the previous version's exit
    assert [version for version, _ in fleet.started()] == ["2.0", "1.0"]
    assert fleet.versions.active() == "1.0"
    assert fleet.versions.trial() is None
    failure = fleet.versions.failure()
    assert failure is not None
    assert (failure.version, failure.rollout_id, failure.outcome) == ("2.0", "r1", "rolled-back")
    assert "exited with code 1 before announcing itself" in failure.detail


def test_a_silent_version_is_stopped_at_the_bound_and_the_installed_one_returns(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("2.0", "silent")
    fleet.versions.start_trial(trial("2.0", timeout_s=1.0))
    started = time.monotonic()
    assert fleet.supervisor().round() == 0
    assert time.monotonic() - started < 20  # stopped, not waited out
    assert [version for version, _ in fleet.started()] == ["2.0", "installed"]
    assert fleet.versions.active() is None
    failure = fleet.versions.failure()
    assert failure is not None
    assert "did not announce itself within 1 s" in failure.detail


def test_an_agent_that_staged_a_version_is_started_again_in_it(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.behaviour[None] = "restart"  # the installed agent staged 2.0 and asks to restart
    fleet.install("2.0", "healthy")

    def stage_then_restart(version: str | None) -> Sequence[str]:
        if version is None:
            fleet.versions.start_trial(trial("2.0"))
        return fleet.command(version)

    supervisor = Supervisor(fleet.versions, stage_then_restart, log=lambda _: None)
    assert supervisor.run() == 0
    assert [version for version, _ in fleet.started()] == ["installed", "2.0"]
    assert fleet.versions.active() == "2.0"


def test_a_trial_whose_files_are_gone_is_dropped(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.versions.start_trial(trial("9.9"))
    assert fleet.supervisor().round() == 0
    assert [version for version, _ in fleet.started()] == ["installed"]
    assert fleet.versions.trial() is None


def test_old_versions_are_pruned_but_the_active_and_previous_stay(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    for number, version in enumerate(["1.0", "1.1", "1.2", "1.3", "1.4"]):
        fleet.install(version, "healthy")
        os.utime(fleet.versions.root / version, (number, number))
    fleet.versions.prune({"1.0", "1.4"})
    kept = sorted(path.name for path in fleet.versions.root.iterdir() if path.is_dir())
    assert kept == ["1.0", "1.2", "1.3", "1.4"]


def test_sigterm_reaches_the_agent_and_ends_the_supervisor_with_its_code(tmp_path: Path) -> None:
    """As systemd stops the unit: the supervisor passes SIGTERM on and exits as the agent
    did, without starting it again."""
    script = tmp_path / "agent.py"
    script.write_text(
        "import signal, sys, time, pathlib, os\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "pathlib.Path(os.environ['GREENFED_SUPERVISOR_HEALTH_FILE']).write_text('up')\n"
        "time.sleep(60)\n"
    )
    versions = tmp_path / "agent-versions"
    versions.mkdir()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from edge.upgrade.supervisor import Supervisor; "
            "from edge.upgrade.versions import VersionsDir; from pathlib import Path; "
            f"sys.exit(Supervisor(VersionsDir(Path({str(versions)!r})), "
            f"lambda v: [sys.executable, {str(script)!r}]).run())",
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        health = versions / "health"
        deadline = time.monotonic() + 30
        while not health.exists():
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_the_versions_files_survive_a_torn_write(tmp_path: Path) -> None:
    versions = VersionsDir(tmp_path)
    (tmp_path / "trial.json").write_text("{not json")
    (tmp_path / "active.json").write_text(json.dumps({"version": "gone"}))
    assert versions.trial() is None
    assert versions.active() is None  # a version whose files are gone is not active


def test_restart_exit_code_is_not_one_systemd_refuses_to_restart() -> None:
    unit = (Path(__file__).resolve().parents[2] / "deploy/edge/greenfed-agent.service").read_text()
    line = next(ln for ln in unit.splitlines() if ln.startswith("RestartPreventExitStatus="))
    assert str(RESTART_EXIT_CODE) not in line.split("=", 1)[1].split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_agent_whose_supervisor_is_killed_is_stopped_too(tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no chance to pass anything on: the kernel sends the
    agent SIGTERM (PR_SET_PDEATHSIG), so no agent outlives its supervisor."""
    script = tmp_path / "agent.py"
    stopped = tmp_path / "stopped"
    script.write_text(
        "import signal, sys, time, pathlib, os\n"
        f"def stop(*_): pathlib.Path({str(stopped)!r}).write_text('SIGTERM'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "pathlib.Path(os.environ['GREENFED_SUPERVISOR_HEALTH_FILE']).write_text(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    versions = tmp_path / "agent-versions"
    versions.mkdir()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from edge.upgrade.supervisor import Supervisor; "
            "from edge.upgrade.versions import VersionsDir; from pathlib import Path; "
            f"sys.exit(Supervisor(VersionsDir(Path({str(versions)!r})), "
            f"lambda v: [sys.executable, {str(script)!r}]).run())",
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        health = versions / "health"
        deadline = time.monotonic() + 30
        while not health.exists() or not health.read_text():
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.05)
        process.kill()
        process.wait(10)
        deadline = time.monotonic() + 30
        while not (stopped.exists() and stopped.read_text()):
            assert time.monotonic() < deadline, "the agent outlived its supervisor"
            time.sleep(0.05)
        assert stopped.read_text() == "SIGTERM"
    finally:
        if process.poll() is None:
            process.kill()
        if health.exists() and not stopped.exists() and health.read_text().isdigit():
            os.kill(int(health.read_text()), signal.SIGKILL)


def test_the_supervisor_reads_its_two_options_as_argparse_did() -> None:
    assert parse_arguments(["--versions-dir", "/d", "--", "edge", "run", "--config", "a"]) == (
        Path("/d"),
        ["edge", "run", "--config", "a"],
    )
    assert parse_arguments(["--versions-dir=/d", "edge", "run"]) == (Path("/d"), ["edge", "run"])
    assert parse_arguments(["--versions-dir", "/d"]) == (Path("/d"), [])
    for wrong in ([], ["--versions-dir"], ["--versions-dir="], ["edge", "run"]):
        with pytest.raises(ValueError, match="usage"):
            parse_arguments(wrong)
