"""What a node may claim: plausibility limits on what arrives over MQTT.

The schema (shared/messages.py) says what shape a payload has; this says whether it
could be true. A birth claiming 689 GPUs, a sample drawing 1e300 W or a status sent
in the year 10^292 is well-formed and still a lie, and once in the registry it would
attract work, overflow sums or break every view of the fleet. Ingestion
(cloud/fleet/ingest.py) calls one `check_*` per channel before anything is applied;
a violation names its reason (counted as `greenfed_mqtt_messages_invalid{reason}`)
and the field at fault (logged), and the message is dropped whole.

Timestamps: none may lie further in the future than `max_clock_skew_s` by the control
plane's clock. Only a telemetry sample must also be recent: it is sent as it is
taken and never retained, whereas a retained birth or report may be days old when a
restarted control plane reads it, a will carries the time its agent connected, and
`started_at` is as old as the agent.

msgspec already refuses NaN and infinities (JSON has no literal for them and an
out-of-range number fails validation), so every float here is finite.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from shared.messages import (
    DeploymentSample,
    JobLogChunk,
    NodeEvent,
    NodeStatus,
    ReplicaSample,
    ReportedState,
    ReportedTraining,
    Telemetry,
    TrainingRunState,
)
from shared.placement_names import placement_error
from shared.printable import has_control
from shared.sealing import is_valid_public_key
from shared.settings import CloudSettings

# Bounds that need no setting: far beyond any real value, near enough to keep one
# message from blowing up memory, sums or views.
MAX_TEXT_CHARS = 256  # ids, names, versions, zones, regions, vendors, models
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 256
MAX_FEATURES = 512  # per accelerator (a CPU's ISA flags are ~150)
MAX_PROVIDERS = 16
MAX_RELATIVE_SPEED = 1000.0  # x one A100
MAX_COMPUTE_UNITS = 1 << 20
MAX_HOST_MEMORY_BYTES = 1 << 52  # 4 PiB
MAX_DEPLOYMENT_SAMPLES = 1024
MAX_REPORTED_ENTRIES = 4096
# A node samples the replicas it serves, and reports at most MAX_REPORTED_ENTRIES.
MAX_REPLICA_SAMPLES = MAX_REPORTED_ENTRIES
MAX_RATE_PER_S = 1e9
# An energy counter counts from its agent's start (edge/discovery/): a century of the
# most a device may draw (`max_accelerator_power_w`) is beyond any real counter, and
# keeps its mJ (x 1000, /metrics) and sums finite.
MAX_ENERGY_COUNTER_AGE_S = 100 * 365.25 * 86400.0
MAX_LATENCY_MS = 1e9
MAX_BATCH_SIZE = 1e6
MIN_TEMPERATURE_C = -273.15
MAX_TEMPERATURE_C = 1000.0


class Implausible(StrEnum):
    """Why a well-formed message cannot be true; each is an `InvalidReason` too."""

    INVENTORY = "implausible_inventory"  # a birth's accelerators or host
    SAMPLE = "implausible_sample"  # a telemetry figure
    CLOCK_SKEW = "clock_skew"
    BAD_INTERVAL = "bad_interval"
    FIELD_TOO_LONG = "field_too_long"
    # A zone, region or label outside shared/placement_names.py; an id (the agent
    # instance's, an accelerator's) holding control characters.
    INVALID_NAME = "invalid_name"


@dataclass(frozen=True, slots=True)
class Violation:
    reason: Implausible
    field: str  # JSON path of the field at fault, e.g. "$.accelerators[3].memory_bytes"
    detail: str

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlausibilityLimits:
    max_accelerators_per_node: int = 256
    max_accelerator_memory_bytes: int = 64 * 1024**4
    max_accelerator_power_w: float = 10_000.0
    max_clock_skew_s: float = 300.0
    min_telemetry_interval_s: float = 0.05
    max_telemetry_interval_s: float = 3600.0

    @classmethod
    def of(cls, settings: CloudSettings) -> PlausibilityLimits:
        return cls(
            max_accelerators_per_node=settings.max_accelerators_per_node,
            max_accelerator_memory_bytes=settings.max_accelerator_memory_bytes,
            max_accelerator_power_w=settings.max_accelerator_power_w,
            max_clock_skew_s=settings.max_clock_skew_s,
            min_telemetry_interval_s=settings.min_telemetry_interval_s,
            max_telemetry_interval_s=settings.max_telemetry_interval_s,
        )


class _Found(Exception):
    """Raised inside a check at the first violation; never leaves this module."""

    def __init__(self, violation: Violation) -> None:
        self.violation = violation


def _fail(reason: Implausible, field: str, detail: str) -> None:
    raise _Found(Violation(reason, field, detail))


def _text(field: str, value: str | None, limit: int = MAX_TEXT_CHARS) -> None:
    if value is not None and len(value) > limit:
        _fail(Implausible.FIELD_TOO_LONG, field, f"{len(value)} characters > {limit}")


def _id(field: str, value: str | None) -> None:
    """An id is matched, stored and shown as it is: it may hold no control character
    (free text has them replaced instead, cloud/fleet/node_text.py)."""
    if value is not None and has_control(value):
        _fail(Implausible.INVALID_NAME, field, f"{value[:60]!r} holds control characters")


def _texts(field: str, values: Iterable[str], count_limit: int) -> None:
    values = tuple(values)
    if len(values) > count_limit:
        _fail(Implausible.FIELD_TOO_LONG, field, f"{len(values)} entries > {count_limit}")
    for index, value in enumerate(values):
        _text(f"{field}[{index}]", value)


def _at_most(reason: Implausible, field: str, value: float | None, limit: float) -> None:
    if value is not None and value > limit:
        _fail(reason, field, f"{value!r} > {limit!r}")


def _not_future(field: str, value: float | None, now_s: float, limits: PlausibilityLimits) -> None:
    if value is not None and value > now_s + limits.max_clock_skew_s:
        ahead_s = value - now_s
        _fail(
            Implausible.CLOCK_SKEW,
            field,
            f"{ahead_s:.3g} s ahead of the control plane's clock "
            f"(max_clock_skew_s = {limits.max_clock_skew_s:g})",
        )


def _recent(field: str, value: float, now_s: float, limits: PlausibilityLimits) -> None:
    _not_future(field, value, now_s, limits)
    if value < now_s - limits.max_clock_skew_s:
        _fail(
            Implausible.CLOCK_SKEW,
            field,
            f"{now_s - value:.3g} s behind the control plane's clock "
            f"(max_clock_skew_s = {limits.max_clock_skew_s:g})",
        )


def _interval(field: str, value: float, limits: PlausibilityLimits) -> None:
    if not limits.min_telemetry_interval_s <= value <= limits.max_telemetry_interval_s:
        _fail(
            Implausible.BAD_INTERVAL,
            field,
            f"{value!r} s is outside [{limits.min_telemetry_interval_s:g}, "
            f"{limits.max_telemetry_interval_s:g}]",
        )


class SealingKeyRefusal(StrEnum):
    """Why a birth's sealing key is dropped (the birth itself is kept); each is an
    `InvalidReason` too."""

    INVALID = "sealing_key_invalid"  # not base64 of a 32-byte X25519 public key
    MISMATCH = "sealing_key_mismatch"  # not the key the node enrolled with


def sealing_key_refusal(announced: str, pinned: str | None) -> SealingKeyRefusal | None:
    """Whether a birth's sealing key may be trusted: a key at all, and the one pinned at
    enrolment where one was (a node enrolled without one is trusted with what its own
    broker account announces). A node whose key is dropped receives no secrets: a
    broker account taken over, or a node reimaged since it enrolled, cannot make the
    control plane seal a job's secrets to a key it did not enrol with."""
    if not is_valid_public_key(announced):
        return SealingKeyRefusal.INVALID
    if pinned is not None and base64.b64decode(announced) != base64.b64decode(pinned):
        return SealingKeyRefusal.MISMATCH
    return None


