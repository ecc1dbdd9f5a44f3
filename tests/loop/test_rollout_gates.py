"""The gates of a canary rollout (cloud/loop/rollout.py), on nodes' serving figures."""

from __future__ import annotations

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.loop.rollout import RolloutWatch
from cloud.store import AllocationRecord
from cloud.work.specs import CanarySpec, DeploymentSpec
from shared.messages import DeploymentSample, ReportedDeployment, ReportedState, Telemetry
from tests.usage.test_accountant import T0, birth

SPEC = DeploymentSpec(
    name="risk",
    model_id="old",
    replicas=2,
    canary=CanarySpec(model_id="new", replicas=1, hold_s=10.0, min_requests=10),
)


def replica(member: int, node_id: str) -> AllocationRecord:
    return AllocationRecord(
        work_id="d", member_index=member, node_id=node_id, accelerator_kind="gpu",
        accelerators=1, accelerator_ids=("gpu0",), host_memory_bytes=0, started_at=T0,
        expected_end=None, borrowed=False, state="running", tenant_id="t",
        work_kind="inference", priority="p0",
    )  # fmt: skip


MEMBERS = (replica(0, "canary-node"), replica(1, "stable-node"))


def node(
    node_id: str, seq: int, *, requests: int = 50, errors: int = 0, p95_ms: float = 10.0,
    reason: str = "",
) -> NodeRecord:  # fmt: skip
    status = msgspec.structs.replace(birth(T0), node_id=node_id)
    sample = DeploymentSample(
        deployment_id="d", requests=requests, errors=errors, rejected=0,
        requests_per_s=float(requests), latency_p95_ms=p95_ms,
    )  # fmt: skip
    telemetry = Telemetry(
        node_id=node_id, instance_id="i1", seq=seq, sampled_at=T0 + seq, interval_s=1.0,
        cpu_utilization_pct=1.0, memory_used_bytes=1, memory_total_bytes=2,
        deployments=(sample,),
    )  # fmt: skip
    member = 0 if node_id == "canary-node" else 1
    reported = ReportedState(
        node_id=node_id, instance_id="i1", observed_generation=1, reported_at=T0,
        deployments=(ReportedDeployment(deployment_id="d", replica=member, state="ready",
                                        reason=reason),),
    )  # fmt: skip
    return NodeRecord(
        status=status, state="online", offline_reason=None, last_seen_monotonic=0.0,
        last_seen_at=T0, decoded_telemetry=telemetry, reported=reported,
    )  # fmt: skip


def nodes(seq: int, stable_p95_ms: float = 10.0, **canary: object) -> dict[str, NodeRecord]:
    return {
        "canary-node": node("canary-node", seq, **canary),  # type: ignore[arg-type]
        "stable-node": node("stable-node", seq, p95_ms=stable_p95_ms),
    }


def test_healthy_canaries_are_promoted_after_the_hold_and_not_before() -> None:
    watch = RolloutWatch()
    assert watch.judge("d", SPEC, MEMBERS, nodes(1), T0) is None
    assert watch.judge("d", SPEC, MEMBERS, nodes(2), T0 + 9) is None
    verdict = watch.judge("d", SPEC, MEMBERS, nodes(3), T0 + 10)
    assert verdict is not None
    assert verdict.outcome == "promoted"
    assert "0 errors in 150 requests" in verdict.reason  # each sample counted once


def test_an_error_rate_above_the_gate_rolls_back_once_enough_requests_are_seen() -> None:
    watch = RolloutWatch()
    assert watch.judge("d", SPEC, MEMBERS, nodes(1, requests=5, errors=5), T0) is None
    verdict = watch.judge("d", SPEC, MEMBERS, nodes(2, requests=20, errors=1), T0 + 1)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "canary error rate 24.0% over 25 requests" in verdict.reason


def test_latency_is_judged_over_enough_requests_not_one_small_sample() -> None:
    # A first sample of 2 requests, one of them slow (a busy host): its p95 is that
    # request. Judged alone it would roll a healthy canary back.
    watch = RolloutWatch()
    assert watch.judge("d", SPEC, MEMBERS, nodes(1, requests=2, p95_ms=40.0), T0) is None
    # Then it serves as fast as the others: over 102 requests its p95 is no breach.
    assert watch.judge("d", SPEC, MEMBERS, nodes(2, requests=100, p95_ms=10.0), T0 + 1) is None
    # A canary slow over many requests is rolled back.
    slow = RolloutWatch()
    assert slow.judge("d", SPEC, MEMBERS, nodes(1, requests=2, p95_ms=40.0), T0) is None
    verdict = slow.judge("d", SPEC, MEMBERS, nodes(2, requests=100, p95_ms=40.0), T0 + 1)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "4.0× the other replicas'" in verdict.reason


def test_a_slow_canary_or_a_failed_update_rolls_back() -> None:
    slow = RolloutWatch().judge("d", SPEC, MEMBERS, nodes(1, p95_ms=40.0), T0)
    assert slow is not None
    assert "4.0× the other replicas'" in slow.reason
    # Sub-millisecond latencies compare against 5 ms: noise is no breach.
    quick = RolloutWatch().judge("d", SPEC, MEMBERS, nodes(1, stable_p95_ms=0.2, p95_ms=0.6), T0)
    assert quick is None
    failed = RolloutWatch().judge(
        "d", SPEC, MEMBERS, nodes(1, reason="update to abc failed: bad model"), T0
    )
    assert failed is not None
    assert failed.outcome == "rolled-back"
    assert "bad model" in failed.reason
