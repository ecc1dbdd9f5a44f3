"""The agent never sets a power limit for a worker on MIG instances: NVML limits power
per physical GPU, so the parent's limit would hold its sibling instances, other
tenants' work among them, too. A control plane of an older version may still ask: the
worker runs at the default, reports nothing capped and says why, and the agent logs it
once. NVML is faked at the pynvml seam; workers are real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from structlog.testing import CapturingLogger

from edge.discovery.nvidia import NvidiaProbe
from edge.discovery.nvidia_power import NvmlPowerControl
from edge.training import power_limits as power_limits_module
from edge.training.power_limits import ON_MIG_SLICES
from shared.messages import Accelerator
from tests.edge.test_power_limits import _gpus, agent, let_go, report, state_is, worker
from tests.support.fake_nvml import FakeNvml
from tests.support.waiting import eventually

REFUSED_NOTE = f"power limit not applied: {ON_MIG_SLICES}"


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """gpu0: a whole A100 (default 400 W); gpu1: an A100 in MIG mode, gpu1-mig0..2."""
    nvml = FakeNvml(_gpus())
    nvml.install(monkeypatch)
    return nvml


@pytest.fixture
def inventory(fake_nvml: FakeNvml) -> tuple[Accelerator, ...]:
    probe = NvidiaProbe(available_providers=())
    try:
        return tuple(probe.discover())
    finally:
        probe.close()


@pytest.fixture
def captured_log(monkeypatch: pytest.MonkeyPatch) -> CapturingLogger:
    logger = CapturingLogger()
    monkeypatch.setattr(power_limits_module, "log", logger)
    return logger


@pytest.fixture
def go(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "go"
    yield path
    let_go(path)  # no worker outlives the test


async def test_a_limit_asked_for_mig_slices_is_never_applied_to_their_gpu(
    tmp_path: Path,
    fake_nvml: FakeNvml,
    inventory: tuple[Accelerator, ...],
    go: Path,
    captured_log: CapturingLogger,
) -> None:
    whole, mig_parent = fake_nvml.gpus
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        # An older control plane caps two tenants' workers on slices, and one on a
        # whole GPU; a third tenant's worker on a sibling slice asks nothing.
        training.apply(
            [
                worker(go, "slice-a", gpus=("gpu1-mig0",), limit_w=200.0),
                worker(go, "slice-b", gpus=("gpu1-mig1",), limit_w=150.0),
                worker(go, "sibling", gpus=("gpu1-mig2",), limit_w=None),
                worker(go, "whole", gpus=("gpu0",), limit_w=250.0),
            ]
        )
        for job_id in ("slice-a", "slice-b", "sibling", "whole"):
            await state_is(training, "running", job_id)
        # One settle brings every held GPU to what is asked and tells every run.
        await eventually(lambda: report(training, "whole").power_limit_w == 250.0)
        for job_id in ("slice-a", "slice-b"):
            reported = report(training, job_id)
            assert (reported.power_limit_w, reported.power_limit_note) == (None, REFUSED_NOTE)
        sibling = report(training, "sibling")
        assert (sibling.power_limit_w, sibling.power_limit_note) == (None, "")
        assert mig_parent.limits_set_mw == []  # the sibling's GPU runs at its default
        assert mig_parent.power_limit_mw == 400_000
        assert whole.power_limit_mw == 250_000  # a whole GPU is still capped
        let_go(go)
        for job_id in ("slice-a", "slice-b", "sibling", "whole"):
            await state_is(training, "succeeded", job_id)
        await eventually(lambda: whole.power_limit_mw == 400_000)
    assert mig_parent.limits_set_mw == []
    refusals = [
        call.kwargs
        for call in captured_log.calls
        if call.method_name == "warning" and call.kwargs.get("why") == ON_MIG_SLICES
    ]
    assert len(refusals) == 1  # said once, for the first such worker
    assert refusals[0]["limit_w"] in (200.0, 150.0)


async def test_a_gpu_an_older_agent_capped_for_a_slice_gets_its_default_back(
    tmp_path: Path, fake_nvml: FakeNvml, inventory: tuple[Accelerator, ...], go: Path
) -> None:
    mig_parent = fake_nvml.gpus[1]
    # An agent of an older version capped the parent for a worker on a slice, and said
    # so in its file; the worker runs on (taken back, or started again: the same ask).
    mig_parent.power_limit_mw = 200_000
    (tmp_path / "power_limits.json").write_bytes(msgspec.json.encode(["gpu1"]))
    async with agent(tmp_path, inventory, NvmlPowerControl()) as training:
        training.apply([worker(go, "slice-a", gpus=("gpu1-mig0",), limit_w=200.0)])
        await state_is(training, "running", "slice-a")
        # Settled: the report says what the GPU is held to, or why it is not.
        await eventually(
            lambda: (
                report(training, "slice-a").power_limit_w is not None
                or report(training, "slice-a").power_limit_note != ""
            )
        )
        reported = report(training, "slice-a")
        assert (reported.power_limit_w, reported.power_limit_note) == (None, REFUSED_NOTE)
        assert mig_parent.power_limit_mw == 400_000
        let_go(go)
        await state_is(training, "succeeded", "slice-a")
    assert mig_parent.limits_set_mw == [400_000]
    assert msgspec.json.decode((tmp_path / "power_limits.json").read_bytes()) == []
