"""Rollouts and autoscaling meeting no traffic and each other (review round 6).

- A canary that answers no request is never promoted: its gates have judged nothing. It
  holds, saying it waits for traffic, and is promoted once it has answered
  `min_requests` (or rolled back, if those requests fail).
- A deployment autoscaled on p95 latency scales down when its traffic stops (an idle
  replica measures no p95), under its carbon cap too.
- The autoscaler scaling a rollout to one replica ends the rollout, with its
  `work.rollout` event, instead of leaving a canary on the only replica for ever.

The pass's deployment step runs on the real store of either backend; the nodes' reports
and samples are built (the seam: what agents say over MQTT).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import pytest

from cloud.fleet.registry import NodeRecord
from cloud.loop.autoscale import Autoscaler, ServingLoad
from cloud.loop.deployment_control import DeploymentControl
from cloud.loop.desired import canary_members
from cloud.loop.rollout import RolloutWatch
from cloud.loop.scaling import scaled_spec
from cloud.store import LeadershipLease, PassWrite, StoreSnapshot
from cloud.work.specs import AutoscaleSpec, CanarySpec, CarbonCapSpec, DeploymentSpec
from shared.messages import DeploymentSample, ReportedDeployment, ReportedState, Telemetry
from tests.api.support import Api, bearer, running_api
from tests.loop.test_rollout_gates import judge, nodes, replica
from tests.store.builders import placement
from tests.store.databases import DatabaseUnderTest
from tests.support.onnx_models import mlp
from tests.usage.test_accountant import T0, birth

pytestmark = pytest.mark.timeout(60)


# --- the rollout's gates, on built figures --------------------------------------------


def test_a_canary_without_traffic_holds_past_its_hold_and_says_it_waits_for_traffic() -> None:
    watch = RolloutWatch()
    # Serving the new model, no request for an hour (hold_s is 10, min_requests 10).
    for seq in range(1, 3600, 60):
        assert judge(watch, nodes(seq, requests=0), T0 + seq) is None
    assert watch.waiting("d") == "waiting for traffic: 0 of 10 requests"
    assert judge(watch, nodes(3601, requests=4), T0 + 3601) is None
    assert watch.waiting("d") == "waiting for traffic: 4 of 10 requests"
    # Enough answered, held long since: promoted at once.
    verdict = judge(watch, nodes(3602, requests=6), T0 + 3602)
    assert verdict is not None
    assert verdict.outcome == "promoted"
    assert "0 errors in 10 requests" in verdict.reason


def test_a_canary_failing_every_request_is_rolled_back_once_it_gets_traffic() -> None:
    watch = RolloutWatch()
    for seq in range(1, 600, 30):
        assert judge(watch, nodes(seq, requests=0), T0 + seq) is None
    verdict = judge(watch, nodes(600, requests=10, errors=10), T0 + 600)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "canary error rate 100.0% over 10 requests" in verdict.reason


def test_the_wait_says_what_the_canary_waits_for() -> None:
    watch = RolloutWatch()
    assert watch.waiting("d") is None  # not watched
    assert judge(watch, nodes(1, model_sha256="0" * 64), T0) is None
    assert watch.waiting("d") == "waiting for the canary replicas to serve the new model"
    assert judge(watch, nodes(2), T0 + 2) is None
    assert watch.waiting("d") == "holding: 0 of 10 s"
    assert judge(watch, nodes(5), T0 + 5) is None
    assert watch.waiting("d") == "holding: 3 of 10 s"


# --- the autoscaler on latency, idle ----------------------------------------------------

ON_LATENCY = AutoscaleSpec(
    min_replicas=1,
    max_replicas=8,
    target_p95_latency_ms=50.0,
    scale_down_stabilization_s=60.0,
    max_replicas_by_carbon=(CarbonCapSpec(above_g_per_kwh=300.0, max_replicas=2),),
)
IDLE = ServingLoad(ready_replicas=8, requests_per_s=0.0, p95_latency_ms=None)


def test_a_deployment_on_latency_scales_down_when_its_traffic_stops() -> None:
    scaler = Autoscaler()
    assert scaler.decide("d", ON_LATENCY, 8, ServingLoad(8, 400.0, 50.0), now_s=0.0) is None
    assert scaler.decide("d", ON_LATENCY, 8, IDLE, now_s=30.0) is None  # within the window
    decision = scaler.decide("d", ON_LATENCY, 8, IDLE, now_s=100.0)
    assert decision is not None
    assert (decision.to_replicas, decision.recommendation) == (4, 1)  # max_step 4
    assert decision.metric == "p95_latency_ms"
    assert decision.reason == (
        "no requests, so no p95 against a target of 50 ms: 1 (min_replicas) recommended"
    )
    last = scaler.decide("d", ON_LATENCY, 4, IDLE, now_s=200.0)
    assert last is not None
    assert last.to_replicas == 1
    assert scaler.decide("d", ON_LATENCY, 1, IDLE, now_s=300.0) is None  # at the floor


def test_an_idle_deployment_on_latency_keeps_to_its_carbon_cap() -> None:
    floor = msgspec.structs.replace(ON_LATENCY, min_replicas=3)
    decision = Autoscaler().decide("d", floor, 8, IDLE, now_s=0.0, intensity_g_per_kwh=500.0)
    assert decision is None  # a new leader does not scale down on its first look
    scaler = Autoscaler()
    scaler.decide("d", floor, 8, ServingLoad(8, 400.0, 50.0), now_s=0.0)
    decision = scaler.decide("d", floor, 8, IDLE, now_s=100.0, intensity_g_per_kwh=500.0)
    assert decision is not None
    # The cap (2) is never below min_replicas (3): 3 recommended, capped at 3.
    assert (decision.to_replicas, decision.recommendation, decision.carbon_cap) == (4, 3, 3)
    # Serving requests with no p95 says nothing: no decision.
    odd = ServingLoad(ready_replicas=8, requests_per_s=5.0, p95_latency_ms=None)
    assert scaler.decide("d", floor, 8, odd, now_s=200.0) is None


# --- a canary's share when the count changes --------------------------------------------


def rollout(replicas: int, canary_replicas: int) -> DeploymentSpec:
    canary = CanarySpec(model_id="new", replicas=canary_replicas)
    return DeploymentSpec(name="risk", model_id="old", replicas=replicas, canary=canary)


@pytest.mark.parametrize(
    ("replicas", "canary_replicas", "to_replicas", "canary_after"),
    [
        (6, 2, 3, 1),  # a third stays a third
        (6, 2, 5, 1),  # 2 of 5 is more than a third
        (6, 3, 4, 2),  # a half stays a half
        (3, 2, 2, 1),  # one keeps the model
        (3, 1, 6, 1),  # more replicas: the canary's share only falls
        (6, 2, 1, 1),  # one replica: the rollout ends (the judge's, or the PATCH's)
    ],
)
def test_a_canary_comes_down_with_its_deployment_in_proportion(
    replicas: int, canary_replicas: int, to_replicas: int, canary_after: int
) -> None:
    scaled = scaled_spec(rollout(replicas, canary_replicas), to_replicas)
    assert scaled.canary is not None
    assert (scaled.replicas, scaled.canary.replicas) == (to_replicas, canary_after)


def test_a_canary_is_counted_within_the_spec_while_the_surplus_is_still_held() -> None:
    held = tuple(replica(member, f"n{member}") for member in range(6))
    # Scaled to 3 (canary 1), its 6 replicas not given back yet.
    assert canary_members(scaled_spec(rollout(6, 2), 3), held) == {0}
    # A stored canary of 2 on 3 replicas (written before this fix): never 2 of 3 kept.
    assert canary_members(rollout(3, 2), held) == {0, 1}
    assert canary_members(rollout(2, 1), held) == {0}
    assert canary_members(rollout(1, 1), held) == frozenset()


# --- the pass's deployment step, on the real store ----------------------------------------


@pytest.fixture
async def api(database: DatabaseUnderTest) -> AsyncIterator[Api]:
    async with running_api(database) as running:
        yield running


def serving(
    node_id: str, seq: int, deployment_id: str, replica: int, sha256: str, *, requests: int
) -> NodeRecord:
    """A node, online, whose replica of the deployment is ready on the model of `sha256`,
    with a sample of `requests` over a second (telemetry `seq` at T0 + seq, after the
    report at T0)."""
    sample = DeploymentSample(
        deployment_id=deployment_id, requests=requests, errors=0, rejected=0,
        requests_per_s=float(requests), latency_p95_ms=10.0 if requests else None,
    )  # fmt: skip
    telemetry = Telemetry(
        node_id=node_id, instance_id="i1", seq=seq, sampled_at=T0 + seq, interval_s=1.0,
        cpu_utilization_pct=1.0, memory_used_bytes=1, memory_total_bytes=2, deployments=(sample,),
    )  # fmt: skip
    reported = ReportedState(
        node_id=node_id, instance_id="i1", observed_generation=1, reported_at=T0,
        deployments=(ReportedDeployment(deployment_id=deployment_id, replica=replica,
                                        state="ready", model_sha256=sha256),),
    )  # fmt: skip
    return NodeRecord(
        status=msgspec.structs.replace(birth(T0), node_id=node_id), state="online",
        offline_reason=None, last_seen_monotonic=0.0, last_seen_at=T0,
        decoded_telemetry=telemetry, reported=reported,
    )  # fmt: skip


async def placed_rollout(
    api: Api, token: str, spec: dict[str, Any], rollout: dict[str, Any]
) -> tuple[str, dict[str, str]]:
    """A deployment running on nodes n0, n1, ... then a model update with `rollout`:
    its id, and the sha256 of the current and the canary's model."""
    first = await api.model(token)
    second = await api.model(token, mlp(seed=11), name="mlp-v2")
    body = {"name": "risk", "model_id": first, **spec}
    deployment_id = await api.submitted(token, body, collection="deployments")
    replicas = spec["replicas"]
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        write = placement(deployment_id, *(f"n{i}" for i in range(replicas)))
        await api.store.commit_pass(PassWrite(placements=(write,)), lease=lease)
    await api.store.transition(deployment_id, "running")
    response = await api.client.patch(
        f"/v1/deployments/{deployment_id}",
        json={"model_id": second, "rollout": rollout},
        headers=bearer(token),
    )
    assert response.status == 200, await response.text()
    models = await api.store.models_by_id([first, second])
    return deployment_id, {"old": models[first].sha256, "new": models[second].sha256}


