"""Fair share in the live loop, on the real Mosquitto with a real agent, on SQLite and
PostgreSQL: two sibling tenants of a cohort want the whole fleet at once; the one with
less decayed past usage is served first, though it submitted later, and
`GET /v1/tenants` shows why (paths, decayed usage, shares, ranks)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.settings import CohortSettings
from tests.api.support import Api, bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import FAST_LOOP, fleet, reaches
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(120)

SCHEDULING = msgspec.structs.replace(
    FAST_LOOP,
    fair_share_half_life_s=3600.0,
    cohorts={"lab": CohortSettings(parent="org"), "org": CohortSettings()},
)


def job(name: str, gpus: int, duration_s: float) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["python", "train.py"],
        "accelerators_per_worker": gpus,
        "estimated_duration_s": duration_s,
    }


async def fair_shares(api: Api) -> dict[str, dict[str, Any]]:
    response = await api.get(api.admin_token, "/v1/tenants")
    assert response.status == 200, await response.text()
    return {item["name"]: item["fair_share"] for item in (await response.json())["items"]}


async def test_the_sibling_with_less_decayed_usage_is_served_first(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1, scheduling=SCHEDULING) as running:
        api = running.api
        vision = await api.tenant("vision", quotas={"gpu": 4}, cohort="lab")
        speech = await api.tenant("speech", quotas={"gpu": 4}, cohort="lab")
        ops = await api.tenant("ops")  # no quota: the blocker's owner

        # vision has used the whole fleet for a while; speech never has.
        earlier = await api.submitted(vision, job("earlier", 4, 2.0))
        await reaches(api, vision, earlier, "succeeded", timeout_s=30)
        blocker = await api.submitted(ops, job("blocker", 4, 3600.0))
        await reaches(api, ops, blocker, "running")
        first = await api.submitted(vision, job("first", 4, 3600.0))
        second = await api.submitted(speech, job("second", 4, 3600.0))
        await reaches(api, vision, first, "pending")
        await reaches(api, speech, second, "pending")

        # The leader writes decayed usage every 30 s at most; its first write is at once.
        seen: dict[str, dict[str, Any]] = {}

        async def ranked() -> bool:
            seen.update(await fair_shares(api))
            return bool(seen["vision"]["decayed_usage"].get("gpu", 0) > 0)

        await eventually_async(ranked, timeout_s=40, message=lambda: f"no decayed usage: {seen}")
        assert seen["vision"]["parent_path"] == ["org", "lab"]
        assert seen["speech"]["decayed_usage"] == {}
        assert seen["vision"]["dominant_share"] > seen["speech"]["dominant_share"] == 0.0
        assert (seen["speech"]["rank"], seen["vision"]["rank"], seen["vision"]["siblings"]) == (
            1, 2, 2,
        )  # fmt: skip

        # The fleet frees: speech's job goes first, though vision's was submitted first.
        response = await api.client.delete(f"/v1/jobs/{blocker}", headers=bearer(ops))
        assert response.status == 200, await response.text()
        await reaches(api, speech, second, "running")
        waiting = await reaches(api, vision, first, "pending")
        assert waiting["state"] == "pending"
        now = await fair_shares(api)
        assert now["speech"]["held"] == {"gpu": 4}
