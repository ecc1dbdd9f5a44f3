"""CSV cells a spreadsheet reads as data (shared/csv_cells.py, OWASP "CSV Injection")."""

from __future__ import annotations

import csv
import io

import pytest

from shared.csv_cells import csv_cell, csv_text, is_formula


@pytest.mark.parametrize(
    "cell",
    ["=cmd|' /C calc'!A0", "+1+2", "-2+3+cmd|' /C calc'!A0", "@SUM(A1:A2)", "\t=1", "\r=1", "-"],
)
def test_a_cell_a_spreadsheet_would_run_gets_a_quote_in_front_and_quotes_around(
    cell: str,
) -> None:
    assert is_formula(cell)
    written = csv_cell(cell)
    assert written.startswith("\"'")
    assert written.endswith('"')
    (row,) = csv.reader(io.StringIO(csv_text([[cell]]), newline=""))
    assert row == ["'" + cell]  # the text as it was, shown as text


@pytest.mark.parametrize("cell", ["-12.5", "-1e+06", "3", "0.25", "DE", "", "a=b", "acme"])
def test_numbers_and_ordinary_text_are_left_alone(cell: str) -> None:
    assert not is_formula(cell)
    assert csv_cell(cell) == cell


def test_quotes_commas_and_line_breaks_are_quoted_as_rfc_4180_says() -> None:
    text = csv_text([["a,b", 'say "hi"', "two\nlines", "=1,2"]])
    (row,) = csv.reader(io.StringIO(text, newline=""))
    assert row == ["a,b", 'say "hi"', "two\nlines", "'=1,2"]
