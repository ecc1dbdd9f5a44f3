"""A dry run sees what a pass sees of fair share (cloud/loop/dry_run.py): the
configured cohort tree, whose quotas the pass enforces, and each tenant's decayed past
usage; and it advances no accumulator."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cloud.loop.dry_run import dry_run_fair_share
from cloud.loop.fair_share import FairShareLedger
from cloud.loop.inputs import PassInputs, build_inputs
from cloud.store import StoreSnapshot
from cloud.store.fair_share import FairShareRow
from shared.settings import CohortSettings
from tests.api.support import bearer
from tests.loop.builders import allocation, node, work
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, fleet, reaches
from tests.support.control_plane import work as work_view
from tests.support.waiting import eventually_async

HALF_LIFE_S = 3600.0
LAB = {"lab": CohortSettings(quotas={"gpu": 2})}


class RowsWritten:
    """What the leader last wrote (`fair_share_usage`)."""

    def __init__(self, rows: dict[str, FairShareRow]) -> None:
        self.rows = rows

    async def fair_share_usage(self) -> dict[str, FairShareRow]:
        return dict(self.rows)

    async def put_fair_share_usage(self, rows: list[FairShareRow]) -> None:
        self.rows = {row.tenant: row for row in rows}


def inputs(holding: bool) -> PassInputs:
    """A pass's inputs; `holding`: tenant t1 holds one GPU."""
    job = work("job", state="running")
    held = (allocation("job", 0, "a"),) if holding else ()
    store = StoreSnapshot(tenants=(), work=(job,), allocations=held, node_generations={})
    return build_inputs(0.0, [node("a")], store)


async def test_a_dry_run_off_the_leader_sees_the_cohorts_and_the_usage_last_written() -> None:
    written = RowsWritten({"t1": FairShareRow("t1", {"gpu": 7200.0}, as_of=1000.0)})
    settings = msgspec.structs.replace(FAST_LOOP, fair_share_half_life_s=HALF_LIFE_S, cohorts=LAB)
    ledger = await dry_run_fair_share(written, settings, None)
    snapshot = ledger.preview(inputs(holding=False), 1000.0 + HALF_LIFE_S).snapshot
    assert set(snapshot.cohorts) == {"lab"}
    assert snapshot.cohorts["lab"].nominal == {"gpu": 2}
    past = snapshot.past_usage["t1"]
    # Decayed as a new leader's first pass decays it: one half-life later, half.
    fresh = FairShareLedger(HALF_LIFE_S, LAB)
    await fresh.load(written)
    assert fresh.applied(inputs(holding=False), 1000.0 + HALF_LIFE_S).snapshot.past_usage == {
        "t1": past
    }


def test_a_preview_advances_no_accumulator() -> None:
    # t1 has held a GPU since the last pass (at 0 s) in what a dry run sees, and held
    # none in what the next pass sees: a dry run that counted it would leave t1 usage.
    ledger = FairShareLedger(HALF_LIFE_S, {})
    assert ledger.applied(inputs(holding=True), 0.0).snapshot.past_usage == {}
    previewed = ledger.preview(inputs(holding=True), 600.0).snapshot.past_usage
    assert set(previewed) == {"t1"}  # what a pass over those inputs would see
    assert ledger.applied(inputs(holding=False), 600.0).snapshot.past_usage == {}


JOB = {
    "name": "big",
    "command": ["python", "train.py"],
    "accelerators_per_worker": 4,
    "estimated_duration_s": 3600.0,
}


@pytest.mark.timeout(120)
async def test_a_dry_run_refuses_what_a_cohorts_quota_holds_back(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    # vision may hold 4 GPUs by its own quota, but its cohort lends it 2 at most.
    scheduling = msgspec.structs.replace(FAST_LOOP, cohorts=LAB)
    async with fleet(database, mosquitto_root, cloud_nodes=1, scheduling=scheduling) as running:
        api = running.api
        vision = await api.tenant("vision", quotas={"gpu": 4}, cohort="lab")
        dry = await api.client.post("/v1/jobs/dry-run", json=JOB, headers=bearer(vision))
        assert dry.status == 200, await dry.text()
        said = (await dry.json())["message"]
        assert "may hold at most 2 GPU" in said, said
        # The real pass says the same.
        job_id = await api.submitted(vision, JOB)
        await reaches(api, vision, job_id, "pending")
        seen: dict[str, Any] = {}

        async def explained() -> bool:
            seen.update(await work_view(api, vision, job_id))
            return bool(seen.get("reason"))

        await eventually_async(explained, timeout_s=30, message=lambda: str(seen))
        assert seen["state"] == "pending"
        assert seen["reason"] == said
