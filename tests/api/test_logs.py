"""Job logs in the cloud: chunks from the `logs` MQTT channel, kept bounded, served by
`GET /v1/jobs/{id}/logs` (and followed)."""

from __future__ import annotations

import asyncio
import dataclasses

import aiomqtt
import msgspec
import pytest
from sqlalchemy import update

from cloud.app_keys import INGESTOR, SETTINGS
from cloud.store.schema import work as work_table
from cloud.streams.logs import MAX_OPEN_LINE_CHARS, JobLogStore, LogRenderer, render_tail
from shared.messages import JobLogChunk, encode
from shared.settings import parse_mqtt_url
from shared.topics import Channel, Topics
from tests.api.support import (
    FAST,
    Api,
    bearer,
    deployment_spec,
    job_spec,
    problem,
    running_api,
)
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually_async


def chunk(
    job_id: str,
    text: str,
    *,
    node: str = "gpu-a",
    attempt: int = 1,
    offset: int = 0,
    dropped: int = 0,
) -> JobLogChunk:
    return JobLogChunk(
        node_id=node,
        job_id=job_id,
        attempt=attempt,
        offset=offset,
        text=text,
        dropped_bytes=dropped,
        sent_at=1.0,
    )


def assigned(api: Api, message: JobLogChunk) -> None:
    """Tell the assignment index the chunk's node runs that attempt: only such chunks
    are kept (cloud/fleet/assignments.py)."""
    index = api.app[INGESTOR].assignments
    assert index is not None
    index.replace({*index.current, ("training", message.node_id, message.job_id, message.attempt)})


def ingest(api: Api, message: JobLogChunk) -> None:
    """Through the ingestion callback, as an MQTT message would arrive."""
    assigned(api, message)
    topics = Topics(api.app[SETTINGS].mqtt.topic_root)
    api.app[INGESTOR].handle(topics.node(message.node_id, Channel.LOGS), encode(message))


async def logs(api: Api, token: str, job_id: str, query: str = "") -> str:
    response = await api.get(token, f"/v1/jobs/{job_id}/logs{query}")
    assert response.status == 200, await response.text()
    assert response.content_type == "text/plain"
    return await response.text()


async def test_a_gangs_output_is_served_per_line_with_gaps_marked(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec(workers=2))
    assert await logs(api, token, job_id) == ""
    ingest(api, chunk(job_id, "epoch 1 loss 0.9\nepo", node="gpu-a"))
    ingest(api, chunk(job_id, "rank 1 ready\n", node="gpu-b"))
    ingest(api, chunk(job_id, "ch 2 loss 0.7\n", node="gpu-a", offset=20))
    # 100 bytes never arrived (a lost QoS 0 message), then the agent dropped 50 more.
    ingest(api, chunk(job_id, "epoch 9 loss 0.2\n", node="gpu-a", offset=134))
    ingest(api, chunk(job_id, "epoch 10\n", node="gpu-a", offset=201, dropped=50))
    assert await logs(api, token, job_id) == (
        "[gpu-a] epoch 1 loss 0.9\n"
        "[gpu-b] rank 1 ready\n"
        "[gpu-a] epoch 2 loss 0.7\n"
        "[gpu-a] [greenfed: 100 bytes of output missing here]\n"
        "[gpu-a] epoch 9 loss 0.2\n"
        "[gpu-a] [greenfed: 50 bytes of output missing here]\n"
        "[gpu-a] epoch 10\n"
    )
    assert await logs(api, token, job_id, "?tail=2") == (
        "[gpu-a] [greenfed: 50 bytes of output missing here]\n[gpu-a] epoch 10\n"
    )
    # One worker: no prefix.
    assert await logs(api, token, job_id, "?node=gpu-b") == "rank 1 ready\n"
    # The latest attempt by default; earlier ones on request.
    ingest(api, chunk(job_id, "retrying\n", node="gpu-c", attempt=2))
    response = await api.get(token, f"/v1/jobs/{job_id}/logs")
    assert response.headers["X-Greenfed-Attempt"] == "2"
    assert await response.text() == "[gpu-c] retrying\n"
    assert (await logs(api, token, job_id, "?attempt=1&tail=1")).endswith("epoch 10\n")
    await problem(await api.get(token, f"/v1/jobs/{job_id}/logs?tail=-1"), 400)
    deployment = await api.submitted(
        token, deployment_spec(await api.model(token)), collection="deployments"
    )
    await problem(await api.get(token, f"/v1/jobs/{deployment}/logs"), 404)


async def test_the_admin_reads_another_tenants_job_logs_and_a_tenant_does_not(
    api: Api,
) -> None:
    globex = await api.tenant("globex")
    acme = await api.tenant("acme")
    job_id = await api.submitted(globex, job_spec())
    ingest(api, chunk(job_id, "epoch 1 loss 0.9\n"))
    assert await logs(api, api.admin_token, job_id) == "epoch 1 loss 0.9\n"
    assert await logs(api, api.admin_token, job_id, "?tail=1") == "epoch 1 loss 0.9\n"
    await problem(await api.get(acme, f"/v1/jobs/{job_id}/logs"), 404)
    await problem(await api.get(api.admin_token, "/v1/jobs/no-such-job/logs"), 404)


