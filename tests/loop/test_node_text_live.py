"""A node's failure reason holding a NUL, on PostgreSQL (which refuses NUL in text): the
job fails with a readable reason and the scheduling loop goes on placing work. Before,
every pass that wrote the reason failed, and the retained report made every later pass
write it again: nothing was placed anywhere in the fleet.

Through ingestion (a node's `reported` message, made printable as it is taken:
cloud/fleet/node_text.py) and straight into the registry (as a cluster's bridge
reports; cloud/loop/reports.py `_reason` makes it printable there too)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cloud.app_keys import INGESTOR, REGISTRY, SCHEDULER
from cloud.fleet.node_text import printable_reported
from shared.messages import ReportedDeployment, ReportedState, ReportedTraining, encode
from shared.settings import SchedulingSettings
from shared.topics import Channel
from tests.api.support import Api, deployment_spec, job_spec, running_api
from tests.loop.builders import node
from tests.store.databases import postgres_database
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)

# Nodes registered straight into the registry send no telemetry: never lost here.
LOOP = SchedulingSettings(
    debounce_s=0.01, interval_s=0.3, node_lost_grace_s=3600, startup_settle_s=0.0
)
READABLE = "oom\ufffd"


async def _work(api: Api, collection: str, work_id: str) -> dict[str, Any]:
    response = await api.get(api.admin_token, f"/v1/{collection}/{work_id}")
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def _until(api: Api, collection: str, work_id: str, *states: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await _work(api, collection, work_id))
        return seen["state"] in states

    await eventually_async(
        reached,
        timeout_s=20,
        interval_s=0.05,
        message=lambda: f"{work_id} {seen.get('state')} ({seen.get('reason')!r}), not {states}",
    )
    return seen


def _report(api: Api, node_id: str, *, via_ingestion: bool, **entries: Any) -> None:
    registry = api.app[REGISTRY]
    record = registry.get(node_id)
    assert record is not None
    reported = ReportedState(
        node_id=node_id,
        instance_id=record.status.instance_id,
        observed_generation=1,
        reported_at=time.time(),
        **entries,
    )
    if via_ingestion:
        ingestor = api.app[INGESTOR]
        # Applied whole (an entry the assignment index does not know yet is only counted).
        ingestor.handle(ingestor.topics.node(node_id, Channel.REPORTED), encode(reported))
        assert registry.get(node_id).reported == printable_reported(reported)  # type: ignore[union-attr]
    else:
        assert registry.apply_reported(reported) is None


@pytest.mark.parametrize("via_ingestion", [True, False], ids=["ingested", "registry"])
async def test_a_nul_in_a_runs_reason_fails_the_job_readably_and_work_is_still_placed(
    tmp_path: Path, via_ingestion: bool
) -> None:
    async with postgres_database(tmp_path) as db, running_api(db, scheduling=LOOP) as api:
        api.app[REGISTRY].apply_status(node("gpu-1").status)
        api.app[REGISTRY].apply_status(node("gpu-2").status)
        acme = await api.tenant("acme", quotas={"gpu": 8})
        first = await api.submitted(acme, job_spec(name="first"))
        placed = (await _until(api, "jobs", first, "scheduled"))["allocations"][0]["node_id"]

        run = ReportedTraining(job_id=first, attempt=1, state="failed", reason="oom\x00")
        _report(api, placed, via_ingestion=via_ingestion, training=(run,))
        failed = await _until(api, "jobs", first, "failed")
        assert failed["reason"] == f"worker on {placed} failed: {READABLE}"

        second = await api.submitted(acme, job_spec(name="second"))
        await _until(api, "jobs", second, "scheduled")
        assert api.app[SCHEDULER].stats.errors == 0


async def test_a_nul_in_a_failed_replicas_reason_fails_the_deployment_readably(
    tmp_path: Path,
) -> None:
    async with postgres_database(tmp_path) as db, running_api(db, scheduling=LOOP) as api:
        api.app[REGISTRY].apply_status(node("gpu-1", site="edge", gpus=1).status)
        api.app[REGISTRY].apply_status(node("gpu-2").status)
        acme = await api.tenant("acme", quotas={"gpu": 8})
        model = await api.model(acme)
        deployment = await api.submitted(
            acme, deployment_spec(model, replicas=1), collection="deployments"
        )
        await _until(api, "deployments", deployment, "scheduled")

        replica = ReportedDeployment(
            deployment_id=deployment, replica=0, state="failed", reason="crash\x00\x1b[2K"
        )
        _report(api, "gpu-1", via_ingestion=True, deployments=(replica,))
        failed = await _until(api, "deployments", deployment, "failed")
        assert "crash\ufffd\ufffd[2K" in failed["reason"]

        job = await api.submitted(acme, job_spec(name="after"))
        await _until(api, "jobs", job, "scheduled")
        assert api.app[SCHEDULER].stats.errors == 0
