"""`GET /v1/events`: server-sent events of the tenant's work, resumable without loss."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime

import aiohttp

from cloud.app import create_app, serving
from cloud.app_keys import EVENT_HUB
from shared.settings import Settings
from shared.token_files import admin_token_path, read_token_file
from tests.api.support import (
    FAST,
    Api,
    ServerSentEvent,
    SseReader,
    bearer,
    job_spec,
    problem,
    running_api,
)
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings


def states(events: list[ServerSentEvent]) -> list[tuple[str, str]]:
    """(work id, state) of each work.state event."""
    return [(e.data["payload"]["work_id"], e.data["payload"]["state"]) for e in events]


async def test_state_changes_stream_and_resume_from_the_last_event_id(
    database: DatabaseUnderTest,
) -> None:
    # A long poll interval: delivery within the test's timeouts proves the commit wake-up.
    tuning = dataclasses.replace(FAST, event_poll_interval_s=30.0)
    async with running_api(database, tuning) as api:
        acme, globex = await api.tenant("acme"), await api.tenant("globex")
        older = await api.submitted(acme, job_spec(name="before-the-stream"))
        response = await api.client.get("/v1/events", headers=bearer(acme))
        stream = SseReader(response)
        assert response.headers["Cache-Control"] == "no-store"
        first = await api.submitted(acme, job_spec(name="first"))
        await api.submitted(globex, job_spec(name="not-yours"))
        await api.client.delete(f"/v1/jobs/{first}", headers=bearer(acme))
        seen = await stream.take(2)
        # Only what happened after connecting, only this tenant's.
        assert states(seen) == [(first, "pending"), (first, "cancelled")]
        assert [event.event for event in seen] == ["work.state", "work.state"]
        assert seen[0].id < seen[1].id
        assert seen[1].data["seq"] == seen[1].id
        assert seen[1].data["payload"]["previous_state"] == "pending"
        assert seen[1].data["work_id"] == first
        assert stream.retry_ms == 2000
        # Quiet: keep-alive comments.
        assert await stream.comment() == "keep-alive"
        response.close()

        # Missed while disconnected, then resumed from the last id seen.
        second = await api.submitted(acme, job_spec(name="second"))
        third = await api.submitted(acme, job_spec(name="third"))
        await api.client.delete(f"/v1/jobs/{second}", headers=bearer(acme))
        resumed = await api.client.get(
            "/v1/events", headers={**bearer(acme), "Last-Event-ID": str(seen[-1].id)}
        )
        stream = SseReader(resumed)
        replay = await stream.take(3)
        assert states(replay) == [(second, "pending"), (third, "pending"), (second, "cancelled")]
        live = await api.submitted(acme, job_spec(name="live"))
        (after,) = await stream.take(1)
        assert states([after]) == [(live, "pending")]
        ids = [event.id for event in [*replay, after]]
        assert ids == sorted(set(ids))
        assert ids[0] > seen[-1].id
        resumed.close()

        # From the start of the log with ?after=0: everything, in order, once.
        everything = SseReader(await api.client.get("/v1/events?after=0", headers=bearer(acme)))
        assert states(await everything.take(7)) == [
            (older, "pending"),
            (first, "pending"),
            (first, "cancelled"),
            (second, "pending"),
            (third, "pending"),
            (second, "cancelled"),
            (live, "pending"),
        ]
        everything.response.close()


async def test_a_slow_stream_falls_back_to_the_store_without_loss(
    database: DatabaseUnderTest,
) -> None:
    # A queue of two and reads far apart: submissions overflow it, the stream re-reads.
    tuning = dataclasses.replace(FAST, event_queue_limit=2, event_min_interval_s=0.3)
    async with running_api(database, tuning) as api:
        acme = await api.tenant("acme")
        stream = SseReader(await api.client.get("/v1/events", headers=bearer(acme)))
        submitted = [await api.submitted(acme, job_spec(name=f"j{n}")) for n in range(12)]
        received = await stream.take(12)
        assert states(received) == [(work_id, "pending") for work_id in submitted]
        ids = [event.id for event in received]
        assert ids == sorted(set(ids))
        assert api.app[EVENT_HUB].overflows >= 1
        stream.response.close()


async def test_events_committed_by_another_replica_arrive_by_polling(
    database: DatabaseUnderTest,
) -> None:
    async with running_api(database) as first, running_api(database) as second:
        assert first.admin_token == second.admin_token  # bootstrapped once
        token = await first.tenant("acme")
        stream = SseReader(await first.client.get("/v1/events", headers=bearer(token)))
        work_id = await second.submitted(token, job_spec())
        (event,) = await stream.take(1)
        assert states([event]) == [(work_id, "pending")]
        stream.response.close()


async def test_a_bad_last_event_id_is_a_problem(api: Api) -> None:
    token = await api.tenant("acme")
    for value in ("abc", "-4", str(2**63)):
        response = await api.client.get(
            "/v1/events", headers={**bearer(token), "Last-Event-ID": value}
        )
        body = await problem(response, 400)
        assert body["invalid_params"][0]["name"] == "Last-Event-ID"
    for after in ("x", str(2**63), str(10**30)):
        body = await problem(
            await api.client.get(f"/v1/events?after={after}", headers=bearer(token)), 400
        )
        assert body["invalid_params"][0]["name"] == "after"


async def test_open_streams_end_when_the_server_stops(database: DatabaseUnderTest) -> None:
    """The clients stay connected; the server stops at once, not after its shutdown timeout
    (the streams are idle: no heartbeat or state poll is due for 30 s)."""
    tuning = dataclasses.replace(FAST, heartbeat_s=30.0, log_state_poll_s=30.0)
    settings = Settings(
        mqtt=mqtt_settings(f"mqtt://127.0.0.1:{free_port()}", "stopping"), store=database.settings
    )
    app = create_app(settings, tuning=tuning)
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        async with serving(app, "127.0.0.1", port):
            token = read_token_file(admin_token_path(database.settings))
            assert token is not None
            headers = bearer(token)
            async with http.post(f"{api}/v1/jobs", json=job_spec(), headers=headers) as created:
                job_id = (await created.json())["id"]
            events = await http.get(f"{api}/v1/events", headers=headers)
            followed = await http.get(f"{api}/v1/jobs/{job_id}/logs?follow=true", headers=headers)
            assert (events.status, followed.status) == (200, 200)
            stopping_at = loop.time()
        assert loop.time() - stopping_at < 1.0
        async with asyncio.timeout(5):
            assert (await events.content.read()).startswith(b"retry:")
            assert await followed.content.read() == b""


async def test_a_stream_of_one_works_events_ends_once_they_are_sent(api: Api) -> None:
    """`?work_id=` keeps one job's events; `?follow=false` ends after the stored ones
    (what `greenfed events` and `greenfed logs DEPLOYMENT` read)."""
    token = await api.tenant("acme")
    first = await api.submitted(token, job_spec(name="one"))
    await api.submitted(token, job_spec(name="two"))
    await api.client.delete(f"/v1/jobs/{first}", headers=bearer(token))
    response = await api.get(token, f"/v1/events?after=0&follow=false&work_id={first}")
    assert response.status == 200
    text = await asyncio.wait_for(response.text(), 10)  # ended by the server
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert {event["work_id"] for event in data} == {first}
    assert [event["payload"]["state"] for event in data] == ["pending", "cancelled"]


async def test_a_stream_since_a_time_starts_with_the_events_from_then(api: Api) -> None:
    token = await api.tenant("acme")
    await api.submitted(token, job_spec(name="before"))
    since = datetime.now(UTC)
    later = await api.submitted(token, job_spec(name="after"))
    response = await api.client.get(
        "/v1/events", params={"since": since.isoformat(), "follow": "false"}, headers=bearer(token)
    )
    assert response.status == 200
    text = await asyncio.wait_for(response.text(), 10)
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert [event["work_id"] for event in data] == [later]
    bad = await api.client.get("/v1/events?since=yesterday", headers=bearer(token))
    assert [p["name"] for p in (await problem(bad, 400))["invalid_params"]] == ["since"]


async def test_revoking_a_token_ends_the_streams_it_opened(api: Api) -> None:
    # A leaked token is revoked to shut the leak: its open streams must end with it.
    acme = await api.tenant("acme")
    created = await api.client.post("/v1/tokens", json={"name": "leaked"}, headers=bearer(acme))
    leaked = await created.json()
    job_id = await api.submitted(acme, job_spec())
    events = await api.client.get("/v1/events", headers=bearer(leaked["token"]))
    logs = await api.client.get(
        f"/v1/jobs/{job_id}/logs?follow=true", headers=bearer(leaked["token"])
    )
    assert (events.status, logs.status) == (200, 200)
    revoked = await api.client.delete(f"/v1/tokens/{leaked['id']}", headers=bearer(acme))
    assert revoked.status == 200, await revoked.text()
    later = await api.submitted(acme, job_spec(name="after-the-revocation"))
    async with asyncio.timeout(10):
        rest = await events.content.read()  # ends: no endless stream for a revoked token
        assert await logs.content.read() == b""
    assert later not in rest.decode()
