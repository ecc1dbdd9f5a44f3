"""Training output in the cloud: the latest output of each job, in memory, bounded.

Agents ship each worker's new output on the `logs` MQTT channel (`JobLogChunk`, at most
one chunk per worker per second, QoS 1: a chunk may arrive twice). Ingestion hands every
chunk to `JobLogStore.append`; `GET /v1/jobs/{id}/logs` reads and follows it. The full
output stays in the worker's log file on its node: this is a tail for people, not an
archive.

Bounds: the newest `bytes_per_job` of each job (over all its attempts and nodes), at
most `total_bytes` and `max_jobs` in all (the jobs that were quiet longest go first).
Every kept piece also costs memory of its own, whatever its text (about
`PIECE_OVERHEAD_BYTES`), so the budgets bound the number of pieces too: a job keeps at
most `bytes_per_job / PIECE_OVERHEAD_BYTES` of them (at least `MIN_PIECES_PER_JOB`), the
store `total_bytes / PIECE_OVERHEAD_BYTES`; many tiny chunks are trimmed as surely as a
few large ones. An empty chunk that says nothing new (no gap before it) is not kept.

Gaps and copies: a chunk's `offset` is where its text starts in the worker's output,
in raw bytes. When it is past the end of what arrived before (lost chunks, output the
agent dropped, or output from before this process started), a marker line says how
many bytes are missing; a chunk within what arrived (a copy delivered again) is not
kept. The agent replaces each undecodable byte sequence (1 to 3 raw bytes) by U+FFFD,
3 bytes in UTF-8, so the raw length of a chunk with replacements is known only within
bounds, and so is the end of what arrived (`_Stream.end_min_offset`/`end_max_offset`).
What holds: for valid UTF-8 output both are exact, and so are gaps and copies. Past
output that is not, no chunk is lost for it: a chunk whose place is uncertain is a copy
only if it starts where (or before) the newest kept chunk did, as a resent one does.
A gap is marked only where output is certainly missing: right after a chunk with k
replacements, one of up to 2k bytes can go unsaid, or its count be short by as much;
the next kept chunk of valid UTF-8 makes the end exact again.

Trimmed output: each piece knows how many bytes of its stream the cloud received before
it (`received_before_bytes`), and a snapshot how many of each stream's oldest it let go
(`trimmed_by_stream`), so a reader that comes back later (a followed log) sees where
output it never read was trimmed meanwhile, and says so as the plain read does.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from shared.messages import JobLogChunk

StreamKey = tuple[int, str]  # (attempt, node_id)

# About what a kept piece costs beyond its text (the piece, its string, its queue slot).
PIECE_OVERHEAD_BYTES: Final = 256
# Pieces a job may keep however small its budget: a few workers' recent chunks.
MIN_PIECES_PER_JOB: Final = 64
# The longest unfinished line a prefixed (gang) rendering holds per stream while waiting
# for its end: past it, the line is shown in parts, so a follower's memory stays bounded
# (however long a line a worker prints) and the output reaches it.
MAX_OPEN_LINE_CHARS: Final = 64 * 1024
# What the agent puts for undecodable output: 3 bytes in UTF-8 for 1 to 3 raw bytes.
REPLACEMENT_CHARACTER: Final = "\ufffd"


@dataclass(frozen=True, slots=True)
class LogPiece:
    """Output of one worker stream as it arrived; `missing_bytes` > 0: a gap before it."""

    seq: int  # increasing: the "after_seq" cursor of followed logs
    attempt: int
    node_id: str
    text: str
    missing_bytes: int = 0
    size_bytes: int = 0
    # Bytes of its stream the cloud received (and kept a while) before this piece.
    received_before_bytes: int = 0


@dataclass(slots=True)
class _Stream:
    # Bounds on where the output that arrived ends, in the worker's raw bytes: equal
    # unless text had undecodable bytes replaced (their raw length is not known).
    end_min_offset: int = 0
    end_max_offset: int = 0
    newest_start_offset: int = -1  # where the newest kept chunk starts; -1: none yet
    received_bytes: int = 0  # the sizes of its pieces so far
    trimmed_bytes: int = 0  # those of its oldest pieces, let go (a stream trims in order)


@dataclass(slots=True)
class _JobLog:
    pieces: deque[LogPiece] = field(default_factory=deque)
    streams: dict[StreamKey, _Stream] = field(default_factory=dict)
    size_bytes: int = 0
    trimmed_bytes: int = 0  # older output let go to stay within the per-job budget
    last_seq: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass(frozen=True, slots=True)
class LogSnapshot:
    pieces: tuple[LogPiece, ...]
    last_seq: int
    trimmed_bytes: int
    attempts: tuple[int, ...]  # attempts with output, ascending
    # Per stream: the bytes of its oldest output let go (streams that trimmed some).
    trimmed_by_stream: Mapping[StreamKey, int] = field(default_factory=dict)


class JobLogStore:
    def __init__(
        self,
        *,
        bytes_per_job: int = 1024 * 1024,
        total_bytes: int = 128 * 1024 * 1024,
        max_jobs: int = 4096,
    ) -> None:
        self._bytes_per_job = bytes_per_job
        self._total_bytes = total_bytes
        self._max_jobs = max_jobs
        # The same budgets in pieces, each costing PIECE_OVERHEAD_BYTES.
        self._pieces_per_job = max(MIN_PIECES_PER_JOB, bytes_per_job // PIECE_OVERHEAD_BYTES)
        self._total_pieces = max(self._pieces_per_job, total_bytes // PIECE_OVERHEAD_BYTES)
        self._jobs: OrderedDict[str, _JobLog] = OrderedDict()  # least recently written first
        self._size_bytes = 0
        self._pieces = 0
        self._seq = 0  # over all jobs, so a cursor stays valid if a job is evicted and returns
        self._first_output = asyncio.Event()  # set (and replaced) when a job first appears
        self.closed = False

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def pieces(self) -> int:
        """Pieces kept, over all jobs."""
        return self._pieces

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def append(self, chunk: JobLogChunk) -> None:
        """The ingestion `on_log` callback: keep the chunk, note a gap before it."""
        job = self._jobs.get(chunk.job_id)
        if job is None:
            job = self._jobs[chunk.job_id] = _JobLog()
            self._first_output.set()
            self._first_output = asyncio.Event()
        self._jobs.move_to_end(chunk.job_id)
        key = (chunk.attempt, chunk.node_id)
        stream = job.streams.setdefault(key, _Stream())
        size = len(chunk.text.encode())
        raw_min_bytes = size - 2 * chunk.text.count(REPLACEMENT_CHARACTER)
        missing = max(0, chunk.offset - stream.end_max_offset, chunk.dropped_bytes)
        if size == 0 and not missing:
            return  # an empty chunk that says nothing
        if size and _is_copy(stream, chunk.offset, raw_min_bytes, size):
            return
        _note_arrived(stream, chunk.offset, raw_min_bytes, size)
        self._seq += 1
        job.last_seq = self._seq
        piece = LogPiece(
            seq=self._seq,
            attempt=chunk.attempt,
            node_id=chunk.node_id,
            text=chunk.text,
            missing_bytes=missing,
            size_bytes=size,
            received_before_bytes=stream.received_bytes,
        )
        stream.received_bytes += size
        job.pieces.append(piece)
        job.size_bytes += size
        self._size_bytes += size
        self._pieces += 1
        while len(job.pieces) > 1 and (
            job.size_bytes > self._bytes_per_job or len(job.pieces) > self._pieces_per_job
        ):
            self._drop_oldest(job)
        self._evict_jobs()
        job.notify()

    def _drop_oldest(self, job: _JobLog) -> None:
        """Trim the oldest piece of an earlier attempt, else the oldest: a node the job
        left (its assignment lingers a while) cannot crowd the current attempt's output
        out of the job's budget."""
        newest = max(attempt for attempt, _ in job.streams)
        earlier = next((piece for piece in job.pieces if piece.attempt < newest), None)
        if earlier is not None:
            job.pieces.remove(earlier)
            oldest = earlier
        else:
            oldest = job.pieces.popleft()
        job.size_bytes -= oldest.size_bytes
        job.trimmed_bytes += oldest.size_bytes
        job.streams[(oldest.attempt, oldest.node_id)].trimmed_bytes += oldest.size_bytes
        self._size_bytes -= oldest.size_bytes
        self._pieces -= 1

    def _evict_jobs(self) -> None:
        while len(self._jobs) > 1 and (
            len(self._jobs) > self._max_jobs
            or self._size_bytes > self._total_bytes
            or self._pieces > self._total_pieces
        ):
            _, job = self._jobs.popitem(last=False)
            self._size_bytes -= job.size_bytes
            self._pieces -= len(job.pieces)
            job.notify()

    def snapshot(
        self,
        job_id: str,
        *,
        attempt: int | None = None,
        node_id: str | None = None,
        after_seq: int = 0,
        min_attempt: int | None = None,
    ) -> LogSnapshot:
        """What is kept of the job's output: one `attempt` or all from `min_attempt` on,
        one node or all, pieces after `after_seq`."""
        job = self._jobs.get(job_id)
        if job is None:
            return LogSnapshot((), 0, 0, ())
        attempts = tuple(sorted({a for a, _ in job.streams}))
        pieces = tuple(
            piece
            for piece in job.pieces
            if piece.seq > after_seq
            and (attempt is None or piece.attempt == attempt)
            and (min_attempt is None or piece.attempt >= min_attempt)
            and (node_id is None or piece.node_id == node_id)
        )
        trimmed_by_stream = {
            key: stream.trimmed_bytes for key, stream in job.streams.items() if stream.trimmed_bytes
        }
        return LogSnapshot(pieces, job.last_seq, job.trimmed_bytes, attempts, trimmed_by_stream)

    async def wait_for_output(self, job_id: str, after_seq: int, timeout_s: float) -> bool:
        """Wait until the job has output after `after_seq`; False on timeout or `close`."""
        try:
            async with asyncio.timeout(timeout_s):
                while not self.closed:
                    job = self._jobs.get(job_id)
                    if job is not None and job.last_seq > after_seq:
                        return True
                    changed = self._first_output if job is None else job.changed
                    await changed.wait()
        except TimeoutError:
            pass
        return False

    def close(self) -> None:
        """The server is stopping: wake every follower (they see `closed` and end)."""
        self.closed = True
        self._first_output.set()
        for job in self._jobs.values():
            job.notify()


