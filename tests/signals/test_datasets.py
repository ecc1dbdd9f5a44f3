"""The shipped data: intact, attributed, and read into the right zones and hours."""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from cloud.signals.datasets import (
    SHIPPED_FILE_PREFIX,
    SHIPPED_ZONES,
    DatasetError,
    annual_mean_stats,
    checksum_mismatches,
    expected_checksums,
    gcp_region_zones,
    load_traces,
    read_traces,
    shipped_data,
    shipped_traces,
)

from .support import epoch

SHIPPED_FILES = {
    *(f"{prefix}_2023_hourly.csv" for prefix in SHIPPED_FILE_PREFIX.values()),
    *(f"{prefix}_electricity_prices_2023.csv" for prefix in SHIPPED_FILE_PREFIX.values()),
    "umassos_raw_gcp_latency.csv",
    "umassos_gcp_dc_zonecode_mapper.json",
    "umassos_mean_stats.csv",
}


def test_every_shipped_file_matches_its_checksum() -> None:
    assert set(expected_checksums()) == SHIPPED_FILES
    assert checksum_mismatches() == []
    # And the check itself looks at content: recompute one digest independently.
    entry = shipped_data().joinpath("ZA_2023_hourly.csv")
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == expected_checksums()[entry.name]


def test_the_attribution_names_every_source_and_licence() -> None:
    text = shipped_data().joinpath("ATTRIBUTION.md").read_text(encoding="utf-8")
    for needle in (
        "Electricity Maps",
        "Open Data Commons Open Database License (ODbL)",
        "HewlettPackard/green-dcc",
        "3f6ea95cb835b89ba50b0ef76d66d14b8037643e",
        "umassos/decarbonization-potential",
        "3493a63016bd2aaa71cae1f33809576786b331d4",
        "Apache-2.0",
        "MIT",
        *SHIPPED_FILES,
    ):
        assert needle in text, needle


def test_each_zone_has_every_hour_of_2023() -> None:
    traces = shipped_traces()
    assert sorted(traces) == sorted(SHIPPED_ZONES)
    for trace in traces.values():
        assert trace.hours == 8760
        assert trace.start_s == epoch(2023, 1, 1)
        assert trace.end_s == epoch(2024, 1, 1)
        for values in (trace.carbon("lifecycle"), trace.carbon("direct"), trace.price_per_mwh):
            assert np.isfinite(values).all()


@pytest.mark.parametrize(
    ("zone", "hour", "lifecycle", "direct", "price"),
    [
        ("CA-ON", (2023, 1, 1, 0), 50.72, 30.05, 10.1036614),
        ("US-CAL-CISO", (2023, 1, 1, 1), 283.77, 220.25, 118.831175),
        # The DE-LU files serve zone DE (the Zone Id inside them); prices are DE-LU's.
        ("DE", (2023, 1, 1, 0), 185.8, 140.51, -3.3622368),
        ("ZA", (2023, 6, 16, 16), 683.59, 616.31, 306.92717999999996),
        ("CA-ON", (2023, 6, 16, 16), 98.24, 65.64, 21.08666365),
    ],
)
def test_known_values_land_in_their_hour(
    zone: str, hour: tuple[int, int, int, int], lifecycle: float, direct: float, price: float
) -> None:
    trace = shipped_traces()[zone]
    index = trace.hour_index(epoch(*hour))
    assert trace.carbon("lifecycle")[index] == lifecycle
    assert trace.carbon("direct")[index] == direct
    assert trace.price_per_mwh[index] == price


def test_estimated_rows_are_flagged_as_the_data_readme_counts_them() -> None:
    counts = {zone: int(trace.estimated.sum()) for zone, trace in shipped_traces().items()}
    assert counts == {
        "CA-ON": 13,
        "US-CAL-CISO": 2,
        "DE": 30,
        "ZA": 153,
        "JP-TK": 8760,
        "SG": 736,
        "US-NY-NYIS": 49,
        "US-MIDA-PJM": 16,
    }


def test_annual_means_match_the_data_readme() -> None:
    traces = shipped_traces()
    assert round(float(traces["ZA"].carbon("lifecycle").mean())) == 702
    assert round(float(traces["DE"].price_per_mwh.mean()), 1) == 102.6
    assert int((traces["DE"].price_per_mwh < 0).sum()) == 292


def test_supporting_tables_are_readable() -> None:
    assert math.isclose(annual_mean_stats()["ZA"]["2022"], 704.4555753424659)
    assert len(annual_mean_stats()) == 123
    assert gcp_region_zones()["europe-west3"] == "DE"
    assert gcp_region_zones()["us-west2"] == "US-CAL-CISO"


def test_any_directory_in_the_same_format_is_read(tmp_path: Path) -> None:
    source = Path(str(shipped_data()))
    shutil.copy(source / "ZA_2023_hourly.csv", tmp_path / "ZA_2023_hourly.csv")
    traces = load_traces(tmp_path)
    assert list(traces) == ["ZA"]
    assert traces["ZA"].hours == 8760
    # Without a price file the zone has no price, rather than an invented one.
    assert np.isnan(traces["ZA"].price_per_mwh).all()


def test_missing_hours_stay_missing(tmp_path: Path) -> None:
    lines = (Path(str(shipped_data())) / "CA-ON_2023_hourly.csv").read_text("utf-8").splitlines()
    (tmp_path / "CA-ON_2023_hourly.csv").write_text("\n".join(lines[:3] + lines[5:8]), "utf-8")
    trace = read_traces(tmp_path)["CA-ON"]
    assert trace.hours == 7
    assert np.isnan(trace.carbon("lifecycle")[2:4]).all()
    assert trace.carbon("lifecycle")[4] == float(lines[5].split(",")[5])


def test_a_directory_without_carbon_files_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no <ZONE>_<YEAR>_hourly\.csv"):
        read_traces(tmp_path)
    (tmp_path / "XX_2023_hourly.csv").write_text("a,b\n1,2\n", "utf-8")
    with pytest.raises(DatasetError, match=r"XX_2023_hourly\.csv"):
        read_traces(tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_traces(tmp_path / "missing")
