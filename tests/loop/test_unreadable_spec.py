"""Work whose stored spec this greenfed cannot read (written by a newer version during
a rolling upgrade, then led by this one again) is failed with the reason, pending or
placed: a placed one made every pass fail as it built its node's desired document, so
nothing else on the fleet was placed, published or finished."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from sqlalchemy import update

from cloud.store.schema import work as work_table
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches

pytestmark = pytest.mark.timeout(90)


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": ["python", "train.py"], **fields}


async def test_placed_work_a_newer_greenfed_wrote_fails_and_the_fleet_goes_on(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        first = await api.submitted(token, job("first", estimated_duration_s=3600))
        await reaches(api, token, first, "running")
        record = await api.store.find_work(first)
        assert record is not None
        spec = msgspec.json.decode(record.spec)
        spec["a_field_of_a_newer_version"] = 1
        async with api.store._write() as connection:
            await connection.execute(
                update(work_table)
                .where(work_table.c.id == first)
                .values(spec=msgspec.json.encode(spec), version=work_table.c.version + 1)
            )
        second = await api.submitted(token, job("second", estimated_duration_s=1))
        failed = await reaches(api, token, first, "failed", timeout_s=30)
        assert "cannot be scheduled" in (failed["reason"] or ""), failed
        await reaches(api, token, second, "succeeded", timeout_s=30)
        # Its views show the fields this version knows: no 500 for it, nor its listing.
        listed = await api.get(token, "/v1/jobs")
        assert listed.status == 200, await listed.text()
        assert first in {item["id"] for item in (await listed.json())["items"]}
