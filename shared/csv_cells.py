"""CSV that a spreadsheet reads as data, never as formulas (OWASP, "CSV Injection").

Excel, LibreOffice and Google Sheets run a cell that starts with `=`, `+`, `-` or `@`
(a tab or a carriage return in front of one is skipped, so those lead a formula too)
as a formula: `=cmd|' /C calc'!A0` in a node's zone would start a program on the
machine of whoever opens the export. Every such cell is escaped as OWASP recommends:
a single quote in front (the spreadsheet shows the text as it is) and the cell in
double quotes.

A cell that is a plain decimal number is left as it is: a negative figure must stay a
number a spreadsheet can sum, and a number cannot hold a formula (defusedcsv makes the
same exception). Numbers are what this module's callers format themselves; text from
anywhere else (zones, names, ids) is escaped whatever it holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

FORMULA_LEADS: Final = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# RFC 4180: a cell holding these is quoted.
_NEEDS_QUOTES: Final = re.compile(r'[",\r\n]')


def is_formula(cell: str) -> bool:
    """Whether a spreadsheet would read `cell` as a formula."""
    return cell.startswith(FORMULA_LEADS) and _PLAIN_NUMBER.fullmatch(cell) is None


def csv_cell(cell: str) -> str:
    """`cell` as it goes into a CSV line: escaped if a formula, quoted if it must be."""
    if is_formula(cell):
        return '"' + ("'" + cell).replace('"', '""') + '"'
    if _NEEDS_QUOTES.search(cell):
        return '"' + cell.replace('"', '""') + '"'
    return cell


def csv_text(rows: Iterable[Sequence[str]]) -> str:
    """Rows of cells as CSV text, every cell through `csv_cell`, lines ending in \\n."""
    return "".join(",".join(csv_cell(cell) for cell in row) + "\n" for row in rows)
