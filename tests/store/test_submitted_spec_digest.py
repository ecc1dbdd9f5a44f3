"""Work submitted with an idempotency key keeps the digest of its spec as submitted
(migration v25), which a retry is compared with after a PATCH or an apply changed the
spec; work stored before v25 has none and keeps its retries compared with its spec.
SQLite and PostgreSQL."""

from __future__ import annotations

import msgspec
from sqlalchemy import text

from cloud.store import Store, TenantRecord, create_store_engine, open_store, resolve_database
from cloud.store.migrate import migrate
from cloud.store.migrations import MIGRATIONS
from cloud.store.records import submitted_spec_digest
from tests.store.databases import DatabaseUnderTest


def _spec(name: str, **fields: object) -> bytes:
    return msgspec.json.encode({"name": name, "command": ["python", "train.py"], **fields})


def test_the_digest_is_of_the_spec_as_a_json_value() -> None:
    document = b'{"name":"a","env":{"B":"2","A":"1"},"workers":1}'
    reordered = b'{"workers": 1, "env": {"A": "1", "B": "2"}, "name": "a"}'
    assert submitted_spec_digest(document) == submitted_spec_digest(reordered)
    assert submitted_spec_digest(document) != submitted_spec_digest(_spec("a"))


async def test_keyed_work_keeps_the_digest_of_its_spec_as_submitted(
    store: Store, tenant: TenantRecord
) -> None:
    submitted = _spec("train", workers=1)
    result = await store.submit_work(
        tenant.tenant_id, kind="training", spec=submitted, priority="p1", idempotency_key="k1"
    )
    digest = submitted_spec_digest(submitted)
    assert result.work.submitted_spec_sha256 == digest
    updated = await store.update_queued(
        tenant.tenant_id,
        result.work.work_id,
        spec=_spec("train", workers=2),
        priority="p0",
        changed_fields=("workers", "priority"),
    )
    assert (updated.spec, updated.submitted_spec_sha256) == (_spec("train", workers=2), digest)
    retried = await store.submit_work(
        tenant.tenant_id, kind="training", spec=submitted, priority="p1", idempotency_key="k1"
    )
    assert (retried.created, retried.work.submitted_spec_sha256) == (False, digest)

    keyless = await store.submit_work(
        tenant.tenant_id, kind="training", spec=submitted, priority="p1"
    )
    assert keyless.work.submitted_spec_sha256 is None

    tasks = [(index, _spec(f"task-{index}")) for index in range(3)]
    array = await store.submit_array(
        tenant.tenant_id, "A1", tasks=tasks, priority="p1", idempotency_key="k2"
    )
    found = await store.array_tasks(tenant.tenant_id, "A1")
    assert array.work.submitted_spec_sha256 == submitted_spec_digest(tasks[0][1])
    assert [task.work.submitted_spec_sha256 for task in found] == [
        submitted_spec_digest(tasks[0][1]),
        None,
        None,
    ]


async def test_migrating_leaves_earlier_work_without_a_digest(
    database: DatabaseUnderTest,
) -> None:
    engine = create_store_engine(database.settings)
    old_spec = _spec("before-v25")
    try:
        await migrate(engine, resolve_database(database.settings), migrations=MIGRATIONS[:24])
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO tenants (id, name, token_id, token_hash, quotas, "
                    "borrowing_limit, cohort, allowed_priorities, admin, created_at) VALUES "
                    "('t1', 'old', 'tok1', 'hash', '{}', '{}', NULL, "
                    """'["p0","p1","p2"]', false, 1.0)"""
                )
            )
            await connection.execute(
                text(
                    "INSERT INTO work (id, tenant_id, kind, spec, priority, state, attempts, "
                    "submitted_at, updated_at, idempotency_key, version) VALUES "
                    "('w1', 't1', 'training', :spec, 'p1', 'pending', 0, 1.0, 1.0, 'old', 1)"
                ),
                {"spec": old_spec.decode()},
            )
    finally:
        await engine.dispose()
    store = await open_store(database.settings)
    try:
        assert store.migrations.applied == ("0025_submitted_spec_digest",)
        earlier = await store.work_by_idempotency_key("t1", "old")
        assert earlier is not None
        assert (earlier.work_id, earlier.spec, earlier.submitted_spec_sha256) == (
            "w1",
            old_spec,
            None,
        )
        new = await store.submit_work(
            "t1", kind="training", spec=_spec("after"), priority="p1", idempotency_key="new"
        )
        read = await store.work_by_idempotency_key("t1", "new")
        assert read is not None
        assert read.submitted_spec_sha256 == new.work.submitted_spec_sha256
        assert read.submitted_spec_sha256 == submitted_spec_digest(_spec("after"))
    finally:
        await store.close()
