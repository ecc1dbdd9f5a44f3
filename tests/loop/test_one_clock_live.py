"""One clock, live (issue 30): with the default signals (the shipped 2023 trace
replayed at today's date and hour), the loop's explanations and `/v1/signals`
tell the same "now" — the wall clock's — so the forecast the loop shifts work by
lies ahead of the time it decides at. On the real Mosquitto with a real agent, on
SQLite and PostgreSQL. (The deferral itself, at a fixed hour of the replayed
trace, is tests/signals/test_replay_time.py: live, the hour is today's.)"""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches

pytestmark = pytest.mark.timeout(90)

# Decided in one pass, read a moment later: far less than the years that separated them.
SAME_MOMENT_S = 600.0


async def test_explanations_and_signals_tell_the_same_now(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        job_id = await api.submitted(
            token,
            {
                "name": "train",
                "command": ["python", "train.py"],
                "accelerators_per_worker": 1,
                "estimated_duration_s": 3600.0,
            },
        )
        await reaches(api, token, job_id, "running")
        explained = await (await api.get(token, f"/v1/jobs/{job_id}/explain")).json()
        signals = await (await api.get(token, "/v1/signals")).json()
    decided_at = datetime.fromisoformat(explained["explanation"]["decided_at"])
    now = datetime.fromisoformat(signals["now"])
    assert abs((now - decided_at).total_seconds()) < SAME_MOMENT_S
    (zone,) = signals["zones"]
    assert abs((datetime.fromisoformat(zone["next_24h_cleanest_hour"]) - now).days) <= 1
