"""What running work on a Slurm cluster through greenfed costs (issue 26), on a real Slurm
22.05 cluster started on this host (tests/support/slurm.py: two slurmd, four declared
A100s each, slurmdbd on the local MariaDB; run as root, Debian's slurm-wlm installed).

- **Submission to running**: a one-GPU job submitted with plain `sbatch` until `squeue`
  says RUNNING, against the same job submitted to greenfed (`POST /v1/jobs`, the real app
  with the cluster registered) until greenfed says `running`. greenfed's overhead is
  the difference of the medians.
- **Reconciliation of 1,000 Slurm jobs**: 1,000 of greenfed's jobs held in Slurm's
  queue, every one named in a document (as after a control plane restart): one bridge
  step (capacity, jobs from `scontrol` and `sacct`, adoption, reports) takes this long.

Both for each way greenfed reaches the cluster (`--transport`): its commands, and its
slurmrestd (22.05's openapi/v0.0.38 on a UNIX socket).

    python benchmarks/slurm_bench.py --runs 11 --jobs 1000

Medians (and the 90th percentile of submission) printed as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp.test_utils import TestClient, TestServer

from cloud.app import create_app
from cloud.clusters.backend import ClusterBackend
from cloud.clusters.bridge import ClusterBridge, ClusterPlacement
from cloud.clusters.slurm.backend import SlurmBackend
from cloud.clusters.slurm.commands import SlurmAccess, SlurmCommands
from cloud.clusters.slurm.rest_backend import SlurmRestBackend
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.slurm.script import SubmitOptions
from cloud.fleet.registry import NodeRegistry
from cloud.store.ids import IdGenerator
from greenfed.broker import EmbeddedBroker
from shared.messages import DesiredState, DesiredTraining
from shared.settings import CloudSettings, MqttSettings, SchedulingSettings, Settings, StoreSettings
from shared.token_files import admin_token_path, read_token_file
from tests.support.slurm import SlurmCluster, slurm_cluster

POLL_S = 0.01


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 60.0) -> float:
    started = time.perf_counter()
    while not await condition():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError("the condition never held")
        await asyncio.sleep(POLL_S)
    return time.perf_counter() - started


async def slurm_state(cluster: SlurmCluster, slurm_id: str) -> str:
    result = await cluster.run("squeue", "-h", "-j", slurm_id, "-o", "%T", check=False)
    return result.stdout.strip()


async def plain_sbatch_s(cluster: SlurmCluster) -> float:
    started = time.perf_counter()
    result = await cluster.run(
        "sbatch", "--parsable", f"--gres=gpu:{cluster.gres_type}:1", "--wrap", "sleep 300"
    )
    slurm_id = result.stdout.strip().split(";")[0]

    async def running() -> bool:
        return await slurm_state(cluster, slurm_id) == "RUNNING"

    await until(running)
    elapsed_s = time.perf_counter() - started
    await cluster.run("scancel", slurm_id)
    await idle(cluster)
    return elapsed_s


def access(cluster: SlurmCluster, transport: str) -> dict[str, str]:
    """The registration's `slurm` object."""
    if transport == "rest":
        return {"rest_url": f"unix:{cluster.restd_socket}", "work_dir": str(cluster.job_dir)}
    return {"slurm_conf": str(cluster.conf_path), "work_dir": str(cluster.job_dir)}


def backend(cluster: SlurmCluster, transport: str) -> ClusterBackend:
    options = SubmitOptions(work_dir=str(cluster.job_dir))
    if transport == "rest":
        return SlurmRestBackend(
            SlurmRestClient(SlurmRestAccess(url=f"unix:{cluster.restd_socket}")), options
        )
    return SlurmBackend(SlurmCommands(SlurmAccess(slurm_conf=str(cluster.conf_path))), options)


@asynccontextmanager
async def greenfed_on(
    cluster: SlurmCluster, transport: str
) -> AsyncIterator[tuple[TestClient[Any, Any], dict[str, str]]]:
    """The real app with the cluster registered; (client, a tenant's headers)."""
    with tempfile.TemporaryDirectory() as directory:
        store = StoreSettings(data_dir=directory)
        async with EmbeddedBroker(port=0) as broker:
            settings = Settings(
                mqtt=MqttSettings(url=broker.url, topic_root="slurmbench"),
                cloud=CloudSettings(invalid_log_interval_s=60),
                store=store,
                scheduling=SchedulingSettings(
                    debounce_s=0.01, interval_s=0.5, node_lost_grace_s=30.0, startup_settle_s=0
                ),
            )
            async with TestClient(TestServer(create_app(settings))) as client:
                admin = {"Authorization": f"Bearer {read_token_file(admin_token_path(store))}"}
                registration = {
                    "name": "lab",
                    "zone": "DE",
                    "region": "europe-west3",
                    "slurm": access(cluster, transport),
                    "refresh_interval_s": 1.0,
                }
                response = await client.post("/v1/clusters", json=registration, headers=admin)
                assert response.status == 201, await response.text()
                response = await client.post("/v1/tenants", json={"name": "bench"}, headers=admin)
                assert response.status == 201, await response.text()
                tenant = {"Authorization": f"Bearer {(await response.json())['token']}"}

                async def nodes_ready() -> bool:
                    response = await client.get("/v1/nodes", headers=admin)
                    return bool((await response.json())["count"] == len(cluster.node_names))

                await until(nodes_ready)
                yield client, tenant


