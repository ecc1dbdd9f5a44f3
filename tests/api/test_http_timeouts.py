"""Half-open HTTP requests are not held for ever (issue 12): a client that stalls in its
request head is disconnected after cloud.http_header_timeout_s, one that stalls in its
body gets 408 after cloud.http_body_timeout_s, and a slow upload that keeps moving works."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from cloud.app import create_app, serving
from greenfed.broker import EmbeddedBroker
from shared.settings import CloudSettings, SchedulingSettings, Settings
from shared.token_files import admin_token_path, read_token_file
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.onnx_models import mlp

HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
# The slow upload's own server: long enough that a loaded CI machine's pauses between
# two of its pieces never reach it, while the whole upload still outlasts it.
SLOW_UPLOAD_BODY_TIMEOUT_S = 2.0


@pytest.fixture
async def server(database: DatabaseUnderTest) -> AsyncIterator[tuple[int, str]]:
    async with _serving(database, BODY_TIMEOUT_S) as served:
        yield served


@pytest.fixture
async def patient_server(database: DatabaseUnderTest) -> AsyncIterator[tuple[int, str]]:
    async with _serving(database, SLOW_UPLOAD_BODY_TIMEOUT_S) as served:
        yield served


@contextlib.asynccontextmanager
async def _serving(
    database: DatabaseUnderTest, body_timeout_s: float
) -> AsyncIterator[tuple[int, str]]:
    async with EmbeddedBroker(port=0) as broker:
        port = free_port()
        settings = Settings(
            mqtt=mqtt_settings(broker.url, "timeouts"),
            cloud=msgspec.structs.replace(
                CloudSettings(),
                http_header_timeout_s=HEADER_TIMEOUT_S,
                http_body_timeout_s=body_timeout_s,
            ),
            store=database.settings,
            scheduling=SchedulingSettings(enabled=False),
        )
        async with serving(create_app(settings), "127.0.0.1", port):
            token = read_token_file(admin_token_path(database.settings))
            assert token is not None
            yield port, token


async def closed_within(reader: asyncio.StreamReader, limit_s: float) -> tuple[bytes, float]:
    started = time.monotonic()
    async with asyncio.timeout(limit_s):
        answer = await reader.read()  # until the server closes
    return answer, time.monotonic() - started


async def test_a_client_that_stalls_in_its_headers_is_disconnected(
    server: tuple[int, str],
) -> None:
    port, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/system HTTP/1.1\r\nHost: x\r\nX-Half: ")
    await writer.drain()
    answer, waited_s = await closed_within(reader, HEADER_TIMEOUT_S + 5)
    assert answer == b""
    assert waited_s >= HEADER_TIMEOUT_S * 0.8
    writer.close()

    # and one that opens a connection and says nothing
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer, _ = await closed_within(reader, HEADER_TIMEOUT_S + 5)
    assert answer == b""
    writer.close()


async def test_a_client_that_stalls_in_its_body_gets_408(server: tuple[int, str]) -> None:
    port, token = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {token}\r\n".encode()
        + b'Content-Length: 100\r\n\r\n{"name": '
    )
    await writer.drain()
    answer, _ = await closed_within(reader, BODY_TIMEOUT_S + 5)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"application/problem+json" in answer
    writer.close()


async def test_a_slow_upload_that_keeps_moving_is_not_cut_off(
    patient_server: tuple[int, str],
) -> None:
    port, token = patient_server
    body = mlp()
    pieces = [body[i : i + len(body) // 6 + 1] for i in range(0, len(body), len(body) // 6 + 1)]
    gap_s = SLOW_UPLOAD_BODY_TIMEOUT_S / 5
    assert len(pieces) * gap_s > SLOW_UPLOAD_BODY_TIMEOUT_S  # longer in all than the timeout

    async def trickle() -> AsyncIterator[bytes]:
        for piece in pieces:  # never a long pause
            await asyncio.sleep(gap_s)
            yield piece

    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/models?name=slow",
            data=trickle(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/octet-stream",
            },
        ) as response,
    ):
        assert response.status == 201, await response.text()
        # the kept-alive connection serves the next request too
        async with session.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {token}"}
        ) as listed:
            assert listed.status == 200
