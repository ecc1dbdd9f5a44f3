"""A node may not be called after a fixed route under /v1/nodes/ (`enrolled`,
`join-tokens`, ...): `GET /v1/nodes/{node_id}` would reach that route instead of the
node. Enrolment refuses such an id (422 on `$.node_id`, the token not used), on SQLite
and PostgreSQL, and the agent refuses to start with one. The ids are read from the
running app's route table, so a route added later is covered (or this test fails)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from shared.settings import RESERVED_NODE_IDS, ConfigError, load_settings
from tests.api.support import Api, bearer, problem
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.store.databases import DatabaseUnderTest

NODES_PREFIX = "/v1/nodes/"


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with enrolment_api(database, RecordingAccounts(), require_enrolment=True) as running:
        yield running


def fixed_segments(app: web.Application) -> set[str]:
    """The fixed path segments right under /v1/nodes/ in the app's route table."""
    segments = set()
    for resource in app.router.resources():
        path = resource.canonical
        if path.startswith(NODES_PREFIX):
            segment = path.removeprefix(NODES_PREFIX).split("/")[0]
            if not segment.startswith("{"):
                segments.add(segment)
    return segments


async def test_every_fixed_route_under_nodes_is_a_refused_node_id(api: Api) -> None:
    segments = fixed_segments(api.app)
    assert {"enrol", "enrolled", "unenrolled", "join-tokens", "readmit"} <= segments
    assert segments <= RESERVED_NODE_IDS
    created = await create_token(api)
    for node_id in sorted(segments):
        body = await problem(await enrol(api, created["token"], node_id), 422)
        assert body["invalid_params"][0]["name"] == "$.node_id", node_id
        assert not await api.store.is_enrolled(node_id)
    response = await enrol(api, created["token"], "enrolled-1")  # its one use still there
    assert response.status == 200, await response.text()
    view = await api.client.get("/v1/nodes/enrolled", headers=bearer(api.admin_token))
    assert [item["node_id"] for item in (await view.json())["items"]] == ["enrolled-1"]


@pytest.mark.parametrize("node_id", sorted(RESERVED_NODE_IDS))
def test_the_agent_refuses_a_reserved_node_id_naming_the_key(node_id: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GREENFED_AGENT__NODE_ID": node_id})
    assert "agent.node_id" in str(caught.value)
    assert "reserved" in str(caught.value)
