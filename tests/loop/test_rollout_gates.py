"""The gates of a canary rollout (cloud/loop/rollout.py), on nodes' serving figures."""

from __future__ import annotations

import dataclasses

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.loop.rollout import RolloutVerdict, RolloutWatch
from cloud.store import AllocationRecord
from cloud.work.specs import CanarySpec, DeploymentSpec
from shared.messages import (
    DeploymentSample,
    ReplicaSample,
    ReportedDeployment,
    ReportedState,
    Telemetry,
)
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
OLD_SHA, NEW_SHA = "0" * 64, "1" * 64  # the files of the deployment's and the canary's model


def node(
    node_id: str, seq: int, *, requests: int = 50, errors: int = 0, p95_ms: float = 10.0,
    reason: str = "", model_sha256: str | None = None, reported_at: float = T0,
) -> NodeRecord:  # fmt: skip
    """`model_sha256`: the model its replica reports serving (by default the canary's on
    the canary node, the deployment's on the other)."""
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
    if model_sha256 is None:
        model_sha256 = NEW_SHA if node_id == "canary-node" else OLD_SHA
    reported = ReportedState(
        node_id=node_id, instance_id="i1", observed_generation=1, reported_at=reported_at,
        deployments=(ReportedDeployment(deployment_id="d", replica=member, state="ready",
                                        reason=reason, model_sha256=model_sha256),),
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


def judge(watch: RolloutWatch, fleet: dict[str, NodeRecord], now_s: float) -> RolloutVerdict | None:
    return watch.judge("d", SPEC, MEMBERS, fleet, now_s, canary_sha256=NEW_SHA)


def test_healthy_canaries_are_promoted_after_the_hold_and_not_before() -> None:
    watch = RolloutWatch()
    assert judge(watch, nodes(1), T0) is None
    assert judge(watch, nodes(2), T0 + 9) is None
    verdict = judge(watch, nodes(3), T0 + 10)
    assert verdict is not None
    assert verdict.outcome == "promoted"
    assert "0 errors in 150 requests" in verdict.reason  # each sample counted once


def test_an_error_rate_above_the_gate_rolls_back_once_enough_requests_are_seen() -> None:
    watch = RolloutWatch()
    assert judge(watch, nodes(1, requests=5, errors=5), T0) is None
    verdict = judge(watch, nodes(2, requests=20, errors=1), T0 + 1)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "canary error rate 24.0% over 25 requests" in verdict.reason


def test_latency_is_judged_over_enough_requests_not_one_small_sample() -> None:
    # A first sample of 2 requests, one of them slow (a busy host): its p95 is that
    # request. Judged alone it would roll a healthy canary back.
    watch = RolloutWatch()
    assert judge(watch, nodes(1, requests=2, p95_ms=40.0), T0) is None
    # Then it serves as fast as the others: over 102 requests its p95 is no breach.
    assert judge(watch, nodes(2, requests=100, p95_ms=10.0), T0 + 1) is None
    # A canary slow over many requests is rolled back.
    slow = RolloutWatch()
    assert judge(slow, nodes(1, requests=2, p95_ms=40.0), T0) is None
    verdict = judge(slow, nodes(2, requests=100, p95_ms=40.0), T0 + 1)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "4.0× the other replicas'" in verdict.reason


def test_a_slow_canary_or_a_failed_update_rolls_back() -> None:
    slow = judge(RolloutWatch(), nodes(1, p95_ms=40.0), T0)
    assert slow is not None
    assert "4.0× the other replicas'" in slow.reason
    # Sub-millisecond latencies compare against 5 ms: noise is no breach.
    quick = judge(RolloutWatch(), nodes(1, stable_p95_ms=0.2, p95_ms=0.6), T0)
    assert quick is None
    failed = judge(RolloutWatch(), nodes(1, reason="update to abc failed: bad model"), T0)
    assert failed is not None
    assert failed.outcome == "rolled-back"
    assert "bad model" in failed.reason


def test_a_canary_still_serving_the_old_model_is_never_promoted_until_it_serves_the_new() -> None:
    def swapped(seq: int, at_s: float) -> dict[str, NodeRecord]:
        return nodes(seq, model_sha256=NEW_SHA, reported_at=at_s)

    # While the new model downloads the agent keeps the old one serving, ready: its
    # figures are the old model's, however long the download takes.
    watch = RolloutWatch()
    for seq in range(1, 1000, 7):
        assert judge(watch, nodes(seq, model_sha256=OLD_SHA), T0 + seq) is None
    # Swapped at T0 + 1000, as its report says. The sample that spans the swap is partly
    # the old model's: the hold starts with the first one wholly on the new model.
    assert judge(watch, swapped(1000, T0 + 1000), T0 + 1000) is None
    assert judge(watch, swapped(1001, T0 + 1000), T0 + 1001) is None
    # The report goes back to the old model (say, the swap is retried): the hold restarts.
    assert judge(watch, nodes(1002, model_sha256=OLD_SHA), T0 + 1002) is None
    assert judge(watch, swapped(1004, T0 + 1003), T0 + 1004) is None  # the hold starts
    assert judge(watch, swapped(1013, T0 + 1003), T0 + 1013) is None  # 9 s
    verdict = judge(watch, swapped(1014, T0 + 1003), T0 + 1014)
    assert verdict is not None
    assert verdict.outcome == "promoted"
    # The new model's samples only: T0 + 1001, + 1004, + 1013, + 1014.
    assert "0 errors in 200 requests" in verdict.reason


def test_without_the_canary_models_sha256_no_canary_counts_as_serving_it() -> None:
    watch = RolloutWatch()
    for seq in (1, 50, 100):
        verdict = watch.judge("d", SPEC, MEMBERS, nodes(seq), T0 + seq, canary_sha256=None)
        assert verdict is None


def offline(record: NodeRecord) -> NodeRecord:
    """`record` gone offline: the registry keeps its last report and sample."""
    return dataclasses.replace(record, state="offline", offline_reason="connection-lost")


def test_a_canary_whose_node_went_offline_is_not_promoted_on_its_last_figures() -> None:
    watch = RolloutWatch()
    assert judge(watch, nodes(1), T0) is None  # the hold starts
    # The canary crashes its node right after its first sample.
    gone = {**nodes(2), "canary-node": offline(nodes(1)["canary-node"])}
    assert judge(watch, gone, T0 + 10) is None
    assert judge(watch, gone, T0 + 60) is None
    # Back online with the same agent: the sample from before it went away says
    # nothing of the canary since.
    back = {**nodes(3), "canary-node": nodes(1)["canary-node"]}
    assert judge(watch, back, T0 + 61) is None
    assert judge(watch, back, T0 + 80) is None
    # Its next sample starts the hold again.
    assert judge(watch, nodes(4), T0 + 81) is None
    assert judge(watch, nodes(5), T0 + 90) is None
    verdict = judge(watch, nodes(6), T0 + 91)
    assert verdict is not None
    assert verdict.outcome == "promoted"


def test_a_restarted_canary_agent_counts_once_it_reports_the_new_model_itself() -> None:
    watch = RolloutWatch()
    assert judge(watch, nodes(1), T0) is None
    # The canary's agent restarts (instance i2) and samples from 0 again; the registry
    # keeps the previous instance's report until the new one reports.
    fleet = nodes(2)
    before = fleet["canary-node"]
    assert before.telemetry is not None
    restarted = dataclasses.replace(
        before,
        status=msgspec.structs.replace(before.status, instance_id="i2"),
        decoded_telemetry=msgspec.structs.replace(before.telemetry, instance_id="i2", seq=1),
        telemetry_seq=1,
    )
    fleet["canary-node"] = restarted
    assert judge(watch, fleet, T0 + 10) is None
    assert judge(watch, fleet, T0 + 20) is None
    # It reports the new model: its samples count from then on.
    assert restarted.reported is not None
    fleet["canary-node"] = dataclasses.replace(
        restarted,
        reported=msgspec.structs.replace(restarted.reported, instance_id="i2", reported_at=T0),
        decoded_telemetry=msgspec.structs.replace(before.telemetry, instance_id="i2", seq=2),
        telemetry_seq=2,
    )
    assert judge(watch, fleet, T0 + 21) is None
    verdict = judge(watch, fleet, T0 + 31)
    assert verdict is not None
    assert verdict.outcome == "promoted"


# One edge box serving both replicas: the canary (0) beside the current model's (1).
ONE_BOX = (replica(0, "edge-box"), replica(1, "edge-box"))


def figures(number: int, *, requests: int = 50, errors: int = 0, p95_ms: float) -> ReplicaSample:
    return ReplicaSample(
        replica=number, requests=requests, errors=errors, rejected=0,
        requests_per_s=float(requests), latency_p95_ms=p95_ms,
    )  # fmt: skip


def edge_box(seq: int, *replicas: ReplicaSample, per_replica: bool = True) -> NodeRecord:
    """The box after sample `seq`: the deployment's figures are its replicas' together
    (p95 the worst's, as a merged window's comes near), each replica's within them
    unless `per_replica` is off (an agent before schema 1.13)."""
    record = node("edge-box", seq)
    assert record.telemetry is not None
    assert record.reported is not None
    sample = DeploymentSample(
        deployment_id="d",
        requests=sum(r.requests for r in replicas),
        errors=sum(r.errors for r in replicas),
        rejected=0,
        requests_per_s=sum(r.requests_per_s for r in replicas),
        latency_p95_ms=max(r.latency_p95_ms or 0.0 for r in replicas),
        replicas=replicas if per_replica else (),
    )
    reported = (
        ReportedDeployment(deployment_id="d", replica=0, state="ready", model_sha256=NEW_SHA),
        ReportedDeployment(deployment_id="d", replica=1, state="ready", model_sha256=OLD_SHA),
    )
    return dataclasses.replace(
        record,
        decoded_telemetry=msgspec.structs.replace(record.telemetry, deployments=(sample,)),
        reported=msgspec.structs.replace(record.reported, deployments=reported),
    )


def judge_box(watch: RolloutWatch, box: NodeRecord, now_s: float) -> RolloutVerdict | None:
    return watch.judge("d", SPEC, ONE_BOX, {"edge-box": box}, now_s, canary_sha256=NEW_SHA)


def test_a_slow_canary_beside_a_current_replica_on_its_node_is_rolled_back() -> None:
    """The canary is judged against the other replica though both share one node."""
    box = edge_box(1, figures(0, p95_ms=40.0), figures(1, p95_ms=10.0))
    verdict = judge_box(RolloutWatch(), box, T0)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "canary p95 40.0 ms is 4.0× the other replicas'" in verdict.reason


def test_a_failing_canary_beside_a_current_replica_is_judged_on_its_own_requests() -> None:
    # 10 errors in the canary's 50 requests: 20 %, not 10 % of the node's 100.
    box = edge_box(1, figures(0, errors=10, p95_ms=10.0), figures(1, p95_ms=10.0))
    verdict = judge_box(RolloutWatch(), box, T0)
    assert verdict is not None
    assert verdict.outcome == "rolled-back"
    assert "canary error rate 20.0% over 50 requests" in verdict.reason


def test_a_healthy_canary_beside_a_current_replica_is_promoted_on_its_own_requests() -> None:
    watch = RolloutWatch()
    for seq, now_s in ((1, T0), (2, T0 + 9)):
        box = edge_box(seq, figures(0, p95_ms=11.0), figures(1, p95_ms=10.0))
        assert judge_box(watch, box, now_s) is None
    # A withdrawn replica's last figures (no longer placed there) are no baseline.
    box = edge_box(
        3, figures(0, p95_ms=11.0), figures(1, p95_ms=10.0), figures(7, requests=1000, p95_ms=0.1)
    )
    verdict = judge_box(watch, box, T0 + 10)
    assert verdict is not None
    assert verdict.outcome == "promoted"
    assert "0 errors in 150 requests" in verdict.reason  # the canary's, not the node's 300


def test_an_older_agent_without_replica_figures_is_judged_by_node_as_before() -> None:
    """Its node serves a canary replica, so all its figures are the canary's, and with
    no other node there is no baseline to compare its latency with."""
    watch = RolloutWatch()
    for seq, now_s in ((1, T0), (2, T0 + 9)):
        box = edge_box(seq, figures(0, p95_ms=40.0), figures(1, p95_ms=10.0), per_replica=False)
        assert judge_box(watch, box, now_s) is None
    box = edge_box(3, figures(0, p95_ms=40.0), figures(1, p95_ms=10.0), per_replica=False)
    verdict = judge_box(watch, box, T0 + 10)
    assert verdict is not None
    assert verdict.outcome == "promoted"
    assert "0 errors in 300 requests" in verdict.reason