def _is_copy(stream: _Stream, offset: int, raw_min_bytes: int, raw_max_bytes: int) -> bool:
    """Whether a chunk at `offset`, of `raw_min_bytes` to `raw_max_bytes` raw bytes,
    holds only output already here (a copy delivered again)."""
    if offset + raw_max_bytes <= stream.end_min_offset:
        return True  # it certainly ends within what arrived
    if offset + raw_min_bytes > stream.end_max_offset:
        return False  # it certainly brings output past what arrived (overlap or not)
    # Undecodable bytes left it uncertain. One agent's chunks follow each other without
    # overlap, so new output starts past the newest chunk's start; a copy repeats it.
    return offset <= stream.newest_start_offset


def _note_arrived(stream: _Stream, offset: int, raw_min_bytes: int, raw_max_bytes: int) -> None:
    """A chunk at `offset`, of `raw_min_bytes` to `raw_max_bytes` raw bytes, is kept."""
    if offset >= stream.end_min_offset:
        # One agent's chunks follow each other: the output before ended at this chunk's
        # start (or earlier, a gap), so the uncertainty left by replaced bytes ends here.
        stream.end_min_offset = offset + raw_min_bytes
        stream.end_max_offset = offset + raw_max_bytes
    else:  # it overlaps what arrived: an agent that took a worker over resent from before
        stream.end_min_offset = max(stream.end_min_offset, offset + raw_min_bytes)
        stream.end_max_offset = max(stream.end_max_offset, offset + raw_max_bytes)
    stream.newest_start_offset = max(stream.newest_start_offset, offset)


