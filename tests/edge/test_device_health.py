"""GPU health as the agent judges it (edge/agent/device_health.py)."""

from __future__ import annotations

from edge.agent.device_health import FAILED_ROUNDS, DeviceHealth
from shared.messages import Accelerator, AcceleratorKind


def device(accelerator_id: str, kind: AcceleratorKind = "gpu") -> Accelerator:
    return Accelerator(
        id=accelerator_id, kind=kind, vendor="v", model="m", memory_bytes=1, compute_units=1
    )


INVENTORY = (device("cpu0", "cpu"), device("gpu0"), device("gpu1"), device("npu0", "npu"))


def test_a_gpu_without_readings_for_two_rounds_is_unhealthy_until_it_answers() -> None:
    health = DeviceHealth(INVENTORY)
    assert not health.observe({"cpu0", "gpu0", "gpu1", "npu0"})
    assert not health.observe({"gpu0"})  # one missed round is not yet a failure
    assert FAILED_ROUNDS == 2
    assert health.observe({"gpu0"})
    assert set(health.unhealthy) == {"gpu1"}  # CPUs and NPUs are not judged
    announced = {a.id: (a.healthy, a.health) for a in health.inventory(INVENTORY)}
    assert announced["gpu0"] == (True, "")
    assert announced["gpu1"][0] is False
    assert "no reading from its driver for 2 telemetry rounds" in announced["gpu1"][1]
    assert not health.observe({"gpu0"})  # still failing: nothing new to announce
    assert health.observe({"gpu0", "gpu1"})  # it answers again
    assert health.unhealthy == {}
    assert all(a.healthy for a in health.inventory(INVENTORY))
