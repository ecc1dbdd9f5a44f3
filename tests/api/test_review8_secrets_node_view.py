"""The node view and the 422 say what the scheduler does with secrets: a node receives
them only with the sealing key it enrolled with and tenants kept apart (isolation `user`
or `sandbox`), so `receives_secrets` is false for a keyed node at `none`, and a job with
secrets on a fleet of such nodes is refused naming isolation as the reason, not a
missing key. Both databases, through the real API."""

from __future__ import annotations

import time

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app_keys import REGISTRY
from shared.messages import IsolationLevel
from shared.sealing import public_key_text
from tests.api.support import Api, problem
from tests.api.test_secrets import secret_job
from tests.loop.builders import node


def register_keyed(
    api: Api, node_id: str, isolation: IsolationLevel, *, keyed: bool = True
) -> None:
    """A node with a container runtime that announces a usable sealing key (or none)."""
    key = public_key_text(X25519PrivateKey.generate()) if keyed else None
    status = msgspec.structs.replace(
        node(node_id).status,
        isolation=isolation,
        container_runtimes=("podman",),
        sealing_public_key=key,
        started_at=time.time(),
        sent_at=time.time(),
    )
    api.app[REGISTRY].apply_status(status)


async def test_the_node_view_says_a_keyed_node_at_isolation_none_receives_no_secrets(
    api: Api,
) -> None:
    register_keyed(api, "laptop-1", "none")
    register_keyed(api, "server-1", "user")

    for node_id, receives in (("laptop-1", False), ("server-1", True)):
        response = await api.get(api.admin_token, f"/v1/nodes/{node_id}")
        assert response.status == 200, await response.text()
        assert (await response.json())["receives_secrets"] is receives, node_id

    listed = await (await api.get(api.admin_token, "/v1/nodes")).json()
    assert {item["node_id"]: item["receives_secrets"] for item in listed["items"]} == {
        "laptop-1": False,
        "server-1": True,
    }


async def test_secrets_on_keyed_nodes_at_isolation_none_are_refused_for_their_isolation(
    api: Api,
) -> None:
    register_keyed(api, "laptop-1", "none")
    register_keyed(api, "laptop-2", "none")
    token = await api.tenant("acme")

    body = await problem(await api.submit(token, secret_job()), 422)
    (param,) = body["invalid_params"]
    assert param["name"] == "$.secret_env"
    reason = param["reason"]
    assert reason.startswith("no node at cloud")
    assert "can receive sealed secrets (each isolates as none" in reason
    assert "isolation user or sandbox" in reason
    # Each announces its key: a missing key is not the reason given.
    assert "announces the sealing key" not in reason


@pytest.mark.parametrize(
    ("fleet", "why"),
    [
        # Tenants kept apart, but no key: the key is what is missing.
        ({"server-1": ("user", False)}, "(none announces the sealing key it enrolled with)"),
        (
            {"server-1": ("user", False), "laptop-1": ("none", True)},
            "(those at isolation user or sandbox announce no sealing key they enrolled with, "
            "and the others isolate as none",
        ),
    ],
)
async def test_the_422_names_what_the_nodes_lack(
    api: Api, fleet: dict[str, tuple[IsolationLevel, bool]], why: str
) -> None:
    for node_id, (isolation, keyed) in fleet.items():
        register_keyed(api, node_id, isolation, keyed=keyed)
    token = await api.tenant("acme")

    body = await problem(await api.submit(token, secret_job()), 422)
    (param,) = body["invalid_params"]
    assert param["name"] == "$.secret_env"
    assert f"can receive sealed secrets {why}" in param["reason"]
