"""``greenfed eval`` reads no value from beyond its reach: a price series that ends
months before the period is refused as a carbon series would be (never carried
forward into it), and a carbon gap in the drain after the period is refused up front
in one line, not met with a traceback halfway through the run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

import pytest

from cloud.eval.runner import EvalOptions, build_scenario
from cloud.signals.datasets import shipped_data
from greenfed.cli import main

from .scenarios import write_scenario

# The small fleet's zones, by the prefix of their files.
PREFIXES = ("CA-ON", "US-CAL-CISO", "DE-LU")
CARBON_COLUMNS = (4, 5)  # both carbon intensity columns of an hourly file
PRICE_COLUMN = 2


def traces_with_empty_cells(
    directory: Path,
    *,
    prefix: str,
    carbon_empty: Callable[[datetime], bool] = lambda at: False,
    price_empty: Callable[[datetime], bool] = lambda at: False,
) -> Path:
    """The small fleet's shipped carbon and price files, with `prefix`'s cells empty in
    the hours the predicates pick."""
    directory.mkdir()
    for name in PREFIXES:
        for file_name, empty, columns in (
            (f"{name}_2023_hourly.csv", carbon_empty, CARBON_COLUMNS),
            (f"{name}_electricity_prices_2023.csv", price_empty, (PRICE_COLUMN,)),
        ):
            lines = (shipped_data() / file_name).read_text(encoding="utf-8").splitlines()
            if name == prefix:
                for index, line in enumerate(lines[1:], start=1):
                    cells = line.split(",")
                    at = datetime.fromisoformat(cells[0]).replace(tzinfo=None)
                    if empty(at):
                        for column in columns:
                            cells[column] = ""
                        lines[index] = ",".join(cells)
            (directory / file_name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def test_a_price_series_that_ends_before_the_period_is_refused(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    carbon = traces_with_empty_cells(
        tmp_path / "traces", prefix="CA-ON", price_empty=lambda at: at >= datetime(2023, 4, 1)
    )
    options = EvalOptions(days=1, fleet=fleet, workload=workload, carbon_dir=carbon)
    with pytest.raises(
        ValueError,
        match=(
            r"the CA-ON price file \(the one beside CA-ON_2023_hourly.csv\) has no price in the "
            r"\d+ hours up to 2023-06-01 00:00 \(within the evaluated period; .* the last is "
            r"at 2023-03-31 23:00\)"
        ),
    ):
        build_scenario(options)


def test_a_price_series_that_starts_after_the_period_is_refused(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    carbon = traces_with_empty_cells(
        tmp_path / "traces", prefix="DE-LU", price_empty=lambda at: at < datetime(2023, 9, 1)
    )
    options = EvalOptions(days=1, fleet=fleet, workload=workload, carbon_dir=carbon)
    with pytest.raises(
        ValueError,
        match=r"the DE price file .* has no price at or before 2023-06-01 00:00 .* its first "
        r"value is at 2023-09-01 00:00",
    ):
        build_scenario(options)


def test_a_zone_without_any_price_is_still_accounted_with_the_fallback(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    carbon = traces_with_empty_cells(
        tmp_path / "traces", prefix="DE-LU", price_empty=lambda at: True
    )
    options = EvalOptions(days=1, fleet=fleet, workload=workload, carbon_dir=carbon)
    scenario = build_scenario(options)
    series = scenario.recorded.series("DE")
    assert series is not None
    assert not series.has_price


def test_a_carbon_gap_in_the_drain_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ten empty days from the day after a one-day period: a run still draining then
    would find no carbon intensity for DE within the forecaster's week of lookback."""
    fleet, workload = write_scenario(tmp_path)
    carbon = traces_with_empty_cells(
        tmp_path / "traces",
        prefix="DE-LU",
        carbon_empty=lambda at: datetime(2023, 6, 2) <= at < datetime(2023, 6, 12),
    )
    options = EvalOptions(
        start=date(2023, 6, 1), days=1, fleet=fleet, workload=workload, carbon_dir=carbon
    )
    with pytest.raises(
        ValueError,
        match=r"the DE series \(DE-LU_2023_hourly.csv\) has no carbon intensity in the \d+ "
        r"hours up to 2023-06-09 00:00 \(after the evaluated period, while the run may still "
        r"be draining, up to 14 days after it;",
    ):
        build_scenario(options)
    code = main(
        [
            *("eval", "--days", "1", "--start", "2023-06-01", "--policies", "fifo-binpack"),
            *("--fleet", str(fleet), "--workload", str(workload), "--carbon-dir", str(carbon)),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