MISSING_MARKER: Final = "[greenfed: {bytes} bytes of output missing here]\n"
TRIMMED_MARKER: Final = "[greenfed: {bytes} earlier bytes are no longer kept in the cloud]\n"
ATTEMPT_MARKER: Final = "[greenfed: attempt {attempt}]\n"


class LogRenderer:
    """Pieces to text. With `prefix`, each line is prefixed by its node (several workers),
    so a partial line waits for its end; without, text passes through as it came.

    Prefixed, a lone carriage return ends a line too: a progress bar that redraws itself
    (tqdm) shows as a line per redraw instead of a line that never ends, and a line held
    open longer than `MAX_OPEN_LINE_CHARS` is shown in parts.

    Output of a stream trimmed before it was rendered (between two reads of a followed
    log) is marked as the plain read marks what it no longer has; `accounted_bytes` are
    the bytes of each stream said already (the plain read's marker counts them)."""

    def __init__(
        self, *, prefix: bool, accounted_bytes: Mapping[StreamKey, int] | None = None
    ) -> None:
        self._prefix = prefix
        self._partial: dict[StreamKey, str] = {}  # prefix: the unfinished line of a stream
        self._mid_line: set[StreamKey] = set()  # no prefix: streams whose last line is open
        self._attempt: int | None = None
        # Per stream: the received bytes rendered or accounted for, up to the last piece.
        self._through_bytes: dict[StreamKey, int] = dict(accounted_bytes or {})

    def feed(self, pieces: Iterable[LogPiece]) -> str:
        return "".join(self._render(piece) for piece in pieces)

    def _render(self, piece: LogPiece) -> str:
        out: list[str] = []
        if self._attempt is not None and piece.attempt != self._attempt:
            out.append(self.flush())
            out.append(ATTEMPT_MARKER.format(attempt=piece.attempt))
        self._attempt = piece.attempt
        key = (piece.attempt, piece.node_id)
        label = f"[{piece.node_id}] " if self._prefix else ""
        trimmed = piece.received_before_bytes - self._through_bytes.get(key, 0)
        self._through_bytes[key] = piece.received_before_bytes + piece.size_bytes
        if trimmed > 0 or piece.missing_bytes:
            out.append(self._end_line(key))
        if trimmed > 0:
            out.append(label + TRIMMED_MARKER.format(bytes=trimmed))
        if piece.missing_bytes:
            out.append(label + MISSING_MARKER.format(bytes=piece.missing_bytes))
        if not self._prefix:
            if piece.text:
                if piece.text.endswith("\n"):
                    self._mid_line.discard(key)
                else:
                    self._mid_line.add(key)
            out.append(piece.text)
            return "".join(out)
        lines = (self._partial.pop(key, "") + piece.text).split("\n")
        for line in lines[:-1]:
            out.extend(f"{label}{part}\n" for part in _redrawn_parts(line, ended=True))
        *shown, held = _redrawn_parts(lines[-1], ended=False)
        if len(held) > MAX_OPEN_LINE_CHARS:
            shown.append(held)
            held = ""
        out.extend(f"{label}{part}\n" for part in shown)
        if held:
            self._partial[key] = held
        return "".join(out)

    def _end_line(self, key: StreamKey) -> str:
        if self._prefix:
            partial = self._partial.pop(key, "")
            return f"[{key[1]}] {partial}\n" if partial else ""
        if key in self._mid_line:
            self._mid_line.discard(key)
            return "\n"
        return ""

    def flush(self) -> str:
        """End every open line (the output ends here, or another attempt starts)."""
        keys = sorted({*self._partial, *self._mid_line})
        return "".join(self._end_line(key) for key in keys)


