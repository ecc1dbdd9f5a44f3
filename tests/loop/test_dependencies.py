"""Dependencies between jobs and CPU cores beside GPUs, end to end (issue 17): REST ->
store -> scheduling loop -> simulated agents, on SQLite and PostgreSQL; and the rule
itself (cloud/work/dependencies.py)."""

from __future__ import annotations

import io
from typing import Any

import msgspec
import pytest

from cloud.store import DependencyRecord
from cloud.work.dependencies import loop_from, resolve, verdict
from cloud.work.views import JobView
from greenfed.work_commands import render_work
from shared.work_literals import DependencyCondition, WorkState
from tests.api.support import Api, problem
from tests.store.databases import DatabaseUnderTest
from tests.support.control_plane import fleet, reaches, work
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.timeout(90)


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": ["python", "train.py"], **fields}


def after(job_id: str, condition: str = "succeeded") -> dict[str, str]:
    return {"job": job_id, "condition": condition}


# ---- the rule ------------------------------------------------------------------------------


def needs(
    work_id: str, job_id: str, condition: DependencyCondition, state: WorkState, position: int = 0
) -> DependencyRecord:
    return DependencyRecord(
        work_id=work_id,
        position=position,
        job_id=job_id,
        condition=condition,
        job_state=state,
        job_reason="exit code 3" if state == "failed" else None,
    )


@pytest.mark.parametrize(
    ("condition", "state", "expected"),
    [
        ("succeeded", "running", "waits"),
        ("succeeded", "succeeded", "holds"),
        ("succeeded", "failed", "never"),
        ("succeeded", "cancelled", "never"),
        ("failed", "failed", "holds"),
        ("failed", "succeeded", "never"),
        ("failed", "cancelled", "never"),
        ("ended", "pending", "waits"),
        ("ended", "cancelled", "holds"),
        ("ended", "failed", "holds"),
    ],
)
def test_each_condition_holds_waits_or_never_will(
    condition: DependencyCondition, state: WorkState, expected: str
) -> None:
    assert verdict(condition, state) == expected


def test_a_broken_dependency_cancels_the_rest_of_the_chain_in_one_pass() -> None:
    resolution = resolve(
        [
            needs("train", "prep", "succeeded", "failed"),
            needs("eval", "train", "succeeded", "pending"),
            needs("cleanup", "prep", "failed", "failed"),
            needs("audit", "train", "ended", "pending"),
        ]
    )
    assert resolution.cancelled == {
        "train": "dependency can no longer hold: it needs job prep to succeed, which failed "
        "(exit code 3)",
        "eval": "dependency can no longer hold: it needs job train to succeed, which was "
        "cancelled (dependency can no longer hold: it needs job prep to succeed, which "
        "failed (exit code 3))",
    }
    assert set(resolution.waiting) == set()  # cleanup holds; audit's train is cancelled: ends
    assert not resolution.holds_back("cleanup")
    assert not resolution.holds_back("audit")


def test_a_loop_is_found_from_any_job_that_leads_into_it() -> None:
    edges = {"c": ("b",), "b": ("a",), "a": ("b",), "x": ("y",)}
    assert loop_from("c", edges) == ("b", "a", "b")
    assert loop_from("x", edges) is None
    long_chain = {str(i): (str(i + 1),) for i in range(5000)}
    assert loop_from("0", long_chain) is None


# ---- end to end ---------------------------------------------------------------------------


async def state_events(api: Api, token: str) -> list[tuple[int, str, str]]:
    """(seq, work id, state) of every work.state event of the tenant, in order."""
    history = await api.store.list_events(tenant_id=await api.tenant_id(token), limit=1000)
    return [
        (event.seq, event.work_id or "", msgspec.json.decode(event.payload)["state"])
        for event in history
        if event.kind == "work.state"
    ]


def first(events: list[tuple[int, str, str]], work_id: str, state: str) -> int:
    return next(seq for seq, item, to in events if item == work_id and to == state)


