"""Fill a store with the previous release's own code, as its users would have: run by
make_fixture.py in a checkout of that release (PYTHONPATH), never by the test suite.

Tenants, models, jobs and a deployment go through that release's REST API (the real
app in process, `tests.api.support.running_api` of that checkout); what the scheduling
loop, agents and accounting would write goes through its `Store`: placements with power
limits, jobs running, succeeded and failed, usage hours, an enrolled node, node admin
records. What the upgrade tests check afterwards is written to a manifest (JSON): ids,
tokens (test credentials, made here), states, events and usage totals as this release
read them back.

It uses only what both that release and today's code offer (mypy checks it against
today's), so it runs against the one and type-checks against the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from cloud.store import NewAllocation, PassWrite, PlacementWrite, Store
from cloud.store.node_admin import NodeAdminRecord
from cloud.store.usage import CounterfactualRecord, UsageHour, UsageMark, UsageWrite
from shared.settings import StoreSettings
from tests.api.support import Api, bearer, deployment_spec, job_spec, running_api
from tests.store.databases import DatabaseUnderTest

HOUR_S = 3600.0


async def _created(api: Api, path: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    response = await api.client.post(path, json=body, headers=bearer(token))
    assert response.status == 201, await response.text()
    created: dict[str, Any] = await response.json()
    return created


def _allocation(member: int, node_id: str, **fields: Any) -> NewAllocation:
    return NewAllocation(
        member_index=member,
        node_id=node_id,
        accelerator_kind=fields.pop("accelerator_kind", "gpu"),
        accelerators=fields.pop("accelerators", 1),
        **fields,
    )


async def _usage(store: Store, tenant_id: str, work_id: str, node_id: str, hour: float) -> None:
    lease = await store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        await store.write_usage(
            UsageWrite(
                rows=[
                    UsageHour(
                        work_id=work_id,
                        member_index=0,
                        node_id=node_id,
                        hour_start=hour,
                        tenant_id=tenant_id,
                        work_kind="training",
                        zone="DE",
                        accelerator_kind="gpu",
                        energy_j=3.6e6 * 0.25,
                        measured_j=3.6e6 * 0.2,
                        gap_s=12.5,
                        gco2_g=95.0,
                        cost=0.08,
                        currency="EUR",
                        counterfactual_gco2_g=120.0,
                        fallback=False,
                    )
                ],
                marks=[
                    UsageMark(
                        node_id=node_id,
                        instance_id="i-1",
                        seq=41,
                        sampled_at=hour + 1800.0,
                        energy_j={"gpu0": 1.25e6},
                    )
                ],
                counterfactuals=[
                    CounterfactualRecord(
                        work_id=work_id,
                        tenant_id=tenant_id,
                        decided_at=hour,
                        baseline="fifo",
                        zone_factors={"DE": 1.0, "FR": 0.0},
                    )
                ],
            ),
            lease=lease,
        )


async def populate(database: DatabaseUnderTest) -> dict[str, Any]:
    async with running_api(database) as api:
        store = api.store
        admin = api.admin_token
        tokens = {
            "acme": await api.tenant("acme", quotas={"gpu": 4}),
            "labs": await api.tenant(
                "labs", quotas={"gpu": 2}, cohort="research", borrowing_limit={"gpu": 2}
            ),
            "interns": await api.tenant("interns", allowed_priorities=["p2"]),
        }
        acme, labs, interns = tokens["acme"], tokens["labs"], tokens["interns"]
        tenant_ids = {name: await api.tenant_id(token) for name, token in tokens.items()}
        model_id = await api.model(acme)

        two_gpus = {"accelerators_per_worker": 2, "estimated_duration_s": 3600.0}
        work = {
            "queued_a": await api.submitted(acme, job_spec(name="queued-a", **two_gpus), key="q-a"),
            "queued_b": await api.submitted(acme, job_spec(name="queued-b", **two_gpus)),
            "running": await api.submitted(
                acme, job_spec(name="running", workers=2, estimated_duration_s=7200.0)
            ),
            "deployment": await api.submitted(
                acme, deployment_spec(model_id, replicas=1), collection="deployments"
            ),
            "succeeded": await api.submitted(labs, job_spec(name="finished", max_retries=1)),
            "failed": await api.submitted(labs, job_spec(name="broken")),
            "interns_queued": await api.submitted(interns, job_spec(name="low", priority="p2")),
            "cancelled": await api.submitted(interns, job_spec(name="dropped", priority="p2")),
        }
        cancelled = await api.client.delete(
            f"/v1/jobs/{work['cancelled']}", headers=bearer(interns)
        )
        assert cancelled.status == 200, await cancelled.text()

        now = time.time()
        lease = await store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            await store.commit_pass(
                PassWrite(
                    placements=(
                        PlacementWrite(
                            work_id=work["running"],
                            allocations=tuple(
                                _allocation(
                                    member,
                                    node_id,
                                    accelerator_ids=("0",),
                                    host_memory_bytes=2**30,
                                    expected_end=now + 7200.0,
                                    power_limit_w=250.0,
                                )
                                for member, node_id in enumerate(("gpu-a", "gpu-b"))
                            ),
                        ),
                        PlacementWrite(
                            work_id=work["succeeded"],
                            allocations=(_allocation(0, "gpu-a", accelerator_ids=("1",)),),
                        ),
                        PlacementWrite(
                            work_id=work["failed"],
                            allocations=(_allocation(0, "gpu-b", accelerator_ids=("1",)),),
                        ),
                        PlacementWrite(
                            work_id=work["deployment"],
                            allocations=(
                                _allocation(0, "edge-1", accelerator_kind="cpu", accelerators=1),
                            ),
                        ),
                    ),
                    pending_reasons={
                        work["queued_a"]: "0/2 nodes: 2 over quota",
                        work["queued_b"]: "0/2 nodes: 2 over quota",
                    },
                    explanations={work["queued_a"]: b'{"pending":"over quota"}'},
                ),
                lease=lease,
            )
        for name in ("running", "deployment", "succeeded", "failed"):
            await store.transition(work[name], "running", event_id=f"started-{name}")
        await store.transition(work["succeeded"], "succeeded", event_id="exited-succeeded")
        await store.transition(work["failed"], "failed", reason="exit code 3 on gpu-b")
        hour = (now // HOUR_S - 2) * HOUR_S
        await _usage(store, tenant_ids["labs"], work["succeeded"], "gpu-a", hour)
        await _usage(store, tenant_ids["acme"], work["running"], "gpu-a", hour + HOUR_S)

        join_tokens = {
            "unused": await _created(
                api,
                "/v1/nodes/join-tokens",
                {"ttl_s": 86400.0, "uses": 2, "site": "edge", "zone": "FR", "labels": {"a": "b"}},
                admin,
            ),
            "redeemed": await _created(
                api, "/v1/nodes/join-tokens", {"ttl_s": 3600.0, "site": "cloud"}, admin
            ),
        }
        redemption = await store.redeem_join_token(join_tokens["redeemed"]["token"], "gpu-c")
        await store.set_enrolled_username(redemption.node.node_id, "node-gpu-c")
        await store.put_node_admin(
            NodeAdminRecord(
                "gpu-c",
                cordoned=True,
                taints=("maintenance=true:NoSchedule",),
                labels={"rack": "7"},
            )
        )

        records = {name: await store.find_work(work_id) for name, work_id in work.items()}
        events = await store.list_events(tenant_id=None, limit=1000)
        return {
            "admin_token": admin,
            "tokens": tokens,
            "tenant_ids": tenant_ids,
            "model_id": model_id,
            "work": work,
            "states": {name: r.state for name, r in records.items() if r is not None},
            "attempts": {name: r.attempts for name, r in records.items() if r is not None},
            "state_reasons": {name: r.state_reason for name, r in records.items() if r},
            "specs": {name: json.loads(r.spec) for name, r in records.items() if r is not None},
            "events": [[e.seq, e.work_id, e.kind] for e in events],
            "usage_totals": [
                [t.tenant_id, t.zone, t.currency, t.energy_j, t.gco2_g, t.cost, t.avoided_gco2_g]
                for t in await store.usage_totals()
            ],
            "join_tokens": {
                name: {"id": created["id"], "token": created["token"]}
                for name, created in join_tokens.items()
            },
            "enrolled_node": "gpu-c",
            "cluster_id": await store.shared_secret("cluster-id"),
            "created_at": now,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--postgres-url", help="PostgreSQL instead of SQLite")
    parser.add_argument("--schema", default="", help="the PostgreSQL schema to fill")
    args = parser.parse_args(argv)
    if args.postgres_url:
        settings = StoreSettings(
            database_url=args.postgres_url,
            database_schema=args.schema,
            data_dir=str(args.data_dir),
        )
        database = DatabaseUnderTest("postgresql", settings)
    else:
        database = DatabaseUnderTest("sqlite", StoreSettings(data_dir=str(args.data_dir)))
    manifest = asyncio.run(populate(database))
    args.manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
