"""A job's secrets through the real API, on SQLite and PostgreSQL (issue 24): encrypted
before anything is stored (no table holds a plaintext value), masked in every view the
tenant, the admin and the CLI get, never logged, recognised on an Idempotency-Key
retry, and released only sealed to the node that holds the allocation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from sqlalchemy import select
from structlog.testing import capture_logs

from cloud.app_keys import REGISTRY, SECRETS_AT_REST
from cloud.loop.allocations import by_work
from cloud.loop.desired import desired_document
from cloud.secrets.at_rest import PREFIX
from cloud.secrets.release import SecretRelease
from cloud.store.schema import metadata
from cloud.work.convert import spec_of
from cloud.work.specs import TrainingJobSpec
from greenfed.cli import main
from shared.redact import MASK
from shared.sealing import open_sealed, public_key_text
from shared.settings import SchedulingSettings
from tests.api.support import Api, bearer, job_spec, one_pass, problem
from tests.loop.builders import node

SECRET = "aws-secret-Zq8JrT1x"
SECOND_SECRET = "hf-token-Y2kP0sQd"
PASSWORD = "registry-pass-7Hn3"
PLAINTEXTS = (SECRET, SECOND_SECRET, PASSWORD)


def secret_job(**fields: Any) -> dict[str, Any]:
    return job_spec(
        env={"EPOCHS": "3"},
        secret_env={"AWS_SECRET_ACCESS_KEY": SECRET, "HF_TOKEN": SECOND_SECRET},
        image="ghcr.io/acme/trainer:2",
        registry_auth={"username": "ci", "password": PASSWORD},
        estimated_duration_s=600.0,
        **fields,
    )


def assert_no_secret(text: str | bytes, *, ciphertext: bool = True) -> None:
    shown = text.decode(errors="replace") if isinstance(text, bytes) else text
    for plaintext in PLAINTEXTS:
        assert plaintext not in shown
    if ciphertext:
        assert PREFIX not in shown


def assert_masked(spec: dict[str, Any]) -> None:
    assert spec["secret_env"] == {"AWS_SECRET_ACCESS_KEY": MASK, "HF_TOKEN": MASK}
    assert spec["registry_auth"] == {"registry": None, "username": "ci", "password": MASK}
    assert spec["env"] == {"EPOCHS": "3"}  # plain variables stay plain


async def every_row(api: Api) -> str:
    """Every row of every table of the store, as text: what a stolen database shows."""
    rows: list[str] = []
    async with api.store._read() as connection:
        for table in metadata.sorted_tables:
            for row in await connection.execute(select(table)):
                rows.extend(
                    value.decode(errors="replace") if isinstance(value, bytes) else str(value)
                    for value in row
                )
    return "\n".join(rows)


def register(api: Api, node_id: str, key: X25519PrivateKey) -> None:
    """A cloud node with a container runtime that announces its sealing key."""
    status = msgspec.structs.replace(
        node(node_id).status,
        isolation="sandbox",
        container_runtimes=("podman",),
        sealing_public_key=public_key_text(key),
        started_at=time.time(),
        sent_at=time.time(),
    )
    api.app[REGISTRY].apply_status(status)


async def test_secrets_are_encrypted_in_every_row_masked_in_every_view_and_never_logged(
    api: Api,
) -> None:
    node_key = X25519PrivateKey.generate()
    register(api, "a100-1", node_key)
    token = await api.tenant("acme")
    other = await api.tenant("globex")
    with capture_logs() as logs:
        response = await api.submit(token, secret_job(), key="run-1")
        assert response.status == 201, await response.text()
        created = await response.json()
        job_id = created["id"]
        assert_masked(created["spec"])
        assert_no_secret(await response.text())

        await one_pass(api)  # placed: an allocation, an explanation, events
        for path in (f"/v1/jobs/{job_id}", "/v1/jobs", f"/v1/jobs/{job_id}/explain"):
            shown = await api.get(token, path)
            assert shown.status == 200
            assert_no_secret(await shown.text())
        view = await (await api.get(token, f"/v1/jobs/{job_id}")).json()
        assert view["state"] == "scheduled"
        assert_masked(view["spec"])
        # The admin sees any tenant's job, redacted the same way.
        for path in (f"/v1/jobs/{job_id}", "/v1/jobs?tenant=*", "/v1/jobs?tenant=acme"):
            shown = await api.get(api.admin_token, path)
            assert shown.status == 200
            assert_no_secret(await shown.text())
        assert_masked((await (await api.get(api.admin_token, f"/v1/jobs/{job_id}")).json())["spec"])
        # Another tenant does not see the job at all.
        await problem(await api.get(other, f"/v1/jobs/{job_id}"), 404)
        assert (await (await api.get(other, "/v1/jobs")).json())["items"] == []

        # Cancelled by the admin: a reason, an event and an audit entry, none with a secret.
        cancelled = await api.client.delete(f"/v1/jobs/{job_id}", headers=bearer(api.admin_token))
        assert cancelled.status == 200
        assert_no_secret(await cancelled.text())

    stored = await every_row(api)
    assert_no_secret(stored, ciphertext=False)
    assert PREFIX in stored  # the spec holds ciphertext instead
    assert_no_secret(repr(logs))


async def test_the_node_holding_the_allocation_opens_what_the_api_stored(api: Api) -> None:
    node_key = X25519PrivateKey.generate()
    register(api, "a100-1", node_key)
    token = await api.tenant("acme")
    job_id = await api.submitted(token, secret_job())
    await one_pass(api)
    snapshot = await api.store.load_snapshot()
    records = {record.work_id: record for record in snapshot.work}
    document = desired_document(
        "a100-1",
        1,
        now=time.time(),
        records=records,
        allocations=by_work(snapshot.allocations),
        nodes={r.node_id: r for r in api.app[REGISTRY].nodes()},
        settings=SchedulingSettings(),
        secrets=SecretRelease(api.app[SECRETS_AT_REST]),
    )
    (entry,) = document.training
    assert entry.secret_names == ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN")
    assert entry.sealed_secrets is not None
    assert_no_secret(msgspec.json.encode(document))
    opened = open_sealed(
        entry.sealed_secrets, node_key, node_id="a100-1", job_id=job_id, attempt=entry.attempt
    )
    assert opened.env == {"AWS_SECRET_ACCESS_KEY": SECRET, "HF_TOKEN": SECOND_SECRET}
    assert opened.registry is not None
    assert (opened.registry.registry, opened.registry.password) == ("ghcr.io", PASSWORD)


async def test_a_retry_with_the_same_key_is_recognised_and_another_body_is_refused(
    api: Api,
) -> None:
    token = await api.tenant("acme")
    first = await api.submit(token, secret_job(allow_unschedulable=True), key="k1")
    assert first.status == 201
    job_id = (await first.json())["id"]
    again = await api.submit(token, secret_job(allow_unschedulable=True), key="k1")
    assert again.status == 200, await again.text()
    assert (await again.json())["id"] == job_id
    assert_no_secret(await again.text())
    changed = secret_job(allow_unschedulable=True)
    changed["secret_env"] = {"AWS_SECRET_ACCESS_KEY": "another", "HF_TOKEN": SECOND_SECRET}
    await problem(await api.submit(token, changed, key="k1"), 409)


async def test_one_tenants_ciphertext_is_a_plaintext_to_another(api: Api) -> None:
    """A value that looks like a stored secret is encrypted like any other: submitting
    another tenant's ciphertext gets that text, never the plaintext behind it."""
    acme = await api.tenant("acme")
    mallory = await api.tenant("mallory")
    acme_id = await api.submitted(acme, secret_job(allow_unschedulable=True))
    acme_record = await api.store.get_work(await api.tenant_id(acme), acme_id)
    assert acme_record is not None
    acme_spec = spec_of(acme_record)
    assert isinstance(acme_spec, TrainingJobSpec)
    stolen = acme_spec.secret_env["AWS_SECRET_ACCESS_KEY"]
    assert stolen.startswith(PREFIX)

    copied = job_spec(secret_env={"AWS_SECRET_ACCESS_KEY": stolen}, allow_unschedulable=True)
    mallory_tenant = await api.tenant_id(mallory)
    mallory_id = await api.submitted(mallory, copied)
    mallory_record = await api.store.get_work(mallory_tenant, mallory_id)
    assert mallory_record is not None
    mallory_spec = spec_of(mallory_record)
    assert isinstance(mallory_spec, TrainingJobSpec)
    assert mallory_spec.secret_env["AWS_SECRET_ACCESS_KEY"] != stolen
    release = SecretRelease(api.app[SECRETS_AT_REST])
    opened = release.plaintext(mallory_spec, tenant_id=mallory_tenant)
    assert opened.env == {"AWS_SECRET_ACCESS_KEY": stolen}
    with pytest.raises(ValueError, match="does not open"):
        release.plaintext(acme_spec, tenant_id=mallory_tenant)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"secret_env": {"BIG": "x" * 70_000}}, "$.secret_env.BIG"),
        # Counted as they are sealed into a node's document, JSON-escaped: a control
        # character is 6 bytes there ("\u0001"), so 20,000 of them are 120,000 bytes.
        ({"secret_env": {"BLOB": "\x01" * 20_000}}, "$.secret_env.BLOB"),
        ({"secret_env": {"A": "\x01" * 8_000, "B": "\x01" * 8_000}}, "$.secret_env.B"),
        ({"secret_env": {"RANK": "0"}}, "$.secret_env.RANK"),
        # Would reach the worker as an argument (edge/sandbox/root_env.py): refused at
        # submission, not only by the agent that would start it.
        ({"secret_env": {"LD_PRELOAD": "s"}}, "$.secret_env.LD_PRELOAD"),
        ({"secret_env": {"REGISTRY_AUTH_FILE": "s"}}, "$.secret_env.REGISTRY_AUTH_FILE"),
        ({"env": {"K": "a"}, "secret_env": {"K": "b"}}, "$.secret_env.K"),
        ({"registry_auth": {"username": "u", "password": "p"}}, "$.registry_auth"),
    ],
)
async def test_bad_secrets_are_refused_naming_the_field(
    api: Api, fields: dict[str, Any], name: str
) -> None:
    token = await api.tenant("acme")
    body = await problem(await api.submit(token, job_spec(**fields)), 422)
    assert body["invalid_params"][0]["name"] == name
    assert "x" * 100 not in str(body)


