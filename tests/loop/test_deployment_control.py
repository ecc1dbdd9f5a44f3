"""The deployment step of a pass (cloud/loop/deployment_control.py), on a store double:
one deployment's figures never stop the step, which runs before the scheduler, and a
canary is promoted only once its replicas report the sha256 of the canary model's
file as the registry has it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, cast

import msgspec
import pytest
from structlog.testing import capture_logs

from cloud.fleet.registry import NodeRecord
from cloud.loop.autoscale import Autoscaler, ScaleDecision, ServingLoad
from cloud.loop.deployment_control import DeploymentControl
from cloud.store import (
    AllocationRecord,
    LeadershipLease,
    ModelRecord,
    NewEvent,
    PassWrite,
    Store,
    StoreSnapshot,
    WorkRecord,
)
from cloud.work.specs import AutoscaleSpec
from shared.messages import DeploymentSample, ReportedDeployment, ReportedState, Telemetry
from tests.loop.builders import allocation, work
from tests.usage.test_accountant import T0, birth

OLD_SHA, NEW_SHA = "0" * 64, "1" * 64  # the files of the deployment's and the canary's model


class StoreDouble:
    """What the deployment step asks of the store: the snapshot (specs updated in place),
    the registry's models, and what it writes."""

    def __init__(self, snapshot: StoreSnapshot, models: Mapping[str, ModelRecord]) -> None:
        self.snapshot = snapshot
        self.models = dict(models)
        self.updated: list[tuple[str, dict[str, Any]]] = []  # (work id, new spec)
        self.events: list[NewEvent] = []

    async def load_snapshot(self, previous: StoreSnapshot | None = None) -> StoreSnapshot:
        return self.snapshot

    async def drain_waiting(self) -> dict[str, tuple[str, ...]]:
        return {}

    async def models_by_id(self, model_ids: Sequence[str]) -> dict[str, ModelRecord]:
        return {i: self.models[i] for i in model_ids if i in self.models}

    async def update_spec(
        self, tenant_id: str, work_id: str, spec: bytes, *, expected_version: int | None = None
    ) -> WorkRecord:
        (record,) = [r for r in self.snapshot.work if r.work_id == work_id]
        assert expected_version == record.version
        updated = dataclasses.replace(record, spec=spec, version=record.version + 1)
        work_now = tuple(updated if r.work_id == work_id else r for r in self.snapshot.work)
        self.snapshot = dataclasses.replace(self.snapshot, work=work_now)
        self.updated.append((work_id, msgspec.json.decode(spec)))
        return updated

    async def record_event(self, event: NewEvent) -> None:
        self.events.append(event)


async def no_commit(write: PassWrite, lease: LeadershipLease, records: Any) -> None:
    raise AssertionError(f"nothing to commit here: {write}")


def model(model_id: str, sha256: str) -> ModelRecord:
    return ModelRecord(
        model_id=model_id, tenant_id="t1", name=model_id, sha256=sha256, size_bytes=1, opset=17,
        inputs=(), outputs=(), created_at=T0,
    )  # fmt: skip


def serving_node(
    node_id: str,
    seq: int,
    serves: Mapping[str, tuple[int, str]],
    *,
    requests_per_s: float = 50.0,
    reported_at: float = T0,
) -> NodeRecord:
    """A node serving, for each deployment id, (replica, sha256 of its model), with a
    sample of 50 requests in a second (telemetry `seq` at T0 + seq)."""
    samples = tuple(
        DeploymentSample(
            deployment_id=work_id, requests=50, errors=0, rejected=0,
            requests_per_s=requests_per_s, latency_p95_ms=10.0,
        )
        for work_id in serves
    )  # fmt: skip
    telemetry = Telemetry(
        node_id=node_id, instance_id="i1", seq=seq, sampled_at=T0 + seq, interval_s=1.0,
        cpu_utilization_pct=1.0, memory_used_bytes=1, memory_total_bytes=2, deployments=samples,
    )  # fmt: skip
    reported = ReportedState(
        node_id=node_id, instance_id="i1", observed_generation=1, reported_at=reported_at,
        deployments=tuple(
            ReportedDeployment(deployment_id=work_id, replica=replica, state="ready",
                               model_sha256=sha256)
            for work_id, (replica, sha256) in serves.items()
        ),
    )  # fmt: skip
    return NodeRecord(
        status=msgspec.structs.replace(birth(T0), node_id=node_id), state="online",
        offline_reason=None, last_seen_monotonic=0.0, last_seen_at=T0,
        decoded_telemetry=telemetry, reported=reported,
    )  # fmt: skip


def running(work_id: str, member: int, node_id: str) -> AllocationRecord:
    return dataclasses.replace(
        allocation(work_id, member, node_id, kind="inference"), state="running"
    )


