"""Scheduling policy: score weights, thresholds and feature switches.

Weights are per policy and may be overridden per job (``work.score_weights``), by
term name: the built-in ``packing``, ``load``, ``speed``, ``preference`` and
``spread`` plus the name of every extra ``ScoreTerm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from .extensions import CapacityValue, LatencyEstimator, ScoreTerm, StartAdvisor
from .model import BUILTIN_TERM_NAMES, Work

BUILTIN_TERMS: Final = BUILTIN_TERM_NAMES
QueueDiscipline = Literal["fair", "fifo"]

DEFAULT_WEIGHTS: Final[Mapping[str, float]] = MappingProxyType(
    {"packing": 1.0, "load": 0.5, "speed": 0.5, "preference": 1.0, "spread": 1.0}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    load_threshold: float = 0.6  # the load term is 1 below this utilisation, then falls to 0
    score_terms: tuple[ScoreTerm, ...] = ()
    latency_estimator: LatencyEstimator | None = None
    # Blend shape fit into packing, weighed by what each node's capacity is worth
    # (scoring.ShapeFit); None: plain packing.
    capacity_value: CapacityValue | None = None
    # Temporal shifting of flexible training jobs (deadline or max_delay_s); None: off.
    start_advisor: StartAdvisor | None = None
    # Any training job may also be held up to this long after its submission when the
    # start advisor expects cleaner capacity to free by then (0: only flexible jobs are
    # offered to it). The wait is the job's only cost: it starts at the latest then.
    patience_s: float = 0.0
    # "fair": priority, then DRF share, then submission; "fifo": priority, then
    # submission only (the carbon-agnostic first-come-first-served baseline).
    queue_order: QueueDiscipline = "fair"
    runners_up: int = 3  # alternatives recorded with each placement
    preemption: bool = True
    backfill: bool = True
    max_reservations: int = 4  # blocked jobs (in queue order) that hold a reservation
    # Jobs pending longer than this go first within their priority class, oldest first,
    # so that no tenant's work waits forever behind lower-share tenants (None: off).
    starvation_guard_s: float | None = 3600.0
    # Flexible training that must start within this long to meet its deadline (or
    # maximum delay) goes first in its class, most urgent first (None: off).
    deadline_guard_s: float | None = None
    # A training job with a deadline (or maximum delay) that no capacity freeing in
    # time would let start may evict running training of its priority or lower that
    # saves checkpoints and has no deadline itself (reason ``deadline``): it loses at
    # most a checkpoint interval's work, where the job would miss (preemption.py).
    deadline_preemption: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.load_threshold < 1.0:
            raise ValueError("load_threshold must be within [0, 1)")
        if any(not w >= 0 or w == float("inf") for w in self.weights.values()):
            raise ValueError("score weights must be finite and not negative")
        if self.deadline_guard_s is not None and not self.deadline_guard_s >= 0:
            raise ValueError("deadline_guard_s must be >= 0")
        if not 0.0 <= self.patience_s < float("inf"):
            raise ValueError("patience_s must be finite and >= 0")
        if self.queue_order not in ("fair", "fifo"):
            raise ValueError(f"queue_order must be fair or fifo, not {self.queue_order!r}")
        if self.runners_up < 0 or self.max_reservations < 0:
            raise ValueError("runners_up and max_reservations must not be negative")
        names = [term.name for term in self.score_terms]
        if len(set(names)) != len(names) or set(names) & set(BUILTIN_TERMS):
            raise ValueError("score term names must be unique and not shadow built-in terms")
        # A registered term without a weight counts as much as packing (1.0).
        merged = {**DEFAULT_WEIGHTS, **dict.fromkeys(names, 1.0), **self.weights}
        object.__setattr__(self, "weights", MappingProxyType(merged))

    @property
    def builtin_weights(self) -> tuple[float, float, float, float]:
        """packing, load, speed, preference: the policy's, for jobs without overrides."""
        w = self.weights
        return (w["packing"], w["load"], w["speed"], w["preference"])

    def weight(self, work: Work, name: str) -> float:
        """The job's override if it has one, else the policy's weight (0 if unnamed)."""
        override = work.score_weights.get(name)
        if override is not None:
            return override  # checked (finite, >= 0) when the job was built
        return float(self.weights.get(name, 0.0))


DEFAULT_POLICY: Final = Policy()
