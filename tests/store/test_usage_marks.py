"""How far each node's telemetry was counted (`usage_marks`): any sequence number the
wire lets through is kept, and a database from before v0021 keeps its marks."""

from __future__ import annotations

from sqlalchemy import text

from cloud.store import Store, create_store_engine, open_store, resolve_database
from cloud.store.migrate import migrate
from cloud.store.migrations import MIGRATIONS
from cloud.store.usage import UsageMark, UsageWrite
from tests.store.databases import DatabaseUnderTest

# The largest `Telemetry.seq` the wire takes (shared/messages.py).
LARGEST_WIRE_SEQ = 2**53


async def _write_marks(store: Store, *marks: UsageMark) -> None:
    lease = await store.try_acquire_leadership()
    assert lease is not None
    try:
        await store.write_usage(UsageWrite(marks=marks), lease=lease)
    finally:
        await lease.release()


async def test_a_mark_past_32_bits_is_kept_and_other_nodes_are_still_counted(
    store: Store,
) -> None:
    """One node's large number (its agent says it has sent samples for years) must not
    fail the flush that moves every node's mark."""
    beyond_int4 = UsageMark("rogue", "i-rogue", 2**31, 100.0, {"gpu0": 5.0})
    largest = UsageMark("old", "i-old", LARGEST_WIRE_SEQ, 100.0, {})
    ordinary = UsageMark("n1", "i-n1", 7, 100.0, {"gpu0": 1.5})
    await _write_marks(store, beyond_int4, largest, ordinary)
    assert await store.usage_marks() == {"rogue": beyond_int4, "old": largest, "n1": ordinary}
    moved = UsageMark("rogue", "i-rogue", 2**31 + 1, 110.0, {"gpu0": 6.0})
    await _write_marks(store, moved)
    assert (await store.usage_marks())["rogue"] == moved


async def test_migrating_keeps_the_marks_of_a_database_from_before_v21(
    database: DatabaseUnderTest,
) -> None:
    engine = create_store_engine(database.settings)
    try:
        await migrate(engine, resolve_database(database.settings), migrations=MIGRATIONS[:20])
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO usage_marks (node_id, instance_id, seq, sampled_at, energy_j) "
                    """VALUES ('n1', 'i-n1', 2147483647, 100.5, '{"gpu0": 12.5}')"""
                )
            )
    finally:
        await engine.dispose()
    store = await open_store(database.settings)
    try:
        assert store.migrations.applied[0] == "0021_usage_mark_seq_bigint"
        kept = UsageMark("n1", "i-n1", 2**31 - 1, 100.5, {"gpu0": 12.5})
        assert await store.usage_marks() == {"n1": kept}
        # The node's next sample, one past an int4, moves the migrated mark.
        next_sample = UsageMark("n1", "i-n1", 2**31, 101.5, {"gpu0": 13.5})
        await _write_marks(store, next_sample)
        assert await store.usage_marks() == {"n1": next_sample}
    finally:
        await store.close()
