"""The metrics scrape token file (`<store.data_dir>/metrics-token`) when what is there is
not what the control plane wrote: a file that is not text stops `greenfed cloud` with one
line naming the file and the setting (exit status 2), and is left as it was; one that
cannot be read is a warning naming both, and the control plane serves on."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from cloud.app import create_app
from shared.settings import ConfigError, SchedulingSettings, Settings
from shared.token_files import metrics_token_path
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import free_port
from tests.support.fleet import mqtt_settings
from tests.support.processes import greenfed_env

pytestmark = pytest.mark.timeout(90)

EXIT_USAGE = 2
# What a disk error or a file copied over the token file by mistake leaves there.
NOT_TEXT = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\xfd"


def store_environment(database: DatabaseUnderTest) -> dict[str, str]:
    settings = database.settings
    variables = {"GREENFED_STORE__DATA_DIR": settings.data_dir}
    if database.kind == "postgresql":
        variables["GREENFED_STORE__DATABASE_URL"] = settings.database_url
        variables["GREENFED_STORE__DATABASE_SCHEMA"] = settings.database_schema
    return variables


def token_file_holding(database: DatabaseUnderTest, content: bytes) -> Path:
    path = metrics_token_path(database.settings)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(content)
    path.chmod(0o600)
    return path


async def test_greenfed_cloud_refuses_a_token_file_that_is_not_text_in_one_line(
    database: DatabaseUnderTest,
) -> None:
    path = token_file_holding(database, NOT_TEXT)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "greenfed.cli",
        "cloud",
        "--api-host",
        "127.0.0.1",
        "--api-port",
        str(free_port()),
        "--mqtt-url",
        "mqtt://127.0.0.1:1",  # never reached: the store comes first
        "--log-level",
        "error",
        env=greenfed_env(**store_environment(database)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    said = err.decode()
    assert process.returncode == EXIT_USAGE, said  # before: a traceback, exit status 1
    assert said == (
        f"greenfed: configuration error: store.data_dir: {path} is not a token file: it is "
        "not text; remove it and the control plane writes the metrics scrape token there "
        "at its next start\n"
    )
    assert path.read_bytes() == NOT_TEXT  # not overwritten: it may be no file of ours


async def test_the_refusal_is_a_config_error_keyed_by_the_setting(
    database: DatabaseUnderTest,
) -> None:
    token_file_holding(database, NOT_TEXT)
    settings = Settings(
        mqtt=mqtt_settings("mqtt://127.0.0.1:1", "scrape-token"),
        store=database.settings,
        scheduling=SchedulingSettings(enabled=False),
    )
    runner = web.AppRunner(create_app(settings))
    try:
        with pytest.raises(ConfigError) as refused:
            await runner.setup()  # the app's start: its store, then its tokens
    finally:
        await runner.cleanup()
    assert refused.value.key == "store.data_dir"


async def test_a_token_file_that_cannot_be_read_is_a_warning_naming_the_setting(
    database: DatabaseUnderTest,
) -> None:
    path = metrics_token_path(database.settings)
    path.mkdir(parents=True)  # read as a file: IsADirectoryError, whoever runs the test
    with capture_logs() as logs:
        async with running_api(database) as api:
            response = await api.client.get("/healthz")
            assert response.status == 200  # not fatal: admin tokens still see every series
    [warning] = [entry for entry in logs if entry.get("metrics_token_file") == str(path)]
    assert warning["log_level"] == "warning"
    assert warning["setting"] == "store.data_dir"
    assert "Is a directory" in warning["error"]
