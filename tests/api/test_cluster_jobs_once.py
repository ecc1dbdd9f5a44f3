"""A cluster job runs once, whatever the control plane does meanwhile (docs/backends.md):
a control plane restarted after its job ended and aged out of the cluster's memory,
on a cluster that keeps no accounting, never submits that attempt again (it ends
`failed`, "disappeared"); and a cluster is not removed while greenfed's jobs wait in its
queue (they would run there later, orphaned, while greenfed places them again). Slurm's
commands are faked by a bin_dir of scripts (tests/support/slurm_commands.py);
tests/integration/test_slurm_backend.py runs a real cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, reaches
from tests.support.slurm_commands import FakeSlurmBin, job_line
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(120)
# A node is not given up on while the restarted control plane's bridge births it.
SCHEDULING = msgspec.structs.replace(FAST_LOOP, node_lost_grace_s=10.0)
NO_ACCOUNTING = "sacct: error: Slurm accounting storage is disabled"


async def register(api: Api, slurm: FakeSlurmBin, work_dir: Path) -> None:
    body: dict[str, Any] = {
        "name": "lab",
        "zone": "DE",
        "region": "europe-west3",
        "slurm": {"bin_dir": str(slurm.path), "work_dir": str(work_dir)},
        "refresh_interval_s": 1.0,
    }
    response = await api.client.post("/v1/clusters", json=body, headers=bearer(api.admin_token))
    assert response.status == 201, await response.text()
    await eventually(lambda: api.app[REGISTRY].get("lab.gfnode1") is not None, timeout_s=30)


async def test_a_restarted_control_plane_never_runs_an_ended_attempt_again(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    slurm = FakeSlurmBin(tmp_path / "bin")
    slurm.answer("sacct", err=NO_ACCOUNTING, status=1)
    slurm.answer("sbatch", "5;lab\n")
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm, tmp_path)
        token = await api.tenant("acme")
        job = await api.submitted(
            token,
            {"name": "once", "command": ["true"], "accelerators_per_worker": 1, "max_retries": 0},
        )
        await eventually(lambda: len(slurm.calls("sbatch")) == 1, timeout_s=30)
        slurm.answer("scontrol-job", job_line("5", job, 1, "RUNNING") + "\n")
        await reaches(api, token, job, "running", timeout_s=30)

    # Down meanwhile: the job ended, and slurmctld forgot it (MinJobAge); no sacct.
    slurm.answer("scontrol-job", "")
    async with running_api(database, scheduling=SCHEDULING) as api:
        body = await reaches(api, token, job, "failed", timeout_s=60)
        assert "disappeared from cluster lab" in body["reason"]
        assert body["attempts"] == 1
    assert len(slurm.calls("sbatch")) == 1


async def test_a_cluster_is_not_removed_while_greenfeds_jobs_wait_in_its_queue(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    slurm = FakeSlurmBin(tmp_path / "bin")
    slurm.answer("sacct", err=NO_ACCOUNTING, status=1)
    slurm.answer("sbatch", "5;lab\n")
    async with running_api(database, scheduling=SCHEDULING) as api:
        await register(api, slurm, tmp_path)
        token = await api.tenant("acme")
        job = await api.submitted(
            token, {"name": "queued", "command": ["true"], "accelerators_per_worker": 1}
        )
        await eventually(lambda: len(slurm.calls("sbatch")) == 1, timeout_s=30)
        slurm.answer("scontrol-job", job_line("5", job, 1, "PENDING", Reason="Resources") + "\n")

        refused = await api.client.delete("/v1/clusters/lab", headers=bearer(api.admin_token))
        body = await problem(refused, 409)
        assert job in body["detail"]
        assert "cancel them" in body["detail"]
        assert api.app[REGISTRY].get("lab.gfnode1") is not None

        # Once it ended there, the cluster goes.
        ended = job_line("5", job, 1, "COMPLETED", EndTime="1700000009")
        slurm.answer("scontrol-job", ended + "\n")
        await reaches(api, token, job, "succeeded", timeout_s=30)

        async def removed() -> bool:
            response = await api.client.delete("/v1/clusters/lab", headers=bearer(api.admin_token))
            return response.status == 200

        await eventually_async(removed, timeout_s=30, interval_s=0.5)
        await eventually(lambda: api.app[REGISTRY].get("lab.gfnode1") is None, timeout_s=10)
