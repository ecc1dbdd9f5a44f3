"""Where the outbox keeps what the broker has not acknowledged yet: in order, bounded
in bytes and in age, on disk when the agent has a state directory.

`DiskSpool` is an append-only log of segment files (`<n>.seg`, at most
`SEGMENT_BYTES` each) read from a cursor (`cursor`: segment number and byte offset,
written atomically). A record is a header (payload length, channel code, the time it
was spooled) and the payload. Appends are flushed to the file at once, so a crashed
agent loses nothing it had spooled (a power cut may lose the last moments: records
are not fsynced one by one). A half-written record at the end of the newest segment
(the agent died mid-write) is cut off when the spool is opened.

The cursor is saved every `CURSOR_SAVE_EVERY` records and when a flush ends, so an
agent that dies between a publish and the save sends a few records again: every
record is idempotent for the cloud (events by `event_id`, log chunks by offset).

Bounds: past `max_bytes` the oldest records are dropped (whole segments on disk),
and a record older than `max_age_s` when its turn comes is dropped unsent; both
are counted (`dropped`, `expired`). A record's age is counted on the monotonic clock
when this process spooled it, so that a wall clock stepped since (a board without a
real-time clock that booted days behind, then NTP) neither expires what was spooled
a moment ago nor keeps what is too old; a record an earlier agent spooled can only be
aged by the wall time in its header. `MemorySpool` keeps the same rules in memory for
agents without a state directory (simulated fleets, tests).

A full or read-only disk (or one out of inodes) never stops the agent: a record that
cannot be written is lost and counted (`dropped`, `write_errors`), and the next append
tries the disk again; a segment that cannot be started leaves the records going to
the one before. A spool opened on a read-only data directory sends what it holds and
keeps trying to open its segment for appending; one whose directory cannot be made
or read at all starts empty and keeps nothing (its records are read again by the
next agent that can).
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from shared.lean_logs import get_logger
from shared.topics import Channel

SEGMENT_BYTES = 1 << 20
CURSOR_SAVE_EVERY = 64
_HEADER = struct.Struct("<IBd")  # payload bytes, channel code, spooled at (unix s)
_CODES = {Channel.EVENTS: 1, Channel.LOGS: 2}
_CHANNELS = {code: channel for channel, code in _CODES.items()}
_SUFFIX = ".seg"
# How far the wall clock may move from the monotonic one before it counts as stepped (NTP
# correcting a wrong clock), not slewed: a record's monotonic time is then worked out from
# a new reading of the difference (and a birth's `started_at` moves, edge/agent/birth.py).
CLOCK_STEP_TOLERANCE_S = 1.0
_log = get_logger("greenfed.outbox")
# Where a record lies in its spool, in the order records are appended: (segment number,
# byte offset) on disk, (0, number appended before it) in memory.
Position = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Record:
    channel: Channel
    payload: bytes
    spooled_at: float

    @property
    def size(self) -> int:
        return _HEADER.size + len(self.payload)


class Spool(Protocol):
    dropped: int  # records dropped to stay within max_bytes
    expired: int  # records older than max_age_s when their turn came

    @property
    def pending_bytes(self) -> int: ...

    def append(self, channel: Channel, payload: bytes) -> None: ...

    def peek(self) -> Record | None:
        """The oldest record not yet taken, skipping (and counting) expired ones."""
        ...

    def take(self, record: Record) -> None:
        """`record`, returned by `peek`, is acknowledged: move past it (unless appends
        dropped it meanwhile, to stay within bounds)."""
        ...

    def save(self) -> None:
        """Make what was taken durable (the disk spool's cursor)."""
        ...

    def close(self) -> None: ...


class RecordAges:
    """How old a record is, for `max_age_s`: by the monotonic clock if this process
    spooled it, else by the wall clock (the time in its header).

    No monotonic time is kept per record: the wall clock's lead over the monotonic one
    changes only when the wall clock is stepped, so one entry per change (from the first
    record spooled after it) gives each record's monotonic time from its wall time."""

    def __init__(
        self, max_age_s: float, clock: Callable[[], float], monotonic: Callable[[], float]
    ) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._monotonic = monotonic
        # (position of the first record it holds for, wall clock minus monotonic clock)
        self._leads: deque[tuple[Position, float]] = deque()

    def spooled(self, position: Position, spooled_at: float) -> None:
        """The record at `position` was spooled just now, at `spooled_at` (wall clock)."""
        lead_s = spooled_at - self._monotonic()
        if not self._leads or abs(lead_s - self._leads[-1][1]) > CLOCK_STEP_TOLERANCE_S:
            self._leads.append((position, lead_s))

    def expired(self, position: Position, record: Record) -> bool:
        """Whether `record`, at `position`, is older than `max_age_s`. Records are asked
        about in the order they were spooled: what is before `position` is let go."""
        leads = self._leads
        while len(leads) > 1 and leads[1][0] <= position:
            leads.popleft()
        if not leads or position < leads[0][0]:  # an earlier agent spooled it
            return record.spooled_at < self._clock() - self._max_age_s
        spooled_monotonic_s = record.spooled_at - leads[0][1]
        return spooled_monotonic_s < self._monotonic() - self._max_age_s


class MemorySpool:
    def __init__(
        self,
        *,
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._records: deque[Record] = deque()
        self._appended = 0  # records ever appended: the next one's position
        self._bytes = 0
        self._max_bytes = max_bytes
        self._ages = RecordAges(max_age_s, clock, monotonic)
        self._clock = clock
        self.dropped = 0
        self.expired = 0

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def append(self, channel: Channel, payload: bytes) -> None:
        record = Record(channel, payload, self._clock())
        self._ages.spooled((0, self._appended), record.spooled_at)
        self._records.append(record)
        self._appended += 1
        self._bytes += record.size
        while self._bytes > self._max_bytes and len(self._records) > 1:
            self._bytes -= self._records.popleft().size
            self.dropped += 1

    def peek(self) -> Record | None:
        records = self._records
        while records and self._ages.expired((0, self._appended - len(records)), records[0]):
            self._bytes -= records.popleft().size
            self.expired += 1
        return records[0] if records else None

    def take(self, record: Record) -> None:
        if self._records and self._records[0] is record:
            self._bytes -= self._records.popleft().size

    def save(self) -> None:
        return None

    def close(self) -> None:
        return None


class DiskSpool:
    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self._directory = directory
        self._max_bytes = max_bytes
        self._ages = RecordAges(max_age_s, clock, monotonic)
        self._clock = clock
        # Bytes are bounded by dropping whole segments: keep several within the bound.
        self._segment_bytes = max(4096, min(segment_bytes, max_bytes // 4))
        self.dropped = 0
        self.expired = 0
        self.write_errors = 0
        self._peeked: Record | None = None
        self._taken_since_save = 0
        self._sizes: dict[int, int] = {0: 0}
        self._read_segment = self._read_offset = self._write_segment = 0
        # None while no segment could be opened for appending: each append tries again.
        self._writer: BinaryIO | None = None
        # Whether the segments on disk could be read: if not, nothing is written there
        # (a segment number it did not see could be one holding records).
        self._usable = True
        # Whether the last write (or segment start) failed: a failing disk is logged
        # once, not per record.
        self._failing = False
        self._rolling_over_fails = False
        try:
            self._open_existing()
        except OSError as error:
            self._usable = False
            self.write_errors += 1
            _log.warning("outbox spool unusable: records are not kept", error=str(error))
            self._sizes = {0: 0}
            self._read_segment = self._read_offset = self._write_segment = 0
            return
        self._open_writer()

    def _open_existing(self) -> None:
        """Find the segments and the cursor on disk."""
        directory = self._directory
        directory.mkdir(parents=True, exist_ok=True)
        segments = sorted(
            int(path.stem) for path in directory.glob(f"*{_SUFFIX}") if path.stem.isdigit()
        )
        self._sizes = {n: self._path(n).stat().st_size for n in segments}
        if segments:
            self._sizes[segments[-1]] = self._cut_partial(segments[-1])
        read_segment, read_offset = self._load_cursor()
        if segments and read_segment < segments[0]:
            read_segment, read_offset = segments[0], 0  # its segment was dropped
        if read_segment in self._sizes:
            # A cursor past what is on disk (a power cut took the segment's unsynced tail)
            # or off a record boundary: back to the last whole record before it.
            read_offset = self._boundary_at_or_below(read_segment, read_offset)
        self._read_segment = read_segment if segments else 0
        self._read_offset = read_offset if segments else 0
        self._write_segment = segments[-1] if segments else 0
        self._sizes.setdefault(self._write_segment, 0)

    # -- appending -----------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        return sum(self._sizes.values()) - self._read_offset

    def append(self, channel: Channel, payload: bytes) -> None:
        spooled_at = self._clock()
        record = _HEADER.pack(len(payload), _CODES[channel], spooled_at) + payload
        written = self._sizes[self._write_segment]
        if written and written + len(record) > self._segment_bytes:
            started = self._roll_over()
            # No new segment, and the old ones cannot be dropped while this one is
            # written: past the bound, this record is lost instead (counted).
            if not started and self.pending_bytes + len(record) > self._max_bytes:
                self.dropped += 1
                return
        if self._writer is None and not self._open_writer():
            self.dropped += 1  # still no segment to write to: a full or read-only disk
            return
        assert self._writer is not None
        try:
            self._writer.write(record)
            self._writer.flush()
        except (OSError, ValueError) as error:
            # A full or read-only disk: this record is lost (counted), the agent goes on.
            # (ValueError: a file object closed under it; never expected, never fatal.)
            self.dropped += 1
            self._failed("outbox spool write failed", error)
            self._reopen_writer()
            return
        self._failing = False
        self._ages.spooled((self._write_segment, self._sizes[self._write_segment]), spooled_at)
        self._sizes[self._write_segment] += len(record)
        while self.pending_bytes > self._max_bytes and self._read_segment < self._write_segment:
            self._drop_read_segment()

    # -- reading -------------------------------------------------------------------

    def peek(self) -> Record | None:
        while True:
            if self._peeked is None:
                self._peeked = self._read()
                if self._peeked is None:
                    return None
            # A record peeked lies at the read cursor (anything that moves it lets it go).
            if not self._ages.expired((self._read_segment, self._read_offset), self._peeked):
                return self._peeked
            self.expired += 1
            self.take(self._peeked)

    def take(self, record: Record) -> None:
        if record is not self._peeked:
            return  # dropped (with its segment) while it was being sent
        self._peeked = None
        self._read_offset += record.size
        self._taken_since_save += 1
        if self._taken_since_save >= CURSOR_SAVE_EVERY:
            self.save()

    def save(self) -> None:
        if not self._taken_since_save:
            return
        self._taken_since_save = 0
        temporary = self._directory / "cursor.tmp"
        try:
            temporary.write_text(f"{self._read_segment} {self._read_offset}\n", encoding="ascii")
            os.replace(temporary, self._directory / "cursor")
        except OSError as error:  # the records are resent after a restart: no loss
            self.write_errors += 1
            _log.warning("outbox cursor not saved", error=str(error))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.save()
        self._close_writer()

    def _roll_over(self) -> bool:
        """Start the next segment; whether it could be. Its file is opened before the
        full one is let go, so that a disk out of space or inodes leaves the spool as it
        was (appends try again), never without a writer."""
        segment = self._write_segment + 1
        try:
            writer = self._open_segment(segment, 0)
        except OSError as error:
            self.write_errors += 1
            if not self._rolling_over_fails:
                _log.warning("outbox spool segment not started", error=str(error))
            self._rolling_over_fails = True
            return False  # the record goes to the full segment, or is lost if it cannot
        self._rolling_over_fails = False
        self._close_writer()
        self._writer = writer
        self._write_segment = segment
        self._sizes[segment] = 0
        return True

    def _open_writer(self) -> bool:
        """Open the write segment for appending; whether it could be (it is tried again
        at the next append if not)."""
        if not self._usable:
            return False
        try:
            self._writer = self._open_segment(self._write_segment, self._sizes[self._write_segment])
        except OSError as error:
            self._writer = None
            self._failed("outbox spool segment not opened", error)
            return False
        return True

    def _open_segment(self, segment: int, size: int) -> BinaryIO:
        """The segment's file for appending, cut back to `size` (its whole records: a
        failed write may have left part of one)."""
        self._directory.mkdir(parents=True, exist_ok=True)
        writer = open(self._path(segment), "ab")  # noqa: SIM115 - kept open
        try:
            if writer.tell() != size:
                writer.truncate(size)
        except OSError:
            writer.close()
            raise
        return writer

    def _close_writer(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()
            self._writer = None

    def _reopen_writer(self) -> None:
        """After a failed write: a new file object (the old one may still hold the bytes
        it could not write), the segment back to its last whole record."""
        self._close_writer()
        self._open_writer()

    def _failed(self, message: str, error: Exception) -> None:
        """Count a failed write to disk; log the first of a run of them."""
        self.write_errors += 1
        if not self._failing:
            _log.warning(message, error=str(error))
        self._failing = True

    def _read(self) -> Record | None:
        while True:
            size = self._sizes.get(self._read_segment, 0)
            if self._read_offset < size:
                try:
                    with open(self._path(self._read_segment), "rb") as file:
                        file.seek(self._read_offset)
                        header = file.read(_HEADER.size)
                        if len(header) == _HEADER.size:
                            length, code, spooled_at = _HEADER.unpack(header)
                            end = self._read_offset + _HEADER.size + length
                            if code in _CHANNELS and end <= size:
                                return Record(_CHANNELS[code], file.read(length), spooled_at)
                except OSError as error:  # gone, or a failing disk: as if damaged
                    _log.warning("outbox spool segment unreadable", error=str(error))
                # Not a record (the file was damaged): the rest of the segment is given up.
                _log.warning("outbox spool damaged", segment=self._read_segment)
                self.dropped += 1
                self._read_offset = size
                continue
            if self._read_segment >= self._write_segment:
                return None
            # Every record of this segment was taken: delete it, read the next.
            self._drop_read_segment(counted=False)

    def _drop_read_segment(self, *, counted: bool = True) -> None:
        segment = self._read_segment
        if counted:
            with contextlib.suppress(OSError):  # unreadable: its records go uncounted
                self.dropped += self._records_in(segment, self._read_offset)
        try:
            self._path(segment).unlink()
        except FileNotFoundError:
            pass
        except OSError as error:  # a read-only disk: read again after a restart, no loss
            self.write_errors += 1
            _log.warning("outbox spool segment not deleted", error=str(error))
        del self._sizes[segment]
        self._read_segment = segment + 1
        self._read_offset = 0
        self._peeked = None
        self._taken_since_save += 1  # the cursor moved
        self.save()

    # -- files ---------------------------------------------------------------------

    def _path(self, segment: int) -> Path:
        return self._directory / f"{segment:012d}{_SUFFIX}"

    def _load_cursor(self) -> tuple[int, int]:
        try:
            segment, offset = (self._directory / "cursor").read_text(encoding="ascii").split()
            return int(segment), int(offset)
        except (OSError, ValueError):  # none, or unreadable: everything is sent again
            return 0, 0

    @staticmethod
    def _headers(path: Path, start: int = 0) -> Iterator[tuple[int, int]]:
        """(channel code, end offset) of each record header from `start`, in order; the
        record may run past the end of the file (a half-written one): callers decide."""
        with open(path, "rb") as file:
            file.seek(start)
            while len(header := file.read(_HEADER.size)) == _HEADER.size:
                length, code, _ = _HEADER.unpack(header)
                start += _HEADER.size + length
                yield code, start
                file.seek(start)

    def _boundary_at_or_below(self, segment: int, offset: int) -> int:
        boundary = 0
        limit = min(offset, self._sizes[segment])
        for _, end in self._headers(self._path(segment)):
            if end > limit:
                break
            boundary = end
        return boundary

    def _records_in(self, segment: int, offset: int) -> int:
        return sum(1 for _ in self._headers(self._path(segment), offset))

    def _cut_partial(self, segment: int) -> int:
        """Truncate a half-written last record; the segment's whole-record size."""
        path = self._path(segment)
        end = 0
        size = path.stat().st_size
        for code, record_end in self._headers(path):
            if code not in _CHANNELS:
                self.dropped += 1  # damage, not a half-written record: counted
                _log.warning("outbox spool damaged", segment=segment)
                break
            if record_end > size:
                break
            end = record_end
        if end < size:
            try:
                with open(path, "r+b") as file:
                    file.truncate(end)
            except OSError as error:  # read-only: reading stops at `end`; so does writing
                self.write_errors += 1
                _log.warning("outbox spool half-written record not cut", error=str(error))
        return end
