"""The dashboard at `/ui`: served safely by the control plane, and what a person sees in a
real browser (the system's Chromium, driven by Playwright) next to `greenfed up`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler
from playwright.async_api import Browser, Page, Request, Route, async_playwright, expect

from cloud.api.auth import auth_middleware
from cloud.api.problems import problem_middleware
from cloud.api.routes import ROUTE_ACCESS, add_routes
from cloud.app import create_app
from cloud.ui import routes as ui
from shared.settings import Settings
from tests.support.brokers import free_port
from tests.support.processes import GreenfedProcess, get_json, greenfed_env
from tests.support.system_tools import require_tool
from tests.support.waiting import eventually_async

Client = TestClient[web.Request, web.Application]
EXPECTED_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
BROWSER_TIMEOUT_MS = 15_000


# ---- the page as the control plane serves it (no browser) ------------------------------


@asynccontextmanager
async def ui_only_app() -> AsyncIterator[Client]:
    """The dashboard's routes behind the API's own problem and auth middlewares (a public
    route never reaches the store, so none is needed)."""
    app = web.Application(middlewares=[problem_middleware, auth_middleware])
    add_routes(app, ui.ROUTES)
    async with TestClient(TestServer(app)) as client:
        yield client


def assert_secured(response: aiohttp.ClientResponse) -> None:
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'self'" in [part.strip() for part in policy.split(";")]
    for name, value in EXPECTED_HEADERS.items():
        assert response.headers[name] == value, name


async def test_ui_serves_the_page_and_its_assets_with_security_headers_and_no_token() -> None:
    async with ui_only_app() as client:
        page = await client.get("/ui")
        assert page.status == 200
        assert page.content_type == "text/html"
        assert_secured(page)
        html = await page.text()
        # No inline script or style: everything the page loads is a file from /ui/static/.
        assert "<script>" not in html
        assert "style=" not in html
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert set(assets) == {
            "/ui/static/app.js",
            "/ui/static/style.css",
            "/ui/static/icon.svg",
        }
        media_types = {}
        for asset in sorted(set(assets)):
            response = await client.get(asset)
            assert response.status == 200, asset
            assert_secured(response)
            media_types[asset.rsplit("/", 1)[1]] = response.content_type
            # Unchanged files are a 304 on revalidation (Cache-Control: no-cache).
            again = await client.get(asset, headers={"If-None-Match": response.headers["ETag"]})
            assert again.status == 304
            assert await again.read() == b""
        assert media_types == {
            "app.js": "text/javascript",
            "style.css": "text/css",
            "icon.svg": "image/svg+xml",
        }
        redirect = await client.get("/ui/", allow_redirects=False)
        assert (redirect.status, redirect.headers["Location"]) == (308, "/ui")
        # The page is public; the API it calls is not.
        assert (await client.get("/ui", headers={"Authorization": "Bearer nonsense"})).status == 200


async def _raw_get(port: int, target: str) -> tuple[int, bytes]:
    """GET `target` exactly as written (a client library would normalise `..` away)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        writer.write(request.encode("latin-1"))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    return int(status_line.split()[1]), answer


@pytest.mark.parametrize(
    "target",
    [
        "/ui/../../etc/passwd",
        "/ui/static/../../../etc/passwd",
        "/ui/static/..%2f..%2f..%2fetc%2fpasswd",
        "/ui/static/..%2f..",
        "/ui/static/..%2froutes.py",
        "/ui/static/%2e%2e/routes.py",
        "/ui/static/%2e%2e%2froutes.py",
        "/ui/static/..%5croutes.py",
        "/ui/static/index.html",  # the page is /ui, not a file of static/
        "/ui/static/app.js%00.html",
        "/ui/static/",
        "/ui/static//etc/passwd",
        "/ui/etc/passwd",
    ],
)
async def test_no_request_path_reaches_the_file_system(target: str) -> None:
    async with ui_only_app() as client:
        port = client.port
        assert port is not None
        status, answer = await _raw_get(port, target)
    assert status in (403, 404), answer[:300]
    assert b"root:" not in answer
    assert b"from __future__" not in answer


