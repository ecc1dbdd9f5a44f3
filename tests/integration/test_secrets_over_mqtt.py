"""A job's secret on its whole way, with real agents on the real Mosquitto, on SQLite
and PostgreSQL (issue 24): it reaches its worker's environment, and nowhere else:
not one message on the broker holds it (a subscriber to everything, as the control
plane's account or an open broker would be, sees only ciphertext sealed to the node),
no row of the store, no log line, no view of another tenant or of the job's own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiomqtt
import pytest

from shared.settings import parse_mqtt_url
from tests.api.test_secrets import every_row
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches

pytestmark = pytest.mark.timeout(90)
SECRET = "s3cr3t-Wk93hQ2v"


def worker_node(running: Any) -> str:
    (node_id,) = running.launchers
    return str(node_id)


@contextlib.asynccontextmanager
async def everything_on(url: str, root: str) -> AsyncIterator[list[bytes]]:
    """Every payload published under `root` while the block runs (retained ones too)."""
    endpoint = parse_mqtt_url(url)
    seen: list[bytes] = []
    subscribed = asyncio.Event()

    async def listen() -> None:
        async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
            await client.subscribe(f"{root}/#", qos=1)
            subscribed.set()
            async for message in client.messages:
                if isinstance(message.payload, bytes):
                    seen.append(message.payload)

    task = asyncio.create_task(listen())
    await asyncio.wait_for(subscribed.wait(), 10)
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_secret_reaches_its_worker_and_nothing_else(
    database: DatabaseUnderTest,
    mosquitto_root: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, root = mosquitto_root
    async with (
        everything_on(url, root) as seen,
        fleet(database, mosquitto_root, cloud_nodes=1) as running,
    ):
        api = running.api
        token = await api.tenant("acme")
        other = await api.tenant("globex")
        spec = {
            "name": "with-secret",
            "command": ["python", "train.py"],
            "env": {"EPOCHS": "3"},
            "secret_env": {"AWS_SECRET_ACCESS_KEY": SECRET},
            "estimated_duration_s": 30.0,
        }
        job_id = await api.submitted(token, spec)
        body = await reaches(api, token, job_id, "running")
        # The worker got it, opened on its node from what was sealed to the node.
        (launcher,) = running.launchers.values()
        [(worker, env, _)] = [r for r in launcher.runs if r[0].job_id == job_id]
        assert env["AWS_SECRET_ACCESS_KEY"] == SECRET
        assert env["EPOCHS"] == "3"
        assert worker.secret_names == ("AWS_SECRET_ACCESS_KEY",)
        assert worker.sealed_secrets is not None
        assert worker.sealed_secrets.startswith("hpke1.")

        # Nowhere else: the broker, the store, the views, the logs.
        assert seen, "the subscriber saw nothing"
        assert any(worker.sealed_secrets.encode() in payload for payload in seen)
        assert not [payload for payload in seen if SECRET.encode() in payload]
        assert SECRET not in await every_row(api)
        assert SECRET not in str(body)
        for path in (f"/v1/jobs/{job_id}", "/v1/jobs", f"/v1/jobs/{job_id}/explain"):
            response = await api.get(token, path)
            assert SECRET not in await response.text()
        foreign = await api.get(other, f"/v1/jobs/{job_id}")
        assert foreign.status == 404
        assert SECRET not in await foreign.text()
        # The node says what it is: how it isolates work, that it may receive secrets.
        node = await (await api.get(token, f"/v1/nodes/{worker_node(running)}")).json()
        assert (node["isolation"], node["receives_secrets"]) == ("sandbox", True)
        captured = capsys.readouterr()
        assert SECRET not in captured.out + captured.err
