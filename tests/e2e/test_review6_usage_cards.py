"""The dashboard's usage card ("Emissions avoided", with emissions, energy and cost) is the
API's own totals, `GET /v1/usage`, in a real browser (the system's Chromium) over the
real API and store (review round 6).

The table loads only the newest 50 finished jobs and deployments; work that used energy
behind more than 50 newer finished items is still in the card, as `greenfed usage` and
any other reader of `/v1/usage` count it. A card that cannot be read says so: it never
shows 0, nor an old figure as if it were current.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from playwright.async_api import Browser, Page, Route, expect

from cloud.store import UsageHour
from cloud.store.usage import UsageWrite
from shared import secret_hashes
from tests.api.support import Api, job_spec, running_api
from tests.e2e.test_ui import BROWSER_TIMEOUT_MS, _refresh_now, _watch, browser_session
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import cancel
from tests.support.system_tools import require_tool

# More finished work than the table loads (WORK_ROWS in app.js, 50 per collection).
NEWER_FINISHED_JOBS = 55


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """scrypt at 2**10 instead of 2**14, as the API tests do (parameters travel with
    each hash): the test makes over a hundred requests."""
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@dataclass(frozen=True)
class Used:
    """One hour of one job's usage, in round figures a card shows exactly."""

    energy_kwh: float
    gco2_g: float
    counterfactual_gco2_g: float
    cost: float
    currency: str


async def _record_usage(api: Api, token: str, job_id: str, used: Used) -> None:
    """What an accounting flush writes for `job_id` (under the scheduling lease)."""
    now = time.time()
    row = UsageHour(
        work_id=job_id, member_index=0, node_id="cloud-0", hour_start=now - now % 3600,
        tenant_id=await api.tenant_id(token), work_kind="training", zone="DE",
        accelerator_kind="gpu", energy_j=used.energy_kwh * 3.6e6,
        measured_j=used.energy_kwh * 3.6e6, gap_s=0.0, gco2_g=used.gco2_g, cost=used.cost,
        currency=used.currency, counterfactual_gco2_g=used.counterfactual_gco2_g,
        fallback=False,
    )  # fmt: skip
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await api.store.write_usage(UsageWrite(rows=[row]), lease=lease)


async def _finished_job_that_used(api: Api, token: str, used: Used) -> str:
    job_id = await api.submitted(token, job_spec(name="used-energy"))
    await _record_usage(api, token, job_id, used)
    await cancel(api, token, job_id)
    return job_id


async def _totals(api: Api, token: str) -> list[dict[str, object]]:
    response = await api.get(token, "/v1/usage")
    assert response.status == 200, await response.text()
    totals = (await response.json())["totals"]
    assert isinstance(totals, list)
    return totals


@asynccontextmanager
async def dashboard(
    browser: Browser, api: Api, token: str, *, expected_error: str | None = None
) -> AsyncIterator[Page]:
    """The dashboard signed in with `token`; no script or console error on the way but
    those that contain `expected_error` (the browser logs each failed request)."""
    context = await browser.new_context(locale="en-US")
    page = await context.new_page()
    page.set_default_timeout(BROWSER_TIMEOUT_MS)
    problems: list[str] = []
    _watch(page, problems, [])
    await page.goto(str(api.client.make_url(f"/ui#token={token}")))
    await expect(page.locator("#dashboard")).to_be_visible(timeout=BROWSER_TIMEOUT_MS)
    yield page
    await context.close()
    assert [p for p in problems if expected_error is None or expected_error not in p] == []


