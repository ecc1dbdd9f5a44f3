"""What a drain waits for (`drain_waiting`) is shown by every replica of the control
plane, not only by the scheduling leader whose pass found it: the leader stores it with
the pass's commit (`PassWrite.drain_waiting`), an API-only replica reads it back."""

from __future__ import annotations

from typing import Any

import pytest

from cloud.api.nodes import DRAIN_WAITING_FOR_TENANTS
from cloud.app_keys import SCHEDULER
from tests.api.support import Api, running_api
from tests.loop.test_scaling import replicas_become
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, work
from tests.support.fleet import mqtt_settings
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(120)

WAITING = "waiting: detector would fall below min_available 2 (1 serving elsewhere)"


async def admin(api: Api, method: str, path: str) -> Any:
    headers = {"Authorization": f"Bearer {api.admin_token}"}
    response = await api.client.request(method, path, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_an_api_replica_shows_what_the_leaders_drain_waits_for(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, edge_nodes=3) as running:
        leader = running.api
        await eventually(leader.app[SCHEDULER].leading.is_set, timeout_s=10, message="no leader")
        token = await leader.tenant("acme")
        # The third node is cordoned: a replacement has nowhere to go, the drain waits.
        await admin(leader, "POST", "/v1/nodes/orin-2/cordon")
        spec = {
            "name": "detector",
            "model_id": await leader.model(token),
            "replicas": 2,
            "min_available": 2,
        }
        deployment_id = await leader.submitted(token, spec, collection="deployments")
        await replicas_become(leader, token, deployment_id, 2)
        placed = sorted((await work(leader, token, deployment_id, "deployments"))["nodes"])
        assert placed == ["orin-0", "orin-1"]

        url, root = mosquitto_root
        # Scheduling off: its own app, store and registry, fed by the same broker.
        async with running_api(database, mqtt=mqtt_settings(url, root)) as replica:
            assert SCHEDULER not in replica.app
            await eventually_async(
                lambda: _online(replica, 3), timeout_s=20, message="replica: nodes not online"
            )
            await admin(replica, "POST", "/v1/nodes/orin-0/drain")

            async def leader_waits() -> bool:
                node = await admin(leader, "GET", "/v1/nodes/orin-0")
                return bool(node["drain_waiting"] == [WAITING])

            await eventually_async(leader_waits, timeout_s=20, message="the drain does not wait")

            seen: dict[str, tuple[bool, list[str]]] = {}

            async def replica_shows_it() -> bool:
                node = await admin(replica, "GET", "/v1/nodes/orin-0")
                listed = (await admin(replica, "GET", "/v1/nodes"))["items"]
                in_list = next(n for n in listed if n["node_id"] == "orin-0")
                for where, shown in (("node", node), ("list", in_list)):
                    seen[where] = (shown["draining"], shown["drain_waiting"])
                return all(shown == (True, [WAITING]) for shown in seen.values())

            await eventually_async(
                replica_shows_it, timeout_s=15, message=lambda: f"replica shows {seen}"
            )
            # Another tenant learns that the drain waits, not for whose deployment.
            globex = await leader.tenant("globex")
            for api in (leader, replica):
                node = await (await api.get(globex, "/v1/nodes/orin-0")).json()
                listed = (await (await api.get(globex, "/v1/nodes")).json())["items"]
                in_list = next(n for n in listed if n["node_id"] == "orin-0")
                for shown in (node, in_list):
                    assert shown["drain_waiting"] == [DRAIN_WAITING_FOR_TENANTS]

            # Uncordoned, the drain ends; the replica shows no wait once the leader's
            # pass stored that, and a node that does not drain shows none anyway.
            await admin(replica, "POST", "/v1/nodes/orin-0/uncordon")

            async def replica_clear() -> bool:
                node = await admin(replica, "GET", "/v1/nodes/orin-0")
                return bool(not node["draining"] and node["drain_waiting"] == [])

            await eventually_async(replica_clear, timeout_s=15, message="replica still waits")

            async def nothing_stored() -> bool:
                return await replica.store.drain_waiting() == {}

            await eventually_async(nothing_stored, timeout_s=15, message="a wait still stored")


async def _online(api: Api, count: int) -> bool:
    listed = (await admin(api, "GET", "/v1/nodes?state=online"))["items"]
    return len(listed) == count
