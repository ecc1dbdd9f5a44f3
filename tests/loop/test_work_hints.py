"""A cluster's bridge asks the scheduling loop for a job's priority and deadline as soon
as a desired document names the job (`SchedulingLoop.work_record`, the `work_hints` of
cloud/app.py): its Slurm QOS and nice come from them. A pass publishes what it placed
before it ends, so the job must be known from that moment; it was not for a job placed
by the first pass that saw it (its priority was dropped whenever the bridge came first)."""

from __future__ import annotations

import pytest

from cloud.app_keys import SCHEDULER
from shared.messages import DesiredState
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, work
from tests.support.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(90)


async def test_every_document_naming_a_job_finds_its_record_with_its_priority(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        loop = running.api.app[SCHEDULER]
        await eventually(loop.leading.is_set, timeout_s=10, message="no leader")
        # What the loop answers, for each job a document names, as the document is sent.
        answers: dict[str, list[str | None]] = {}
        publisher = loop._publisher
        submit = publisher.submit

        def recording(document: DesiredState) -> None:
            for worker in document.training:
                record = loop.work_record(worker.job_id)
                answers.setdefault(worker.job_id, []).append(record.priority if record else None)
            submit(document)

        publisher.submit = recording  # type: ignore[method-assign]
        token = await running.api.tenant("acme")
        spec = {"name": "low", "command": ["python", "train.py"], "priority": "p2"}
        work_id = await running.api.submitted(token, spec)

        async def placed() -> bool:
            return bool((await work(running.api, token, work_id))["state"] != "pending")

        await eventually_async(placed, timeout_s=20, message="the job was not placed")
        # Its state commits before the pass's documents go out: wait for the document.
        await eventually(
            lambda: bool(answers.get(work_id)), timeout_s=20, message="no document named it"
        )
        assert set(answers[work_id]) == {"p2"}, answers[work_id]
