"""The evaluation credits no power cap on MIG slices: the live system never holds a
slice to a limit (NVML limits power per physical GPU, so the cap would hold the
slices beside it too), so the simulation, which runs the live pass rule, runs and
charges work on slices at the default limit, while work on whole GPUs is capped."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from cloud.eval.runner import EvalOptions, run_eval

SLICE = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
WHOLE = "NVIDIA A100-SXM4-80GB"

# One A100 server in South Africa (a dirty grid): one whole A100 beside one cut into 7 × 1g.10gb.
MIG_SERVER = """
[[group]]
name = "mig"
profile = "a100-mig"
count = 1
site = "cloud"
zone = "ZA"
region = "africa-south1"
"""

# One job on the whole A100, and one wider than it, so on slices.
WHOLE_AND_SLICES = """
seed = 1

[[training]]
id = "whole"
tenant = "vision"
submit_offset_s = 0
duration_s = 3600
gpus_per_worker = 1

[[training]]
id = "sliced"
tenant = "speech"
submit_offset_s = 0
duration_s = 3600
gpus_per_worker = 3
"""


def test_the_green_policy_in_the_evaluation_caps_whole_gpus_but_never_slices(
    tmp_path: Path,
) -> None:
    fleet_path, workload_path = tmp_path / "fleet.toml", tmp_path / "workload.toml"
    fleet_path.write_text(MIG_SERVER, encoding="utf-8")
    workload_path.write_text(WHOLE_AND_SLICES, encoding="utf-8")
    report = run_eval(
        EvalOptions(
            start=date(2023, 6, 1),
            days=1,
            fleet=fleet_path,
            workload=workload_path,
            policies=("green",),
        )
    )
    [outcome] = report.outcomes
    held = {u.work_id: (u.accelerator_model, u.power_limit_w is not None) for u in outcome.usages}
    assert held == {"whole": (WHOLE, True), "sliced": (SLICE, False)}
    assert outcome.jobs["whole"].capped
    assert not outcome.jobs["sliced"].capped
