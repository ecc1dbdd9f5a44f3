"""A small fleet and workload for fast evaluation tests."""

from __future__ import annotations

from pathlib import Path

SMALL_FLEET = """
[[group]]
name = "a100-toronto"
profile = "a100-4x"
count = 1
site = "cloud"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "h100-la"
profile = "h100-8x"
count = 1
site = "cloud"
zone = "US-CAL-CISO"
region = "us-west2"

[[group]]
name = "v100-fra"
profile = "v100-8x"
count = 1
site = "cloud"
zone = "DE"
region = "europe-west3"

[[group]]
name = "orin-toronto"
profile = "jetson-orin-nano"
count = 2
site = "edge"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "t4-fra"
profile = "t4-inference-server"
count = 1
site = "edge"
zone = "DE"
region = "europe-west3"
"""

SMALL_WORKLOAD = """
seed = 1

[[training]]
id = "t1"
tenant = "vision"
submit_offset_s = 0
duration_s = 7200
gpus_per_worker = 4

[[training]]
id = "t2"
tenant = "speech"
submit_offset_s = 600
duration_s = 3600
workers = 2
gpus_per_worker = 4
deadline_offset_s = 43200

[[training]]
id = "t3"
tenant = "vision"
submit_offset_s = 1200
duration_s = 5400
max_delay_s = 21600

[[training]]
id = "t4"
tenant = "recsys"
submit_offset_s = 30000
duration_s = 1800
gpus_per_worker = 8

[[inference]]
id = "cams-toronto"
tenant = "city"
replicas = 2
accepted_kinds = ["gpu"]
latency_slo_ms = 60.0
reference_ms_per_request = 0.5
peak_requests_per_s = 20.0
traffic = [{ region = "northamerica-northeast2", share = 1.0, utc_offset_hours = -5.0 }]

[[inference]]
id = "ocr-eu"
tenant = "docs"
start_offset_s = 60
accepted_kinds = ["gpu", "cpu"]
latency_slo_ms = 200.0
reference_ms_per_request = 1.0
peak_requests_per_s = 5.0
traffic = [{ region = "europe-west3", share = 1.0, utc_offset_hours = 1.0 }]
"""


def write_scenario(directory: Path) -> tuple[Path, Path]:
    fleet = directory / "fleet.toml"
    workload = directory / "workload.toml"
    fleet.write_text(SMALL_FLEET, encoding="utf-8")
    workload.write_text(SMALL_WORKLOAD, encoding="utf-8")
    return fleet, workload
