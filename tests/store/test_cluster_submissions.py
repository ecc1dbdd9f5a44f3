"""The attempts submitted to clusters (migration v24): each claimed once, for good, on
SQLite and PostgreSQL: a restarted control plane, or another replica, is told it was
submitted (cloud/clusters/bridge.py never submits it again)."""

from __future__ import annotations

import msgspec

from cloud.store import Store, TenantRecord, open_store
from tests.store.databases import DatabaseUnderTest


async def test_an_attempt_is_claimed_once_across_restarts(
    store: Store, tenant: TenantRecord, database: DatabaseUnderTest
) -> None:
    spec = msgspec.json.encode({"name": "once", "command": ["true"]})
    submitted = await store.submit_work(tenant.tenant_id, kind="training", spec=spec, priority="p1")
    work_id = submitted.work.work_id
    assert await store.claim_cluster_submission("lab", work_id, 1)
    assert not await store.claim_cluster_submission("lab", work_id, 1)
    assert not await store.claim_cluster_submission("other", work_id, 1)
    assert await store.claim_cluster_submission("lab", work_id, 2)  # the next attempt

    restarted = await open_store(database.settings)
    try:
        assert not await restarted.claim_cluster_submission("lab", work_id, 1)
        assert not await restarted.claim_cluster_submission("lab", work_id, 2)
        assert await restarted.claim_cluster_submission("lab", work_id, 3)
    finally:
        await restarted.close()
