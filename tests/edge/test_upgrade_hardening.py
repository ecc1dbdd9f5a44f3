"""The upgrade supervisor (edge/upgrade/supervisor.py) and the versions it runs when the
node's disk or its files do not behave: a full disk while a trial ends, a version a
power cut emptied, files another user could have written, damaged records. And the
unpacking that makes a version durable before it can be made active
(shared/agent_packages.py `unpack_wheel`).

The child is a small script standing in for `greenfed edge run`, as in
tests/edge/test_upgrade_supervisor.py: what the supervisor decides depends only on
the child's exit and its health file."""

from __future__ import annotations

import errno
import json
import os
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import edge.upgrade.versions as versions_module
from edge.upgrade.supervisor import QUICK_EXITS, Supervisor
from edge.upgrade.versions import Trial, VersionsDir
from shared.agent_packages import PackageError, unpack_wheel

pytestmark = pytest.mark.timeout(60)

# Each version's behaviour: "healthy" writes the health file and exits 0; "crash" exits
# 1 and "empty" exits 0 (an emptied `__main__`), both without announcing themselves.
CHILD = textwrap.dedent(
    """
    import json, os, sys, pathlib
    version, behaviour, log = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    with log.open("a") as f:
        f.write(json.dumps({
            "version": version,
            "versions_dir": os.environ.get("GREENFED_SUPERVISOR_VERSIONS_DIR"),
            "supervised": bool(os.environ.get("GREENFED_SUPERVISOR_HEALTH_FILE")),
        }) + "\\n")
    if behaviour == "crash":
        sys.exit(1)
    if behaviour == "empty":
        sys.exit(0)
    pathlib.Path(os.environ["GREENFED_SUPERVISOR_HEALTH_FILE"]).write_text(version)
    """
)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The unit's files are made under a umask that writes for no group (0027); a
    test run under 0002 would make every version look writable by others."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