async def through_greenfed_s(
    cluster: SlurmCluster, client: TestClient[Any, Any], tenant: dict[str, str], run: int
) -> float:
    spec = {"name": f"bench-{run}", "command": ["sleep", "300"]}
    started = time.perf_counter()
    response = await client.post("/v1/jobs", json=spec, headers=tenant)
    assert response.status == 201, await response.text()
    job_id = (await response.json())["id"]

    async def state_is(wanted: str) -> bool:
        response = await client.get(f"/v1/jobs/{job_id}", headers=tenant)
        return bool((await response.json())["state"] == wanted)

    await until(lambda: state_is("running"))
    elapsed_s = time.perf_counter() - started
    await client.delete(f"/v1/jobs/{job_id}", headers=tenant)
    await until(lambda: state_is("cancelled"))
    await idle(cluster)
    return elapsed_s


async def idle(cluster: SlurmCluster) -> None:
    """Every node idle again (the last job's cleanup done): each run starts alike."""

    async def all_idle() -> bool:
        result = await cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return set(result.stdout.split()) == {"idle"}

    await until(all_idle)


async def reconciliation_s(
    cluster: SlurmCluster, jobs: int, steps: int, transports: list[str]
) -> dict[str, Any]:
    ids = IdGenerator()
    job_ids = [ids.new_id() for _ in range(jobs)]
    submit_started = time.perf_counter()
    for job_id in job_ids:
        await cluster.run(
            "sbatch", "--hold", f"--job-name=gf-{job_id}-1", "--output=/dev/null", "--wrap", "true"
        )
    submitted_s = time.perf_counter() - submit_started
    nodes = [f"lab.{name}" for name in cluster.node_names]
    documents = [
        DesiredState(
            node_id=node_id,
            generation=1,
            issued_at=time.time(),
            cluster_id="bench",
            training=tuple(
                DesiredTraining(job_id=job_id, attempt=1, command=("true",))
                for job_id in job_ids[index :: len(nodes)]
            ),
        )
        for index, node_id in enumerate(nodes)
    ]

    def restarted_bridge(transport: str) -> tuple[ClusterBridge, NodeRegistry]:
        """A control plane's bridge just started, the loop's documents handed over."""
        registry = NodeRegistry(max_nodes=10)
        bridge = ClusterBridge(
            "lab", backend(cluster, transport), registry, ClusterPlacement("DE", "europe-west3")
        )
        for document in documents:
            bridge.accept(document)
        return bridge, registry

    figures: dict[str, Any] = {
        "slurm_jobs": jobs,
        "sbatch_each_ms": round(1000 * submitted_s / jobs, 1),
    }
    for transport in transports:
        first_step_s = []
        for _ in range(steps):
            bridge, registry = restarted_bridge(transport)
            started = time.perf_counter()
            await bridge.step()  # the history read too, every job adopted
            first_step_s.append(time.perf_counter() - started)
            await bridge.backend.close()
        bridge, registry = restarted_bridge(transport)
        await bridge.step()
        steady_s = []
        for _ in range(steps):
            started = time.perf_counter()
            await bridge.step()
            steady_s.append(time.perf_counter() - started)
        await bridge.backend.close()
        figures[transport] = {
            "adopted": sum(1 for job_id in job_ids if bridge.job_of(job_id, 1) is not None),
            "reported": sum(
                len(record.reported.training)
                for record in [registry.get(node_id) for node_id in nodes]
                if record is not None and record.reported is not None
            ),
            "restarted_bridge_first_step_ms": round(1000 * statistics.median(first_step_s)),
            "steady_step_ms": round(1000 * statistics.median(steady_s)),
        }
    await cluster.cancel_all_jobs()
    return figures


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--transport", choices=("commands", "rest", "both"), default="both")
    args = parser.parse_args()
    transports = ["commands", "rest"] if args.transport == "both" else [args.transport]
    async with slurm_cluster() as cluster:
        for transport in transports:
            # Interleaved, each from an idle cluster: Slurm's own start latency (its
            # batch scheduling runs on events, about once a second) weighs on both alike.
            plain: list[float] = []
            greenfed: list[float] = []
            async with greenfed_on(cluster, transport) as (client, tenant):
                for run in range(args.runs):
                    plain.append(await plain_sbatch_s(cluster))
                    greenfed.append(await through_greenfed_s(cluster, client, tenant, run))
            print(
                json.dumps(
                    {
                        "transport": transport,
                        "runs": args.runs,
                        "plain_sbatch_to_running_p50_s": round(statistics.median(plain), 3),
                        "plain_sbatch_to_running_p90_s": round(p90(plain), 3),
                        "greenfed_to_running_p50_s": round(statistics.median(greenfed), 3),
                        "greenfed_to_running_p90_s": round(p90(greenfed), 3),
                        "overhead_p50_s": round(
                            statistics.median(greenfed) - statistics.median(plain), 3
                        ),
                    }
                )
            )
        print(json.dumps(await reconciliation_s(cluster, args.jobs, args.steps, transports)))


if __name__ == "__main__":
    asyncio.run(main())
