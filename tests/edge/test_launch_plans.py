"""A worker's launch plan as the node's sandbox builds it (edge/sandbox/launcher.py),
without running it: what a container's command line holds and what it never holds,
where registry credentials go and that they go away, what a node refuses to run."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from edge.sandbox.containers import ContainerRuntime, auth_file
from edge.sandbox.image_owners import ImageOwners
from edge.sandbox.launcher import Sandbox
from edge.sandbox.probe import NodeIsolation
from edge.sandbox.users import WorkUsers
from edge.training.environment import WorkerSpecError
from edge.training.launch_plan import LaunchPlan
from shared.messages import DesiredTraining
from shared.sealing import RegistryCredentials, SealedSecrets
from tests.support.inventory import nvidia_gpus

PODMAN = ContainerRuntime(
    name="podman", binary="/usr/bin/podman", version="4.3.1", oci_runtime="runc", has_init=True
)
SECRET = "token-never-on-a-command-line"
GPUS = nvidia_gpus(2)


def sandbox(
    tmp_path: Path, level: str = "none", runtime: ContainerRuntime | None = PODMAN
) -> Sandbox:
    isolation = NodeIsolation(level, "test", runtime=runtime, runtime_note="podman 4.3.1")  # type: ignore[arg-type]
    return Sandbox(
        isolation,
        inventory=GPUS,
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(),
    )


def worker(**fields: object) -> DesiredTraining:
    values: dict[str, object] = {
        "job_id": "J1",
        "attempt": 1,
        "command": ("python", "train.py"),
        "tenant": "acme",
        "image": "ghcr.io/acme/trainer:2",
        "secret_names": ("API_TOKEN",),
        "pids_limit": 512,
    }
    values.update(fields)
    return DesiredTraining(**values)  # type: ignore[arg-type]


def test_a_container_gets_its_environment_by_name_and_never_a_value_on_its_command_line(
    tmp_path: Path,
) -> None:
    plan = sandbox(tmp_path).plan(
        worker(env={"EPOCHS": "3"}, accelerator_ids=("gpu1",)),
        SealedSecrets(env={"API_TOKEN": SECRET}),
        name="J1-1",
        started_file=tmp_path / "J1-1.started",
    )
    (process,) = plan["processes"]
    argv = " ".join(process["argv"])
    assert SECRET not in argv
    assert "--env=API_TOKEN" in process["argv"]
    assert "--env=EPOCHS" in process["argv"]
    assert "--env=PATH" not in process["argv"]  # the image's own PATH
    assert process["env"]["API_TOKEN"] == SECRET  # what the runtime client passes on
    # Never the runtime's defaults, nor the pids limit as RLIMIT_NPROC (it counts the
    # user's processes host-wide: tests/edge/test_sandbox_hardening.py).
    assert any(arg.startswith("--ulimit=nofile=") for arg in process["argv"])
    assert "--ulimit=nproc=512:512" not in process["argv"]
    assert "--pull=never" in process["argv"]  # pulled before, as the policy says
    assert "--cap-drop=all" in process["argv"]
    assert "--runtime=runc" in argv
    assert process["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert plan["cleanup"] == (
        (
            "/usr/bin/podman",
            "--cgroup-manager=cgroupfs",
            "--runtime=runc",
            "rm",
            "--force",
            "greenfed-J1-1-w0",
        ),
    )
    (step,) = plan["prepare"]
    assert step["check"][-3:] == ("image", "exists", "ghcr.io/acme/trainer:2")
    assert step["run"][-2:] == ("pull", "ghcr.io/acme/trainer:2")


def test_a_container_runtime_client_never_takes_the_jobs_own_configuration(
    tmp_path: Path,
) -> None:
    """podman runs as root: the job's CONTAINERS_CONF (a hook of its own, run as root),
    LD_PRELOAD or PATH must not be in its environment; the container still gets them."""
    job_env = {"CONTAINERS_CONF": "/tmp/x/c.conf", "LD_PRELOAD": "/tmp/x/e.so", "EPOCHS": "3"}
    plan = sandbox(tmp_path).plan(
        worker(env=job_env), SealedSecrets(env={"API_TOKEN": SECRET}), name="J1-1",
        started_file=tmp_path / "J1-1.started",
    )  # fmt: skip
    (process,) = plan["processes"]
    assert "CONTAINERS_CONF" not in process["env"]
    assert "LD_PRELOAD" not in process["env"]
    assert process["env"]["PATH"].startswith("/usr/local/sbin:")  # not the job's
    assert "--env=CONTAINERS_CONF=/tmp/x/c.conf" in process["argv"]
    assert "--env=LD_PRELOAD=/tmp/x/e.so" in process["argv"]
    assert "--env=EPOCHS" in process["argv"]
    assert process["env"]["API_TOKEN"] == SECRET  # secrets by name, never as values
    assert SECRET not in " ".join(process["argv"])


def test_a_secret_named_like_a_root_sensitive_variable_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerSpecError, match="secret LD_PRELOAD"):
        sandbox(tmp_path, level="user").plan(
            worker(image=None, secret_names=("LD_PRELOAD",)),
            SealedSecrets(env={"LD_PRELOAD": SECRET}),
            name="J1-1",
            started_file=tmp_path / "J1-1.started",
        )


def test_registry_credentials_go_to_a_root_only_file_removed_once_pulled(tmp_path: Path) -> None:
    credentials = RegistryCredentials(registry="ghcr.io", username="ci", password=SECRET)
    plan = sandbox(tmp_path).plan(
        worker(secret_names=()),
        SealedSecrets(registry=credentials),
        name="J1-1",
        started_file=tmp_path / "J1-1.started",
    )
    (step,) = plan["prepare"]
    [authfile] = [arg.split("=", 1)[1] for arg in step["run"] if arg.startswith("--authfile=")]
    path = Path(authfile)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text())["auths"]["ghcr.io"]["auth"]  # base64 of ci:password
    assert str(path.parent) in plan["remove_after_prepare"]
    assert SECRET not in " ".join(step["run"])


def test_never_pulling_only_checks_that_the_image_is_there(tmp_path: Path) -> None:
    plan = sandbox(tmp_path).plan(
        worker(image_pull_policy="never", secret_names=()),
        SealedSecrets(),
        name="J1-1",
        started_file=tmp_path / "J1-1.started",
    )
    (step,) = plan["prepare"]
    assert step["run"] == ()
    assert step["error"] == (
        "image ghcr.io/acme/trainer:2 is not on this node (image_pull_policy never)"
    )


@pytest.mark.parametrize(
    ("level", "runtime", "spec", "reason"),
    [
        ("unavailable", PODMAN, worker(image=None), "this node runs no work it cannot isolate"),
        ("user", PODMAN, worker(image=None, min_isolation="sandbox"), "asks for isolation sandbox"),
        ("sandbox", None, worker(), "no container runtime"),
    ],
)
def test_a_node_refuses_what_it_cannot_give_saying_why(
    tmp_path: Path,
    level: str,
    runtime: ContainerRuntime | None,
    spec: DesiredTraining,
    reason: str,
) -> None:
    assert reason in sandbox(tmp_path, level, runtime).refusal(spec)


def test_a_working_dir_inside_the_agents_private_files_is_refused(tmp_path: Path) -> None:
    from edge.sandbox.launcher import PrivatePaths

    private = Sandbox(
        NodeIsolation("sandbox", "test"),
        inventory=GPUS,
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(),
        private=PrivatePaths(directories=(tmp_path / "data",)),
    )
    spec = worker(image=None, working_dir=str(tmp_path / "data" / "state"))
    assert "inside the agent's private files" in private.refusal(spec)


def test_devices_that_cannot_be_shared_equally_among_a_nodes_workers_are_refused(
    tmp_path: Path,
) -> None:
    spec = worker(
        image=None, secret_names=(), processes=2, accelerator_ids=("gpu0", "gpu1", "gpu1")
    )
    with pytest.raises(WorkerSpecError, match="cannot be shared equally"):
        sandbox(tmp_path).plan(spec, SealedSecrets(), name="J1-1", started_file=tmp_path / "s")


def plan_of(box: Sandbox, spec: DesiredTraining, secrets: SealedSecrets) -> LaunchPlan:
    return box.plan(spec, secrets, name=f"{spec.job_id}-1", started_file=Path("/nonexistent"))


def test_an_image_another_tenants_credentials_pulled_is_pulled_again_with_ones_own(
    tmp_path: Path,
) -> None:
    # One image store for every tenant: acme's private image, pulled with acme's
    # credentials, ran for globex asking `if-not-present` without the registry asked.
    owners = ImageOwners(tmp_path / "state" / "image-owners.json")
    (tmp_path / "state").mkdir()
    box = Sandbox(
        NodeIsolation("none", "test", runtime=PODMAN, runtime_note="podman"),
        inventory=GPUS,
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(),
        image_owners=owners,
    )
    private = "ghcr.io/acme/private:2"
    credentials = RegistryCredentials(registry="ghcr.io", username="ci", password=SECRET)
    plan_of(
        box, worker(job_id="A", image=private, secret_names=()), SealedSecrets(registry=credentials)
    )
    # acme again: as it asks (checked first, pulled only when missing).
    (own,) = plan_of(box, worker(job_id="B", image=private, secret_names=()), SealedSecrets())[
        "prepare"
    ]
    assert own["check"]
    # globex: never from the store unasked; the registry decides, on globex's own.
    theirs = worker(job_id="C", tenant="globex", image=private, secret_names=())
    (step,) = plan_of(box, theirs, SealedSecrets())["prepare"]
    assert (step["check"], step["run"][-1]) == ((), private)
    assert not [arg for arg in step["run"] if arg.startswith("--authfile")]
    never = worker(job_id="D", tenant="globex", image=private, image_pull_policy="never")
    assert "another tenant's registry credentials" in box.refusal(never)
    # Remembered across a restart of the agent.
    again = ImageOwners(tmp_path / "state" / "image-owners.json")
    assert again.others_than(private, "globex") == ["acme"]


def test_a_node_is_asked_for_an_image_by_its_qualified_name(tmp_path: Path) -> None:
    # podman runs a local evil.example/acme/trainer:2 for a bare acme/trainer:2.
    plan = plan_of(
        sandbox(tmp_path), worker(image="acme/trainer:2", secret_names=()), SealedSecrets()
    )
    (step,) = plan["prepare"]
    assert step["check"][-1] == "docker.io/acme/trainer:2"
    assert step["run"][-1] == "docker.io/acme/trainer:2"
    (process,) = plan["processes"]
    assert "docker.io/acme/trainer:2" in process["argv"]
    assert "acme/trainer:2" not in [
        arg for arg in process["argv"] if arg != "docker.io/acme/trainer:2"
    ]


def test_docker_hub_credentials_are_under_the_key_docker_reads_too() -> None:
    written = json.loads(auth_file("docker.io", "ci", "pw"))["auths"]
    assert set(written) == {"docker.io", "https://index.docker.io/v1/"}
    assert set(json.loads(auth_file("ghcr.io", "ci", "pw"))["auths"]) == {"ghcr.io"}


DIGEST = "sha256:" + "5e" * 32


@pytest.mark.parametrize(
    ("pulled_as", "named_as"),
    [
        ("ghcr.io/acme/private", "ghcr.io/acme/private:latest"),
        ("ghcr.io/acme/private:latest", "ghcr.io/acme/private"),
        ("ghcr.io/acme/private:2", f"ghcr.io/acme/private@{DIGEST}"),
        ("ghcr.io/acme/private:2", f"ghcr.io/acme/private:3@{DIGEST}"),
        ("ghcr.io/acme/private:2", "ghcr.io/acme/private:3"),
        ("ghcr.io/acme/private:2", "GHCR.io/acme/private:2"),
        ("acme/private", "docker.io/acme/private:latest"),
        ("acme/private:2", "index.docker.io/acme/private:2"),
        ("python", "docker.io/python:latest"),
        ("docker.io/library/python:3.12", "library/python:3.12"),
        ("localhost:5000/private", "localhost:5000/private:latest"),
    ],
)
def test_an_image_another_tenants_credentials_pulled_is_theirs_however_it_is_spelled(
    tmp_path: Path, pulled_as: str, named_as: str
) -> None:
    # The runtime's store runs one image for every spelling of its reference (an added
    # ':latest', its digest, Docker Hub's long forms), and a registry gives a repository's
    # tags and digests to whoever may pull one of them: the repository is what is owned.
    owners = ImageOwners(tmp_path / "image-owners.json")
    box = Sandbox(
        NodeIsolation("none", "test", runtime=PODMAN, runtime_note="podman"),
        inventory=GPUS,
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(),
        image_owners=owners,
    )
    credentials = RegistryCredentials(registry="", username="ci", password=SECRET)
    plan_of(
        box,
        worker(job_id="A", image=pulled_as, secret_names=()),
        SealedSecrets(registry=credentials),
    )
    theirs = worker(job_id="C", tenant="globex", image=named_as, secret_names=())
    (step,) = plan_of(box, theirs, SealedSecrets())["prepare"]
    assert step["check"] == ()  # never from the store unasked: pulled, on globex's own
    assert step["run"]
    assert not [arg for arg in step["run"] if arg.startswith("--authfile")]
    never = worker(job_id="D", tenant="globex", image=named_as, image_pull_policy="never")
    assert "another tenant's registry credentials" in box.refusal(never)
    # acme's own spelling of it is acme's, as it asks.
    mine = worker(job_id="E", image=named_as, secret_names=())
    (own,) = plan_of(box, mine, SealedSecrets())["prepare"]
    assert own["check"]


def test_images_remembered_before_an_upgrade_are_still_known_by_any_spelling(
    tmp_path: Path,
) -> None:
    # What an older agent wrote: references as the jobs spelled them.
    path = tmp_path / "image-owners.json"
    path.write_text(json.dumps({"ghcr.io/acme/private": ["acme"]}), encoding="utf-8")
    owners = ImageOwners(path)
    assert owners.others_than("ghcr.io/acme/private:latest", "globex") == ["acme"]
    assert owners.others_than(f"ghcr.io/acme/private@{DIGEST}", "globex") == ["acme"]
    assert owners.others_than("ghcr.io/acme/public:latest", "globex") == []


def _runtime_holding(tmp_path: Path, *names: str) -> ContainerRuntime:
    """podman as far as an image's names go: every reference finds an image of `names`."""
    binary = tmp_path / "podman"
    binary.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(names) + "\n", encoding="utf-8")
    binary.chmod(0o755)
    return ContainerRuntime(name="podman", binary=str(binary), version="4.3.1", has_init=True)