def check_recent(
    field: str, value: float, limits: PlausibilityLimits, now_s: float
) -> Violation | None:
    """A timestamp within `max_clock_skew_s` of `now_s`, either way (`clock_skew`)."""
    try:
        _recent(field, value, now_s, limits)
    except _Found as found:
        return found.violation
    return None


def check_status(status: NodeStatus, limits: PlausibilityLimits, now_s: float) -> Violation | None:
    """A birth, will or goodbye: the inventory it claims and when it says it was sent."""
    try:
        _check_status(status, limits, now_s)
    except _Found as found:
        return found.violation
    return None


def _check_status(status: NodeStatus, limits: PlausibilityLimits, now_s: float) -> None:
    inventory = Implausible.INVENTORY
    for name in ("instance_id", "agent_version", "zone", "region"):
        _text(f"$.{name}", getattr(status, name))
    _id("$.instance_id", status.instance_id)
    if len(status.labels) > MAX_LABELS:
        _fail(Implausible.FIELD_TOO_LONG, "$.labels", f"{len(status.labels)} labels > {MAX_LABELS}")
    for key, value in status.labels.items():
        _text("$.labels", key, MAX_LABEL_KEY_CHARS)
        _text(f"$.labels.{key}", value, MAX_LABEL_VALUE_CHARS)
    invalid = placement_error(status.zone, status.region, status.labels)
    if invalid is not None:
        _fail(Implausible.INVALID_NAME, *invalid)
    host = status.host
    for name in ("hostname", "os", "arch"):
        _text(f"$.host.{name}", getattr(host, name))
    _at_most(inventory, "$.host.cpu_logical_cores", host.cpu_logical_cores, MAX_COMPUTE_UNITS)
    _at_most(inventory, "$.host.memory_total_bytes", host.memory_total_bytes, MAX_HOST_MEMORY_BYTES)
    accelerators = status.accelerators
    if len(accelerators) > limits.max_accelerators_per_node:
        _fail(
            inventory,
            "$.accelerators",
            f"{len(accelerators)} accelerators > max_accelerators_per_node "
            f"({limits.max_accelerators_per_node})",
        )
    seen: set[str] = set()
    for index, accelerator in enumerate(accelerators):
        at = f"$.accelerators[{index}]"
        for name in ("id", "vendor", "model", "uuid", "parent_id"):
            _text(f"{at}.{name}", getattr(accelerator, name))
        _id(f"{at}.id", accelerator.id)
        _id(f"{at}.parent_id", accelerator.parent_id)
        if accelerator.id in seen:
            _fail(inventory, f"{at}.id", f"{accelerator.id!r} appears twice")
        seen.add(accelerator.id)
        memory_limit = limits.max_accelerator_memory_bytes
        _at_most(inventory, f"{at}.memory_bytes", accelerator.memory_bytes, memory_limit)
        _at_most(inventory, f"{at}.compute_units", accelerator.compute_units, MAX_COMPUTE_UNITS)
        for name in ("idle_power_w", "max_power_w"):
            power_w = getattr(accelerator, name)
            _at_most(inventory, f"{at}.{name}", power_w, limits.max_accelerator_power_w)
        _at_most(inventory, f"{at}.relative_speed", accelerator.relative_speed, MAX_RELATIVE_SPEED)
        _at_most(inventory, f"{at}.index", accelerator.index, MAX_COMPUTE_UNITS)
        _texts(f"{at}.onnx_providers", accelerator.onnx_providers, MAX_PROVIDERS)
        _texts(f"{at}.features", accelerator.features, MAX_FEATURES)
    _interval("$.telemetry_interval_s", status.telemetry_interval_s, limits)
    _not_future("$.started_at", status.started_at, now_s, limits)
    _not_future("$.sent_at", status.sent_at, now_s, limits)


