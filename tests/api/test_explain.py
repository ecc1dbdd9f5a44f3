"""`GET .../explain`: the scheduler's latest explanation, stored with its plan.

The pass here is the real scheduler, fed the way the scheduling loop feeds it: the
store's snapshot converted with cloud.work.convert, the plan's explanations encoded
with cloud.work.explain and committed with `Store.commit_pass`.
"""

from __future__ import annotations

import io
import time
from collections import defaultdict
from datetime import UTC, datetime

import msgspec
import pytest

from cloud.scheduler import Snapshot, schedule
from cloud.scheduler.plan import Plan
from cloud.store import NewAllocation, PassWrite, PlacementWrite, Store, open_store
from cloud.work.convert import tenant_from_record, work_from_record
from cloud.work.explain import explanations_for_plan
from cloud.work.explanation import Explanation, decode_explanation, encode_explanation
from cloud.work.views import ExplainView, JobView
from greenfed.work_commands import render_work
from tests.api.support import Api, bearer, deployment_spec, job_spec, problem
from tests.scheduler.builders import gpu_node
from tests.store.builders import make_tenant, submit
from tests.store.databases import DatabaseUnderTest


def store_plan(plan: Plan) -> PassWrite:
    """What the scheduling loop commits for a scheduler plan (placements, reasons, why)."""
    members: dict[str, list[NewAllocation]] = defaultdict(list)
    for placement in plan.placements:
        members[placement.work_id].append(
            NewAllocation(
                member_index=placement.member,
                node_id=placement.node_id,
                accelerator_kind=placement.accelerator_kind,
                accelerators=placement.accelerators,
                host_memory_bytes=placement.host_memory_bytes,
                expected_end=placement.expected_end,
            )
        )
    return PassWrite(
        placements=tuple(
            PlacementWrite(work_id=work_id, allocations=tuple(allocations))
            for work_id, allocations in members.items()
        ),
        pending_reasons={pending.work_id: pending.message for pending in plan.pending},
        explanations=explanations_for_plan(plan),
    )


async def schedule_once(store: Store) -> Plan:
    snapshot = await store.load_snapshot()
    names = {tenant.tenant_id: tenant.name for tenant in snapshot.tenants}
    tenants = [t for t in map(tenant_from_record, snapshot.tenants) if t is not None]
    plan = schedule(
        Snapshot.build(
            now=time.time(),
            nodes=[gpu_node("gpu-a", 4), gpu_node("gpu-b", 4, zone="CA-ON")],
            queue=[work_from_record(r, tenant=names[r.tenant_id]) for r in snapshot.work],
            tenants=tenants,
        )
    )
    lease = await store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await store.commit_pass(store_plan(plan), lease=lease)
    return plan


