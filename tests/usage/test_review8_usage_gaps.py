"""Time an allocation ran without telemetry is billed by the model and flagged as a gap:
a node that never reports, or falls silent before its work ends, does not make that work
free (docs/usage.md#energy). And the CLI's usage figures: a line with nothing priced yet,
and `greenfed usage --since 30m`, which shows the hour under way."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import msgspec
import pytest

from cloud.fleet.registry import NodeRegistry
from cloud.store import UsageQuery
from cloud.usage.accountant import Accountant
from cloud.usage.views import UsageReport, WorkUsage, usage_summary
from greenfed.api_client import Reply
from greenfed.output import Output
from greenfed.usage_commands import UsageRequest, parse_when, usage, usage_line
from tests.store.databases import DatabaseUnderTest
from tests.usage.test_accountant import (
    GPU,
    INTERVAL_S,
    T0,
    Clock,
    birth,
    expected_kwh,
    feed,
    grid,
    reading,
    start,
)
from tests.usage.test_usage_review5_final_events import GONE, final_figures, running

pytestmark = pytest.mark.timeout(60)

FINAL_DELAY_S = 30.0  # UsageSettings' default
HOST_OVERHEAD = 1.1  # the node reports no CPU: 10 % of its devices' energy
TRAINING_UTILISATION = 0.8  # the energy model's, for training it has no sample of


async def end_job(accountant: Accountant, lease: object, clock: Clock, ended_at_s: float) -> None:
    """The job ends at `ended_at_s`; flushes until its final figures are due and told."""
    clock.now = ended_at_s
    accountant.note_pass(GONE, grid(clock.now))
    await accountant.flush(lease)  # type: ignore[arg-type]
    clock.now = ended_at_s + FINAL_DELAY_S
    accountant.note_pass(GONE, grid(clock.now))
    await accountant.flush(lease)  # type: ignore[arg-type]


async def test_a_node_that_never_reports_bills_its_job_by_the_model_as_a_gap(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    accountant, store, lease = await start(database, clock)
    try:
        accountant.note_pass(running(), grid(clock.now))
        await end_job(accountant, lease, clock, T0 + 3600.0)  # an hour, not one sample

        (told,) = await final_figures(store)  # type: ignore[arg-type]
        figures = told["usage"]
        idle_w, max_w = GPU.idle_power_w or 0.0, GPU.max_power_w or 0.0
        modelled_w = (idle_w + (max_w - idle_w) * TRAINING_UTILISATION) * HOST_OVERHEAD
        assert figures["energy_kwh"] == pytest.approx(modelled_w * 3600.0 / 3.6e6)  # type: ignore[index]
        assert figures["gco2eq_g"] > 0  # type: ignore[index]
        assert figures["gap_filled_s"] == pytest.approx(3600.0)  # type: ignore[index]
        assert figures["measured_share"] == pytest.approx(0.0)  # type: ignore[index]
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_node_silent_for_its_jobs_last_half_hour_has_it_modelled_once(
    database: DatabaseUnderTest,
) -> None:
    clock = Clock()
    registry = NodeRegistry(wall_clock=clock)
    registry.apply_status(birth(clock.now))  # `start` takes it only when it holds a node
    accountant, store, lease = await start(database, clock, registry)
    try:
        accountant.note_pass(running(), grid(clock.now))
        half_hour = [T0 + INTERVAL_S * i for i in range(181)]  # 0..30 min, then silence
        feed(accountant, half_hour, clock)
        registry.apply_telemetry(reading(half_hour[-1]))  # its last word: 300 W, 71.4 %
        await end_job(accountant, lease, clock, T0 + 3600.0)

        (told,) = await final_figures(store)  # type: ignore[arg-type]
        figures = told["usage"]
        # The model at the last sample's utilisation draws what the samples said: 300 W.
        assert figures["energy_kwh"] == pytest.approx(expected_kwh(T0, T0 + 3600.0), rel=1e-3)  # type: ignore[index]
        assert figures["gap_filled_s"] == pytest.approx(1800.0)  # type: ignore[index]
        assert figures["measured_share"] == pytest.approx(0.5, rel=1e-3)  # type: ignore[index]

        # The node's samples of the silent half hour come late: already counted.
        feed(accountant, [T0 + 1810.0, T0 + 3000.0, T0 + 3600.0], clock)
        clock.now = T0 + 3700.0
        await accountant.flush(lease)  # type: ignore[arg-type]
        stored = usage_summary(await store.usage(UsageQuery(work_ids=["job-1"])))  # type: ignore[attr-defined]
        assert stored.energy_kwh == pytest.approx(figures["energy_kwh"])  # type: ignore[index]
        assert stored.gap_filled_s == pytest.approx(1800.0)
    finally:
        await store.close()  # type: ignore[attr-defined]


def test_a_usage_line_with_nothing_priced_says_so() -> None:
    nothing = WorkUsage(
        energy_kwh=0.0, gco2eq_g=0.0, cost=None, currency=None, costs={},
        avoided_gco2eq_g=None, measured_share=None, gap_filled_s=0.0, fallback=False,
        members=(),
    )  # fmt: skip
    line = usage_line(nothing)
    assert "·  ·" not in line
    assert line.startswith("usage: 0.000 kWh · 0.0 gCO2eq · – · avoided")


class _UsageApi:
    """`GET /v1/usage` answering an empty report, and what it was asked."""

    def __init__(self) -> None:
        self.params: dict[str, str] = {}

    async def ask(
        self, method: str, path: str, reply_type: type, *, params: dict[str, str]
    ) -> Reply[UsageReport]:
        assert (method, path) == ("GET", "/v1/usage")
        self.params = dict(params)
        report = UsageReport(group_by=("tenant",), rows=(), totals=())
        return Reply(200, msgspec.json.encode(report), report)


async def test_usage_since_30m_asks_from_the_start_of_the_hour_under_way() -> None:
    # Usage is kept per hour and the API keeps the hours starting at or after `from`:
    # 08:15 would leave out the 08:00 hour, where everything of the last 30 min is.
    now = datetime(2026, 12, 8, 8, 45, tzinfo=UTC)
    api = _UsageApi()
    out = io.StringIO()
    request = UsageRequest(since=parse_when("30m", now=now), until=None, by="tenant", tenant=None)
    await usage(api, request, Output("table", out))  # type: ignore[arg-type]
    assert datetime.fromisoformat(api.params["from"]) == datetime(2026, 12, 8, 8, tzinfo=UTC)
    assert "usage since 2026-12-08 08:00 UTC (rounded down to the hour)" in out.getvalue()
