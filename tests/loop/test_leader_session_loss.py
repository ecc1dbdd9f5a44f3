"""A PostgreSQL leader whose lock session dies (a database restart or failover, a
network blip, an admin's pg_terminate_backend) while its process lives stops leading
at its next pass, even when that pass has nothing to commit: otherwise it led on beside
the replica that took the lock, and the two publishers rewrote each other's `desired`
documents without end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cloud.app_keys import SCHEDULER
from cloud.loop.inputs import build_inputs
from cloud.store import StoreSnapshot
from cloud.store.fair_share import FairShareRow
from tests.api.support import running_api
from tests.store.databases import postgres_database
from tests.store.leader_lock import end_leader_session
from tests.support.control_plane import FAST_LOOP
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


async def test_an_idle_leader_whose_lock_session_died_stops_leading(tmp_path: Path) -> None:
    async with (
        postgres_database(tmp_path) as database,
        running_api(database, scheduling=FAST_LOOP) as api,
    ):
        loop = api.app[SCHEDULER]
        await eventually(loop.leading.is_set, timeout_s=10, message="it never led")
        schema = database.settings.database_schema
        with capture_logs() as logs:
            assert await end_leader_session(api.store, schema) == [True]
            # No work, no nodes: its passes have nothing to commit.
            await eventually(
                lambda: any(line["event"] == "scheduling leadership lost" for line in logs),
                timeout_s=10,
                message="it still believes it leads on a dead lock session",
            )
        # And it leads again, on a session of its own, once it takes the lock anew.
        await eventually(loop.leading.is_set, timeout_s=15, message="it never led again")


async def test_leading_again_starts_from_the_fair_share_usage_another_leader_wrote(
    tmp_path: Path,
) -> None:
    """A leader that lost the lock and takes it again counts fair share from what the
    store holds then (what the leader in between wrote), not from what it had counted
    before: its old accumulators would hide every tenant's usage in between."""
    async with (
        postgres_database(tmp_path) as database,
        running_api(database, scheduling=FAST_LOOP) as api,
    ):
        loop = api.app[SCHEDULER]
        await eventually(
            lambda: loop.leading_fair_share() is not None, timeout_s=10, message="it never led"
        )
        # What another leader counted while this one did not lead.
        now = time.time()
        await api.store.put_fair_share_usage(
            [FairShareRow(tenant="busy", accelerator_seconds={"gpu": 3600.0}, as_of=now)]
        )
        await end_leader_session(api.store, database.settings.database_schema)

        def counts_busy() -> bool:
            ledger = loop.leading_fair_share()
            if ledger is None:
                return False
            empty = StoreSnapshot(tenants=(), work=(), allocations=(), node_generations={})
            seen = ledger.preview(build_inputs(time.time(), [], empty), time.time())
            return "busy" in seen.snapshot.past_usage

        await eventually(counts_busy, timeout_s=20, message="its old accumulators hid it")
