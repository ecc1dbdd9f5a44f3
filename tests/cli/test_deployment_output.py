"""`greenfed deployment ID` as a person reads it: every endpoint URL whole, at any width."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from cloud.work.views import DeploymentView
from greenfed.work_commands import render_work

DEPLOYMENT_ID = "01JDEPLOYMENT0000000000000"
# As an agent reports it: long host names are common on edge sites.
ENDPOINTS = (
    f"http://agx-orin-losangeles-1.edge.example.internal:8701/v1/infer/{DEPLOYMENT_ID}",
    f"http://npu-gw-frankfurt-1.edge.example.internal:8701/v1/infer/{DEPLOYMENT_ID}",
)


def _deployment() -> DeploymentView:
    now = datetime.now(tz=UTC)
    nodes = ("agx-orin-losangeles-1", "npu-gw-frankfurt-1", "coral-gw-johannesburg-1")
    replicas = [
        {
            "replica": index,
            "node_id": node,
            "state": "ready" if index < len(ENDPOINTS) else "starting",
            "provider": "CPUExecutionProvider",
            "endpoint": ENDPOINTS[index] if index < len(ENDPOINTS) else None,
            "reason": "TensorrtExecutionProvider is not available; running on the CPU",
            "model_sha256": "ab" * 32,
        }
        for index, node in enumerate(nodes)
    ]
    payload = {
        "id": DEPLOYMENT_ID,
        "name": "detector",
        "tenant": "acme",
        "priority": "p1",
        "state": "running",
        "reason": None,
        "attempts": 1,
        "version": 4,
        "submitted_at": (now - timedelta(minutes=5)).isoformat(),
        "updated_at": now.isoformat(),
        "model_id": "01JMODEL000000000000000000",
        "replicas": 3,
        "accelerators_per_replica": 1,
        "idempotency_key": None,
        "nodes": list(nodes),
        "allocations": [],
        "replica_states": replicas,
        "spec": {"name": "detector", "model_id": "01JMODEL000000000000000000", "replicas": 3},
    }
    return msgspec.convert(payload, DeploymentView)


@pytest.mark.parametrize("columns", [80, 160])
def test_every_endpoint_is_printed_whole_on_one_line(
    columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    render_work(_deployment(), None, out)
    text = out.getvalue()
    lines = text.splitlines()
    for endpoint in ENDPOINTS:
        assert sum(endpoint in line for line in lines) == 1, text
    # The tables still fit the terminal; only the endpoint lines may be longer.
    assert all(len(line) <= columns for line in lines if "/v1/infer/" not in line), text
    assert "…" not in text
    assert "agx-orin-losangeles-1" in text  # the replicas table is still there
    assert "replica 2" not in text  # a replica that is not ready has no endpoint
