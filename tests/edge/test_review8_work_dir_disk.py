"""Workers' work directories can live on a filesystem of their own (`agent.work_dir`):
nothing limits what a job writes to its work directory ($HOME), and on the data
directory's filesystem a job that fills it costs the agent its state and outbox writes
and turns every other tenant's job away ("No space left on device"). `greenfed edge
doctor` warns where a contained node keeps them on the data directory's filesystem."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import edge.sandbox.setup as setup
from edge.doctor import check_work_dir
from edge.sandbox.probe import NodeIsolation
from edge.sandbox.setup import TrainingSetup, set_up_training
from shared.messages import DesiredTraining
from shared.sealing import SealedSecrets
from shared.settings import AgentSettings, ConfigError, Settings, load_settings
from tests.support.sandboxed_node import (
    TESTS_ROOT,
    SandboxedNode,
    make_node,
    require_isolation_tools,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def unisolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the node can do is probed elsewhere: here every node gives `none`, which
    needs neither root nor cgroups, and makes work directories all the same."""
    monkeypatch.setattr(
        setup, "probe_isolation", lambda *args, **kwargs: NodeIsolation("none", "test")
    )


def node(tmp_path: Path, **agent: object) -> Settings:
    fields: dict[str, object] = {"data_dir": str(tmp_path / "data"), "training_enabled": True}
    return Settings(agent=AgentSettings(**(fields | agent)))  # type: ignore[arg-type]


def home_of_first_worker(training: TrainingSetup, tmp_path: Path) -> Path:
    plan = training.sandbox((), 4096).plan(
        DesiredTraining(job_id="J1", attempt=1, command=("true",), tenant="acme"),
        SealedSecrets(),
        name="J1-1",
        started_file=tmp_path / "J1-1.started",
    )
    (process,) = plan["processes"]
    return Path(process["env"]["HOME"])


@pytest.mark.usefixtures("unisolated")
def test_workers_work_on_the_filesystem_agent_work_dir_names(tmp_path: Path) -> None:
    work_root = tmp_path / "scratch-disk" / "greenfed-work"
    training = set_up_training(node(tmp_path, work_dir=str(work_root)), None)

    home = home_of_first_worker(training, tmp_path)

    assert home == work_root / "J1-1" / "w0"
    assert home.is_dir()
    assert not (tmp_path / "data" / "work").exists()  # nothing on the data directory's disk
    # Hidden from sandboxes as the default one inside the data directory is.
    assert work_root in training.private.directories


@pytest.mark.usefixtures("unisolated")
def test_without_agent_work_dir_work_directories_stay_in_the_data_directory(
    tmp_path: Path,
) -> None:
    training = set_up_training(node(tmp_path), None)

    assert home_of_first_worker(training, tmp_path) == tmp_path / "data" / "work" / "J1-1" / "w0"
    assert training.private.directories == (tmp_path / "data",)


@pytest.mark.usefixtures("unisolated")
def test_a_work_dir_reached_through_a_link_is_used_by_its_real_path(tmp_path: Path) -> None:
    disk = tmp_path / "scratch-disk"
    disk.mkdir()
    (tmp_path / "work-link").symlink_to(disk)
    training = set_up_training(node(tmp_path, work_dir=str(tmp_path / "work-link")), None)

    assert home_of_first_worker(training, tmp_path) == disk / "J1-1" / "w0"
    assert disk in training.private.directories


@pytest.mark.parametrize(
    ("work_dir", "words"),
    [
        ("work", "must be an absolute path"),
        ("/", "without '.' or '..'"),
        ("/srv/../var/lib/greenfed", "without '.' or '..'"),
        ("/var/lib/greenfed", "holds the agent's data directory"),
        ("/var/lib", "holds the agent's data directory"),
        ("/var/lib/greenfed/state/work", "inside the agent's data directory"),
    ],
)
def test_a_work_dir_that_cannot_hold_work_directories_is_refused_by_its_key(
    tmp_path: Path, work_dir: str, words: str
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\ndata_dir = "/var/lib/greenfed"\nwork_dir = "{work_dir}"\n')

    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})

    assert caught.value.key == "agent.work_dir"
    assert "agent.work_dir" in str(caught.value)
    assert words in str(caught.value)


