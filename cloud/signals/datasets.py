"""The data greenfed ships (cloud/signals/data) and readers for its file formats.

Shipped files are opened through `importlib.resources`, so an installed wheel and
a fresh clone both work without the workspace's `../shared`. See
`data/ATTRIBUTION.md` for sources and licences; `SHA256SUMS` pins every file.

Carbon files follow the Electricity Maps export format
(`<PREFIX>_<YEAR>_hourly.csv`); the zone id is read from their `Zone Id` column,
so `DE-LU_2023_hourly.csv` serves zone `DE`. Price files
(`<PREFIX>_electricity_prices_<YEAR>.csv`, USD/MWh) attach to the zone of the
carbon file with the same prefix: DE's prices are those of the DE-LU bidding zone.

A file is checked as it is read, since one bad row would spoil every series built on
it: a carbon intensity outside 0 to 10,000 gCO2eq/kWh, a price beyond ±100,000 per MWh
(`model.MAX_CARBON_G_PER_KWH`, `MAX_ABS_PRICE_PER_MWH`) or a zone's rows more than
`MAX_TRACE_SPAN_YEARS` apart are a `DatasetError` naming the file and line, and so are
a cell that holds text that is no number (`NaN` included), a time that is none, a row
shorter or longer than the header, a carbon file's row whose `Zone Id` is empty or not the file's
one zone, and an hour with two rows (naming both). Only an empty cell is a missing hour.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np
import numpy.typing as npt

from cloud.signals.grid import FloatArray
from cloud.signals.model import (
    MAX_ABS_PRICE_PER_MWH,
    MAX_CARBON_G_PER_KWH,
    plausible_carbon,
    plausible_price,
)
from cloud.signals.units import HOUR_S, parse_utc
from shared.clock import utc_from_epoch

EmissionFactor = Literal["lifecycle", "direct"]

# The default fleet's four zones, then four more (other-zones.toml) to judge policies on
# grids they were not tuned on.
SHIPPED_ZONES = ("CA-ON", "US-CAL-CISO", "DE", "ZA", "JP-TK", "SG", "US-NY-NYIS", "US-MIDA-PJM")
SHIPPED_FILE_PREFIX = MappingProxyType(
    {
        "CA-ON": "CA-ON",
        "US-CAL-CISO": "US-CAL-CISO",
        "DE": "DE-LU",
        "ZA": "ZA",
        "JP-TK": "JP-TK",
        "SG": "SG",
        "US-NY-NYIS": "US-NY-NYIS",
        "US-MIDA-PJM": "US-MIDA-PJM",
    }
)
LATENCY_FILE = "umassos_raw_gcp_latency.csv"
ZONE_MAPPER_FILE = "umassos_gcp_dc_zonecode_mapper.json"
MEAN_STATS_FILE = "umassos_mean_stats.csv"
CHECKSUM_FILE = "SHA256SUMS"

TIME_COLUMN = "Datetime (UTC)"
ZONE_COLUMN = "Zone Id"
DIRECT_COLUMN = "Carbon Intensity gCO₂eq/kWh (direct)"
LCA_COLUMN = "Carbon Intensity gCO₂eq/kWh (LCA)"
ESTIMATED_COLUMN = "Data Estimated"
PRICE_COLUMN = "Price (USD/MWh)"

# A zone's trace covers at most this many years: a trace is read into dense hourly
# arrays, so one row dated 9999-12-31 among 2023's would otherwise ask for gigabytes.
MAX_TRACE_SPAN_YEARS = 20
_MAX_TRACE_SPAN_S = MAX_TRACE_SPAN_YEARS * 366 * 24 * HOUR_S

_CARBON_FILE = re.compile(r"^(?P<prefix>.+)_(?P<year>\d{4})_hourly\.csv$")
_PRICE_FILE = re.compile(r"^(?P<prefix>.+)_electricity_prices_(?P<year>\d{4})\.csv$")

BoolArray = npt.NDArray[np.bool_]


class DatasetError(ValueError):
    """A trace directory or file that cannot be read; the message names the file."""


def shipped_data() -> Traversable:
    return resources.files("cloud.signals").joinpath("data")


def shipped_file(name: str) -> Traversable:
    return shipped_data().joinpath(name)


def expected_checksums() -> dict[str, str]:
    """File name → sha256 hex, from the shipped SHA256SUMS."""
    checksums: dict[str, str] = {}
    for line in shipped_file(CHECKSUM_FILE).read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            checksums[name.lstrip("*")] = digest
    return checksums


def checksum_mismatches() -> list[str]:
    """Names of shipped files whose content differs from SHA256SUMS (or that are missing)."""
    bad: list[str] = []
    for name, digest in expected_checksums().items():
        entry = shipped_file(name)
        if not entry.is_file() or hashlib.sha256(entry.read_bytes()).hexdigest() != digest:
            bad.append(name)
    return bad


@dataclass(frozen=True, slots=True, eq=False)
class HourlyTrace:
    """One zone's recorded hourly series; hour i starts at start_s + i·3600. NaN = no value."""

    zone: str
    start_s: float
    carbon_lifecycle_g_per_kwh: FloatArray
    carbon_direct_g_per_kwh: FloatArray
    price_per_mwh: FloatArray
    estimated: BoolArray
    currency: str = "USD"
    source: str = ""

    @property
    def hours(self) -> int:
        return int(self.carbon_lifecycle_g_per_kwh.size)

    @property
    def end_s(self) -> float:
        return self.start_s + self.hours * HOUR_S

    def carbon(self, emission_factor: EmissionFactor) -> FloatArray:
        if emission_factor == "direct":
            return self.carbon_direct_g_per_kwh
        return self.carbon_lifecycle_g_per_kwh

    def hour_index(self, at_s: float) -> int:
        """Index of the hour containing at_s (may be outside 0..hours-1)."""
        return math.floor((at_s - self.start_s) / HOUR_S)


