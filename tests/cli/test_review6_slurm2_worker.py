"""`greenfed job ID` shows what each worker's node last said of it (review round 6): its
state, and its reason whole on a line of its own: a cluster's node says why the job
waits in the cluster's own queue."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from cloud.work.views import JobView
from greenfed.work_commands import render_work

JOB_ID = "01JJOB0000000000000000000X"
WAITING = "waiting in cluster lab's queue (3 jobs pending there): Resources"


def _job(*members: dict[str, Any]) -> JobView:
    now = datetime.now(tz=UTC)
    allocations = [
        {
            "member": index,
            "node_id": f"lab.gfnode{index + 1}",
            "accelerator_kind": "gpu",
            "accelerators": 4,
            "accelerator_ids": [],
            "host_memory_bytes": 0,
            "state": "running",
            "started_at": (now - timedelta(minutes=3)).isoformat(),
            "expected_end": None,
            "borrowed": False,
            **member,
        }
        for index, member in enumerate(members)
    ]
    payload = {
        "id": JOB_ID,
        "name": "train",
        "tenant": "acme",
        "priority": "p1",
        "state": "running",
        "reason": None,
        "attempts": 1,
        "version": 3,
        "submitted_at": (now - timedelta(minutes=5)).isoformat(),
        "updated_at": now.isoformat(),
        "workers": len(members),
        "accelerators_per_worker": 4,
        "accelerator_kind": "gpu",
        "idempotency_key": None,
        "nodes": [allocation["node_id"] for allocation in allocations],
        "allocations": allocations,
        "spec": {"name": "train", "command": ["python", "train.py"]},
    }
    return msgspec.convert(payload, JobView)


def _shown(view: JobView) -> list[str]:
    out = io.StringIO()
    render_work(view, None, out)
    return [" ".join(line.split()) for line in out.getvalue().splitlines()]


def _cells(lines: list[str], node_id: str) -> list[str]:
    row = next(line for line in lines if f"│ {node_id} │" in line)
    return [cell.strip() for cell in row.strip("│ ").split("│")]


def test_a_worker_waiting_in_a_clusters_queue_says_so() -> None:
    lines = _shown(
        _job(
            {"worker_state": "starting", "worker_reason": WAITING},
            {"worker_state": "running"},
        )
    )
    header = next(line for line in lines if "member" in line)
    assert "worker" in header
    assert _cells(lines, "lab.gfnode1")[3:5] == ["running", "starting"]  # allocation, worker
    assert _cells(lines, "lab.gfnode2")[3:5] == ["running", "running"]
    # The reason whole, at any width, on a line of its own.
    assert f"worker 0 (lab.gfnode1): {WAITING}" in lines
    assert not any(line.startswith("worker 1") for line in lines)


def test_what_a_node_writes_cannot_drive_the_terminal() -> None:
    lines = _shown(_job({"worker_state": "starting", "worker_reason": "[bold]x\x1b[2Jy"}))
    reason = next(line for line in lines if line.startswith("worker 0"))
    assert "\x1b" not in reason
    assert "[bold]x" in reason  # not read as markup


def test_no_worker_column_where_no_node_reported_one() -> None:
    header = next(line for line in _shown(_job({})) if "member" in line)
    assert "worker" not in header
