"""`greenfed agent-packages` and `greenfed nodes upgrade|rollouts` through the real command
line against the real app: what an admin types to publish a version, roll it out and
follow or cancel the rollout."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared import secret_hashes
from tests.api.support import Api, running_api
from tests.api.test_agent_upgrades import register, wheel_bytes
from tests.cli.test_admin_cli import Cli
from tests.store.databases import DatabaseUnderTest

# What is printed does not depend on the store (tests/api/test_agent_upgrades.py runs both).
pytestmark = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


@pytest.fixture
async def api(database: DatabaseUnderTest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.setattr(secret_hashes, "SCRYPT_LOG2_N", 10)
    async with running_api(database) as running:
        yield running


async def test_an_admin_publishes_rolls_out_follows_and_cancels(
    api: Api, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cli = Cli(api, capfd)
    for node_id in ("n1", "n2", "n3", "n4"):
        register(api, node_id)
    wheel = tmp_path / "greenfed-9.0.0-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes("9.0.0"))

    code, out, err = await cli.run("agent-packages", "publish", str(wheel))
    assert code == 0, err
    assert "agent 9.0.0 published" in out
    assert "greenfed nodes upgrade --version 9.0.0" in out
    code, out, err = await cli.run("agent-packages", "list", "-o", "json")
    assert code == 0, err
    assert [item["version"] for item in json.loads(out)["items"]] == ["9.0.0"]

    code, out, err = await cli.run(
        "nodes", "upgrade", "--version", "9.0.0", "--canary", "25%", "--nodes", "n1,n2",
        "--nodes", "n3", "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    rollout = json.loads(out)
    assert sorted(rollout["nodes"]) == ["n1", "n2", "n3"]
    assert rollout["rules"]["canary_percent"] == 25
    rollout_id = rollout["rollout_id"]

    code, out, err = await cli.run("nodes", "rollouts")
    assert code == 0, err
    assert rollout_id in out
    assert "running" in out
    code, out, err = await cli.run("nodes", "rollouts", rollout_id, "-o", "wide")
    assert code == 0, err
    assert f"rollout {rollout_id} of agent 9.0.0: running" in out
    assert all(node_id in out for node_id in ("n1", "n2", "n3"))  # wide: every node

    code, out, err = await cli.run("nodes", "rollouts", rollout_id, "--cancel")
    assert code == 0, err
    assert "cancelled" in out
    code, out, err = await cli.run("nodes", "rollouts", rollout_id, "--watch")
    assert code == 1, (out, err)  # over, and not a success
    assert "cancelled by an admin" in out


async def test_a_percentage_that_is_none_is_refused_naming_the_option_and_the_value(
    api: Api, capfd: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capfd)
    code, _, err = await cli.run("nodes", "upgrade", "--version", "9.0.0", "--canary", "ten")
    assert code == 2
    assert "argument --canary: 'ten' is not a percentage such as 10%" in err
