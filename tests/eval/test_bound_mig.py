"""The training optimum on a fleet with MIG-partitioned GPUs: the scheduler places work
on every GPU pool of a node, its MIG slices included, so the optimum must offer them
too, or a policy could emit less than the optimum (a share past 100 %)."""

from __future__ import annotations

import pytest

from cloud.eval.bound import BoundUnavailable, optimum
from cloud.eval.runner import EvalOptions, EvalReport, run_eval
from cloud.scheduler import Node

# Two A100 servers in Ontario (clean), each one whole GPU beside a GPU in MIG mode as
# 7 × 1g.10gb, and a 4-GPU A100 server in South Africa (coal).
MIG_FLEET = """
[[group]]
name = "mig"
profile = "a100-mig"
count = 2
site = "cloud"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "za"
profile = "a100-4x"
count = 1
site = "cloud"
zone = "ZA"
region = "africa-south1"
"""

# Gangs wider than one whole GPU: in Ontario they fit only on slices; five GPUs fit
# nowhere else.
MIG_WORKLOAD = """
seed = 1

[[training]]
id = "two-slices"
tenant = "vision"
submit_offset_s = 0
duration_s = 1800
gpus_per_worker = 2

[[training]]
id = "four-slices"
tenant = "speech"
submit_offset_s = 600
duration_s = 1800
gpus_per_worker = 4

[[training]]
id = "five-slices"
tenant = "language"
submit_offset_s = 900
duration_s = 1200
gpus_per_worker = 5

[[training]]
id = "one-gpu"
tenant = "vision"
submit_offset_s = 1200
duration_s = 3600

[[training]]
id = "two-by-two"
tenant = "recsys"
submit_offset_s = 1800
duration_s = 1800
workers = 2
gpus_per_worker = 2
"""


@pytest.fixture(scope="module")
def mig_report(tmp_path_factory: pytest.TempPathFactory) -> EvalReport:
    directory = tmp_path_factory.mktemp("mig")
    fleet, workload = directory / "fleet.toml", directory / "workload.toml"
    fleet.write_text(MIG_FLEET, encoding="utf-8")
    workload.write_text(MIG_WORKLOAD, encoding="utf-8")
    return run_eval(
        EvalOptions(
            days=1,
            fleet=fleet,
            workload=workload,
            policies=("fifo-binpack", "green"),
            bound=True,
        )
    )


def test_the_optimum_on_a_mig_fleet_includes_every_job_and_no_policy_emits_less(
    mig_report: EvalReport,
) -> None:
    bound = mig_report.bound
    assert bound is not None
    assert bound.jobs == len(mig_report.scenario.workload.training)
    # Some policy did run work on the slices: the case the optimum must cover.
    assert any(
        usage.node_id.startswith("mig") and usage.accelerators > 1
        for outcome in mig_report.outcomes
        for usage in outcome.usages
        if usage.work_id in outcome.jobs
    )
    for result in mig_report.results:
        assert result.training_gco2 >= bound.gco2 * (1 - 1e-9), result.policy


def test_a_job_a_policy_ran_where_the_optimum_has_no_pool_is_an_error(
    mig_report: EvalReport,
) -> None:
    """Left out, the job's emissions would count against the policies and not against
    the optimum. (Here the optimum is handed the fleet without its MIG slices.)"""
    scenario = mig_report.scenario
    without_slices = [
        Node(
            node_id=node.node_id,
            site=node.site,
            zone=node.zone,
            region=node.region,
            pools=tuple(pool for pool in node.pools if "MIG" not in pool.model),
        )
        for node in scenario.nodes
        if node.zone == "CA-ON"
    ]
    with pytest.raises(BoundUnavailable, match=r"two-slices.*no GPU pool"):
        optimum(
            scenario.workload,
            without_slices,
            mig_report.outcomes,
            scenario.recorded,
            mig_report.options.energy,
        )


def test_the_optimum_offers_slices_no_power_cap_and_whole_gpus_their_caps(
    mig_report: EvalReport,
) -> None:
    """No policy caps a MIG slice (NVML's limit is the whole GPU's, so it would hold the
    sibling slices too): an optimum that could would credit itself savings no schedule
    can make, and read every policy's share too low."""
    from cloud.eval.bound import _pools
    from cloud.green.energy import EnergyModel
    from cloud.scheduler import Snapshot

    scenario = mig_report.scenario
    snapshot = Snapshot.build(now=0.0, nodes=scenario.nodes)
    pools = _pools(snapshot, EnergyModel())
    slices = [p for p in pools if "MIG" in snapshot.nodes.model_at(p.column, p.representative)]
    whole = [p for p in pools if p not in slices]
    assert slices
    assert whole
    assert all(len(pool.modes) == 1 for pool in slices)
    assert all(len(pool.modes) > 1 for pool in whole)
