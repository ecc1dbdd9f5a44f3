"""Shared fixtures: the brokers every integration test runs against, and isolation.

Integration tests run against the embedded broker always and against the real
Mosquitto (127.0.0.1:1883) when reachable; CI sets GREENFED_TEST_REQUIRE_SERVICES=1
so an unreachable Mosquitto fails the run instead of being skipped.

Property tests run without Hypothesis's per-example deadline (200 ms by default): the
suite runs on two shared, loaded cores in CI, where an example that takes 100 ms alone
takes 300 ms beside other work, and a deadline failure there says nothing about the code.
The profile is loaded here, before any test module is imported, because a test's own
`@settings(...)` takes every value it does not name from the profile loaded when the
decorator runs; tests/test_review7_hypothesis_deadlines.py keeps tests from setting a
deadline again. Everything else (max_examples, ...) stays as Hypothesis loaded it (its
`ci` profile where a CI variable is set), and `--hypothesis-profile` still overrides.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

from greenfed.broker import EmbeddedBroker
from tests.store.databases import DatabaseUnderTest, postgres_database, sqlite_database
from tests.support.brokers import (
    MOSQUITTO_URL,
    BrokerUnderTest,
    clear_retained,
    require_or_skip,
    tcp_reachable,
)

settings.register_profile("greenfed", deadline=None)
settings.load_profile("greenfed")

# The real Slurm cluster of the Slurm tests (`slurm`, one per session, started on first use).
pytest_plugins = ("tests.support.slurm",)


@pytest.fixture(autouse=True)
def structlog_as_found() -> Iterator[None]:
    """A test that configures logging (the CLI's `main` does, at level error for some
    commands) leaves structlog as it found it: a later test's `capture_logs` would see
    nothing below that level."""
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def terminal_size_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables are as wide as the command decides (160 columns into a pipe), whatever the
    process that runs the tests says: pytest-xdist's workers set COLUMNS=80. A test that
    wants a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(params=["embedded", "mosquitto"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[BrokerUnderTest]:
    if request.param == "embedded":
        async with EmbeddedBroker(port=0) as embedded:
            yield BrokerUnderTest("embedded", embedded.url)
        return
    if not tcp_reachable(MOSQUITTO_URL):
        require_or_skip(f"no MQTT broker at {MOSQUITTO_URL}")
    yield BrokerUnderTest("mosquitto", MOSQUITTO_URL)


@pytest.fixture
async def topic_root(broker: BrokerUnderTest) -> AsyncIterator[str]:
    """A topic root of its own per test, so retained messages never leak between tests;
    on the persistent Mosquitto they are deleted afterwards."""
    root = f"gftest-{uuid.uuid4().hex[:12]}"
    yield root
    if broker.kind == "mosquitto":
        await clear_retained(broker.url, root)


@pytest.fixture
async def mosquitto_root() -> AsyncIterator[tuple[str, str]]:
    """(url, topic root) on the real Mosquitto only, for what the embedded broker cannot show
    (it dies with the process that runs it)."""
    if not tcp_reachable(MOSQUITTO_URL):
        require_or_skip(f"no MQTT broker at {MOSQUITTO_URL}")
    root = f"gftest-{uuid.uuid4().hex[:12]}"
    yield MOSQUITTO_URL, root
    await clear_retained(MOSQUITTO_URL, root)


@pytest.fixture(params=["sqlite", "postgresql"])
async def database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[DatabaseUnderTest]:
    """An empty store database per test: a SQLite file in tmp_path, or a schema of its own
    on the real PostgreSQL (127.0.0.1:5432, database `test`), dropped afterwards. An
    unreachable PostgreSQL is skipped, and fails the run under GREENFED_TEST_REQUIRE_SERVICES=1."""
    if request.param == "sqlite":
        yield sqlite_database(tmp_path)
        return
    async with postgres_database(tmp_path) as database:
        yield database
