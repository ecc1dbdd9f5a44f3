"""`/v1/nodes` pages from kept JSON (cloud/fleet/node_pages.py): byte for byte what
encoding every summary gives, after every kind of change a node goes through, and
pages that stay right while the fleet changes under them. The API's own page through a
running control plane on both backends: an admin's label and a node going offline show
on the next page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import msgspec
import pytest

from cloud.app_keys import REGISTRY
from cloud.fleet.envelope import NodeEnvelope
from cloud.fleet.node_pages import NodePages
from cloud.fleet.registry import NodeFilter, NodeRecord, NodeRegistry
from cloud.fleet.views import NodeList, node_summary
from cloud.store import NodeAdminRecord
from shared.messages import AcceleratorSample, ReportedState, Telemetry
from tests.api.support import Api, running_api
from tests.loop.builders import node
from tests.store.databases import DatabaseUnderTest

EVERY_NODE = NodeFilter()


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now_s


def fleet(clock: Clock, count: int = 6) -> NodeRegistry:
    registry = NodeRegistry(monotonic=clock, wall_clock=clock)
    for number in range(count):
        registry.apply_status(node(f"node-{number}", gpus=number % 3).status)
        sample(registry, f"node-{number}", seq=1, utilization_pct=10.0 * number)
    return registry


def sample(registry: NodeRegistry, node_id: str, *, seq: int, utilization_pct: float) -> None:
    record = registry.get(node_id)
    assert record is not None
    samples = tuple(
        AcceleratorSample(
            id=accelerator.id,
            utilization_pct=utilization_pct,
            memory_used_bytes=2**30,
            power_w=100.0 + seq,
        )
        for accelerator in record.status.accelerators
    )
    registry.apply_telemetry(
        Telemetry(
            node_id=node_id,
            instance_id=record.status.instance_id,
            seq=seq,
            sampled_at=registry.wall_clock(),
            interval_s=1.0,
            cpu_utilization_pct=5.0,
            memory_used_bytes=2**30,
            memory_total_bytes=64 * 2**30,
            accelerators=samples,
        )
    )


def encoded(
    records: list[NodeRecord],
    cursor: str | None = None,
    limit: int = 1000,
    drain: dict[str, tuple[str, ...]] | None = None,
) -> bytes:
    """What `/v1/nodes` served before pages were kept: every summary built and encoded."""
    start = next((n for n, r in enumerate(records) if cursor is None or r.node_id > cursor), 0)
    if cursor is not None and all(r.node_id <= cursor for r in records):
        start = len(records)
    page = records[start : start + limit]
    items = tuple(node_summary(r, (drain or {}).get(r.node_id, ())) for r in page)
    next_cursor = page[-1].node_id if start + limit < len(records) else None
    listed = NodeList(items=items, count=len(page), total=len(records), next_cursor=next_cursor)
    return msgspec.json.encode(listed)


def served(pages: NodePages, drain: dict[str, tuple[str, ...]] | None = None) -> bytes:
    return pages.page(EVERY_NODE, None, 1000, lambda r: (drain or {}).get(r.node_id, ()))


def test_a_kept_page_is_what_encoding_every_summary_gives_after_every_change() -> None:
    clock = Clock()
    registry = fleet(clock)
    pages = NodePages(registry)
    drain: dict[str, tuple[str, ...]] = {}

    def same() -> None:
        assert served(pages, drain) == encoded(registry.nodes(), drain=drain)

    same()
    clock.now_s += 1.0
    sample(registry, "node-1", seq=2, utilization_pct=99.5)  # a new sample
    same()
    registry.mark_offline(["node-2"], "telemetry-stale")  # offline, with a cause
    same()
    clock.now_s += 30.0
    sample(registry, "node-2", seq=40, utilization_pct=1.0)  # back: an outage that ended
    same()
    admin = NodeAdminRecord(
        node_id="node-3", cordoned=True, draining=True, taints=("gpu=a:NoSchedule",)
    )
    registry.set_admin({"node-3": admin})  # cordoned, draining, a taint
    drain["node-3"] = ("waiting: detector would fall below min_available 2",)
    same()
    registry.set_admin({"node-3": replace(admin, labels={"team": "vision"})})  # a label
    same()
    record = registry.get("node-4")
    assert record is not None
    registry.apply_status(  # a new birth of the same agent: another zone, more labels
        msgspec.structs.replace(record.status, zone="FR", labels={"rack": "r7"})
    )
    same()
    registry.apply_reported(
        ReportedState(
            node_id="node-0", instance_id="i1", reported_at=clock.now_s, observed_generation=7
        )
    )
    same()
    # Its birth says more than it enrolled as: pending approval.
    registry.envelope_of = lambda node_id: NodeEnvelope(zone="FR") if node_id == "node-5" else None
    registry.judge_again(["node-5"])
    same()
    registry.forget("node-1")
    registry.apply_status(node("node-10", gpus=1).status)  # one gone, one new
    same()


def test_pages_walked_while_nodes_change_are_encoded_alike_and_hold_every_node_once() -> None:
    clock = Clock()
    registry = fleet(clock, count=9)
    pages = NodePages(registry)
    first = pages.page(EVERY_NODE, None, 4, lambda r: ())
    assert first == encoded(registry.nodes(), None, 4)
    cursor = msgspec.json.decode(first)["next_cursor"]
    assert cursor == "node-3"
    registry.forget("node-3")  # the cursor's node is gone
    registry.apply_status(node("node-35", gpus=1).status)  # and one joins after it
    second = pages.page(EVERY_NODE, cursor, 4, lambda r: ())
    assert second == encoded(registry.nodes(), cursor, 4)
    listed = msgspec.json.decode(second)
    assert [item["node_id"] for item in listed["items"]] == [
        "node-35",
        "node-4",
        "node-5",
        "node-6",
    ]
    assert (listed["total"], listed["next_cursor"]) == (9, "node-6")


def test_a_filtered_page_follows_state_changes() -> None:
    clock = Clock()
    registry = fleet(clock)
    pages = NodePages(registry)
    online = NodeFilter(state="online")

    def online_ids() -> list[str]:
        body = msgspec.json.decode(pages.page(online, None, 100, lambda r: ()))
        return [item["node_id"] for item in body["items"]]

    assert online_ids() == [f"node-{n}" for n in range(6)]
    registry.mark_offline(["node-2"], "telemetry-stale")
    assert "node-2" not in online_ids()
    assert pages.page(online, None, 100, lambda r: ()) == encoded(registry.nodes(online), None, 100)
    clock.now_s += 10.0
    sample(registry, "node-2", seq=20, utilization_pct=3.0)
    assert "node-2" in online_ids()


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


async def test_the_api_page_shows_an_admins_label_and_a_node_going_offline(api: Api) -> None:
    registry = api.app[REGISTRY]
    for number in range(3):
        registry.apply_status(node(f"gpu-{number}", gpus=1).status)

    async def listed(query: str = "") -> dict[str, dict[str, object]]:
        response = await api.get(api.admin_token, f"/v1/nodes{query}")
        assert response.status == 200, await response.text()
        body = await response.json()
        return {item["node_id"]: item for item in body["items"]}

    before = await listed()
    assert sorted(before) == ["gpu-0", "gpu-1", "gpu-2"]
    assert "team" not in before["gpu-1"]["labels"]  # type: ignore[operator]
    response = await api.client.patch(
        "/v1/nodes/gpu-1",
        json={"labels": {"team": "vision"}},
        headers={"Authorization": f"Bearer {api.admin_token}"},
    )
    assert response.status == 200, await response.text()
    after = await listed()
    assert after["gpu-1"]["labels"] == before["gpu-1"]["labels"] | {"team": "vision"}  # type: ignore[operator]
    registry.mark_offline(["gpu-2"], "telemetry-stale")
    assert (await listed())["gpu-2"]["state"] == "offline"
    assert sorted(await listed("?state=online")) == ["gpu-0", "gpu-1"]


def test_a_summary_averages_the_devices_but_the_host_cpu_and_sums_every_power() -> None:
    clock = Clock()
    registry = NodeRegistry(monotonic=clock, wall_clock=clock)
    for node_id, gpus in (("gpu-node", 2), ("cpu-node", 0)):
        registry.apply_status(node(node_id, gpus=gpus).status)
        record = registry.get(node_id)
        assert record is not None
        # The host CPU at 90 %, each GPU at 10 % and 30 %: a GPU node is as busy as its GPUs.
        shares = {"cpu0": 90.0, "gpu0": 10.0, "gpu1": 30.0}
        registry.apply_telemetry(
            Telemetry(
                node_id=node_id,
                instance_id=record.status.instance_id,
                seq=1,
                sampled_at=clock.now_s,
                interval_s=1.0,
                cpu_utilization_pct=5.0,
                memory_used_bytes=2**30,
                memory_total_bytes=64 * 2**30,
                accelerators=tuple(
                    AcceleratorSample(
                        id=a.id,
                        utilization_pct=shares[a.id],
                        memory_used_bytes=0,
                        power_w=60.5 if a.kind == "cpu" else 200.125,
                    )
                    for a in record.status.accelerators
                ),
            )
        )
    listed = msgspec.json.decode(served(NodePages(registry)))
    by_id = {item["node_id"]: item for item in listed["items"]}
    assert by_id["gpu-node"]["accelerator_utilization_pct"] == 20.0
    assert by_id["gpu-node"]["power_w"] == 460.75  # 60.5 + 2 x 200.125
    assert by_id["cpu-node"]["accelerator_utilization_pct"] == 90.0
    assert by_id["cpu-node"]["power_w"] == 60.5