async def test_explain_says_when_the_scheduler_has_not_looked_yet_then_why(api: Api) -> None:
    token = await api.tenant("acme", quotas={"gpu": 8})
    gang = await api.submitted(token, job_spec(name="gang", workers=2, accelerators_per_worker=2))
    npu = await api.submitted(token, job_spec(name="needs-npu", accelerator_kind="npu"))
    deployment = await api.submitted(
        token, deployment_spec(await api.model(token)), collection="deployments"
    )

    before = await (await api.get(token, f"/v1/jobs/{gang}/explain")).json()
    assert before["explanation"] is None
    assert before["explained_at"] is None
    assert "not looked at it yet" in before["message"]
    assert (before["id"], before["kind"], before["state"]) == (gang, "training", "pending")

    await schedule_once(api.store)

    placed = await (await api.get(token, f"/v1/jobs/{gang}/explain")).json()
    assert placed["state"] == "scheduled"
    assert placed["explained_at"] is not None
    explanation = placed["explanation"]
    assert explanation["outcome"] == "placed"
    assert placed["message"] == explanation["message"]
    assert explanation["message"].startswith("Placed 2 workers on")
    assert [m["member"] for m in explanation["placements"]] == [0, 1]
    chosen = explanation["placements"][0]["chosen"]
    assert chosen["node_id"] in ("gpu-a", "gpu-b")
    assert {term["name"] for term in chosen["terms"]} >= {"packing", "load"}
    total = sum(t["value"] * t["weight"] for t in chosen["terms"])
    assert chosen["total"] == pytest.approx(total, abs=1e-3)
    job_response = await api.get(token, f"/v1/jobs/{gang}")
    job = await job_response.json()
    assert sorted(job["nodes"]) == sorted(m["node_id"] for m in explanation["placements"])
    # What `greenfed job ID` prints of it.
    out = io.StringIO()
    render_work(
        msgspec.json.decode(await job_response.read(), type=JobView),
        msgspec.json.decode(msgspec.json.encode(placed), type=ExplainView),
        out,
    )
    printed = out.getvalue()
    assert "state: scheduled" in printed
    assert "placement" in printed
    assert "score breakdown" in printed
    assert all(node in printed for node in job["nodes"])

    waiting = await (await api.get(token, f"/v1/jobs/{npu}/explain")).json()
    assert waiting["state"] == "pending"
    why = waiting["explanation"]
    assert why["outcome"] == "pending"
    assert why["pending"]["code"] == "unschedulable"
    assert why["pending"]["rejections"] == {"kind": 2}
    assert (why["pending"]["nodes_total"], why["pending"]["fitting_nodes"]) == (2, 0)
    # The one-line reason is the job's too.
    shown = await (await api.get(token, f"/v1/jobs/{npu}")).json()
    assert shown["reason"] == why["message"] == waiting["message"]
    assert "0/2 nodes fit: 2 no NPU" in why["message"]

    # The deployment wants edge nodes; none here.
    edge = await (await api.get(token, f"/v1/deployments/{deployment}/explain")).json()
    assert (edge["kind"], edge["explanation"]["outcome"]) == ("deployment", "pending")
    await problem(await api.get(token, f"/v1/jobs/{deployment}/explain"), 404)
    other = await api.tenant("globex")
    await problem(await api.client.get(f"/v1/jobs/{gang}/explain", headers=bearer(other)), 404)


async def test_the_store_keeps_the_latest_explanation_per_work(
    database: DatabaseUnderTest,
) -> None:
    store = await open_store(database.settings)
    try:
        tenant = (await make_tenant(store, "acme")).tenant
        work = (await submit(store, tenant.tenant_id)).work
        assert (await store.work_explanation(tenant.tenant_id, work.work_id)) is not None
        commits: list[int] = []
        stop = store.add_commit_listener(lambda: commits.append(1))
        lease = await store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            for message in ("first", "second"):
                document = encode_explanation(
                    Explanation(outcome="pending", message=message, decided_at=datetime.now(UTC))
                )
                await store.commit_pass(
                    PassWrite(
                        explanations={
                            work.work_id: document,
                            "01ARZ3NDEKTSV4RRFFQ69G5FAV": document,
                        }
                    ),
                    lease=lease,
                )
            with pytest.raises(ValueError, match="explanation of"):
                await store.commit_pass(PassWrite(explanations={work.work_id: b"[]"}), lease=lease)
        stop()
        await submit(store, tenant.tenant_id)
        assert commits == [1, 1]  # two plans committed; nothing after the listener left
        found = await store.work_explanation(tenant.tenant_id, work.work_id)
        assert found is not None
        assert found.explanation is not None
        assert decode_explanation(found.explanation).message == "second"
        assert found.explained_at is not None
        assert found.work.version == work.version  # advice, not a change of the work
        other = (await make_tenant(store, "globex")).tenant
        assert await store.work_explanation(other.tenant_id, work.work_id) is None
        # Snapshots do not carry explanations.
        snapshot = await store.load_snapshot()
        assert [w.work_id for w in snapshot.work][:1] == [work.work_id]
    finally:
        await store.close()
