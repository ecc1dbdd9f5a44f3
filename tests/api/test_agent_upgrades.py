"""The agent-upgrade API (cloud/api/agent_upgrades.py), on SQLite and PostgreSQL: what is
published is a signed greenfed wheel or a clear refusal, one rollout runs at a time, the
wheel goes only to a signed URL, and every change is audited. Agents upgrading for real:
tests/e2e/test_agent_upgrade.py."""

from __future__ import annotations

import asyncio
import io
import time
import zipfile
from typing import Any

import pytest

from cloud.app_keys import MODEL_URL_SIGNER, REGISTRY, SIGNING_KEY
from cloud.store.agent_upgrades import AgentRolloutRecord
from cloud.upgrades.controller import UpgradeController
from shared.agent_packages import PackageFacts, verify_package_signature
from shared.messages import AgentUpgradeReport, HostInfo, NodeStatus
from tests.api.support import Api, bearer, problem

WHEEL = "application/octet-stream"


def wheel_bytes(version: str = "9.0.0", *, name: str = "greenfed") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("greenfed/__init__.py", "")
        archive.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n"
        )
    return buffer.getvalue()


def register(
    api: Api,
    node_id: str,
    *,
    self_upgrade: bool = True,
    agent_upgrade: AgentUpgradeReport | None = None,
) -> None:
    api.app[REGISTRY].apply_status(
        NodeStatus(
            node_id=node_id,
            state="online",
            instance_id="i",
            agent_version="1.0.0",
            site="edge",
            zone="DE",
            region="r",
            host=HostInfo(
                hostname=node_id,
                os="linux",
                arch="x86_64",
                cpu_logical_cores=2,
                memory_total_bytes=1,
            ),
            accelerators=(),
            telemetry_interval_s=5.0,
            started_at=1.0,
            sent_at=1.0,
            self_upgrade=self_upgrade,
            agent_upgrade=agent_upgrade,
        )
    )


async def publish(api: Api, body: bytes, token: str | None = None) -> Any:
    return await api.client.post(
        "/v1/agent-packages",
        data=body,
        headers=bearer(token or api.admin_token) | {"Content-Type": WHEEL},
    )


async def start(api: Api, **rules: Any) -> Any:
    return await api.client.post("/v1/agent-rollouts", json=rules, headers=bearer(api.admin_token))


async def test_a_published_wheel_is_signed_with_the_desired_documents_key(api: Api) -> None:
    response = await publish(api, wheel_bytes("9.0.0"))
    assert response.status == 201, await response.text()
    package = await response.json()
    assert package["version"] == "9.0.0"
    facts = PackageFacts(
        version="9.0.0", sha256=package["sha256"], size_bytes=package["size_bytes"]
    )
    verify_package_signature(facts, package["signature"], api.app[SIGNING_KEY].public_key())
    listing = await (await api.get(api.admin_token, "/v1/agent-packages")).json()
    assert [item["version"] for item in listing["items"]] == ["9.0.0"]
    again = await publish(api, wheel_bytes("9.0.0"))
    assert (await problem(again, 409))["type"].endswith("agent-package-exists")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"not a zip at all", "not a wheel"),
        (wheel_bytes(name="requests"), "not 'greenfed'"),
        (wheel_bytes(version="1.0 beta"), "not a plain version"),
    ],
    ids=["garbage", "another-project", "odd-version"],
)
async def test_what_is_no_greenfed_wheel_is_a_422_saying_why(
    api: Api, body: bytes, why: str
) -> None:
    body_problem = await problem(await publish(api, body), 422)
    assert why in body_problem["detail"]


async def test_only_an_admin_publishes_and_rolls_out(api: Api) -> None:
    tenant = await api.tenant("team-a")
    assert (await publish(api, wheel_bytes(), token=tenant)).status == 403
    response = await api.client.post(
        "/v1/agent-rollouts", json={"version": "9.0.0"}, headers=bearer(tenant)
    )
    assert response.status == 403


