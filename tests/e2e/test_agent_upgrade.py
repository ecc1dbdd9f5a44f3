"""Agents upgrade themselves over the air (issue 27), end to end: real agents, each run
by `greenfed edge run` as installed (the upgrade supervisor and its agent), on Mosquitto,
with a control plane that serves greenfed wheels built from this checkout.

A good version reaches every node in waves (the canaries first) and each agent comes
back in it; a deliberately broken version (its agent cannot even import) is tried by
every node, and every node rolls back to the version it ran and says so, and the
rollout halts."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from cloud.app_keys import REGISTRY, SIGNING_KEY
from shared import __version__
from shared.desired_signature import public_key_base64
from tests.api.support import Api, bearer, running_api
from tests.store.databases import DatabaseUnderTest
from tests.support.brokers import BrokerUnderTest
from tests.support.control_plane import FAST_LOOP
from tests.support.fleet import mqtt_settings
from tests.support.processes import GreenfedProcess
from tests.support.waiting import eventually, eventually_async
from tests.support.wheels import build_wheel

pytestmark = pytest.mark.timeout(300)

NODES = [f"ota-{index}" for index in range(3)]
GOOD = f"{__version__}.post7"
BROKEN = f"{__version__}.post8"
BROKEN_MAIN = 'raise RuntimeError("a deliberately broken agent package")\n'


def agent_config(tmp_path: Path, node_id: str, url: str, root: str, key: str) -> Path:
    config = tmp_path / f"{node_id}.toml"
    config.write_text(
        f'[mqtt]\nurl = "{url}"\ntopic_root = "{root}"\n'
        f'[agent]\nnode_id = "{node_id}"\nsite = "edge"\nzone = "DE"\n'
        'region = "europe-west3"\ntelemetry_interval_s = 0.5\nprobes = ["cpu"]\n'
        f'data_dir = "{tmp_path / node_id}"\ncontrol_plane_public_key = "{key}"\n'
    )
    return config


async def publish(api: Api, wheel: Path) -> None:
    response = await api.client.post(
        "/v1/agent-packages",
        data=await asyncio.to_thread(wheel.read_bytes),
        headers=bearer(api.admin_token) | {"Content-Type": "application/octet-stream"},
    )
    assert response.status == 201, await response.text()


async def roll_out(api: Api, **rules: Any) -> str:
    response = await api.client.post(
        "/v1/agent-rollouts", json=rules, headers=bearer(api.admin_token)
    )
    assert response.status == 201, await response.text()
    rollout_id = (await response.json())["rollout_id"]
    assert isinstance(rollout_id, str)
    return rollout_id


async def rollout(api: Api, rollout_id: str) -> dict[str, Any]:
    response = await api.get(api.admin_token, f"/v1/agent-rollouts/{rollout_id}")
    assert response.status == 200, await response.text()
    document: dict[str, Any] = await response.json()
    return document


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
@pytest.mark.parametrize("broker", ["mosquitto"], indirect=True)
async def test_agents_upgrade_in_waves_and_all_roll_back_a_broken_version(
    database: DatabaseUnderTest, broker: BrokerUnderTest, topic_root: str, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    good = build_wheel(wheels, GOOD)
    broken = build_wheel(wheels, BROKEN, replace={"edge/main.py": BROKEN_MAIN})
    mqtt = mqtt_settings(broker.url, topic_root)
    async with running_api(database, mqtt=mqtt, scheduling=FAST_LOOP) as api:
        registry = api.app[REGISTRY]
        key = public_key_base64(api.app[SIGNING_KEY])
        agents = [
            GreenfedProcess(
                [
                    "edge",
                    "run",
                    "--config",
                    str(agent_config(tmp_path, n, broker.url, topic_root, key)),
                ],
                tmp_path,
            )
            for n in NODES
        ]

        def stderr() -> str:
            return "\n".join(
                f"--- {n}:\n{a.stderr[-3000:]}" for n, a in zip(NODES, agents, strict=True)
            )

        def versions() -> dict[str, str | None]:
            records = {n: registry.get(n) for n in NODES}
            return {
                n: r.status.agent_version if r is not None and r.state == "online" else None
                for n, r in records.items()
            }

        for agent in agents:
            await agent.start()
        try:
            await eventually(
                lambda: all(
                    (r := registry.get(n)) is not None
                    and r.state == "online"
                    and r.status.self_upgrade
                    for n in NODES
                ),
                timeout_s=60,
                message=stderr,
            )
            assert set(versions().values()) == {__version__}

            # A good version: the canaries (34 % of 3: 2 nodes), then the last one.
            await publish(api, good)
            good_rollout = await roll_out(api, version=GOOD, canary_percent=34, max_failure_share=0)
            await eventually(
                lambda: set(versions().values()) == {GOOD}, timeout_s=120, message=stderr
            )

            async def good_over() -> bool:
                return bool((await rollout(api, good_rollout))["phase"] != "running")

            await eventually_async(good_over, timeout_s=60)
            done = await rollout(api, good_rollout)
            assert done["phase"] == "succeeded", done
            assert [wave["nodes"] for wave in done["waves"]] == [2, 1]
            assert done["counts"] == {"upgraded": 3}
            # The same processes: each supervisor started its agent again in the new version.
            assert all(
                agent.process is not None and agent.process.returncode is None for agent in agents
            )

            # A broken version, asked of every node at once: each tries it, its agent cannot
            # start, its supervisor goes back to GOOD, whose birth says so.
            await publish(api, broken)
            broken_rollout = await roll_out(
                api, version=BROKEN, canary_percent=100, health_timeout_s=60
            )

            async def broken_over() -> bool:
                # Halted at the first failure; the nodes already on their way still finish.
                document = await rollout(api, broken_rollout)
                return document["phase"] != "running" and "upgrading" not in document["counts"]

            await eventually_async(broken_over, timeout_s=150)
            halted = await rollout(api, broken_rollout)
            assert halted["phase"] == "halted", halted
            assert halted["counts"] == {"failed": 3}
            for entry in halted["nodes"].values():
                assert entry["detail"].startswith("rolled-back: the new version exited"), entry
            await eventually(
                lambda: set(versions().values()) == {GOOD}, timeout_s=60, message=stderr
            )
            for node_id in NODES:
                record = registry.get(node_id)
                assert record is not None
                assert record.status.agent_upgrade is not None
                assert record.status.agent_upgrade.version == BROKEN
                assert record.status.agent_upgrade.outcome == "rolled-back"
            assert "a deliberately broken agent package" in agents[0].stderr
        finally:
            codes = [(await agent.stop(signal.SIGTERM, timeout_s=20))[0] for agent in agents]
        assert codes == [0, 0, 0], stderr()
