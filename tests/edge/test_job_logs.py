"""Job-log chunks (edge/agent/job_logs.py): each one fits in `mqtt.max_payload_bytes`
once encoded, whatever the worker printed, so the cloud takes every one and the output
arrives whole."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import cast

import pytest

import edge.agent.job_logs
from edge.agent.context import AgentContext, AgentCounters, NodeIdentity
from edge.agent.job_logs import JobLogShipper
from edge.agent.outbox import Outbox
from edge.agent.spool import MemorySpool
from edge.training.output import BUFFER_MAX_BYTES, OutputBuffer
from edge.training.reconcile import TrainingReconciler
from shared.lean_logs import get_logger
from shared.messages import LOG_DECODER, JobLogChunk
from shared.topics import Topics
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(30)


class Status:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.attempt = 0


class Run:
    def __init__(self, job_id: str) -> None:
        self.status = Status(job_id)
        self.output = OutputBuffer()


class Reconciler:
    def __init__(self, run: Run) -> None:
        self.run = run

    def runs_with_output(self) -> list[Run]:
        return [self.run] if self.run.output.pending_bytes else []


def shipped(output: bytes, max_payload_bytes: int, job_id: str = "job-1") -> list[bytes]:
    """The payloads the agent spools for a worker that printed `output`, then ended."""
    assert len(output) <= BUFFER_MAX_BYTES, "the output buffer would drop some of it"

    async def ship() -> list[bytes]:
        context = AgentContext(
            identity=NodeIdentity(node_id="logs-1", site="edge", zone="z", region="r"),
            instance_id="i1",
            topics=Topics("greenfed"),
            counters=AgentCounters(),
            wall_clock=time.time,
            log=get_logger("test"),
        )
        spool = MemorySpool(max_bytes=64 << 20, max_age_s=3600.0, clock=time.time)
        run = Run(job_id)
        waiting = asyncio.Event()
        shipper = JobLogShipper(
            context,
            cast(TrainingReconciler, Reconciler(run)),
            waiting,
            Outbox(context, spool),
            max_payload_bytes=max_payload_bytes,
        )
        run.output.append(output)
        run.output.end()
        waiting.set()
        task = asyncio.create_task(shipper._ship_forever())
        try:
            await eventually(lambda: run.output.pending_bytes == 0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        payloads = []
        while (record := spool.peek()) is not None:
            spool.take(record)
            payloads.append(record.payload)
        return payloads

    return asyncio.run(ship())


def control_bytes(size: int) -> bytes:
    """Binary written to stdout, NUL padding: 6 bytes each once escaped in JSON."""
    rng = random.Random(1)
    return bytes(rng.choice(b"\x00\x01\x1b") for _ in range(size))


@pytest.mark.parametrize(
    ("output", "max_payload_bytes"),
    [
        (control_bytes(128 * 1024) + b"epoch 1 loss 0.25\n", 256 * 1024),
        (b"".join(f"step {n} loss 0.{n}\n".encode() for n in range(10_000)), 64 * 1024),
        ("é\xff\n".encode("latin-1") * 20_000, 1024),
    ],
    ids=["control bytes", "text, small limit", "not UTF-8, smallest limit"],
)
def test_every_chunk_fits_in_a_payload_and_the_output_arrives_whole(
    monkeypatch: pytest.MonkeyPatch, output: bytes, max_payload_bytes: int
) -> None:
    monkeypatch.setattr(edge.agent.job_logs, "LOG_SHIP_INTERVAL_S", 0.0)
    payloads = shipped(output, max_payload_bytes)
    assert max(len(payload) for payload in payloads) <= max_payload_bytes
    chunks: list[JobLogChunk] = [LOG_DECODER.decode(payload) for payload in payloads]
    assert [chunk.dropped_bytes for chunk in chunks] == [0] * len(chunks)
    offsets = [chunk.offset for chunk in chunks]
    assert offsets[0] == 0
    assert offsets == sorted(set(offsets))
    assert "".join(chunk.text for chunk in chunks) == output.decode("utf-8", errors="replace")


def test_output_no_chunk_can_carry_is_let_go_not_tried_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job id as long as the payload limit leaves no room for any output."""
    monkeypatch.setattr(edge.agent.job_logs, "LOG_SHIP_INTERVAL_S", 0.0)
    assert shipped(b"epoch 1 loss 0.25\n" * 100, 1024, job_id="j" * 1024) == []
