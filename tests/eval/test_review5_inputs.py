"""``greenfed eval`` on inputs a reviewer found it choked on: a fleet without a cloud GPU
to generate training for, and figures that hung on the process's hash seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.generate import generate_workload
from cloud.eval.trace_shaped import generate_trace_shaped
from greenfed.cli import main

from .scenarios import write_scenario

REPOSITORY = Path(__file__).resolve().parents[2]
START_S = 1_685_577_600.0  # 2023-06-01 UTC

EDGE_ONLY_FLEET = """
[[group]]
name = "pi"
profile = "raspberry-pi-5"
count = 2
site = "edge"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "nano"
profile = "jetson-orin-nano"
count = 1
site = "edge"
zone = "DE"
region = "europe-west3"
"""


@pytest.fixture
def edge_only_fleet(tmp_path: Path) -> Path:
    fleet = tmp_path / "edgeonly.toml"
    fleet.write_text(EDGE_ONLY_FLEET, encoding="utf-8")
    return fleet


@pytest.mark.parametrize("generator", ["default", "trace"])
def test_a_fleet_without_cloud_gpus_is_refused_naming_the_fleet_and_workload(
    edge_only_fleet: Path, generator: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "eval",
            "--days",
            "1",
            "--no-optimum",
            "--policies",
            "fifo-binpack",
            "--generator",
            generator,
            "--fleet",
            str(edge_only_fleet),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert str(edge_only_fleet) in err
    assert "no cloud GPU" in err
    assert "--workload" in err


def test_the_generators_refuse_a_fleet_without_cloud_gpus(edge_only_fleet: Path) -> None:
    nodes = load_fleet_nodes(edge_only_fleet)
    with pytest.raises(ValueError, match="no cloud GPU"):
        generate_workload(nodes, start_s=START_S, days=1, seed=1)
    with pytest.raises(ValueError, match="no cloud GPU"):
        generate_trace_shaped(nodes, start_s=START_S, days=1, seed=1)


def test_an_edge_only_fleet_with_a_workload_file_still_runs(
    edge_only_fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal is the generator's: a workload of one's own needs no cloud GPU."""
    workload = tmp_path / "serving.toml"
    workload.write_text("seed = 1\n", encoding="utf-8")
    code = main(
        [
            "eval",
            "--days",
            "1",
            "--no-optimum",
            "--policies",
            "fifo-binpack",
            "--fleet",
            str(edge_only_fleet),
            "--workload",
            str(workload),
            "--json",
        ]
    )
    assert code == 0, capsys.readouterr().err


def _eval_json(args: list[str], hash_seed: str) -> list[dict[str, object]]:
    environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
    completed = subprocess.run(
        [sys.executable, "-m", "greenfed.cli", "eval", *args],
        cwd=REPOSITORY,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results: list[dict[str, object]] = json.loads(completed.stdout)
    for result in results:
        result.pop("runtime_s", None)
    return results


@pytest.mark.timeout(300)
def test_the_same_scenario_gives_the_same_json_whatever_the_hash_seed(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    args = [
        "--days",
        "1",
        "--fleet",
        str(fleet),
        "--workload",
        str(workload),
        "--no-optimum",
        "--policies",
        "fifo-binpack,green",
        "--json",
    ]
    assert _eval_json(args, "1") == _eval_json(args, "2") == _eval_json(args, "3")
