"""Workload files and the generated default workload."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cloud.eval.fleet import load_fleet_nodes
from cloud.eval.generate import (
    INFERENCE,
    WorkloadParams,
    arrival_factor,
    cloud_gpu_throughput,
    generate_workload,
)
from cloud.eval.workload import (
    dump_workload,
    load_workload,
    requests_per_s,
    traffic_profile,
    traffic_weights,
)
from shared.settings import ConfigError

from .scenarios import SMALL_WORKLOAD, write_scenario

START = 1_685_577_600.0  # 2023-06-01T00:00:00Z


def write(tmp_path: Path, text: str, name: str = "w.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_small_workload_loads(tmp_path: Path) -> None:
    _, path = write_scenario(tmp_path)
    workload = load_workload(path)
    assert [spec.id for spec in workload.training] == ["t1", "t2", "t3", "t4"]
    assert workload.training[1].workers == 2
    assert workload.inference[0].traffic[0].region == "northamerica-northeast2"


def test_unknown_keys_are_errors_naming_the_key(tmp_path: Path) -> None:
    text = SMALL_WORKLOAD.replace("gpus_per_worker = 4\n", "gpus = 4\n", 1)
    with pytest.raises(ConfigError, match=r"unknown field `gpus`.*\$\.training\[0\]"):
        load_workload(write(tmp_path, text))


def test_bad_values_are_errors_naming_the_key(tmp_path: Path) -> None:
    text = SMALL_WORKLOAD.replace("duration_s = 7200", "duration_s = -5", 1)
    with pytest.raises(ConfigError, match=r"\$\.training\[0\]\.duration_s"):
        load_workload(write(tmp_path, text))
    missing = SMALL_WORKLOAD.replace('tenant = "vision"\n', "", 1)
    with pytest.raises(ConfigError, match="missing required field `tenant`"):
        load_workload(write(tmp_path, missing))


def test_bad_score_weights_and_duplicate_ids_name_the_job(tmp_path: Path) -> None:
    weights = SMALL_WORKLOAD.replace(
        'id = "t3"\n', 'id = "t3"\nscore_weights = { carbn = 1.0 }\n', 1
    )
    with pytest.raises(ConfigError, match=r"training\[2\]: t3: score_weights names unknown term"):
        load_workload(write(tmp_path, weights))
    duplicate = SMALL_WORKLOAD.replace('id = "t2"', 'id = "t1"', 1)
    with pytest.raises(ConfigError, match=r"training\[1\]\.id: duplicate id 't1'"):
        load_workload(write(tmp_path, duplicate))


def test_json_workloads_and_a_round_trip(tmp_path: Path) -> None:
    _, path = write_scenario(tmp_path)
    workload = load_workload(path)
    again = load_workload(write(tmp_path, dump_workload(workload), "w.json"))
    assert again == workload
    with pytest.raises(ConfigError, match="not valid json"):
        load_workload(write(tmp_path, "{", "bad.json"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_workload(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="top level"):
        load_workload(write(tmp_path, json.dumps([1]), "list.json"))


def test_the_daily_traffic_profile() -> None:
    assert traffic_profile(4.0) == pytest.approx(0.25)
    assert traffic_profile(16.0) == pytest.approx(1.0)
    spec = INFERENCE[0]  # Los Angeles only, UTC-8
    at_la_4pm = START + (16 + 8) * 3600.0
    assert requests_per_s(spec, at_la_4pm) == pytest.approx(spec.peak_requests_per_s)
    assert sum(traffic_weights(spec, at_la_4pm).values()) == pytest.approx(spec.peak_requests_per_s)


def test_the_generator_is_deterministic_and_hits_its_load() -> None:
    nodes = load_fleet_nodes()
    # One Toronto A100 server is MIG-partitioned: one whole A100 and seven 1g.10gb slices.
    assert cloud_gpu_throughput(nodes) == pytest.approx(61.2)
    first = generate_workload(nodes, start_s=START, days=7, seed=5)
    again = generate_workload(nodes, start_s=START, days=7, seed=5)
    other = generate_workload(nodes, start_s=START, days=7, seed=6)
    assert first == again
    assert first != other
    params = WorkloadParams()
    work = sum(s.workers * s.gpus_per_worker * s.duration_s for s in first.training)
    offered = work / (7 * 86400) / cloud_gpu_throughput(nodes)
    assert offered == pytest.approx(params.target_load, rel=0.25)
    flexible = [s for s in first.training if s.deadline_offset_s or s.max_delay_s is not None]
    assert len(flexible) / len(first.training) == pytest.approx(params.flexible_share, abs=0.07)
    sizes = {s.workers * s.gpus_per_worker for s in first.training}
    assert sizes <= {1, 2, 4, 8}
    assert min(sizes) == 1
    assert max(sizes) == 8
    assert all(300 <= s.duration_s <= 36 * 3600 for s in first.training)
    assert [s.start_offset_s for s in first.inference] == [60.0 * i for i in range(8)]


def test_arrivals_follow_the_working_day_and_week() -> None:
    monday = START + 4 * 86400  # 2023-06-05
    assert arrival_factor(monday + 15 * 3600) == 1.5
    assert arrival_factor(monday + 3 * 3600) == 0.5
    assert math.isclose(arrival_factor(monday - 86400 + 15 * 3600), 0.9)  # Sunday


def test_tenants_carry_quotas_and_bad_ones_are_named(tmp_path: Path) -> None:
    tenants = """
[[tenants]]
name = "vision"
quotas = { gpu = 8 }
cohort = "research"
borrowing_limit = { gpu = 4 }

[[tenants]]
name = "speech"
"""
    workload = load_workload(write(tmp_path, SMALL_WORKLOAD + tenants))
    vision, speech = (spec.to_tenant() for spec in workload.tenants)
    assert vision.nominal == {"gpu": 8}
    assert vision.borrowing_limit == {"gpu": 4}
    assert vision.cohort == "research"
    assert speech.nominal == {}
    assert speech.cohort is None
    duplicate = tenants.replace('"speech"', '"vision"')
    with pytest.raises(ConfigError, match=r"tenants\[1\]\.name: duplicate tenant 'vision'"):
        load_workload(write(tmp_path, SMALL_WORKLOAD + duplicate))
    negative = tenants.replace("gpu = 8", "gpu = -1")
    with pytest.raises(ConfigError, match=r"\$\.tenants\[0\]\.quotas"):
        load_workload(write(tmp_path, SMALL_WORKLOAD + negative))
    unknown_kind = tenants.replace("gpu = 8", "tpu = 8")
    with pytest.raises(ConfigError, match=r"\$\.tenants\[0\]\.quotas"):
        load_workload(write(tmp_path, SMALL_WORKLOAD + unknown_kind))
