"""Nodes held to what they enrolled as (issue 25), through the real API on SQLite and
PostgreSQL: a node enrolled as an edge node that announces itself as a cloud node with
250 GPUs at speed 1000 waits for an admin's approval, gets no work and no secrets; what
a token fixes (site, work, an inventory ceiling) and what a first birth sets hold; an
admin approves (audited), and speed and power come from the model table unless the
admin trusts the node's own."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app_keys import ENROLLED_NODES, INGESTOR, REGISTRY
from cloud.fleet.registry import NodeRecord
from cloud.loop.nodes import scheduler_node
from shared.messages import Accelerator, HostInfo, NodeStatus, Site, encode
from shared.sealing import public_key_text
from shared.topics import Channel, Topics
from tests.api.support import Api, bearer, job_spec, one_pass, problem
from tests.api.test_enrolment import RecordingAccounts, create_token, enrol, enrolment_api
from tests.store.databases import DatabaseUnderTest
from tests.support.waiting import eventually

T4 = "Tesla T4"  # in the model table: 70 W, relative speed 0.2 (shared/accelerators.py)
GIB = 1024**3


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with enrolment_api(database, RecordingAccounts(), require_enrolment=True) as running:
        yield running


def gpu(index: int, model: str = T4, memory_gib: int = 16, **fields: Any) -> Accelerator:
    return Accelerator(
        id=f"gpu{index}",
        kind="gpu",
        vendor="nvidia",
        model=model,
        memory_bytes=memory_gib * GIB,
        compute_units=40,
        onnx_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        **fields,
    )


def birth(
    node_id: str,
    *,
    site: Site = "edge",
    zone: str = "DE",
    gpus: tuple[Accelerator, ...] = (),
    runs_training: bool = True,
    key: str | None = None,
    instance: str = "i1",
) -> NodeStatus:
    now = time.time()
    return NodeStatus(
        node_id=node_id,
        state="online",
        instance_id=instance,
        agent_version="0.1.0",
        site=site,
        zone=zone,
        region="europe-west3",
        host=HostInfo(
            hostname=node_id,
            os="Linux",
            arch="x86_64",
            cpu_logical_cores=16,
            memory_total_bytes=64 * GIB,
        ),
        accelerators=gpus,
        telemetry_interval_s=5.0,
        started_at=now,
        sent_at=now,
        runs_training=runs_training,
        isolation="sandbox",
        container_runtimes=("podman",),
        sealing_public_key=key,
    )


def announce(api: Api, status: NodeStatus) -> NodeRecord:
    api.app[INGESTOR].handle(
        Topics("enroltest").node(status.node_id, Channel.STATUS), encode(status)
    )
    record = api.app[REGISTRY].get(status.node_id)
    assert record is not None
    return record


async def node_view(api: Api, node_id: str) -> dict[str, Any]:
    response = await api.get(api.admin_token, f"/v1/nodes/{node_id}")
    assert response.status == 200, await response.text()
    view: dict[str, Any] = await response.json()
    return view


async def approve(api: Api, node_id: str, token: str | None = None, **body: Any) -> Any:
    return await api.client.post(
        f"/v1/nodes/{node_id}/approve", json=body, headers=bearer(token or api.admin_token)
    )


async def first_claim_recorded(api: Api, node_id: str) -> None:
    def recorded() -> bool:
        admin = api.app[REGISTRY].admin.get(node_id)
        return admin is not None and admin.approved is not None

    await eventually(recorded, timeout_s=15)


async def test_a_node_lying_within_the_limits_waits_for_approval_and_gets_no_work_or_secrets(
    api: Api,
) -> None:
    """The review's attack: enrolled as an edge node, it announces a cloud node with 250
    GPUs at relative speed 1000; another tenant's jobs (one with a secret) must not go
    there, and it is not trusted with their secrets."""
    key = public_key_text(X25519PrivateKey.generate())
    created = await create_token(api, site="edge")
    assert (await enrol(api, created["token"], "edge-1", sealing_public_key=key)).status == 200
    honest = announce(api, birth("edge-1", gpus=(gpu(0),), key=key))
    assert honest.approval == "approved"
    await first_claim_recorded(api, "edge-1")

    lying = tuple(gpu(i, relative_speed=1000.0, max_power_w=1.0) for i in range(250))
    record = announce(api, birth("edge-1", site="cloud", gpus=lying, key=key, instance="i2"))
    assert record.approval == "pending-approval"
    assert "site 'cloud'; enrolled as 'edge'" in record.awaiting_approval
    assert f"250 gpu {T4!r}; approved 1" in record.awaiting_approval
    view = await node_view(api, "edge-1")
    assert view["approval"] == "pending-approval"
    assert view["receives_secrets"] is False
    assert view["approval_differences"] == list(record.awaiting_approval)
    listed = await (await api.get(api.admin_token, "/v1/nodes?approval=pending-approval")).json()
    assert [node["node_id"] for node in listed["items"]] == ["edge-1"]
    scheduled = scheduler_node(record)
    assert (scheduled.approved, scheduled.receives_secrets) == (False, False)
    # Speed and power are the model table's, never the node's say-so.
    (pool,) = [pool for pool in scheduled.pools if pool.kind == "gpu"]
    assert (pool.relative_speed, pool.max_power_w) == (0.2, 70.0)

    tenant = await api.tenant("globex")
    secret_job = job_spec(
        sites=["cloud", "edge"],
        accelerators_per_worker=1,
        secret_env={"AWS_SECRET_ACCESS_KEY": "aws-Zq8JrT1x"},
        image="ghcr.io/acme/trainer:2",
    )
    job_ids = [await api.submitted(tenant, job_spec(sites=["cloud", "edge"]))]
    job_ids.append(await api.submitted(tenant, secret_job))
    await one_pass(api)
    for job_id in job_ids:
        job = await (await api.get(tenant, f"/v1/jobs/{job_id}")).json()
        assert job["state"] == "pending"
        explained = await (await api.get(tenant, f"/v1/jobs/{job_id}/explain")).json()
        assert "awaiting approval" in msgspec.json.encode(explained).decode()

    # A tenant cannot approve; the admin can, and it is audited with what changed.
    await problem(await approve(api, "edge-1", tenant), 403)
    response = await approve(api, "edge-1")
    assert response.status == 200, await response.text()
    approved = await response.json()
    assert (approved["approval"], approved["receives_secrets"]) == ("approved", True)
    audit = await (await api.get(api.admin_token, "/v1/audit?action=node.approve")).json()
    (entry,) = audit["items"]
    assert entry["target"] == "edge-1"
    assert "site 'cloud'; enrolled as 'edge'" in entry["detail"]["differences"]
    await one_pass(api)
    placed = await (await api.get(tenant, f"/v1/jobs/{job_ids[0]}")).json()
    assert placed["state"] == "scheduled"


async def test_what_a_token_fixes_holds_from_the_first_birth(api: Api) -> None:
    created = await create_token(
        api,
        uses=3,
        work="inference",
        max_accelerators={"gpu": 2},
        accelerator_models=[T4],
        max_accelerator_memory_bytes=16 * GIB,
    )
    assert created["max_accelerators"] == {"gpu": 2}
    for node_id in ("inside", "training", "bigger"):
        assert (await enrol(api, created["token"], node_id)).status == 200
    inside = announce(api, birth("inside", gpus=(gpu(0), gpu(1)), runs_training=False))
    assert inside.approval == "approved"
    training = announce(api, birth("training", gpus=(gpu(0),), runs_training=True))
    assert training.awaiting_approval == ("runs training; enrolled for inference only",)
    bigger = announce(
        api,
        birth(
            "bigger",
            gpus=(gpu(0), gpu(1), gpu(2, model="NVIDIA H200", memory_gib=141)),
            runs_training=False,
        ),
    )
    assert bigger.awaiting_approval == (
        "3 gpu accelerators; at most 2",
        "gpu model 'NVIDIA H200' is not one it enrolled with",
        "gpu memory 141 GiB; at most 16 GiB",
    )
    # Saying less never needs an approval.
    fewer = announce(api, birth("inside", gpus=(gpu(0),), runs_training=False, instance="i2"))
    assert fewer.approval == "approved"
    enrolled = await (await api.get(api.admin_token, "/v1/nodes/enrolled")).json()
    envelope = next(n["envelope"] for n in enrolled["items"] if n["node_id"] == "inside")
    # Neither the token nor the node named a site, zone or region: the first birth's hold.
    assert envelope == {
        "work": "inference",
        "max_accelerators": {"gpu": 2},
        "accelerator_models": [T4],
        "max_accelerator_memory_bytes": 16 * GIB,
    }


async def test_an_admin_may_trust_a_nodes_own_figures(api: Api) -> None:
    created = await create_token(api)
    assert (await enrol(api, created["token"], "lab-1")).status == 200
    unknown = gpu(0, model="Prototype X1", relative_speed=3.0, max_power_w=90.0)
    record = announce(api, birth("lab-1", gpus=(unknown,)))
    (pool,) = [pool for pool in scheduler_node(record).pools if pool.kind == "gpu"]
    assert (pool.relative_speed, pool.max_power_w) == (1.0, 300.0)  # the GPU defaults
    response = await approve(api, "lab-1", trust_figures=True)
    assert response.status == 200, await response.text()
    assert (await response.json())["trusted_figures"] is True
    trusted = api.app[REGISTRY].get("lab-1")
    assert trusted is not None
    (pool,) = [pool for pool in scheduler_node(trusted).pools if pool.kind == "gpu"]
    assert (pool.relative_speed, pool.max_power_w) == (3.0, 90.0)


async def test_an_approval_reaches_every_replica_and_survives_a_restart(
    database: DatabaseUnderTest,
) -> None:
    accounts = RecordingAccounts()
    async with (
        enrolment_api(database, accounts, require_enrolment=True) as first,
        enrolment_api(database, accounts, require_enrolment=True) as second,
    ):
        created = await create_token(first, site="cloud")
        assert (await enrol(first, created["token"], "a100-1")).status == 200
        await eventually(lambda: second.app[ENROLLED_NODES].envelope("a100-1") is not None)
        wrong_site = birth("a100-1", site="edge", gpus=(gpu(0),))
        assert announce(first, wrong_site).approval == "pending-approval"
        assert announce(second, wrong_site).approval == "pending-approval"
        assert (await approve(first, "a100-1")).status == 200

        def approved_on_second() -> bool:
            record = second.app[REGISTRY].get("a100-1")
            return record is not None and record.approval == "approved"

        await eventually(approved_on_second, timeout_s=15)
    async with enrolment_api(database, accounts, require_enrolment=True) as restarted:
        assert announce(restarted, wrong_site).approval == "approved"
        grown = birth("a100-1", site="edge", gpus=(gpu(0), gpu(1)), instance="i2")
        assert announce(restarted, grown).approval == "pending-approval"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("zone", "=cmd|' /C calc'!A0"),
        ("region", "eu west 1"),
        ("labels", {"team": "+SUM(A1)"}),
        ("labels", {"bad key": "v"}),
    ],
)
async def test_enrolment_refuses_names_outside_the_grammar(
    api: Api, field: str, value: Any
) -> None:
    created = await create_token(api)
    body = await problem(await enrol(api, created["token"], "edge-1", **{field: value}), 422)
    assert body["invalid_params"][0]["name"].startswith(f"$.{field}")
    body = await problem(
        await api.client.post(
            "/v1/nodes/join-tokens", json={field: value}, headers=bearer(api.admin_token)
        ),
        422,
    )
    assert body["invalid_params"][0]["name"].startswith(f"$.{field}")
