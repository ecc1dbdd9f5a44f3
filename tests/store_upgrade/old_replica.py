"""A replica of the previous release that keeps running while the store is upgraded
under it: run by test_upgrade_from_previous.py with the release's code first on
PYTHONPATH (previous_release.extract_release), never imported by the suite.

1. Opens the store with the release's `open_store` (the store is at the release's
   own schema version, so nothing is migrated) and says `ready` on stdout.
2. Waits for one line on stdin: the test has meanwhile opened the store with today's
   code, which migrated it, and wrote some rows of its own; the line names them.
3. Reads and writes through the release's `Store` as a running replica and its
   scheduling loop would, each step on its own (a failing step is reported, the rest
   still run), and prints one JSON report: step -> {"ok": ..., "value" | "error": ...}.

Like populate.py it uses only what both versions offer, so mypy checks it against
today's code while it runs against the release's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import cloud.store as store_module
from cloud.loop.inputs import build_inputs
from cloud.loop.plans import translate
from cloud.scheduler import schedule
from cloud.store import (
    NewAllocation,
    NewTenant,
    PassWrite,
    PlacementWrite,
    SchemaTooNewError,
    Store,
    open_store,
)
from cloud.store.node_admin import NodeAdminRecord
from cloud.store.usage import UsageHour, UsageWrite
from cloud.work.convert import spec_of
from cloud.work.specs import TrainingJobSpec, encode_spec
from shared.settings import StoreSettings

Report = dict[str, dict[str, Any]]


async def _step(report: Report, name: str, action: Callable[[], Awaitable[Any]]) -> Any:
    try:
        value = await action()
    except Exception as error:  # reported, never hidden: the test names what broke
        report[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        return None
    report[name] = {"ok": True, "value": value}
    return value


async def _as_old_replica(store: Store, settings: StoreSettings, ask: dict[str, Any]) -> Report:
    report: Report = {}
    clock_at = float(ask["clock_at"])

    async def authenticate(token: str) -> str | None:
        tenant = await store.authenticate(token)
        return None if tenant is None else tenant.tenant_id

    await _step(report, "authenticate_old_tenant", lambda: authenticate(ask["old_token"]))
    await _step(report, "authenticate_new_tenant", lambda: authenticate(ask["new_token"]))
    await _step(report, "authenticate_revoked_token", lambda: authenticate(ask["revoked_token"]))

    async def listed() -> dict[str, str]:
        page = await store.list_work(ask["tenant_id"], limit=100)
        return {record.work_id: record.state for record in page.items}

    await _step(report, "list_work", listed)

    async def read_new_spec() -> str:
        record = await store.find_work(ask["new_work_id"])
        assert record is not None, "not found"
        return type(spec_of(record)).__name__

    await _step(report, "read_spec_written_by_new_code", read_new_spec)

    async def plan_a_pass() -> dict[str, Any]:
        snapshot = await store.load_snapshot()
        inputs = build_inputs(clock_at, (), snapshot)
        translation = translate(schedule(inputs.snapshot), inputs, {})
        return {
            "work": len(snapshot.work),
            "allocations": len(snapshot.allocations),
            "would_fail": {
                change.work_id: change.reason
                for change in translation.write.state_changes
                if change.to_state == "failed"
            },
        }

    await _step(report, "scheduling_pass_planned", plan_a_pass)

    async def submit() -> str:
        spec = encode_spec(TrainingJobSpec(name="from-old-replica", command=("true",)))
        result = await store.submit_work(
            ask["tenant_id"],
            kind="training",
            spec=spec,
            priority="p1",
            idempotency_key="old-replica-1",
        )
        return result.work.work_id

    submitted = await _step(report, "submit_work", submit)

    async def place_and_run() -> list[str]:
        assert submitted is not None, "nothing submitted"
        lease = await store.try_acquire_leadership()
        assert lease is not None, "leadership is held elsewhere"
        async with lease:
            allocation = NewAllocation(
                member_index=0, node_id="gpu-old", accelerator_kind="gpu", accelerators=1
            )
            placement = PlacementWrite(work_id=submitted, allocations=(allocation,))
            await store.commit_pass(PassWrite(placements=(placement,)), lease=lease)
            await store.write_usage(
                UsageWrite(
                    rows=[
                        UsageHour(
                            work_id=submitted,
                            member_index=0,
                            node_id="gpu-old",
                            hour_start=float(ask["usage_hour"]),
                            tenant_id=ask["tenant_id"],
                            work_kind="training",
                            zone="DE",
                            accelerator_kind="gpu",
                            energy_j=1000.0,
                            measured_j=1000.0,
                            gap_s=0.0,
                            gco2_g=10.0,
                            cost=0.01,
                            currency="EUR",
                            counterfactual_gco2_g=None,
                            fallback=False,
                        )
                    ]
                ),
                lease=lease,
            )
        result = await store.transition(submitted, "running", event_id="old-replica-started")
        return [record.state for record in result.work]

    await _step(report, "place_run_and_meter", place_and_run)

    async def cordon() -> bool:
        stored = await store.put_node_admin(NodeAdminRecord("gpu-old", cordoned=True))
        return stored.cordoned

    await _step(report, "put_node_admin", cordon)

    async def enrol() -> str:
        redemption = await store.redeem_join_token(ask["join_token"], "edge-old")
        await store.set_enrolled_username("edge-old", "node-edge-old")
        return redemption.node.node_id

    await _step(report, "redeem_join_token", enrol)

    async def create_tenant() -> dict[str, str]:
        created = await store.create_tenant(NewTenant(name="oldco", quotas={"gpu": 1}))
        return {"tenant_id": created.tenant.tenant_id, "token": created.token}

    await _step(report, "create_tenant", create_tenant)

    async def restart() -> str:
        restarted = await open_store(settings)
        await restarted.close()
        return "started"

    try:
        await restart()
        report["restart"] = {"ok": True, "value": "started"}
    except SchemaTooNewError as error:
        report["restart"] = {"ok": False, "error": f"SchemaTooNewError: {error}"}
    return report


async def main(settings: StoreSettings, clock_at: float) -> None:
    store = await open_store(settings, clock=lambda: clock_at)
    try:
        ready = {"version": store.migrations.to_version, "imported_from": store_module.__file__}
        print("READY", json.dumps(ready), flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        report = await _as_old_replica(store, settings, json.loads(line))
    finally:
        await store.close()
    print("REPORT", json.dumps(report), flush=True)


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    asyncio.run(main(StoreSettings(**arguments["settings"]), float(arguments["clock_at"])))
