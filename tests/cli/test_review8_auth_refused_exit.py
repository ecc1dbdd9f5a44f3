"""A broker that refuses the control plane's login ends `greenfed cloud` with exit status 3
and one line (docs/configuration.md [mqtt]), however many of its MQTT sessions met the
refusal before it stopped: each cleanup context re-raised its own task's copy, and
aiohttp's CleanupError of them ended the command with status 1 and tracebacks. A cleanup
that fails with nothing else on its way out is still reported."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from cloud.app import create_app, serving
from cloud.app_keys import BACKGROUND_TASKS, SETTINGS
from cloud.main import watch_background
from greenfed.arguments import run_command
from shared import secret_hashes
from shared.errors import MqttAuthError
from shared.runtime import run_until_stopped
from shared.settings import Settings, SignalSettings
from shared.tasks import stop_tasks
from tests.store.databases import sqlite_database
from tests.support.brokers import MosquittoProcess, free_port, make_password_file
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

EXIT_AUTH = 3
RUN_TIMEOUT_S = 30.0


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


def _refused(tasks: list[asyncio.Task[None]]) -> int:
    return sum(
        1
        for task in tasks
        if task.done() and not task.cancelled() and isinstance(task.exception(), MqttAuthError)
    )


async def _cloud_once_every_session_is_refused(settings: Settings) -> int:
    """`run_cloud` (cloud/main.py), except that the command acts on the refusal only once
    ingestion and the publisher have both met it: what a loaded machine often did."""
    async with asyncio.timeout(RUN_TIMEOUT_S):
        app = create_app(settings)
        async with serving(app, "127.0.0.1", free_port()):
            tasks = app[BACKGROUND_TASKS]
            await eventually(
                lambda: _refused(tasks) >= 2,
                message=lambda: f"refused sessions: {[t.get_name() for t in tasks if t.done()]}",
            )
            await run_until_stopped(asyncio.Event(), watch_background(tasks))
    return 0


def test_a_refused_login_ends_the_cloud_with_status_3_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    passwords = make_password_file(tmp_path, "greenfed-cloud", "right-secret")
    mosquitto = MosquittoProcess(tmp_path, password_file=passwords)
    asyncio.run(mosquitto.start())
    try:
        settings = Settings(
            mqtt=mqtt_settings(
                mosquitto.url, "auth-exit", username="greenfed-cloud", password="wrong"
            ),
            store=sqlite_database(tmp_path).settings,
            # The shipped traces take seconds to load, and no signal is read here.
            signals=SignalSettings(providers=("static",)),
        )
        handler = lambda _args: asyncio.run(_cloud_once_every_session_is_refused(settings))  # noqa: E731
        status = run_command(argparse.Namespace(handler=handler))
    finally:
        asyncio.run(mosquitto.stop())
    output = capsys.readouterr()
    assert status == EXIT_AUTH, output.err
    lines = output.err.splitlines()
    assert len(lines) == 1, output.err
    assert lines[0].startswith("greenfed: the MQTT broker at ")
    assert "refused the credentials" in lines[0]
    assert "Traceback" not in output.out + output.err


@pytest.fixture
def bare_app() -> web.Application:
    """An app with only what `serving` reads, for cleanup contexts of the tests' own."""
    app = web.Application()
    app[SETTINGS] = Settings()
    return app


def _failing_cleanup(error: Exception) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        yield
        raise error

    return context


async def _serve(app: web.Application, leaving_with: Exception | None = None) -> None:
    """Serve `app`, then leave the block normally or with `leaving_with`."""
    async with asyncio.timeout(RUN_TIMEOUT_S), serving(app, "127.0.0.1", free_port()):
        if leaving_with is not None:
            raise leaving_with


async def test_a_cleanup_failure_with_nothing_else_on_its_way_out_is_raised(
    bare_app: web.Application,
) -> None:
    bare_app.cleanup_ctx.append(_failing_cleanup(RuntimeError("store close failed")))
    with pytest.raises(RuntimeError, match="store close failed"):
        await _serve(bare_app)


async def test_a_cleanup_failure_of_another_kind_is_logged_under_the_error_on_its_way_out(
    bare_app: web.Application,
) -> None:
    bare_app.cleanup_ctx.append(_failing_cleanup(RuntimeError("store close failed")))
    bare_app.cleanup_ctx.append(_failing_cleanup(MqttAuthError("refused, again")))
    with capture_logs() as logs, pytest.raises(MqttAuthError, match="refused first"):
        await _serve(bare_app, leaving_with=MqttAuthError("refused first"))
    warnings = [entry for entry in logs if entry["event"] == "cleanup failed too"]
    assert [str(entry["exc_info"]) for entry in warnings] == ["store close failed"]


async def test_a_contexts_tasks_all_stop_when_the_first_has_failed() -> None:
    async def refused() -> None:
        raise MqttAuthError("refused")

    failed = asyncio.create_task(refused())
    running = asyncio.create_task(asyncio.Event().wait())
    await asyncio.wait([failed])
    with pytest.raises(MqttAuthError, match="refused"):
        await stop_tasks([failed, running], timeout_s=RUN_TIMEOUT_S)
    assert running.cancelled()
