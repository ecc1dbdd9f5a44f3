"""Topology and MIG slices live: real agents on simulated hardware over the real
Mosquitto, on SQLite and PostgreSQL. Every node carries the well-known labels, which
selectors and affinity match; a training gang stays within one region (it waits,
saying why, rather than span Los Angeles and Frankfurt); a job asking for a MIG
profile runs on one slice of the MIG node and its worker sees that slice alone."""

from __future__ import annotations

from typing import Any

import pytest

from cloud.app_keys import SETTINGS
from tests.api.support import bearer
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.processes import run_greenfed
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(120)

ZONES = (
    ("DE", "europe-west3"),
    ("US-CAL-CISO", "us-west2"),
    ("DE", "europe-west3"),
    ("CA-ON", "northamerica-northeast2"),
)


def job(name: str, **fields: Any) -> dict[str, Any]:
    # Long enough to hold its GPUs while the test looks.
    return {"name": name, "command": ["python", "train.py"], "estimated_duration_s": 600, **fields}


async def test_labels_topology_and_mig_slices_live(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(
        database,
        mosquitto_root,
        cloud_nodes=4,
        cloud_zones=ZONES,
        cloud_profiles=("a100-4x", "a100-4x", "a100-4x", "a100-mig"),
    ) as running:
        api = running.api
        admin = bearer(api.admin_token)

        # The well-known labels, from the birth; an admin may add a rack, not move a zone.
        node = await (await api.get(api.admin_token, "/v1/nodes/a100-1")).json()
        assert {key: node["labels"][key] for key in ("site", "zone", "region", "hostname")} == {
            "site": "cloud",
            "zone": "US-CAL-CISO",
            "region": "us-west2",
            "hostname": "a100-1",
        }
        moved = await api.client.patch(
            "/v1/nodes/a100-0", json={"labels": {"zone": "FR"}}, headers=admin
        )
        assert moved.status == 422
        assert (await moved.json())["invalid_params"][0]["name"] == "$.labels.zone"
        racked = await api.client.patch(
            "/v1/nodes/a100-0", json={"labels": {"rack": "r1"}}, headers=admin
        )
        assert racked.status == 200, await racked.text()
        assert (await racked.json())["labels"]["rack"] == "r1"

        token = await api.tenant("acme")
        # docs/cli.md's affinity on zone, with the hostname label: it lands on a100-2.
        holder = await api.submitted(
            token,
            job(
                "holder",
                accelerators_per_worker=4,
                node_selector={"hostname": "a100-2"},
                affinity=[{"key": "zone", "operator": "In", "values": ["CA-ON", "DE"]}],
            ),
        )
        placed = await reaches(api, token, holder, "running")
        assert placed["nodes"] == ["a100-2"]

        # Frankfurt has one free node, Los Angeles one: the gang waits for one region.
        gang = await api.submitted(token, job("gang", workers=2, accelerators_per_worker=4))

        async def waits_for_one_region() -> bool:
            explained = await (await api.get(token, f"/v1/jobs/{gang}/explain")).json()
            return "within one region (topology)" in explained["message"]

        await eventually_async(waits_for_one_region, timeout_s=20, message="no topology reason")
        assert (await work(api, token, gang))["state"] == "pending"

        cancelled = await api.client.delete(f"/v1/jobs/{holder}", headers=bearer(token))
        assert cancelled.status in (200, 202), await cancelled.text()
        together = await reaches(api, token, gang, "running", timeout_s=30)
        assert sorted(together["nodes"]) == ["a100-0", "a100-2"]

        # Three workers of four GPUs: the fleet holds three, but no one region does.
        spanning = await api.submit(token, job("wide", workers=3, accelerators_per_worker=4))
        assert spanning.status == 422
        assert (await spanning.json())["invalid_params"][0]["name"] == "$.topology"

        # A MIG slice job: one 1g.10gb slice of a100-3, seen by its worker by MIG UUID.
        tiny = await api.submitted(token, job("tiny", mig_profile="1g.10gb"))
        on_slice = await reaches(api, token, tiny, "running")
        assert on_slice["nodes"] == ["a100-3"]
        launcher = running.launchers["a100-3"]
        ((spec, env),) = [(s, e) for s, e, _ in launcher.runs if s.job_id == tiny]
        (slice_id,) = spec.accelerator_ids
        assert slice_id.startswith("gpu0-mig")
        slices = {a.id: a.uuid for a in launcher.inventory}
        assert env["CUDA_VISIBLE_DEVICES"] == slices[slice_id]
        assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
        # A profile no node offers is refused at submission, naming the field.
        refused = await api.submit(token, job("big-slice", mig_profile="3g.40gb"))
        assert refused.status == 422
        assert (await refused.json())["invalid_params"][0]["name"] == "$.mig_profile"


async def test_slices_count_against_their_profiles_quota_live(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(
        database, mosquitto_root, cloud_nodes=1, cloud_profiles=("a100-mig",)
    ) as running:
        api = running.api
        token = await api.tenant("acme", quotas={"gpu": 1, "mig-1g.10gb": 1})
        listed = await (await api.get(api.admin_token, "/v1/tenants")).json()
        (acme,) = [t for t in listed["items"] if t["name"] == "acme"]
        assert acme["quotas"] == {"gpu": 1, "mig-1g.10gb": 1}
        bad = await api.client.post(
            "/v1/tenants",
            json={"name": "other", "quotas": {"mig-huge": 1}},
            headers=bearer(api.admin_token),
        )
        assert bad.status == 422

        first = await api.submitted(token, job("first", mig_profile="1g.10gb"))
        await reaches(api, token, first, "running")
        # The slice does not count as the tenant's one GPU: a whole-GPU job runs too.
        whole = await api.submitted(token, job("whole", memory_gib=40))
        assert (await reaches(api, token, whole, "running"))["nodes"] == ["a100-0"]
        second = await api.submitted(token, job("second", mig_profile="1g.10gb"))

        async def over_its_slice_quota() -> bool:
            body = await work(api, token, second)
            return body["state"] == "pending" and "mig-1g.10gb slices" in (body["reason"] or "")

        await eventually_async(over_its_slice_quota, timeout_s=20, message="no quota reason")

        # `greenfed tenants set acme --quota ...` raises it: the second slice job runs.
        base = api.app[SETTINGS].cloud.public_url
        assert base is not None
        code, _, errors = await run_greenfed(
            [
                "tenants", "set", "acme", "--quota", "gpu=1", "--quota", "mig-1g.10gb=2",
                "--api", base, "--token", api.admin_token,
            ]
        )  # fmt: skip
        assert code == 0, errors
        await reaches(api, token, second, "running")
