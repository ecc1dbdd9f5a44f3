"""Admin changes that meet another admin's at once, on either store: each request is held
at the store while another one commits, so that what it read before is stale when it
writes. A node keeps both admins' settings, the cluster cap holds, and a tenant's audit
history says what each change really changed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse

import cloud.api.clusters as cluster_api
from cloud.app_keys import REGISTRY
from cloud.store import Store
from tests.api.support import Api, bearer, problem
from tests.loop.builders import node

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0


class HeldFirstCall:
    """The first call of the store's methods named is held at its start (before it reads
    anything) until `release`; every later call passes at once. Another request can
    then commit between what the held request read and what it writes."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
        self.reached = asyncio.Event()
        self._released = asyncio.Event()
        for name in names:
            if hasattr(store, name):  # whichever of them the API writes with
                monkeypatch.setattr(store, name, self._held(getattr(store, name)))

    def _held(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def held(*args: Any, **kwargs: Any) -> Any:
            if not self.reached.is_set():
                self.reached.set()
                await self._released.wait()
            return await method(*args, **kwargs)

        return held

    async def around(
        self, held: Awaitable[ClientResponse], meanwhile: Awaitable[ClientResponse]
    ) -> tuple[ClientResponse, ClientResponse]:
        """`held` sent and stopped at the store; `meanwhile` done; then `held` let on."""
        first = asyncio.ensure_future(held)
        try:
            await asyncio.wait_for(self.reached.wait(), WAIT_S)
            second = await asyncio.wait_for(meanwhile, WAIT_S)
        finally:
            self._released.set()
        return await asyncio.wait_for(first, WAIT_S), second


# ---- node settings -----------------------------------------------------------------


async def test_a_cordon_and_a_label_patch_at_once_both_stay(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    admin = bearer(api.admin_token)
    gate = HeldFirstCall(api.store, monkeypatch, "change_node_admin", "put_node_admin")

    cordon, patch = await gate.around(
        api.client.post("/v1/nodes/gpu-1/cordon", headers=admin),
        api.client.patch("/v1/nodes/gpu-1", json={"labels": {"team": "a"}}, headers=admin),
    )

    assert (cordon.status, patch.status) == (200, 200)
    stored = (await api.store.node_admin())["gpu-1"]
    assert stored.cordoned, "the cordon was lost"
    assert dict(stored.labels) == {"team": "a"}, "the labels were lost"
    shown = await (await api.client.get("/v1/nodes/gpu-1", headers=admin)).json()
    assert shown["cordoned"]
    assert shown["labels"]["team"] == "a"


async def test_a_taint_patch_audits_the_labels_a_patch_set_meanwhile(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    admin = bearer(api.admin_token)
    gate = HeldFirstCall(api.store, monkeypatch, "change_node_admin", "put_node_admin")

    taints, labels = await gate.around(
        api.client.patch("/v1/nodes/gpu-1", json={"taints": ["x=y:NoSchedule"]}, headers=admin),
        api.client.patch("/v1/nodes/gpu-1", json={"labels": {"team": "a"}}, headers=admin),
    )

    assert (taints.status, labels.status) == (200, 200)
    stored = (await api.store.node_admin())["gpu-1"]
    assert (stored.taints, dict(stored.labels)) == (("x=y:NoSchedule",), {"team": "a"})
    page = await (await api.client.get("/v1/audit?action=node.update", headers=admin)).json()
    assert page["items"][0]["detail"] == {"taints": ["x=y:NoSchedule"], "labels": {"team": "a"}}


async def test_a_burst_of_admin_actions_on_one_node_keeps_every_one(api: Api) -> None:
    """No row yet for the node: each action makes it or waits for the one that does."""
    api.app[REGISTRY].apply_status(node("gpu-1").status)
    admin = bearer(api.admin_token)
    replies = await asyncio.wait_for(
        asyncio.gather(
            api.client.post("/v1/nodes/gpu-1/drain", headers=admin),
            api.client.patch("/v1/nodes/gpu-1", json={"taints": ["x=y:NoSchedule"]}, headers=admin),
            api.client.patch("/v1/nodes/gpu-1", json={"labels": {"team": "a"}}, headers=admin),
        ),
        WAIT_S,
    )
    assert [reply.status for reply in replies] == [200, 200, 200]
    stored = (await api.store.node_admin())["gpu-1"]
    assert (stored.cordoned, stored.draining) == (True, True)
    assert (stored.taints, dict(stored.labels)) == (("x=y:NoSchedule",), {"team": "a"})


# ---- the cluster cap -----------------------------------------------------------------


def _cluster(name: str) -> dict[str, Any]:
    return {"name": name, "zone": "DE", "region": "europe-west3", "slurm": {}}


async def test_a_registration_counted_below_the_cap_is_refused_once_another_filled_it(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_api, "MAX_CLUSTERS", 2)
    admin = bearer(api.admin_token)
    first = await api.client.post("/v1/clusters", json=_cluster("lab0"), headers=admin)
    assert first.status == 201, await first.text()
    gate = HeldFirstCall(api.store, monkeypatch, "add_cluster")

    late, filling = await gate.around(
        api.client.post("/v1/clusters", json=_cluster("lab1"), headers=admin),
        api.client.post("/v1/clusters", json=_cluster("lab2"), headers=admin),
    )

    assert filling.status == 201, await filling.text()
    assert (await problem(late, 409))["type"].endswith("too-many-clusters")
    assert sorted(r.spec.name for r in await api.store.list_clusters()) == ["lab0", "lab2"]
    added = await (await api.client.get("/v1/audit?action=cluster.add", headers=admin)).json()
    assert sorted(entry["target"] for entry in added["items"]) == ["lab0", "lab2"]


async def test_a_burst_of_registrations_keeps_the_cap(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_api, "MAX_CLUSTERS", 3)
    admin = bearer(api.admin_token)
    replies = await asyncio.wait_for(
        asyncio.gather(
            *(
                api.client.post("/v1/clusters", json=_cluster(f"lab{n}"), headers=admin)
                for n in range(8)
            )
        ),
        WAIT_S * 2,
    )
    assert sorted(reply.status for reply in replies) == [201] * 3 + [409] * 5
    assert len(await api.store.list_clusters()) == 3


# ---- tenant changes ------------------------------------------------------------------


async def _max_queued_history(api: Api) -> list[dict[str, Any]]:
    """The audited changes of max_queued, oldest first."""
    admin = bearer(api.admin_token)
    page = await (await api.client.get("/v1/audit?action=tenant.update", headers=admin)).json()
    return [entry["detail"].get("max_queued") for entry in reversed(page["items"])]


async def test_a_tenant_change_audits_from_what_a_change_meanwhile_set(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await api.tenant("acme", max_queued=1)
    admin = bearer(api.admin_token)
    gate = HeldFirstCall(api.store, monkeypatch, "update_tenant")

    late, meanwhile = await gate.around(
        api.client.patch("/v1/tenants/acme", json={"max_queued": 5}, headers=admin),
        api.client.patch("/v1/tenants/acme", json={"max_queued": 3}, headers=admin),
    )

    assert (late.status, meanwhile.status) == (200, 200)
    assert (await late.json())["max_queued"] == 5
    assert await _max_queued_history(api) == [{"from": 1, "to": 3}, {"from": 3, "to": 5}]


async def test_a_tenant_change_undone_meanwhile_is_audited_as_a_change(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting what the tenant had when read, after another change: a real change back."""
    await api.tenant("acme", max_queued=1)
    admin = bearer(api.admin_token)
    gate = HeldFirstCall(api.store, monkeypatch, "update_tenant")

    late, meanwhile = await gate.around(
        api.client.patch("/v1/tenants/acme", json={"max_queued": 1}, headers=admin),
        api.client.patch("/v1/tenants/acme", json={"max_queued": 4}, headers=admin),
    )

    assert (late.status, meanwhile.status) == (200, 200)
    history = await _max_queued_history(api)
    assert history == [{"from": 1, "to": 4}, {"from": 4, "to": 1}]
    tenants = await (await api.client.get("/v1/tenants", headers=admin)).json()
    assert [t["max_queued"] for t in tenants["items"] if t["name"] == "acme"] == [1]
