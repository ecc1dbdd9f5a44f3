"""An API-only replica's submissions wake the scheduling leader in another process
(its own app, store and engine) through PostgreSQL NOTIFY: with `interval_s` at an
hour, nothing else would make the leader look at the queue."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from cloud.app_keys import SCHEDULER
from tests.api.support import Api, running_api
from tests.store.databases import POSTGRES_URL, postgres_database
from tests.support.control_plane import FAST_LOOP, fleet, work
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(90)

# Only a notification wakes the passes: no interval pass within the test.
HOUR_LOOP = msgspec.structs.replace(FAST_LOOP, interval_s=3600.0, full_pass_interval_s=3600.0)


def job(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": 600}


async def placed(api: Api, token: str, work_id: str) -> None:
    seen: dict[str, object] = {}

    async def out_of_the_queue() -> bool:
        seen.update(await work(api, token, work_id))
        return seen["state"] != "pending"

    await eventually_async(
        out_of_the_queue,
        timeout_s=15,
        interval_s=0.05,
        message=lambda: f"{work_id} still {seen.get('state')} ({seen.get('reason')})",
    )


async def terminate_backend(pid: int) -> None:
    engine = create_async_engine(make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.begin() as connection:
            query = text("SELECT pg_terminate_backend(:pid)")
            assert (await connection.execute(query, {"pid": pid})).scalar() is True
    finally:
        await engine.dispose()


async def test_a_submission_to_an_api_replica_wakes_the_leader_in_another_process(
    tmp_path: Path, mosquitto_root: tuple[str, str]
) -> None:
    async with (
        postgres_database(tmp_path) as database,
        fleet(database, mosquitto_root, cloud_nodes=1, scheduling=HOUR_LOOP) as running,
    ):
        leader = running.api.app[SCHEDULER]
        await eventually(leader.leading.is_set, timeout_s=10, message="no leader")
        token = await running.api.tenant("acme")
        url, root = mosquitto_root
        # The replica: scheduling off, a store and engine of its own.
        async with running_api(database, mqtt=mqtt_settings(url, root)) as replica:
            await placed(replica, token, await replica.submitted(token, job("first")))

            # The leader's listening connection is killed: it comes back and wakes again.
            listener = running.api.store.change_listener
            assert listener is not None
            assert listener.backend_pid is not None
            await terminate_backend(listener.backend_pid)
            await eventually(lambda: listener.connects == 2, message="no reconnect")
            notified = listener.notified
            await placed(replica, token, await replica.submitted(token, job("second")))
            assert listener.notified > notified