def check_telemetry(
    telemetry: Telemetry, limits: PlausibilityLimits, now_s: float
) -> Violation | None:
    """A sample: taken just now, at a sane interval, with figures that could be real."""
    try:
        _check_telemetry(telemetry, limits, now_s)
    except _Found as found:
        return found.violation
    return None


def _check_sample_header(telemetry: Telemetry, limits: PlausibilityLimits, now_s: float) -> None:
    sample = Implausible.SAMPLE
    _text("$.instance_id", telemetry.instance_id)
    _interval("$.interval_s", telemetry.interval_s, limits)
    _recent("$.sampled_at", telemetry.sampled_at, now_s, limits)
    _at_most(sample, "$.memory_total_bytes", telemetry.memory_total_bytes, MAX_HOST_MEMORY_BYTES)
    _at_most(sample, "$.memory_used_bytes", telemetry.memory_used_bytes, MAX_HOST_MEMORY_BYTES)


def _check_telemetry(telemetry: Telemetry, limits: PlausibilityLimits, now_s: float) -> None:
    sample = Implausible.SAMPLE
    skew_s = limits.max_clock_skew_s
    if not (
        len(telemetry.instance_id) <= MAX_TEXT_CHARS
        and limits.min_telemetry_interval_s
        <= telemetry.interval_s
        <= limits.max_telemetry_interval_s
        and now_s - skew_s <= telemetry.sampled_at <= now_s + skew_s
        and telemetry.memory_total_bytes <= MAX_HOST_MEMORY_BYTES
        and telemetry.memory_used_bytes <= MAX_HOST_MEMORY_BYTES
    ):
        # The usual sample passes the tests above at once; these name what fails.
        _check_sample_header(telemetry, limits, now_s)
    if len(telemetry.accelerators) > limits.max_accelerators_per_node:
        _fail(
            sample,
            "$.accelerators",
            f"{len(telemetry.accelerators)} samples > max_accelerators_per_node "
            f"({limits.max_accelerators_per_node})",
        )
    power_limit_w = limits.max_accelerator_power_w
    memory_limit = limits.max_accelerator_memory_bytes
    energy_limit_j = power_limit_w * MAX_ENERGY_COUNTER_AGE_S
    # A device named twice would count twice in every sum of power (a zone's, a node's).
    seen_ids: set[str] = set()
    for index, accelerator in enumerate(telemetry.accelerators):
        # The usual sample passes these tests at once; the checks below name what fails
        # (building their field paths for every sample costs more than the tests).
        accelerator_id = accelerator.id
        power_w, temperature_c = accelerator.power_w, accelerator.temperature_c
        energy_j = accelerator.energy_j
        repeated = accelerator_id in seen_ids
        seen_ids.add(accelerator_id)
        if (
            not repeated
            and len(accelerator_id) <= MAX_TEXT_CHARS
            and (power_w is None or power_w <= power_limit_w)
            and accelerator.memory_used_bytes <= memory_limit
            and (temperature_c is None or MIN_TEMPERATURE_C <= temperature_c <= MAX_TEMPERATURE_C)
            and (energy_j is None or energy_j <= energy_limit_j)
        ):
            continue
        at = f"$.accelerators[{index}]"
        _text(f"{at}.id", accelerator_id)
        if repeated:
            _fail(sample, f"{at}.id", f"{accelerator_id!r} appears twice")
        _at_most(sample, f"{at}.power_w", power_w, power_limit_w)
        _at_most(sample, f"{at}.energy_j", energy_j, energy_limit_j)
        _at_most(sample, f"{at}.memory_used_bytes", accelerator.memory_used_bytes, memory_limit)
        if temperature_c is not None and not (
            MIN_TEMPERATURE_C <= temperature_c <= MAX_TEMPERATURE_C
        ):
            _fail(sample, f"{at}.temperature_c", f"{temperature_c!r} °C")
    if len(telemetry.deployments) > MAX_DEPLOYMENT_SAMPLES:
        _fail(
            Implausible.FIELD_TOO_LONG,
            "$.deployments",
            f"{len(telemetry.deployments)} samples > {MAX_DEPLOYMENT_SAMPLES}",
        )
    # Requests, errors and rejections since the previous sample: at most MAX_RATE_PER_S
    # over the longest interval a sample may cover. JSON integers have no size, and one
    # of 10**400 would break every sum and float of them (tenants' /metrics, rollouts).
    count_limit = MAX_RATE_PER_S * limits.max_telemetry_interval_s
    replica_samples = sum(len(deployment.replicas) for deployment in telemetry.deployments)
    if replica_samples > MAX_REPLICA_SAMPLES:
        _fail(
            Implausible.FIELD_TOO_LONG,
            "$.deployments",
            f"{replica_samples} replica samples > {MAX_REPLICA_SAMPLES}",
        )
    for index, deployment in enumerate(telemetry.deployments):
        at = f"$.deployments[{index}]"
        _text(f"{at}.deployment_id", deployment.deployment_id)
        _serving_figures(at, deployment, count_limit)
        _replica_figures(at, deployment, count_limit)


