"""`GET /v1/jobs/{id}/explain` of a job back in the queue after it was placed: the
explanation of the pass that placed it ("Placed 1 worker on n1") no longer holds.

A job waiting out its retry backoff is out of the queue (cloud/loop/inputs.py), so no
pass explains it again: its explanation says it waits for its retry, and until when. A
job requeued (by a person, a lost node, a failure retried at once) is explained by its
reason until a pass explains it again, also where the pass finds the same pending
reason it gave before the job was placed (the loop writes only reasons that changed).
The real scheduling loop, pass by pass on a clock of the test's, on SQLite and
PostgreSQL; `greenfed job ID` prints the same.
"""

from __future__ import annotations

import io
import time
from typing import Any

import msgspec
import pytest

from cloud.app_keys import LIVENESS, REGISTRY, SETTINGS, SIGNING_KEY
from cloud.loop.loop import SchedulingLoop
from cloud.loop.publisher import DesiredPublisher
from cloud.work.views import ExplainView, JobView
from greenfed.work_commands import render_work
from shared.messages import ReportedState, ReportedTraining, TrainingRunState
from shared.settings import SchedulingSettings
from tests.api.support import Api, bearer, job_spec
from tests.loop.builders import node

pytestmark = pytest.mark.timeout(60)


class Passes:
    """The app's store and registry scheduled by a loop of the test's, one pass at a
    time, at `now` (the app's own loop is off)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.now = time.time()
        publisher = DesiredPublisher(
            api.app[SETTINGS].mqtt, signing_key=api.app[SIGNING_KEY], cluster_id="test"
        )
        self.loop = SchedulingLoop(
            api.store,
            api.app[REGISTRY],
            publisher,
            SchedulingSettings(startup_settle_s=0.0),
            liveness=api.app[LIVENESS],
            clock=lambda: self.now,
        )
        self._reports: dict[str, dict[tuple[str, int], ReportedTraining]] = {}

    def node(self, node_id: str) -> None:
        status = node(node_id, gpus=4).status
        # No telemetry expected: the node stays online however far `now` moves.
        self.api.app[REGISTRY].apply_status(
            msgspec.structs.replace(status, telemetry_interval_s=1e6)
        )

    async def run(self) -> None:
        lease = await self.api.store.try_acquire_leadership()
        assert lease is not None
        async with lease:
            await self.loop.run_pass(lease)

    def report(self, node_id: str, job_id: str, state: TrainingRunState, **fields: Any) -> None:
        """`node_id`'s agent reports the job's first attempt in `state`."""
        entries = self._reports.setdefault(node_id, {})
        entries[(job_id, 1)] = ReportedTraining(
            job_id=job_id, attempt=1, state=state, started_at=self.now, **fields
        )
        self.api.app[REGISTRY].apply_reported(
            ReportedState(
                node_id=node_id,
                instance_id="i1",
                observed_generation=10**6,
                reported_at=self.now,
                training=tuple(entries.values()),
            )
        )


@pytest.fixture
def passes(api: Api) -> Passes:
    return Passes(api)


def job(name: str, **fields: Any) -> dict[str, Any]:
    return job_spec(name=name, accelerators_per_worker=4, estimated_duration_s=3600, **fields)


async def shown(api: Api, token: str, job_id: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The job, its explanation, and what `greenfed job ID` prints of them."""
    job_response = await api.get(token, f"/v1/jobs/{job_id}")
    explain_response = await api.get(token, f"/v1/jobs/{job_id}/explain")
    assert (job_response.status, explain_response.status) == (200, 200)
    job_body, explain_body = await job_response.read(), await explain_response.read()
    printed = io.StringIO()
    render_work(
        msgspec.json.decode(job_body, type=JobView),
        msgspec.json.decode(explain_body, type=ExplainView),
        printed,
    )
    return msgspec.json.decode(job_body), msgspec.json.decode(explain_body), printed.getvalue()