async def test_secret_values_of_plain_text_up_to_the_limit_are_taken(api: Api) -> None:
    token = await api.tenant("acme")
    limit = 64 * 1024
    await api.submitted(
        token, job_spec(secret_env={"A": "x" * (limit // 2), "B": "y" * (limit // 2)})
    )
    body = await problem(
        await api.submit(token, job_spec(secret_env={"A": "x" * (limit - 1) + "\n"})), 422
    )
    assert body["invalid_params"][0]["name"] == "$.secret_env.A"  # "\n" is 2 bytes sent


async def test_the_cli_shows_secret_names_never_their_values(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, secret_job(allow_unschedulable=True, isolation="user"))
    base = ("--api", str(api.client.make_url("")).rstrip("/"), "--token", token)
    outputs = []
    for argv in (("job", job_id), ("job", job_id, "--json"), ("jobs",), ("jobs", "--json")):
        code = await asyncio.to_thread(main, [argv[0], *base, *argv[1:]])
        out = capsys.readouterr().out
        assert code == 0, out
        outputs.append(out)
    assert_no_secret("\n".join(outputs))
    assert "secrets AWS_SECRET_ACCESS_KEY, HF_TOKEN (values hidden)" in " ".join(outputs[0].split())
    assert "isolation user or stronger" in outputs[0]
    assert '"AWS_SECRET_ACCESS_KEY": "***"' in outputs[1]
