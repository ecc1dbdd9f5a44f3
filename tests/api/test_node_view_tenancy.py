"""What a tenant sees of a node its work may share with other tenants' (docs/rest.md):
not their replicas' serving figures, which /metrics keeps for the admin too."""

from __future__ import annotations

import time

from cloud.app_keys import REGISTRY
from shared.messages import DeploymentSample, Telemetry
from tests.api.support import Api, bearer
from tests.loop.builders import node


async def test_a_tenant_sees_no_other_tenants_serving_figures_on_a_node(api: Api) -> None:
    registry = api.app[REGISTRY]
    status = node("gpu-1").status
    registry.apply_status(status)
    sample = Telemetry(
        node_id="gpu-1", instance_id=status.instance_id, seq=1, sampled_at=time.time(),
        interval_s=5.0, cpu_utilization_pct=5.0, memory_used_bytes=1, memory_total_bytes=2,
        deployments=(DeploymentSample(
            deployment_id="01HZZZZZZZZZZZZZZZZZZZZZZZ", requests=5, errors=0, rejected=0,
            requests_per_s=1.0,
        ),),
    )  # fmt: skip
    assert registry.apply_telemetry(sample) is None
    tenant = await api.tenant("bob")
    seen = await (await api.client.get("/v1/nodes/gpu-1", headers=bearer(tenant))).json()
    assert seen["telemetry"]["deployments"] == []
    assert seen["telemetry"]["cpu_utilization_pct"] == 5.0  # the node's own figures stay
    admin = await (await api.client.get("/v1/nodes/gpu-1", headers=bearer(api.admin_token))).json()
    assert admin["telemetry"]["deployments"][0]["requests"] == 5
