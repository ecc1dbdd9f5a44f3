"""The energy model against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from cloud.green.energy import EnergyModel, linear_power_w
from cloud.scheduler import Candidates, InferenceDeployment, TrainingJob

from .builders import T0, gpu_server, snapshot


def candidates(snap_nodes: int, runtime_s: list[float], accelerators: int = 1) -> Candidates:
    return Candidates(
        np.arange(snap_nodes), "gpu", accelerators, np.array(runtime_s, dtype=np.float64)
    )


def test_linear_power() -> None:
    assert linear_power_w(50.0, 400.0, 0.0) == 50.0
    assert linear_power_w(50.0, 400.0, 1.0) == 400.0
    assert linear_power_w(50.0, 400.0, 0.8) == pytest.approx(330.0)


def test_training_kwh_with_the_host_cpu_share() -> None:
    # 4 A100s (50-400 W) and a host CPU (100-500 W); a 2 GPU x 2 worker job of 2 h.
    snap = snapshot([gpu_server("a", "X")])
    job = TrainingJob(
        work_id="j", tenant="t", workers=2, accelerators_per_worker=2, duration_s=7200.0
    )
    kwh = EnergyModel().training_kwh(snap, job, candidates(1, [7200.0], 2))
    # per worker: 2 x 330 W + host 420 W x 2/4 = 870 W; two workers for 2 h: 3.48 kWh
    assert kwh[0] == pytest.approx(2 * (2 * 330.0 + 420.0 * 2 / 4) * 2 / 1000)


def test_faster_nodes_run_shorter() -> None:
    snap = snapshot([gpu_server("a", "X"), gpu_server("b", "X", speed=2.0)])
    job = TrainingJob(work_id="j", tenant="t", duration_s=3600.0)
    kwh = EnergyModel().training_kwh(snap, job, candidates(2, [3600.0, 1800.0]))
    assert kwh[1] == pytest.approx(kwh[0] / 2)


def test_nodes_without_a_cpu_pool_use_the_overhead_ratio_and_pue_scales() -> None:
    snap = snapshot([gpu_server("a", "X", cpu=None)])
    job = TrainingJob(work_id="j", tenant="t", duration_s=3600.0)
    model = EnergyModel(host_overhead_ratio=0.25, pue=1.2)
    kwh = model.training_kwh(snap, job, candidates(1, [3600.0]))
    assert kwh[0] == pytest.approx(330.0 * 1.25 * 1.2 / 1000)


def test_inference_utilisation_follows_the_load() -> None:
    snap = snapshot([gpu_server("a", "X", speed=0.5)])
    deployment = InferenceDeployment(
        work_id="d",
        tenant="t",
        replicas=2,
        requests_per_s=100.0,
        reference_ms_per_request=2.0,
    )
    model = EnergyModel()
    # 50 req/s per replica x 4 ms on a half-speed GPU: busy 20 % of the time.
    busy = model.replica_utilisation(snap, deployment, "gpu", np.array([0]))
    assert busy[0] == pytest.approx(0.2)
    kw = model.inference_kw(snap, deployment, candidates(1, [np.inf]))
    gpu_w = 50 + 350 * 0.2
    host_w = (100 + 400 * 0.2) * 1 / 4
    assert kw[0] == pytest.approx((gpu_w + host_w) / 1000)


def test_unknown_inference_load_uses_the_default_utilisation() -> None:
    snap = snapshot([gpu_server("a", "X")])
    deployment = InferenceDeployment(work_id="d", tenant="t")
    busy = EnergyModel(inference_utilisation=0.3).replica_utilisation(
        snap, deployment, "gpu", np.array([0])
    )
    assert busy[0] == 0.3


def test_running_on_the_cpu_pool_has_no_separate_host_share() -> None:
    snap = snapshot([gpu_server("a", "X")])
    power = EnergyModel().member_power_w(snap, "cpu", np.array([0]), 1, 0.5)
    assert power[0] == pytest.approx(300.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"training_utilisation": 1.5}, {"pue": 0.9}, {"host_overhead_ratio": -1.0}],
)
def test_the_model_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        EnergyModel(**kwargs)


def test_snapshot_time_does_not_matter() -> None:
    job = TrainingJob(work_id="j", tenant="t", duration_s=3600.0)
    a = EnergyModel().training_kwh(snapshot([gpu_server("a", "X")]), job, candidates(1, [3600.0]))
    b = EnergyModel().training_kwh(
        snapshot([gpu_server("a", "X")], now=T0 + 86400), job, candidates(1, [3600.0])
    )
    assert a[0] == b[0]
