"""The commands that follow (`events -f`, `logs ID -f`, `job ID -w`, `deployment ID -w`)
against a control plane that accepts the connection and never answers, or answers and
then falls silent (hung, or a connection a proxy dropped without a word), end with the
one line every command says for an API that does not answer, instead of hanging forever.
A live control plane's streams go on: the event stream's keep-alives (also a stream of
one work's events while other work's pass it by) and a quiet job's output, whose API
still answers.

The client's limits are made short here (the first answer in 0.5 s, a heartbeat of 0.2 s)
so that each case takes a second, not a minute."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest
from aiohttp import web

from cloud.api.tuning import ApiTuning
from cloud.work.views import EventView
from greenfed import api_client, event_stream
from greenfed.api_client import ApiClient, Target
from greenfed.cli import main
from shared import secret_hashes
from tests.api.support import FAST, Api, SseReader, bearer, job_spec, running_api
from tests.cli.test_admin_cli import Cli
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(90)

FIRST_ANSWER_S = 0.5
HEARTBEAT_S = 0.2  # the server's in these tests (tests/api/support.py FAST) and the client's
NO_ANSWER = "no answer in time"
FOLLOWING = [["events", "-f"], ["logs", "x", "-f"], ["job", "x", "-w"], ["deployment", "x", "-w"]]


EXPECTED_HEARTBEAT_S = api_client.EVENT_HEARTBEAT_S  # read before the fixture shortens it


@pytest.fixture(autouse=True)
def short_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_client, "TIMEOUT_S", FIRST_ANSWER_S)
    monkeypatch.setattr(api_client, "EVENT_HEARTBEAT_S", HEARTBEAT_S)
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def never_answering() -> AsyncIterator[str]:
    """The URL of a server that accepts connections and never says a word."""
    released = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await released.wait()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        released.set()
        server.close()
        await server.wait_closed()


@pytest.fixture
async def falling_silent() -> AsyncIterator[str]:
    """The URL of an API whose streams start and then say nothing more, and that then
    answers nothing else either (a job is there, for `logs x`)."""
    released = asyncio.Event()

    async def silent_stream(
        request: web.Request, content_type: str, first: bytes
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await response.write(first)
        await released.wait()
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        return await silent_stream(request, "text/event-stream", b"retry: 2000\n\n")

    async def logs(request: web.Request) -> web.StreamResponse:
        return await silent_stream(request, "text/plain", b"epoch 1\n")

    async def job(request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info["id"], "state": "running"})

    async def hung(request: web.Request) -> web.Response:
        await released.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/jobs/{id}/logs", logs)
    app.router.add_get("/v1/jobs/{id}", job)
    app.router.add_get("/healthz", hung)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        released.set()
        await runner.cleanup()


async def run(argv: list[str], url: str, capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The real command line in a thread (its own event loop), bounded."""
    capfd.readouterr()
    code = await asyncio.wait_for(
        asyncio.to_thread(main, [*argv, "--api", url, "--token", "gf_x"]), timeout=30
    )
    out, err = capfd.readouterr()
    return code, out, err


def assert_no_answer(err: str, url: str) -> None:
    assert err.startswith(f"greenfed: cannot reach the greenfed API at {url} (from --api): ")
    assert NO_ANSWER in err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("argv", FOLLOWING, ids=" ".join)
async def test_a_follower_of_an_api_that_never_answers_gives_up(
    argv: list[str], never_answering: str, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await run(argv, never_answering, capfd)
    assert code == 1
    assert_no_answer(err, never_answering)


async def test_an_event_stream_that_falls_silent_is_given_up(
    falling_silent: str, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run(["events", "-f"], falling_silent, capfd)
    assert (code, out) == (1, "")
    assert_no_answer(err, falling_silent)


async def test_a_followed_log_whose_api_stops_answering_is_given_up(
    falling_silent: str, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run(["logs", "x", "-f"], falling_silent, capfd)
    assert (code, out) == (1, "epoch 1\n")
    assert_no_answer(err, falling_silent)


def test_the_client_expects_the_servers_heartbeat() -> None:
    """The client's patience is a number of the server's keep-alive intervals."""
    assert ApiTuning().heartbeat_s == pytest.approx(EXPECTED_HEARTBEAT_S)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database, dataclasses.replace(FAST, heartbeat_s=HEARTBEAT_S)) as running:
        yield running


async def test_a_live_event_stream_outlasts_its_quiet(api: Api) -> None:
    """Nothing happens for many times the silence the client bears; the keep-alives
    keep the stream open, and the event that then comes arrives."""
    acme = await api.tenant("acme")
    target = Target(str(api.client.make_url("")).rstrip("/"), acme, "test")
    async with ApiClient(target, timeout_s=None) as client:

        async def first_event() -> EventView:
            async with contextlib.aclosing(
                cast(AsyncGenerator[EventView, None], event_stream.events(client, {}))
            ) as stream:
                return await anext(stream)

        async with asyncio.TaskGroup() as tasks:
            arriving = tasks.create_task(first_event())
            # Time passing is what is tested: no event can be awaited instead.
            quiet_s = 5 * api_client.SILENT_HEARTBEATS * HEARTBEAT_S
            done, _ = await asyncio.wait({arriving}, timeout=quiet_s)
            assert not done, arriving.result()  # neither an event nor a failure yet
            job = await api.submitted(acme, job_spec())
            event = await asyncio.wait_for(arriving, timeout=10)
    assert (event.kind, event.work_id) == ("work.state", job)


async def test_a_stream_of_one_quiet_work_hears_keep_alives_while_other_work_is_busy(
    api: Api,
) -> None:
    """The server's keep-alive comes every heartbeat of silence on the stream itself,
    whatever other work's events it passes by (`work_id`)."""
    acme = await api.tenant("acme")
    quiet = await api.submitted(acme, job_spec(name="quiet"))
    response = await api.client.get(f"/v1/events?work_id={quiet}", headers=bearer(acme))
    reader = SseReader(response)

    async def busy() -> None:
        while True:  # other work's events, one after another: the feed is never idle
            await api.submitted(acme, job_spec(name="busy"))

    async with asyncio.TaskGroup() as tasks:
        submitting = tasks.create_task(busy())
        try:
            for _ in range(3):
                assert await reader.comment(timeout_s=10 * HEARTBEAT_S) == "keep-alive"
        finally:
            submitting.cancel()
    response.close()


async def test_a_quiet_jobs_followed_output_goes_on_while_its_api_answers(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    """A job prints nothing for many silences (its log stream has no keep-alive); the
    client asks the API whether it is there instead, and follows until the job ends."""
    cli = Cli(api, capfd)
    acme = await api.tenant("acme")
    job = await api.submitted(acme, job_spec())
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(cli.run("logs", job, "-f", token=acme))
        # Time passing is what is tested: the follower must outlast its silences.
        done, _ = await asyncio.wait(
            {following}, timeout=5 * api_client.SILENT_HEARTBEATS * HEARTBEAT_S
        )
        assert not done, following.result()
        cancelled = await api.client.delete(f"/v1/jobs/{job}", headers=bearer(acme))
        assert cancelled.status == 200, await cancelled.text()
        code, _, err = await asyncio.wait_for(following, timeout=30)
    assert (code, err) == (0, "")
