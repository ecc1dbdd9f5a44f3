"""Logging setup: JSON lines with bound context, stdlib records too, and rate-limited warnings."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

import shared.logs
from shared.logs import RateLimitedLog, configure_logging

NOISY_LOGGERS = ("amqtt", "transitions", "aiohttp.access", "asyncio")


class FakeMonotonic:
    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(autouse=True)
def restore_logging(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """configure_logging changes process-wide state; put it back for the other tests.

    pytest adds its capture handlers to the root logger per test phase, so those of
    the setup phase are not put back (they are gone by now) and those of the
    teardown phase are kept.
    """
    root = logging.getLogger()
    pytest_phase_handler = type(caplog.handler)
    session_handlers = [h for h in root.handlers if not isinstance(h, pytest_phase_handler)]
    level = root.level
    noisy_levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    structlog_config = structlog.get_config()
    yield
    structlog.contextvars.clear_contextvars()
    structlog.configure(**structlog_config)
    phase_handlers: list[logging.Handler] = [
        h for h in root.handlers if isinstance(h, pytest_phase_handler)
    ]
    root.handlers[:] = session_handlers + phase_handlers
    root.setLevel(level)
    for name, noisy_level in noisy_levels.items():
        logging.getLogger(name).setLevel(noisy_level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_format_writes_one_object_per_line_with_level_timestamp_and_event() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    log = structlog.get_logger("greenfed.test")

    log.info("node joined", node_count=3)
    log.warning("probe slow", probe="nvidia")

    first, second = json_lines(stream)
    assert first["event"] == "node joined"
    assert first["level"] == "info"
    assert first["node_count"] == 3
    assert second["level"] == "warning"
    assert second["probe"] == "nvidia"
    assert datetime.fromisoformat(first["timestamp"]).utcoffset() == timedelta(0)


def test_context_bound_once_rides_along_on_every_line() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    log = structlog.get_logger("greenfed.test")

    structlog.contextvars.bind_contextvars(node_id="t4-frankfurt-1", job_id="job-9")
    log.info("started")
    log.info("finished")
    structlog.contextvars.clear_contextvars()
    log.info("unbound")

    lines = json_lines(stream)
    assert [(line.get("node_id"), line.get("job_id")) for line in lines] == [
        ("t4-frankfurt-1", "job-9"),
        ("t4-frankfurt-1", "job-9"),
        (None, None),
    ]


def test_stdlib_logging_records_are_rendered_as_the_same_json_lines() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    structlog.contextvars.bind_contextvars(node_id="n1")

    logging.getLogger("aiohttp.server").warning("connection from %s reset", "10.0.0.1")

    (line,) = json_lines(stream)
    assert line["event"] == "connection from 10.0.0.1 reset"
    assert line["level"] == "warning"
    assert line["node_id"] == "n1"
    assert "timestamp" in line


def test_lines_below_the_configured_level_are_dropped() -> None:
    stream = io.StringIO()
    configure_logging("warning", "json", stream)

    structlog.get_logger("greenfed.test").info("chatty")
    logging.getLogger("some.library").info("chatty too")
    structlog.get_logger("greenfed.test").error("broken")

    assert [line["event"] for line in json_lines(stream)] == ["broken"]


def test_chatty_libraries_are_held_to_warnings_even_at_debug_level() -> None:
    stream = io.StringIO()
    configure_logging("debug", "json", stream)

    logging.getLogger("amqtt.broker").info("client connected")
    logging.getLogger("amqtt.broker").warning("client dropped")
    logging.getLogger("greenfed.cloud").debug("own debug line")

    assert [line["event"] for line in json_lines(stream)] == [
        "client dropped",
        "own debug line",
    ]


def test_auto_format_writes_json_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    configure_logging("info", "auto", stream)
    structlog.get_logger("greenfed.test").info("hello")
    assert json_lines(stream)[0]["event"] == "hello"


def test_console_format_writes_readable_text_for_a_person() -> None:
    stream = io.StringIO()
    configure_logging("info", "console", stream)
    structlog.get_logger("greenfed.test").info("hello there", node_id="n1")

    text = stream.getvalue()
    assert "hello there" in text
    assert "node_id" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


@pytest.fixture
def fake_monotonic(monkeypatch: pytest.MonkeyPatch) -> FakeMonotonic:
    clock = FakeMonotonic()
    # Only the logs module sees the fake clock; the rest of the process keeps the real one.
    monkeypatch.setattr(shared.logs, "time", SimpleNamespace(monotonic=clock))
    return clock


@pytest.fixture
def json_stream() -> io.StringIO:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    return stream


def test_rate_limited_log_writes_the_first_warning_for_a_key(
    fake_monotonic: FakeMonotonic, json_stream: io.StringIO
) -> None:
    limited = RateLimitedLog(structlog.get_logger("greenfed.ingest"), interval_s=10.0)

    assert limited.warning("telemetry/malformed_json", "payload dropped", topic="t1") is True

    (line,) = json_lines(json_stream)
    assert line["event"] == "payload dropped"
    assert line["level"] == "warning"
    assert line["topic"] == "t1"
    assert line["suppressed_since_last"] == 0


def test_rate_limited_log_suppresses_repeats_within_the_interval_and_counts_them(
    fake_monotonic: FakeMonotonic, json_stream: io.StringIO
) -> None:
    limited = RateLimitedLog(structlog.get_logger("greenfed.ingest"), interval_s=10.0)

    limited.warning("key", "dropped", n=0)
    fake_monotonic.now_s += 3.0
    suppressed = [limited.warning("key", "dropped", n=n) for n in range(1, 6)]
    fake_monotonic.now_s += 6.9
    suppressed.append(limited.warning("key", "dropped", n=6))

    assert suppressed == [False] * 6
    assert len(json_lines(json_stream)) == 1

    fake_monotonic.now_s += 0.2  # now 10.1 s after the first line
    assert limited.warning("key", "dropped", n=7) is True

    lines = json_lines(json_stream)
    assert [line["n"] for line in lines] == [0, 7]
    assert lines[1]["suppressed_since_last"] == 6


def test_the_suppressed_count_starts_again_after_it_is_reported(
    fake_monotonic: FakeMonotonic, json_stream: io.StringIO
) -> None:
    limited = RateLimitedLog(structlog.get_logger("greenfed.ingest"), interval_s=5.0)

    limited.warning("key", "dropped")
    limited.warning("key", "dropped")
    fake_monotonic.now_s += 5.0
    limited.warning("key", "dropped")
    fake_monotonic.now_s += 5.0
    limited.warning("key", "dropped")

    assert [line["suppressed_since_last"] for line in json_lines(json_stream)] == [0, 1, 0]


def test_each_key_is_limited_on_its_own(
    fake_monotonic: FakeMonotonic, json_stream: io.StringIO
) -> None:
    limited = RateLimitedLog(structlog.get_logger("greenfed.ingest"), interval_s=10.0)

    assert limited.warning("telemetry/oversized", "dropped", topic="a") is True
    assert limited.warning("status/malformed_json", "dropped", topic="b") is True
    assert limited.warning("telemetry/oversized", "dropped", topic="a") is False

    assert [line["topic"] for line in json_lines(json_stream)] == ["a", "b"]


def test_an_interval_of_zero_logs_every_line(
    fake_monotonic: FakeMonotonic, json_stream: io.StringIO
) -> None:
    limited = RateLimitedLog(structlog.get_logger("greenfed.ingest"), interval_s=0.0)
    assert all(limited.warning("key", "dropped") for _ in range(5))
    assert len(json_lines(json_stream)) == 5
