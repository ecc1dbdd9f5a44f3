"""What the HTTP layer answers before, or beside, any handler (issue 25): every error is
application/problem+json, and a malformed request is logged as a warning without a
traceback. Each request is sent over a raw socket, as a broken or hostile client would
send it, to a control plane served as `greenfed cloud` serves it (cloud.app.serving)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from cloud.app import create_app, serving
from greenfed.broker import EmbeddedBroker
from shared.settings import CloudSettings, SchedulingSettings, Settings
from shared.token_files import admin_token_path, read_token_file
from tests.store.databases import sqlite_database
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.onnx_models import mlp
from tests.support.waiting import eventually

PROBLEM = b"application/problem+json"
# Generous: one exchange on the loopback takes milliseconds.
EXCHANGE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def problem(self) -> dict[str, Any]:
        assert self.headers.get("content-type", "").encode() == PROBLEM, self
        body: dict[str, Any] = msgspec.json.decode(self.body)
        assert body["status"] == self.status
        assert body["type"].startswith("https://greenfed.dev/problems/")
        return body


@dataclass(frozen=True)
class Served:
    port: int
    token: str


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    database = sqlite_database(tmp_path)
    async with EmbeddedBroker(port=0) as broker:
        port = free_port()
        settings = Settings(
            mqtt=mqtt_settings(broker.url, "http-layer"),
            # Every malformed request logs (no rate limit), for the tests to see each.
            cloud=CloudSettings(invalid_log_interval_s=0),
            store=database.settings,
            scheduling=SchedulingSettings(enabled=False),
        )
        async with serving(create_app(settings), "127.0.0.1", port):
            token = read_token_file(admin_token_path(database.settings))
            assert token is not None
            yield Served(port, token)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines if line)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(status_line.split()[1]), headers, body)


async def exchange(port: int, *pieces: bytes, close: bool = False) -> Answer | None:
    """Send `pieces` (a pause after each, so they arrive apart) and read one answer;
    with `close`, hang up after the last piece instead (no answer)."""
    async with asyncio.timeout(EXCHANGE_TIMEOUT_S):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.05)
            if close:
                return None
            return await read_answer(reader)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
POST_JOB = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

MALFORMED = {
    "url-too-long": (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri-too-long"),
    "header-too-long": (GET + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n", 431, "header-too-large"),
    "too-many-headers": (
        GET + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
        431,
        "too-many-headers",
    ),
    "content-length-not-a-number": (
        POST_JOB + b"Content-Length: abc\r\n\r\n",
        400,
        "malformed-request",
    ),
    "content-length-negative": (POST_JOB + b"Content-Length: -1\r\n\r\n", 400, "malformed-request"),
    "content-length-twice": (
        POST_JOB + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        400,
        "malformed-request",
    ),
    "content-length-and-chunked": (
        POST_JOB + b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "malformed-request",
    ),
    "unknown-transfer-encoding": (
        POST_JOB + b"Transfer-Encoding: gzip\r\n\r\n",
        400,
        "malformed-request",
    ),
    "bad-chunk-size": (
        POST_JOB + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        400,
        "malformed-request",
    ),
    "not-a-request-line": (b"GARBAGE\r\n\r\n", 400, "bad-request-line"),
    "bad-method": (b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-request-line"),
    "bad-version": (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 400, "bad-request-line"),
    "bad-request-target": (b"GET http://[bad HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-request-line"),
    "header-name-with-a-space": (GET + b"Bad Header: v\r\n\r\n", 400, "malformed-request"),
    "nul-in-a-header": (GET + b"X-A: a\x00b\r\n\r\n", 400, "malformed-request"),
    "folded-header": (GET + b"X-A: a\r\n b\r\n\r\n", 400, "malformed-request"),
    "lf-line-ends": (b"GET /healthz HTTP/1.1\nHost: x\n\n", 400, "bad-request-line"),
    "no-host": (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "malformed-request"),
    "tls-hello": (
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
        400,
        "bad-request-line",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_request_the_parser_refuses_is_a_problem_and_a_warning(
    served: Served, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    raw, status, slug = MALFORMED[case]
    with capture_logs() as logs, caplog.at_level(logging.DEBUG):
        answer = await exchange(served.port, raw)
    assert answer is not None
    assert answer.status == status
    assert answer.problem()["type"].endswith("/" + slug)
    (line,) = [entry for entry in logs if entry["event"] == "malformed request"]
    assert line["log_level"] == "warning"
    assert line["status"] == status
    assert "exc_info" not in line
    assert b"aaaa" not in answer.body  # the request's bytes are not echoed back
    assert_no_error_logs(logs, caplog)


def assert_no_error_logs(
    logs: list[MutableMapping[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    assert [e for e in logs if e["log_level"] in ("error", "critical") or "exc_info" in e] == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []


async def test_a_body_that_breaks_while_the_handler_reads_it_is_a_400_at_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    auth = f"Authorization: Bearer {served.token}\r\n".encode()
    with capture_logs() as logs, caplog.at_level(logging.DEBUG):
        # A chunk size that is not hex, arriving after the head was dispatched.
        late_chunk = await exchange(
            served.port,
            POST_JOB + auth + b"Transfer-Encoding: chunked\r\n\r\n",
            b'5\r\n{"a":\r\n',
            b"zz\r\nabc\r\n",
        )
        # A gzip body that does not decompress.
        undecodable = await exchange(
            served.port,
            POST_JOB + auth + b"Content-Encoding: gzip\r\nContent-Length: 5\r\n\r\nabcde",
        )
        # A client that hangs up halfway through its body: nobody to answer.
        await exchange(
            served.port, POST_JOB + auth + b'Content-Length: 100\r\n\r\n{"name":', close=True
        )
        # Unknown expectations are refused before any handler (aiohttp's own 417).
        expectation = await exchange(
            served.port, POST_JOB + auth + b"Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}"
        )
        # The hung-up request's handler ends in its own time (a busy machine delays it).
        await eventually(
            lambda: any(e["event"] == "client went away" for e in logs),
            message=lambda: f"no 'client went away' among {[e['event'] for e in logs]}",
        )
    for answer, status in ((late_chunk, 400), (undecodable, 400), (expectation, 417)):
        assert answer is not None
        assert answer.status == status
        assert answer.problem()["instance"] == "/v1/jobs"
    assert late_chunk is not None
    assert undecodable is not None
    assert late_chunk.problem()["type"].endswith("/malformed-body")
    assert "chunk size" in late_chunk.problem()["detail"]
    assert "content-encoding" in undecodable.problem()["detail"]
    warned = [e for e in logs if e["event"] == "malformed request body"]
    assert [e["log_level"] for e in warned] == ["warning", "warning"]
    assert any(e["event"] == "client went away" and e["log_level"] == "info" for e in logs)
    assert_no_error_logs(logs, caplog)


async def test_a_model_download_that_cannot_be_served_as_asked_is_a_problem(
    served: Served,
) -> None:
    upload = await exchange(
        served.port,
        b"POST /v1/models?name=mlp HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {served.token}\r\n".encode()
        + b"Content-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(mlp())}\r\n\r\n".encode()
        + mlp(),
    )
    assert upload is not None
    assert upload.status == 201, upload
    model_id = msgspec.json.decode(upload.body)["id"]
    size = len(mlp())

    async def blob(*headers: str) -> Answer:
        answer = await exchange(
            served.port,
            f"GET /v1/models/{model_id}/blob HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {served.token}\r\n".encode()
            + "".join(f"{header}\r\n" for header in headers).encode()
            + b"\r\n",
        )
        assert answer is not None
        return answer

    for ranges in (f"Range: bytes={size + 10}-", "Range: bytes=abc"):
        refused = await blob(ranges)
        assert refused.status == 416
        assert refused.headers["content-range"] == f"bytes */{size}"
        assert f"bytes */{size}" in refused.problem()["detail"]
        assert "content-disposition" not in refused.headers
    failed = await blob('If-Match: "not-this-file"')
    assert failed.status == 412
    assert "If-Match" in failed.problem()["detail"]
    part = await blob("Range: bytes=0-9")
    assert (part.status, len(part.body)) == (206, 10)
    assert part.headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize("path", [b"/metrics", b"/v1/jobs"])
@pytest.mark.parametrize("token", [b"\xff\xfe", b"caf\xe9"])
async def test_a_bearer_token_that_is_not_utf8_is_a_401(
    served: Served, path: bytes, token: bytes
) -> None:
    # The header's undecodable bytes reach handlers as surrogates: /metrics compared
    # them with the scrape token by encoding them, and answered 500.
    raw = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\n\r\n"
    answer = await exchange(served.port, raw)
    assert answer is not None
    assert answer.status == 401
    assert answer.problem()["type"].endswith("/invalid-token")
