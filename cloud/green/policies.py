"""Named scheduling policies: weights over the built-in and green terms, queue order,
temporal shifting and migration.

==============  =======  ====  =====  ======  =====  =======  ====  =====  ======  ======  ======
policy          packing  load  speed  carbon  price  latency  thr.  queue  shifts  moves   caps
==============  =======  ====  =====  ======  =====  =======  ====  =====  ======  ======  ======
green           0.5      0.25  0.25   4       0      0.5      0.6   fair   carbon  carbon  carbon
cost            0.5      0.25  0.25   0       4      0.5      0.6   fair   price   price   price
latency         0.5      0.25  0.5    0       0      4        0.6   fair   off     off     off
balanced        1        0.5   0.5    1.5     1      1        0.6   fair   carbon  carbon  carbon
fifo-binpack    1        0     0.5    0       0      0        0.6   fifo   off     off     off
spread          0        1     0      0       0      0        0     fair   off     off     off
green-spatial   as green                                              off     carbon  off
green-temporal  as green, but carbon 0                                carbon  off     off
==============  =======  ====  =====  ======  =====  =======  ====  =====  ======  ======  ======

(preference and spread weigh 1 in every policy; thr.: ``load_threshold``; queue:
``Policy.queue_order``; shifts: the objective of temporal shifting; moves: of
migration, ``build_migrator``; caps: of power capping, ``build_power_capper``.)

* ``fifo-binpack`` is the carbon-agnostic baseline: first come, first served
  within a priority class (no fair-share reordering), packing partly used nodes
  first, faster accelerators breaking ties (a job finishes sooner there).
* ``spread`` balances load: no packing, and the load term with threshold 0 scores
  each node ``1 − utilisation``, so the least used node wins.
* ``green``, ``cost``, ``balanced`` and ``green-spatial`` blend *shape fit* into
  packing (``scoring.ShapeFit``, ``terms.CleanCapacity``): a placement is also priced
  by the clean (or cheap) capacity it leaves in shapes the queue cannot use, so a
  4-GPU member fills a clean 4-GPU node rather than break a clean 8-GPU one.
* ``green-spatial`` and ``green-temporal`` split green's saving between choosing
  the cleaner zone (at the start, and by moving running work) and waiting for the
  cleaner hour (evaluation ablations).

Every policy gets the same latency estimator, so an inference SLO is a hard
filter under all of them, and registers all three green terms; a term whose
weight is 0 is not evaluated. Per-job ``score_weights`` override any of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cloud.scheduler import Policy, StartAdvisor
from cloud.scheduler.policy import QueueDiscipline
from cloud.signals.grid import GridSignals

from .energy import EnergyModel
from .latency import ServingLatency
from .migration import Migrator
from .power_capping import PowerCapper
from .shifting import DEFAULT_MIN_SAVING, Objective, WindowShifter
from .terms import DEFAULT_INFERENCE_WINDOW_S, CarbonTerm, CleanCapacity, LatencyTerm, PriceTerm
from .waiting import DEFAULT_PATIENCE_S, DEFAULT_WAIT_MIN_SAVING, CapacityWaiter

DEADLINE_GUARD_S = 7200.0


def _weights(**values: float) -> Mapping[str, float]:
    return MappingProxyType(values)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    description: str
    weights: Mapping[str, float]
    load_threshold: float = 0.6
    queue_order: QueueDiscipline = "fair"
    shifting: Objective | None = None
    # With shifting, jobs this close to their latest safe start go first, and a job
    # that would miss its deadline otherwise may evict checkpointing work without one
    # (``Policy.deadline_preemption``): waiting, capping and moving for the grid must
    # never be why a deadline is missed.
    deadline_guard_s: float | None = None
    # Move running, checkpointing training to cleaner (or cheaper) capacity as it
    # frees (migration.py); None: never.
    migration: Objective | None = None
    # Hold new training's GPUs to a lower power limit where the energy saved is worth
    # the longer run (power_capping.py); None: never.
    power_capping: Objective | None = None
    # Temporal shifting's minimum saving when the inputs name none; None: no temporal
    # shifting unless the operator sets one (capacity waiting and migration stay on).
    shifting_min_saving: float | None = None
    # Blend shape fit into packing, fragmentation weighed by the capacity's cleanliness
    # (or cheapness: the shifting objective) (terms.CleanCapacity, scoring.ShapeFit).
    shape_fit: bool = False

    def __post_init__(self) -> None:
        if self.shifting is not None and self.deadline_guard_s is None:
            object.__setattr__(self, "deadline_guard_s", DEADLINE_GUARD_S)


_GREEN = _weights(
    packing=0.5,
    load=0.25,
    speed=0.25,
    preference=1.0,
    spread=1.0,
    carbon=4.0,
    price=0.0,
    latency=0.5,
)

POLICIES: Mapping[str, PolicySpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            PolicySpec(
                "green",
                "lowest emissions: cleanest zone now, or the cleanest forecast window",
                _GREEN,
                shifting="carbon",
                migration="carbon",
                power_capping="carbon",
                shape_fit=True,
            ),
            PolicySpec(
                "cost",
                "lowest electricity cost, in place and in time",
                _weights(
                    packing=0.5,
                    load=0.25,
                    speed=0.25,
                    preference=1.0,
                    spread=1.0,
                    carbon=0.0,
                    price=4.0,
                    latency=0.5,
                ),
                shifting="price",
                migration="price",
                power_capping="price",
                shape_fit=True,
            ),
            PolicySpec(
                "latency",
                "lowest request latency for inference",
                _weights(
                    packing=0.5,
                    load=0.25,
                    speed=0.5,
                    preference=1.0,
                    spread=1.0,
                    carbon=0.0,
                    price=0.0,
                    latency=4.0,
                ),
            ),
            PolicySpec(
                "balanced",
                "carbon, cost, latency and packing weighed together",
                _weights(
                    packing=1.0,
                    load=0.5,
                    speed=0.5,
                    preference=1.0,
                    spread=1.0,
                    carbon=1.5,
                    price=1.0,
                    latency=1.0,
                ),
                shifting="carbon",
                migration="carbon",
                power_capping="carbon",
                shape_fit=True,
            ),
            PolicySpec(
                "fifo-binpack",
                "carbon-agnostic baseline: first come first served, pack tightly",
                _weights(
                    packing=1.0,
                    load=0.0,
                    speed=0.5,
                    preference=1.0,
                    spread=1.0,
                    carbon=0.0,
                    price=0.0,
                    latency=0.0,
                ),
                queue_order="fifo",
            ),
            PolicySpec(
                "spread",
                "carbon-agnostic baseline: balance load across nodes",
                _weights(
                    packing=0.0,
                    load=1.0,
                    speed=0.0,
                    preference=1.0,
                    spread=1.0,
                    carbon=0.0,
                    price=0.0,
                    latency=0.0,
                ),
                load_threshold=0.0,
            ),
            PolicySpec(
                "green-spatial",
                "ablation: green's placement and migration without temporal shifting",
                _GREEN,
                migration="carbon",
                shape_fit=True,
            ),
            PolicySpec(
                "green-temporal",
                "ablation: green's temporal shifting without the carbon term",
                MappingProxyType({**_GREEN, "carbon": 0.0}),
                shifting="carbon",
                shifting_min_saving=DEFAULT_MIN_SAVING,
            ),
        )
    }
)

POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def policy_spec(name: str) -> PolicySpec:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class GreenInputs:
    """What a pass knows: the grid, the network and the energy model."""

    signals: GridSignals
    latency: ServingLatency
    energy: EnergyModel = field(default_factory=EnergyModel)
    inference_window_s: float = DEFAULT_INFERENCE_WINDOW_S
    # Temporal shifting: defer only for this much less; None: the policy's own default
    # (PolicySpec.shifting_min_saving: green does not shift in time unless asked).
    min_saving: float | None = None
    safety_margin_s: float = 3600.0  # temporal shifting: before the latest start
    max_booked_share: float = 0.5  # temporal shifting: of a zone's capacity, ahead of time
    migration: bool = True  # policies that migrate may (False: none does)
    migration_min_saving: float = 0.2  # migration: move only for at least this much less
    restart_s: float = 300.0  # migration: reference seconds to resume from a checkpoint
    migration_cooldown_s: float = 600.0  # migration: runs younger than this stay put
    # Policies that shift in time also hold any training job up to this long for
    # cleaner capacity that frees by then (waiting.py); 0: never.
    patience_s: float = DEFAULT_PATIENCE_S
    wait_min_saving: float = DEFAULT_WAIT_MIN_SAVING
    power_capping: bool = True  # policies that cap power may (False: none does)
    power_cap_min_saving: float = 0.03  # power capping: cap only for at least this much less


def build_migrator(spec: PolicySpec | str, inputs: GreenInputs) -> Migrator | None:
    """The policy's migrator, or None when it never moves running work."""
    if isinstance(spec, str):
        spec = policy_spec(spec)
    if spec.migration is None or not inputs.migration:
        return None
    return Migrator(
        inputs.signals,
        inputs.energy,
        objective=spec.migration,
        min_saving=inputs.migration_min_saving,
        restart_s=inputs.restart_s,
        cooldown_s=inputs.migration_cooldown_s,
    )


