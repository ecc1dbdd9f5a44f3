"""The control plane rides out a PostgreSQL that cannot be reached for a while (a
restart, a failover): the API answers 503 `store-unavailable` with `Retry-After`, no
background task ends (one that ended stopped the process: cloud/main.py), and once the
database is back requests work and the replica that scheduled leads again.

Before, a connection the database refused was the driver's own error: 500 from the API,
and the death of the node settings and assignments refreshes, the event hub and the
scheduling loop's leadership poll, on API-only replicas as on the leader."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cloud.app_keys import SCHEDULER
from shared.settings import SchedulingSettings
from tests.api.support import Api, job_spec, problem, running_api
from tests.store.test_review6_dbdown import proxied_postgres
from tests.support.control_plane import FAST_LOOP
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(90)

# What each background loop logs when the store is away, and goes on.
LOOPS_THAT_MET_THE_OUTAGE = (
    "node settings not refreshed: store unavailable",  # node_admin.refresh_forever
    "assignments not refreshed: store unavailable",  # assignments.refresh_forever
    "reading the event log failed",  # EventHub.run
)


def assert_every_task_runs(api: Api) -> None:
    ended = {task.get_name(): task for task in api.app_tasks() if task.done()}
    assert not ended, {
        name: task.exception() if not task.cancelled() else "cancelled"
        for name, task in ended.items()
    }


@pytest.mark.parametrize(
    "scheduling", [FAST_LOOP, SchedulingSettings(enabled=False)], ids=["leader", "api-only"]
)
async def test_the_control_plane_answers_503_while_the_database_is_away_and_recovers(
    tmp_path: Path, scheduling: SchedulingSettings
) -> None:
    async with (
        proxied_postgres(tmp_path) as (database, proxy),
        running_api(database, scheduling=scheduling) as api,
    ):
        token = await api.tenant("acme")
        await api.submitted(token, job_spec(name="before"))
        loop = api.app[SCHEDULER] if scheduling.enabled else None
        if loop is not None:
            await eventually(loop.leading.is_set, message="it never led")

        with capture_logs() as logs:
            await proxy.unplug()  # the server now refuses connections, as while it restarts
            for _ in range(3):  # a pooled connection the outage killed, then new ones
                body = await problem(await api.get(token, "/v1/jobs?limit=1"), 503)
                assert body["type"].endswith("store-unavailable")
            response = await api.submit(token, job_spec(name="during"))
            body = await problem(response, 503)
            assert response.headers["Retry-After"] == "1"

            def met_the_outage() -> set[str]:
                return {str(line["event"]) for line in logs} & set(LOOPS_THAT_MET_THE_OUTAGE)

            await eventually(
                lambda: len(met_the_outage()) == len(LOOPS_THAT_MET_THE_OUTAGE),
                timeout_s=20,
                message=lambda: f"only these loops met the outage: {met_the_outage()}",
            )
            if loop is not None:
                # Its lock session ended with the connections: it stops leading, and its
                # poll goes on while the database is away.
                await eventually(lambda: not loop.leading.is_set(), message="it leads on")
                await eventually(
                    lambda: any(
                        line["event"] == "leadership poll failed: store unavailable"
                        for line in logs
                    ),
                    message="its leadership poll never met the outage",
                )
            assert_every_task_runs(api)

        await proxy.plug()

        async def lists_jobs() -> bool:
            return (await api.get(token, "/v1/jobs")).status == 200

        await eventually_async(lists_jobs, message="the API never recovered")
        await api.submitted(token, job_spec(name="after"))
        if loop is not None:
            await eventually(loop.leading.is_set, timeout_s=20, message="it never led again")
        assert_every_task_runs(api)
