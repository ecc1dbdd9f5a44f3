"""Workload files for ``greenfed eval --workload FILE`` (TOML, or JSON by extension).

Times are offsets in seconds from the start of the run, so one file can be
replayed over any period. Unknown keys are errors, and every error names the key
and where it is (``$.training[3]``).

```toml
seed = 7                            # optional, informational

[[training]]
id = "train-00001"                  # unique across the file
tenant = "vision"
submit_offset_s = 5400.0            # submitted 1.5 h after the start
workers = 2                         # gang size (default 1)
gpus_per_worker = 4                 # default 1
duration_s = 7200.0                 # run time on the reference GPU (an A100)
deadline_offset_s = 43200.0         # optional: must finish 12 h after submission
max_delay_s = 21600.0               # optional: may start up to 6 h after submission
priority = "p1"                     # p0 | p1 | p2 (default p1)
preemptible = true                  # default true
checkpoint_interval_s = 1800.0      # optional: resumes from a checkpoint this often
score_weights = { carbon = 2.0 }    # optional per-job weight overrides
alternative_shapes = [{ workers = 1, gpus_per_worker = 8 }]  # optional: other gang shapes
                                    # it runs as well in (data-parallel; same total GPUs)

[[inference]]
id = "shop-cams-la"
tenant = "retail"
start_offset_s = 0.0                # default 0
lifetime_s = 259200.0               # optional: stopped after 3 days (default: runs on)
replicas = 3
accepted_kinds = ["gpu", "npu"]     # in order of preference
providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]  # optional
latency_slo_ms = 50.0               # optional hard SLO
reference_ms_per_request = 0.5      # compute per request on an A100
peak_requests_per_s = 60.0          # all origins at their daily peak
priority = "p0"                     # default p0
traffic = [{ region = "us-west2", share = 1.0, utc_offset_hours = -8.0 }]

[[tenants]]                         # optional: quotas, as `greenfed tenants create` sets them
name = "vision"
quotas = { gpu = 8 }                # nominal accelerators per kind (a kind not named: 0)
cohort = "research"                 # optional: tenants of a cohort lend idle quota
borrowing_limit = { gpu = 4 }       # optional: at most this many borrowed, per kind
```

Tenants without a ``[[tenants]]`` entry are unmanaged: no quota applies to them.

Traffic follows a daily profile in each origin's local time,
``profile(h) = 0.25 + 0.75 · (1 − cos(2π (h − 4) / 24)) / 2``: a quarter of the
peak at 04:00, the peak at 16:00. The request rate at time t is
``peak_requests_per_s · Σ_r share_r · profile(h_r(t)) / Σ_r share_r``.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from cloud.scheduler import GangShape, InferenceDeployment, Tenant, Toleration, TrainingJob
from cloud.work.specs import AutoscaleSpec
from shared.messages import AcceleratorKind, Site
from shared.settings import ConfigError
from shared.work_literals import PriorityClass

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]


class TrafficSource(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    region: str
    share: Positive
    utc_offset_hours: Annotated[float, msgspec.Meta(ge=-14, le=14)] = 0.0


class ShapeSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An alternative gang shape of a training job (flexible shapes)."""

    workers: Count
    gpus_per_worker: Count


class TrainingSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    tenant: str
    submit_offset_s: NonNegative
    duration_s: Positive
    workers: Count = 1
    gpus_per_worker: Count = 1
    deadline_offset_s: Positive | None = None
    max_delay_s: NonNegative | None = None
    priority: PriorityClass = "p1"
    preemptible: bool = True
    # Saves a checkpoint every this many seconds of its run and resumes from the
    # newest one when stopped (preempted or migrated); None: starts over.
    checkpoint_interval_s: Positive | None = None
    score_weights: dict[str, float] = {}
    tolerations: tuple[str, ...] = ()  # `key` (any value) or `key=value` (node groups)
    # Other shapes it runs as well in (data-parallel), each with the same total GPUs.
    alternative_shapes: tuple[ShapeSpec, ...] = ()


class InferenceSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    tenant: str
    reference_ms_per_request: Positive
    peak_requests_per_s: NonNegative
    start_offset_s: NonNegative = 0.0
    lifetime_s: Positive | None = None
    replicas: Count = 1
    accepted_kinds: tuple[AcceleratorKind, ...] = ("npu", "gpu", "cpu")
    providers: tuple[str, ...] = ()
    latency_slo_ms: Positive | None = None
    priority: PriorityClass = "p0"
    traffic: tuple[TrafficSource, ...] = ()
    score_weights: dict[str, float] = {}
    sites: tuple[Site, ...] = ("edge",)
    max_replicas_per_node: Count = 1
    tolerations: tuple[str, ...] = ()  # `key` (any value) or `key=value` (node groups)
    # The live autoscaler's rule on the simulated load (cloud/loop/autoscale.py);
    # None: `replicas` throughout.
    autoscale: AutoscaleSpec | None = None


Quotas = dict[AcceleratorKind, Annotated[int, msgspec.Meta(ge=0)]]


class TenantSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tenant's quotas, with the field names of the REST API's tenant."""

    name: str
    quotas: Quotas = {}
    cohort: str | None = None
    borrowing_limit: Quotas = {}

    def to_tenant(self) -> Tenant:
        return Tenant(
            name=self.name,
            cohort=self.cohort,
            nominal=self.quotas,
            borrowing_limit=self.borrowing_limit,
        )


class Workload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    seed: int | None = None
    training: tuple[TrainingSpec, ...] = ()
    inference: tuple[InferenceSpec, ...] = ()
    tenants: tuple[TenantSpec, ...] = ()


def within_period(workload: Workload, period_s: float) -> Workload:
    """The work submitted within the first ``period_s`` seconds: what the simulation
    submits (submissions stop at the end of the evaluated period)."""
    return msgspec.structs.replace(
        workload,
        training=tuple(spec for spec in workload.training if spec.submit_offset_s < period_s),
        inference=tuple(spec for spec in workload.inference if spec.start_offset_s < period_s),
    )


def traffic_profile(local_hour: float) -> float:
    """Share of the daily peak at a local hour (0.25 at 04:00, 1.0 at 16:00)."""
    return 0.25 + 0.75 * (1.0 - math.cos(2.0 * math.pi * (local_hour - 4.0) / 24.0)) / 2.0


def traffic_weights(spec: InferenceSpec, at_s: float) -> dict[str, float]:
    """Request rate (req/s) from each origin region at ``at_s``."""
    total_share = sum(source.share for source in spec.traffic)
    if total_share <= 0:
        return {}
    rates: dict[str, float] = {}
    for source in spec.traffic:
        local_hour = ((at_s / 3600.0) + source.utc_offset_hours) % 24.0
        rate = spec.peak_requests_per_s * source.share / total_share * traffic_profile(local_hour)
        rates[source.region] = rates.get(source.region, 0.0) + rate
    return rates


def requests_per_s(spec: InferenceSpec, at_s: float) -> float:
    if not spec.traffic:
        return spec.peak_requests_per_s
    return sum(traffic_weights(spec, at_s).values())


def _tolerations(texts: tuple[str, ...]) -> tuple[Toleration, ...]:
    result = []
    for text in texts:
        key, _, value = text.partition("=")
        result.append(Toleration(key, value or None))
    return tuple(result)


def training_job(
    spec: TrainingSpec, submitted_at: float, duration_s: float | None = None
) -> TrainingJob:
    """The job as submitted, or, with ``duration_s``, as resumed with that much left."""
    return TrainingJob(
        work_id=spec.id,
        tenant=spec.tenant,
        priority=spec.priority,
        submitted_at=submitted_at,
        workers=spec.workers,
        accelerators_per_worker=spec.gpus_per_worker,
        accelerator_kind="gpu",
        duration_s=spec.duration_s if duration_s is None else duration_s,
        deadline=(
            submitted_at + spec.deadline_offset_s if spec.deadline_offset_s is not None else None
        ),
        max_delay_s=spec.max_delay_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        preemptible=spec.preemptible,
        score_weights=spec.score_weights,
        tolerations=_tolerations(spec.tolerations),
        alternative_shapes=tuple(
            GangShape(shape.workers, shape.gpus_per_worker) for shape in spec.alternative_shapes
        ),
    )


def deployment(
    spec: InferenceSpec, submitted_at: float, replicas: int | None = None
) -> InferenceDeployment:
    count = spec.replicas if replicas is None else replicas
    scale = spec.autoscale
    expected = scale.expected_requests_per_s(count) if scale is not None else None
    traffic: dict[str, float] = {}
    for source in spec.traffic:
        traffic[source.region] = traffic.get(source.region, 0.0) + source.share
    return InferenceDeployment(
        work_id=spec.id,
        tenant=spec.tenant,
        priority=spec.priority,
        submitted_at=submitted_at,
        replicas=count,
        accepted_kinds=spec.accepted_kinds,
        providers=spec.providers,
        latency_slo_ms=spec.latency_slo_ms,
        traffic_by_region=traffic,
        # The scheduler sizes for the peak, this share of it for ``count`` replicas; an
        # autoscaled deployment for its target per replica (as the live control plane).
        requests_per_s=(
            spec.peak_requests_per_s * count / spec.replicas if expected is None else expected
        ),
        reference_ms_per_request=spec.reference_ms_per_request,
        max_replicas_per_node=spec.max_replicas_per_node,
        sites=spec.sites,
        score_weights=spec.score_weights,
        tolerations=_tolerations(spec.tolerations),
    )


def check_workload(workload: Workload, source: str) -> Workload:
    """Unique ids, and every job buildable (score weights are checked there)."""
    seen: set[str] = set()
    specs: list[tuple[str, TrainingSpec | InferenceSpec]] = [
        *((f"training[{i}]", spec) for i, spec in enumerate(workload.training)),
        *((f"inference[{i}]", spec) for i, spec in enumerate(workload.inference)),
    ]
    for where, spec in specs:
        if spec.id in seen:
            raise ConfigError(f"{source}: {where}.id: duplicate id {spec.id!r}")
        seen.add(spec.id)
        try:
            if isinstance(spec, TrainingSpec):
                training_job(spec, 0.0)
            else:
                deployment(spec, 0.0)
        except ValueError as error:
            raise ConfigError(f"{source}: {where}: {error}") from None
    names: set[str] = set()
    for i, tenant in enumerate(workload.tenants):
        if tenant.name in names:
            raise ConfigError(f"{source}: tenants[{i}].name: duplicate tenant {tenant.name!r}")
        names.add(tenant.name)
    return workload


def parse_workload(data: Mapping[str, object], source: str) -> Workload:
    try:
        workload = msgspec.convert(data, Workload)
    except msgspec.ValidationError as error:
        raise ConfigError(f"{source}: {error}") from None
    return check_workload(workload, source)


def load_workload(path: Path) -> Workload:
    """Read a workload file: ``.json`` as JSON, anything else as TOML."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"workload file {path} does not exist") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path} is not valid {path.suffix[1:] or 'TOML'}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table / object")
    return parse_workload(data, str(path))


def dump_workload(workload: Workload) -> str:
    """As JSON (``greenfed eval --dump-workload``), loadable with ``--workload``."""
    return msgspec.json.format(msgspec.json.encode(workload)).decode() + "\n"
