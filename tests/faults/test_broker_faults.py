"""The broker dies under a running, enrolled fleet; the control plane must not mistake
its own broker trouble for fleet failure.

- `kill -9` of a Mosquitto without persistence, then a restart: every node is back,
  no running work was restarted, and every node's signed `desired` document is on
  the broker again (the control plane republishes on reconnection).
- A long outage (GREENFED_FAULT_OUTAGE_S, 20 s by default here: twenty node-lost
  grace periods and 33 staleness deadlines; benchmarks/RESULTS.md records a 120 s
  run of this same test): no node is lost, no work restarted, and work submitted
  during the outage (the REST API keeps answering) runs once the broker is back.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, reaches, work
from tests.support.enrolled_fleet import EnrolledFleet, enrolled_fleet
from tests.support.waiting import eventually, eventually_async

OUTAGE_S = float(os.environ.get("GREENFED_FAULT_OUTAGE_S", "20"))
pytestmark = pytest.mark.timeout(90 + 2 * OUTAGE_S)

# Grace 1 s: an outage of OUTAGE_S would lose every node many times over if the
# control plane judged nodes while it is itself off the broker.
SCHEDULING = msgspec.structs.replace(FAST_LOOP, node_lost_grace_s=1.0, assignment_timeout_s=2.0)
LONG_S = 3600.0  # simulated run time of the job that must survive: it never ends here


def long_job(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": LONG_S}


def short_job(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": 0.5}


async def all_back(running: EnrolledFleet, timeout_s: float) -> float:
    """Seconds until every started node is online and heard from again (a sample after
    this call: the registry's view from before the fault does not count)."""
    registry = running.api.app[REGISTRY]
    since_s = registry.monotonic()

    def back() -> bool:
        for node_id, node in running.nodes.items():
            record = registry.get(node_id)
            if node.task is None:
                continue
            if record is None or record.state != "online" or record.last_seen_monotonic <= since_s:
                return False
        return True

    await eventually(back, timeout_s=timeout_s, message=lambda: f"not back: {running.states()}")
    return registry.monotonic() - since_s


def starts_of(running: EnrolledFleet, job_id: str) -> int:
    """How many workers of the job the fleet's nodes started (one: never restarted)."""
    return sum(
        spec.job_id == job_id
        for node in running.nodes.values()
        for spec, _, _ in node.launcher.runs
    )


async def running_job(running: EnrolledFleet, token: str) -> dict[str, object]:
    job_id = await running.api.submitted(token, long_job("survivor"))
    return await reaches(running.api, token, job_id, "running")


@pytest.mark.parametrize("database", ["sqlite", "postgresql"], indirect=True)
async def test_a_killed_broker_without_persistence_loses_no_node_no_work_and_no_desired(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with enrolled_fleet(database, tmp_path, scheduling=SCHEDULING) as running:
        api = running.api
        token = await api.tenant("acme")
        survivor = await running_job(running, token)
        before = await running.retained_desired()  # nodes given work have a document
        assert before

        await running.broker.kill()  # SIGKILL: no wills, no retained state kept
        await running.broker.start()
        recovery_s = await all_back(running, timeout_s=30)

        async def republished() -> bool:
            return set(await running.retained_desired()) == set(before)

        await eventually_async(republished, timeout_s=20, message="desired not republished")
        after = await work(api, token, str(survivor["id"]))
        assert after["state"] == "running"
        assert after["attempts"] == survivor["attempts"]  # not restarted
        # The worker kept running on its node: one start, no stop.
        assert starts_of(running, str(survivor["id"])) == 1
        print(f"broker kill -9: nodes back in {recovery_s:.2f} s")


# One backend: the outage is the broker's; the kill test above covers both stores.
@pytest.mark.parametrize("database", ["postgresql"], indirect=True)
async def test_a_long_broker_outage_loses_no_node_restarts_nothing_and_loses_nothing(
    database: DatabaseUnderTest, tmp_path: Path
) -> None:
    async with enrolled_fleet(database, tmp_path, scheduling=SCHEDULING) as running:
        api = running.api
        token = await api.tenant("acme")
        survivor = await running_job(running, token)

        await running.broker.kill()
        outage_started = time.monotonic()
        # The API keeps taking work while the fleet is out of reach: acknowledged
        # submissions must run once the broker is back.
        during = [await api.submitted(token, short_job(f"during-{i}")) for i in range(3)]
        await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_started)))
        await running.broker.start()
        recovery_s = await all_back(running, timeout_s=30)

        for job_id in during:
            await reaches(api, token, job_id, "succeeded", timeout_s=30)
        after = await work(api, token, str(survivor["id"]))
        assert after["state"] == "running"
        assert after["attempts"] == survivor["attempts"]
        assert starts_of(running, str(survivor["id"])) == 1
        print(f"broker outage {OUTAGE_S:.0f} s: nodes back in {recovery_s:.2f} s")
