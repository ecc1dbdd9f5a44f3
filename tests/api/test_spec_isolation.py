"""A training job's isolation fields (issue 24): secret_env beside env, an image with its
pull policy and registry credentials, a pids limit, the least isolation, the launch
mode; each refusal names the field at fault, and the scheduler gets what it filters on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from cloud.scheduler.model import TrainingJob
from cloud.work.convert import check_convertible, training_job
from cloud.work.specs import (
    MAX_SECRET_BYTES,
    TrainingJobSpec,
    check_submitted_secrets,
    describe_error,
)
from greenfed.spec_files import SpecFileError, load_spec_file
from shared.errors import FieldError, json_path
from shared.images import qualified, registry_of
from shared.worker_env import RUNNER_VARIABLES


def job(**fields: Any) -> dict[str, Any]:
    return {"name": "a", "command": ["python", "train.py"], **fields}


def test_the_new_fields_have_defaults_that_ask_for_nothing() -> None:
    spec = msgspec.convert(job(), TrainingJobSpec)
    assert spec.secret_env == {}
    assert (spec.image, spec.image_pull_policy, spec.registry_auth) == (
        None,
        "if-not-present",
        None,
    )
    assert (spec.isolation, spec.launch, spec.pids_limit) == ("none", "per-worker", None)
    assert not spec.has_secrets
    converted = training_job(spec, work_id="w1", tenant="acme", submitted_at=0.0)
    assert (converted.isolation, converted.image, converted.has_secrets) == ("none", None, False)


def test_a_full_spec_round_trips_and_converts() -> None:
    spec = msgspec.convert(
        job(
            env={"EPOCHS": "3"},
            secret_env={"HF_TOKEN": "hf_x", "AWS_SECRET_ACCESS_KEY": "aws"},
            image="ghcr.io/acme/trainer:2.1",
            image_pull_policy="always",
            registry_auth={"username": "ci", "password": "pw"},
            isolation="user",
            launch="per-node",
            pids_limit=512,
        ),
        TrainingJobSpec,
    )
    assert msgspec.json.decode(msgspec.json.encode(spec), type=TrainingJobSpec) == spec
    assert spec.has_secrets
    assert spec.image_registry() == "ghcr.io"
    converted = training_job(spec, work_id="w1", tenant="acme", submitted_at=0.0)
    assert (converted.isolation, converted.image, converted.has_secrets) == (
        "user",
        "ghcr.io/acme/trainer:2.1",
        True,
    )
    # A registry password alone is a secret too.
    only_auth = msgspec.structs.replace(spec, secret_env={})
    assert only_auth.has_secrets


@pytest.mark.parametrize(
    ("own", "cluster", "expected"),
    [
        ("none", "none", "none"),
        ("none", "sandbox", "sandbox"),
        ("sandbox", "user", "sandbox"),
        ("user", "none", "user"),
    ],
)
def test_the_cluster_minimum_raises_a_jobs_isolation(own: str, cluster: str, expected: str) -> None:
    spec = msgspec.convert(job(isolation=own), TrainingJobSpec)
    converted = training_job(
        spec,
        work_id="w1",
        tenant="acme",
        submitted_at=0.0,
        min_isolation=cluster,  # type: ignore[arg-type]
    )
    assert isinstance(converted, TrainingJob)
    assert converted.isolation == expected


@pytest.mark.parametrize(
    ("fields", "path", "reason"),
    [
        ({"env": {"LOCAL_RANK": "1"}}, "$.env", "LOCAL_RANK is set by greenfed"),
        ({"env": {"RANK": "1", "NNODES": "2"}}, "$.env", "NNODES, RANK are set by greenfed"),
        ({"secret_env": {"WORLD_SIZE": "x"}}, "$.secret_env.WORLD_SIZE", "set by greenfed"),
        (
            {"env": {"TOKEN": "a"}, "secret_env": {"TOKEN": "b"}},
            "$.secret_env.TOKEN",
            "TOKEN is in env too",
        ),
        ({"secret_env": {"bad name": "v"}}, "$.secret_env", ""),
        (
            {"registry_auth": {"username": "u", "password": "p"}},
            "$.registry_auth",
            "name the image",
        ),
        (
            {"image": "x", "registry_auth": {"username": "u", "password": ""}},
            "$.registry_auth.password",
            "",
        ),
        (
            {
                "image": "x",
                "registry_auth": {"registry": "no/slash", "username": "u", "password": "p"},
            },
            "$.registry_auth.registry",
            "",
        ),
        ({"image": "Bad Image"}, "$.image", ""),
        ({"image": "a//b"}, "$.image", ""),
        ({"image": "x:"}, "$.image", ""),
        ({"image": "a" * 513}, "$.image", ""),
        ({"image_pull_policy": "sometimes"}, "$.image_pull_policy", ""),
        ({"isolation": "unavailable"}, "$.isolation", ""),
        ({"launch": "per-gpu"}, "$.launch", ""),
        ({"pids_limit": 15}, "$.pids_limit", ""),
        ({"pids_limit": 4_194_305}, "$.pids_limit", ""),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(msgspec.ValidationError) as error:
        msgspec.convert(job(**fields), TrainingJobSpec)
    name, why = describe_error(error.value)
    assert name == path
    assert reason in why


def test_every_runner_variable_is_refused_in_env_and_secret_env() -> None:
    for variable in sorted(RUNNER_VARIABLES):
        for field in ("env", "secret_env"):
            with pytest.raises(msgspec.ValidationError):
                msgspec.convert(job(**{field: {variable: "1"}}), TrainingJobSpec)


@pytest.mark.parametrize(
    "image",
    [
        "python",
        "python:3.12-slim",
        "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "ghcr.io/acme/trainer:2.1",
        "localhost:5000/job",
        "registry.example.com:443/team/a_b__c-d:v1.0",
        "nvcr.io/nvidia/pytorch@sha256:" + "0a" * 32,
        "quay.io/a/b:tag@sha256:" + "f" * 64,
    ],
)
def test_image_references_runtimes_take_are_accepted(image: str) -> None:
    assert msgspec.convert(job(image=image), TrainingJobSpec).image == image


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("python:3.12", "docker.io"),
        ("pytorch/pytorch:2", "docker.io"),
        ("ghcr.io/acme/t", "ghcr.io"),
        ("localhost/x", "localhost"),
        ("localhost:5000/x", "localhost:5000"),
        ("Registry/x", "Registry"),
    ],
)
def test_the_registry_of_an_image(image: str, registry: str) -> None:
    assert registry_of(image) == registry


@pytest.mark.parametrize(
    ("image", "spelled_out"),
    [
        ("python:3.12", "docker.io/library/python:3.12"),
        ("acme/trainer:2", "docker.io/acme/trainer:2"),
        ("docker.io/acme/trainer:2", "docker.io/acme/trainer:2"),
        ("ghcr.io/acme/t@sha256:" + "a" * 64, "ghcr.io/acme/t@sha256:" + "a" * 64),
        ("localhost/x", "localhost/x"),
        ("localhost:5000/x", "localhost:5000/x"),
    ],
)
def test_nodes_get_image_names_with_their_registry_spelled_out(
    image: str, spelled_out: str
) -> None:
    # podman resolves a short name against any local image of that path, whoever
    # pulled it: another tenant's evil.example/acme/trainer:2 ran for acme/trainer:2.
    assert qualified(image) == spelled_out
    assert registry_of(qualified(image)) == registry_of(image)


def test_registry_auth_may_name_its_registry() -> None:
    spec = msgspec.convert(
        job(
            image="acme/trainer",
            registry_auth={"registry": "mirror.example.com:8443", "username": "u", "password": "p"},
        ),
        TrainingJobSpec,
    )
    assert spec.image_registry() == "mirror.example.com:8443"


def test_secret_sizes_are_checked_on_the_plaintext() -> None:
    at_limit = msgspec.convert(job(secret_env={"A": "x" * MAX_SECRET_BYTES}), TrainingJobSpec)
    check_submitted_secrets(at_limit)

    one_too_many = msgspec.convert(
        job(secret_env={"A": "x" * (MAX_SECRET_BYTES + 1)}), TrainingJobSpec
    )
    with pytest.raises(FieldError) as refused:
        check_submitted_secrets(one_too_many)
    assert json_path(refused.value.path) == "$.secret_env.A"

    # Each within bounds, together not: the value that crosses the limit is named.
    half = "é" * (MAX_SECRET_BYTES // 4 + 1)  # two bytes each in UTF-8
    together = msgspec.convert(job(secret_env={"A": half, "B": half}), TrainingJobSpec)
    with pytest.raises(FieldError) as refused:
        check_submitted_secrets(together)
    assert json_path(refused.value.path) == "$.secret_env.B"
    assert "together" in refused.value.reason

    password = msgspec.convert(
        job(image="x", registry_auth={"username": "u", "password": "p" * 4097}), TrainingJobSpec
    )
    with pytest.raises(FieldError) as refused:
        check_submitted_secrets(password)
    assert json_path(refused.value.path) == "$.registry_auth.password"


def test_at_most_256_secrets() -> None:
    many = {f"S{i}": "v" for i in range(257)}
    with pytest.raises(msgspec.ValidationError) as error:
        msgspec.convert(job(secret_env=many), TrainingJobSpec)
    assert describe_error(error.value)[0] == "$.secret_env"


def test_a_spec_file_with_oversized_secrets_fails_before_it_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(msgspec.json.encode(job(secret_env={"K": "x" * 70_000})).decode())
    with pytest.raises(SpecFileError, match=r"\$\.secret_env\.K: has 70000 bytes"):
        load_spec_file(path, "training")


def test_a_spec_file_with_a_secret_a_root_program_would_read_fails_before_it_is_sent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "job.json"
    path.write_text(msgspec.json.encode(job(secret_env={"DBUS_SESSION_BUS_ADDRESS": "s"})).decode())
    with pytest.raises(SpecFileError, match=r"\$\.secret_env\.DBUS_SESSION_BUS_ADDRESS: .* in env"):
        load_spec_file(path, "training")


def test_new_fields_never_make_a_spec_unschedulable_by_themselves() -> None:
    spec = msgspec.convert(
        job(image="x", secret_env={"K": "v"}, isolation="sandbox"), TrainingJobSpec
    )
    assert check_convertible(spec) is None
