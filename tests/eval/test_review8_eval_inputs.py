"""``greenfed eval`` accounts nothing it has no data for: a series that ends before the
drain after the period may is refused (its last hour would otherwise stand in for up to
14 days of figures nobody recorded, in the policies' CO2 and in the optimum's), a
missing zone no fallback can account is refused rather than printed as NaN or crashing
the optimum, and a carbon file saved with a UTF-8 byte-order mark reads as any other."""

from __future__ import annotations

import dataclasses
import math
from datetime import date
from pathlib import Path

import pytest

from cloud.eval.metrics import PolicyResult
from cloud.eval.report import table
from cloud.eval.runner import EvalOptions, build_scenario
from cloud.signals.datasets import read_traces, shipped_data
from greenfed.cli import main

from .scenarios import SMALL_FLEET, write_scenario

# The small fleet's zones, by the prefix of their files.
PREFIXES = ("CA-ON", "US-CAL-CISO", "DE-LU")
BYTE_ORDER_MARK = b"\xef\xbb\xbf"


def shipped_traces_copy(directory: Path, *, carbon_before: dict[str, str] | None = None) -> Path:
    """The small fleet's shipped carbon and price files; for each prefix in
    `carbon_before`, its carbon file keeps only the rows before that time (ISO text)."""
    directory.mkdir()
    for prefix in PREFIXES:
        for name in (f"{prefix}_2023_hourly.csv", f"{prefix}_electricity_prices_2023.csv"):
            lines = (shipped_data() / name).read_text(encoding="utf-8").splitlines()
            cut = (carbon_before or {}).get(prefix)
            if cut is not None and name.endswith("_hourly.csv"):
                lines = [lines[0], *(line for line in lines[1:] if line < cut)]
            (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


# -- the drain after the period -------------------------------------------------------


def test_a_series_that_ends_within_the_drain_is_refused_naming_how_far_it_must_reach(
    tmp_path: Path,
) -> None:
    fleet, workload = write_scenario(tmp_path)
    # CA-ON's file ends five days after a one-day period: the period is covered, the
    # 14 days it may drain after it are not.
    carbon = shipped_traces_copy(tmp_path / "traces", carbon_before={"CA-ON": "2023-06-06"})
    options = EvalOptions(days=1, fleet=fleet, workload=workload, carbon_dir=carbon)
    with pytest.raises(
        ValueError,
        match=(
            r"the CA-ON series \(CA-ON_2023_hourly.csv\) ends with the hour from "
            r"2023-06-05 23:00, and after the evaluated period the run may still be draining, "
            r"up to 14 days after it, until 2023-06-16 00:00: extend the file up to then"
        ),
    ):
        build_scenario(options)


def test_a_period_ending_near_the_end_of_the_shipped_year_is_refused_at_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--start 2023-12-31 --days 1` used to account the drain into 2024 with the value
    of 2023-12-31 23:00; it names the latest period end the shipped data can drain."""
    fleet, workload = write_scenario(tmp_path)
    code = main(
        [
            "eval",
            "--start",
            "2023-12-31",
            "--days",
            "1",
            "--fleet",
            str(fleet),
            "--workload",
            str(workload),
            "--no-optimum",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in error
    assert "until 2024-01-15 00:00" in error
    assert "evaluate a period that ends by 2023-12-18 00:00" in error


def test_a_period_whose_drain_ends_with_the_series_is_accepted(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    scenario = build_scenario(
        EvalOptions(start=date(2023, 12, 17), days=1, fleet=fleet, workload=workload)
    )
    assert scenario.workload.training


# -- a missing zone nothing can account -------------------------------------------------


def write_fleet(directory: Path, fleet_text: str) -> Path:
    path = directory / "fleet.toml"
    path.write_text(fleet_text, encoding="utf-8")
    return path


NOWHERE_FLEET = """
[[group]]
name = "h100-nowhere"
profile = "h100-8x"
count = 1
site = "cloud"
zone = "XX"
region = "europe-west9"
"""


def test_a_missing_zone_without_a_static_entry_is_refused_even_when_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, workload = write_scenario(tmp_path)
    fleet = write_fleet(tmp_path, NOWHERE_FLEET)
    options = EvalOptions(days=1, fleet=fleet, workload=workload, allow_missing_zones=True)
    with pytest.raises(ValueError, match=r"fleet zone XX has no carbon series .* no fallback"):
        build_scenario(options)
    # The CLI says so in one line; it used to crash in the optimum's linprog.
    code = main(
        [
            *("eval", "--days", "1", "--fleet", str(fleet), "--workload", str(workload)),
            "--allow-missing-zones",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in error
    assert "fleet zone XX has no carbon series" in error


def test_a_missing_zone_beside_a_recorded_one_still_gets_the_fallback(tmp_path: Path) -> None:
    """The fallback is the highest recorded series where the static table has no entry."""
    _, workload = write_scenario(tmp_path)
    fleet = write_fleet(tmp_path, SMALL_FLEET + NOWHERE_FLEET)
    options = EvalOptions(days=1, fleet=fleet, workload=workload, allow_missing_zones=True)
    assert "XX" in {node.zone for node in build_scenario(options).nodes}


def test_the_table_shows_an_unknown_co2_as_na_never_nan() -> None:
    known = PolicyResult(
        policy="fifo-binpack",
        kwh=10.0,
        gco2=1000.0,
        cost=1.0,
        wait_mean_s=0.0,
        wait_p95_s=0.0,
        deadline_misses=0,
        slo_violations=0,
        utilisation=0.5,
    )
    unknown = dataclasses.replace(known, policy="green", gco2=math.nan)
    for results in ([known, unknown], [unknown, known]):
        text = table(results)
        assert "nan" not in text.lower()
        assert "n/a" in text


# -- a byte-order mark ----------------------------------------------------------------


def test_carbon_and_price_files_with_a_byte_order_mark_read_as_without(tmp_path: Path) -> None:
    plain = shipped_traces_copy(tmp_path / "plain")
    marked = shipped_traces_copy(tmp_path / "marked")
    for path in marked.iterdir():
        path.write_bytes(BYTE_ORDER_MARK + path.read_bytes())
    expected, got = read_traces(plain), read_traces(marked)
    assert set(got) == set(expected) == {"CA-ON", "US-CAL-CISO", "DE"}
    for zone, trace in expected.items():
        assert got[zone].start_s == trace.start_s
        assert got[zone].carbon_lifecycle_g_per_kwh.tolist() == pytest.approx(
            trace.carbon_lifecycle_g_per_kwh.tolist(), nan_ok=True
        )
        assert got[zone].price_per_mwh.tolist() == pytest.approx(
            trace.price_per_mwh.tolist(), nan_ok=True
        )