@pytest.mark.parametrize(
    ("held_as", "pulled_again"),
    [
        (("ghcr.io/acme/private:2", f"ghcr.io/acme/private@{DIGEST}"), True),
        (("ghcr.io/acme/private:2", f"docker.io/library/anything@{DIGEST}"), False),
        ((), False),
    ],
)
def test_a_digest_finds_another_tenants_image_under_any_name_and_is_pulled_again(
    tmp_path: Path, held_as: tuple[str, ...], pulled_again: bool
) -> None:
    # podman runs `anything@sha256:<d>` from the image it holds as ghcr.io/acme/private:2.
    owners = ImageOwners()
    owners.record("ghcr.io/acme/private:2", "acme")
    runtime = _runtime_holding(tmp_path, *held_as)
    box = Sandbox(
        NodeIsolation("none", "test", runtime=runtime, runtime_note="podman"),
        inventory=GPUS,
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(),
        image_owners=owners,
    )
    named = f"anything@{DIGEST}"
    theirs = worker(job_id="C", tenant="globex", image=named, secret_names=())
    (step,) = plan_of(box, theirs, SealedSecrets())["prepare"]
    assert (step["check"] == ()) == pulled_again
    never = worker(job_id="D", tenant="globex", image=named, image_pull_policy="never")
    if pulled_again:
        with pytest.raises(WorkerSpecError, match="another tenant's registry credentials"):
            plan_of(box, never, SealedSecrets())
    else:
        assert plan_of(box, never, SealedSecrets())["prepare"][0]["check"]
    # acme's own job finds its own image.
    mine = worker(job_id="E", image=named, secret_names=())
    assert plan_of(box, mine, SealedSecrets())["prepare"][0]["check"]
