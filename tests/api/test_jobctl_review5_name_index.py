"""A name's live work, each job array once (review 5, bug 1), is read through the name
index (migration v23) on SQLite and PostgreSQL, as the plain name lookup is
(tests/store/test_work_name_index.py): the arrays' tasks are found by their unique work
id, never by reading every array."""

from __future__ import annotations

from sqlalchemy import Select, text

from cloud.store import Store
from cloud.store.migrations.v0023_work_name_index import INDEX_NAME
from cloud.store.work_lookup import live_arrays_named_query, live_work_named_query
from tests.api.support import Api, job_spec


async def _plan(store: Store, dialect: str, query: Select[object]) -> str:
    engine = store._engine
    sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    async with engine.connect() as connection:
        if dialect == "postgresql":
            # A handful of rows is read faster whole; what is asked is whether the index
            # can answer the query at all.
            await connection.execute(text("SET enable_seqscan = off"))
            rows = await connection.execute(text(f"EXPLAIN {sql}"))
        else:
            rows = await connection.execute(text(f"EXPLAIN QUERY PLAN {sql}"))
        return "\n".join(str(row[-1]) for row in rows)


async def test_a_names_live_work_and_arrays_are_read_through_the_name_index(api: Api) -> None:
    token = await api.tenant("vision")
    tenant_id = await api.tenant_id(token)
    for name in ("sweep", "other"):
        await api.submitted(token, job_spec(name=name, array="0-3"))
        await api.submitted(token, job_spec(name=name))
    dialect = api.database.kind
    for scope in (tenant_id, None):  # None: the admin's reach, every tenant's
        for build in (live_work_named_query, live_arrays_named_query):
            query = build(dialect, scope, "training", "sweep", limit=11)
            plan = await _plan(api.store, dialect, query)
            assert INDEX_NAME in plan, (build.__name__, scope, plan)

    live = await api.store.live_work_named(tenant_id, "training", "sweep", limit=11)
    assert [record.state for record in live.work] == ["pending"]
    assert [(array.live_tasks, array.array_id < live.work[0].work_id) for array in live.arrays] == [
        (4, True)
    ]
