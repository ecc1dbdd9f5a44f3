"""Work records: submission, idempotency keys (also under concurrency), tenant scoping,
filters and cursor pagination."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cloud.store import (
    NewTenant,
    QueueFullError,
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


async def test_submissions_arriving_together_commit_together_each_with_its_own_answer(
    store: Store,
) -> None:
    """Group commit: many concurrent submissions take a few transactions, and each gets
    what it would have alone: new work, the original for a retry or its twin, a refusal
    for a tenant at its max_queued (in arrival order) or an unknown tenant."""
    acme = (await make_tenant(store, "acme")).tenant
    capped = await store.create_tenant(NewTenant(name="capped", max_queued=3))
    earlier = await submit(store, acme.tenant_id, key="retried")
    groups_before = store._submissions.groups

    async def outcome(tenant_id: str, key: str | None) -> str:
        try:
            result = await submit(store, tenant_id, key=key)
        except QueueFullError:
            return "full"
        except TenantNotFoundError:
            return "unknown"
        return f"{'new' if result.created else 'again'}:{result.work.work_id}"

    calls: list[tuple[str, str | None]] = [(acme.tenant_id, f"k{index}") for index in range(40)]
    calls += [(acme.tenant_id, "retried"), (acme.tenant_id, "twin"), (acme.tenant_id, "twin")]
    calls += [(capped.tenant.tenant_id, None) for _ in range(5)]
    calls += [("no-such-tenant", None)]
    outcomes = await asyncio.gather(*(outcome(tenant_id, key) for tenant_id, key in calls))

    assert all(o.startswith("new:") for o in outcomes[:40])
    assert outcomes[40] == f"again:{earlier.work.work_id}"
    first_twin, second_twin = outcomes[41:43]
    assert first_twin.startswith("new:")
    assert second_twin == first_twin.replace("new:", "again:")
    assert [o.split(":")[0] for o in outcomes[43:48]] == ["new"] * 3 + ["full"] * 2
    assert outcomes[48] == "unknown"
    assert store._submissions.groups - groups_before < len(calls) // 4  # shared commits
    page = await store.list_work(acme.tenant_id, limit=100)
    assert len(page.items) == 42  # 40, the retried one and one twin: nothing twice
    listed = {work.work_id for work in page.items}
    assert {o.split(":")[1] for o in outcomes[:43]} <= listed
    queued = await store.list_work(capped.tenant.tenant_id)
    assert len(queued.items) == 3


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
