"""Over REST, both databases: a preemption across tenants shows neither tenant the
other's work id (another tenant's job is a 404, exactly like one that does not exist:
its id must not turn up in a reason, an explanation or an event either). Each side
reads "another tenant's p0 work" instead, whose priority is what explains it; within
one tenant the ids stay (test_disruption_budget_and_explanations.py). The scheduling
pass is the loop's own steps."""

from __future__ import annotations

from cloud.app_keys import REGISTRY
from tests.api.support import Api, bearer, job_spec, one_pass
from tests.loop.builders import node


def register(api: Api, node_id: str, gpus: int = 4) -> None:
    api.app[REGISTRY].apply_status(node(node_id, gpus=gpus).status)


async def test_a_preemption_across_tenants_names_neither_tenant_the_others_work(
    api: Api,
) -> None:
    alpha = await api.tenant("alpha")
    bravo = await api.tenant("bravo")
    register(api, "gpu-a")
    batch = await api.submitted(
        alpha, job_spec(name="batch", priority="p2", accelerators_per_worker=4)
    )
    await one_pass(api)
    urgent = await api.submitted(
        bravo, job_spec(name="urgent", priority="p0", accelerators_per_worker=4)
    )
    await one_pass(api)

    # The preemptor's tenant learns that it took another tenant's lower-priority room.
    explained = await (await api.get(bravo, f"/v1/jobs/{urgent}/explain")).json()
    assert explained["message"].endswith(
        "It preempted another tenant's p2 work on gpu-a (priority)."
    )
    [victim] = explained["explanation"]["preemptions"]
    assert victim == {
        "node_id": "gpu-a",
        "reason": "priority",
        "preempted_by": urgent,
        "work_id": None,
        "another_tenant": True,
    }
    for path in (f"/v1/jobs/{urgent}", "/v1/jobs", "/v1/events?follow=false&after=0"):
        seen = await (await api.get(bravo, path)).text()
        assert batch not in seen, (path, seen)
    assert batch not in str(explained)

    # The victim's tenant learns that more important work of another tenant took it.
    stopped = await (await api.get(alpha, f"/v1/jobs/{batch}")).json()
    assert stopped["state"] == "pending"
    assert stopped["reason"] == "preempted by another tenant's p0 work (priority)"
    lost = await (await api.get(alpha, f"/v1/jobs/{batch}/explain")).json()
    assert lost["explanation"]["message"] == (
        "Preempted (priority) to make room for another tenant's p0 work."
    )
    assert lost["explanation"]["preemptions"] == [
        {
            "node_id": "gpu-a",
            "reason": "priority",
            "preempted_by": None,
            "work_id": None,
            "another_tenant": True,
        }
    ]
    for path in (f"/v1/jobs/{batch}", "/v1/jobs", "/v1/events?follow=false&after=0"):
        seen = await (await api.get(alpha, path)).text()
        assert urgent not in seen, (path, seen)
    assert urgent not in str(lost)

    # Passes that find no room for the victim keep the reason, still without the id.
    await one_pass(api)
    waiting = await (await api.get(alpha, f"/v1/jobs/{batch}")).json()
    assert waiting["reason"] == "preempted by another tenant's p0 work (priority)"


async def test_a_dry_run_that_would_preempt_another_tenants_job_does_not_name_it(
    api: Api,
) -> None:
    alpha = await api.tenant("alpha")
    bravo = await api.tenant("bravo")
    register(api, "gpu-a")
    batch = await api.submitted(
        alpha, job_spec(name="batch", priority="p2", accelerators_per_worker=4)
    )
    await one_pass(api)

    dry = await api.client.post(
        "/v1/jobs/dry-run",
        json=job_spec(name="urgent", priority="p0", accelerators_per_worker=4),
        headers=bearer(bravo),
    )
    assert dry.status == 200, await dry.text()
    body = await dry.json()
    assert body["explanation"]["outcome"] == "placed"
    assert body["message"].endswith("It preempted another tenant's p2 work on gpu-a (priority).")
    [victim] = body["explanation"]["preemptions"]
    assert (victim["work_id"], victim["another_tenant"]) == (None, True)
    assert batch not in await dry.text()
