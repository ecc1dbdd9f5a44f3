"""Times a calendar cannot hold (shared/clock.py): a node may say it is very slow, and a
run there is then expected to end millennia from now; the next pass, which explains a
reservation behind it, must still decide."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from cloud.scheduler import Snapshot, schedule
from shared.clock import utc_from_epoch
from tests.scheduler.builders import NOW, gpu_node, job


def test_a_run_expected_to_end_after_year_9999_does_not_stop_the_next_pass() -> None:
    nodes = [gpu_node("slow", 1, speed=1e-9)]
    first = schedule(Snapshot.build(now=NOW, nodes=nodes, queue=[job("a", 1)]))
    allocations = [placement.to_allocation() for placement in first.placements]
    assert allocations[0].expected_end is not None
    assert allocations[0].expected_end > datetime.max.replace(tzinfo=UTC).timestamp()
    second = schedule(
        Snapshot.build(now=NOW + 60, nodes=nodes, allocations=allocations, queue=[job("b", 1)])
    )
    assert [pending.work_id for pending in second.pending] == ["b"]


def test_a_time_past_the_calendar_is_its_last_moment_and_nan_is_refused() -> None:
    assert utc_from_epoch(1e15) == datetime.max.replace(tzinfo=UTC)
    assert utc_from_epoch(-1e15) == datetime.min.replace(tzinfo=UTC)
    assert utc_from_epoch(0.0) == datetime(1970, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="not a number"):
        utc_from_epoch(math.nan)
