"""`greenfed_scheduling_last_pass_seconds` is the leader's alone: a replica that lost
leadership exports no sample of it (as `greenfed_work_pending`), so that the queue
dashboard's max across replicas shows the pass of the replica that leads now, not the
frozen last pass of one that led before."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from cloud.app_keys import SCHEDULER
from cloud.store.locks import advisory_key
from tests.api.support import Api, bearer, running_api
from tests.store.databases import POSTGRES_URL, postgres_database
from tests.store.leader_lock import end_leader_session
from tests.support.control_plane import FAST_LOOP
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(60)


async def scheduling_samples(api: Api) -> dict[str, float]:
    response = await api.client.get("/metrics", headers=bearer(api.admin_token))
    assert response.status == 200
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(await response.text())
        for sample in family.samples
        if sample.name.startswith("greenfed_scheduling_")
    }


@contextlib.asynccontextmanager
async def rival_session() -> AsyncIterator[AsyncConnection]:
    """A session of another replica's, on the same server."""
    engine = create_async_engine(make_url(POSTGRES_URL).set(drivername="postgresql+asyncpg"))
    try:
        async with engine.connect() as connection:
            yield connection
    finally:
        await engine.dispose()


async def test_a_replica_that_lost_leadership_exports_no_last_pass_duration(
    tmp_path: Path,
) -> None:
    async with (
        postgres_database(tmp_path) as database,
        running_api(database, scheduling=FAST_LOOP) as api,
    ):
        loop = api.app[SCHEDULER]
        await eventually(lambda: loop.stats.passes > 0, message="it never ran a pass")
        leading = await scheduling_samples(api)
        assert leading["greenfed_scheduling_leader"] == 1
        assert "greenfed_scheduling_last_pass_seconds" in leading

        schema = database.settings.database_schema
        assert schema is not None
        async with rival_session() as rival:

            async def rival_leads() -> bool:
                """Another replica takes the lock once this one's session is gone."""
                lock = select(func.pg_try_advisory_lock(advisory_key(schema, "leader")))
                taken = bool((await rival.execute(lock)).scalar())
                await rival.commit()
                if not taken and loop.leading.is_set():
                    await end_leader_session(api.store, schema)
                return taken

            await eventually_async(rival_leads, timeout_s=20, message="the rival never led")
            await eventually(lambda: not loop.leading.is_set(), message="it leads on")
            former = await scheduling_samples(api)
            assert former["greenfed_scheduling_leader"] == 0
            assert "greenfed_scheduling_last_pass_seconds" not in former, former
            assert former["greenfed_scheduling_passes_total"] > 0  # its counters stay

        # The rival's session ended: this replica leads again, and exports its passes.
        await eventually(loop.leading.is_set, timeout_s=20, message="it never led again")

        async def exports_its_pass() -> bool:
            return "greenfed_scheduling_last_pass_seconds" in await scheduling_samples(api)

        await eventually_async(exports_its_pass, message="no pass duration while leading")