async def rollout_events(api: Api, deployment_id: str) -> list[dict[str, Any]]:
    records = await api.store.list_events(tenant_id=None, limit=1000, work_id=deployment_id)
    return [msgspec.json.decode(e.payload) for e in records if e.kind == "work.rollout"]


class Passes:
    """The deployment step pass after pass, as the leader runs it, committing to the store."""

    def __init__(self, api: Api, lease: LeadershipLease) -> None:
        self.api, self.lease = api, lease
        self.control = DeploymentControl(api.store, self._commit)

    async def _commit(
        self, write: PassWrite, lease: LeadershipLease, records: Mapping[str, Any]
    ) -> None:
        await self.api.store.commit_pass(write, lease=lease)

    async def run(self, fleet: Mapping[str, NodeRecord], now: float) -> StoreSnapshot:
        snapshot = await self.api.store.load_snapshot()
        after, _ = await self.control.run(snapshot, fleet, self.lease, now)
        return after


async def test_a_canary_that_gets_no_traffic_is_not_promoted_by_the_loop(api: Api) -> None:
    token = await api.tenant("acme")
    rollout = {"canary_replicas": 1, "hold_s": 5.0, "min_requests": 20}
    deployment_id, sha = await placed_rollout(api, token, {"replicas": 2}, rollout)

    def fleet(seq: int, requests: int) -> dict[str, NodeRecord]:
        return {
            "n0": serving("n0", seq, deployment_id, 0, sha["new"], requests=requests),
            "n1": serving("n1", seq, deployment_id, 1, sha["old"], requests=requests),
        }

    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        passes = Passes(api, lease)
        # Ten minutes of passes, forty times the hold, not a request.
        for seq in range(1, 600, 15):
            await passes.run(fleet(seq, requests=0), T0 + seq)
        record = await api.store.get_work(await api.tenant_id(token), deployment_id)
        assert record is not None
        assert msgspec.json.decode(record.spec)["canary"] is not None
        assert await rollout_events(api, deployment_id) == []
        # Traffic comes: promoted once the canary has answered min_requests.
        await passes.run(fleet(600, requests=10), T0 + 600)
        assert await rollout_events(api, deployment_id) == []
        await passes.run(fleet(601, requests=10), T0 + 601)
    (event,) = await rollout_events(api, deployment_id)
    assert event["outcome"] == "promoted"
    assert "0 errors in 20 requests" in event["reason"]


