"""Work found by its name reads the runs of that name, not the tenant's whole history:
the lookup's query is one each database answers from the name index (migration v23),
on SQLite and PostgreSQL, and the answers are the ones the history holds."""

from __future__ import annotations

import msgspec
from sqlalchemy import text

from cloud.store import Store, TenantRecord
from cloud.store.migrations.v0023_work_name_index import INDEX_NAME
from cloud.store.work_lookup import work_matching_query
from tests.store.databases import DatabaseUnderTest


def _spec(name: str) -> bytes:
    return msgspec.json.encode({"name": name, "command": ["python", "train.py"]})


async def _plan(store: Store, database: DatabaseUnderTest, **lookup: object) -> str:
    query = work_matching_query(database.kind, kind="training", limit=1, **lookup)  # type: ignore[arg-type]
    sql = str(query.compile(dialect=store._engine.dialect, compile_kwargs={"literal_binds": True}))
    async with store._engine.connect() as connection:
        if database.kind == "postgresql":
            # A handful of rows is read faster whole; what is asked is whether the
            # index can answer this query at all (an expression index serves only the
            # very expression it indexed).
            await connection.execute(text("SET enable_seqscan = off"))
            rows = await connection.execute(text(f"EXPLAIN {sql}"))
        else:
            rows = await connection.execute(text(f"EXPLAIN QUERY PLAN {sql}"))
        return "\n".join(str(row[-1]) for row in rows)


async def test_a_name_is_looked_up_through_its_index(
    store: Store, tenant: TenantRecord, database: DatabaseUnderTest
) -> None:
    for lookup in (
        {"tenant_id": tenant.tenant_id, "name": "train"},
        {"tenant_id": tenant.tenant_id, "name": "train", "active_only": True},
        {"tenant_id": None, "name": "train"},  # an admin's lookup over every tenant
    ):
        plan = await _plan(store, database, **lookup)
        assert INDEX_NAME in plan, (lookup, plan)


async def test_the_newest_run_of_a_name_is_found_among_many(
    store: Store, tenant: TenantRecord
) -> None:
    submitted = []
    for index in range(30):
        name = "nightly" if index % 10 == 3 else f"sweep-{index}"
        result = await store.submit_work(
            tenant.tenant_id, kind="training", spec=_spec(name), priority="p1"
        )
        submitted.append((name, result.work.work_id))
    nightly = [work_id for name, work_id in submitted if name == "nightly"]

    found = await store.work_matching(tenant.tenant_id, "training", name="nightly", limit=10)
    assert [record.work_id for record in found] == nightly[::-1]
    assert await store.work_matching(tenant.tenant_id, "training", name="nightl", limit=10) == ()
    assert await store.work_matching(tenant.tenant_id, "inference", name="nightly", limit=10) == ()
