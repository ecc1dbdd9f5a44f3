"""What greenfed sends slurmrestd and reads from it, version by version
(cloud/clusters/slurm/rest_dialects.py): v0.0.38 against answers a real Slurm 22.05
slurmrestd gave (tests/cloud/slurmrestd/), v0.0.41 to v0.0.45 against Slurm's published
OpenAPI schemas (no slurmrestd of those versions can be installed here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cloud.clusters.backend import GangMember, GangRequest
from cloud.clusters.slurm.rest_dialects import (
    SPOKEN_VERSIONS,
    V0038,
    best_version,
    dialect_of,
)
from cloud.clusters.slurm.script import SubmitOptions, batch_script, job_shape

ANSWERS = Path(__file__).parent / "slurmrestd"
SCHEMAS: dict[str, dict[str, Any]] = json.loads((ANSWERS / "openapi-schemas.json").read_text())
NEWER = sorted(SCHEMAS)
JOB = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def answer(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ANSWERS / name).read_text())
    return loaded


def gang(**changes: Any) -> GangRequest:
    fields: dict[str, Any] = {
        "job_id": JOB,
        "attempt": 2,
        "tenant": "acme",
        "partition": "gpu",
        "members": (
            GangMember(node="gfnode1", processes=2, accelerators=4, cpus=8),
            GangMember(node="gfnode2", processes=2, accelerators=4, cpus=8),
        ),
        "accelerator_type": "a100",
        "command": ("python", "train.py"),
        "env": {"EPOCHS": "3"},
        "working_dir": None,
        "master_port": 29500,
        "per_node": False,
        "time_limit_s": 3600.0,
        "priority": "p0",
        "grace_period_s": 30.0,
    }
    return GangRequest(**{**fields, **changes})


OPTIONS = SubmitOptions(work_dir="/shared/gf", account="ml", qos={"p0": "high"}, nice={"p2": 50})


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with no property beyond those it names (slurmrestd ignores or refuses
    unknown keys: greenfed must send none)."""
    return {**schema, "additionalProperties": False}


# ---- v0.0.38: Slurm 22.05's answers ---------------------------------------------------


def test_v0038_reads_nodes_as_the_cluster_reported_them() -> None:
    nodes = {
        node.name: node
        for raw in answer("v0.0.38-nodes.json")["nodes"]
        if (node := V0038("v0.0.38").node(raw)) is not None
    }
    assert set(nodes) == {"gfnode1", "gfnode2"}
    busy, idle = nodes["gfnode1"], nodes["gfnode2"]
    assert busy.accelerators == {"a100": 4}
    assert busy.allocated == {"a100": 4}
    assert idle.accelerators == {"a100": 4}
    assert idle.allocated == {"a100": 0}
    assert busy.partitions == ("gpu", "debug")
    assert busy.cpus == 8
    assert busy.memory_bytes == 8000 << 20
    assert busy.unavailable == ""
    assert idle.unavailable == ""


def test_v0038_a_drained_or_unresponsive_node_takes_no_work() -> None:
    dialect = V0038("v0.0.38")
    raw = {**answer("v0.0.38-nodes.json")["nodes"][1], "state_flags": ["DRAIN"]}
    node = dialect.node({**raw, "reason": "disk"})
    assert node is not None
    assert node.unavailable == "idle+drain: disk"
    raw = {**raw, "state": "down", "state_flags": ["NOT_RESPONDING"], "reason": ""}
    node = dialect.node(raw)
    assert node is not None
    assert node.unavailable.startswith("down")


def recorded_jobs() -> list[dict[str, Any]]:
    """The recorded live jobs, job 1 with the comment greenfed gives (it was submitted by
    hand, commented `greenfed:x`; the others have none)."""
    jobs: list[dict[str, Any]] = answer("v0.0.38-jobs.json")["jobs"]
    return [
        {**raw, "comment": f"greenfed:{JOB}:1:acme"} if raw["job_id"] == 1 else raw for raw in jobs
    ]


