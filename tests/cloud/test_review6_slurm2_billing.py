"""A job waiting in a cluster's queue holds nothing there (review round 6, follow-up of
the waiting-job fix): usage metering (cloud/usage/meter.py, fed the bridge's own
samples) bills its GPUs nothing until the cluster runs it, gaps between samples
included (a slow refresh, a cluster that did not answer), where the energy model would
fill them at the GPUs' idle power. Its share of the machine's host (the CPU, which the
bridge does not sample) is modelled as for a running job.
"""

from __future__ import annotations

import pytest

from cloud.clusters.backend import ClusterJob
from cloud.clusters.bridge import ClusterBridge, ClusterPlacement
from cloud.fleet.registry import NodeRegistry
from cloud.loop.nodes import device_power_w
from cloud.usage.meter import MeteredAllocation, NodeMark, meter
from shared.messages import Telemetry
from tests.cloud.test_cluster_bridge import JOB, MemoryCluster, document, training

GPUS = ("gpu0", "gpu1", "gpu2", "gpu3")
PLACED_AT_S = 1000.0


def allocation() -> MeteredAllocation:
    return MeteredAllocation(
        work_id=JOB,
        member_index=0,
        tenant_id="acme",
        node_id="lab.n2",
        accelerator_kind="gpu",
        accelerators=len(GPUS),
        accelerator_ids=GPUS,
        work_kind="training",
        started_at_s=PLACED_AT_S,
    )


class Metered:
    """The bridge's samples of lab.n2 metered as the leader's accountant meters them."""

    def __init__(self, registry: NodeRegistry) -> None:
        self.registry = registry
        self.mark: NodeMark | None = None
        self.energy_j = 0.0
        self.host_j = 0.0  # what the machine's CPU (modelled idle) adds over the same steps

    def __call__(self, telemetry: Telemetry) -> None:
        if telemetry.node_id != "lab.n2":
            return
        record = self.registry.get("lab.n2")
        assert record is not None
        started_s = self.mark.sampled_at_s if self.mark is not None else None
        increments, self.mark = meter(record.status, telemetry, self.mark, (allocation(),))
        self.energy_j += sum(increment.energy_j for increment in increments)
        if started_s is not None:
            (cpu,) = [a for a in record.status.accelerators if a.kind == "cpu"]
            idle_w, _ = device_power_w(cpu)
            self.host_j += idle_w * (telemetry.sampled_at - started_s)


@pytest.mark.timeout(30)
async def test_a_waiting_jobs_gpus_are_billed_nothing_until_the_cluster_runs_it() -> None:
    cluster = MemoryCluster()
    registry = NodeRegistry(max_nodes=10)
    metered = Metered(registry)
    clock = [PLACED_AT_S]
    bridge = ClusterBridge(
        "lab",
        cluster,
        registry,
        ClusterPlacement("DE", "europe-west3"),
        telemetry_listeners=(metered,),
        refresh_interval_s=5.0,
        clock=lambda: clock[0],
    )
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "pending", reason="Resources")
    bridge.accept(document("lab.n2", training(ids=GPUS)))
    await bridge.step()
    for step_s in (5.0, 5.0, 120.0, 5.0):  # a refresh two minutes late among them
        clock[0] += step_s
        await bridge.step()
    assert metered.host_j > 0
    assert metered.energy_j == pytest.approx(metered.host_j)  # the GPUs: nothing
    # The cluster runs it: its GPUs are billed busy from then on.
    cluster.jobs_held["7"] = ClusterJob("7", JOB, 1, "running", nodes=("n2",))
    waited_j = metered.energy_j
    clock[0] += 5.0
    await bridge.step()
    record = registry.get("lab.n2")
    assert record is not None
    max_w = sum(device_power_w(a)[1] for a in record.status.accelerators if a.id in GPUS)
    assert metered.energy_j - waited_j >= max_w * 5.0
