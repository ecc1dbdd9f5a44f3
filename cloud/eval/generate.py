"""The default evaluation workload: a seeded, realistic mix for the default fleet.

**Training** (cloud GPUs), submitted as a Poisson process whose rate follows the
working day (×1.5 from 13:00 to 21:00 UTC, when Europe and North America
overlap, ×0.5 from 01:00 to 09:00, ×0.6 at weekends), so that the mean offered
load is ``target_load`` (default 0.5) of the fleet's cloud GPU throughput, counted
in reference-GPU (A100) equivalents (Σ count × relative speed: 61.2 on the
default fleet).

* gang sizes 1–8 GPUs: 1 GPU 40 %, 2 GPUs 20 %, 4 GPUs 20 %, 8 GPUs 20 % (half of
  them one 8-GPU worker, half two 4-GPU workers);
* flexible shapes: of the 1×8, 2×4 and 1×4 jobs, ``data_parallel_share`` (70 %) are
  data-parallel and declare the alternative of the same total GPUs
  (``DATA_PARALLEL_SHAPES``: 1×8 ↔ 2×4, 1×4 → 2×2), drawn from a random stream of
  their own so that the rest of a seed's workload is unchanged;
* run time on an A100: lognormal, median ``median_duration_h`` (1.5 h), σ
  ``duration_sigma`` (1.2; mean ≈ 3.1 h), clipped to 5 min – 36 h;
* four tenants, equally likely;
* ``flexible_share`` (40 %) can wait: half of them with a deadline of twice the
  A100 run time plus 4–24 h (uniform), half with a maximum start delay of 4–24 h.
  The others start as soon as they can.

**Inference** (edge devices): eight deployments with diurnal traffic from one to
four of the fleet's regions and latency SLOs from 40 to 300 ms, submitted a
minute apart at the start and running throughout (``INFERENCE``; on a fleet
with other edge regions, from those: ``inference_for``). Replicas per
deployment 2–3, one per node.

The same seed gives the same workload, whatever the policy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import msgspec

from cloud.loop.nodes import ZONE_TIMEZONES
from cloud.scheduler import Node

from .workload import InferenceSpec, ShapeSpec, TrafficSource, TrainingSpec, Workload

HOUR_S = 3600.0
TENANTS = ("vision", "language", "speech", "recsys")
GANGS: tuple[tuple[float, int, int], ...] = (  # probability, workers, gpus per worker
    (0.40, 1, 1),
    (0.20, 1, 2),
    (0.20, 1, 4),
    (0.10, 1, 8),
    (0.10, 2, 4),
)
NVIDIA = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
OPENVINO = ("OpenVINOExecutionProvider",)
CPU = ("CPUExecutionProvider",)

LA = TrafficSource(region="us-west2", share=1.0, utc_offset_hours=-8.0)
TORONTO = TrafficSource(region="northamerica-northeast2", share=1.0, utc_offset_hours=-5.0)
FRANKFURT = TrafficSource(region="europe-west3", share=1.0, utc_offset_hours=1.0)
JOHANNESBURG = TrafficSource(region="africa-south1", share=1.0, utc_offset_hours=2.0)


def _from(*sources: tuple[TrafficSource, float]) -> tuple[TrafficSource, ...]:
    return tuple(
        TrafficSource(region=s.region, share=share, utc_offset_hours=s.utc_offset_hours)
        for s, share in sources
    )


_INFERENCE: tuple[InferenceSpec, ...] = (
    InferenceSpec(
        id="shop-cams-la",
        tenant="retail",
        replicas=2,
        accepted_kinds=("gpu", "npu"),
        providers=NVIDIA + OPENVINO,
        latency_slo_ms=50.0,
        reference_ms_per_request=0.5,
        peak_requests_per_s=60.0,
        traffic=_from((LA, 1.0)),
    ),
    InferenceSpec(
        id="traffic-cams-toronto",
        tenant="city",
        replicas=3,
        accepted_kinds=("gpu", "npu"),
        providers=NVIDIA + OPENVINO,
        latency_slo_ms=50.0,
        reference_ms_per_request=0.5,
        peak_requests_per_s=40.0,
        traffic=_from((TORONTO, 1.0)),
    ),
    InferenceSpec(
        id="factory-qc-frankfurt",
        tenant="industry",
        replicas=3,
        accepted_kinds=("npu", "gpu"),
        providers=OPENVINO + NVIDIA,
        latency_slo_ms=40.0,
        reference_ms_per_request=0.4,
        peak_requests_per_s=50.0,
        traffic=_from((FRANKFURT, 1.0)),
    ),
    InferenceSpec(
        id="kiosk-johannesburg",
        tenant="retail",
        replicas=2,
        accepted_kinds=("gpu", "npu", "cpu"),
        providers=NVIDIA + OPENVINO + CPU,
        latency_slo_ms=60.0,
        reference_ms_per_request=0.2,
        peak_requests_per_s=10.0,
        traffic=_from((JOHANNESBURG, 1.0)),
    ),
    InferenceSpec(
        id="assistant-na",
        tenant="language",
        replicas=2,
        accepted_kinds=("gpu",),
        providers=NVIDIA,
        latency_slo_ms=150.0,
        reference_ms_per_request=2.0,
        peak_requests_per_s=30.0,
        traffic=_from((LA, 0.6), (TORONTO, 0.4)),
    ),
    InferenceSpec(
        id="translate-eu-africa",
        tenant="language",
        replicas=2,
        accepted_kinds=("gpu", "npu"),
        providers=NVIDIA + OPENVINO,
        latency_slo_ms=200.0,
        reference_ms_per_request=1.0,
        peak_requests_per_s=20.0,
        traffic=_from((FRANKFURT, 0.7), (JOHANNESBURG, 0.3)),
    ),
    InferenceSpec(
        id="ocr-global",
        tenant="documents",
        replicas=2,
        accepted_kinds=("gpu", "npu", "cpu"),
        providers=NVIDIA + OPENVINO + CPU,
        latency_slo_ms=300.0,
        reference_ms_per_request=0.5,
        peak_requests_per_s=20.0,
        traffic=_from((LA, 1.0), (TORONTO, 1.0), (FRANKFURT, 1.0), (JOHANNESBURG, 1.0)),
    ),
    InferenceSpec(
        id="anomaly-sensors",
        tenant="industry",
        replicas=2,
        accepted_kinds=("cpu", "npu"),
        providers=CPU + OPENVINO,
        latency_slo_ms=250.0,
        reference_ms_per_request=0.2,
        peak_requests_per_s=10.0,
        traffic=_from((LA, 0.5), (FRANKFURT, 0.5)),
    ),
)


# Submitted a minute apart in this order, as a fleet's deployments arrive one by one
# (simultaneous submissions would be decided by work id, an artefact).
INFERENCE: tuple[InferenceSpec, ...] = tuple(
    msgspec.structs.replace(spec, start_offset_s=60.0 * number)
    for number, spec in enumerate(_INFERENCE)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadParams:
    target_load: float = 0.5
    flexible_share: float = 0.4
    median_duration_h: float = 1.5
    duration_sigma: float = 1.2
    min_duration_s: float = 300.0
    max_duration_s: float = 36 * HOUR_S
    slack_h: tuple[float, float] = (4.0, 24.0)
    # Jobs at least this long on an A100 save a checkpoint every checkpoint_interval_s.
    checkpoint_min_duration_s: float = HOUR_S
    checkpoint_interval_s: float = 1800.0
    # The gang mix (probability, workers, GPUs per worker); trace_shaped.py passes its own.
    gangs: tuple[tuple[float, int, int], ...] = GANGS
    # Of the jobs whose shape has data-parallel alternatives (DATA_PARALLEL_SHAPES), the
    # share that declares them (flexible shapes).
    data_parallel_share: float = 0.7


def arrival_factor(at_s: float) -> float:
    """Relative submission rate at a UTC time: the working day and the week."""
    hour = (at_s / HOUR_S) % 24.0
    weekday = int(at_s // (24 * HOUR_S) + 3) % 7  # 1970-01-01 was a Thursday (3)
    daily = 1.5 if 13 <= hour < 21 else 0.5 if 1 <= hour < 9 else 1.0
    return daily * (0.6 if weekday >= 5 else 1.0)


def _mean_arrival_factor() -> float:
    week = [arrival_factor(h * HOUR_S) for h in range(7 * 24)]
    return sum(week) / len(week)


class NoTrainingCapacity(ValueError):
    """The fleet has no cloud GPU: there is no load to scale generated training to."""


def cloud_gpu_throughput(nodes: Sequence[Node]) -> float:
    """Σ count × relative speed over the cloud GPU pools (reference-GPU equivalents)."""
    return sum(
        pool.count * pool.relative_speed
        for node in nodes
        if node.site == "cloud"
        for pool in node.pools
        if pool.kind == "gpu"
    )


def _mean_gpus(gangs: tuple[tuple[float, int, int], ...]) -> float:
    return sum(p * workers * gpus for p, workers, gpus in gangs)


def mean_duration_s(params: WorkloadParams) -> float:
    # Lognormal mean (the clipping changes it by well under 1 %).
    return params.median_duration_h * HOUR_S * math.exp(params.duration_sigma**2 / 2)


def generate_workload(
    nodes: Sequence[Node],
    *,
    start_s: float,
    days: float,
    seed: int,
    params: WorkloadParams | None = None,
) -> Workload:
    """Training arrivals over ``days`` from ``start_s`` plus the ``INFERENCE`` set.

    ``start_s`` only places the daily and weekly pattern; offsets in the result are
    relative to it.
    """
    params = params or WorkloadParams()
    rng = random.Random(seed)
    capacity = cloud_gpu_throughput(nodes)
    if not capacity > 0:
        raise NoTrainingCapacity(
            "the fleet has no cloud GPU to generate training work for (its offered load is a "
            "share of the cloud GPUs)"
        )
    mean_work_gpu_s = _mean_gpus(params.gangs) * mean_duration_s(params)
    mean_rate_per_s = params.target_load * capacity / mean_work_gpu_s
    peak_rate = mean_rate_per_s / _mean_arrival_factor() * 1.5
    horizon = days * 24 * HOUR_S
    training: list[TrainingSpec] = []
    offset = 0.0
    while True:
        # Thinning of a Poisson process with the peak rate.
        offset += rng.expovariate(peak_rate)
        if offset >= horizon:
            break
        if rng.random() * 1.5 > arrival_factor(start_s + offset):
            continue
        training.append(_training(rng, len(training) + 1, offset, params))
    training = _mark_data_parallel(training, seed, params.data_parallel_share)
    return Workload(seed=seed, training=tuple(training), inference=inference_for(nodes, start_s))


# Flexible shapes: the alternatives a data-parallel job of each shape (workers, GPUs per
# worker) declares; the same total GPUs, so the same work and run time in either.
DATA_PARALLEL_SHAPES: dict[tuple[int, int], tuple[ShapeSpec, ...]] = {
    (1, 8): (ShapeSpec(workers=2, gpus_per_worker=4),),
    (2, 4): (ShapeSpec(workers=1, gpus_per_worker=8),),
    (1, 4): (ShapeSpec(workers=2, gpus_per_worker=2),),
}


def _mark_data_parallel(
    training: list[TrainingSpec], seed: int, share: float
) -> list[TrainingSpec]:
    """Mark ``share`` of the jobs with a shape in ``DATA_PARALLEL_SHAPES`` as data-parallel.

    The draws come from a stream of their own (seeded from ``seed``), one per job in
    order whatever its shape, so every other draw of the workload, and so every job
    of a seed apart from this mark, is what it was before flexible shapes."""
    rng = random.Random(f"greenfed-data-parallel:{seed}")
    marked = []
    for spec in training:
        data_parallel = rng.random() < share
        alternatives = DATA_PARALLEL_SHAPES.get((spec.workers, spec.gpus_per_worker), ())
        if data_parallel and alternatives:
            spec = msgspec.structs.replace(spec, alternative_shapes=alternatives)
        marked.append(spec)
    return marked


# The edge regions of the default fleet, in the order its groups first name them: the
# ``INFERENCE`` set's traffic comes from these.
DEFAULT_EDGE_REGIONS = ("northamerica-northeast2", "europe-west3", "us-west2", "africa-south1")


def inference_for(nodes: Sequence[Node], start_s: float) -> tuple[InferenceSpec, ...]:
    """``INFERENCE``, its traffic coming from the fleet's own edge regions: unchanged on
    a fleet that has the default's, else the default's regions in turn mapped onto a
    fleet with as many (`sim_devices/fleets/other-zones.toml`), at their local time."""
    regions: dict[str, str] = {}  # edge region -> a zone in it, in first-named order
    for node in nodes:
        if node.site == "edge":
            regions.setdefault(node.region, node.zone)
    if set(DEFAULT_EDGE_REGIONS) <= set(regions) or len(regions) != len(DEFAULT_EDGE_REGIONS):
        return INFERENCE
    mapped = {
        old: (new, _utc_offset_hours(regions[new], start_s))
        for old, new in zip(DEFAULT_EDGE_REGIONS, regions, strict=True)
    }
    return tuple(
        msgspec.structs.replace(
            spec,
            traffic=tuple(
                msgspec.structs.replace(
                    source,
                    region=mapped[source.region][0],
                    utc_offset_hours=mapped[source.region][1],
                )
                if source.region in mapped
                else source
                for source in spec.traffic
            ),
        )
        for spec in INFERENCE
    )


def _utc_offset_hours(zone: str, at_s: float) -> float:
    name = ZONE_TIMEZONES.get(zone)
    if name is None:
        return 0.0
    offset = datetime.fromtimestamp(at_s, tz=ZoneInfo(name)).utcoffset()
    return offset.total_seconds() / HOUR_S if offset is not None else 0.0


def _training(
    rng: random.Random, number: int, offset: float, params: WorkloadParams
) -> TrainingSpec:
    pick = rng.random()
    workers, gpus = params.gangs[-1][1:]
    for probability, w, g in params.gangs:
        if pick < probability:
            workers, gpus = w, g
            break
        pick -= probability
    duration = rng.lognormvariate(
        math.log(params.median_duration_h * HOUR_S), params.duration_sigma
    )
    duration = min(max(duration, params.min_duration_s), params.max_duration_s)
    deadline = max_delay = None
    if rng.random() < params.flexible_share:
        slack = rng.uniform(*params.slack_h) * HOUR_S
        if rng.random() < 0.5:
            deadline = 2.0 * duration + slack
        else:
            max_delay = slack
    return TrainingSpec(
        id=f"train-{number:05d}",
        tenant=rng.choice(TENANTS),
        submit_offset_s=round(offset, 3),
        duration_s=round(duration, 1),
        workers=workers,
        gpus_per_worker=gpus,
        deadline_offset_s=deadline,
        max_delay_s=max_delay,
        checkpoint_interval_s=(
            params.checkpoint_interval_s if duration >= params.checkpoint_min_duration_s else None
        ),
    )