def test_the_default_place_may_be_named_and_any_directory_elsewhere(tmp_path: Path) -> None:
    for work_dir in ("/var/lib/greenfed/work", "/srv/greenfed-work", "/var/lib/greenfed-work"):
        config = tmp_path / "agent.toml"
        config.write_text(f'[agent]\ndata_dir = "/var/lib/greenfed"\nwork_dir = "{work_dir}"\n')
        assert load_settings(config, environ={}).agent.resolved_work_dir() == Path(work_dir)


@pytest.mark.usefixtures("unisolated")
def test_a_link_to_the_data_directory_is_refused_when_the_agent_starts(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "sneaky").symlink_to(tmp_path / "data")

    with pytest.raises(ConfigError) as caught:
        set_up_training(node(tmp_path, work_dir=str(tmp_path / "sneaky")), None)

    assert caught.value.key == "agent.work_dir"


@pytest.fixture(params=["sandbox", "user"])
def node_with_work_dir(request: pytest.FixtureRequest) -> Iterator[tuple[SandboxedNode, Path]]:
    """A real node (root, real users, bubblewrap) whose work directories are outside
    its data directory, below a parent its workers may pass as a mount's would be."""
    require_isolation_tools()
    TESTS_ROOT.mkdir(mode=0o755, exist_ok=True)
    scratch = TESTS_ROOT / f"scratch-{uuid.uuid4().hex[:10]}"
    scratch.mkdir(mode=0o755)
    try:
        for node in make_node(request.param, work_dir=str(scratch / "work")):
            yield node, scratch / "work"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def test_a_contained_worker_writes_only_where_agent_work_dir_says(
    node_with_work_dir: tuple[SandboxedNode, Path],
) -> None:
    node, work_root = node_with_work_dir
    spec = node.worker('echo "home=$HOME"; echo data > "$HOME/written" && echo wrote')

    status, output = await node.run(spec, timeout_s=30)

    assert status.state == "succeeded", output
    assert f"home={work_root}/{spec.job_id}-{spec.attempt}/w0" in output
    assert "wrote" in output
    assert not (node.data_dir / "work").exists()


def stat_with_devices(devices: dict[Path, int]) -> Callable[[Path], os.stat_result]:
    """A stat whose device id is that of the nearest listed directory above the path
    (as mounts are): filesystems that tests cannot mount unprivileged."""

    def fake_stat(path: Path) -> os.stat_result:
        for candidate in (path, *path.parents):
            if candidate in devices:
                return os.stat_result((0o40755, 1, devices[candidate], 2, 0, 0, 4096, 0, 0, 0))
        raise FileNotFoundError(path)

    return fake_stat


@pytest.mark.parametrize("level", ["sandbox", "user"])
def test_doctor_warns_when_work_directories_share_the_data_directorys_filesystem(
    tmp_path: Path, level: str
) -> None:
    one_disk = stat_with_devices({Path("/"): 1})

    check = check_work_dir(node(tmp_path), NodeIsolation(level, "test"), stat_path=one_disk)  # type: ignore[arg-type]

    assert check.verdict == "warn"
    assert str(tmp_path / "data" / "work") in check.detail
    assert "agent.work_dir" in check.fix


@pytest.mark.parametrize("level", ["sandbox", "user"])
def test_doctor_is_content_when_work_directories_have_a_filesystem_of_their_own(
    tmp_path: Path, level: str
) -> None:
    scratch = tmp_path / "scratch"  # mounted there; the work root is made on first use
    two_disks = stat_with_devices({Path("/"): 1, scratch: 2})
    settings = node(tmp_path, work_dir=str(scratch / "greenfed-work"))

    check = check_work_dir(settings, NodeIsolation(level, "test"), stat_path=two_disks)  # type: ignore[arg-type]

    assert check.verdict == "ok"


def test_doctor_skips_nodes_that_contain_no_workers(tmp_path: Path) -> None:
    one_disk = stat_with_devices({Path("/"): 1})
    assert check_work_dir(node(tmp_path), None, stat_path=one_disk).verdict == "skip"
    unisolated = NodeIsolation("none", "test")
    assert check_work_dir(node(tmp_path), unisolated, stat_path=one_disk).verdict == "skip"


def test_doctor_compares_the_real_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no /dev/shm on a filesystem apart from the test's directory")
    sandbox = NodeIsolation("sandbox", "test")
    apart = node(tmp_path, work_dir=str(shm / f"greenfed-review8-{os.getpid()}"))
    together = node(tmp_path, work_dir=str(tmp_path / "work-elsewhere"))

    assert check_work_dir(apart, sandbox).verdict == "ok"
    assert check_work_dir(together, sandbox).verdict == "warn"