def _redrawn_parts(line: str, *, ended: bool) -> list[str]:
    """A line (without its newline) split where a lone carriage return starts it over;
    the empty parts between redraws left out. A final CR is kept: it may be half of a
    CRLF (the LF in the next chunk). Unless the line `ended`, its last part, maybe
    empty, is the one still open."""
    body, final_cr = (line[:-1], "\r") if line.endswith("\r") else (line, "")
    *redrawn, last = body.split("\r")
    last += final_cr
    parts = [part for part in redrawn if part]
    if not ended or last or not parts:
        parts.append(last)
    return parts


def last_lines(text: str, count: int) -> str:
    """The last `count` lines of `text` (a final partial line counts as one)."""
    if count <= 0:
        return ""
    lines = text.splitlines(keepends=True)
    return "".join(lines[-count:])


def render_tail(
    snapshot: LogSnapshot, *, prefix: bool, tail_lines: int | None, finish: bool = True
) -> tuple[str, LogRenderer]:
    """The kept output as text (its last `tail_lines` lines), and the renderer that made
    it, to continue with when following."""
    # What was trimmed before this snapshot is said once, by the marker at the top.
    renderer = LogRenderer(prefix=prefix, accounted_bytes=snapshot.trimmed_by_stream)
    text = renderer.feed(snapshot.pieces)
    if finish:
        text += renderer.flush()
    if tail_lines is not None:
        text = last_lines(text, tail_lines)
    kept = len(text.splitlines())
    wanted_more = tail_lines is None or tail_lines > kept
    if snapshot.trimmed_bytes and wanted_more:
        text = TRIMMED_MARKER.format(bytes=snapshot.trimmed_bytes) + text
    return text, renderer


def iter_nodes(snapshot: LogSnapshot) -> Iterator[str]:
    seen: set[str] = set()
    for piece in snapshot.pieces:
        if piece.node_id not in seen:
            seen.add(piece.node_id)
            yield piece.node_id