async def test_the_autoscaler_scaling_a_rollout_to_one_replica_ends_it(api: Api) -> None:
    token = await api.tenant("acme")
    autoscale = {
        "min_replicas": 1,
        "max_replicas": 6,
        "target_requests_per_s": 1.0,
        "scale_down_stabilization_s": 0.0,
        "max_step": 6,
    }
    rollout = {"canary_share": 0.34, "hold_s": 600.0}
    deployment_id, sha = await placed_rollout(
        api, token, {"replicas": 6, "autoscale": autoscale}, rollout
    )
    # Replicas 0 and 1 are the canary (a third of 6); traffic has stopped.
    idle = {
        f"n{i}": serving(f"n{i}", 1, deployment_id, i, sha["new" if i < 2 else "old"], requests=0)
        for i in range(6)
    }
    lease = await api.store.try_acquire_leadership()
    assert lease is not None
    async with lease:
        passes = Passes(api, lease)
        after = await passes.run(idle, T0 + 1)
        (record,) = [r for r in after.work if r.work_id == deployment_id]
        spec = msgspec.json.decode(record.spec)
        assert (spec["replicas"], spec["canary"]["replicas"]) == (1, 1)
        assert [a.member_index for a in after.allocations if a.work_id == deployment_id] == [0]
        # The next pass: a rollout on one replica has nothing to keep the model on.
        after = await passes.run({"n0": idle["n0"]}, T0 + 2)
    (record,) = [r for r in after.work if r.work_id == deployment_id]
    spec = msgspec.json.decode(record.spec)
    assert (spec["replicas"], spec["canary"]) == (1, None)
    (event,) = await rollout_events(api, deployment_id)
    assert (event["outcome"], event["reason"]) == ("rolled-back", "scaled to 1 replica")
