"""Work that could never run (issue 17): refused at submission with a 422 naming the
field, unless the spec opts out for a fleet that will grow; then (or when the fleet
shrank) it waits with pending reason `unschedulable` and the exact cause, and a job
whose deadline became unreachable ends failed unless its spec says to keep it. Both
databases; the scheduling pass is the loop's own steps (inputs, core, translation)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from cloud.api.registered_fleet import registered_fleet
from cloud.app_keys import REGISTRY, STORE
from cloud.work.explanation import decode_explanation
from shared.messages import Accelerator
from shared.settings import SchedulingSettings
from tests.api.support import Api, job_spec, one_pass, problem, running_api
from tests.loop.builders import device, node
from tests.store.databases import DatabaseUnderTest

GIB = 2**30


def server(node_id: str, *, gpus: int = 8, cores: int = 16) -> tuple[Accelerator, ...]:
    return (
        device("cpu", 0, compute_units=cores),
        *(device("gpu", i, model="A100", memory_bytes=80 * GIB) for i in range(gpus)),
    )


def register(api: Api, node_id: str, **fields: Any) -> None:
    """A cloud node of 8 A100s (80 GiB), 16 cores and 64 GiB of host memory."""
    api.app[REGISTRY].apply_status(node(node_id, devices=server(node_id, **fields)).status)


async def refused(api: Api, token: str, spec: dict[str, Any]) -> tuple[str, str]:
    body = await problem(await api.submit(token, spec), 422)
    (param,) = body["invalid_params"]
    return param["name"], param["reason"]


@pytest.mark.parametrize(
    ("fields", "name", "reason"),
    [
        (
            {"accelerators_per_worker": 64},
            "$.accelerators_per_worker",
            "no node has 64 GPU; the largest has 8",
        ),
        ({"accelerator_kind": "npu"}, "$.accelerator_kind", "no node at cloud has a NPU"),
        (
            {"memory_gib": 100},
            "$.memory_gib",
            "no node has GPU with 100 GiB of memory each; the most is 80 GiB",
        ),
        (
            {"host_memory_gib": 65},
            "$.host_memory_gib",
            "no node with 1 GPU has 65 GiB of host memory; the most is 64 GiB",
        ),
        (
            {"cpus_per_worker": 17},
            "$.cpus_per_worker",
            "no node with 1 GPU has 17 CPU cores; the most is 16",
        ),
        (
            {"workers": 3, "accelerators_per_worker": 8},
            "$.workers",
            "the fleet could hold at most 2 workers of 8 GPU at once (on 2 nodes); the gang has 3",
        ),
    ],
)
async def test_work_no_registered_node_could_hold_is_a_422_naming_the_field(
    api: Api, fields: dict[str, Any], name: str, reason: str
) -> None:
    token = await api.tenant("vision")
    register(api, "gpu-a")
    register(api, "gpu-b")
    found_name, found_reason = await refused(api, token, job_spec(**fields))
    assert found_name == name
    assert found_reason.startswith(reason)
    assert "allow_unschedulable" in found_reason  # how to queue it anyway
    # The same spec opted out is accepted: the fleet may grow.
    accepted = await api.submit(token, job_spec(**fields, allow_unschedulable=True))
    assert accepted.status == 201, await accepted.text()


async def test_the_fleet_is_judged_once_for_a_burst_and_a_new_node_counts_at_once(
    api: Api,
) -> None:
    """Submissions share one view of the registered fleet (building it per submission
    was most of the API's cost with a thousand nodes), yet a node that registers counts
    for the very next submission: nothing is refused on a view older than the registry."""
    token = await api.tenant("vision")
    register(api, "gpu-a")
    fleet = registered_fleet(api.app[REGISTRY], api.app[STORE])
    first = await api.submit(token, job_spec())
    assert first.status == 201, await first.text()
    builds = fleet.builds
    for _ in range(20):
        accepted = await api.submit(token, job_spec())
        assert accepted.status == 201, await accepted.text()
    assert fleet.builds <= builds + 1  # once more at most: liveness may judge gpu-a
    name, _ = await refused(api, token, job_spec(accelerators_per_worker=16))
    assert name == "$.accelerators_per_worker"
    register(api, "gpu-big", gpus=16)
    accepted = await api.submit(token, job_spec(accelerators_per_worker=16))
    assert accepted.status == 201, await accepted.text()


async def test_a_gang_beyond_the_quota_and_what_the_cohort_could_lend_is_a_422(api: Api) -> None:
    for node_id in ("gpu-a", "gpu-b", "gpu-c"):
        register(api, node_id)
    alone = await api.tenant("alone", quotas={"gpu": 8})
    name, reason = await refused(api, alone, job_spec(workers=2, accelerators_per_worker=8))
    assert name == "$.workers"
    assert reason.startswith(
        "tenant alone may hold at most 8 GPU (its nominal quota; no cohort to borrow from); "
        "the job needs 16"
    )
    lender = await api.tenant("lender", quotas={"gpu": 8}, cohort="lab")
    borrower = await api.tenant(
        "borrower", quotas={"gpu": 8}, cohort="lab", borrowing_limit={"gpu": 4}
    )
    name, reason = await refused(api, borrower, job_spec(workers=2, accelerators_per_worker=8))
    assert (name, reason.split(";")[0]) == (
        "$.workers",
        "tenant borrower may hold at most 12 GPU (nominal 8 plus what cohort lab could lend, "
        "borrowing limit 4)",
    )
    twelve = job_spec(workers=3, accelerators_per_worker=4)
    assert (await api.submit(borrower, twelve)).status == 201
    assert (await api.submit(lender, job_spec(workers=2, accelerators_per_worker=8))).status == 201


async def test_nothing_registered_yet_is_nothing_to_judge_by(api: Api) -> None:
    token = await api.tenant("vision")
    assert (await api.submit(token, job_spec(accelerators_per_worker=64))).status == 201


async def test_opted_out_work_waits_as_unschedulable_with_the_exact_cause(api: Api) -> None:
    token = await api.tenant("vision")
    register(api, "gpu-a")
    register(api, "gpu-b")
    spec = job_spec(name="huge", accelerators_per_worker=64, allow_unschedulable=True)
    huge = await api.submitted(token, spec)
    big = await api.submitted(
        token, job_spec(name="big", host_memory_gib=65, allow_unschedulable=True)
    )
    await one_pass(api)

    body = await (await api.get(token, f"/v1/jobs/{huge}")).json()
    assert body["state"] == "pending"
    assert body["reason"].startswith("No node can run it: no node has 64 GPU; the largest has 8;")
    explained = await (await api.get(token, f"/v1/jobs/{huge}/explain")).json()
    assert explained["explanation"]["pending"]["code"] == "unschedulable"
    assert explained["explanation"]["pending"]["field"] == "$.accelerators_per_worker"
    reason = (await (await api.get(token, f"/v1/jobs/{big}")).json())["reason"]
    assert reason.startswith(
        "No node can run it: no node with 1 GPU has 65 GiB of host memory; the most is 64 GiB;"
    )
    assert "Waiting for capacity" not in reason


async def test_a_job_whose_deadline_became_unreachable_fails_unless_kept(api: Api) -> None:
    """Accepted while its deadline could be met; it waited (here: nothing placed it) past
    the last moment it could start on the fastest registered GPU."""
    token = await api.tenant("vision")
    register(api, "gpu-a")
    now = time.time()
    deadline = datetime.fromtimestamp(now, UTC) + timedelta(hours=2)
    late = job_spec(name="late", estimated_duration_s=3600.0, deadline=deadline.isoformat())
    late_id = await api.submitted(token, late)
    kept_id = await api.submitted(token, {**late, "name": "kept", "on_deadline_missed": "keep"})
    # Someone else's work holds every GPU, so neither starts in time.
    blocker = await api.submitted(
        await api.tenant("ops"),
        job_spec(name="blocker", accelerators_per_worker=8, priority="p0", preemptible=False),
    )
    await one_pass(api, now)
    assert (await api.store.find_work(blocker)).state == "scheduled"  # type: ignore[union-attr]
    assert (await api.store.find_work(late_id)).state == "pending"  # type: ignore[union-attr]

    # An hour and a half later the job needs more than the half hour that is left.
    later = now + 5400
    plan = await one_pass(api, later)
    failed = await (await api.get(token, f"/v1/jobs/{late_id}")).json()
    assert failed["state"] == "failed"
    assert failed["reason"].startswith(f"deadline missed: {deadline.isoformat()} is too soon")
    assert "needs 3,600 s on the fastest registered gpu" in failed["reason"]
    kept = await (await api.get(token, f"/v1/jobs/{kept_id}")).json()
    assert kept["state"] == "pending"
    assert kept["reason"].startswith(f"No node can run it: {deadline.isoformat()} is too soon")
    waiting = plan.pending_for(kept_id)
    assert waiting is not None
    assert waiting.never_fits is not None
    assert waiting.never_fits.field == "deadline"
    stored = await api.store.work_explanation(await api.tenant_id(token), kept_id)
    assert stored is not None
    assert stored.explanation is not None
    pending = decode_explanation(stored.explanation).pending
    assert pending is not None
    assert (pending.code, pending.field) == ("unschedulable", "$.deadline")


async def test_a_cpu_job_asks_for_cores_with_accelerators_per_worker(api: Api) -> None:
    token = await api.tenant("vision")
    name, reason = await refused(api, token, job_spec(accelerator_kind="cpu", cpus_per_worker=2))
    assert name == "$.cpus_per_worker"
    assert "accelerators_per_worker" in reason


# ---- containment (issue 24) ---------------------------------------------------------------


def register_contained(api: Api, node_id: str, **birth: Any) -> None:
    """A cloud node of 8 A100s whose birth says how it contains workers (1.8)."""
    status = node(node_id, devices=server(node_id)).status
    api.app[REGISTRY].apply_status(msgspec.structs.replace(status, **birth))


@pytest.mark.parametrize(
    ("birth", "fields", "name", "reason"),
    [
        (
            {"isolation": "user"},
            {"isolation": "sandbox"},
            "$.isolation",
            "no node at cloud isolates training workers as sandbox; the best isolates as user",
        ),
        (
            {"isolation": "unavailable"},
            {},
            "$.isolation",
            "no node at cloud can isolate training workers",
        ),
        (
            {},
            {"image": "ghcr.io/acme/trainer:2"},
            "$.image",
            "no node at cloud has a container runtime (podman or docker) to run an image",
        ),
        (
            {"container_runtimes": ("podman",)},
            {"secret_env": {"TOKEN": "t"}},
            "$.secret_env",
            "no node at cloud can receive sealed secrets",
        ),
        (
            {"container_runtimes": ("podman",)},
            {"image": "x", "registry_auth": {"username": "u", "password": "p"}},
            "$.secret_env",
            "no node at cloud that runs containers can receive sealed secrets",
        ),
    ],
)
async def test_work_no_node_could_contain_is_a_422_naming_the_field(
    api: Api, birth: dict[str, Any], fields: dict[str, Any], name: str, reason: str
) -> None:
    token = await api.tenant("vision")
    register_contained(api, "gpu-a", **birth)
    found_name, found_reason = await refused(api, token, job_spec(**fields))
    assert found_name == name
    assert found_reason.startswith(reason)
    accepted = await api.submit(token, job_spec(**fields, allow_unschedulable=True))
    assert accepted.status == 201, await accepted.text()


async def test_a_node_that_contains_the_work_lets_it_in(api: Api) -> None:
    token = await api.tenant("vision")
    key = "A" * 43 + "="
    register_contained(
        api,
        "gpu-a",
        isolation="sandbox",
        container_runtimes=("podman",),
        sealing_public_key=key,
    )
    spec = job_spec(isolation="sandbox", image="x", secret_env={"TOKEN": "t"})
    assert (await api.submit(token, spec)).status == 201


async def test_the_clusters_least_isolation_is_judged_at_submission(
    database: DatabaseUnderTest,
) -> None:
    async with running_api(
        database, scheduling=SchedulingSettings(enabled=False, min_isolation="sandbox")
    ) as api:
        token = await api.tenant("vision")
        register_contained(api, "gpu-a", isolation="user")
        name, reason = await refused(api, token, job_spec())
        assert name == "$.isolation"
        assert reason.startswith("no node at cloud isolates training workers as sandbox")
