"""`GET /v1/tenants` shows each tenant's standing in fair sharing: its cohort path from
the settings' tree, its decayed past usage as the scheduling leader wrote it, its
dominant share and its rank among its siblings (on SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from cloud.store.fair_share import FairShareRow
from shared.settings import CohortSettings, SchedulingSettings
from tests.api.support import Api, bearer, problem, running_api
from tests.store.databases import DatabaseUnderTest

HALF_LIFE_S = 3600.0


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    scheduling = SchedulingSettings(
        enabled=False,
        fair_share_half_life_s=HALF_LIFE_S,
        cohorts={
            "research": CohortSettings(parent="org", lending_limit={"gpu": 4}),
            "prod": CohortSettings(parent="org"),
        },
    )
    async with running_api(database, scheduling=scheduling) as running:
        yield running


async def test_tenants_show_their_path_decayed_usage_share_and_rank(api: Api) -> None:
    await api.tenant("vision", quotas={"gpu": 8}, cohort="research")
    await api.tenant("speech", quotas={"gpu": 8}, cohort="research")
    await api.tenant("serving", quotas={"gpu": 16}, cohort="prod")
    await api.tenant("loner", quotas={"gpu": 4})
    now = time.time()
    # vision held 4 GPUs on average (decayed), as of now; speech half that an hour ago.
    rate = 0.6931471805599453 / HALF_LIFE_S
    await api.store.put_fair_share_usage(
        [
            FairShareRow("vision", {"gpu": 4 / rate}, now),
            FairShareRow("speech", {"gpu": 4 / rate}, now - HALF_LIFE_S),
        ]
    )
    listed = await (await api.get(api.admin_token, "/v1/tenants")).json()
    shares = {item["name"]: item["fair_share"] for item in listed["items"]}
    vision, speech = shares["vision"], shares["speech"]
    assert vision["parent_path"] == ["org", "research"]
    assert shares["serving"]["parent_path"] == ["org", "prod"]
    assert shares["loner"]["parent_path"] == []
    assert vision["decayed_usage"]["gpu"] == pytest.approx(4.0, rel=1e-3)
    assert speech["decayed_usage"]["gpu"] == pytest.approx(2.0, rel=1e-3)
    assert vision["dominant_share"] == pytest.approx(0.5, rel=1e-3)
    assert speech["dominant_share"] == pytest.approx(0.25, rel=1e-3)
    assert vision["held"] == {}
    # Among research's members, speech (less past usage) is served first.
    assert (speech["rank"], vision["rank"], vision["siblings"]) == (1, 2, 2)
    assert (shares["serving"]["rank"], shares["serving"]["siblings"]) == (1, 1)
    assert shares["serving"]["dominant_share"] == 0.0


async def test_the_fair_share_rows_are_upserted(api: Api) -> None:
    await api.store.put_fair_share_usage([FairShareRow("vision", {"gpu": 10.0}, 100.0)])
    await api.store.put_fair_share_usage(
        [FairShareRow("vision", {"gpu": 20.0, "cpu": 5.0}, 200.0), FairShareRow("x", {}, 1.0)]
    )
    rows = await api.store.fair_share_usage()
    assert rows["vision"] == FairShareRow("vision", {"gpu": 20.0, "cpu": 5.0}, 200.0)
    assert rows["x"] == FairShareRow("x", {}, 1.0)


async def test_a_tenants_lending_limit_is_stored_changed_and_checked(api: Api) -> None:
    created = await api.client.post(
        "/v1/tenants",
        json={
            "name": "vision",
            "quotas": {"gpu": 8},
            "cohort": "research",
            "lending_limit": {"gpu": 2},
        },
        headers=bearer(api.admin_token),
    )
    assert created.status == 201, await created.text()
    assert (await created.json())["lending_limit"] == {"gpu": 2}
    changed = await api.client.patch(
        "/v1/tenants/vision", json={"lending_limit": {"gpu": 4}}, headers=bearer(api.admin_token)
    )
    assert changed.status == 200, await changed.text()
    assert (await changed.json())["lending_limit"] == {"gpu": 4}
    listed = await (await api.get(api.admin_token, "/v1/tenants")).json()
    vision = next(t for t in listed["items"] if t["name"] == "vision")
    assert vision["lending_limit"] == {"gpu": 4}
    audited = await (await api.get(api.admin_token, "/v1/audit?action=tenant.update")).json()
    (entry,) = audited["items"]
    assert entry["detail"] == {"lending_limit": {"from": {"gpu": 2}, "to": {"gpu": 4}}}
    for body in ({"lending_limit": {"gpu": -1}}, {"lending_limit": {"tpu": 1}}):
        refused = await api.client.patch(
            "/v1/tenants/vision", json=body, headers=bearer(api.admin_token)
        )
        found = await problem(refused, 422)
        assert found["invalid_params"][0]["name"].startswith("$.lending_limit"), found