def _read_only(array: npt.NDArray[np.generic]) -> None:
    array.setflags(write=False)


def _numbered_rows(entry: Traversable) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file: errors name the line people see in an editor.

    A row with fewer fields than the header (a line cut short) is a DatasetError naming
    the first column it lacks: the csv module would give that column None, which is no
    text, and read as an empty cell it would pass for a missing hour. A row with more
    fields than the header is one too: the csv module files the extra ones under the key
    None, where nothing reads them, and a stray comma has shifted which value is in which
    column."""
    # newline="" as the csv module wants: the shipped files end lines with CRLF.
    # utf-8-sig: a file saved with a byte-order mark (a spreadsheet's "CSV UTF-8") would
    # otherwise have it in its first column's name, and no time column.
    with io.TextIOWrapper(entry.open("rb"), encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            header = reader.fieldnames or ()
            extra = row.pop(None, None)  # the fields past the header's (restkey None)
            if extra:
                raise DatasetError(
                    f"{entry.name}: line {reader.line_num}: the row has "
                    f"{len(header) + len(extra)} fields, more than the header's "
                    f"{len(header)} (a value with a comma in it goes in double quotes)"
                )
            missing = [column for column, text in row.items() if text is None]
            if missing:
                raise DatasetError(
                    f"{entry.name}: line {reader.line_num}: no {missing[0]} cell: the row "
                    f"has {len(header) - len(missing)} of the header's {len(header)} fields"
                )
            yield reader.line_num, row


def _rows(entry: Traversable) -> Iterator[dict[str, str]]:
    return (row for _, row in _numbered_rows(entry))


def _number(entry: Traversable, line: int, row: dict[str, str], column: str) -> float:
    """The cell's number, NaN for an empty one (a missing hour). Text that is no number
    (`#N/A`, a typo, a spreadsheet's `NaN`) is a DatasetError: read as a missing hour, it
    would be filled from the hour before and nobody would know the file is damaged."""
    text = row.get(column)
    if text is None or not text.strip():
        return math.nan
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise DatasetError(
            f"{entry.name}: line {line}: {column} is {text!r}, not a number (leave the cell "
            "empty where there is no value)"
        )
    return value


def _carbon_cell(entry: Traversable, line: int, row: dict[str, str], column: str) -> float:
    """The cell's intensity, NaN where it has none; a DatasetError for one no grid has."""
    value = _number(entry, line, row, column)
    if math.isnan(value) or plausible_carbon(value):
        return value
    raise DatasetError(
        f"{entry.name}: line {line}: {column} is {row.get(column)!r}; a carbon intensity "
        f"is 0 to {MAX_CARBON_G_PER_KWH:,.0f} gCO2eq/kWh (leave the cell empty where "
        "there is no value)"
    )


def _price_cell(entry: Traversable, line: int, row: dict[str, str]) -> float:
    value = _number(entry, line, row, PRICE_COLUMN)
    if math.isnan(value) or plausible_price(value):
        return value
    raise DatasetError(
        f"{entry.name}: line {line}: {PRICE_COLUMN} is {row[PRICE_COLUMN]!r}; a price is "
        f"-{MAX_ABS_PRICE_PER_MWH:,.0f} to {MAX_ABS_PRICE_PER_MWH:,.0f} per MWh (leave the "
        "cell empty where there is no value)"
    )


def _time_cell(entry: Traversable, line: int, row: dict[str, str]) -> float:
    """The row's hour (epoch seconds); a DatasetError naming the line for text that is
    no time."""
    text = row[TIME_COLUMN]
    try:
        return parse_utc(text).timestamp()
    except ValueError:
        raise DatasetError(
            f"{entry.name}: line {line}: {TIME_COLUMN} is {text!r}, not an ISO 8601 time "
            "such as 2023-06-01 13:00:00 (UTC unless it gives an offset)"
        ) from None


def _check_span(entry: Traversable, times: list[float], lines: list[int]) -> None:
    """Refuse a file whose rows lie more than MAX_TRACE_SPAN_YEARS apart, naming the row
    farthest from the file's median time (the odd one out, whether first or last)."""
    if not times or max(times) - min(times) <= _MAX_TRACE_SPAN_S:
        return
    median_s = sorted(times)[len(times) // 2]
    worst = max(range(len(times)), key=lambda index: abs(times[index] - median_s))
    raise DatasetError(
        f"{entry.name}: line {lines[worst]}: {utc_from_epoch(times[worst]):%Y-%m-%d %H:%M} "
        f"is more than {MAX_TRACE_SPAN_YEARS} years from the file's other rows"
    )


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a row was read: errors about rows name the file and line."""

    file: str
    line: int


def _check_each_hour_once(times: list[float], origins: list[_Origin]) -> None:
    """Refuse a zone with two rows for one hour (in one file or two), naming both: the
    dense arrays hold one value an hour, and keeping either would hide the other."""
    first_row_of_hour: dict[int, int] = {}
    for row, at_s in enumerate(times):
        hour = math.floor(at_s / HOUR_S)
        first = first_row_of_hour.setdefault(hour, row)
        if first == row:
            continue
        earlier, later = origins[first], origins[row]
        where = (
            f"{earlier.file}: lines {earlier.line} and {later.line}"
            if earlier.file == later.file
            else f"{earlier.file}: line {earlier.line} and {later.file}: line {later.line}"
        )
        raise DatasetError(
            f"{where}: both hold the hour from {utc_from_epoch(hour * HOUR_S):%Y-%m-%d %H:%M} "
            "UTC; a trace has one row an hour"
        )


@dataclass(slots=True)
class _ZoneRows:
    times: list[float]
    lifecycle: list[float]
    direct: list[float]
    estimated: list[bool]
    files: list[str]
    origins: list[_Origin]


def _read_carbon_file(entry: Traversable, into: dict[str, _ZoneRows]) -> str:
    """Read one carbon file; returns its zone id.

    A file holds one zone: the price file of its prefix is attached to that zone, so a
    row of another zone (or none) is a DatasetError naming its line and both ids, not a
    zone of its own that would take the prices."""
    zone, zone_line = "", 0
    rows = _ZoneRows([], [], [], [], [], [])
    try:
        for line, row in _numbered_rows(entry):
            row_zone = row[ZONE_COLUMN].strip()
            if not row_zone:
                raise DatasetError(
                    f"{entry.name}: line {line}: {ZONE_COLUMN} is empty; each row names its zone"
                )
            if not zone:
                zone, zone_line = row_zone, line
            elif row_zone != zone:
                raise DatasetError(
                    f"{entry.name}: line {line}: {ZONE_COLUMN} is {row_zone!r}, but line "
                    f"{zone_line} has {zone!r}; a file holds the rows of one zone"
                )
            rows.times.append(_time_cell(entry, line, row))
            rows.origins.append(_Origin(entry.name, line))
            rows.lifecycle.append(_carbon_cell(entry, line, row, LCA_COLUMN))
            rows.direct.append(_carbon_cell(entry, line, row, DIRECT_COLUMN))
            rows.estimated.append(row.get(ESTIMATED_COLUMN, "").strip().lower() == "true")
    except DatasetError:
        raise
    except (KeyError, ValueError) as error:
        raise DatasetError(f"{entry.name}: not in the Electricity Maps format ({error})") from None
    if not zone:
        raise DatasetError(f"{entry.name}: no rows")
    _check_span(entry, rows.times, [origin.line for origin in rows.origins])
    zone_rows = into.setdefault(zone, _ZoneRows([], [], [], [], [], []))
    zone_rows.times += rows.times
    zone_rows.lifecycle += rows.lifecycle
    zone_rows.direct += rows.direct
    zone_rows.estimated += rows.estimated
    zone_rows.origins += rows.origins
    zone_rows.files.append(entry.name)
    return zone


def _dense(times: list[float], values: Iterable[float], start_s: float, hours: int) -> FloatArray:
    array = np.full(hours, np.nan)
    for at_s, value in zip(times, values, strict=True):
        index = math.floor((at_s - start_s) / HOUR_S)
        if 0 <= index < hours:
            array[index] = value
    return array


def read_traces(directory: Traversable) -> dict[str, HourlyTrace]:
    """Every zone in a directory of carbon (and optional price) files, one trace per zone."""
    entries = sorted((e for e in directory.iterdir() if e.is_file()), key=lambda e: e.name)
    zone_rows: dict[str, _ZoneRows] = {}
    prefix_zone: dict[str, str] = {}
    prefix_file: dict[str, str] = {}
    for entry in entries:
        match = _CARBON_FILE.match(entry.name)
        if match:
            prefix, zone = match.group("prefix"), _read_carbon_file(entry, zone_rows)
            # The prefix's price files go to one zone: its carbon files must agree on it.
            known = prefix_zone.setdefault(prefix, zone)
            if known != zone:
                raise DatasetError(
                    f"{prefix_file[prefix]} has zone {known!r} and {entry.name} {zone!r}: the "
                    f"files of prefix {prefix} hold one zone, whose prices they share"
                )
            prefix_file.setdefault(prefix, entry.name)
    if not zone_rows:
        raise DatasetError(f"{directory}: no <ZONE>_<YEAR>_hourly.csv carbon files")
    price_rows: dict[str, tuple[list[float], list[float], list[_Origin]]] = {}
    for entry in entries:
        match = _PRICE_FILE.match(entry.name)
        if not match or match.group("prefix") not in prefix_zone:
            continue
        times, prices, origins = price_rows.setdefault(
            prefix_zone[match.group("prefix")], ([], [], [])
        )
        try:
            for line, row in _numbered_rows(entry):
                times.append(_time_cell(entry, line, row))
                prices.append(_price_cell(entry, line, row))
                origins.append(_Origin(entry.name, line))
        except DatasetError:
            raise
        except (KeyError, ValueError) as error:
            raise DatasetError(f"{entry.name}: not a greenfed price file ({error})") from None
    traces: dict[str, HourlyTrace] = {}
    for zone, rows in zone_rows.items():
        if max(rows.times) - min(rows.times) > _MAX_TRACE_SPAN_S:
            # Each file is within the span (checked as it was read): together they are not.
            raise DatasetError(
                f"{', '.join(rows.files)}: zone {zone}'s rows span more than "
                f"{MAX_TRACE_SPAN_YEARS} years"
            )
        _check_each_hour_once(rows.times, rows.origins)
        start_s = math.floor(min(rows.times) / HOUR_S) * HOUR_S
        hours = math.floor((max(rows.times) - start_s) / HOUR_S) + 1
        lifecycle = _dense(rows.times, rows.lifecycle, start_s, hours)
        direct = _dense(rows.times, rows.direct, start_s, hours)
        estimated = _dense(rows.times, (float(e) for e in rows.estimated), start_s, hours) == 1.0
        price_times, prices, price_origins = price_rows.get(zone, ([], [], []))
        _check_each_hour_once(price_times, price_origins)
        price = _dense(price_times, prices, start_s, hours)
        for array in (lifecycle, direct, estimated, price):
            _read_only(array)
        traces[zone] = HourlyTrace(
            zone=zone,
            start_s=start_s,
            carbon_lifecycle_g_per_kwh=lifecycle,
            carbon_direct_g_per_kwh=direct,
            price_per_mwh=price,
            estimated=estimated,
            source=", ".join(rows.files),
        )
    return traces


@cache
def shipped_traces() -> Mapping[str, HourlyTrace]:
    """The eight shipped 2023 zones (read once per process, ~0.4 s)."""
    return MappingProxyType(read_traces(shipped_data()))


@cache
def _directory_traces(path: str) -> Mapping[str, HourlyTrace]:
    directory = Path(path)
    if not directory.is_dir():
        raise DatasetError(f"trace directory {path} does not exist")
    return MappingProxyType(read_traces(directory))


def load_traces(directory: Path | str | None = None) -> Mapping[str, HourlyTrace]:
    """Traces from `directory` (same format as the shipped files), or the shipped ones."""
    if directory is None:
        return shipped_traces()
    return _directory_traces(str(Path(directory).resolve()))


@cache
def annual_mean_stats() -> Mapping[str, Mapping[str, float]]:
    """umassos_mean_stats.csv: zone → {year: mean gCO2eq/kWh}."""
    table: dict[str, Mapping[str, float]] = {}
    for row in _rows(shipped_file(MEAN_STATS_FILE)):
        zone = row.pop("zonecode").strip()
        table[zone] = MappingProxyType(
            {year: float(value) for year, value in row.items() if value and value.strip()}
        )
    return MappingProxyType(table)


@cache
def gcp_region_zones() -> Mapping[str, str]:
    """umassos_gcp_dc_zonecode_mapper.json: GCP region → Electricity Maps zone."""
    raw = json.loads(shipped_file(ZONE_MAPPER_FILE).read_text(encoding="utf-8"))
    return MappingProxyType({str(region): str(zone) for region, zone in raw.items()})


def latency_rows() -> Iterator[tuple[str, str, float]]:
    """umassos_raw_gcp_latency.csv: (sending region, receiving region, milliseconds)."""
    for row in _rows(shipped_file(LATENCY_FILE)):
        yield (
            row["sending_region"].strip(),
            row["receiving_region"].strip(),
            float(row["milliseconds"]),
        )