class Fleet:
    def __init__(self, root: Path) -> None:
        self.versions = VersionsDir(root / "agent-versions")
        self.versions.root.mkdir()
        self.script = root / "child.py"
        self.script.write_text(CHILD)
        self.log = root / "started.log"
        self.lines: list[str] = []
        self.behaviour: dict[str | None, str] = {None: "healthy"}

    def install(self, version: str, behaviour: str) -> None:
        package = self.versions.site(version) / "greenfed"
        package.mkdir(parents=True)
        (package / "__main__.py").write_text("")
        self.behaviour[version] = behaviour

    def command(self, version: str | None) -> Sequence[str]:
        behaviour = self.behaviour[version]
        return [sys.executable, str(self.script), version or "installed", behaviour, str(self.log)]

    def starts(self) -> list[dict[str, object]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [json.loads(line) for line in lines]

    def started(self) -> list[object]:
        return [start["version"] for start in self.starts()]

    def supervisor(self) -> Supervisor:
        return Supervisor(
            self.versions,
            self.command,
            clock=lambda: 1000.0,
            log=self.lines.append,
            restart_pause_s=0.0,
        )


def trial(version: str, previous: str | None = None) -> Trial:
    return Trial(version=version, rollout_id="r1", previous=previous, health_timeout_s=30.0)


def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record the versions directory writes fails as on a full disk (the seam:
    the atomic write); unlinking still works, as it does there."""

    def no_space(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(versions_module, "write_atomically", no_space)


# ---- a full disk when a trial ends -------------------------------------------------------


def test_a_failed_trial_on_a_full_disk_still_goes_back_to_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("1.0", "healthy")
    fleet.install("2.0", "crash")
    fleet.versions.set_active("1.0")
    fleet.versions.start_trial(trial("2.0", previous="1.0"))
    full_disk(monkeypatch)
    assert fleet.supervisor().round() == 0  # the previous version's exit, not a traceback
    assert fleet.started() == ["2.0", "1.0"]
    # The trial is over even though its failure could not be written: a restart (the
    # unit's, or a second round) runs the previous version, never the broken one again.
    assert fleet.versions.trial() is None
    assert fleet.versions.active() == "1.0"
    assert any("could not record the failure of agent 2.0" in line for line in fleet.lines)
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["2.0", "1.0", "1.0"]


def test_a_trial_that_passed_on_a_full_disk_keeps_its_agent_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("2.0", "healthy")
    fleet.versions.start_trial(trial("2.0"))
    full_disk(monkeypatch)
    assert fleet.supervisor().round() == 0  # the agent's own exit: it was left to run
    assert fleet.started() == ["2.0"]
    # Not recorded as active: it stays on trial, tried (and made active) at next start.
    assert fleet.versions.trial() == trial("2.0")
    assert any("could not make agent 2.0 the active version" in line for line in fleet.lines)
    monkeypatch.undo()
    assert fleet.supervisor().round() == 0
    assert fleet.versions.active() == "2.0"
    assert fleet.versions.trial() is None


# ---- an active version that no longer starts ------------------------------------------


@pytest.mark.parametrize("behaviour", ["empty", "crash"])
def test_an_active_version_that_keeps_exiting_at_once_is_given_up_for_the_installed_one(
    tmp_path: Path, behaviour: str
) -> None:
    """A power cut soon after 3.0 was made active emptied its files: its `__main__`
    exits 0 at once (which systemd would not restart), or it cannot import (exit 1)."""
    fleet = Fleet(tmp_path)
    fleet.install("3.0", behaviour)
    (fleet.versions.root / "active.json").write_text(
        json.dumps({"version": "3.0", "rollout_id": "r7"})
    )
    assert fleet.supervisor().round() == 0  # the installed version's exit
    assert fleet.started() == ["3.0"] * QUICK_EXITS + ["installed"]
    assert fleet.versions.active() is None
    failure = fleet.versions.failure()
    assert failure is not None
    assert (failure.version, failure.rollout_id, failure.outcome) == ("3.0", "r7", "rolled-back")
    assert "before announcing itself" in failure.detail
    assert fleet.supervisor().round() == 0  # later starts: the installed version at once
    assert fleet.started()[-1] == "installed"


def test_an_active_version_that_announced_itself_is_not_given_up(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("3.0", "healthy")  # announces itself, then exits 0
    fleet.versions.set_active("3.0")
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["3.0"]
    assert fleet.versions.active() == "3.0"
    assert fleet.versions.failure() is None


def test_a_version_given_up_on_a_full_disk_is_still_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("3.0", "empty")
    fleet.versions.set_active("3.0")
    full_disk(monkeypatch)
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["3.0"] * QUICK_EXITS + ["installed"]
    assert fleet.versions.active() is None  # removing active.json needs no space


# ---- files the supervisor must not trust -----------------------------------------------


def _chmod(mode: int) -> Callable[[Path], None]:
    return lambda path: path.chmod(mode)


def _foreign(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, 65534, 65534, follow_symlinks=False)


def _linked(path: Path) -> None:
    """`path` replaced with a link to a copy of it (same contents, same owner)."""
    copy = path.with_name(f"{path.name}.real")
    path.rename(copy)
    path.symlink_to(copy.name)


TAMPERING = {
    "group-writable": _chmod(0o664),
    "world-writable": _chmod(0o666),
    "another-users": _foreign,
    "a-link": _linked,
}


@pytest.mark.parametrize("tamper", TAMPERING.values(), ids=TAMPERING.keys())
def test_an_active_record_the_supervisor_cannot_trust_is_ignored(
    tmp_path: Path, tamper: Callable[[Path], None]
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("6.6.6", "healthy")
    fleet.versions.set_active("6.6.6")
    tamper(fleet.versions.root / "active.json")
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["installed"]
    warnings: list[str] = []  # the supervisor's own VersionsDir logs them (main())
    assert VersionsDir(fleet.versions.root, warn=warnings.append).active() is None
    assert any("active.json ignored" in line for line in warnings)


@pytest.mark.parametrize("tamper", TAMPERING.values(), ids=TAMPERING.keys())
def test_a_trial_record_the_supervisor_cannot_trust_is_ignored(
    tmp_path: Path, tamper: Callable[[Path], None]
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("1.0", "healthy")
    fleet.install("6.6.6", "healthy")
    fleet.versions.set_active("1.0")
    fleet.versions.start_trial(trial("6.6.6", previous="1.0"))
    tamper(fleet.versions.root / "trial.json")
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["1.0"]
    assert fleet.versions.active() == "1.0"


@pytest.mark.parametrize(
    "where", ["version", "site", "package", "module"], ids=lambda where: f"its-{where}"
)
@pytest.mark.parametrize("tamper", TAMPERING.values(), ids=TAMPERING.keys())
def test_a_version_whose_files_another_user_could_write_is_not_run(
    tmp_path: Path, tamper: Callable[[Path], None], where: str
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("6.6.6", "healthy")
    fleet.versions.set_active("6.6.6")
    site = fleet.versions.site("6.6.6")
    path = {
        "version": site.parent,
        "site": site,
        "package": site / "greenfed",
        "module": site / "greenfed" / "__main__.py",
    }[where]
    if tamper is TAMPERING["group-writable"] and path.is_dir():
        tamper = _chmod(0o775)
    elif tamper is TAMPERING["world-writable"] and path.is_dir():
        tamper = _chmod(0o777)
    tamper(path)
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["installed"]
    assert any("agent 6.6.6 not run" in line for line in fleet.lines)


def test_a_version_on_trial_whose_files_could_be_planted_is_not_tried(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("6.6.6", "healthy")
    fleet.versions.start_trial(trial("6.6.6"))
    (fleet.versions.site("6.6.6") / "greenfed").chmod(0o777)
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["installed"]
    assert fleet.versions.trial() is None
    failure = fleet.versions.failure()
    assert failure is not None
    assert (failure.version, failure.outcome) == ("6.6.6", "failed")


@pytest.mark.parametrize(
    "tamper", [_chmod(0o775), _chmod(0o777), _foreign, _linked], ids=TAMPERING.keys()
)
def test_a_versions_directory_others_could_write_is_not_used_at_all(
    tmp_path: Path, tamper: Callable[[Path], None]
) -> None:
    """As a local user could do to a world-writable agent-versions/: plant a version and
    make it active. The installed version runs, told of no versions directory (so it
    cannot stage an upgrade there either), but still that a supervisor runs it."""
    fleet = Fleet(tmp_path)
    fleet.install("6.6.6", "healthy")
    fleet.versions.set_active("6.6.6")
    fleet.versions.start_trial(trial("6.6.6"))
    tamper(fleet.versions.root)
    assert fleet.supervisor().round() == 0
    (start,) = fleet.starts()
    assert start == {"version": "installed", "versions_dir": None, "supervised": True}
    assert any("cannot upgrade itself" in line for line in fleet.lines)


def test_a_careless_umask_still_unpacks_versions_no_group_can_write(tmp_path: Path) -> None:
    """Else the supervisor would refuse every version this node unpacked."""
    site = tmp_path / "agent-versions" / "1.2.3" / "site"
    previous = os.umask(0o002)  # as careless as a umask gets; the unit's is 0027
    try:
        unpack_wheel(_wheel(tmp_path / "a.whl"), site)
    finally:
        os.umask(previous)
    for path in [site.parent, site, *site.rglob("*")]:
        assert path.stat().st_mode & 0o022 == 0, path


# ---- damaged records -------------------------------------------------------------------


def test_a_trial_whose_previous_version_is_not_a_name_goes_back_to_the_installed_one(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("2.0", "crash")
    (fleet.versions.root / "trial.json").write_text(
        json.dumps({"version": "2.0", "rollout_id": "r1", "previous": 5, "health_timeout_s": 30})
    )
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["2.0", "installed"]
    assert fleet.versions.trial() is None


def test_a_trial_whose_previous_version_is_its_own_goes_back_to_the_installed_one(
    tmp_path: Path,
) -> None:
    """A record naming the version on trial as the one to go back to (what an agent
    running the installed version while `active.json` named the new one wrote): a failed
    trial is not started again as its own rollback."""
    fleet = Fleet(tmp_path)
    fleet.install("2.0", "crash")
    fleet.versions.set_active("2.0")
    fleet.versions.start_trial(trial("2.0", previous="2.0"))
    assert fleet.supervisor().round() == 0
    assert fleet.started() == ["2.0", "installed"]
    assert fleet.versions.trial() is None
    assert fleet.versions.active() is None
    failure = fleet.versions.failure()
    assert failure is not None
    assert (failure.version, failure.outcome) == ("2.0", "rolled-back")
    assert any("rolled back to the installed version" in line for line in fleet.lines)


def test_a_record_naming_a_path_for_a_version_is_no_version(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.install("1.0", "healthy")
    (fleet.versions.root / "active.json").write_text(
        json.dumps({"version": "../agent-versions/1.0"})
    )
    assert fleet.versions.active() is None


def test_a_version_removed_while_old_ones_are_pruned_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = VersionsDir(tmp_path)
    for number, version in enumerate(["1.0", "1.1", "1.2", "1.3", "1.4"]):
        versions.site(version).mkdir(parents=True)
        os.utime(tmp_path / version, (number, number))
    victim = str(tmp_path / "1.2")
    real_scandir, real_stat = os.scandir, os.stat
    stats = {"count": 0}

    def remove_victim() -> None:
        os.rmdir(f"{victim}/site")
        os.rmdir(victim)

    # Another prune (an agent's, a person's rm) removes 1.2 after it was listed and
    # before its time is read, whichever calls list and read it.
    def scandir_then_remove(path: object) -> object:
        entries = list(real_scandir(path))  # type: ignore[call-overload]
        if str(path) == str(tmp_path):
            remove_victim()
        return _Entries(entries)

    def stat_after_listing(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path) == victim:
            stats["count"] += 1
            if stats["count"] == 2:  # listed and seen to be a directory: now it goes
                remove_victim()
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(os, "scandir", scandir_then_remove)
        patch.setattr(os, "stat", stat_after_listing)
        versions.prune({"1.0", "1.4"})
    kept = sorted(path.name for path in tmp_path.iterdir() if path.is_dir())
    assert kept == ["1.0", "1.1", "1.3", "1.4"]  # the two newest others: 1.3, then 1.1


class _Entries(list[os.DirEntry[str]]):
    """A listing that is also the context manager os.scandir returns."""

    def __enter__(self) -> _Entries:
        return self

    def __exit__(self, *_: object) -> None:
        return None


# ---- unpacking durably -------------------------------------------------------------------


def _wheel(path: Path, *, corrupt: bool = False) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("greenfed/__init__.py", "")
        archive.writestr("greenfed/__main__.py", "print('the agent')\n")
        archive.writestr("greenfed/sub/module.py", "VALUE = 'intact'\n")
        archive.writestr(
            "greenfed-1.2.3.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: greenfed\nVersion: 1.2.3\n",
        )
    if corrupt:  # the last member's bytes changed: zipfile finds it out as it reads them
        data = path.read_bytes()
        path.write_bytes(data.replace(b"Version: 1.2.3\n", b"Version: 6.6.6\n", 1))
    return path


def test_every_unpacked_file_and_directory_is_on_disk_before_it_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut after the version is made active must not find its files empty:
    each is fsynced, then its directories, then the rename into place is."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("names open files through /proc")
    monkeypatch.setattr(os, "fsync", recording_fsync)
    root = tmp_path.resolve() / "agent-versions"
    root.mkdir()
    site = root / "1.2.3" / "site"
    unpack_wheel(_wheel(tmp_path / "a.whl"), site)
    monkeypatch.undo()
    assert (site / "greenfed" / "sub" / "module.py").read_text() == "VALUE = 'intact'\n"
    assert not site.with_name("site.partial").exists()
    partial = str(root / "1.2.3" / "site.partial")
    unpacked = [
        path.relative_to(site).as_posix()
        for path in sorted(site.rglob("*"))
        if path.is_file() or path.is_dir()
    ]
    # Written and fsynced where nothing looks for them yet, then renamed in whole.
    for name in unpacked:
        assert f"{partial}/{name}" in synced, name
    assert partial in synced
    assert synced.index(f"{partial}/greenfed/__main__.py") < synced.index(partial)
    assert synced[-2:] == [str(root / "1.2.3"), str(root)]  # the rename, the new version


def test_a_wheel_that_fails_to_unpack_leaves_nothing_in_place(tmp_path: Path) -> None:
    site = tmp_path / "agent-versions" / "1.2.3" / "site"
    with pytest.raises(PackageError):
        unpack_wheel(_wheel(tmp_path / "a.whl", corrupt=True), site)
    assert not site.exists()  # never a version with some of its files
    assert not site.with_name("site.partial").exists()
    unpack_wheel(_wheel(tmp_path / "b.whl"), site)  # a later attempt starts afresh
    assert (site / "greenfed" / "__main__.py").is_file()
