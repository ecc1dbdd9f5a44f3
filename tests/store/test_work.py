"""Work records: submission, idempotency keys (also under concurrency), tenant scoping,
filters and cursor pagination."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cloud.store import (
    Store,
    TenantNotFoundError,
    TenantRecord,
    WorkNotFoundError,
    open_store,
)
from cloud.store.ids import id_timestamp_ms, is_valid_id
from tests.store.builders import make_tenant, spec, submit
from tests.store.databases import DatabaseUnderTest


async def test_submitted_work_is_pending_and_reads_back(store: Store, tenant: TenantRecord) -> None:
    result = await submit(store, tenant.tenant_id, kind="inference", priority="p0", replicas=3)
    work = result.work
    assert result.created
    assert is_valid_id(work.work_id)
    assert (work.state, work.attempts, work.version, work.kind, work.priority) == (
        "pending",
        0,
        1,
        "inference",
        "p0",
    )
    assert msgspec.json.decode(work.spec) == msgspec.json.decode(spec(replicas=3))
    assert await store.get_work(tenant.tenant_id, work.work_id) == work
    assert await store.find_work(work.work_id) == work


async def test_ids_sort_by_submission_time(store: Store, tenant: TenantRecord) -> None:
    ids = [(await submit(store, tenant.tenant_id)).work.work_id for _ in range(20)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 20
    assert id_timestamp_ms(ids[0]) <= id_timestamp_ms(ids[-1])


async def test_a_retried_submission_returns_the_original(
    store: Store, tenant: TenantRecord
) -> None:
    first = await submit(store, tenant.tenant_id, key="retry-me", epochs=1)
    again = await submit(store, tenant.tenant_id, key="retry-me", epochs=1)
    assert (first.created, again.created) == (True, False)
    assert again.work == first.work
    assert len((await store.list_work(tenant.tenant_id)).items) == 1


async def test_idempotency_keys_are_per_tenant(store: Store, tenant: TenantRecord) -> None:
    other = (await make_tenant(store, "globex")).tenant
    mine = await submit(store, tenant.tenant_id, key="same")
    theirs = await submit(store, other.tenant_id, key="same")
    assert mine.created
    assert theirs.created
    assert mine.work.work_id != theirs.work.work_id


async def test_concurrent_retries_store_exactly_one_row(database: DatabaseUnderTest) -> None:
    """Two API replicas (two engines) each receive the same retried request several times."""
    stores = [await open_store(database.settings) for _ in range(2)]
    try:
        tenant = (await make_tenant(stores[0], "acme")).tenant
        results = await asyncio.gather(
            *(submit(stores[index % 2], tenant.tenant_id, key="once") for index in range(16))
        )
        assert sum(result.created for result in results) == 1
        assert len({result.work.work_id for result in results}) == 1
        page = await stores[1].list_work(tenant.tenant_id)
        assert [work.work_id for work in page.items] == [results[0].work.work_id]
    finally:
        for store in stores:
            await store.close()


async def test_submitting_for_an_unknown_tenant_fails(store: Store) -> None:
    with pytest.raises(TenantNotFoundError):
        await submit(store, "no-such-tenant")


async def test_a_spec_must_be_a_json_object(store: Store, tenant: TenantRecord) -> None:
    for bad, message in ((b"[1, 2]", "JSON object"), (b"{nope", "not valid JSON")):
        with pytest.raises(ValueError, match=message):
            await store.submit_work(tenant.tenant_id, kind="training", spec=bad, priority="p1")
    with pytest.raises(ValueError, match="idempotency key"):
        await store.submit_work(
            tenant.tenant_id, kind="training", spec=b"{}", priority="p1", idempotency_key=""
        )


async def test_another_tenants_work_is_simply_not_found(store: Store, tenant: TenantRecord) -> None:
    other = (await make_tenant(store, "globex")).tenant
    theirs = (await submit(store, other.tenant_id)).work
    assert await store.get_work(tenant.tenant_id, theirs.work_id) is None
    assert (await store.list_work(tenant.tenant_id)).items == ()
    assert await store.work_allocations(tenant.tenant_id, theirs.work_id) == ()
    with pytest.raises(WorkNotFoundError):
        await store.cancel_work(tenant.tenant_id, theirs.work_id)
    assert (await store.get_work(other.tenant_id, theirs.work_id)) == theirs
    cancelled = await store.cancel_work(other.tenant_id, theirs.work_id)
    assert cancelled.work[0].state == "cancelled"


async def test_list_filters_by_state_kind_and_priority(store: Store, tenant: TenantRecord) -> None:
    training_p1 = (await submit(store, tenant.tenant_id)).work
    inference_p0 = (await submit(store, tenant.tenant_id, kind="inference", priority="p0")).work
    training_p2 = (await submit(store, tenant.tenant_id, priority="p2")).work
    await store.cancel_work(tenant.tenant_id, training_p2.work_id)

    async def ids(**filters: object) -> list[str]:
        page = await store.list_work(tenant.tenant_id, **filters)  # type: ignore[arg-type]
        return [work.work_id for work in page.items]

    assert await ids() == [training_p2.work_id, inference_p0.work_id, training_p1.work_id]
    assert await ids(kinds=["training"]) == [training_p2.work_id, training_p1.work_id]
    assert await ids(states=["pending"]) == [inference_p0.work_id, training_p1.work_id]
    assert await ids(states=["cancelled"]) == [training_p2.work_id]
    assert await ids(priorities=["p0", "p2"]) == [training_p2.work_id, inference_p0.work_id]
    assert await ids(kinds=["training"], states=["pending"]) == [training_p1.work_id]


async def test_pagination_is_stable_while_work_is_submitted(
    store: Store, tenant: TenantRecord
) -> None:
    existing = [(await submit(store, tenant.tenant_id)).work.work_id for _ in range(23)]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_work(tenant.tenant_id, limit=5, cursor=cursor)
        seen.extend(work.work_id for work in page.items)
        # Submissions between pages neither repeat nor skip anything on later pages.
        await submit(store, tenant.tenant_id)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == list(reversed(existing))
    with pytest.raises(ValueError, match="limit"):
        await store.list_work(tenant.tenant_id, limit=0)