def snapshot(
    records: Sequence[WorkRecord], allocations: Sequence[AllocationRecord]
) -> StoreSnapshot:
    return StoreSnapshot(
        tenants=(), work=tuple(records), allocations=tuple(allocations), node_generations={}
    )


AUTOSCALE = {"min_replicas": 1, "max_replicas": 4, "target_requests_per_s": 10.0}


async def test_a_deployment_whose_autoscaling_fails_leaves_the_others_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "bad" comes first: its failure used to end the step, and with it the pass.
    store = StoreDouble(
        snapshot(
            [
                work(w, kind="inference", state="running", replicas=1, autoscale=AUTOSCALE)
                for w in ("bad", "good")
            ],
            [running("bad", 0, "n1"), running("good", 0, "n1")],
        ),
        {},
    )
    fleet = {"n1": serving_node("n1", 1, {"bad": (0, OLD_SHA), "good": (0, OLD_SHA)})}
    decide = Autoscaler.decide

    def failing_for_bad(
        self: Autoscaler,
        work_id: str,
        spec: AutoscaleSpec,
        desired: int,
        load: ServingLoad | None,
        **options: Any,
    ) -> ScaleDecision | None:
        if work_id == "bad":
            raise ArithmeticError("figures no rule foresaw")
        return decide(self, work_id, spec, desired, load, **options)

    monkeypatch.setattr(Autoscaler, "decide", failing_for_bad)
    control = DeploymentControl(cast(Store, store), no_commit)
    lease = cast(LeadershipLease, None)
    with capture_logs() as logs:
        for now in (T0, T0 + 1):  # failing every pass, logged once
            await control.run(store.snapshot, fleet, lease, now)
    assert [(w, spec["replicas"]) for w, spec in store.updated] == [("good", 4)]  # 50/s
    failures = [e for e in logs if e["event"].startswith("deployment decision failed")]
    assert [(e["step"], e["work_id"], e["log_level"]) for e in failures] == [
        ("autoscale", "bad", "error")
    ]


async def test_a_node_saying_it_serves_1e308_requests_per_s_stops_no_pass() -> None:
    # Constructed, not decoded: the decoder refuses such a figure (test_autoscale.py),
    # and two such nodes add up to inf.
    store = StoreDouble(
        snapshot(
            [work("d", kind="inference", state="running", replicas=2, autoscale=AUTOSCALE)],
            [running("d", 0, "n1"), running("d", 1, "n2")],
        ),
        {},
    )
    fleet = {
        node_id: serving_node(node_id, 1, {"d": (member, OLD_SHA)}, requests_per_s=1e308)
        for member, node_id in enumerate(("n1", "n2"))
    }
    control = DeploymentControl(cast(Store, store), no_commit)
    await control.run(store.snapshot, fleet, cast(LeadershipLease, None), T0)
    assert [(w, spec["replicas"]) for w, spec in store.updated] == [("d", 4)]  # max_replicas


async def test_a_canary_is_promoted_only_once_it_reports_the_canary_models_sha256() -> None:
    canary = {"model_id": "new", "replicas": 1, "hold_s": 10.0, "min_requests": 10}
    store = StoreDouble(
        snapshot(
            [work("d", kind="inference", state="running", model_id="old", replicas=2,
                  canary=canary)],
            [running("d", 0, "canary-node"), running("d", 1, "stable-node")],
        ),
        {"old": model("old", OLD_SHA), "new": model("new", NEW_SHA)},
    )  # fmt: skip
    control = DeploymentControl(cast(Store, store), no_commit)
    lease = cast(LeadershipLease, None)

    def fleet(seq: int, canary_sha256: str, reported_at: float = T0) -> dict[str, NodeRecord]:
        return {
            "canary-node": serving_node(
                "canary-node", seq, {"d": (0, canary_sha256)}, reported_at=reported_at
            ),
            "stable-node": serving_node("stable-node", seq, {"d": (1, OLD_SHA)}),
        }

    # The new model downloads for ten minutes; the old one serves meanwhile, ready.
    for seq in range(1, 600, 13):
        await control.run(store.snapshot, fleet(seq, OLD_SHA), lease, T0 + seq)
    assert store.updated == []
    # Swapped at T0 + 600: promoted once it has served the new model for hold_s.
    for seq in range(601, 611):
        await control.run(store.snapshot, fleet(seq, NEW_SHA, T0 + 600), lease, T0 + seq)
    assert store.updated == []
    await control.run(store.snapshot, fleet(611, NEW_SHA, T0 + 600), lease, T0 + 611)
    assert [(w, spec["model_id"], spec.get("canary")) for w, spec in store.updated] == [
        ("d", "new", None)
    ]
    (event,) = [msgspec.json.decode(e.payload) for e in store.events]
    assert event["outcome"] == "promoted"
    assert "0 errors in 550 requests" in event["reason"]  # the new model's samples only
