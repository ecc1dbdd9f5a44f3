"""`greenfed job ID` on a capped worker: what the node holds, not only what was asked
(an agent without the right to set GPU power limits runs its worker at the default)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from cloud.work.views import JobView
from greenfed.work_commands import render_work

JOB_ID = "01JJOB0000000000000000000X"


def _job(**member: Any) -> JobView:
    now = datetime.now(tz=UTC)
    allocation = {
        "member": 0,
        "node_id": "h100-la-0",
        "accelerator_kind": "gpu",
        "accelerators": 8,
        "accelerator_ids": [],
        "host_memory_bytes": 0,
        "state": "running",
        "started_at": (now - timedelta(minutes=3)).isoformat(),
        "expected_end": None,
        "borrowed": False,
        "power_limit_w": 420.0,
        **member,
    }
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
        "workers": 1,
        "accelerators_per_worker": 8,
        "accelerator_kind": "gpu",
        "idempotency_key": None,
        "nodes": ["h100-la-0"],
        "allocations": [allocation],
        "spec": {"name": "train", "command": ["python", "train.py"]},
    }
    return msgspec.convert(payload, JobView)


def _shown(view: JobView) -> str:
    out = io.StringIO()
    render_work(view, None, out)
    return " ".join(out.getvalue().split())


@pytest.mark.parametrize(
    ("member", "words"),
    [
        ({"power_limit_reported": True, "power_limit_held_w": 420.0}, "held to 420 W"),
        # Clamped by the device: what it holds is what counts.
        ({"power_limit_reported": True, "power_limit_held_w": 450.0}, "held to 450 W"),
        (
            {
                "power_limit_reported": True,
                "power_limit_note": "power limit not applied: no permission",
            },
            "asked 420 W (power limit not applied: no permission)",
        ),
        ({}, "not yet confirmed by the node"),
    ],
)
def test_a_worker_shows_the_limit_its_node_holds(member: dict[str, Any], words: str) -> None:
    assert words in _shown(_job(**member))


def test_an_unreported_or_refused_limit_is_never_shown_as_held() -> None:
    refused = _job(power_limit_reported=True, power_limit_note="power limit not applied: x")
    assert "held to" not in _shown(refused)