def test_the_script_never_parses_data_as_markup() -> None:
    """Everything from the API enters the page as text: no HTML parser is ever handed a
    string, and nothing is evaluated."""
    script = ui.static_file("app.js").body.decode()
    sinks = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(")
    assert [sink for sink in sinks if sink in script] == []
    assert "textContent" in script


def test_the_control_plane_registers_the_dashboard_as_public() -> None:
    app = create_app(Settings())  # not started: only its routes are read
    served = {route.resource.canonical for route in app.router.routes() if route.resource}
    assert {"/ui", "/ui/", "/ui/static/{name}"} <= served
    access = app[ROUTE_ACCESS]
    assert {access[ui.ui_page], access[ui.ui_page_slash], access[ui.ui_static]} == {"public"}


# ---- the page in a browser, next to `greenfed up` --------------------------------------


def _admin_token(data_dir: Path) -> str | None:
    path = data_dir / "admin-token"
    return path.read_text().strip() if path.exists() else None


async def _online_count(api: str, data_dir: Path) -> int:
    token = _admin_token(data_dir)
    if token is None:
        return 0
    try:
        body = await get_json(f"{api}/v1/nodes?state=online", token)
    except OSError:
        return 0
    assert isinstance(body, dict)
    return int(body["count"])


async def _post_json(url: str, token: str, body: dict[str, object]) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http, http.post(url, json=body) as answer:
        assert answer.status == 201, await answer.text()
        created = await answer.json()
    assert isinstance(created, dict)
    return created


def _screenshot_path(tmp_path: Path) -> Path:
    artifacts = os.environ.get("GREENFED_TEST_ARTIFACTS")
    folder = Path(artifacts) if artifacts else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "ui.png"


@asynccontextmanager
async def browser_session(chromium: str) -> AsyncIterator[Browser]:
    """The system's Chromium (Playwright's own browser download is never needed)."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--headless=new"]
        )
        try:
            yield browser
        finally:
            await browser.close()


def _watch(page: Page, problems: list[str], requests: list[Request]) -> None:
    """Collect what would be a bug: script errors and console errors (a Content Security
    Policy violation is one), and every request the page makes."""
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )
    page.on("request", lambda request: requests.append(request))


MARKUP = '<img src="/x" onerror="window.injected = true">'
USAGE = {
    "energy_kwh": 1.5,
    "gco2eq_g": 300.0,
    "cost": 0.42,
    "currency": "EUR",
    "avoided_gco2eq_g": 1500.0,
    "measured_share": 0.8,
    "fallback": True,
    "members": [],
}


async def _shows_usage_and_never_markup(
    browser: Browser, api: str, token: str, job_id: str, problems: list[str]
) -> None:
    """The real job view, changed on its way to the page: a `usage` block, and markup in
    fields that are text."""

    async def tampered_view(route: Route) -> None:
        response = await route.fetch()
        body = await response.json()
        body.update(usage=USAGE, reason=MARKUP)
        body["allocations"][0]["node_id"] = MARKUP
        body["nodes"] = [MARKUP]
        await route.fulfill(response=response, json=body)

    context = await browser.new_context(locale="en-US")
    page = await context.new_page()
    _watch(page, problems, [])
    await page.route(f"{api}/v1/jobs/{job_id}", tampered_view)
    await page.goto(f"{api}/ui#token={token}")
    row = page.locator(f'#work tr[data-work-id="{job_id}"]')
    cells = row.locator("td")
    await expect(cells.nth(5)).to_have_text("1.5 kWh", timeout=BROWSER_TIMEOUT_MS)
    await expect(cells.nth(5)).to_have_attribute("title", "80 % measured, rest estimated")
    await expect(cells.nth(6)).to_have_text("300 g")
    await expect(cells.nth(7)).to_have_text("€0.42")
    await expect(cells.nth(8)).to_have_text("1.5 kg")
    # The cards are GET /v1/usage's totals, not the rows' (test_review6_usage_cards.py).
    await expect(row.locator(".nodes-list")).to_have_text(MARKUP)
    await expect(row.locator(".state .badge")).to_have_attribute("title", MARKUP)
    assert await page.locator("#work img").count() == 0
    assert await page.evaluate("window.injected === undefined")
    await context.close()


@pytest.mark.e2e
@pytest.mark.timeout(120)
async def test_the_dashboard_shows_the_fleet_the_work_and_the_zones(tmp_path: Path) -> None:
    chromium = require_tool("chromium", "chromium")
    node_count = 12
    broker_port, api_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    data_dir = tmp_path / "data"
    args = [
        "up",
        "--sim",
        str(node_count),
        "--broker-port",
        str(broker_port),
        "--api-port",
        str(api_port),
        "--telemetry-interval",
        "0.5",
    ]
    env = greenfed_env(GREENFED_STORE__DATA_DIR=str(data_dir))
    async with GreenfedProcess(args, tmp_path, env) as up:

        async def all_online() -> bool:
            return await _online_count(api, data_dir) == node_count

        await eventually_async(all_online, timeout_s=30, message=lambda: up.stderr[-2000:])
        token = _admin_token(data_dir)
        assert token is not None
        job = await _post_json(
            f"{api}/v1/jobs",
            token,
            {
                "name": "ui-resnet",
                "command": ["python", "train.py"],
                "workers": 1,
                "accelerators_per_worker": 2,
                "estimated_duration_s": 3600,
            },
        )
        job_id = str(job["id"])
        placed: dict[str, object] = {}

        async def job_running() -> bool:
            body = await get_json(f"{api}/v1/jobs/{job_id}", token)
            assert isinstance(body, dict)
            placed.update(body)
            return bool(body["state"] == "running")

        await eventually_async(job_running, timeout_s=30, message=lambda: str(placed))
        tenant = await _post_json(f"{api}/v1/tenants", token, {"name": "acme"})
        nodes_body = await get_json(f"{api}/v1/nodes", token)
        signals_before = await get_json(f"{api}/v1/signals", token)
        assert isinstance(nodes_body, dict)
        assert isinstance(signals_before, dict)
        nodes = nodes_body["items"]
        zone_of = {node["node_id"]: node["zone"] for node in nodes}
        allocations = placed["allocations"]
        assert isinstance(allocations, list)
        job_node = allocations[0]["node_id"]

        problems: list[str] = []
        requests: list[Request] = []
        async with browser_session(chromium) as browser:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            _watch(page, problems, requests)
            await page.goto(f"{api}/ui#token={token}")

            # The fleet: one row per node of /v1/nodes, in its order, all online.
            rows = page.locator("#nodes tbody tr[data-node-id]")
            await expect(rows).to_have_count(len(nodes), timeout=BROWSER_TIMEOUT_MS)
            shown = await rows.evaluate_all("rows => rows.map(row => row.dataset.nodeId)")
            assert shown == [node["node_id"] for node in nodes]
            await expect(page.locator("#card-nodes")).to_have_text(f"{node_count}/{node_count}")
            first = rows.first
            await expect(first.locator("td.zone")).to_have_text(nodes[0]["zone"])

            # The job, running where the API says, with its zone.
            job_row = page.locator(f'#work tr[data-work-id="{job_id}"]')
            await expect(job_row.locator(".state")).to_have_text("running")
            await expect(job_row).to_contain_text("ui-resnet")
            await expect(job_row.locator(".nodes-list")).to_have_text(job_node)
            await expect(job_row.locator(".zones-list")).to_have_text(zone_of[job_node])

            # Every zone with its carbon intensity, and the job's accelerators in its zone.
            zone_rows = page.locator("#zones tbody tr[data-zone]")
            await expect(zone_rows).to_have_count(len(signals_before["zones"]))
            carbon = await zone_rows.evaluate_all(
                "rows => rows.map(row => [row.dataset.zone,"
                " Number(row.querySelector('[data-carbon]').dataset.carbon)])"
            )
            signals_after = await get_json(f"{api}/v1/signals", token)
            assert isinstance(signals_after, dict)
            expected = [
                {z["zone"]: z["carbon_g_per_kwh"] for z in body["zones"]}
                for body in (signals_before, signals_after)  # an hour may turn meanwhile
            ]
            assert dict(carbon) in expected
            assert [value for _, value in carbon] == sorted(value for _, value in carbon)
            job_zone = page.locator(f'#zones tr[data-zone="{zone_of[job_node]}"] [data-allocated]')
            await expect(job_zone).to_have_attribute("data-allocated", "2")

            # The token left the address bar and never travelled in a URL; the API calls
            # carried it as a header.
            assert "token" not in page.url
            stored = await page.evaluate("sessionStorage.getItem('greenfed.token')")
            assert stored == token
            assert requests
            assert all(token not in request.url for request in requests)
            api_calls = [request for request in requests if "/v1/" in request.url]
            assert {request.url.split("?")[0] for request in api_calls} >= {
                f"{api}/v1/nodes",
                f"{api}/v1/signals",
                f"{api}/v1/jobs",
                f"{api}/v1/jobs/{job_id}",
                f"{api}/v1/usage",
            }
            for request in api_calls:
                assert (await request.all_headers())["authorization"] == f"Bearer {token}"

            screenshot = _screenshot_path(tmp_path)
            await page.screenshot(path=str(screenshot), full_page=True)
            print(f"dashboard screenshot: {screenshot}")

            # The job's view with usage, and with markup where text goes: shown as text.
            await _shows_usage_and_never_markup(browser, api, token, job_id, problems)

            # Another tab, no fragment: the token form; a wrong token is refused, and a
            # tenant's own token shows the same fleet and none of the admin's work.
            context = await browser.new_context()
            signin = await context.new_page()
            _watch(signin, [], requests)
            await signin.goto(f"{api}/ui")
            await expect(signin.locator("#token-form")).to_be_visible()
            await signin.fill("#token-input", "gf_0123456789abcdef_wrong")
            await signin.click("#token-form button")
            await expect(signin.locator("#signin-error")).to_contain_text("rejected")
            await signin.fill("#token-input", str(tenant["token"]))
            await signin.click("#token-form button")
            tenant_rows = signin.locator("#nodes tbody tr[data-node-id]")
            await expect(tenant_rows).to_have_count(len(nodes), timeout=BROWSER_TIMEOUT_MS)
            await expect(signin.locator("#work tbody tr")).to_have_text(
                "No jobs or deployments yet."
            )
            await signin.click("#forget-token")
            await expect(signin.locator("#token-form")).to_be_visible()
            assert await signin.evaluate("sessionStorage.getItem('greenfed.token')") is None
            await context.close()

        code, _ = await up.stop(signal.SIGINT)
        assert code == 0, up.stderr
    assert problems == []


# ---- what the page makes of the API's answers: a fake API at the seam, a real browser ---
#
# The control plane's own answers, shaped as the API shapes them, with the states a
# test needs set directly (sixty jobs queued in front of three running ones, usage that
# moves after the end, amounts in two currencies) instead of waiting for a fleet to get
# there. Each refresh is asked for by changing the fragment (the page refreshes on
# `hashchange`), so nothing waits for the five-second timer.

FAKE_TOKEN = "gf_0123456789abcdef_fake"
FAKE_ZONE = "DE"
FAKE_NODE = "cloud-h100-0"
# What a listing leaves out of a job's or deployment's view (JobSummary against JobView).
DETAIL_ONLY = ("nodes", "allocations", "usage", "replica_states", "spec", "idempotency_key")


def _at(seconds_ago: float = 0.0) -> str:
    moment = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return moment.isoformat().replace("+00:00", "Z")


@dataclass
class FakeApi:
    """The endpoints the dashboard reads, over work the test edits in place."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    usage_totals: list[dict[str, Any]] = field(default_factory=list)  # GET /v1/usage
    requests: list[str] = field(default_factory=list)  # path and query of each /v1 call

    def add_job(self, state: str, *, node: str | None = None, **fields: Any) -> dict[str, Any]:
        """A job newer than every one before it (ids sort as ULIDs do: newest last)."""
        index = len(self.jobs)
        job_id = f"01JFAKE{index:019d}"
        placed = state in ("scheduled", "running")
        job: dict[str, Any] = {
            "id": job_id,
            "name": f"job-{index}",
            "tenant": "acme",
            "priority": "p2",
            "state": state,
            "reason": None,
            "attempts": 1 if placed else 0,
            "version": 1,
            "submitted_at": _at(3600 - index),
            "updated_at": _at(),
            "kind": "training",
            "workers": 1,
            "accelerators_per_worker": 2,
            "accelerator_kind": "gpu",
            "nodes": [node] if placed and node else [],
            "allocations": (
                [{"member": 0, "node_id": node, "accelerators": 2}] if placed and node else []
            ),
            "usage": None,
        }
        job.update(fields)
        self.jobs[job_id] = job
        return job

    def change(self, job: dict[str, Any], **fields: Any) -> None:
        """A change the API versions (a state change, say)."""
        job.update(fields, version=job["version"] + 1, updated_at=_at())

    def add_event(self, kind: str, work_id: str) -> None:
        self.events.append(
            {
                "seq": len(self.events) + 1,
                "kind": kind,
                "work_id": work_id,
                "at": _at(),
                "payload": {"work_id": work_id},
                "tenant": "acme",
            }
        )

    def detail_requests(self, job: dict[str, Any]) -> int:
        return self.requests.count(f"/v1/jobs/{job['id']}")

    # ---- the endpoints

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._bearer_only])
        add_routes(app, ui.ROUTES)
        app.router.add_get("/v1/nodes", self._nodes)
        app.router.add_get("/v1/signals", self._signals)
        app.router.add_get("/v1/jobs", self._list_jobs)
        app.router.add_get("/v1/jobs/{id}", self._job)
        app.router.add_get("/v1/deployments", self._list_deployments)
        app.router.add_get("/v1/events", self._events)
        app.router.add_get("/v1/usage", self._usage)
        return app

    @web.middleware
    async def _bearer_only(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        self.requests.append(request.path_qs)
        if request.headers.get("Authorization") != f"Bearer {FAKE_TOKEN}":
            return web.json_response({"title": "Unauthorized", "detail": "no"}, status=401)
        return await handler(request)

    async def _nodes(self, request: web.Request) -> web.Response:
        node = {
            "node_id": FAKE_NODE,
            "state": "online",
            "offline_reason": None,
            "site": "cloud",
            "zone": FAKE_ZONE,
            "accelerators": [{"kind": "gpu", "model": "H100"}] * 8,
            "accelerator_counts": {"gpu": 8},
            "power_w": 2000.0,
            "accelerator_utilization_pct": 50.0,
            "last_seen_at": _at(),
        }
        return web.json_response({"items": [node], "count": 1, "total": 1, "next_cursor": None})

    async def _signals(self, request: web.Request) -> web.Response:
        zone = {
            "zone": FAKE_ZONE,
            "carbon_g_per_kwh": 300.0,
            "next_24h_min_carbon_g_per_kwh": 200.0,
            "next_24h_max_carbon_g_per_kwh": 400.0,
            "next_24h_cleanest_hour": _at(),
            "price_per_mwh": 80.0,
            "currency": "EUR",
            "stale": False,
        }
        return web.json_response({"zones": [zone]})

    def _listing(self, request: web.Request, work: dict[str, dict[str, Any]]) -> web.Response:
        """As `GET /v1/jobs` lists: newest first, `state` a comma-separated filter, a page
        of `limit` and the cursor of the next (older) page."""
        states = request.query.get("state")
        limit = int(request.query.get("limit", "50"))
        cursor = request.query.get("cursor")
        ordered = sorted(work.values(), key=lambda item: str(item["id"]), reverse=True)
        if states is not None:
            ordered = [item for item in ordered if item["state"] in states.split(",")]
        if cursor is not None:
            ordered = [item for item in ordered if str(item["id"]) < cursor]
        page = ordered[:limit]
        summaries = [{k: v for k, v in item.items() if k not in DETAIL_ONLY} for item in page]
        next_cursor = page[-1]["id"] if len(ordered) > limit else None
        body = {"items": summaries, "count": len(summaries), "next_cursor": next_cursor}
        return web.json_response(body)

    async def _list_jobs(self, request: web.Request) -> web.Response:
        return self._listing(request, self.jobs)

    async def _list_deployments(self, request: web.Request) -> web.Response:
        return self._listing(request, {})

    async def _job(self, request: web.Request) -> web.Response:
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            return web.json_response({"title": "Not found"}, status=404)
        return web.json_response(job)

    async def _usage(self, request: web.Request) -> web.Response:
        """`GET /v1/usage` (grouped by tenant, as the page asks): one row per currency."""
        rows = [{"tenant": "acme", **total} for total in self.usage_totals]
        return web.json_response(
            {"group_by": ["tenant"], "rows": rows, "totals": self.usage_totals}
        )

    async def _events(self, request: web.Request) -> web.Response:
        """`GET /v1/events?follow=false`: the stored events after `after` (or recorded at
        or after `since`), as server-sent events, and the end of the stream."""
        assert request.query.get("follow") == "false", request.path_qs
        after = request.query.get("after")
        since = request.query.get("since")
        chosen = self.events
        if after is not None:
            chosen = [event for event in chosen if event["seq"] > int(after)]
        elif since is not None:
            chosen = [event for event in chosen if _parse(event["at"]) >= _parse(since)]
        else:
            chosen = []
        text = "retry: 2000\n\n" + "".join(
            f"id: {event['seq']}\nevent: {event['kind']}\ndata: {json.dumps(event)}\n\n"
            for event in chosen
        )
        return web.Response(text=text, content_type="text/event-stream")


def _parse(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


@asynccontextmanager
async def fake_dashboard(fake: FakeApi) -> AsyncIterator[tuple[Page, list[str]]]:
    """The dashboard in a real browser over `fake`, signed in; (page, page errors)."""
    chromium = require_tool("chromium", "chromium")
    async with TestServer(fake.app()) as server, browser_session(chromium) as browser:
        context = await browser.new_context(locale="en-US")
        page = await context.new_page()
        page.set_default_timeout(BROWSER_TIMEOUT_MS)
        problems: list[str] = []
        _watch(page, problems, [])
        await page.goto(str(server.make_url(f"/ui#token={FAKE_TOKEN}")))
        await expect(page.locator("#dashboard")).to_be_visible()
        yield page, problems
        await context.close()


async def _refresh_now(page: Page) -> None:
    """Ask the page for a refresh at once (it refreshes on every `hashchange`)."""
    await page.evaluate("location.hash = 'refresh-' + Date.now() + Math.random()")


def _usage(energy_kwh: float, **fields: Any) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "energy_kwh": energy_kwh,
        "gco2eq_g": energy_kwh * 300,
        "cost": 0.0,
        "currency": None,
        "costs": {},
        "avoided_gco2eq_g": None,
        "measured_share": 1.0,
        "gap_filled_s": 0.0,
        "fallback": False,
        "members": [],
    }
    usage.update(fields)
    return usage


@pytest.mark.timeout(60)
async def test_the_cards_and_zones_count_live_work_behind_a_long_queue() -> None:
    """Three jobs run, sixty newer ones wait: the cards and the zone count all of them,
    and the table says it shows only the newest."""
    fake = FakeApi()
    for _ in range(3):
        fake.add_job("running", node=FAKE_NODE)
    for _ in range(60):
        fake.add_job("pending")
    async with fake_dashboard(fake) as (page, problems):
        await expect(page.locator("#card-work")).to_have_text("3 running")
        await expect(page.locator("#card-work-detail")).to_have_text(
            "60 waiting · 63 live jobs · 0 live deployments"
        )
        allocated = page.locator(f'#zones tr[data-zone="{FAKE_ZONE}"] [data-allocated]')
        await expect(allocated).to_have_attribute("data-allocated", "6")
        await expect(page.locator("#work tbody tr[data-work-id]")).to_have_count(50)
        await expect(page.locator("#work .notice")).to_be_visible()
        await expect(page.locator("#work .notice")).to_contain_text("Showing the newest 50 of 63")
    assert problems == []


@pytest.mark.timeout(60)
async def test_finished_work_shows_its_usage_until_the_final_figures() -> None:
    """Usage is metered after the end without a new version: the row follows it until
    the `work.usage` event gives the final figures, and is then kept as it is."""
    fake = FakeApi()
    job = fake.add_job("running", node=FAKE_NODE, usage=_usage(1.0))
    sentinel = fake.add_job("pending", name="sentinel-0")
    async with fake_dashboard(fake) as (page, problems):
        row = page.locator(f'#work tr[data-work-id="{job["id"]}"]')
        energy = row.locator("td").nth(5)
        await expect(energy).to_have_text("1 kWh")

        fake.change(job, state="cancelled", usage=_usage(1.2))
        await _refresh_now(page)
        await expect(row).to_have_attribute("data-state", "cancelled")
        await expect(energy).to_have_text("1.2 kWh")

        job["usage"] = _usage(1.5)  # the node's last samples, metered after the end
        await _refresh_now(page)
        await expect(energy).to_have_text("1.5 kWh")

        job["usage"] = _usage(1.6)
        fake.add_event("work.usage", job["id"])
        await _refresh_now(page)
        await expect(energy).to_have_text("1.6 kWh")

        # Final: not asked again. The sentinel's new name says a refresh is done: one
        # after the event, then one more to count the requests over.
        sentinel["name"] = "sentinel-1"
        await _refresh_now(page)
        await expect(page.locator("#work")).to_contain_text("sentinel-1")
        asked = fake.detail_requests(job)
        job["usage"] = _usage(9.0)
        sentinel["name"] = "sentinel-2"
        await _refresh_now(page)
        await expect(page.locator("#work")).to_contain_text("sentinel-2")
        await expect(energy).to_have_text("1.6 kWh")
        assert fake.detail_requests(job) == asked
    assert problems == []


@pytest.mark.timeout(60)
async def test_work_priced_in_two_currencies_shows_each_and_totals_each() -> None:
    fake = FakeApi()
    two = fake.add_job(
        "running", node=FAKE_NODE, usage=_usage(1.0, costs={"EUR": 0.42, "USD": 0.1})
    )
    one = fake.add_job(
        "running", node=FAKE_NODE, usage=_usage(1.0, cost=1.0, currency="EUR", costs={"EUR": 1.0})
    )
    # A server older than `costs` sends `cost` and `currency` alone.
    older = {k: v for k, v in _usage(1.0, cost=0.5, currency="EUR").items() if k != "costs"}
    legacy = fake.add_job("running", node=FAKE_NODE, usage=older)
    # The card: the API's totals, one row per currency (never summed across them).
    fake.usage_totals = [
        {"currency": currency, "cost": cost, "energy_kwh": 1.5, "gco2eq_g": 450.0,
         "avoided_gco2eq_g": None, "measured_share": 1.0, "fallback": False}
        for currency, cost in (("EUR", 1.92), ("USD", 0.1))
    ]  # fmt: skip
    async with fake_dashboard(fake) as (page, problems):
        cost = {
            item["id"]: page.locator(f'#work tr[data-work-id="{item["id"]}"] td').nth(7)
            for item in (two, one, legacy)
        }
        await expect(cost[two["id"]]).to_have_text("€0.42 + $0.10")
        await expect(cost[one["id"]]).to_have_text("€1.00")
        await expect(cost[legacy["id"]]).to_have_text("€0.50")
        await expect(page.locator("#card-avoided-detail")).to_contain_text("€1.92 + $0.10")
    assert problems == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "pasted",
    ["gf_…", "gf_0123456789abcdef_wrong\u200b", "gf_0123456789abcdef_wr\nong", "gf_ab cd"],
)
async def test_a_pasted_token_with_a_character_no_token_has_is_refused_at_once(
    pasted: str,
) -> None:
    """Not sent (a browser cannot put it in a header): the sign-in form says what is
    wrong, for a token pasted into it or given in the link's fragment."""
    fake = FakeApi()
    chromium = require_tool("chromium", "chromium")
    problems: list[str] = []
    async with TestServer(fake.app()) as server, browser_session(chromium) as browser:
        # A password input drops line breaks from what is pasted: only the link has them.
        if "\n" not in pasted:
            page = await browser.new_page()
            _watch(page, problems, [])
            await page.goto(str(server.make_url("/ui")))
            await expect(page.locator("#token-form")).to_be_visible(timeout=BROWSER_TIMEOUT_MS)
            await page.evaluate(
                "t => { document.getElementById('token-input').value = t; }", pasted
            )
            await page.click("#token-form button")
            await expect(page.locator("#signin-error")).to_contain_text("That is not a token")
            await expect(page.locator("#token-form")).to_be_visible()
            await expect(page.locator("#status")).not_to_contain_text("Cannot reach")
            assert await page.evaluate("sessionStorage.getItem('greenfed.token')") is None

        linked = await browser.new_page()
        _watch(linked, problems, [])
        await linked.goto(str(server.make_url("/ui")) + "#token=" + quote(pasted))
        await expect(linked.locator("#signin-error")).to_contain_text("That is not a token")
        assert await linked.evaluate("sessionStorage.getItem('greenfed.token')") is None
        assert "token" not in linked.url
    assert fake.requests == []
    assert problems == []


@pytest.mark.timeout(60)
async def test_an_outage_keeps_the_work_shown_and_never_claims_there_is_none() -> None:
    fake = FakeApi()
    job = fake.add_job("pending", name="still-here")
    async with fake_dashboard(fake) as (page, problems):
        row = page.locator(f'#work tr[data-work-id="{job["id"]}"]')
        await expect(row).to_be_visible()

        async def refuse(route: Route) -> None:
            await route.abort("connectionrefused")

        await page.route("**/v1/**", refuse)
        await _refresh_now(page)
        await expect(page.locator("#status")).to_have_text(
            "Cannot reach the control plane, retrying…"
        )
        await expect(page.locator("#work .notice")).to_contain_text("Could not load")
        await expect(page.locator("#work")).not_to_contain_text("No jobs or deployments yet.")
        await expect(row).to_be_visible()
    # The browser reports each refused request as a console error: those are expected.
    assert [problem for problem in problems if "ERR_CONNECTION_REFUSED" not in problem] == []