async def test_following_streams_new_output_until_the_job_ends(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec())
    ingest(api, chunk(job_id, "starting\n"))
    response = await api.get(token, f"/v1/jobs/{job_id}/logs?follow=true")
    assert response.status == 200
    assert response.headers["Transfer-Encoding"] == "chunked"
    async with asyncio.timeout(5):
        assert await response.content.readline() == b"starting\n"
        ingest(api, chunk(job_id, "step 1\n", offset=9))
        assert await response.content.readline() == b"step 1\n"
        ingest(api, chunk(job_id, "step 2 (no newline yet)", offset=16))
        assert await response.content.read(6) == b"step 2"
        cancelled = await api.client.delete(f"/v1/jobs/{job_id}", headers=bearer(token))
        assert cancelled.status == 200
        # Output still arriving after the end is shown, then the stream closes.
        ingest(api, chunk(job_id, "\nstopped by SIGTERM\n", offset=39))
        rest = await response.content.read()
    assert rest == b" (no newline yet)\nstopped by SIGTERM\n"


async def test_output_published_over_mqtt_reaches_the_logs_route(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec())
    settings = api.app[SETTINGS].mqtt
    endpoint = parse_mqtt_url(settings.url)
    message = chunk(job_id, "hello from the node\n", node="gpu-z")
    topic = Topics(settings.topic_root).node("gpu-z", Channel.LOGS)
    assigned(api, message)
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.publish(topic, encode(message), qos=1)

    async def arrived() -> bool:
        return await logs(api, token, job_id) == "hello from the node\n"

    await eventually_async(arrived, timeout_s=10)


def test_each_job_keeps_its_newest_output_within_its_budget() -> None:
    store = JobLogStore(bytes_per_job=100, total_bytes=250, max_jobs=3)
    for n in range(10):
        store.append(chunk("big", f"line {n:02d} ".ljust(29, ".") + "\n", offset=n * 30))
    snapshot = store.snapshot("big")
    assert sum(piece.size_bytes for piece in snapshot.pieces) <= 100
    assert snapshot.trimmed_bytes == 210
    text, _ = render_tail(snapshot, prefix=False, tail_lines=None)
    assert text.splitlines()[0] == "[greenfed: 210 earlier bytes are no longer kept in the cloud]"
    assert text.splitlines()[-1].startswith("line 09")
    # A tail within what is kept says nothing about what is not.
    assert render_tail(snapshot, prefix=False, tail_lines=1)[0].startswith("line 09")
    # A copy of output already kept (a resent chunk) is ignored.
    before = store.snapshot("big").last_seq
    store.append(chunk("big", "line 09 ".ljust(29, ".") + "\n", offset=270))
    assert store.snapshot("big").last_seq == before
    # Beyond the total, the jobs quiet longest go first.
    for name in ("a", "b", "c"):
        store.append(chunk(name, "x" * 90))
    assert "big" not in store
    assert store.size_bytes <= 250
    store.append(chunk("d", "y"))
    assert "a" not in store
    assert all(name in store for name in ("b", "c", "d"))


def test_a_node_the_job_left_cannot_crowd_out_the_current_attempts_output() -> None:
    """The node of an earlier attempt may still send output a while (its assignment
    lingers): within the job's budget, earlier attempts' output goes first."""
    store = JobLogStore(bytes_per_job=100, total_bytes=1000)
    store.append(chunk("job", "current attempt\n", node="gpu-b", attempt=2))
    for n in range(20):
        store.append(chunk("job", "x" * 29 + "\n", node="gpu-a", attempt=1, offset=n * 30))
    snapshot = store.snapshot("job")
    assert any(p.attempt == 2 and p.text == "current attempt\n" for p in snapshot.pieces)
    assert sum(piece.size_bytes for piece in snapshot.pieces) <= 100


@pytest.mark.parametrize("prefix", [True, False])
def test_open_lines_are_ended_when_the_output_stops_or_an_attempt_starts(prefix: bool) -> None:
    store = JobLogStore()
    store.append(chunk("j", "half a line"))
    store.append(chunk("j", "new run\n", attempt=2))
    renderer = LogRenderer(prefix=prefix)
    text = renderer.feed(store.snapshot("j").pieces) + renderer.flush()
    label = "[gpu-a] " if prefix else ""
    assert text == f"{label}half a line\n[greenfed: attempt 2]\n{label}new run\n"


async def test_waiting_for_output_wakes_on_the_first_chunk() -> None:
    store = JobLogStore()

    async def first_chunk() -> None:  # runs once the waiter waits (tasks start in order)
        store.append(chunk("later", "hi\n"))

    woke, _ = await asyncio.gather(store.wait_for_output("later", 0, timeout_s=5), first_chunk())
    assert woke
    assert not await store.wait_for_output("later", store.snapshot("later").last_seq, 0.01)


