"""Work waiting in Slurm's own queue (review round 6), on the real two-node cluster of
tests/support/slurm.py, through greenfed's REST API:

- a job waiting on a machine that is drained meanwhile is placed elsewhere after a grace
  (its Slurm job cancelled), as a node's loss: a job with no retries of its own runs
  again; while it waits its GPUs are not sampled busy (billed at full power), and its
  worker says why it waits (Slurm's reason);
- a partition that is not up takes no work: a machine in no other partition is tainted
  saying so, and one that is in another partition is placed on through that one.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from cloud.clusters.bridge import UNAVAILABLE_TAINT
from tests.api.support import Api, running_api
from tests.integration.test_slurm_backend import (
    CLUSTER,
    SCHEDULING,
    TRANSPORTS,
    accounted,
    job,
    register,
    sqlite_only,
)
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import reaches
from tests.support.slurm import SlurmCluster
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(300)


async def running_foreign_job(slurm: SlurmCluster, *options: str) -> str:
    """Another user's job (no greenfed name or comment), once Slurm runs it."""
    result = await slurm.run("sbatch", "--parsable", *options, "--wrap", "sleep 600")
    backend_id = result.stdout.strip().split(";")[0]

    async def runs() -> bool:
        shown = await slurm.run("squeue", "-h", "-j", backend_id, "-o", "%T")
        return shown.stdout.strip() == "RUNNING"

    await eventually_async(runs, timeout_s=30, message=f"job {backend_id} does not run")
    return backend_id


def busy_gpus(api: Api, node_id: str) -> list[str]:
    record = api.app[REGISTRY].get(node_id)
    assert record is not None
    return [a.id for a in record.status.accelerators if a.kind == "gpu" and not a.healthy]


# The requeue goes through the store (an eviction, its events): both databases.
@pytest.mark.parametrize("database", ["sqlite", "postgresql"], indirect=True)
async def test_a_job_waiting_on_a_machine_drained_meanwhile_runs_elsewhere_unbilled_meanwhile(
    slurm: SlurmCluster, database: DatabaseUnderTest
) -> None:
    first, second = slurm.node_names
    try:
        # Others' work: every GPU of the second machine, every core (no GPU) of the first.
        on_second = await running_foreign_job(
            slurm, "-w", second, f"--gres=gpu:{slurm.gres_type}:{slurm.gpus_per_node}"
        )
        await running_foreign_job(slurm, "-w", first, "-n", str(slurm.cpus_per_node))
        async with running_api(database, scheduling=SCHEDULING) as api:
            await register(api, slurm)
            await eventually(lambda: len(busy_gpus(api, f"{CLUSTER}.{second}")) == 4)
            token = await api.tenant("acme")
            work = await api.submitted(
                token, job("waits", ["sleep", "600"], accelerators_per_worker=4, max_retries=0)
            )
            # Placed on the first machine's free GPUs; Slurm holds it for want of cores.
            worker: dict[str, Any] = {}

            async def waits() -> bool:
                body = await (await api.get(token, f"/v1/jobs/{work}")).json()
                worker.update(body["allocations"][0] if body["allocations"] else {})
                return worker.get("worker_state") == "starting" and "Resources" in str(
                    worker.get("worker_reason")
                )

            await eventually_async(waits, timeout_s=60, message=lambda: f"worker: {worker}")
            assert worker["node_id"] == f"{CLUSTER}.{first}"
            assert worker["worker_reason"].startswith(f"waiting in cluster {CLUSTER}'s queue")
            # Waiting, it holds no GPU there: sampled idle, not at full power.
            record = api.app[REGISTRY].get(f"{CLUSTER}.{first}")
            assert record is not None
            assert record.telemetry is not None
            assert {a.utilization_pct for a in record.telemetry.accelerators} == {0.0}

            # The machine is drained (its other work may finish there; nothing starts).
            await slurm.run("scancel", on_second)
            await slurm.run(
                "scontrol", "update", f"nodename={first}", "state=drain", "reason=maint"
            )
            body = await reaches(api, token, work, "running", timeout_s=90)
            assert body["attempts"] == 2
            assert body["nodes"] == [f"{CLUSTER}.{second}"]
            reasons = [
                msgspec.json.decode(event.payload).get("reason") or ""
                for event in await api.store.list_events(tenant_id=None, limit=1000)
                if event.work_id == work and event.kind == "work.state"
            ]
            assert any(
                f"machine {first} of cluster {CLUSTER} takes no work" in reason
                for reason in reasons
            ), reasons
            # The waiting attempt left Slurm's queue; the second runs.
            await accounted(slurm, work, ["CANCELLED", "RUNNING"])
    finally:
        await slurm.run("scontrol", "update", f"nodename={first}", "state=resume", check=False)


@sqlite_only
@TRANSPORTS
async def test_a_partition_that_is_not_up_takes_no_work(
    slurm: SlurmCluster, database: DatabaseUnderTest, transport: str
) -> None:
    first, second = slurm.node_names  # the first is in `debug` too, the second in `gpu` alone
    await slurm.run("scontrol", "update", "partitionname=gpu", "state=down")
    try:
        async with running_api(database, scheduling=SCHEDULING) as api:
            await register(api, slurm, transport)
            tainted = api.app[REGISTRY].get(f"{CLUSTER}.{second}")
            placed = api.app[REGISTRY].get(f"{CLUSTER}.{first}")
            assert tainted is not None
            assert placed is not None
            assert [t.key for t in tainted.status.taints] == [UNAVAILABLE_TAINT]
            assert placed.status.taints == ()
            assert placed.status.labels["slurm.partition"] == "debug"
            token = await api.tenant("acme")
            work = await api.submitted(
                token, job("through-debug", ["true"], accelerators_per_worker=4)
            )
            await reaches(api, token, work, "succeeded", timeout_s=60)
            (row,) = await accounted(slurm, work, ["COMPLETED"])
            assert row["nodes"] == first
    finally:
        await slurm.run("scontrol", "update", "partitionname=gpu", "state=up", check=False)
