"""Plausibility limits (cloud/fleet/plausibility.py): what a node may claim in a birth,
a sample, a report, an event or a log chunk, and which report transitions are legal."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cloud.fleet.plausibility import (
    MAX_RATE_PER_S,
    MAX_REPLICA_SAMPLES,
    Implausible,
    PlausibilityLimits,
    check_event,
    check_log_chunk,
    check_reported,
    check_status,
    check_telemetry,
    without_illegal_transitions,
)
from shared.messages import (
    TELEMETRY_DECODER,
    Accelerator,
    AcceleratorSample,
    DeploymentSample,
    HostInfo,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReplicaSample,
    ReportedState,
    ReportedTraining,
    Telemetry,
    TrainingRunState,
)
from shared.settings import CloudSettings

NOW_S = 1_800_000_000.0
LIMITS = PlausibilityLimits.of(CloudSettings())


def gpu(index: int = 0, **changes: Any) -> Accelerator:
    base = Accelerator(
        id=f"gpu{index}",
        kind="gpu",
        vendor="nvidia",
        model="A100",
        memory_bytes=80 * 1024**3,
        compute_units=108,
        idle_power_w=50.0,
        max_power_w=400.0,
        relative_speed=1.0,
        onnx_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
    )
    return msgspec.structs.replace(base, **changes)


def birth(**changes: Any) -> NodeStatus:
    base = NodeStatus(
        node_id="n1",
        state="online",
        instance_id="i1",
        agent_version="0.1.0",
        site="cloud",
        zone="DE",
        region="europe-west3",
        labels={"rack": "r7"},
        host=HostInfo(
            hostname="n1", os="Linux", arch="x86_64", cpu_logical_cores=64, memory_total_bytes=2**39
        ),
        accelerators=tuple(gpu(i) for i in range(8)),
        telemetry_interval_s=5.0,
        started_at=NOW_S - 30 * 86400.0,  # up for a month
        sent_at=NOW_S,
    )
    return msgspec.structs.replace(base, **changes)


def sample(**changes: Any) -> Telemetry:
    base = Telemetry(
        node_id="n1",
        instance_id="i1",
        seq=10,
        sampled_at=NOW_S - 1.0,
        interval_s=5.0,
        cpu_utilization_pct=30.0,
        memory_used_bytes=2**30,
        memory_total_bytes=2**39,
        accelerators=(
            AcceleratorSample(
                id="gpu0", utilization_pct=90.0, memory_used_bytes=2**34, power_w=380.0
            ),
        ),
        deployments=(
            DeploymentSample(
                deployment_id="d1", requests=10, errors=0, rejected=0, requests_per_s=2.0
            ),
        ),
    )
    return msgspec.structs.replace(base, **changes)


def test_a_real_birth_is_plausible() -> None:
    assert check_status(birth(), LIMITS, NOW_S) is None


def test_a_will_sent_at_connect_time_long_ago_is_plausible() -> None:
    will = birth(state="offline", offline_reason="connection-lost", sent_at=NOW_S - 86400.0)
    assert check_status(will, LIMITS, NOW_S) is None


@pytest.mark.parametrize(
    ("changes", "reason", "field"),
    [
        (
            {"accelerators": tuple(gpu(i) for i in range(689))},
            Implausible.INVENTORY,
            "$.accelerators",
        ),
        (
            {"accelerators": (gpu(0, memory_bytes=2**50),)},
            Implausible.INVENTORY,
            "$.accelerators[0].memory_bytes",
        ),
        (
            {"accelerators": (gpu(0, max_power_w=1e300),)},
            Implausible.INVENTORY,
            "$.accelerators[0].max_power_w",
        ),
        (
            {"accelerators": (gpu(0, relative_speed=1e9),)},
            Implausible.INVENTORY,
            "$.accelerators[0].relative_speed",
        ),
        ({"accelerators": (gpu(0), gpu(0))}, Implausible.INVENTORY, "$.accelerators[1].id"),
        ({"started_at": 1e300}, Implausible.CLOCK_SKEW, "$.started_at"),
        ({"sent_at": NOW_S + 301.0}, Implausible.CLOCK_SKEW, "$.sent_at"),
        ({"telemetry_interval_s": 0.001}, Implausible.BAD_INTERVAL, "$.telemetry_interval_s"),
        ({"telemetry_interval_s": 86400.0}, Implausible.BAD_INTERVAL, "$.telemetry_interval_s"),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, Implausible.FIELD_TOO_LONG, "$.labels"),
        ({"labels": {"k": "v" * 257}}, Implausible.FIELD_TOO_LONG, "$.labels.k"),
        ({"zone": "Z" * 257}, Implausible.FIELD_TOO_LONG, "$.zone"),
        (
            {"accelerators": (gpu(0, features=tuple(f"f{i}" for i in range(513))),)},
            Implausible.FIELD_TOO_LONG,
            "$.accelerators[0].features",
        ),
    ],
)
def test_an_implausible_birth_is_refused_naming_the_field(
    changes: dict[str, Any], reason: Implausible, field: str
) -> None:
    violation = check_status(birth(**changes), LIMITS, NOW_S)

    assert violation is not None
    assert (violation.reason, violation.field) == (reason, field)


def test_the_limits_come_from_the_settings() -> None:
    limits = PlausibilityLimits.of(CloudSettings(max_accelerators_per_node=4))
    violation = check_status(birth(), limits, NOW_S)
    assert violation is not None
    assert violation.reason is Implausible.INVENTORY
    assert "max_accelerators_per_node (4)" in violation.detail


def busy_gpu(accelerator_id: str) -> AcceleratorSample:
    return AcceleratorSample(
        id=accelerator_id, utilization_pct=90.0, memory_used_bytes=2**34, power_w=380.0
    )


def serving(**changes: Any) -> DeploymentSample:
    base = DeploymentSample(
        deployment_id="d1", requests=10, errors=1, rejected=2, requests_per_s=2.0
    )
    return msgspec.structs.replace(base, **changes)


def part(replica: int, **changes: Any) -> ReplicaSample:
    """One replica's part of `serving()`'s figures (schema 1.13)."""
    base = ReplicaSample(replica=replica, requests=5, errors=0, rejected=1, requests_per_s=1.0)
    return msgspec.structs.replace(base, **changes)


def test_a_real_sample_is_plausible() -> None:
    assert check_telemetry(sample(), LIMITS, NOW_S) is None


def test_a_sample_with_each_replicas_figures_is_plausible() -> None:
    """A canary beside the current model: together they answered the deployment's 10
    requests; a replica withdrawn since the previous sample left some out."""
    replicas = (part(0, errors=1), part(1, rejected=0))
    assert check_telemetry(sample(deployments=(serving(replicas=replicas),)), LIMITS, NOW_S) is None
    withdrawn = (part(1, rejected=0),)
    assert (
        check_telemetry(sample(deployments=(serving(replicas=withdrawn),)), LIMITS, NOW_S) is None
    )


def test_more_replica_samples_than_a_node_reports_replicas_are_refused() -> None:
    many = tuple(part(n, requests=0, rejected=0) for n in range(MAX_REPLICA_SAMPLES + 1))
    violation = check_telemetry(sample(deployments=(serving(replicas=many),)), LIMITS, NOW_S)
    assert violation is not None
    assert (violation.reason, violation.field) == (Implausible.FIELD_TOO_LONG, "$.deployments")


def test_the_largest_real_figures_are_plausible() -> None:
    """A 10 kW device's counter after a century, and a billion requests a second over
    the longest interval a sample may cover, every one failed, and as many refused."""
    century_s = 100 * 365.25 * 86400.0
    most_requests = int(MAX_RATE_PER_S * LIMITS.max_telemetry_interval_s)
    accelerators = tuple(
        AcceleratorSample(
            id=f"gpu{index}",
            utilization_pct=100.0,
            memory_used_bytes=2**34,
            energy_j=LIMITS.max_accelerator_power_w * century_s,
        )
        for index in range(8)
    )
    deployments = (serving(requests=most_requests, errors=most_requests, rejected=most_requests),)
    assert (
        check_telemetry(sample(accelerators=accelerators, deployments=deployments), LIMITS, NOW_S)
        is None
    )


def test_serving_counts_from_the_wire_are_refused_before_any_sum_overflows() -> None:
    """JSON integers have no size, and msgspec decodes them up to Python's 4,300 digits;
    a float of 10**400 raises wherever it is used (the tenants' /metrics, the canary
    gate)."""
    payload = msgspec.json.encode(sample()).replace(b'"requests":10', b'"requests":1' + b"0" * 400)
    decoded = TELEMETRY_DECODER.decode(payload)
    assert decoded.deployments[0].requests == 10**400

    violation = check_telemetry(decoded, LIMITS, NOW_S)

    assert violation is not None
    assert (violation.reason, violation.field) == (Implausible.SAMPLE, "$.deployments[0].requests")


@pytest.mark.parametrize(
    ("changes", "reason", "field"),
    [
        ({"sampled_at": 1e300}, Implausible.CLOCK_SKEW, "$.sampled_at"),
        ({"sampled_at": NOW_S - 3600.0}, Implausible.CLOCK_SKEW, "$.sampled_at"),
        ({"interval_s": 0.0001}, Implausible.BAD_INTERVAL, "$.interval_s"),
        (
            {
                "accelerators": (
                    AcceleratorSample(
                        id="gpu0", utilization_pct=1.0, memory_used_bytes=1, power_w=1e300
                    ),
                )
            },
            Implausible.SAMPLE,
            "$.accelerators[0].power_w",
        ),
        (
            {
                "accelerators": (
                    AcceleratorSample(
                        id="gpu0", utilization_pct=1.0, memory_used_bytes=1, temperature_c=-1e300
                    ),
                )
            },
            Implausible.SAMPLE,
            "$.accelerators[0].temperature_c",
        ),
        (
            {
                "deployments": (
                    DeploymentSample(
                        deployment_id="d1", requests=1, errors=0, rejected=0, requests_per_s=1e300
                    ),
                )
            },
            Implausible.SAMPLE,
            "$.deployments[0].requests_per_s",
        ),
        (
            {
                "accelerators": (
                    AcceleratorSample(
                        id="gpu0", utilization_pct=1.0, memory_used_bytes=1, energy_j=1e306
                    ),
                )
            },
            Implausible.SAMPLE,
            "$.accelerators[0].energy_j",
        ),
        (
            # One announced GPU named twice, so that it would count twice in every sum.
            {"accelerators": (busy_gpu("gpu0"), busy_gpu("gpu1"), busy_gpu("gpu0"))},
            Implausible.SAMPLE,
            "$.accelerators[2].id",
        ),
        (
            {"deployments": (serving(requests=10**400),)},
            Implausible.SAMPLE,
            "$.deployments[0].requests",
        ),
        (
            {"deployments": (serving(errors=10**400),)},
            Implausible.SAMPLE,
            "$.deployments[0].errors",
        ),
        (
            {"deployments": (serving(rejected=10**400),)},
            Implausible.SAMPLE,
            "$.deployments[0].rejected",
        ),
        # An error is a request answered with one (edge/inference/stats.py).
        (
            {"deployments": (serving(requests=3, errors=4),)},
            Implausible.SAMPLE,
            "$.deployments[0].errors",
        ),
        # A replica's figures are part of its deployment's: one named twice, or more
        # than the deployment answered, would count requests twice in a canary's gates.
        (
            {"deployments": (serving(replicas=(part(0), part(0))),)},
            Implausible.SAMPLE,
            "$.deployments[0].replicas[1].replica",
        ),
        (
            {"deployments": (serving(replicas=(part(0), part(1, requests=6))),)},
            Implausible.SAMPLE,
            "$.deployments[0].replicas",
        ),
        (
            {"deployments": (serving(replicas=(part(0, errors=2),)),)},
            Implausible.SAMPLE,
            "$.deployments[0].replicas",
        ),
        (
            {"deployments": (serving(replicas=(part(0, requests=10**400),)),)},
            Implausible.SAMPLE,
            "$.deployments[0].replicas[0].requests",
        ),
        (
            {"deployments": (serving(replicas=(part(0, errors=6),)),)},
            Implausible.SAMPLE,
            "$.deployments[0].replicas[0].errors",
        ),
        (
            {"deployments": (serving(replicas=(part(0, latency_p95_ms=1e300),)),)},
            Implausible.SAMPLE,
            "$.deployments[0].replicas[0].latency_p95_ms",
        ),
    ],
)
def test_an_implausible_sample_is_refused_naming_the_field(
    changes: dict[str, Any], reason: Implausible, field: str
) -> None:
    violation = check_telemetry(sample(**changes), LIMITS, NOW_S)

    assert violation is not None
    assert (violation.reason, violation.field) == (reason, field)


def test_a_clock_within_the_skew_is_believed_either_way() -> None:
    assert check_telemetry(sample(sampled_at=NOW_S + 299.0), LIMITS, NOW_S) is None
    assert check_telemetry(sample(sampled_at=NOW_S - 299.0), LIMITS, NOW_S) is None


def report(*training: ReportedTraining, instance_id: str = "i1", **changes: Any) -> ReportedState:
    base = ReportedState(
        node_id="n1",
        instance_id=instance_id,
        observed_generation=3,
        reported_at=NOW_S - 86400.0,  # retained: a day old when a control plane restarts
        training=training,
    )
    return msgspec.structs.replace(base, **changes)


def run(state: TrainingRunState, job_id: str = "job-a", **changes: Any) -> ReportedTraining:
    return ReportedTraining(job_id=job_id, attempt=1, state=state, **changes)


def test_reports_events_and_chunks_may_be_old_but_not_from_the_future() -> None:
    assert check_reported(report(run("succeeded", finished_at=NOW_S - 10)), LIMITS, NOW_S) is None
    violation = check_reported(report(run("succeeded", finished_at=1e300)), LIMITS, NOW_S)
    assert violation is not None
    assert (violation.reason, violation.field) == (
        Implausible.CLOCK_SKEW,
        "$.training[0].finished_at",
    )
    late = NodeEvent(node_id="n1", event_id="e1", kind="started", occurred_at=NOW_S - 3600.0)
    assert check_event(late, LIMITS, NOW_S) is None
    future = msgspec.structs.replace(late, occurred_at=1e300)
    assert check_event(future, LIMITS, NOW_S) is not None
    chunk = JobLogChunk(node_id="n1", job_id="j", offset=0, text="x", sent_at=1e300)
    assert check_log_chunk(chunk, LIMITS, NOW_S) is not None
    assert check_log_chunk(msgspec.structs.replace(chunk, sent_at=NOW_S), LIMITS, NOW_S) is None


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("running", "starting"),
        ("succeeded", "running"),
        ("succeeded", "starting"),
        ("failed", "succeeded"),
        ("stopped", "succeeded"),
    ],
)
def test_a_run_that_goes_backwards_within_an_instance_keeps_its_earlier_word(
    before: TrainingRunState, after: TrainingRunState
) -> None:
    previous = report(run(before), run("running", job_id="job-b"))
    new = report(run(after), run("succeeded", job_id="job-b"))

    kept, undone = without_illegal_transitions(previous, new)

    assert kept.training == (run(before), run("succeeded", job_id="job-b"))
    assert undone == [f"job-a attempt 1: {before} -> {after}"]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("starting", "running"),
        ("starting", "succeeded"),
        ("running", "failed"),
        ("running", "running"),
        ("succeeded", "succeeded"),
    ],
)
def test_forward_transitions_pass(before: TrainingRunState, after: TrainingRunState) -> None:
    new = report(run(after))
    assert without_illegal_transitions(report(run(before)), new) == (new, [])


def test_a_new_agent_instance_may_start_a_run_again() -> None:
    new = report(run("starting"), instance_id="i2")
    assert without_illegal_transitions(report(run("succeeded")), new) == (new, [])
    assert without_illegal_transitions(None, new) == (new, [])


def test_a_finished_run_left_out_of_one_report_cannot_finish_otherwise_in_the_next() -> None:
    """Leaving the entry out once must not clear the way for `succeeded -> failed`: a
    finished run is kept while its attempt is still the node's."""
    finished = report(run("succeeded"))
    silent, undone = without_illegal_transitions(finished, report())
    assert silent.training == (run("succeeded"),)
    assert undone == []
    kept, undone = without_illegal_transitions(silent, report(run("failed")))
    assert kept.training == (run("succeeded"),)
    assert undone == ["job-a attempt 1: succeeded -> failed"]
    # Once the attempt is no longer the node's, it is let go.
    gone, _ = without_illegal_transitions(finished, report(), lambda job_id, attempt: False)
    assert gone.training == ()


def test_a_run_named_twice_in_a_report_counts_as_its_first_entry() -> None:
    previous = report(run("running"))
    kept, undone = without_illegal_transitions(previous, report(run("succeeded"), run("failed")))
    assert kept.training == (run("succeeded"),)
    assert undone == ["job-a attempt 1: named twice"]
