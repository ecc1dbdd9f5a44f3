"""The REST spec types, their conversion to the scheduler's types, and spec files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

import msgspec
import pytest

from cloud.scheduler.model import InferenceDeployment, LabelRequirement, Toleration, TrainingJob
from cloud.store import AllocationRecord, TenantRecord, WorkRecord
from cloud.work.convert import (
    allocation_from_record,
    check_convertible,
    inference_deployment,
    tenant_from_record,
    training_job,
    work_from_record,
)
from cloud.work.specs import (
    GIB,
    SPEC_TYPES,
    DeploymentSpec,
    LabelRequirementSpec,
    TrainingJobSpec,
    decode_spec,
    describe_error,
    encode_spec,
)
from greenfed.spec_files import SpecFileError, load_spec_file
from shared import work_literals
from shared.errors import FieldError

FULL_JOB = {
    "kind": "training",
    "name": "llama-ft",
    "priority": "p2",
    "workers": 4,
    "accelerators_per_worker": 8,
    "accelerator_kind": "gpu",
    "memory_gib": 80,
    "host_memory_gib": 256,
    "accelerator_models": ["NVIDIA H100 80GB HBM3"],
    "estimated_duration_s": 7200,
    "preemptible": False,
    "start_window": "20:00-06:00",
    "deadline": "2030-01-02T03:04:05+01:00",
    "max_delay_s": 3600,
    "command": ["torchrun", "train.py", "--epochs", "3"],
    "env": {"WANDB_MODE": "offline"},
    "working_dir": "/srv/jobs",
    "grace_period_s": 60,
    "node_selector": {"pool": "training"},
    "affinity": [
        {"key": "zone", "operator": "In", "values": ["DE", "CA-ON"]},
        {"key": "spot", "operator": "DoesNotExist"},
    ],
    "tolerations": [{"key": "dedicated", "value": "ml"}, {"key": "maintenance"}],
    "group": "llm",
    "anti_affinity_groups": ["batch"],
    "score_weights": {"carbon": 3.0, "price": 0.5},
}


def record(kind: str, spec: bytes, **changes: object) -> WorkRecord:
    fields: dict[str, object] = {
        "work_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "tenant_id": "01ARZ3NDEKTSV4RRFFQ69G5FAW",
        "kind": kind,
        "spec": spec,
        "priority": "p2",
        "state": "pending",
        "state_reason": None,
        "attempts": 0,
        "submitted_at": 1_700_000_000.0,
        "updated_at": 1_700_000_000.0,
        "idempotency_key": None,
        "version": 1,
    }
    fields.update(changes)
    return WorkRecord(**fields)  # type: ignore[arg-type]


def test_a_full_training_spec_converts_to_the_schedulers_job() -> None:
    spec = msgspec.json.decode(msgspec.json.encode(FULL_JOB), type=TrainingJobSpec)
    job = training_job(spec, work_id="w1", tenant="acme", submitted_at=5.0)
    assert isinstance(job, TrainingJob)
    assert (job.work_id, job.tenant, job.priority, job.submitted_at) == ("w1", "acme", "p2", 5.0)
    assert (job.workers, job.accelerators_per_worker, job.accelerator_kind) == (4, 8, "gpu")
    assert (job.memory_bytes, job.host_memory_bytes) == (80 * GIB, 256 * GIB)
    assert job.accelerator_models == ("NVIDIA H100 80GB HBM3",)
    assert (job.duration_s, job.preemptible) == (7200.0, False)
    assert str(job.start_window) == "20:00-06:00"
    assert job.deadline == datetime(2030, 1, 2, 2, 4, 5, tzinfo=UTC).timestamp()
    assert job.max_delay_s == 3600.0
    assert job.sites == ("cloud",)
    assert dict(job.node_selector) == {"pool": "training"}
    assert job.affinity == (
        LabelRequirement("zone", "In", ("DE", "CA-ON")),
        LabelRequirement("spot", "DoesNotExist"),
    )
    assert job.tolerations == (Toleration("dedicated", "ml"), Toleration("maintenance"))
    assert (job.group, job.anti_affinity_groups) == ("llm", ("batch",))
    assert dict(job.score_weights) == {"carbon": 3.0, "price": 0.5}
    assert job.flexible


def test_a_deployment_spec_converts_to_the_schedulers_deployment() -> None:
    spec = DeploymentSpec(
        name="detector",
        model_id="yolo",
        replicas=3,
        min_replicas=2,
        accepted_kinds=("npu", "cpu"),
        providers=("QNNExecutionProvider", "CPUExecutionProvider"),
        memory_gib=0.5,
        latency_slo_ms=50,
        traffic_by_region={"europe-west3": 0.7, "us-west2": 0.3},
        requests_per_s=200,
        reference_ms_per_request=4,
        max_replicas_per_node=2,
    )
    deployment = inference_deployment(spec, work_id="d1", tenant="acme", submitted_at=1.0)
    assert isinstance(deployment, InferenceDeployment)
    assert (deployment.replicas, deployment.min_replicas, deployment.priority) == (3, 2, "p0")
    assert deployment.accepted_kinds == ("npu", "cpu")
    assert deployment.providers == ("QNNExecutionProvider", "CPUExecutionProvider")
    assert deployment.memory_bytes == GIB // 2
    assert deployment.latency_slo_ms == 50
    assert dict(deployment.traffic_by_region) == {"europe-west3": 0.7, "us-west2": 0.3}
    assert (deployment.requests_per_s, deployment.reference_ms_per_request) == (200, 4)
    assert (deployment.max_replicas_per_node, deployment.sites) == (2, ("edge",))


def test_stored_work_converts_with_its_record_and_allocations() -> None:
    spec = msgspec.json.decode(msgspec.json.encode(FULL_JOB), type=TrainingJobSpec)
    stored = record("training", encode_spec(spec))
    job = work_from_record(stored, tenant="acme")
    assert isinstance(job, TrainingJob)
    assert (job.work_id, job.submitted_at) == (stored.work_id, stored.submitted_at)
    allocation = allocation_from_record(
        AllocationRecord(
            work_id=stored.work_id,
            member_index=1,
            node_id="gpu-7",
            accelerator_kind="gpu",
            accelerators=8,
            accelerator_ids=(),
            host_memory_bytes=256 * GIB,
            started_at=10.0,
            expected_end=7210.0,
            borrowed=True,
            state="running",
            tenant_id=stored.tenant_id,
            work_kind="training",
            priority="p2",
        ),
        job,
    )
    assert (allocation.allocation_id, allocation.tenant, allocation.preemptible) == (
        f"{stored.work_id}/1",
        "acme",
        False,
    )
    assert (allocation.group, allocation.anti_affinity_groups) == ("llm", ("batch",))
    assert (allocation.expected_end, allocation.borrowed) == (7210.0, True)
    # What a deadline rescue reads: this job has a deadline and no checkpoints.
    assert (allocation.deadline_bound, allocation.checkpointing) == (True, False)
    deployment = work_from_record(
        record("inference", encode_spec(DeploymentSpec(name="d", model_id="m")), priority="p0"),
        tenant="t",
    )
    assert isinstance(deployment, InferenceDeployment)


def test_tenants_without_quota_or_cohort_are_unmanaged() -> None:
    def tenant(**changes: object) -> TenantRecord:
        fields: dict[str, object] = {
            "tenant_id": "t1",
            "name": "acme",
            "quotas": {},
            "borrowing_limit": {},
            "cohort": None,
            "allowed_priorities": ("p0", "p1", "p2"),
            "admin": False,
            "created_at": 0.0,
        }
        fields.update(changes)
        return TenantRecord(**fields)  # type: ignore[arg-type]

    assert tenant_from_record(tenant()) is None
    managed = tenant_from_record(tenant(quotas={"gpu": 8}, borrowing_limit={"gpu": 2}, cohort="c"))
    assert managed is not None
    assert (managed.name, dict(managed.nominal), managed.cohort) == ("acme", {"gpu": 8}, "c")
    assert dict(managed.borrowing_limit) == {"gpu": 2}


def test_the_scheduler_refusing_a_spec_is_caught_at_submission() -> None:
    assert check_convertible(TrainingJobSpec(name="a", command=("x",))) is None
    refused = check_convertible(
        TrainingJobSpec(name="a", command=("x",), score_weights={"carbn": 1.0})
    )
    assert refused is not None
    assert refused.path == ("score_weights",)
    assert refused.reason.startswith("score_weights names unknown term 'carbn'")
    never_opens = check_convertible(
        TrainingJobSpec(name="a", command=("x",), start_window="20:00-20:00")
    )
    assert never_opens is not None
    assert (never_opens.path, never_opens.reason) == (
        (),
        "an empty start window never opens; omit it to allow any time",
    )


def test_specs_have_defaults_and_a_canonical_encoding() -> None:
    spec = decode_spec("training", b'{"command": ["python", "x.py"], "name": "a"}')
    assert isinstance(spec, TrainingJobSpec)
    assert (spec.priority, spec.workers, spec.grace_period_s, spec.sites) == (
        "p1",
        1,
        30.0,
        ("cloud",),
    )
    same = decode_spec(
        "training", b'{"name": "a", "priority": "p1", "command": ["python", "x.py"]}'
    )
    assert encode_spec(spec) == encode_spec(same)
    assert decode_spec("training", encode_spec(spec)) == spec
    deployment = decode_spec("deployment", b'{"name": "d", "model_id": "m"}')
    assert isinstance(deployment, DeploymentSpec)
    assert (deployment.priority, deployment.accepted_kinds) == ("p0", ("npu", "gpu", "cpu"))


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ({"name": "a", "command": ["x"], "workers": "2"}, "$.workers"),
        ({"name": "a", "command": ["x"], "extra": 1}, "$.extra"),
        ({"command": ["x"]}, "$.name"),
        (
            {"name": "a", "command": ["x"], "affinity": [{"key": "k", "operator": "Is"}]},
            "$.affinity[0].operator",
        ),
        (
            {
                "name": "a",
                "command": ["x"],
                "affinity": [{"key": "k", "operator": "Exists", "values": ["v"]}],
            },
            "$.affinity[0].values",
        ),
        ({"name": "a", "command": ["x"], "env": {"bad name": "v"}}, "$.env"),
        ({"name": "a", "command": ["x"], "sites": ["cloud", "cloud"]}, "$.sites"),
    ],
)
def test_errors_name_the_path_of_the_field(document: dict[str, object], path: str) -> None:
    with pytest.raises(msgspec.ValidationError) as error:
        msgspec.convert(document, TrainingJobSpec)
    name, reason = describe_error(error.value)
    assert name == path
    assert reason


def test_spec_checks_raise_a_typed_field_error() -> None:
    with pytest.raises(FieldError) as refused:
        LabelRequirementSpec(key="zone", operator="In")
    assert (refused.value.path, refused.value.reason) == (
        ("values",),
        "operator In needs at least one value",
    )
    with pytest.raises(msgspec.ValidationError) as wrapped:
        msgspec.convert(
            {"name": "d", "model_id": "m", "affinity": [{"key": "k", "operator": "NotIn"}]},
            DeploymentSpec,
        )
    assert isinstance(wrapped.value.__cause__, FieldError)
    assert describe_error(wrapped.value) == (
        "$.affinity[0].values",
        "operator NotIn needs at least one value",
    )


def test_a_deployment_is_inference_work_below_the_rest_api() -> None:
    assert work_literals.spec_kind_of("inference") == "deployment"
    assert work_literals.work_kind_of("deployment") == "inference"
    for kind in work_literals.WORK_KINDS:
        assert work_literals.work_kind_of(work_literals.spec_kind_of(kind)) == kind
    assert set(get_args(work_literals.SpecKind)) == set(SPEC_TYPES)


def test_spec_files_in_json_toml_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(msgspec.json.encode(FULL_JOB).decode())
    (tmp_path / "job.toml").write_text(
        'kind = "training"\nname = "toml-job"\ncommand = ["python", "t.py"]\nworkers = 2\n'
        "deadline = 2030-01-01T00:00:00Z\nmemory_gib = 40\n"
        '[[affinity]]\nkey = "zone"\noperator = "In"\nvalues = ["DE"]\n'
    )
    (tmp_path / "serve.yaml").write_text(
        "kind: deployment\nname: detector\nmodel_id: m1\nreplicas: 3\naccepted_kinds: [npu, cpu]\n"
    )
    (tmp_path / "plain.yml").write_text("name: plain\ncommand: [run]\n")
    assert load_spec_file(tmp_path / "job.json") == msgspec.convert(FULL_JOB, TrainingJobSpec)
    toml_job = load_spec_file(tmp_path / "job.toml")
    assert isinstance(toml_job, TrainingJobSpec)
    assert (toml_job.workers, toml_job.memory_gib, toml_job.affinity[0].values) == (
        2,
        40.0,
        ("DE",),
    )
    assert toml_job.deadline == datetime(2030, 1, 1, tzinfo=UTC)
    deployment = load_spec_file(tmp_path / "serve.yaml")
    assert isinstance(deployment, DeploymentSpec)
    assert deployment.accepted_kinds == ("npu", "cpu")
    assert isinstance(load_spec_file(tmp_path / "plain.yml", "training"), TrainingJobSpec)


@pytest.mark.parametrize(
    ("name", "text", "kind", "message"),
    [
        (
            "a.toml",
            'kind = "training"\nname = "a"\ncommand = ["x"]\nworkers = "two"\n',
            None,
            "$.workers",
        ),
        (
            "a.yaml",
            "kind: training\nname: a\ncommand: [x]\ngpus: 2\n",
            None,
            "$.gpus: unknown field",
        ),
        ("a.yaml", "name: a\ncommand: [x]\n", None, "add kind"),
        ("a.yaml", "kind: deployment\nname: a\n", "training", "--kind says training"),
        ("a.yaml", "kind: job\nname: a\n", None, "$.kind"),
        ("a.yaml", "- just\n- a list\n", "training", "mapping"),
        ("a.toml", "name = \n", "training", "not valid TOML"),
        ("a.json", "{", "training", "not valid JSON"),
        ("a.yaml", "a: [", "training", "not valid YAML"),
        ("a.txt", "", "training", "unknown file type .txt"),
    ],
)
def test_bad_spec_files_say_where_and_why(
    tmp_path: Path, name: str, text: str, kind: str | None, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecFileError) as error:
        load_spec_file(path, kind)  # type: ignore[arg-type]
    assert message in str(error.value)
    assert str(path) in str(error.value)
    with pytest.raises(SpecFileError, match="No such file"):
        load_spec_file(tmp_path / "missing.json")