async def test_a_job_waiting_out_its_retry_backoff_is_explained_by_its_retry(
    api: Api, passes: Passes
) -> None:
    token = await api.tenant("acme")
    passes.node("n1")
    job_id = await api.submitted(token, job("flaky", max_retries=2, retry_backoff_s=300))
    await passes.run()
    passes.report("n1", job_id, "running")
    await passes.run()
    passes.report("n1", job_id, "failed", exit_code=1, reason="exit code 1")
    await passes.run()
    passes.now += 10  # a pass within the backoff leaves the job out of the queue
    await passes.run()

    work, explained, printed = await shown(api, token, job_id)
    assert (work["state"], work["failures"]) == ("pending", 1)
    assert work["reason"] == "worker on n1 failed: exit code 1; retry 1 of 2 in 300 s"
    assert work["retry_at"] is not None
    explanation = explained["explanation"]
    assert explanation["outcome"] == "pending", explained["message"]
    assert explanation["placements"] == []
    assert explanation["pending"]["code"] == "backoff"
    assert explanation["pending"]["retry_at"] == work["retry_at"]
    assert explained["message"] == explanation["message"]
    assert explained["message"].startswith("Waiting out its retry backoff until ")
    assert explained["message"].endswith(f": {work['reason']}.")
    assert explained["explained_at"] == explanation["decided_at"]
    assert "Placed" not in printed
    assert "score breakdown" not in printed
    assert "why: Waiting out its retry backoff until " in printed


async def test_a_requeued_job_is_explained_by_its_reason_not_its_last_placement(
    api: Api, passes: Passes
) -> None:
    token = await api.tenant("acme")
    passes.node("n1")
    job_id = await api.submitted(token, job("trainer"))
    await passes.run()
    passes.report("n1", job_id, "running")
    await passes.run()
    response = await api.client.post(f"/v1/jobs/{job_id}/requeue", headers=bearer(token))
    assert response.status == 200, await response.text()

    # Back in the queue; the scheduler has not looked at it since.
    work, explained, printed = await shown(api, token, job_id)
    assert work["state"] == "pending"
    assert work["reason"].startswith("requeued by acme")
    assert explained["explanation"] is None
    assert explained["explained_at"] is None
    assert explained["message"] == work["reason"]
    assert "Placed" not in printed
    assert "score breakdown" not in printed


async def test_a_job_retried_into_the_reason_it_waited_for_before_is_not_shown_placed(
    api: Api, passes: Passes
) -> None:
    """Waiting over quota, placed, failed and retried at once while a higher-priority job
    takes the quota: the pass finds the pending reason it gave before the placement."""
    token = await api.tenant("acme", quotas={"gpu": 4})
    passes.node("n1")
    passes.node("n2")
    blocker = await api.submitted(token, job("blocker", preemptible=False))
    await passes.run()
    job_id = await api.submitted(token, job("flaky", max_retries=1, retry_backoff_s=0))
    await passes.run()
    _, before, _ = await shown(api, token, job_id)
    assert before["explanation"]["pending"]["code"] == "quota"
    (blocker_node,) = (await (await api.get(token, f"/v1/jobs/{blocker}")).json())["nodes"]
    passes.report(blocker_node, blocker, "succeeded")
    await passes.run()
    placed = await (await api.get(token, f"/v1/jobs/{job_id}")).json()
    assert placed["state"] == "scheduled"
    (job_node,) = placed["nodes"]
    # The retry may be placed at once (the loop's clock is not ahead of the API's).
    await api.submitted(token, job("urgent", priority="p0", preemptible=False))
    passes.report(job_node, job_id, "failed", exit_code=1, reason="exit code 1")
    await passes.run()

    work, explained, printed = await shown(api, token, job_id)
    assert (work["state"], work["failures"]) == ("pending", 1)
    assert work["reason"] == before["message"]  # over quota again, in the same words
    assert explained["explanation"] is None or explained["explanation"]["outcome"] == "pending"
    assert explained["message"] == work["reason"]
    assert "Placed" not in printed
    assert "score breakdown" not in printed
