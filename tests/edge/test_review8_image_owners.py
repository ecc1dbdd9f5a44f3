"""A node that forgets whose credentials pulled an image must not take it for a public
one: another tenant would run the private image from the shared store without the
registry asked (edge/sandbox/image_owners.py). And a job's working_dir is looked for
only as far as the job's user could look itself: the reason a refused attempt ends
with tells nothing of what lies behind a directory closed to it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from edge.sandbox import image_owners
from edge.sandbox.containers import ContainerRuntime
from edge.sandbox.image_owners import ImageOwners
from edge.sandbox.launcher import Sandbox
from edge.sandbox.probe import NodeIsolation
from edge.sandbox.users import WorkUsers
from edge.training.environment import WorkerSpecError
from edge.training.launch_plan import PrepareStep
from shared.messages import DesiredTraining
from shared.sealing import RegistryCredentials, SealedSecrets

PODMAN = ContainerRuntime(
    name="podman", binary="/usr/bin/podman", version="4.3.1", oci_runtime="runc", has_init=True
)
PRIVATE = "ghcr.io/acme/private-model:1"
# Smaller than an agent's, so that pushing acme's entry out takes a few jobs.
RECORDED_AT_MOST = 8


def worker(job_id: str, tenant: str, image: str | None, **fields: object) -> DesiredTraining:
    values: dict[str, object] = {"job_id": job_id, "attempt": 1, "command": ("true",)}
    values.update(fields, tenant=tenant, image=image)
    return DesiredTraining(**values)  # type: ignore[arg-type]


def credentials(username: str) -> SealedSecrets:
    return SealedSecrets(
        registry=RegistryCredentials(registry="ghcr.io", username=username, password="any")
    )


def node(tmp_path: Path, owners: ImageOwners) -> Sandbox:
    return Sandbox(
        NodeIsolation("none", "test", runtime=PODMAN, runtime_note="podman"),
        inventory=(),
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        image_owners=owners,
    )


def image_step(box: Sandbox, spec: DesiredTraining, secrets: SealedSecrets) -> PrepareStep:
    plan = box.plan(spec, secrets, name=f"{spec.job_id}-1", started_file=Path("/nonexistent"))
    (step,) = plan["prepare"]
    return step


def assert_pulled_again_for(box: Sandbox, tenant: str, job_id: str) -> None:
    """`tenant`'s job for acme's image asks the registry, and may not skip it."""
    step = image_step(box, worker(job_id, tenant, PRIVATE), SealedSecrets())
    assert (step["check"], step["run"][-1:]) == ((), (PRIVATE,))
    never = worker(f"{job_id}n", tenant, PRIVATE, image_pull_policy="never")
    assert "another tenant's registry credentials" in box.refusal(never)


@pytest.fixture
def few_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_owners, "MAX_IMAGES", RECORDED_AT_MOST)


@pytest.mark.usefixtures("few_remembered")
def test_jobs_naming_many_images_never_make_another_tenants_image_look_public(
    tmp_path: Path,
) -> None:
    (tmp_path / "state").mkdir()
    path = tmp_path / "state" / "image-owners.json"
    box = node(tmp_path, ImageOwners(path))
    image_step(box, worker("A", "acme", PRIVATE), credentials("acme"))
    # globex's jobs name throwaway images with bogus credentials (their pulls fail):
    # each one recorded, till acme's entry is pushed out.
    for n in range(RECORDED_AT_MOST + 2):
        image_step(box, worker(f"F{n}", "globex", f"ghcr.io/globex/junk{n}:1"), credentials("x"))
    assert_pulled_again_for(box, "globex", "B")
    # Nor once globex's own (bogus) credentials named it: the record then starts anew.
    image_step(box, worker("C", "globex", PRIVATE), credentials("x"))
    assert_pulled_again_for(box, "globex", "D")
    # Nor after a restart of the agent.
    assert_pulled_again_for(node(tmp_path, ImageOwners(path)), "globex", "E")


def test_an_unreadable_owners_file_makes_every_image_pulled_again(tmp_path: Path) -> None:
    path = tmp_path / "image-owners.json"
    box = node(tmp_path, ImageOwners(path))
    image_step(box, worker("A", "acme", PRIVATE), credentials("acme"))
    path.write_bytes(path.read_bytes()[:-3])  # cut short: what it said is lost
    restarted = node(tmp_path, ImageOwners(path))
    assert_pulled_again_for(restarted, "globex", "B")


def test_owners_the_disk_had_no_room_for_are_not_forgotten_by_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "image-owners.json"
    box = node(tmp_path, ImageOwners(path))
    image_step(box, worker("A", "acme", "ghcr.io/acme/other:1"), credentials("acme"))

    def full_disk(_path: Path, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(image_owners, "write_atomically", full_disk)
    image_step(box, worker("B", "acme", PRIVATE), credentials("acme"))
    assert_pulled_again_for(box, "globex", "C")  # known while the agent runs
    restarted = node(tmp_path, ImageOwners(path))
    assert_pulled_again_for(restarted, "globex", "D")


def test_what_lies_behind_a_directory_closed_to_the_jobs_user_is_never_told(
    tmp_path: Path,
) -> None:
    # Another user's home: only its owner (never the job's user) may search it.
    closed = tmp_path / "home"
    (closed / "acquisition-plan").mkdir(parents=True)
    (closed / "q3-layoffs").mkdir()
    (closed / "to-elsewhere").symlink_to(closed / "q3-layoffs")
    os.chmod(closed, 0o700)
    box = Sandbox(
        NodeIsolation("user", "test"),
        inventory=(),
        work_root=tmp_path / "work",
        credentials_dir=tmp_path / "credentials",
        users=WorkUsers(uid_range=(70000, 70010), taken_on_host=lambda _number: False),
    )
    reasons = set()
    for n, name in enumerate(("acquisition-plan", "nothing-here", "to-elsewhere")):
        spec = worker(f"J{n}", "mallory", None, working_dir=str(closed / name))
        assert box.refusal(spec) == ""
        with pytest.raises(WorkerSpecError) as refused:
            box.plan(spec, SealedSecrets(), name=f"J{n}-1", started_file=tmp_path / "s")
        reasons.add(str(refused.value).replace(name, "NAME"))
    # The same words whether it exists, is missing or is a link (and where to).
    assert reasons == {
        f"working_dir {closed}/NAME is not a directory the job's user (uid 70000) may enter"
    }
