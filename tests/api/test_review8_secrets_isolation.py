"""A job's secrets reach only nodes that keep tenants apart (isolation `user` or
`sandbox`): at `none` every tenant's workers run as the agent's own user, who reads the
other workers' environments and the node's sealing key. And a withheld release is logged
for every node it happens on, not for the first node of each reason only."""

from __future__ import annotations

import os
import time

import msgspec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from structlog.testing import capture_logs

from cloud.app_keys import REGISTRY
from cloud.secrets.at_rest import KEY_BYTES, SecretsAtRest
from cloud.secrets.release import SecretRelease
from cloud.work.specs import TrainingJobSpec
from shared.messages import IsolationLevel
from shared.sealing import public_key_text
from tests.api.support import Api, one_pass, problem
from tests.api.test_secrets import secret_job
from tests.loop.builders import node


def register(api: Api, node_id: str, isolation: IsolationLevel) -> None:
    """A node with a container runtime that announces a usable sealing key."""
    status = msgspec.structs.replace(
        node(node_id).status,
        isolation=isolation,
        container_runtimes=("podman",),
        sealing_public_key=public_key_text(X25519PrivateKey.generate()),
        started_at=time.time(),
        sent_at=time.time(),
    )
    api.app[REGISTRY].apply_status(status)


async def test_a_job_with_secrets_is_not_placed_on_a_node_at_isolation_none(api: Api) -> None:
    register(api, "laptop-1", "none")
    token = await api.tenant("acme")

    refused = await api.submit(token, secret_job())
    assert (await problem(refused, 422))["invalid_params"][0]["name"] == "$.secret_env"

    job_id = await api.submitted(token, secret_job(allow_unschedulable=True))
    await one_pass(api)
    view = await (await api.get(token, f"/v1/jobs/{job_id}")).json()
    assert view["state"] == "pending"
    assert "cannot receive sealed secrets" in view["reason"]


async def test_a_job_with_secrets_goes_to_the_node_that_keeps_tenants_apart(api: Api) -> None:
    register(api, "laptop-1", "none")
    register(api, "server-1", "user")
    token = await api.tenant("acme")

    job_id = await api.submitted(token, secret_job())
    await one_pass(api)
    view = await (await api.get(token, f"/v1/jobs/{job_id}")).json()
    assert view["state"] == "scheduled"
    assert view["nodes"] == ["server-1"]


def test_each_node_whose_release_is_withheld_is_logged() -> None:
    at_rest = SecretsAtRest(os.urandom(KEY_BYTES))
    release = SecretRelease(at_rest)  # the default interval: a minute per key
    spec = at_rest.encrypt_spec(
        TrainingJobSpec(name="train", command=("true",), secret_env={"TOKEN": "v"}),
        tenant_id="acme",
    )
    other_key = public_key_text(X25519PrivateKey.generate())
    with capture_logs() as logs:
        for node_id, job_id in (("node-a", "job-1"), ("node-b", "job-2")):
            release.sealed(
                spec, tenant_id="acme", node_id=node_id, job_id=job_id, attempt=0, public_key=None
            )
        # Stored under acme's binding, asked for as globex's: the secrets do not open.
        for node_id, job_id in (("node-c", "job-3"), ("node-d", "job-4")):
            release.sealed(
                spec,
                tenant_id="globex",
                node_id=node_id,
                job_id=job_id,
                attempt=0,
                public_key=other_key,
            )
        # Again on a node already logged within the interval: counted, not logged.
        release.sealed(
            spec, tenant_id="acme", node_id="node-a", job_id="job-5", attempt=0, public_key=None
        )

    logged = [(entry["node_id"], entry["job_id"]) for entry in logs]
    assert logged == [
        ("node-a", "job-1"),
        ("node-b", "job-2"),
        ("node-c", "job-3"),
        ("node-d", "job-4"),
    ]
    assert all(entry["event"].startswith("secrets withheld") for entry in logs)