async def test_a_gangs_progress_bar_reaches_a_follower_a_line_per_redraw(api: Api) -> None:
    """A progress bar (tqdm) redraws its line with a carriage return and ends it only when
    done: prefixed, each redraw is a line of its own, sent once the next one starts."""
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec(workers=2))
    ingest(api, chunk(job_id, "start\n"))
    response = await api.get(token, f"/v1/jobs/{job_id}/logs?follow=true")
    assert response.status == 200
    async with asyncio.timeout(5):
        assert await response.content.readline() == b"[gpu-a] start\n"
        offset = 6
        for step in range(1, 4):
            bar = f"\r{step}/9 [" + "#" * step + "]"
            ingest(api, chunk(job_id, bar, offset=offset))
            offset += len(bar)
        assert await response.content.readline() == b"[gpu-a] 1/9 [#]\n"
        assert await response.content.readline() == b"[gpu-a] 2/9 [##]\n"
    response.close()


def test_prefixed_redraws_are_lines_and_a_crlf_split_across_chunks_stays_one() -> None:
    store = JobLogStore()
    renderer = LogRenderer(prefix=True)
    shown = []
    offset = 0
    for text in ("\r1/2 [#", " ]\r2/2 [##]\r", "\ndone\r", "\n"):
        store.append(chunk("j", text, offset=offset))
        offset += len(text)
        shown.append(renderer.feed(store.snapshot("j").pieces[-1:]))  # as a follower reads
    assert shown == ["", "[gpu-a] 1/2 [# ]\n", "[gpu-a] 2/2 [##]\r\n", "[gpu-a] done\r\n"]
    assert renderer.flush() == ""


def test_a_prefixed_line_that_never_ends_is_shown_in_parts_within_a_bound() -> None:
    """A worker printing without a newline (nor a carriage return) does not make the
    server hold its output without limit, and what it printed is shown."""
    store = JobLogStore(bytes_per_job=10 * MAX_OPEN_LINE_CHARS)
    renderer = LogRenderer(prefix=True)
    piece_chars = MAX_OPEN_LINE_CHARS // 3
    shown = ""
    for n in range(12):
        store.append(chunk("j", "x" * piece_chars, offset=n * piece_chars))
        shown += renderer.feed(store.snapshot("j").pieces[-1:])
    held = renderer.flush()
    assert len(held) <= len("[gpu-a] \n") + MAX_OPEN_LINE_CHARS
    assert shown.startswith("[gpu-a] xxx")
    assert (shown + held).count("x") == 12 * piece_chars
    assert all(line.startswith("[gpu-a] ") for line in (shown + held).splitlines())


async def test_a_follower_is_told_of_output_trimmed_before_it_read_it(
    database: DatabaseUnderTest,
) -> None:
    """A burst past the job's budget (an agent's outbox flushed after a reconnect) between
    two reads of a follower: the output it never saw is marked, as the plain read does."""
    tuning = dataclasses.replace(FAST, log_bytes_per_job=4000)
    async with running_api(database, tuning) as api:
        token = await api.tenant("acme")
        job_id = await api.submitted(token, job_spec())

        def line(n: int) -> str:
            return f"line {n:03d} ".ljust(99, ".") + "\n"  # 100 bytes

        ingest(api, chunk(job_id, line(0)))
        response = await api.get(token, f"/v1/jobs/{job_id}/logs?follow=true")
        assert response.status == 200
        async with asyncio.timeout(5):
            assert await response.content.readline() == line(0).encode()
            # No await in between: the follower cannot read until the burst is over.
            for n in range(1, 101):
                ingest(api, chunk(job_id, line(n), offset=n * 100))
            # 40 lines fit the budget (61..100): 1..60, never sent, are 6000 bytes.
            assert await response.content.readline() == (
                b"[greenfed: 6000 earlier bytes are no longer kept in the cloud]\n"
            )
            assert await response.content.readline() == line(61).encode()
        response.close()
        plain = await logs(api, token, job_id)
        assert plain.splitlines()[0] == (
            "[greenfed: 6100 earlier bytes are no longer kept in the cloud]"
        )


async def test_the_logs_of_a_job_a_newer_greenfed_wrote_are_served(api: Api) -> None:
    """During a rolling upgrade a job's stored spec may hold a field this version does
    not know: its logs are served as its view is, never a 500."""
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec(workers=2))
    record = await api.store.find_work(job_id)
    assert record is not None
    spec = {**msgspec.json.decode(record.spec), "a_field_of_a_newer_version": 1}
    async with api.store._write() as connection:
        await connection.execute(
            update(work_table)
            .where(work_table.c.id == job_id)
            .values(spec=msgspec.json.encode(spec), version=work_table.c.version + 1)
        )
    ingest(api, chunk(job_id, "epoch 1\n"))
    assert await logs(api, token, job_id) == "[gpu-a] epoch 1\n"
    response = await api.get(token, f"/v1/jobs/{job_id}/logs?follow=true")
    assert response.status == 200, await response.text()
    async with asyncio.timeout(5):
        assert await response.content.readline() == b"[gpu-a] epoch 1\n"
    response.close()
