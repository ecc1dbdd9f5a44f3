"""A node that is online but never acknowledges its assignment (here: it trusts another
control plane's key, so it applies nothing) does not hold work `scheduled` for ever:
its document is published again, then the work is requeued with the reason, and once
its attempts are used up it fails instead of waiting."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, fleet, reaches
from tests.support.fleet import TEST_PUBLIC_KEY, mqtt_settings, simulated_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.5


async def test_a_gang_on_a_node_that_never_acknowledges_is_requeued_then_fails(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    scheduling = msgspec.structs.replace(FAST_LOOP, assignment_timeout_s=TIMEOUT_S)
    async with fleet(database, mosquitto_root, cloud_nodes=2, scheduling=scheduling) as running:
        api = running.api
        # a100-1 comes back trusting a key that is not this control plane's.
        await running.stop_agent("a100-1")
        url, root = mosquitto_root
        deaf = simulated_agent(
            "a100-1",
            mqtt_settings(url, root),
            "a100-4x",
            site="cloud",
            zone="DE",
            region="europe-west3",
            telemetry_interval_s=0.2,
            trains=True,
            control_plane_public_key=TEST_PUBLIC_KEY,
        )
        running.tasks["a100-1"] = asyncio.create_task(deaf.run(), name="a100-1")
        await asyncio.wait_for(deaf.announced.wait(), 15)
        token = await api.tenant("acme")
        spec = {
            "name": "gang",
            "command": ["python", "train.py"],
            "workers": 2,
            "accelerators_per_worker": 4,
            "estimated_duration_s": 1.0,
        }
        job_id = await api.submitted(token, spec)
        await eventually(
            lambda: deaf.counters.desired_rejected >= 2,
            timeout_s=10,
            message="the deaf node never got its document again",
        )
        ended = await reaches(api, token, job_id, "failed", timeout_s=30)
        assert "a100-1 did not acknowledge its assignment" in ended["reason"]
        assert ended["attempts"] == api.store.max_attempts
        # Each attempt reached the healthy node, which started its worker, then stopped it.
        started = [spec for spec, _, _ in running.launchers["a100-0"].runs if spec.job_id == job_id]
        assert {spec.attempt for spec in started} <= set(range(1, ended["attempts"] + 1))
