"""Two control-plane replicas on one database: both serve the API, one schedules; when
the leader stops scheduling, the other takes over and work keeps flowing."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from cloud.app_keys import SCHEDULER
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, fleet, reaches
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)


def job(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": 0.5}


async def test_a_second_replica_serves_the_api_and_takes_over_scheduling(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    quick = dataclasses.replace(
        database, settings=msgspec.structs.replace(database.settings, leader_poll_interval_s=0.1)
    )
    async with fleet(quick, mosquitto_root, cloud_nodes=1) as running:
        first = running.api
        leader = first.app[SCHEDULER]
        await eventually(leader.leading.is_set, timeout_s=10, message="the first never led")
        token = await first.tenant("acme")
        url, root = mosquitto_root
        async with running_api(
            quick, mqtt=mqtt_settings(url, root), scheduling=FAST_LOOP
        ) as second:
            standby = second.app[SCHEDULER]
            # Submitted through the replica that does not schedule: the leader places it.
            placed_by_leader = await second.submitted(token, job("through-the-standby"))
            await reaches(second, token, placed_by_leader, "succeeded")
            assert not standby.leading.is_set()
            assert standby.stats.passes == 0

            # The leader stops scheduling (as when its process ends): the standby leads.
            loop_task = next(t for t in first.app_tasks() if t.get_name() == "scheduling-loop")
            loop_task.cancel()
            await eventually(standby.leading.is_set, timeout_s=10, message="no takeover")
            after = await second.submitted(token, job("after-the-takeover"))
            await reaches(second, token, after, "succeeded")
            assert standby.stats.passes > 0
