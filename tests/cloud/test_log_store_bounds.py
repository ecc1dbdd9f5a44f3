"""The job log store's bounds hold for chunks that carry little or nothing
(cloud/streams/logs.py): a node running an attempt may send any number of them, and
each kept piece costs memory whatever its text."""

from __future__ import annotations

import pytest

from cloud.streams.logs import (
    MIN_PIECES_PER_JOB,
    PIECE_OVERHEAD_BYTES,
    JobLogStore,
    render_tail,
)
from shared.messages import JobLogChunk

CHUNKS = 200_000
BYTES_PER_JOB = 1024
TOTAL_BYTES = 4096
MAX_JOBS = 4
# What the budgets allow in pieces (each counting PIECE_OVERHEAD_BYTES).
PIECES_PER_JOB = max(MIN_PIECES_PER_JOB, BYTES_PER_JOB // PIECE_OVERHEAD_BYTES)


def chunk(text: str, *, offset: int, job_id: str = "job-1", dropped: int = 0) -> JobLogChunk:
    return JobLogChunk(
        node_id="n1",
        job_id=job_id,
        attempt=0,
        offset=offset,
        text=text,
        dropped_bytes=dropped,
        sent_at=1.0,
    )


def kept_pieces(store: JobLogStore, *job_ids: str) -> int:
    return sum(len(store.snapshot(job_id).pieces) for job_id in job_ids)


def store() -> JobLogStore:
    return JobLogStore(bytes_per_job=BYTES_PER_JOB, total_bytes=TOTAL_BYTES, max_jobs=MAX_JOBS)


@pytest.mark.parametrize(
    "kind",
    [
        "the same empty chunk",
        "empty after output",
        "one byte each",
        "empty, each after a gap",
        "empty, each with dropped bytes",
    ],
)
def test_many_chunks_with_little_in_them_stay_within_the_budget(kind: str) -> None:
    logs = store()
    logs.append(chunk("hello\n", offset=0))
    for n in range(CHUNKS):
        if kind == "the same empty chunk":
            logs.append(chunk("", offset=0))
        elif kind == "empty after output":
            logs.append(chunk("", offset=6))
        elif kind == "one byte each":
            logs.append(chunk("x", offset=6 + n))
        elif kind == "empty, each after a gap":
            logs.append(chunk("", offset=7 + n))
        else:
            logs.append(chunk("", offset=6, dropped=1))
    assert kept_pieces(logs, "job-1") <= PIECES_PER_JOB
    assert logs.size_bytes <= BYTES_PER_JOB


def test_empty_chunks_that_say_nothing_new_are_not_kept() -> None:
    logs = store()
    logs.append(chunk("", offset=0))
    assert kept_pieces(logs, "job-1") == 0
    logs.append(chunk("step 1\n", offset=0))
    logs.append(chunk("", offset=7))
    logs.append(chunk("", offset=3))
    assert kept_pieces(logs, "job-1") == 1
    # An empty chunk after a gap still says so.
    logs.append(chunk("", offset=20))
    logs.append(chunk("", offset=20, dropped=5))
    text, _ = render_tail(logs.snapshot("job-1"), prefix=False, tail_lines=None)
    assert text == (
        "step 1\n"
        "[greenfed: 13 bytes of output missing here]\n"
        "[greenfed: 5 bytes of output missing here]\n"
    )


def test_tiny_pieces_of_many_jobs_stay_within_the_total() -> None:
    logs = store()
    jobs = [f"job-{index}" for index in range(MAX_JOBS)]
    for n in range(CHUNKS // len(jobs)):
        for job_id in jobs:
            logs.append(chunk("", offset=n + 1, job_id=job_id))
    total_pieces = max(PIECES_PER_JOB, TOTAL_BYTES // PIECE_OVERHEAD_BYTES)
    assert kept_pieces(logs, *jobs) <= total_pieces
    assert logs.size_bytes <= TOTAL_BYTES
