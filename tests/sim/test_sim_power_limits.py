"""Simulated GPUs under a power limit behave as capped hardware: they draw no more than
the limit while held to it, a capped worker trains slower by the shared throughput
curve, and the real agent code holds and restores the limits through them."""

from __future__ import annotations

import asyncio
import random

import pytest

from edge.probes import DeviceProbes, PowerLimitUnavailable
from edge.training.power_limits import PowerLimits
from edge.training.reconcile import TrainingReconciler
from shared.accelerators import capped_throughput
from shared.messages import Accelerator, AcceleratorSample, DesiredTraining
from sim_devices.probes import SimulatedNode
from sim_devices.profiles import get_profile
from sim_devices.training import SimulatedLauncher, SimulatedRun, simulated_runtime_s
from tests.support.waiting import eventually

# A100-SXM4-80GB: 50 W idle, 400 W default limit, 100 W lowest limit; relative speed 1.0.
PROFILE = "a100-4x"
POWER_ROUNDING_W = 0.0005


class FakeMonotonic:
    def __init__(self) -> None:
        self.now_s = 10_000.0

    def __call__(self) -> float:
        return self.now_s


def simulated(seed: int = 3) -> tuple[SimulatedNode, DeviceProbes, FakeMonotonic]:
    clock = FakeMonotonic()
    node = SimulatedNode("sim-1", get_profile(PROFILE), random.Random(seed), monotonic=clock)
    return node, node.probes(), clock


def gpu(node: SimulatedNode, accelerator_id: str) -> Accelerator:
    return next(a for a in node.accelerators if a.id == accelerator_id)


def rounds(probes: DeviceProbes, clock: FakeMonotonic, count: int) -> list[AcceleratorSample]:
    (probe,) = probes.accelerator_probes
    samples: list[AcceleratorSample] = []
    for _ in range(count):
        clock.now_s += 1.0
        samples.extend(probe.sample())
    return samples


def power_of(samples: list[AcceleratorSample], accelerator_id: str) -> list[float]:
    return [s.power_w for s in samples if s.id == accelerator_id and s.power_w is not None]


def test_a_gpu_held_to_a_limit_draws_no_more_than_it_until_its_default_is_back() -> None:
    node, probes, clock = simulated()
    power = probes.gpu_power
    assert power is not None
    rounds(probes, clock, 1)

    assert power.set_power_limit_w(gpu(node, "gpu0"), 120.0) == 120.0
    capped = rounds(probes, clock, 100)
    assert max(power_of(capped, "gpu0")) <= 120.0 + POWER_ROUNDING_W
    assert max(power_of(capped, "gpu1")) > 120.0  # its neighbours draw as before

    power.restore_default_power_limit(gpu(node, "gpu0"))
    assert max(power_of(rounds(probes, clock, 100), "gpu0")) > 120.0


def test_the_limit_takes_hold_at_once_and_is_clamped_like_a_driver_clamps_it() -> None:
    node, probes, clock = simulated()
    power = probes.gpu_power
    assert power is not None
    rounds(probes, clock, 5)
    gpu0 = gpu(node, "gpu0")

    assert power.set_power_limit_w(gpu0, 10.0) == 100.0  # the A100's lowest limit
    assert node.accelerator_samples()[1].power_w == pytest.approx(100.0)  # no round yet
    assert power.set_power_limit_w(gpu0, 5000.0) == 400.0  # its default at most
    with pytest.raises(PowerLimitUnavailable, match="cpu0 does not support power limits"):
        power.set_power_limit_w(gpu(node, "cpu0"), 50.0)
    node.fail("gpu1")
    with pytest.raises(PowerLimitUnavailable, match="gpu1 is not answering"):
        power.set_power_limit_w(gpu(node, "gpu1"), 200.0)


def test_a_capped_simulated_worker_runs_longer_by_the_throughput_curve() -> None:
    node, _, _ = simulated()
    speed = gpu(node, "gpu0").relative_speed
    assert speed is not None

    def runtime_s(limit_w: float | None) -> float:
        spec = DesiredTraining(
            job_id="j",
            accelerator_ids=("gpu0", "gpu1"),
            reference_duration_s=100.0,
            power_limit_w=limit_w,
        )
        run = SimulatedLauncher(node.accelerators).prepare(spec)
        assert isinstance(run, SimulatedRun)
        assert run.runtime_s == simulated_runtime_s(spec, node.accelerators)
        return run.runtime_s

    assert runtime_s(None) == pytest.approx(100.0 / speed)
    assert runtime_s(200.0) == pytest.approx(100.0 / speed / capped_throughput(0.5))
    assert runtime_s(200.0) == pytest.approx(100.0 / speed / 0.8)
    assert runtime_s(10.0) == pytest.approx(100.0 / speed / capped_throughput(0.25))  # clamped
    assert runtime_s(900.0) == pytest.approx(100.0 / speed)


async def test_the_agent_holds_a_simulated_worker_gpu_to_its_limit_while_it_runs() -> None:
    node, probes, clock = simulated()
    changes: list[None] = []
    training = TrainingReconciler(
        SimulatedLauncher(node.accelerators),
        node.accelerators,
        on_change=lambda: changes.append(None),
        on_event=lambda kind, subject, detail: None,
        power_limits=PowerLimits(probes.gpu_power, node.accelerators),
    )
    spec = DesiredTraining(
        job_id="capped",
        accelerator_ids=("gpu0",),
        reference_duration_s=60.0,
        power_limit_w=150.0,
    )
    async with asyncio.timeout(20), asyncio.TaskGroup() as tasks:
        training.bind(tasks)
        training.apply([spec])
        await eventually(lambda: training.reported()[0].power_limit_w == 150.0)
        (report,) = training.reported()
        assert (report.state, report.power_limit_note) == ("running", "")
        assert max(power_of(rounds(probes, clock, 50), "gpu0")) <= 150.0 + POWER_ROUNDING_W

        training.apply([])  # withdrawn: the GPU gets its default back
        await eventually(lambda: max(power_of(rounds(probes, clock, 20), "gpu0")) > 150.0)
        await training.stop_all("test over")
