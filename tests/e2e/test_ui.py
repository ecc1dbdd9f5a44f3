"""The dashboard at `/ui`: served safely by the control plane, and what a person sees in a
real browser (the system's Chromium, driven by Playwright) next to `greenfed up`."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
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
    await expect(page.locator("#card-avoided")).to_have_text("1.5 kg")
    await expect(page.locator("#card-avoided-detail")).to_have_text(
        "CO₂eq · emitted 300 g · 1.5 kWh · €0.42"
    )
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