async def test_a_three_job_chain_runs_in_order_and_shows_its_links(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=2) as running:
        api = running.api
        token = await api.tenant("acme")
        prep = await api.submitted(token, job("preprocess", estimated_duration_s=3.0))
        train = await api.submitted(
            token, job("train", estimated_duration_s=0.3, depends_on=[after(prep)])
        )
        evaluate = await api.submitted(
            token, job("evaluate", estimated_duration_s=0.3, depends_on=[after(train)])
        )

        # While preprocessing runs, training waits for it, and says so.
        explained: dict[str, Any] = {}

        async def waiting() -> bool:
            response = await api.get(token, f"/v1/jobs/{train}/explain")
            explained.update(await response.json())
            pending = (explained.get("explanation") or {}).get("pending") or {}
            return bool(pending.get("code") == "dependency")

        await eventually_async(waiting, timeout_s=20, message=lambda: str(explained))
        assert explained["message"].startswith(f"Waiting for job {prep} to succeed (now ")
        assert explained["explanation"]["pending"]["waiting_for"][0]["job"] == prep
        shown = io.StringIO()
        render_work(
            msgspec.json.decode(msgspec.json.encode(await work(api, token, train)), type=JobView),
            None,
            shown,
        )
        assert f"waits for: job {prep} preprocess to succeed" in shown.getvalue()
        assert f"needed by: job {evaluate} evaluate" in shown.getvalue()

        await reaches(api, token, evaluate, "succeeded", timeout_s=40)
        events = await state_events(api, token)
        assert first(events, prep, "succeeded") < first(events, train, "scheduled")
        assert first(events, train, "succeeded") < first(events, evaluate, "scheduled")
        body = await work(api, token, evaluate)
        assert [(d["id"], d["verdict"]) for d in body["waits_for"]] == [(train, "holds")]


async def test_a_failed_first_job_cancels_the_chain_and_runs_its_cleanup(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        crash = {"GREENFED_SIM_EXIT_CODE": "3"}
        prep = await api.submitted(token, job("preprocess", estimated_duration_s=0.5, env=crash))
        train = await api.submitted(token, job("train", depends_on=[after(prep)]))
        evaluate = await api.submitted(token, job("evaluate", depends_on=[after(train)]))
        cleanup = await api.submitted(
            token, job("cleanup", estimated_duration_s=0.2, depends_on=[after(prep, "failed")])
        )

        cancelled = await reaches(api, token, evaluate, "cancelled")
        assert cancelled["reason"].startswith(
            f"dependency can no longer hold: it needs job {train} to succeed, which was cancelled"
        )
        train_body = await work(api, token, train)
        assert train_body["state"] == "cancelled"
        assert train_body["reason"].startswith(
            f"dependency can no longer hold: it needs job {prep} to succeed, which failed ("
        )
        assert "exit code 3" in train_body["reason"]
        await reaches(api, token, cleanup, "succeeded")
        assert train_body["attempts"] == 0  # never placed


async def test_cpu_cores_beside_gpus_are_held_while_running_and_refused_beyond_any_node(
    database: DatabaseUnderTest, mosquitto_root: tuple[str, str]
) -> None:
    """One 4-GPU node with 128 cores: a job holding 100 leaves too few for a second one
    asking for 64, although two GPUs are free; cancelling the first lets it run."""
    async with fleet(database, mosquitto_root, cloud_nodes=1) as running:
        api = running.api
        token = await api.tenant("acme")
        too_many = job("greedy", cpus_per_worker=129)
        body = await problem(await api.submit(token, too_many), 422)
        assert body["invalid_params"][0]["name"] == "$.cpus_per_worker"
        assert body["invalid_params"][0]["reason"].startswith(
            "no node with 1 GPU has 129 CPU cores; the most is 128"
        )

        holder = await api.submitted(
            token,
            job(
                "holder", accelerators_per_worker=2, cpus_per_worker=100, estimated_duration_s=3600
            ),
        )
        held = await reaches(api, token, holder, "running")
        assert [a["cpu_cores"] for a in held["allocations"]] == [100]
        second = await api.submitted(
            token, job("second", accelerators_per_worker=2, cpus_per_worker=64)
        )
        seen: dict[str, Any] = {}

        async def short_of_cores() -> bool:
            seen.update(await work(api, token, second))
            return "fewer than 64 CPU cores free" in (seen.get("reason") or "")

        await eventually_async(short_of_cores, timeout_s=20, message=lambda: str(seen))
        assert seen["state"] == "pending"

        cancel = await api.client.delete(
            f"/v1/jobs/{holder}", headers={"Authorization": f"Bearer {token}"}
        )
        assert cancel.status == 200
        placed = await reaches(api, token, second, "running")
        assert [a["cpu_cores"] for a in placed["allocations"]] == [64]
