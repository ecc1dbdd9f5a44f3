"""The store across processes: concurrent starts, and durability through SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import msgspec

from cloud.store import open_store
from cloud.store.migrations import MIGRATIONS
from tests.store.builders import make_tenant
from tests.store.databases import DatabaseUnderTest

CHILD = Path(__file__).with_name("child.py")
ACKNOWLEDGED_BEFORE_KILL = 300


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def test_processes_started_together_migrate_exactly_once(
    database: DatabaseUnderTest,
) -> None:
    settings_json = msgspec.json.encode(database.settings).decode()
    children = [await _spawn("open", settings_json) for _ in range(3)]
    outputs = await asyncio.wait_for(
        asyncio.gather(*(child.communicate() for child in children)), 30
    )
    for child, (_, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr.decode()
    applied = [json.loads(stdout) for stdout, _ in outputs]
    # Each migration exactly once in all (with SQLite, one process may apply the first
    # and another the next: each migration is its own transaction).
    assert sorted(label for labels in applied for label in labels) == [
        f"{m.version:04d}_{m.name}" for m in MIGRATIONS
    ]


async def test_every_acknowledged_submission_survives_sigkill(
    database: DatabaseUnderTest,
) -> None:
    store = await open_store(database.settings)
    tenant = (await make_tenant(store, "durable")).tenant
    await store.close()

    child = await _spawn(
        "submit", msgspec.json.encode(database.settings).decode(), tenant.tenant_id
    )
    assert child.stdout is not None
    acknowledged: dict[int, str] = {}
    async with asyncio.timeout(30):
        assert (await child.stdout.readline()).strip() == b"ready"
        while len(acknowledged) < ACKNOWLEDGED_BEFORE_KILL:
            line = await child.stdout.readline()
            assert line, (await child.stderr.read()).decode() if child.stderr else "child died"
            number, work_id = line.decode().split()
            acknowledged[int(number)] = work_id
        # Killed while it is still submitting: the next transaction is in flight.
        child.send_signal(signal.SIGKILL)
        remaining = await child.stdout.read()
        await child.wait()
    for text_line in remaining.decode().splitlines(keepends=True):
        if text_line.endswith("\n"):  # a line cut short was never acknowledged
            number, work_id = text_line.split()
            acknowledged[int(number)] = work_id
    assert child.returncode == -signal.SIGKILL

    reopened = await open_store(database.settings)
    try:
        for index, work_id in acknowledged.items():
            record = await reopened.get_work(tenant.tenant_id, work_id)
            assert record is not None, f"acknowledged work {index} ({work_id}) was lost"
            assert record.idempotency_key == f"key-{index}"
        # A client retrying an acknowledged submission gets the original, no duplicate.
        last = max(acknowledged)
        retry = await reopened.submit_work(
            tenant.tenant_id,
            kind="training",
            spec=msgspec.json.encode({"index": last}),
            priority="p1",
            idempotency_key=f"key-{last}",
        )
        assert (retry.created, retry.work.work_id) == (False, acknowledged[last])
        stored = await reopened.list_work(tenant.tenant_id, limit=1000)
        keys = [record.idempotency_key for record in stored.items]
        assert len(keys) == len(set(keys))
    finally:
        await reopened.close()
