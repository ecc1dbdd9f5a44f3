"""Trace files with a damaged row: each is refused naming the file and the line, never a
traceback, a silent split of the file or a price file attached to the wrong zone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cloud.signals.datasets import DatasetError, read_traces

from .test_implausible_values import carbon_row, hours_of_2023, write_trace

PRICE_FILE = "XX_electricity_prices_2023.csv"


def write_prices(directory: Path, rows: list[str]) -> None:
    (directory / PRICE_FILE).write_text(
        "\n".join(["Datetime (UTC),Price (USD/MWh)", *rows]) + "\n", encoding="utf-8"
    )


def with_zone(row: str, zone: str) -> str:
    return row.replace(",X,X,XX,", f",X,X,{zone},")


# ---- a row with too few fields ---------------------------------------------------------


def test_a_short_carbon_row_is_refused_naming_the_file_line_and_column(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[2] = "2023-01-01 02:00:00,X"  # line 4: cut after its second field
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)
    message = str(refused.value)
    assert message.startswith("XX_2023_hourly.csv: line 4: ")
    assert "Zone Name" in message
    assert "2 of the header's 11 fields" in message


@pytest.mark.parametrize("cut", [3, 5, 10])
def test_a_carbon_row_cut_anywhere_is_refused(tmp_path: Path, cut: int) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(3)]
    rows[1] = ",".join(rows[1].split(",")[:cut])
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError, match=rf"^XX_2023_hourly\.csv: line 3: .*{cut} of the"):
        read_traces(tmp_path)


def test_a_short_price_row_is_refused_naming_the_file_line_and_column(tmp_path: Path) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    write_prices(tmp_path, ["2023-01-01 00:00:00,40", "2023-01-01 01:00:00"])
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before: read as a missing price, silently
    message = str(refused.value)
    assert message.startswith(f"{PRICE_FILE}: line 3: ")
    assert "Price (USD/MWh)" in message


# ---- one zone per file -----------------------------------------------------------------


def test_a_last_row_of_another_zone_is_refused_naming_both_ids(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[-1] = with_zone(rows[-1], "ZZ")  # line 5
    write_trace(tmp_path, rows)
    write_prices(tmp_path, ["2023-01-01 00:00:00,40"])
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before: a one-hour zone ZZ that got XX's prices
    message = str(refused.value)
    assert message.startswith("XX_2023_hourly.csv: line 5: ")
    assert "'ZZ'" in message
    assert "'XX'" in message


def test_a_middle_row_of_another_zone_is_refused(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[1] = with_zone(rows[1], "ZZ")  # line 3
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError, match=r"^XX_2023_hourly\.csv: line 3: .*'ZZ'.*'XX'"):
        read_traces(tmp_path)  # before: accepted, the file split in two zones


@pytest.mark.parametrize("empty_row", [0, 1, 3])
def test_an_empty_zone_id_is_refused_naming_its_line(tmp_path: Path, empty_row: int) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[empty_row] = with_zone(rows[empty_row], "")
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before (last row): "no rows", of a file of four
    message = str(refused.value)
    assert message.startswith(f"XX_2023_hourly.csv: line {empty_row + 2}: ")
    assert "Zone Id is empty" in message


def test_the_price_file_goes_to_the_zone_of_its_carbon_file(tmp_path: Path) -> None:
    """The zone id is read from the file, not its name: DE-LU_... serves DE."""
    rows = [with_zone(carbon_row(at), "YY") for at in hours_of_2023(3)]
    write_trace(tmp_path, rows)
    write_prices(tmp_path, ["2023-01-01 00:00:00,40", "2023-01-01 02:00:00,42"])
    traces = read_traces(tmp_path)
    assert list(traces) == ["YY"]
    np.testing.assert_array_equal(traces["YY"].price_per_mwh, [40.0, np.nan, 42.0])


# ---- a time that is no time ------------------------------------------------------------


def test_a_bad_carbon_timestamp_is_refused_naming_the_line(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[2] = carbon_row("06/01/2023 00:00")  # line 4
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)
    message = str(refused.value)
    assert message.startswith("XX_2023_hourly.csv: line 4: Datetime (UTC) is '06/01/2023 00:00'")


def test_a_bad_price_timestamp_is_refused_naming_the_line(tmp_path: Path) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    write_prices(tmp_path, ["2023-01-01 00:00:00,40", "yesterday,41"])
    with pytest.raises(
        DatasetError, match=rf"^{PRICE_FILE}: line 3: Datetime \(UTC\) is 'yesterday'"
    ):
        read_traces(tmp_path)


def test_two_carbon_files_of_one_prefix_with_two_zones_are_refused(tmp_path: Path) -> None:
    """Their prefix's price file would go to one of them, whichever was read last."""
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(2)])
    write_trace(
        tmp_path,
        [with_zone(carbon_row("2024-01-01 00:00:00"), "ZZ")],
        name="XX_2024_hourly.csv",
    )
    with pytest.raises(
        DatasetError, match=r"^XX_2023_hourly\.csv has zone 'XX' and XX_2024_hourly\.csv 'ZZ'"
    ):
        read_traces(tmp_path)
