"""The two typed hooks other parts of greenfed plug into the scheduler.

* ``ScoreTerm``: an extra score (the green issue adds carbon, price and latency).
  A term returns raw values per candidate node; the framework normalises them to
  0..1 (min-max over the job's candidate nodes, or over fixed ``bounds``), flips
  them when lower is better and multiplies by the term's weight.
* ``LatencyEstimator``: estimated request latency per candidate node; the
  ``latency-slo`` filter rejects nodes above a deployment's SLO.
* ``StartAdvisor``: temporal shifting. For a training job that may wait (a
  ``deadline`` or ``max_delay_s``), it may answer "not now, at T" (a ``Deferral``);
  the core then keeps the job pending with code ``deferred``. The core enforces
  the safety rule itself: a deferral that would start after the latest start
  still meeting the deadline (or the maximum delay) on every candidate is ignored.

All three see only the immutable snapshot and the work (plus, for the advisor,
which candidates have room right now), never the tentative state: their values
stay valid for the whole pass and are computed once per job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import numpy as np

from shared.messages import AcceleratorKind

from .arrays import BoolArray, FloatArray, IntArray
from .model import InferenceDeployment, TrainingJob, Work
from .plan import Deferral
from .snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes a job may go to, for one accelerator kind.

    ``runtime_s`` is the estimated run time on each node (duration on the reference
    accelerator divided by the node's relative speed; ``inf`` for long-running
    inference).
    """

    nodes: IntArray
    kind: AcceleratorKind
    accelerators: int  # per worker or replica
    runtime_s: FloatArray


@dataclass(frozen=True, slots=True)
class TermValues:
    name: str
    raw: FloatArray  # one value per candidate node, aligned with Candidates.nodes
    higher_is_better: bool
    bounds: tuple[float, float] | None = None  # fixed normalisation range; None = min-max


class ScoreTerm(Protocol):
    """An extra score term. ``name`` is the key of its weight in policies and jobs."""

    @property
    def name(self) -> str: ...

    def evaluate(self, snapshot: Snapshot, work: Work, candidates: Candidates) -> TermValues: ...


class LatencyEstimator(Protocol):
    def estimate_ms(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray: ...


@dataclass(frozen=True, slots=True)
class StartCandidates:
    """One accepted kind's candidates for a training job, and where a member fits now.

    ``fits_now`` is per candidate: the node has the free accelerators (and host
    memory) for one member at this point of the pass.
    """

    candidates: Candidates
    fits_now: BoolArray


@dataclass(frozen=True, slots=True)
class Booking:
    """Capacity an earlier decision of the same pass has taken or promised: a
    placement on a node (from now), or a deferral to a zone (from its target start,
    ``node_id`` None, ``member_accelerators`` per gang worker)."""

    zone: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    start_s: float
    end_s: float  # inf: long-running
    node_id: str | None = None
    member_accelerators: int = 0


class StartAdvisor(Protocol):
    """Temporal shifting: None starts the job now (where scoring puts it), a
    ``Deferral`` keeps it pending until ``Deferral.start_at``. ``booked`` lists what
    this pass has placed or deferred so far, in decision order."""

    def advise(
        self,
        snapshot: Snapshot,
        job: TrainingJob,
        options: Sequence[StartCandidates],
        booked: Sequence[Booking],
    ) -> Deferral | None: ...


def normalise(values: TermValues, size: int | None = None) -> FloatArray:
    """Map raw values to 0..1 where 1 is best.

    * ``size``: the number of candidates; a term returning another number of raw
      values is a bug and raises ``ValueError`` naming the term.
    * Equal values carry no preference: all 1, whichever direction is better.
    * NaN (an unknown value) is the worst score, 0, whichever direction is better:
      missing data must never make a node look good.
    """
    raw = np.asarray(values.raw, dtype=np.float64)
    if raw.ndim != 1 or (size is not None and raw.size != size):
        count = raw.size if raw.ndim == 1 else f"an array of shape {raw.shape} of"
        raise ValueError(
            f"score term {values.name!r} returned {count} raw values for {size} candidates"
        )
    if raw.size == 0:
        return raw
    unknown = np.isnan(raw)
    if values.bounds is not None:
        low, high = values.bounds
    else:
        finite = raw[np.isfinite(raw)]
        if finite.size == 0:
            return np.where(unknown, 0.0, 1.0)
        low, high = float(finite.min()), float(finite.max())
    if high <= low:
        score = np.ones_like(raw)
    else:
        scaled = np.clip((raw - low) / (high - low), 0.0, 1.0)
        score = scaled if values.higher_is_better else 1.0 - scaled
    result: FloatArray = np.where(unknown, 0.0, score)
    return result


@dataclass(frozen=True, slots=True)
class RegionRttLatency:
    """Traffic-weighted network RTT from origin regions plus compute time per kind.

    A simple table-driven estimator; the green issue may replace it with measured
    RTTs. Pairs missing from ``rtt_ms`` cost ``default_rtt_ms`` (0 within a region).
    """

    rtt_ms: Mapping[tuple[str, str], float]
    default_rtt_ms: float = 100.0
    compute_ms: Mapping[AcceleratorKind, float] = field(
        default_factory=lambda: MappingProxyType({"gpu": 5.0, "npu": 10.0, "cpu": 40.0})
    )

    def estimate_ms(
        self, snapshot: Snapshot, deployment: InferenceDeployment, candidates: Candidates
    ) -> FloatArray:
        regions = snapshot.nodes.regions
        traffic = {r: w for r, w in deployment.traffic_by_region.items() if w > 0}
        total = sum(traffic.values())
        per_region = np.zeros(len(regions), dtype=np.float64)
        for code, region in enumerate(regions):
            if total <= 0:
                continue
            per_region[code] = sum(
                weight / total * self._rtt(origin, region) for origin, weight in traffic.items()
            )
        kind_columns = snapshot.nodes.kind(candidates.kind)
        compute = (
            self.compute_ms.get(candidates.kind, 0.0)
            / kind_columns.relative_speed[candidates.nodes]
        )
        result: FloatArray = per_region[snapshot.nodes.region_code[candidates.nodes]] + compute
        return result

    def _rtt(self, origin: str, region: str) -> float:
        if origin == region:
            return self.rtt_ms.get((origin, region), 0.0)
        return self.rtt_ms.get(
            (origin, region), self.rtt_ms.get((region, origin), self.default_rtt_ms)
        )