def test_v0038_reads_greenfeds_jobs_and_their_states() -> None:
    dialect = V0038("v0.0.38")
    jobs = {job.backend_id: job for raw in recorded_jobs() if (job := dialect.job(raw)) is not None}
    assert set(jobs) == {"1", "2", "3", "4"}
    assert jobs["1"].state == "pending"
    assert jobs["1"].reason == "Priority"
    assert jobs["1"].started_at is None
    assert jobs["1"].nodes == ()
    # A raw wait status of 768 is exit code 3.
    assert (jobs["2"].state, jobs["2"].exit_code) == ("failed", 3)
    assert jobs["2"].finished_at is not None
    running = jobs["3"]
    assert running.state == "running"
    assert running.nodes == ("gfnode1",)
    assert running.started_at is not None
    assert running.finished_at is None
    assert (running.job_id, running.attempt) == ("01ARZ3NDEKTSV4RRFFQ69G5FAX", 1)
    # The output pattern as Slurm fills it (slurmrestd 22.05 gives it unexpanded).
    assert jobs["1"].output_path is not None
    assert jobs["1"].output_path.endswith("/gf-x-1.out")
    assert jobs["4"].state == "pending"  # cancelled a moment after this was recorded


def test_v0038_reads_the_accounting_and_believes_its_state_not_its_return_code() -> None:
    dialect = V0038("v0.0.38")
    jobs = {
        job.backend_id: job
        for raw in answer("v0.0.38-slurmdb-jobs.json")["jobs"]
        if (job := dialect.accounted_job(raw)) is not None
    }
    assert jobs["2"].state == "failed"  # its return_code says 0; it exited 3
    assert jobs["2"].nodes == ("gfnode1",)
    assert jobs["4"].state == "stopped"
    assert jobs["4"].nodes == ()
    assert jobs["3"].state == "running"