def build_power_capper(spec: PolicySpec | str, inputs: GreenInputs) -> PowerCapper | None:
    """The policy's power capper, or None when it never caps."""
    if isinstance(spec, str):
        spec = policy_spec(spec)
    if spec.power_capping is None or not inputs.power_capping:
        return None
    return PowerCapper(
        signals=inputs.signals,
        energy=inputs.energy,
        objective=spec.power_capping,
        min_saving=inputs.power_cap_min_saving,
        safety_margin_s=inputs.safety_margin_s,
    )


def _capacity_value(spec: PolicySpec, inputs: GreenInputs) -> CleanCapacity | None:
    objective = spec.shifting or spec.migration
    if not spec.shape_fit or objective is None:
        return None
    return CleanCapacity(inputs.signals, inputs.energy, objective)


def build_policy(spec: PolicySpec | str, inputs: GreenInputs) -> Policy:
    """A scheduler ``Policy`` for one pass (build a fresh one when the signals change)."""
    if isinstance(spec, str):
        spec = policy_spec(spec)
    energy, signals = inputs.energy, inputs.signals
    min_saving = inputs.min_saving if inputs.min_saving is not None else spec.shifting_min_saving
    shifter = (
        WindowShifter(
            signals,
            energy,
            objective=spec.shifting,
            min_saving=min_saving,
            safety_margin_s=inputs.safety_margin_s,
            max_booked_share=inputs.max_booked_share,
            migrating=spec.migration is not None and inputs.migration,
        )
        if spec.shifting is not None and min_saving is not None
        else None
    )
    advisor: StartAdvisor | None = shifter
    patience_s = inputs.patience_s if spec.shifting is not None else 0.0
    if patience_s > 0 and spec.shifting is not None:
        advisor = CapacityWaiter(
            signals,
            energy,
            patience_s,
            min_saving=inputs.wait_min_saving,
            objective=spec.shifting,
            then=shifter,
        )
    return Policy(
        weights=spec.weights,
        load_threshold=spec.load_threshold,
        score_terms=(
            CarbonTerm(signals, energy, inputs.inference_window_s),
            PriceTerm(signals, energy, inputs.inference_window_s),
            LatencyTerm(inputs.latency),
        ),
        latency_estimator=inputs.latency,
        capacity_value=_capacity_value(spec, inputs),
        start_advisor=advisor,
        patience_s=patience_s,
        queue_order=spec.queue_order,
        deadline_guard_s=spec.deadline_guard_s,
        deadline_preemption=spec.shifting is not None,
    )