@pytest.mark.e2e
@pytest.mark.timeout(120)
async def test_the_usage_card_is_the_apis_totals_behind_many_newer_finished_jobs(
    database: DatabaseUnderTest,
) -> None:
    chromium = require_tool("chromium", "chromium")
    async with running_api(database) as api:
        acme = await api.tenant("acme")
        globex = await api.tenant("globex")
        # Energy in two currencies; then more finished work, never placed, than the table
        # loads: the jobs that used energy are not among its rows.
        await _finished_job_that_used(api, acme, Used(2.0, 840.0, 1440.0, 0.19, "EUR"))
        await _finished_job_that_used(api, acme, Used(1.0, 300.0, 1200.0, 0.25, "USD"))
        await _finished_job_that_used(api, globex, Used(1.0, 100.0, 600.0, 0.10, "EUR"))
        for _ in range(NEWER_FINISHED_JOBS):
            await cancel(api, acme, await api.submitted(acme, job_spec(name="never-placed")))

        # The API's totals, one per currency: acme's own, and every tenant's for the admin.
        acme_totals = await _totals(api, acme)
        assert [(t["currency"], t["energy_kwh"], t["avoided_gco2eq_g"]) for t in acme_totals] == [
            ("EUR", 2.0, 600.0),
            ("USD", 1.0, 900.0),
        ]
        admin_totals = await _totals(api, api.admin_token)
        assert [(t["currency"], t["cost"]) for t in admin_totals] == [
            ("EUR", pytest.approx(0.29)),
            ("USD", 0.25),
        ]

        async with browser_session(chromium) as browser:
            async with dashboard(browser, api, acme) as page:
                # The table: the newest 50, saying older finished work is left out.
                await expect(page.locator("#work tbody tr[data-work-id]")).to_have_count(
                    50, timeout=BROWSER_TIMEOUT_MS
                )
                await expect(page.locator("#work .notice")).to_contain_text(
                    "older finished ones are left out"
                )
                await expect(page.locator("#work")).not_to_contain_text("used-energy")
                # The card: the API's totals, summed over currencies where they add up
                # (grams, kWh) and each currency on its own.
                await expect(page.locator("#card-avoided")).to_have_text("1.5 kg")
                await expect(page.locator("#card-avoided-detail")).to_have_text(
                    "CO₂eq · emitted 1.1 kg · 3 kWh · €0.19 + $0.25"
                )
            async with dashboard(browser, api, api.admin_token) as page:
                await expect(page.locator("#card-avoided")).to_have_text("2 kg")
                await expect(page.locator("#card-avoided-detail")).to_have_text(
                    "CO₂eq · emitted 1.2 kg · 4 kWh · €0.29 + $0.25"
                )


@pytest.mark.e2e
@pytest.mark.timeout(120)
async def test_a_usage_card_that_cannot_be_read_says_so_instead_of_a_figure(
    database: DatabaseUnderTest,
) -> None:
    chromium = require_tool("chromium", "chromium")
    async with running_api(database) as api:
        acme = await api.tenant("acme")
        await _finished_job_that_used(api, acme, Used(2.0, 840.0, 1440.0, 0.19, "EUR"))
        async with (
            browser_session(chromium) as browser,
            dashboard(browser, api, acme, expected_error="status of 503") as page,
        ):
            card = page.locator("#card-avoided")
            detail = page.locator("#card-avoided-detail")
            await expect(card).to_have_text("600 g", timeout=BROWSER_TIMEOUT_MS)

            async def unavailable(route: Route) -> None:
                await route.fulfill(
                    status=503,
                    content_type="application/problem+json",
                    json={"title": "Service Unavailable", "detail": "store unavailable"},
                )

            # Only the usage read fails: the rest of the page goes on as before.
            await page.route("**/v1/usage*", unavailable)
            await _refresh_now(page)
            await expect(detail).to_have_text("unavailable: store unavailable")
            await expect(card).to_have_text("–")
            await expect(page.locator("#work tbody tr[data-work-id]")).to_have_count(1)
            await expect(page.locator("#status")).to_contain_text("Updated")

            await page.unroute("**/v1/usage*")
            await _refresh_now(page)
            await expect(card).to_have_text("600 g")
            await expect(detail).to_have_text("CO₂eq · emitted 840 g · 2 kWh · €0.19")
