"""Where work waiting in Slurm's own queue cannot start (review round 6, follow-up of
tests/integration/test_review6_slurm_queue.py), on the real two-node cluster of
tests/support/slurm.py (`gpu`: both machines; `debug`: the first), through greenfed's
REST API:

- a cluster registered for `gpu` alone, `gpu` down: the first machine is up only through
  `debug`, which greenfed may not use, so it is tainted (no job placed there to wait);
- a job waiting in `gpu` when `gpu` goes down (Slurm's reason: PartitionDown), on a
  machine that still takes work through `debug`, is given up after the grace and placed
  again, through `debug`; while it waits its GPUs draw nothing of greenfed's (0 W).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from cloud.clusters.bridge import UNAVAILABLE_TAINT
from tests.api.support import running_api
from tests.integration.test_review6_slurm_queue import busy_gpus, running_foreign_job
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


@sqlite_only
@TRANSPORTS
async def test_a_machine_up_only_through_a_partition_greenfed_may_not_use_takes_no_work(
    slurm: SlurmCluster, database: DatabaseUnderTest, transport: str
) -> None:
    first, second = slurm.node_names
    await slurm.run("scontrol", "update", "partitionname=gpu", "state=down")
    try:
        async with running_api(database, scheduling=SCHEDULING) as api:
            await register(api, slurm, transport, partitions={"gpu": None})
            for machine in (first, second):
                record = api.app[REGISTRY].get(f"{CLUSTER}.{machine}")
                assert record is not None
                assert [t.key for t in record.status.taints] == [UNAVAILABLE_TAINT], machine
                assert record.status.labels["slurm.partition"] == "gpu"
    finally:
        await slurm.run("scontrol", "update", "partitionname=gpu", "state=up", check=False)


# The requeue goes through the store (an eviction, its events): both databases.
@pytest.mark.parametrize("database", ["sqlite", "postgresql"], indirect=True)
async def test_a_job_waiting_in_a_partition_gone_down_runs_again_through_one_that_is_up(
    slurm: SlurmCluster, database: DatabaseUnderTest
) -> None:
    first, second = slurm.node_names
    try:
        # Others' work: every GPU of the second machine, every core of the first.
        await running_foreign_job(
            slurm, "-w", second, f"--gres=gpu:{slurm.gres_type}:{slurm.gpus_per_node}"
        )
        on_first = await running_foreign_job(slurm, "-w", first, "-n", str(slurm.cpus_per_node))
        async with running_api(database, scheduling=SCHEDULING) as api:
            await register(api, slurm)
            await eventually(lambda: len(busy_gpus(api, f"{CLUSTER}.{second}")) == 4)
            token = await api.tenant("acme")
            work = await api.submitted(
                token, job("waits", ["sleep", "600"], accelerators_per_worker=4, max_retries=0)
            )
            worker: dict[str, Any] = {}

            async def waits() -> bool:
                body = await (await api.get(token, f"/v1/jobs/{work}")).json()
                worker.update(body["allocations"][0] if body["allocations"] else {})
                return worker.get("worker_state") == "starting" and "Resources" in str(
                    worker.get("worker_reason")
                )

            await eventually_async(waits, timeout_s=60, message=lambda: f"worker: {worker}")
            assert worker["node_id"] == f"{CLUSTER}.{first}"
            # Waiting, its GPUs draw nothing of greenfed's: billed nothing meanwhile.
            record = api.app[REGISTRY].get(f"{CLUSTER}.{first}")
            assert record is not None
            assert record.telemetry is not None
            assert {a.power_w for a in record.telemetry.accelerators} == {0.0}

            # `gpu` goes down: the job waits there for ever (its cores free now), while
            # its machine still takes work through `debug`.
            await slurm.run("scontrol", "update", "partitionname=gpu", "state=down")
            await slurm.run("scancel", on_first)
            body = await reaches(api, token, work, "running", timeout_s=120)
            assert body["attempts"] == 2
            assert body["nodes"] == [f"{CLUSTER}.{first}"]
            reasons = [
                msgspec.json.decode(event.payload).get("reason") or ""
                for event in await api.store.list_events(tenant_id=None, limit=1000)
                if event.work_id == work and event.kind == "work.state"
            ]
            assert any(
                f"cluster {CLUSTER} cannot start the job where it waits in its queue" in reason
                and "PartitionDown" in reason
                for reason in reasons
            ), reasons
            await accounted(slurm, work, ["CANCELLED", "RUNNING"])
    finally:
        await slurm.run("scontrol", "update", "partitionname=gpu", "state=up", check=False)