async def test_one_rollout_at_a_time_and_a_cancelled_one_asks_nobody(api: Api) -> None:
    for node_id in ("n1", "n2", "n3"):
        register(api, node_id)
    register(api, "old", self_upgrade=False)
    assert (await publish(api, wheel_bytes("9.0.0"))).status == 201
    missing = await problem(await start(api, version="9.9.9"), 404)
    assert "9.9.9" in missing["detail"]
    unknown = await problem(await start(api, version="9.0.0", nodes=["n1", "ghost"]), 422)
    assert "ghost" in unknown["detail"]
    response = await start(api, version="9.0.0", canary_percent=34)
    assert response.status == 201, await response.text()
    rollout = await response.json()
    assert rollout["phase"] == "running"
    assert rollout["counts"] == {"skipped": 1, "upgrading": 2, "waiting": 1}
    assert [wave["nodes"] for wave in rollout["waves"]] == [2, 1]
    busy = await problem(await start(api, version="9.0.0"), 409)
    assert rollout["rollout_id"] in busy["detail"]
    path = f"/v1/agent-rollouts/{rollout['rollout_id']}"
    cancelled = await api.client.post(f"{path}/cancel", headers=bearer(api.admin_token))
    assert cancelled.status == 200
    assert (await cancelled.json())["phase"] == "cancelled"
    again = await api.client.post(f"{path}/cancel", headers=bearer(api.admin_token))
    assert (await problem(again, 409))["type"].endswith("agent-rollout-over")
    assert (await start(api, version="9.0.0", nodes=["n1"])).status == 201  # free again
    audit = await (await api.get(api.admin_token, "/v1/audit")).json()
    actions = [entry["action"] for entry in audit["items"]]
    for action in ("agent_package.publish", "agent_rollout.create", "agent_rollout.cancel"):
        assert action in actions


async def test_a_cancel_that_meets_a_rollout_the_loop_ended_meanwhile_is_a_409(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin's cancel reads a running rollout; before it writes, the loop halts it
    (its canaries rolled back). The rollout stays halted, as the loop recorded it, and
    the admin is told so rather than that it was cancelled."""
    for node_id in ("n1", "n2", "n3"):
        register(api, node_id)
    assert (await publish(api, wheel_bytes("9.0.0"))).status == 201
    rollout = await (await start(api, version="9.0.0", canary_percent=34)).json()
    rollout_id = rollout["rollout_id"]
    store = api.store
    read = store.agent_rollout
    halts: list[str] = []

    async def read_then_halted(wanted: str) -> AgentRolloutRecord | None:
        record = await read(wanted)
        if not halts:
            halts.append(wanted)
            for node_id, entry in rollout["nodes"].items():
                if entry["state"] == "upgrading":
                    report = AgentUpgradeReport(
                        version="9.0.0",
                        rollout_id=rollout_id,
                        outcome="rolled-back",
                        detail="exited 1",
                        at=time.time(),
                    )
                    register(api, node_id, agent_upgrade=report)
            controller = UpgradeController(store, api.app[MODEL_URL_SIGNER])
            nodes = {node.node_id: node for node in api.app[REGISTRY].nodes()}
            await controller.step(nodes, time.time())
        return record

    monkeypatch.setattr(store, "agent_rollout", read_then_halted)
    async with asyncio.timeout(20):
        response = await api.client.post(
            f"/v1/agent-rollouts/{rollout_id}/cancel", headers=bearer(api.admin_token)
        )
    assert halts == [rollout_id]
    body = await problem(response, 409)
    assert body["type"].endswith("agent-rollout-over")
    assert "halted" in body["detail"]
    after = await read(rollout_id)
    assert after is not None
    assert (after.phase, after.state.detail) == ("halted", "wave 1: 2 of 2 nodes failed")
    audit = await (await api.get(api.admin_token, "/v1/audit")).json()
    assert "agent_rollout.cancel" not in [entry["action"] for entry in audit["items"]]


@pytest.mark.parametrize("sig", ["", "0" * 64, "zz", "%FF", "f" * 1000])
async def test_the_wheel_goes_only_to_a_signed_url(api: Api, sig: str) -> None:
    assert (await publish(api, wheel_bytes("9.0.0"))).status == 201
    for version in ("9.0.0", "9.9.9", "..%2F..%2Fetc"):
        response = await api.client.get(f"/v1/agent-packages/{version}/wheel?sig={sig}")
        assert response.status == 403, (version, sig)


async def test_the_signed_url_serves_the_very_bytes_published(api: Api) -> None:
    from cloud.app_keys import MODEL_URL_SIGNER
    from cloud.upgrades.packages import package_url

    body = wheel_bytes("9.0.0")
    package = await (await publish(api, body)).json()
    url = package_url(api.app[MODEL_URL_SIGNER], "9.0.0", package["sha256"])
    path = url.split("://", 1)[1].split("/", 1)[1]
    response = await api.client.get(f"/{path}")
    assert response.status == 200
    assert await response.read() == body
    assert package["size_bytes"] == len(body)
