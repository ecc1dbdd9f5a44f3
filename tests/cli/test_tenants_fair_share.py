"""`greenfed tenants` shows each tenant's cohort path, dominant share, decayed usage
and standing among its siblings (the real command line against the real app, both
backends)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from cloud.store.fair_share import FairShareRow
from shared import secret_hashes
from shared.settings import CohortSettings, SchedulingSettings
from tests.api.support import Api, running_api
from tests.cli.test_admin_cli import Cli
from tests.store.databases import DatabaseUnderTest

pytestmark = pytest.mark.timeout(120)
HALF_LIFE_S = 3600.0


@pytest.fixture(autouse=True)
def cheap_token_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    scheduling = SchedulingSettings(
        enabled=False,
        fair_share_half_life_s=HALF_LIFE_S,
        cohorts={"research": CohortSettings(parent="org")},
    )
    async with running_api(database, scheduling=scheduling) as running:
        yield running


async def test_tenants_shows_path_share_decayed_usage_and_standing(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    for name in ("vision", "speech"):
        code, _, err = await cli.run(
            "tenants", "create", name, "--quota", "gpu=4", "--cohort", "research"
        )
        assert code == 0, err
    rate = 0.6931471805599453 / HALF_LIFE_S
    await api.store.put_fair_share_usage([FairShareRow("vision", {"gpu": 2 / rate}, time.time())])
    code, out, err = await cli.run("tenants", "-o", "wide")
    assert code == 0, err
    vision = next(line for line in out.splitlines() if " vision " in line)
    speech = next(line for line in out.splitlines() if " speech " in line)
    assert "org/research" in vision
    assert "0.500" in vision  # (0 held + 2 decayed) / 4
    assert "gpu=2" in vision
    assert "2 of 2" in vision
    assert "1 of 2" in speech

    code, out, err = await cli.run("tenants", "set", "vision", "--lend", "gpu=2")
    assert code == 0, err
    assert "cohort research, lends at most gpu=2" in out
    code, out, err = await cli.run("tenants", "set", "vision", "--no-lending-limit")
    assert code == 0, err
    assert "lends at most" not in out
    code, _, err = await cli.run("tenants", "set", "vision", "--lend", "gpu")
    assert code == 2
    assert "--lend 'gpu': expected KIND=COUNT" in err
