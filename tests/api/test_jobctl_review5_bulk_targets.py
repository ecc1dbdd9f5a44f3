"""An admin past `cloud.destructive_actions_per_minute` is asked to confirm only an action
that would really be done (review 5, bug 4): work or a node that does not exist is the
404 it is within the limit, ended work the 409, an ambiguous name the 409 listing the
matches, and none of these is audited as a refused bulk action. Both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.settings import CloudSettings
from tests.api.support import Api, bearer, job_spec, problem, running_api
from tests.store.databases import DatabaseUnderTest

LIMIT = 1


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    cloud = CloudSettings(invalid_log_interval_s=0, destructive_actions_per_minute=LIMIT)
    async with running_api(database, cloud=cloud) as running:
        yield running


async def refusals(api: Api) -> list[tuple[str, str]]:
    response = await api.get(api.admin_token, "/v1/audit?action=bulk.refused")
    items: list[dict[str, Any]] = (await response.json())["items"]
    return [(entry["target"], entry["detail"]["refused"]) for entry in items]


async def test_past_the_limit_what_would_not_be_done_is_refused_as_within_it(api: Api) -> None:
    token = await api.tenant("globex")
    admin = bearer(api.admin_token)
    first = await api.submitted(token, job_spec(name="first"))
    assert (await api.client.delete(f"/v1/jobs/{first}", headers=admin)).status == 200
    # The limit is reached: what follows would each need a confirmation, if done.

    ended = await api.submitted(token, job_spec(name="ended"))
    assert (await api.client.delete(f"/v1/jobs/{ended}", headers=bearer(token))).status == 200
    array = await api.submitted(token, job_spec(name="sweep", array="0-2"))
    assert (await api.client.delete(f"/v1/jobs/{array}", headers=bearer(token))).status == 200
    for _ in range(2):
        await api.submitted(token, job_spec(name="twice"))

    for method, path, status, slug in (
        ("DELETE", "/v1/jobs/NOSUCHJOBATALL", 404, "job-not-found"),
        ("DELETE", "/v1/deployments/no-such-deployment", 404, "deployment-not-found"),
        ("DELETE", f"/v1/jobs/{ended}", 409, "already-finished"),
        ("DELETE", "/v1/jobs/ended", 409, "already-finished"),
        ("DELETE", f"/v1/jobs/{array}", 409, "already-finished"),
        ("DELETE", "/v1/jobs/twice", 409, "ambiguous-reference"),
        ("POST", "/v1/nodes/no-such-node/drain", 404, "node-not-found"),
        ("POST", "/v1/nodes/no-such-node/revoke", 404, "node-not-found"),
    ):
        body = await problem(await api.client.request(method, path, headers=admin), status)
        assert body["type"].endswith(f"/{slug}"), (path, body)
    assert await refusals(api) == []

    # Work that would be cancelled still needs the confirmation, audited under its id.
    live = await api.submitted(token, job_spec(name="live"))
    asked = await problem(await api.client.delete("/v1/jobs/live", headers=admin), 428)
    assert asked["type"].endswith("/confirmation-required")
    assert (await (await api.get(token, f"/v1/jobs/{live}")).json())["state"] == "pending"
    assert await refusals(api) == [(live, "work.cancel")]