def test_v0038_submits_what_sbatch_would_but_cannot_name_the_machines() -> None:
    dialect = V0038("v0.0.38")
    assert dialect.pins_machines is False
    body = dialect.submit_body(job_shape(gang(), OPTIONS), batch_script(gang()))
    job = body["job"]
    assert job["name"] == f"gf-{JOB}-2"
    assert job["nodes"] == "2"
    assert job["tasks_per_node"] == 2
    assert job["gres"] == "gpu:a100:4"
    assert job["cpus_per_task"] == 4
    assert job["time_limit"] == 60
    assert (job["account"], job["qos"]) == ("ml", "high")
    assert "nice" not in job  # p0 has no nice value registered
    assert job["standard_output"] == f"/shared/gf/gf-{JOB}-2-%j.out"
    assert job["requeue"] is False
    assert "required_nodes" not in job
    assert body["script"].startswith("#!/bin/sh")
    # Nothing of the control plane's environment: only a PATH; the script sets the rest.
    assert job["environment"] == {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def test_v0038_asks_the_accounting_in_slurms_time_words() -> None:
    # Its query parser refuses a Unix time and a colon; "now-7days" it takes.
    assert V0038("v0.0.38").accounting_since(7 * 86400.0, 0.0) == "now-7days"


# ---- v0.0.41 to v0.0.45: Slurm's published schemas ------------------------------------


@pytest.mark.parametrize("version", NEWER)
def test_newer_versions_submit_a_description_their_schema_accepts(version: str) -> None:
    dialect = dialect_of(version)
    assert dialect.pins_machines is True
    for request in (gang(), gang(accelerator_type=None, time_limit_s=None, priority="p2")):
        body = dialect.submit_body(job_shape(request, OPTIONS), batch_script(request))
        assert set(body) == {"job"}
        jsonschema.validate(body["job"], strict(SCHEMAS[version]["job_desc_msg"]))
    job = dialect.submit_body(job_shape(gang(), OPTIONS), batch_script(gang()))["job"]
    assert job["required_nodes"] == ["gfnode1", "gfnode2"]
    assert job["tres_per_node"] == "gres/gpu:a100:4"
    assert job["time_limit"] == {"set": True, "infinite": False, "number": 60}
    assert job["environment"] == ["PATH=/usr/local/bin:/usr/bin:/bin"]
    assert job["script"].startswith("#!/bin/sh")


def newer_job(**changes: Any) -> dict[str, Any]:
    def number(value: int | None) -> dict[str, Any]:
        return {"set": value is not None, "infinite": False, "number": value or 0}

    raw: dict[str, Any] = {
        "job_id": 41,
        "name": f"gf-{JOB}-3",
        "job_state": ["RUNNING"],
        "state_reason": "None",
        "exit_code": {"status": ["PENDING"], "return_code": number(None)},
        "nodes": "gfnode[1-2]",
        "submit_time": number(1_800_000_000),
        "start_time": number(1_800_000_010),
        "end_time": number(1_800_086_410),
        "standard_output": f"/shared/gf/gf-{JOB}-3-41.out",
    }
    return {**raw, **changes}


@pytest.mark.parametrize("version", NEWER)
def test_newer_versions_read_jobs_shaped_as_their_schema_says(version: str) -> None:
    dialect = dialect_of(version)
    signal_9 = {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}
    cases = {
        "running": newer_job(),
        "succeeded": newer_job(
            job_state=["COMPLETED"],
            exit_code={"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}},
        ),
        "failed": newer_job(
            job_state=["FAILED"],
            state_reason="NonZeroExitCode",
            exit_code={"status": ["ERROR"], "return_code": {"set": True, "number": 3}},
        ),
        "killed": newer_job(
            job_state=["FAILED"],
            exit_code={
                "status": ["SIGNALED"],
                "return_code": {"set": True, "number": 0},
                "signal": signal_9,
            },
        ),
        "pending": newer_job(
            job_state=["PENDING"],
            state_reason="Resources",
            nodes="",
            start_time={"set": True, "infinite": False, "number": 0},
        ),
        "requeued": newer_job(job_state=["PENDING", "REQUEUED"], state_reason="BeginTime"),
    }
    read = {}
    for name, raw in cases.items():
        jsonschema.validate(raw, SCHEMAS[version]["job_info"])
        job = dialect.job(raw)
        assert job is not None
        read[name] = job
    assert read["running"].state == "running"
    assert read["running"].nodes == ("gfnode1", "gfnode2")
    assert read["running"].started_at == 1_800_000_010
    assert read["running"].finished_at is None
    assert (read["succeeded"].state, read["succeeded"].exit_code) == ("succeeded", 0)
    assert read["succeeded"].finished_at == 1_800_086_410
    assert (read["failed"].state, read["failed"].exit_code) == ("failed", 3)
    assert (read["killed"].state, read["killed"].exit_code) == ("failed", 137)
    assert read["pending"].state == "pending"
    assert read["pending"].reason == "Resources"
    assert read["requeued"].state == "pending"
    # Anyone else's job is not greenfed's.
    assert dialect.job(newer_job(name="train-resnet")) is None


@pytest.mark.parametrize("version", NEWER)
def test_newer_versions_read_nodes_shaped_as_their_schema_says(version: str) -> None:
    dialect = dialect_of(version)
    raw = {
        "name": "gpu07",
        "partitions": ["gpu", "long"],
        "cpus": 64,
        "real_memory": 512000,
        "gres": "gpu:h100:8(S:0-1)",
        "gres_used": "gpu:h100:3(IDX:0-2)",
        "tres_used": "cpu=24,mem=96G,gres/gpu=3",
        "state": ["MIXED"],
        "reason": "",
    }
    jsonschema.validate(raw, SCHEMAS[version]["node"])
    node = dialect.node(raw)
    assert node is not None
    assert node.accelerators == {"h100": 8}
    assert node.allocated == {"h100": 3}
    assert node.partitions == ("gpu", "long")
    assert node.unavailable == ""
    drained = dialect.node({**raw, "state": ["IDLE", "DRAIN"], "reason": "bad fan"})
    assert drained is not None
    assert drained.unavailable == "idle+drain: bad fan"


@pytest.mark.parametrize("version", NEWER)
def test_newer_versions_read_the_accounting(version: str) -> None:
    dialect = dialect_of(version)
    raw = {
        "job_id": 40,
        "name": f"gf-{JOB}-1",
        "state": {"current": ["TIMEOUT"], "reason": "None"},
        "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}},
        "nodes": "gfnode1",
        "time": {"submission": 1_800_000_000, "start": 1_800_000_005, "end": 1_800_003_605},
    }
    jsonschema.validate(raw, SCHEMAS[version]["job"])
    job = dialect.accounted_job(raw)
    assert job is not None
    assert job.state == "failed"
    assert "time limit" in job.reason
    assert job.finished_at == 1_800_003_605
    assert dialect.accounting_since(86400.0, 1_800_100_000.0) == "1800013600"


def test_the_best_version_both_speak_is_chosen() -> None:
    assert best_version(("v0.0.39", "v0.0.40", "v0.0.41")) == "v0.0.41"
    assert best_version(("v0.0.42", "v0.0.43", "v0.0.44")) == "v0.0.44"
    assert best_version(("v0.0.37", "v0.0.38", "v0.0.39")) == "v0.0.38"
    assert best_version(("v0.0.39", "v0.0.40")) is None  # Slurm 23.02/23.11 only
    assert best_version(()) is None
    assert set(NEWER) | {"v0.0.38"} == set(SPOKEN_VERSIONS)
