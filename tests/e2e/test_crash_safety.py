"""Nothing acknowledged is lost: SIGKILL the control plane in the middle of 1,000
submissions, restart it, and check that every job that got a 201 is there, once.

The client behaves as a careful user does: each submission carries an
`Idempotency-Key` and is retried with the same key until it gets an answer, so a
submission whose 201 was lost with the process is answered by the restarted one
with the original job (200) instead of a second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from greenfed.broker import EmbeddedBroker
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import free_port
from tests.support.processes import GreenfedProcess, greenfed_env
from tests.support.waiting import eventually, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SUBMISSIONS = 1000
CONCURRENCY = 8
KILL_AFTER = 300  # acknowledged submissions before the SIGKILL


def _store_env(database: DatabaseUnderTest) -> dict[str, str]:
    settings = database.settings
    env = {"GREENFED_STORE__DATA_DIR": str(settings.data_dir)}
    if settings.database_url:
        env["GREENFED_STORE__DATABASE_URL"] = settings.database_url
    if settings.database_schema:
        env["GREENFED_STORE__DATABASE_SCHEMA"] = settings.database_schema
    return env


async def _ready(api: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{api}/healthz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


class Cloud:
    def __init__(self, workdir: Path, env: dict[str, str], api: str, token_file: Path) -> None:
        self.workdir, self.env, self.api, self.token_file = workdir, env, api, token_file
        self.process: GreenfedProcess | None = None
        self.starts = 0

    async def start(self) -> None:
        self.process = await GreenfedProcess(["cloud"], self.workdir, self.env).start()
        self.starts += 1
        process = self.process
        await eventually_async(
            lambda: _ready(self.api), timeout_s=30, message=lambda: process.stderr[-2000:]
        )
        await eventually(self.token_file.exists, timeout_s=10, message="no admin token")

    async def kill(self) -> None:
        assert self.process is not None
        code, _ = await self.process.stop(signal.SIGKILL)
        assert code == -signal.SIGKILL


@contextlib.asynccontextmanager
async def cloud(tmp_path: Path, database: DatabaseUnderTest) -> AsyncIterator[Cloud]:
    port = free_port()
    async with EmbeddedBroker(port=0) as broker:
        env = greenfed_env(
            GREENFED_CLOUD__API_PORT=str(port),
            GREENFED_MQTT__URL=broker.url,
            GREENFED_MQTT__TOPIC_ROOT="crashtest",
            **_store_env(database),
        )
        running = Cloud(
            tmp_path,
            env,
            f"http://127.0.0.1:{port}",
            Path(database.settings.data_dir or "") / "admin-token",
        )
        await running.start()
        try:
            yield running
        finally:
            if running.process is not None:
                await running.process.stop(signal.SIGTERM)


async def _submit_until_answered(
    http: aiohttp.ClientSession, api: str, token: str, index: int
) -> tuple[int, str]:
    """(status, job id) of the first answer; the same key on every retry."""
    body = {"name": f"job-{index}", "command": ["true"], "estimated_duration_s": 60}
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": f"submission-{index}"}
    while True:
        try:
            async with http.post(f"{api}/v1/jobs", json=body, headers=headers) as response:
                if response.status in (200, 201):
                    return response.status, (await response.json())["id"]
                assert response.status >= 500, await response.text()
        except (TimeoutError, aiohttp.ClientConnectionError):
            pass
        await asyncio.sleep(0.05)  # the server is down or restarting: try again


async def _all_jobs(http: aiohttp.ClientSession, api: str, token: str) -> list[dict[str, str]]:
    jobs: list[dict[str, str]] = []
    cursor = ""
    while True:
        url = f"{api}/v1/jobs?limit=200" + (f"&cursor={cursor}" if cursor else "")
        async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status == 200, await response.text()
            page = await response.json()
        jobs.extend(page["items"])
        if not page["next_cursor"]:
            return jobs
        cursor = page["next_cursor"]


async def test_sigkill_during_a_thousand_submissions_loses_and_duplicates_nothing(
    tmp_path: Path, database: DatabaseUnderTest
) -> None:
    async with cloud(tmp_path, database) as running, aiohttp.ClientSession() as http:
        admin = running.token_file.read_text().split()[-1]
        async with http.post(
            f"{running.api}/v1/tenants",
            json={"name": "acme"},
            headers={"Authorization": f"Bearer {admin}"},
        ) as response:
            assert response.status == 201, await response.text()
            token = (await response.json())["token"]

        answers: dict[int, tuple[int, str]] = {}
        next_index = iter(range(SUBMISSIONS))
        killed = asyncio.Event()

        async def client() -> None:
            for index in next_index:
                answers[index] = await _submit_until_answered(http, running.api, token, index)
                if len(answers) >= KILL_AFTER and not killed.is_set():
                    killed.set()
                    await running.kill()
                    await running.start()

        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        assert running.starts == 2

        acknowledged = {job_id for status, job_id in answers.values() if status == 201}
        jobs = await _all_jobs(http, running.api, token)
        ids = [job["id"] for job in jobs]
        names = [job["name"] for job in jobs]
        assert len(answers) == SUBMISSIONS
        assert acknowledged <= set(ids), "a job acknowledged with 201 is missing"
        assert len(ids) == len(set(ids)) == SUBMISSIONS, "a job is duplicated or missing"
        assert sorted(names) == sorted(f"job-{i}" for i in range(SUBMISSIONS))
        # Every answer, 201 or a retry's 200, names the one job its key created.
        by_name = {job["name"]: job["id"] for job in jobs}
        assert all(by_name[f"job-{i}"] == job_id for i, (_, job_id) in answers.items())
