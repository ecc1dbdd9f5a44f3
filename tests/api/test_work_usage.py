"""A job's `usage` on `GET /v1/jobs/{id}`: a member whose hours were priced in two
currencies (a zone's prices lost for an hour, the static table's dollars instead) shows
each currency's amount, never their sum, and the document says so."""

from __future__ import annotations

import time

import msgspec

from cloud.store import UsageHour
from cloud.store.usage import UsageWrite
from cloud.work.views import JobView
from tests.api.support import Api, job_spec


async def test_a_members_cost_in_two_currencies_is_never_one_sum(api: Api) -> None:
    token = await api.tenant("acme")
    job_id = await api.submitted(token, job_spec())
    tenant_id = await api.tenant_id(token)
    now = time.time()
    this_hour = now - now % 3600

    def hour(start_s: float, cost: float, currency: str) -> UsageHour:
        return UsageHour(
            work_id=job_id, member_index=0, node_id="n1", hour_start=start_s,
            tenant_id=tenant_id, work_kind="training", zone="DE", accelerator_kind="gpu",
            energy_j=3.6e6, measured_j=3.6e6, gap_s=0.0, gco2_g=400.0, cost=cost,
            currency=currency, counterfactual_gco2_g=None, fallback=currency == "USD",
        )  # fmt: skip

    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        rows = [hour(this_hour - 3600, 0.10, "EUR"), hour(this_hour, 5.00, "USD")]
        await api.store.write_usage(UsageWrite(rows=rows), lease=lease)

    response = await api.get(token, f"/v1/jobs/{job_id}")
    assert response.status == 200, await response.text()
    usage = (await response.json())["usage"]
    (member,) = usage["members"]
    assert member["costs"] == usage["costs"] == {"EUR": 0.10, "USD": 5.00}
    assert (member["cost"], member["currency"]) == (None, None)
    msgspec.convert(await response.json(), JobView)  # what `greenfed job` decodes

    document = await (await api.client.get("/openapi.json")).json()
    member_schema = document["components"]["schemas"]["MemberUsage"]
    assert member_schema["properties"]["costs"]["type"] == "object"
    assert {"type": "null"} in member_schema["properties"]["cost"]["anyOf"]
