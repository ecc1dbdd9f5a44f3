"""Bulk destructive admin actions need an explicit confirmation (issue 25): past
`cloud.destructive_actions_per_minute` revocations, drains and cancellations in a
minute, an admin's next one is a 428 problem that says how to confirm, and is audited;
with `Greenfed-Confirm: bulk` it goes through, audited as confirmed. A tenant
cancelling its own work is not held to it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cloud.app_keys import REGISTRY
from greenfed.cli import main
from shared.settings import CloudSettings
from tests.api.support import Api, bearer, job_spec, problem, running_api
from tests.loop.builders import node
from tests.store.databases import DatabaseUnderTest

LIMIT = 2
CONFIRM = {"Greenfed-Confirm": "bulk"}


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    cloud = CloudSettings(invalid_log_interval_s=0, destructive_actions_per_minute=LIMIT)
    async with running_api(database, cloud=cloud) as running:
        for node_id in ("gpu-1", "gpu-2", "gpu-3"):
            running.app[REGISTRY].apply_status(node(node_id).status)
        yield running


async def audit(api: Api, query: str) -> list[dict[str, Any]]:
    response = await api.get(api.admin_token, "/v1/audit" + query)
    assert response.status == 200, await response.text()
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


async def test_past_the_limit_an_admin_must_confirm_and_the_refusal_is_audited(
    api: Api,
) -> None:
    token = await api.tenant("globex")
    jobs = [await api.submitted(token, job_spec(name=f"job-{n}")) for n in range(3)]
    admin = bearer(api.admin_token)
    # Two destructive actions of different kinds: within the limit.
    cancelled = await api.client.delete(f"/v1/jobs/{jobs[0]}", headers=admin)
    assert cancelled.status == 200, await cancelled.text()
    drained = await api.client.post("/v1/nodes/gpu-1/drain", headers=admin)
    assert drained.status == 200, await drained.text()

    # The third, of any kind, needs the confirmation; nothing is done without it.
    for method, path in (
        ("DELETE", f"/v1/jobs/{jobs[1]}"),
        ("POST", "/v1/nodes/gpu-2/drain"),
        ("POST", "/v1/nodes/gpu-3/revoke"),
    ):
        refused = await problem(await api.client.request(method, path, headers=admin), 428)
        assert refused["type"].endswith("/confirmation-required")
        assert "Greenfed-Confirm: bulk" in refused["detail"]
        assert "cloud.destructive_actions_per_minute = 2" in refused["detail"]
    job = await (await api.get(token, f"/v1/jobs/{jobs[1]}")).json()
    assert job["state"] == "pending"
    assert (await (await api.get(api.admin_token, "/v1/nodes/gpu-3")).json())["node_id"]
    refusals = await audit(api, "?action=bulk.refused")
    assert [(e["target"], e["detail"]["refused"]) for e in refusals] == [
        ("gpu-3", "node.revoke"),
        ("gpu-2", "node.drain"),
        (jobs[1], "work.cancel"),
    ]
    assert refusals[0]["detail"]["in_last_minute"] == 2
    assert refusals[0]["detail"]["limit"] == LIMIT

    # Confirmed, each goes through, and the audit log says it was confirmed.
    for method, path in (
        ("DELETE", f"/v1/jobs/{jobs[1]}"),
        ("POST", "/v1/nodes/gpu-2/drain"),
        ("POST", "/v1/nodes/gpu-3/revoke"),
    ):
        done = await api.client.request(method, path, headers=admin | CONFIRM)
        assert done.status == 200, await done.text()
    confirmed = await audit(api, "?action=work.cancel,node.drain,node.revoke&limit=3")
    assert [(e["action"], e["detail"].get("confirmed")) for e in confirmed] == [
        ("node.revoke", "bulk"),
        ("node.drain", "bulk"),
        ("work.cancel", "bulk"),
    ]

    # A confirmation is one word; anything else is a mistake to point out.
    wrong = await problem(
        await api.client.delete(f"/v1/jobs/{jobs[2]}", headers=admin | {"Greenfed-Confirm": "yes"}),
        400,
    )
    assert wrong["invalid_params"][0]["name"] == "Greenfed-Confirm"


async def test_parallel_unconfirmed_cancellations_stop_at_the_limit(api: Api) -> None:
    # A script cancelling many jobs at once gets no more past the guard than one
    # cancelling them in turn: the limit, then 428s.
    token = await api.tenant("initech")
    jobs = [await api.submitted(token, job_spec(name=f"job-{n}")) for n in range(12)]
    admin = bearer(api.admin_token)
    replies = await asyncio.gather(
        *(api.client.delete(f"/v1/jobs/{job}", headers=admin) for job in jobs)
    )
    statuses = sorted(reply.status for reply in replies)
    assert statuses == [200] * LIMIT + [428] * (len(jobs) - LIMIT)
    cancelled = await audit(api, "?action=work.cancel")
    assert len(cancelled) == LIMIT


async def test_a_tenant_cancelling_its_own_work_is_not_held_to_the_limit(api: Api) -> None:
    token = await api.tenant("acme")
    for number in range(LIMIT + 2):
        job_id = await api.submitted(token, job_spec(name=f"job-{number}"))
        response = await api.client.delete(f"/v1/jobs/{job_id}", headers=bearer(token))
        assert response.status == 200, await response.text()
    assert await audit(api, "?action=bulk.refused") == []


async def test_the_cli_confirms_with_confirm_bulk(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    """`greenfed nodes drain NODE --confirm-bulk` (and revoke, cancel) send the header:
    past the limit the plain command fails with the 428's advice, the confirmed one works."""
    base = ["--api", str(api.client.make_url("")).rstrip("/"), "--token", api.admin_token]
    for node_id in ("gpu-1", "gpu-2"):
        assert await asyncio.to_thread(main, ["nodes", "drain", node_id, *base]) == 0
    assert await asyncio.to_thread(main, ["nodes", "drain", "gpu-3", *base]) == 1
    assert "Greenfed-Confirm: bulk" in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["nodes", "drain", "gpu-3", "--confirm-bulk", *base]) == 0
    newest, *_ = await audit(api, "?action=node.drain")
    assert newest["target"] == "gpu-3"