def _figures_pass(figures: DeploymentSample | ReplicaSample, count_limit: float) -> bool:
    """Whether every test of `_serving_figures` passes: the usual sample's, tested
    without building the field paths that only a refusal needs (every message)."""
    requests, errors = figures.requests, figures.errors
    p50, p95, p99 = figures.latency_p50_ms, figures.latency_p95_ms, figures.latency_p99_ms
    batch = figures.mean_batch_size
    return (
        requests <= count_limit
        and errors <= count_limit
        and figures.rejected <= count_limit
        and errors <= requests
        and figures.requests_per_s <= MAX_RATE_PER_S
        and (p50 is None or p50 <= MAX_LATENCY_MS)
        and (p95 is None or p95 <= MAX_LATENCY_MS)
        and (p99 is None or p99 <= MAX_LATENCY_MS)
        and (batch is None or batch <= MAX_BATCH_SIZE)
    )


def _serving_figures(
    at: str, figures: DeploymentSample | ReplicaSample, count_limit: float
) -> None:
    if _figures_pass(figures, count_limit):
        return
    sample = Implausible.SAMPLE
    for name in ("requests", "errors", "rejected"):
        _at_most(sample, f"{at}.{name}", getattr(figures, name), count_limit)
    # An error is a request answered with one; a rejection is not a request
    # (edge/inference/stats.py).
    if figures.errors > figures.requests:
        _fail(sample, f"{at}.errors", f"{figures.errors} errors > {figures.requests} requests")
    _at_most(sample, f"{at}.requests_per_s", figures.requests_per_s, MAX_RATE_PER_S)
    for name in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms"):
        _at_most(sample, f"{at}.{name}", getattr(figures, name), MAX_LATENCY_MS)
    _at_most(sample, f"{at}.mean_batch_size", figures.mean_batch_size, MAX_BATCH_SIZE)


