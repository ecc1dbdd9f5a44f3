"""What a node refuses and how it builds a worker's command line, checked without running
it: working_dirs that would undo the sandbox, the order of the sandbox's mounts, the
ulimits a container gets, and which uids tenants get. (tests/edge/test_hostile_races.py
tries the same things against real processes.)"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from edge.sandbox.bubblewrap import SHARED_TMP_DIRS, sandbox_argv
from edge.sandbox.containers import ContainerRuntime
from edge.sandbox.launcher import PrivatePaths, Sandbox
from edge.sandbox.probe import NodeIsolation
from edge.sandbox.users import WorkUser, WorkUsers
from edge.training.environment import WorkerSpecError
from shared.messages import DesiredTraining
from shared.sealing import SealedSecrets

DATA_DIR = Path("/var/lib/greenfed")
HIDDEN = Path("/etc/operator-secrets")
SETTINGS = Path("/etc/greenfed/agent.toml")
USER = WorkUser(70000, 70000, "greenfed-70000")
PODMAN = ContainerRuntime(name="podman", binary="/usr/bin/podman", version="4.3.1")
DOCKER = ContainerRuntime(name="docker", binary="/usr/bin/docker", version="24.0")


def node(
    tmp_path: Path, level: str = "sandbox", runtime: ContainerRuntime | None = None
) -> Sandbox:
    isolation = NodeIsolation(level, "test", runtime=runtime)  # type: ignore[arg-type]
    return Sandbox(
        isolation,
        inventory=(),
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(),
        private=PrivatePaths(directories=(DATA_DIR, HIDDEN), files=(SETTINGS,)),
    )


def worker(**fields: object) -> DesiredTraining:
    values: dict[str, object] = {
        "job_id": "J1",
        "attempt": 1,
        "command": ("python", "train.py"),
        "tenant": "acme",
    }
    values.update(fields)
    return DesiredTraining(**values)  # type: ignore[arg-type]


# ---- working_dirs that would undo the sandbox ------------------------------------------


@pytest.mark.parametrize("level", ["sandbox", "user"])
@pytest.mark.parametrize(
    ("working_dir", "reason"),
    [
        (
            "/",
            "working_dir / holds what a sandbox hides or replaces (the agent's private "
            "files, /dev, /proc, /sys, /tmp, /var/tmp): name a directory that holds none of it",
        ),
        (
            "/var/lib",
            "working_dir /var/lib holds what a sandbox hides or replaces (the agent's "
            "private files): name a directory that holds none of it",
        ),
        (
            "/etc",  # the operator's hidden_paths and the settings file are in it
            "working_dir /etc holds what a sandbox hides or replaces (the agent's "
            "private files): name a directory that holds none of it",
        ),
        (
            "/var",
            "working_dir /var holds what a sandbox hides or replaces (the agent's "
            "private files, /var/tmp): name a directory that holds none of it",
        ),
        ("/tmp", "working_dir /tmp holds what a sandbox hides or replaces (/tmp)"),
        ("/dev", "working_dir /dev holds what a sandbox hides or replaces (/dev)"),
        ("/proc/1", "working_dir /proc/1 is inside /proc, which a sandbox replaces"),
        ("/sys/fs/cgroup", "working_dir /sys/fs/cgroup is inside /sys, which a sandbox"),
        ("/dev/shm/x", "working_dir /dev/shm/x is inside /dev, which a sandbox replaces"),
        ("/var/lib/greenfed/state", "is inside the agent's private files"),
    ],
)
def test_a_working_dir_holding_what_a_sandbox_hides_or_replaces_is_refused(
    tmp_path: Path, level: str, working_dir: str, reason: str
) -> None:
    """Bound writable into the sandbox, `/` or a parent of the agent's data directory
    would lay the host's files, /proc and /tmp back over their stand-ins. Refused the
    same way on a node that does not sandbox, so a job fails alike everywhere."""
    assert reason in node(tmp_path, level).refusal(worker(working_dir=working_dir))


def test_a_working_dir_in_the_shared_tmp_is_refused_only_where_a_sandbox_replaces_it(
    tmp_path: Path,
) -> None:
    spec = worker(working_dir="/tmp/scratch")
    assert node(tmp_path, "sandbox").refusal(spec) == (
        "working_dir /tmp/scratch is inside /tmp, which a sandbox replaces with its own"
    )
    assert node(tmp_path, "user").refusal(spec) == ""  # the host's own /tmp: it is there


def test_ordinary_working_dirs_and_those_in_an_image_are_taken(tmp_path: Path) -> None:
    sandboxed = node(tmp_path, "sandbox", runtime=PODMAN)
    for working_dir in ("/srv/jobs/run-1", "/var/lib/other", "/home/alice/project"):
        assert sandboxed.refusal(worker(working_dir=working_dir)) == "", working_dir
    # In an image, `/` is the image's.
    assert sandboxed.refusal(worker(working_dir="/", image="ghcr.io/acme/train:1")) == ""


def test_a_working_dir_is_checked_again_where_it_really_is(tmp_path: Path) -> None:
    """What the spec names is checked when it arrives; the directory itself (its real
    path) when the worker is planned."""
    data = tmp_path / "data"
    (data / "state").mkdir(parents=True)
    sandbox = Sandbox(
        NodeIsolation("none", "test"),
        inventory=(),
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        private=PrivatePaths(directories=(data / "state",)),
    )
    with pytest.raises(WorkerSpecError, match="holds what a sandbox hides or replaces"):
        sandbox.plan(
            worker(working_dir=str(data)), SealedSecrets(), name="J1-1", started_file=tmp_path / "s"
        )


# ---- the sandbox's mounts: nothing the job names goes over a stand-in ------------------


def _mount_positions(argv: list[str]) -> dict[tuple[str, str], int]:
    """(option, where it mounts) -> its position among the mounts."""
    options = {"--ro-bind": 2, "--bind": 2, "--dev-bind": 2, "--tmpfs": 1, "--dev": 1, "--proc": 1}
    found: dict[tuple[str, str], int] = {}
    index = 1
    while index < len(argv) and argv[index] != "--":
        option = argv[index]
        width = options.get(option)
        if width is None:
            index += 2 if option in ("--perms", "--dir", "--chdir", "--hostname") else 1
            continue
        found[(option, argv[index + width])] = index
        index += width + 1
    return found


def test_every_stand_in_is_mounted_over_the_jobs_working_dir() -> None:
    """Were a working_dir of `/` (or a parent of a hidden path, or a link to one
    swapped in after it was checked) ever let through, the stand-ins still cover
    what it brings back: bubblewrap applies later mounts over earlier ones."""
    work_dir = f"{DATA_DIR}/work/J1-1/w0"
    argv = sandbox_argv(
        ("cat", "secret"),
        bubblewrap="/usr/bin/bwrap",
        user=USER,
        work_dir=work_dir,
        working_dir="/",
        hidden_dirs=[str(DATA_DIR), str(HIDDEN)],
        hidden_files=[str(SETTINGS)],
        devices=(),
        moved_env={},
    )
    mounts = _mount_positions(argv)
    working_dir = mounts[("--bind", "/")]
    assert mounts[("--ro-bind", "/")] < working_dir
    stand_ins = [
        ("--dev", "/dev"),
        ("--proc", "/proc"),
        *(("--tmpfs", d) for d in SHARED_TMP_DIRS),
        ("--tmpfs", str(DATA_DIR)),
        ("--tmpfs", str(HIDDEN)),
        ("--ro-bind", str(SETTINGS)),
    ]
    for stand_in in stand_ins:
        assert mounts[stand_in] > working_dir, stand_in
    # The work directory, inside the hidden data directory, is bound over its stand-in.
    assert mounts[("--bind", work_dir)] > mounts[("--tmpfs", str(DATA_DIR))]


def test_the_jobs_working_dir_is_entered_as_the_work_user_never_by_root() -> None:
    argv = sandbox_argv(
        ("python", "train.py"),
        bubblewrap="/usr/bin/bwrap",
        user=USER,
        work_dir="/w/J1-1/w0",
        working_dir="/srv/jobs/run-1",
        hidden_dirs=[],
        hidden_files=[],
        devices=(),
        moved_env={"LD_PRELOAD": "/x.so"},
    )
    # bubblewrap (root) enters the work directory only the agent names ...
    assert argv[argv.index("--chdir") + 1] == "/w/J1-1/w0"
    setpriv = next(i for i, arg in enumerate(argv) if arg.endswith("setpriv"))
    env = next(i for i, arg in enumerate(argv) if arg.endswith("/env"))
    # ... `env`, after setpriv dropped to the work user, the job's working_dir.
    assert setpriv < env
    assert argv[env + 1] == "--chdir=/srv/jobs/run-1"
    assert argv[-3:] == ["LD_PRELOAD=/x.so", "python", "train.py"]


# ---- a container's ulimits ---------------------------------------------------------------


def _container_argv(
    tmp_path: Path, runtime: ContainerRuntime, pids_limit: int = 32
) -> tuple[str, ...]:
    plan = node(tmp_path, "sandbox", runtime=runtime).plan(
        worker(image="ghcr.io/acme/train:1", pids_limit=pids_limit),
        SealedSecrets(),
        name="J1-1",
        started_file=tmp_path / "J1-1.started",
    )
    (process,) = plan["processes"]
    return tuple(process["argv"])


def _nproc(argv: tuple[str, ...]) -> list[str]:
    return [arg for arg in argv if arg.startswith("--ulimit=nproc=")]


@pytest.mark.parametrize("runtime", [PODMAN, DOCKER], ids=["podman", "docker"])
def test_a_containers_nproc_ulimit_is_never_the_workers_pids_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: ContainerRuntime
) -> None:
    """RLIMIT_NPROC counts every process of the user on the host: as the worker's pids
    limit, one job of a user running that many keeps the next from starting. The
    worker's cgroup (pids.max; docker's --pids-limit) holds its processes instead;
    the ulimit is as many as the kernel has pids: no limit in effect."""
    limits = {resource.RLIMIT_NOFILE: (1024, 4096), resource.RLIMIT_NPROC: (96000, 96367)}
    monkeypatch.setattr("edge.sandbox.containers.resource.getrlimit", limits.__getitem__)
    monkeypatch.setattr("edge.sandbox.containers._pid_max", lambda: 32768)
    argv = _container_argv(tmp_path, runtime, pids_limit=32)
    assert _nproc(argv) == ["--ulimit=nproc=32768:32768"]
    assert "--ulimit=nofile=1024:4096" in argv  # never the runtime's defaults
    if runtime.name == "docker":
        assert "--pids-limit=32" in argv


def test_a_containers_nproc_ulimit_stays_within_the_agents_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the agent's hard limit the runtime could not set it (no container would
    start); where nothing says how many, the runtime's default is left."""
    limits = {resource.RLIMIT_NOFILE: (1024, 4096), resource.RLIMIT_NPROC: (2000, 3000)}
    monkeypatch.setattr("edge.sandbox.containers.resource.getrlimit", limits.__getitem__)
    monkeypatch.setattr("edge.sandbox.containers._pid_max", lambda: 32768)
    assert _nproc(_container_argv(tmp_path, PODMAN)) == ["--ulimit=nproc=3000:3000"]
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr("edge.sandbox.containers.resource.getrlimit", lambda _: unlimited)
    monkeypatch.setattr("edge.sandbox.containers._pid_max", lambda: None)
    assert not [arg for arg in _container_argv(tmp_path, PODMAN) if "--ulimit=" in arg]
