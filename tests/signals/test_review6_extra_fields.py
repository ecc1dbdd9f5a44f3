"""Trace files with a row longer than their header (a stray comma, a decimal comma): each
is refused naming the file and the line, as a row cut short is; the csv module would file
the extra fields where nothing reads them, and every value after the comma would sit one
column off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cloud.signals.datasets import DatasetError, read_traces

from .test_dataset_rows_review5 import PRICE_FILE, write_prices
from .test_implausible_values import carbon_row, hours_of_2023, write_trace


def test_a_price_with_a_decimal_comma_is_refused_naming_the_file_and_line(
    tmp_path: Path,
) -> None:
    write_trace(tmp_path, [carbon_row(at) for at in hours_of_2023(3)])
    write_prices(tmp_path, ["2023-01-01 00:00:00,40", "2023-01-01 01:00:00,41,5"])
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before: a price of 41, the ",5" dropped without a word
    message = str(refused.value)
    assert message.startswith(f"{PRICE_FILE}: line 3: ")
    assert "3 fields, more than the header's 2" in message


def test_a_carbon_row_with_a_field_too_many_is_refused_naming_the_line(tmp_path: Path) -> None:
    rows = [carbon_row(at) for at in hours_of_2023(4)]
    rows[1] = carbon_row(hours_of_2023(2)[1], direct="100,5")  # line 3: a decimal comma
    write_trace(tmp_path, rows)
    with pytest.raises(DatasetError) as refused:
        read_traces(tmp_path)  # before: direct 100, lifecycle 5, and the rest shifted
    message = str(refused.value)
    assert message.startswith("XX_2023_hourly.csv: line 3: ")
    assert "12 fields, more than the header's 11" in message


def test_a_comma_inside_double_quotes_is_one_field(tmp_path: Path) -> None:
    rows = [
        carbon_row(at).replace(",X,X,XX,", ',X,"Germany, Luxembourg",XX,')
        for at in hours_of_2023(2)
    ]
    write_trace(tmp_path, rows)
    write_prices(tmp_path, ["2023-01-01 00:00:00,40", "2023-01-01 01:00:00,41"])
    trace = read_traces(tmp_path)["XX"]
    np.testing.assert_array_equal(trace.carbon_direct_g_per_kwh, [100.0, 100.0])
    np.testing.assert_array_equal(trace.price_per_mwh, [40.0, 41.0])