def _replica_figures(at: str, deployment: DeploymentSample, count_limit: float) -> None:
    """Each replica's figures are part of the deployment's (edge/inference/stats.py): a
    replica named twice, or replicas that together answered more than their deployment,
    would count requests twice in a canary's gates."""
    if not deployment.replicas:
        return
    seen: set[int] = set()
    requests = errors = rejected = 0
    for index, replica in enumerate(deployment.replicas):
        if replica.replica in seen:
            _fail(
                Implausible.SAMPLE,
                f"{at}.replicas[{index}].replica",
                f"replica {replica.replica} appears twice",
            )
        seen.add(replica.replica)
        _serving_figures(f"{at}.replicas[{index}]", replica, count_limit)
        requests += replica.requests
        errors += replica.errors
        rejected += replica.rejected
    for name, together in (("requests", requests), ("errors", errors), ("rejected", rejected)):
        if together > getattr(deployment, name):
            _fail(
                Implausible.SAMPLE,
                f"{at}.replicas",
                f"its replicas' {name} ({together}) > the deployment's "
                f"({getattr(deployment, name)})",
            )


def check_reported(
    reported: ReportedState, limits: PlausibilityLimits, now_s: float
) -> Violation | None:
    """A report: bounded, and no time in it lies in the future."""
    try:
        _text("$.instance_id", reported.instance_id)
        _not_future("$.reported_at", reported.reported_at, now_s, limits)
        entries = len(reported.training) + len(reported.deployments)
        if entries > MAX_REPORTED_ENTRIES:
            _fail(Implausible.FIELD_TOO_LONG, "$", f"{entries} entries > {MAX_REPORTED_ENTRIES}")
        for index, training in enumerate(reported.training):
            at = f"$.training[{index}]"
            _text(f"{at}.job_id", training.job_id)
            _not_future(f"{at}.started_at", training.started_at, now_s, limits)
            _not_future(f"{at}.finished_at", training.finished_at, now_s, limits)
        for index, deployment in enumerate(reported.deployments):
            at = f"$.deployments[{index}]"
            _text(f"{at}.deployment_id", deployment.deployment_id)
            _text(f"{at}.provider", deployment.provider)
    except _Found as found:
        return found.violation
    return None


