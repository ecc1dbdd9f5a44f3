"""The typed hooks other parts of greenfed plug into the scheduler, and how the core
calls them.

* ``ScoreTerm``: an extra score (the green issue adds carbon, price and latency).
  A term returns raw values per candidate node; the framework normalises them to
  0..1 (min-max over the job's candidate nodes, or over fixed ``bounds``), flips
  them when lower is better and multiplies by the term's weight.
* ``LatencyEstimator``: estimated request latency per candidate node; the
  ``latency-slo`` filter rejects nodes above a deployment's SLO. The core only
  calls it: latency is estimated in ``cloud.green.latency`` (``ServingLatency``).
* ``StartAdvisor``: temporal shifting. For a training job that may wait (a
  ``deadline`` or ``max_delay_s``), it may answer "not now, at T" (a ``Deferral``);
  the core then keeps the job pending with code ``deferred``. The core enforces
  the safety rule itself: a deferral that would start after the latest start
  still meeting the deadline (or the maximum delay) on every candidate is ignored.

All three see only the immutable snapshot and the work (plus, for the advisor,
which candidates have room right now), never the tentative state: their values
stay valid for the whole pass and are computed once per job.

The core calls hooks only through ``evaluate_term``, ``estimate_latency`` and
``advise_start``. A hook that raises, or returns values that do not line up with
the candidates, fails for the work item being decided and nothing else: the call
raises ``HookFailed`` with a ``HookFailure`` (which hook, its name, the error), and
the core makes that the item's pending reason (code ``hook-failed``) and goes on
with the next item. Exceptions that are not ``Exception`` (``KeyboardInterrupt``,
``CancelledError``) are not caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shared.messages import AcceleratorKind

from .arrays import BoolArray, FloatArray, IntArray
from .model import InferenceDeployment, TrainingJob, Work
from .plan import Deferral, HookFailure, HookKind
from .snapshot import KindColumns, Snapshot


@dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes a job may go to, for one accelerator kind.

    ``runtime_s`` is the estimated run time on each node (duration on the reference
    accelerator divided by the node's relative speed; ``inf`` for long-running
    inference). ``column`` is the pool column (``Snapshot.nodes.kinds``) the nodes
    were found in: a node with several pools of the kind (MIG slices beside whole
    GPUs) is a candidate once per pool; None: the kind's first pool.
    """

    nodes: IntArray
    kind: AcceleratorKind
    accelerators: int  # per worker or replica
    runtime_s: FloatArray
    column: int | None = None

    def pools(self, snapshot: Snapshot) -> KindColumns:
        """The pool column the candidates' speed, power and memory are read from."""
        table = snapshot.nodes
        return table.kind(self.kind) if self.column is None else table.kinds[self.column]


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


class CapacityValue(Protocol):
    """What each node's free capacity is worth to the rest of the queue, 0..1 per node
    row (1: the most; green: the cleanest), for the accelerators of pool ``column``
    (``Snapshot.nodes.kinds``). A policy with one blends shape fit into packing
    (``scoring.ShapeFit``): it keeps valuable capacity in shapes the queue can use.
    Called once per pass and pool column, on the immutable snapshot."""

    def node_values(self, snapshot: Snapshot, column: int) -> FloatArray: ...


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


class HookFailed(Exception):
    """A hook failed for the work item being decided; the core turns ``failure`` into
    that item's pending reason. Raised only by the calls below."""

    def __init__(self, failure: HookFailure) -> None:
        super().__init__(
            f"{failure.hook} {failure.name!r} failed: {failure.error}: {failure.detail}"
        )
        self.failure = failure


def _failed(hook: HookKind, name: str, error: Exception) -> HookFailed:
    return HookFailed(
        HookFailure(hook=hook, name=name, error=type(error).__name__, detail=str(error))
    )


def evaluate_term(
    term: ScoreTerm, snapshot: Snapshot, work: Work, candidates: Candidates
) -> FloatArray:
    """The term's values for ``candidates``, normalised (``normalise``)."""
    try:
        return normalise(term.evaluate(snapshot, work, candidates), candidates.nodes.size)
    except Exception as error:
        raise _failed("score-term", term.name, error) from error


def estimate_latency(
    estimator: LatencyEstimator,
    snapshot: Snapshot,
    deployment: InferenceDeployment,
    candidates: Candidates,
) -> FloatArray:
    """The estimator's milliseconds per candidate, one value for each."""
    try:
        estimate = np.asarray(
            estimator.estimate_ms(snapshot, deployment, candidates), dtype=np.float64
        )
    except Exception as error:
        raise _failed("latency-estimator", type(estimator).__name__, error) from error
    if estimate.shape != candidates.nodes.shape:
        count = estimate.size if estimate.ndim == 1 else f"an array of shape {estimate.shape} of"
        raise _failed(
            "latency-estimator",
            type(estimator).__name__,
            ValueError(f"returned {count} estimates for {candidates.nodes.size} candidates"),
        )
    return estimate


def advise_start(
    advisor: StartAdvisor,
    snapshot: Snapshot,
    job: TrainingJob,
    options: Sequence[StartCandidates],
    booked: Sequence[Booking],
) -> Deferral | None:
    """The advisor's answer for ``job``: None (start now) or a ``Deferral``."""
    try:
        return advisor.advise(snapshot, job, options, booked)
    except Exception as error:
        raise _failed("start-advisor", type(advisor).__name__, error) from error
