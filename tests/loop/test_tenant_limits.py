"""Tenant changes in the live loop: a lowered quota or running cap takes effect at the
next pass and evicts nothing that runs; work over `max_running` waits with a quota
reason that counts what the tenant really holds. Real agents, both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cloud.app_keys import SCHEDULER
from tests.api.support import Api, bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(120)


def long_job(name: str, gpus: int) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["python", "train.py"],
        "accelerators_per_worker": gpus,
        "estimated_duration_s": 3600.0,
    }


async def patch(api: Api, body: dict[str, Any]) -> None:
    response = await api.client.patch(
        "/v1/tenants/acme", json=body, headers=bearer(api.admin_token)
    )
    assert response.status == 200, await response.text()


async def passes(api: Api, count: int = 2) -> None:
    """Wait for `count` passes that started after now (each sees the latest tenants)."""
    loop = api.app[SCHEDULER]
    for _ in range(count):
        loop.wake()
        async with asyncio.timeout(10):
            await loop.wait_for_pass()


async def waits_saying(api: Api, token: str, work_id: str, text: str) -> None:
    seen: dict[str, Any] = {}

    async def says() -> bool:
        seen.update(await work(api, token, work_id))
        return seen["state"] == "pending" and text in (seen["reason"] or "")

    await eventually_async(says, timeout_s=20, message=lambda: f"{seen.get('reason')!r}")


async def test_lowered_limits_apply_at_the_next_pass_and_evict_nothing(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:  # 4 GPUs
        api = running.api
        token = await api.tenant("acme", quotas={"gpu": 4})
        first = await api.submitted(token, long_job("first", 2))
        second = await api.submitted(token, long_job("second", 2))
        for job_id in (first, second):
            await reaches(api, token, job_id, "running")

        # The quota goes down to 1: both keep running; new work waits, told what the
        # tenant holds.
        await patch(api, {"quotas": {"gpu": 1}})
        third = await api.submitted(token, long_job("third", 1))
        await waits_saying(
            api, token, third, "Over quota: tenant acme uses 4 GPU (nominal 1, borrowing limit 0)"
        )
        await passes(api)
        for job_id in (first, second):
            assert (await work(api, token, job_id))["state"] == "running"

        # Room in the quota, but at most one job may run: both still run, the third waits.
        await patch(api, {"quotas": {"gpu": 8}, "max_running": 1})
        await passes(api)
        cancelled = await api.client.delete(f"/v1/jobs/{first}", headers=bearer(token))
        assert cancelled.status == 200, await cancelled.text()
        await waits_saying(
            api,
            token,
            third,
            "Over quota: tenant acme runs 1 job or deployment, its max_running of 1",
        )
        await passes(api)
        assert (await work(api, token, second))["state"] == "running"
        assert (await work(api, token, third))["state"] == "pending"  # 2 GPUs are free

        await patch(api, {"max_running": 2})
        await reaches(api, token, third, "running")
        assert (await work(api, token, second))["state"] == "running"