# How far along a training run is; a run never moves to a lower rank, and a finished one
# never changes its outcome (edge/training/runs.py: starting -> running -> finished).
_RUN_RANK: dict[TrainingRunState, int] = {
    "starting": 0,
    "running": 1,
    "succeeded": 2,
    "failed": 2,
    "stopped": 2,
}


def _goes_backwards(before: ReportedTraining, after: ReportedTraining) -> bool:
    rank_before, rank_after = _RUN_RANK[before.state], _RUN_RANK[after.state]
    return rank_after < rank_before or (rank_before == 2 and after.state != before.state)


def without_illegal_transitions(
    previous: ReportedState | None,
    reported: ReportedState,
    still_assigned: Callable[[str, int], bool] = lambda job_id, attempt: True,
) -> tuple[ReportedState, list[str]]:
    """`reported` with every training entry that goes backwards since the same agent
    instance's `previous` report (a finished run running again, a running one starting
    again, succeeded turned failed) replaced by what that instance said before; and a
    description of each entry so replaced. A finished run the report leaves out is kept
    while its attempt is `still_assigned` to the node (else leaving it out of one report
    would let the next one finish it otherwise), and a run named twice counts as its first
    entry, as everything that reads reports reads it. A new instance starts afresh: its
    runs are new processes. Deployment replicas may start again (a replica withdrawn and
    placed anew), so they are not constrained here."""
    if previous is None or previous.instance_id != reported.instance_id:
        return reported, []
    before: dict[tuple[str, int], ReportedTraining] = {}
    for entry in previous.training:
        before.setdefault((entry.job_id, entry.attempt), entry)
    kept: list[ReportedTraining] = []
    undone: list[str] = []
    named: set[tuple[str, int]] = set()
    for entry in reported.training:
        key = (entry.job_id, entry.attempt)
        if key in named:
            undone.append(f"{entry.job_id} attempt {entry.attempt}: named twice")
            continue
        named.add(key)
        earlier = before.get(key)
        if earlier is not None and _goes_backwards(earlier, entry):
            undone.append(
                f"{entry.job_id} attempt {entry.attempt}: {earlier.state} -> {entry.state}"
            )
            kept.append(earlier)
        else:
            kept.append(entry)
    carried = [
        entry
        for key, entry in before.items()
        if key not in named and _RUN_RANK[entry.state] == 2 and still_assigned(*key)
    ]
    if not undone and not carried:
        return reported, []
    return msgspec.structs.replace(reported, training=(*kept, *carried)), undone


def check_event(event: NodeEvent, limits: PlausibilityLimits, now_s: float) -> Violation | None:
    """An event: its time not in the future (the outbox may deliver it late)."""
    try:
        _text("$.event_id", event.event_id)
        _text("$.subject", event.subject)
        _not_future("$.occurred_at", event.occurred_at, now_s, limits)
    except _Found as found:
        return found.violation
    return None


def check_log_chunk(
    chunk: JobLogChunk, limits: PlausibilityLimits, now_s: float
) -> Violation | None:
    """A log chunk: its time not in the future (its size is the payload limit's)."""
    try:
        _text("$.job_id", chunk.job_id)
        _not_future("$.sent_at", chunk.sent_at, now_s, limits)
    except _Found as found:
        return found.violation
    return None
