"""The backup file: one portable format for SQLite and PostgreSQL (docs/operations.md).

A gzip stream of JSON lines:

1. the header (`BackupHeader`): the format and its version, when and by which greenfed
   the backup was made, the source database (password hidden), the schema version and
   the names of the migrations it was taken at, the cluster id, and every table with
   its columns, in the order rows must be inserted (a referenced table first);
2. for each table in that order, a line `{"table": NAME}`, then one JSON array per row;
3. the trailer (`BackupTrailer`): the rows of each table, so that a file cut short
   (a full disk, a copy interrupted) is refused rather than half restored.

The trailer is the last line and the gzip stream ends with it: a reader reads on to the
stream's end, where gzip checks the CRC32 and length of all it decompressed, and refuses
anything after it.

Values are JSON scalars: text (a JSON document as its exact text), integers, floats
(a non-finite one as "NaN", "Infinity" or "-Infinity": JSON has none), booleans, null.
Rows are the database's as they are: secrets at rest stay ciphertext. The keys that
open and sign them are files, never rows, and a backup holds neither.

The file is written beside its final name and renamed into place once complete, with
owner-only permissions: it holds token and password hashes and the cluster's shared
secrets.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final, Literal

import msgspec

from cloud.store.errors import BackupFormatError
from shared.agent_packages import MAX_PACKAGE_BYTES
from shared.errors import MSGSPEC_DECODE_ERRORS

FORMAT: Final = "greenfed-store-backup"
FORMAT_VERSION: Final = 1
ValueKind = Literal["text", "integer", "float", "boolean"]
Value = str | int | float | bool | None
Row = Sequence[Value]

_NON_FINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# What both databases' integers hold (SQLite's INTEGER, PostgreSQL's BIGINT).
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# How the refusal of a value names what its column holds.
_KIND_WORDS: Final[dict[ValueKind, str]] = {
    "text": "text",
    "integer": "a 64-bit integer",
    "float": "a number",
    "boolean": "true or false",
}
# zlib's default level: a store of 1,000 jobs, 1.8 MB of JSON lines, becomes 111 kB in 13 ms
# (level 1: 127 kB in 4 ms; 9: 108 kB in 29 ms).
_COMPRESS_LEVEL: Final = 6


# table -> JSON column -> the decoder each of its documents must pass (cloud/store/restore.py).
DocumentDecoders = Mapping[str, Mapping[str, msgspec.json.Decoder[Any]]]


class BackupColumn(msgspec.Struct, frozen=True):
    name: str
    kind: ValueKind


class BackupTable(msgspec.Struct, frozen=True):
    name: str
    columns: tuple[BackupColumn, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)


class BackupHeader(msgspec.Struct, frozen=True, kw_only=True):
    format: str
    format_version: int
    created_at: float  # UTC epoch seconds
    greenfed_version: str
    source_backend: str  # "sqlite", "postgresql"
    source: str  # the database's URL, password hidden
    schema_version: int
    migrations: tuple[str, ...]  # names of migrations 1..schema_version, in order
    cluster_id: str | None  # None: the store never ran a control plane
    tables: tuple[BackupTable, ...]


class BackupTrailer(msgspec.Struct, frozen=True):
    rows: dict[str, int]


_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(BackupHeader)
# A line after the header: a row (array), a table's start {"table": ...} or the trailer.
_line_decoder = msgspec.json.Decoder(list[Value] | dict[str, str | dict[str, int]])


def partial_path(path: Path) -> Path:
    """Where the backup for `path` is written until it is complete."""
    return path.with_name(f".{path.name}.partial")


class _FormatOnly(msgspec.Struct):
    format: str


_format_decoder = msgspec.json.Decoder(_FormatOnly)
# A header names every table and column: a few kB. A first line longer than this (or
# none) is not one, and reading on would only spend memory on whatever the file is.
_MAX_HEADER_BYTES: Final = 1 << 20
# The longest row a store keeps is an agent package of the largest size the API takes
# (MAX_PACKAGE_BYTES, 64 MiB) as base64: 85.3 MiB. Every other row is a few MiB at
# most (its documents come in request bodies of at most 1 MiB). Twice the package: a
# line past this was not written by greenfed, and reading it whole (a few MB of gzip
# can hold gigabytes) would only exhaust memory.
MAX_ROW_BYTES: Final = 2 * 4 * math.ceil(MAX_PACKAGE_BYTES / 3)


def looks_like_backup(path: Path) -> bool:
    """Whether the file at `path` begins as a backup of any format version does: a gzip
    stream whose first line is a JSON object with this `format`. Reads no further."""
    try:
        with gzip.open(path, "rb") as stream:
            line = stream.readline(_MAX_HEADER_BYTES)
        return _format_decoder.decode(line).format == FORMAT
    except (OSError, EOFError, zlib.error, *MSGSPEC_DECODE_ERRORS):
        return False


class BackupWriter:
    """Writes one backup file; `finish()` puts it in place, `discard()` leaves nothing.

    Blocking (compression, file I/O): call its methods off the event loop."""

    def __init__(self, path: Path, header: BackupHeader) -> None:
        self.path = path
        self._partial = partial_path(path)
        self._kinds = {table.name: [c.kind for c in table.columns] for table in header.tables}
        self._rows: dict[str, int] = {}
        self._table: str | None = None
        self.finished = False
        descriptor = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._raw: IO[bytes] = os.fdopen(descriptor, "wb")
        # mtime 0: the same store gives the same bytes.
        self._gzip = gzip.GzipFile(
            filename="", mode="wb", fileobj=self._raw, compresslevel=_COMPRESS_LEVEL, mtime=0
        )
        self._gzip.write(_encoder.encode(header) + b"\n")

    def start_table(self, name: str) -> None:
        self._table = name
        self._rows[name] = 0
        self._gzip.write(_encoder.encode({"table": name}) + b"\n")

    def write_rows(self, rows: Sequence[Row]) -> None:
        assert self._table is not None, "start_table() first"
        floats = [i for i, kind in enumerate(self._kinds[self._table]) if kind == "float"]
        lines = []
        for row in rows:
            if floats and any(_non_finite(row[i]) for i in floats):
                row = [_finite_or_name(value) for value in row]
            lines.append(_encoder.encode(row))
        if lines:
            self._gzip.write(b"\n".join(lines) + b"\n")
        self._rows[self._table] += len(rows)

    def finish(self) -> int:
        """Write the trailer, make the file durable and give it its name; its size."""
        self._gzip.write(_encoder.encode(BackupTrailer(self._rows)) + b"\n")
        self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        os.replace(self._partial, self.path)
        self.finished = True
        _fsync_directory(self.path.parent)
        return self.path.stat().st_size

    def discard(self) -> None:
        self._gzip.close()
        self._raw.close()
        self._partial.unlink(missing_ok=True)


def _of_kind(value: str | int | float | bool, kind: ValueKind) -> Value:
    """The value as its column holds it, or None when it is not of the column's kind
    (a boolean is an int to Python, and neither an integer nor a number here)."""
    if kind == "text":
        return value if isinstance(value, str) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind == "integer":
        return value if isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX else None
    if isinstance(value, str):  # a float column's non-finite value, by its name
        return _NON_FINITE.get(value)
    try:
        return float(value)  # 2 written for 2.0
    except OverflowError:  # an integer no float holds
        return None


def _shown(value: Value) -> str:
    """The value as a refusal shows it: its repr, cut short."""
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."


def _a_date(epoch_s: float) -> bool:
    """Whether a UTC datetime holds these epoch seconds (years 1 to 9999)."""
    if not math.isfinite(epoch_s):
        return False
    try:
        datetime.fromtimestamp(epoch_s, UTC)
    except (OverflowError, ValueError, OSError):  # past time_t, or the years datetime holds
        return False
    return True


def _non_finite(value: Value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _finite_or_name(value: Value) -> Value:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class BackupReader:
    """Reads a backup file: the header at once, then each table's rows in batches.

    Blocking (decompression, file I/O): call `next_batch` off the event loop. Every
    damage is a `BackupFormatError`: a wrong CRC or length, a file cut short, anything
    after the trailer (another file appended), a line that is not what the format puts
    there (JSON nested too deep included) or longer than any greenfed writes, a header's
    created_at that is no date, a row of the wrong width, a value that is not of its
    column's kind (a restore checks the kinds against the schema,
    cloud/store/restore.py), a JSON document the store could not read back (the
    restore gives the decoders), counts that disagree. Whether a column may hold null
    is the database's to enforce: its NOT NULL refuses the row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = gzip.open(path, "rb")  # noqa: SIM115 (closed by close())
        except OSError as error:
            raise BackupFormatError(f"{path}: cannot open: {error.strerror or error}") from None
        try:
            self.header = self._read_header()
        except BaseException:
            self._file.close()
            raise
        self._expected = iter(self.header.tables)
        self._table: BackupTable | None = None
        self._kinds: tuple[ValueKind, ...] = ()  # the current table's, column by column
        self._read_as: Mapping[str, Mapping[str, ValueKind]] = {}
        self._documents: DocumentDecoders = {}
        # The current table's JSON columns: (index, the decoder its documents must pass).
        self._table_documents: tuple[tuple[int, msgspec.json.Decoder[Any]], ...] = ()
        self._rows: dict[str, int] = {}
        self.trailer: BackupTrailer | None = None

    def close(self) -> None:
        self._file.close()

    def _readline(self, max_bytes: int) -> bytes:
        """The next line, refused past `max_bytes` (with its newline) without reading on."""
        try:
            line = self._file.readline(max_bytes + 1)
        except (OSError, EOFError, zlib.error) as error:
            raise self._damaged(error) from None
        if len(line) > max_bytes:
            raise BackupFormatError(
                f"{self.path}: a line longer than {max_bytes:,} bytes, more than greenfed "
                "writes: the file was changed, or not made by greenfed"
            )
        return line

    def _damaged(self, error: OSError | EOFError | zlib.error) -> BackupFormatError:
        # gzip says "Compressed file ended before the end-of-stream marker was
        # reached", "CRC check failed ...", "Incorrect length of data produced",
        # "Not a gzipped file".
        return BackupFormatError(f"{self.path}: damaged: {error}")

    def _read_header(self) -> BackupHeader:
        line = self._readline(_MAX_HEADER_BYTES)
        if not line.startswith(b"{"):
            raise BackupFormatError(f"{self.path} is not a greenfed store backup")
        try:
            header = _header_decoder.decode(line)
        except MSGSPEC_DECODE_ERRORS as error:
            raise BackupFormatError(
                f"{self.path} is not a greenfed store backup ({error})"
            ) from None
        if header.format != FORMAT:
            raise BackupFormatError(f"{self.path} is not a greenfed store backup")
        if header.format_version > FORMAT_VERSION:
            raise BackupFormatError(
                f"{self.path} is in backup format {header.format_version}, and this greenfed "
                f"reads formats up to {FORMAT_VERSION}: restore it with the newer greenfed "
                f"that made it ({header.greenfed_version})"
            )
        if not _a_date(header.created_at):
            # A restore shows when the backup was taken; past the dates Python holds,
            # showing it would fail after the restore had committed.
            raise BackupFormatError(
                f"{self.path}: its header's created_at {header.created_at!r} is no date "
                "(UTC epoch seconds): the file was changed, or not made by greenfed"
            )
        return header

    def read_as(
        self, kinds: Mapping[str, Mapping[str, ValueKind]], documents: DocumentDecoders
    ) -> None:
        """Check values against these kinds (table -> column -> kind: the schema's, which a
        restore has checked the header against) rather than the header's, and each JSON
        column's documents with its decoder (table -> column -> decoder: how the store
        reads them back)."""
        self._read_as = kinds
        self._documents = documents

    def next_batch(self, max_rows: int) -> tuple[BackupTable, list[Row]] | None:
        """Up to `max_rows` rows of the current table (a table may come in several
        batches, an empty one as one empty batch); None after the last table, once the
        trailer has checked out."""
        if self.trailer is not None:
            return None
        rows: list[Row] = []
        while len(rows) < max_rows:
            line = self._readline(MAX_ROW_BYTES)
            if not line:
                raise BackupFormatError(f"{self.path} ends before its trailer: it is truncated")
            try:
                item = _line_decoder.decode(line)
            except MSGSPEC_DECODE_ERRORS as error:
                raise BackupFormatError(f"{self.path}: a damaged line ({error})") from None
            if isinstance(item, list):
                rows.append(self._row(item))
                continue
            finished = self._table
            table = item.get("table")
            if isinstance(table, str):
                self._start(table)
            else:
                self._check_trailer(item)
            if finished is not None:
                return finished, rows  # the rest of the table before (or all of it)
            if self._table is None:
                return None  # no table at all
        assert self._table is not None
        return self._table, rows

    def _start(self, name: str) -> None:
        expected = next(self._expected, None)
        if expected is None or expected.name != name:
            raise BackupFormatError(
                f"{self.path}: table {name!r} where the header says "
                f"{expected.name if expected else 'no more tables'!r}"
            )
        self._table = expected
        self._rows[name] = 0
        kinds = self._read_as.get(name, {})
        self._kinds = tuple(kinds.get(column.name, column.kind) for column in expected.columns)
        documents = self._documents.get(name, {})
        self._table_documents = tuple(
            (index, documents[column.name])
            for index, column in enumerate(expected.columns)
            if column.name in documents
        )

    def _row(self, values: list[Value]) -> Row:
        """The row with each value checked against its column's kind (a value of another
        kind would be stored as it is by SQLite, and fail every later read of it)."""
        table = self._table
        if table is None:
            raise BackupFormatError(f"{self.path}: a row before the first table")
        if len(values) != len(table.columns):
            raise BackupFormatError(
                f"{self.path}: a row of {table.name} with {len(values)} values, not "
                f"{len(table.columns)}"
            )
        for index, kind in enumerate(self._kinds):
            value = values[index]
            if value is None:
                continue
            read = _of_kind(value, kind)
            if read is None:
                raise BackupFormatError(
                    f"{self.path}: {table.name}.{table.columns[index].name} holds "
                    f"{_shown(value)}, not {_KIND_WORDS[kind]}"
                )
            values[index] = read
        for index, decoder in self._table_documents:
            document = values[index]
            if not isinstance(document, str):  # null (a value of another kind: refused above)
                continue
            try:
                decoder.decode(document)
            except MSGSPEC_DECODE_ERRORS as error:  # its ValidationError too
                first = table.columns[0].name
                raise BackupFormatError(
                    f"{self.path}: {table.name}.{table.columns[index].name} in row "
                    f"{self._rows[table.name] + 1} ({first} {_shown(values[0])}) is not what "
                    f"greenfed keeps there ({error}): the file was changed"
                ) from None
        self._rows[table.name] += 1
        return values

    def _check_trailer(self, item: dict[str, str | dict[str, int]]) -> None:
        try:
            trailer = msgspec.convert(item, BackupTrailer)
        except msgspec.ValidationError as error:
            raise BackupFormatError(f"{self.path}: a damaged line ({error})") from None
        missing = next(self._expected, None)
        if missing is not None:
            raise BackupFormatError(f"{self.path}: the trailer comes before table {missing.name!r}")
        if trailer.rows != self._rows:
            raise BackupFormatError(
                f"{self.path}: the trailer counts {trailer.rows}, the file holds {self._rows}"
            )
        self._check_end()
        self.trailer = trailer
        self._table = None

    def _check_end(self) -> None:
        """The file must end with the trailer's line. Reading on to the end is what makes
        gzip check the CRC32 and length of all it decompressed (a flipped bit can inflate
        to other rows that parse, a hash changed in one character, and only the CRC sees
        it) and refuse a footer cut short; whatever follows (another file appended, a
        second backup) is refused too, rather than left unread."""
        try:
            after = self._file.read(1)  # one byte: an appended file is not decompressed
        except (OSError, EOFError, zlib.error) as error:
            raise self._damaged(error) from None
        if after:
            raise BackupFormatError(
                f"{self.path}: data after its trailer: the file was changed, or had "
                "another appended to it"
            )


# The tables people ask about first, with the words they use for them.
_HEADLINE_TABLES: Final = {
    "tenants": "tenants",
    "work": "jobs and deployments",
    "enrolled_nodes": "enrolled nodes",
    "events": "events",
}


def describe_counts(rows: Mapping[str, int]) -> str:
    """The tables people ask about, then all, e.g. `3 tenants, 1,000 jobs and deployments,
    100 enrolled nodes, 5,210 events (6,480 rows in 17 tables)`; `schema_version` (the
    migrations' history, not the store's content) is left out."""
    content = {name: count for name, count in rows.items() if name != "schema_version"}
    shown = [
        f"{content[name]:,} {words}" for name, words in _HEADLINE_TABLES.items() if name in content
    ]
    total = f"{sum(content.values()):,} rows in {len(content)} tables"
    return f"{', '.join(shown)} ({total})" if shown else total
