"""A Slurm registration greenfed could not use is refused at `POST /v1/clusters`, a 422
naming the field (cloud/clusters/views.py), not accepted to fail later without saying why:

- `slurm.work_dir` reaches Slurm's records (`scontrol -o` prints `StdOut=<path>` among
  its `Key=Value` pairs, cut at a space) and Slurm's `--output` pattern (where `%` and
  `\\` are Slurm's): no whitespace, control characters, `%` or `\\`;
- `slurm.rest_url` must be a URL slurmrestd can be reached at: a host, a port 1 to 65535,
  nothing after it, no credentials (those are `rest_user` and `rest_token`).

A registration of such a URL made before these rules reaches the bridge, which then says
which key is at fault and why, not only the URL."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from sqlalchemy import update

from cloud.clusters.backend import ClusterUnreachable
from cloud.clusters.slurm.rest_client import SlurmRestAccess, SlurmRestClient
from cloud.clusters.views import SPEC_DECODER
from cloud.store.schema import clusters
from tests.api.support import Api, bearer, problem

pytestmark = pytest.mark.timeout(60)
# Refused before anything is stored: one database says it.
ONE_DATABASE = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


def registration(**slurm: Any) -> dict[str, Any]:
    return {"name": "lab", "zone": "DE", "region": "europe-west3", "slurm": slurm}


@ONE_DATABASE
@pytest.mark.parametrize(
    "work_dir",
    [
        "/shared/with space",
        "/shared/tab\there",
        "/shared/gf\n",
        "/shared/no\u2028break",
        "/shared/%u",
        "/shared/back\\slash",
    ],
)
async def test_a_work_dir_slurm_would_cut_or_expand_is_refused(api: Api, work_dir: str) -> None:
    response = await api.client.post(
        "/v1/clusters", json=registration(work_dir=work_dir), headers=bearer(api.admin_token)
    )
    body = await problem(response, 422)
    assert [param["name"] for param in body["invalid_params"]] == ["$.slurm.work_dir"], body


@ONE_DATABASE
@pytest.mark.parametrize(
    ("rest_url", "why"),
    [
        ("http://127.0.0.1:99999", "port"),
        ("http://127.0.0.1:0", "port"),
        ("http://[::1", "IPv6"),
        ("http://login1:6820?x=1", "nothing after"),
        ("https://greenfed:secret@login1:6820", "rest_token"),
    ],
)
async def test_a_rest_url_slurmrestd_cannot_be_reached_at_is_refused_saying_why(
    api: Api, rest_url: str, why: str
) -> None:
    response = await api.client.post(
        "/v1/clusters", json=registration(rest_url=rest_url), headers=bearer(api.admin_token)
    )
    body = await problem(response, 422)
    (param,) = body["invalid_params"]
    assert param["name"] == "$.slurm.rest_url", body
    assert why.lower() in param["reason"].lower(), body


def test_usable_work_dirs_and_rest_urls_are_accepted() -> None:
    for slurm in (
        {"work_dir": "/shared/greenfed-out/lab_1.2"},
        {"rest_url": "unix:/run/slurmrestd/slurmrestd.socket"},
        {"rest_url": "http://127.0.0.1:6820"},
        {"rest_url": "https://login1.example.org/"},
        {"rest_url": "http://[::1]:6820"},
    ):
        document = registration(**slurm)
        spec = SPEC_DECODER.decode(msgspec.json.encode(document))
        assert spec.slurm.work_dir == slurm.get("work_dir", "/tmp")


async def test_a_malformed_rest_url_kept_from_before_names_the_key_when_used() -> None:
    client = SlurmRestClient(SlurmRestAccess("http://127.0.0.1:99999"))
    try:
        with pytest.raises(ClusterUnreachable) as refused:
            await client.request("GET", "/openapi/v3")
    finally:
        await client.close()
    assert "slurm.rest_url" in str(refused.value)
    assert "Port out of range" in str(refused.value)


async def test_a_registration_todays_rules_refuse_can_still_be_removed(api: Api) -> None:
    # As an earlier greenfed stored it: a work_dir Slurm cuts at its space. It is listed
    # nowhere (the control plane logs it and says to remove it), and removing it works.
    admin = bearer(api.admin_token)
    created = await api.client.post("/v1/clusters", json=registration(), headers=admin)
    assert created.status == 201, await created.text()
    stored = msgspec.json.decode(
        msgspec.json.encode(SPEC_DECODER.decode(msgspec.json.encode(registration())))
    )
    stored["slurm"]["work_dir"] = "/scratch/with space"
    async with api.store._engine.begin() as connection:
        await connection.execute(
            update(clusters)
            .where(clusters.c.name == "lab")
            .values(spec=msgspec.json.encode(stored))
        )
    assert (await api.client.get("/v1/clusters/lab", headers=admin)).status == 404

    removed = await api.client.delete("/v1/clusters/lab", headers=admin)
    assert removed.status == 200, await removed.text()
    assert (await removed.json())["spec"]["name"] == "lab"
    assert (await api.client.delete("/v1/clusters/lab", headers=admin)).status == 404
