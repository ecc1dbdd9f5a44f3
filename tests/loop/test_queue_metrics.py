"""The queue on `/metrics`: pending work by priority, kind and reason from the leader's
latest pass, and the wait histograms, each transition observed once."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud.app_keys import SCHEDULER
from cloud.loop.queue_metrics import QueueMetrics
from cloud.scheduler import PendingCode, Policy, Snapshot, schedule
from tests.loop.builders import work
from tests.scheduler.builders import gpu_node
from tests.scheduler.builders import job as queued_job
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    seen: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return seen[(name, frozenset(labels.items()))]


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": ["python", "train.py"], **fields}


async def test_pending_work_and_the_waits_of_work_that_ran_are_exported_once(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        # Eight GPUs on one worker: no node of the fleet (4 GPUs) can ever take it.
        too_big = job("too-big", priority="p1", accelerators_per_worker=8, allow_unschedulable=True)
        await api.submitted(token, too_big)
        quick = await api.submitted(
            token, job("quick", priority="p0", accelerators_per_worker=4, estimated_duration_s=0.5)
        )
        await reaches(api, token, quick, "succeeded")

        seen: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

        async def settled() -> bool:
            seen.clear()
            seen.update(samples(await (await api.client.get("/metrics")).text()))
            key = (
                "greenfed_work_pending",
                frozenset(
                    {"priority": "p1", "kind": "training", "reason": "unschedulable"}.items()
                ),
            )
            return seen.get(key) == 1

        await eventually_async(settled, message=lambda: str(sorted(seen.items())))
        pending = {
            labels: count
            for (name, labels), count in seen.items()
            if name == "greenfed_work_pending" and count
        }
        assert len(pending) == 1  # the job that ran is not pending under any reason
        for name in ("greenfed_queue_wait_seconds", "greenfed_submission_to_running_seconds"):
            assert value(seen, f"{name}_count", priority="p0") == 1
            assert value(seen, f"{name}_count", priority="p1") == 0
            assert value(seen, f"{name}_bucket", priority="p0", le="+Inf") == 1
            assert 0 <= value(seen, f"{name}_sum", priority="p0") < 20

        # Passes go on (the too-big job is looked at again); nothing is observed twice.
        loop = api.app[SCHEDULER]
        for _ in range(2):
            loop.wake()
            async with asyncio.timeout(10):
                await loop.wait_for_pass()
        again = samples(await (await api.client.get("/metrics")).text())
        assert value(again, "greenfed_queue_wait_seconds_count", priority="p0") == 1
        assert value(again, "greenfed_submission_to_running_seconds_count", priority="p0") == 1


def test_a_requeued_job_waits_from_its_requeue_and_only_its_first_run_counts_to_running() -> None:
    metrics = QueueMetrics()
    queued = dataclasses.replace(
        work("j", state="pending", attempts=1), submitted_at=100.0, updated_at=1000.0
    )
    placed = dataclasses.replace(queued, state="scheduled", attempts=2, updated_at=1030.0)
    metrics.note_commit({"j": queued}, [placed])
    assert metrics.queue_wait["p1"].sum_s == 30.0  # since the requeue, not the submission
    assert metrics.queue_wait["p1"].cumulative()[3] == ("60.0", 1)

    ran_again = dataclasses.replace(placed, state="running", updated_at=1040.0)
    metrics.note_commit({"j": placed}, [ran_again])
    assert metrics.submission_to_running["p1"].cumulative()[-1] == ("+Inf", 0)

    first = dataclasses.replace(work("k", attempts=1), submitted_at=0.0)
    finished = dataclasses.replace(first, state="succeeded", updated_at=7.0)  # ran in between
    metrics.note_commit({"k": first}, [finished])
    assert metrics.submission_to_running["p1"].cumulative()[1] == ("5.0", 0)
    assert metrics.submission_to_running["p1"].cumulative()[2] == ("15.0", 1)

    metrics.forget_pending()
    assert metrics.pending is None


def test_work_a_bounded_pass_did_not_decide_keeps_its_last_reason_on_metrics() -> None:
    """Quick passes decide only the head of the queue: the rest stays counted under the
    reason the last full pass gave it, and work queued since waits for capacity."""
    full_node = [gpu_node("n1", 8)]
    big = queued_job("big", gpus=16)  # no node could ever hold it
    small = [queued_job(f"s{index}", gpus=8, submitted_at=float(index)) for index in range(3)]
    records = {w.work_id: work(w.work_id, state="pending") for w in (big, *small)}
    records["late"] = work("late", state="pending")
    metrics = QueueMetrics()

    def pending(code: PendingCode) -> int:
        assert metrics.pending is not None
        return metrics.pending[("p1", "training", code)]

    whole = schedule(Snapshot.build(now=0.0, nodes=full_node, queue=[big, *small]), Policy())
    metrics.note_pass(whole, records)
    assert (pending("unschedulable"), pending("capacity")) == (1, 2)
    head = schedule(
        Snapshot.build(now=0.0, nodes=full_node, queue=[big, *small, queued_job("late", gpus=1)]),
        Policy(),
        max_decisions=1,
    )
    assert head.order == ("big",)  # the head, decided again
    metrics.note_pass(head, records)
    # s1 and s2 as before, late queued since, and s0 (placed by the full pass; queued
    # again here, as after an eviction) wait behind the head for capacity.
    assert (pending("unschedulable"), pending("capacity")) == (1, 4)
