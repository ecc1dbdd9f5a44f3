"""What work cost: kWh, gCO2eq and money per allocation, job and tenant, and what
the carbon-agnostic baseline would have cost instead.

Pure functions over usage records, the energy model and recorded signals; the
simulator uses them now, the control plane will feed them its allocations and
telemetry.

* A ``Usage`` is one allocation (gang worker or replica) on one pool of one node
  over [start_s, end_s) at a mean utilisation. Its pool is the node's pool of its
  kind and ``accelerator_model`` (MIG slices beside whole GPUs are pools of their
  own, each with its own power), as the scheduler's placement names it. When
  telemetry measured its energy (NVML energy counters, RAPL),
  ``measured_energy_j`` replaces the model.
* Emissions and cost use the **recorded** intensity and price of the node's zone
  averaged over the interval (never the forecast the scheduler decided on):
  ``gco2 = kWh × mean intensity``, ``cost = kWh × mean price / 1000``. For a
  constant power this is exactly ∫ P(t)·I(t) dt. A zone without a recorded
  series gets the conservative fallback of ``window.window_means`` and the
  record is flagged ``fallback``; where nothing at all is known (no zone has a
  price), the cost is NaN, unknown, and reports show it so.
* The **counterfactual** of a job is what the ``fifo-binpack`` baseline would
  have chosen at submission on the same cluster state (running work and the
  queue ahead of it): its nodes and start (now, or its reservation's start when
  it would have had to wait).
  ``avoided = counterfactual − actual`` is the job's "gCO2 avoided".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cloud.scheduler import (
    InferenceDeployment,
    Plan,
    Policy,
    Scheduler,
    Snapshot,
    TrainingJob,
    Work,
)
from cloud.scheduler.arrays import FloatArray, IntArray
from cloud.signals.grid import GridSignals
from shared.messages import AcceleratorKind

from .energy import J_PER_KWH, EnergyModel
from .window import window_means


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    allocation_id: str
    work_id: str
    tenant: str
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    start_s: float
    end_s: float
    utilisation: float  # mean busy share of its accelerators over the interval, 0..1
    measured_energy_j: float | None = None  # from telemetry; replaces the model
    power_limit_w: float | None = None  # each device's power cap (power capping); None: none
    # The model of the node's pool it held (``Allocation.accelerator_model``): on a node
    # with several pools of the kind (MIG slices beside whole GPUs) each draws its own
    # power; "" (or a model no longer there) for the node's first pool of the kind.
    accelerator_model: str = ""

    def __post_init__(self) -> None:
        if self.end_s < self.start_s:
            raise ValueError(f"usage {self.allocation_id}: ends before it starts")
        if not 0.0 <= self.utilisation <= 1.0:
            raise ValueError(f"usage {self.allocation_id}: utilisation must be within 0..1")
        if self.measured_energy_j is not None and not self.measured_energy_j >= 0:
            raise ValueError(f"usage {self.allocation_id}: measured energy must be >= 0")


@dataclass(frozen=True, slots=True)
class Totals:
    kwh: float = 0.0
    gco2: float = 0.0
    cost: float = 0.0

    def __add__(self, other: Totals) -> Totals:
        return Totals(self.kwh + other.kwh, self.gco2 + other.gco2, self.cost + other.cost)

    def __sub__(self, other: Totals) -> Totals:
        return Totals(self.kwh - other.kwh, self.gco2 - other.gco2, self.cost - other.cost)


@dataclass(frozen=True, slots=True)
class UsageAccount:
    usage: Usage
    zone: str
    totals: Totals
    currency: str
    measured: bool  # energy from telemetry, not the model
    fallback: bool  # the zone had no recorded intensity or price: conservative fallback


def account(
    usages: Sequence[Usage],
    fleet: Snapshot,
    recorded: GridSignals,
    energy: EnergyModel,
    *,
    currency: str = "USD",
) -> list[UsageAccount]:
    """kWh, gCO2eq and cost of each usage. ``fleet`` is any snapshot of the nodes
    (only its node columns are read)."""
    if not usages:
        return []
    table = fleet.nodes
    nodes = _node_rows(usages, fleet)
    start = np.array([u.start_s for u in usages])
    end = np.array([u.end_s for u in usages])
    kwh = modelled_kwh(usages, fleet, energy)
    measured = np.array([u.measured_energy_j is not None for u in usages])
    if measured.any():
        joules = np.array([u.measured_energy_j or 0.0 for u in usages])
        kwh = np.where(measured, joules / J_PER_KWH * energy.pue, kwh)
    carbon = window_means(recorded, fleet, nodes, start, end, "carbon")
    price = window_means(recorded, fleet, nodes, start, end, "price", currency=currency)
    gco2 = kwh * carbon.values
    # A price nobody knows (no zone of the grid has one, nor the static table) stays
    # NaN, never 0: a free hour would flatter the policy. It is flagged like any other
    # fallback, and reports show the cost as unknown.
    cost = kwh * price.values / 1000.0
    unknown = ~np.isfinite(carbon.values) | ~np.isfinite(price.values)
    zones = table.zones
    return [
        UsageAccount(
            usage=usage,
            zone=zones[int(table.zone_code[nodes[i]])],
            totals=Totals(float(kwh[i]), float(gco2[i]), float(cost[i])),
            currency=currency,
            measured=bool(measured[i]),
            fallback=bool(carbon.fallback[i] or price.fallback[i] or unknown[i]),
        )
        for i, usage in enumerate(usages)
    ]


def _node_rows(usages: Sequence[Usage], fleet: Snapshot) -> IntArray:
    try:
        return np.array([fleet.nodes.index[u.node_id] for u in usages], dtype=np.int64)
    except KeyError as error:
        raise ValueError(f"usage on unknown node {error.args[0]!r}") from None


def modelled_kwh(usages: Sequence[Usage], fleet: Snapshot, energy: EnergyModel) -> FloatArray:
    """The energy model's kWh of each usage (measured energy ignored), at the power of
    the pool it held."""
    nodes = _node_rows(usages, fleet)
    span_s = np.array([u.end_s - u.start_s for u in usages], dtype=np.float64)
    table = fleet.nodes
    columns = np.array(
        [
            table.column_of(int(node), u.accelerator_kind, u.accelerator_model)
            for u, node in zip(usages, nodes.tolist(), strict=True)
        ],
        dtype=np.int64,
    )
    kwh = np.zeros(len(usages))
    for column in np.unique(columns).tolist():
        rows = np.flatnonzero(columns == column)
        held = [usages[i] for i in rows.tolist()]
        power_w = energy.member_power_w(
            fleet,
            table.kinds[column].kind,
            nodes[rows],
            np.array([u.accelerators for u in held]),
            np.array([u.utilisation for u in held]),
            column=column,
            power_limit_w=np.array(
                [np.nan if u.power_limit_w is None else u.power_limit_w for u in held]
            ),
        )
        kwh[rows] = power_w * span_s[rows] / J_PER_KWH
    return kwh


def total(accounts: Iterable[UsageAccount]) -> Totals:
    result = Totals()
    for item in accounts:
        result = result + item.totals
    return result


def by_work(accounts: Iterable[UsageAccount]) -> dict[str, Totals]:
    result: dict[str, Totals] = {}
    for item in accounts:
        result[item.usage.work_id] = result.get(item.usage.work_id, Totals()) + item.totals
    return result


def by_tenant(accounts: Iterable[UsageAccount]) -> dict[str, Totals]:
    result: dict[str, Totals] = {}
    for item in accounts:
        result[item.usage.tenant] = result.get(item.usage.tenant, Totals()) + item.totals
    return result


# -- the carbon-agnostic counterfactual ---------------------------------------------


@dataclass(frozen=True, slots=True)
class CounterfactualMember:
    node_id: str
    accelerator_kind: AcceleratorKind
    accelerators: int
    runtime_s: float | None  # None: long-running (a replica)
    accelerator_model: str = ""  # its pool's (``Usage.accelerator_model``)


@dataclass(frozen=True, slots=True)
class Counterfactual:
    """Where and when the baseline would have run the work, decided at submission."""

    work_id: str
    tenant: str
    start_s: float
    members: tuple[CounterfactualMember, ...]


def counterfactual(snapshot: Snapshot, work: Work, baseline: Policy) -> Counterfactual | None:
    """The baseline's choice for ``work`` on ``snapshot``, the cluster as it was at
    submission with the work already queued ahead of it (added if not there): placed
    now, or at its reservation's start. None when the baseline would not have run it
    then nor reserved for it (no node, or queued behind other reservations)."""
    return counterfactuals(snapshot, (work,), baseline)[work.work_id]


def counterfactuals(
    snapshot: Snapshot, works: Sequence[Work], baseline: Policy
) -> dict[str, Counterfactual | None]:
    """``counterfactual`` of several works decided together on one cluster state (the
    control plane's pass that placed them): one baseline plan, in which they compete
    for capacity as they would have under the baseline."""
    queued = {w.work_id: w for w in snapshot.queue}
    queued.update((w.work_id, w) for w in works)
    # Only as far down the baseline's queue as the last of them: what comes after in its
    # order cannot change their decisions.
    plan = Scheduler(
        dataclasses.replace(snapshot, queue=tuple(queued[k] for k in sorted(queued))), baseline
    ).run_until([w.work_id for w in works])
    return {work.work_id: _choice(snapshot, plan, work) for work in works}


def _choice(snapshot: Snapshot, plan: Plan, work: Work) -> Counterfactual | None:
    placements = plan.placements_for(work.work_id)
    if placements:
        return Counterfactual(
            work_id=work.work_id,
            tenant=work.tenant,
            start_s=snapshot.now,
            members=tuple(
                CounterfactualMember(
                    node_id=p.node_id,
                    accelerator_kind=p.accelerator_kind,
                    accelerators=p.accelerators,
                    runtime_s=None if p.expected_end is None else p.expected_end - p.start_at,
                    accelerator_model=p.accelerator_model,
                )
                for p in placements
            ),
        )
    pending = plan.pending_for(work.work_id)
    reservation = pending.reservation if pending is not None else None
    if reservation is None or not isinstance(work, TrainingJob):
        return None
    per_member = work.accelerators_per_worker
    kind = reservation.accelerator_kind
    speeds = snapshot.nodes.kind(kind).relative_speed
    members: list[CounterfactualMember] = []
    for node_id, amount in zip(reservation.nodes, reservation.accelerators, strict=True):
        runtime = work.duration_s / float(speeds[snapshot.nodes.index[node_id]])
        members.extend(
            CounterfactualMember(node_id, kind, per_member, runtime)
            for _ in range(amount // per_member)
        )
    return Counterfactual(work.work_id, work.tenant, reservation.start_at, tuple(members))


def counterfactual_usages(
    choice: Counterfactual,
    work: Work,
    energy: EnergyModel,
    *,
    end_s: float | None = None,
    utilisation: float | Mapping[str, float] | None = None,
) -> list[Usage]:
    """The usage the baseline's choice implies. A gang runs until its slowest member
    ends; long-running members until ``end_s``. ``utilisation`` (one value or per
    node) defaults to the energy model's training utilisation."""
    runtimes = [m.runtime_s for m in choice.members if m.runtime_s is not None]
    gang_end = choice.start_s + max(runtimes) if runtimes else None
    usages = []
    for number, member in enumerate(choice.members):
        stop = gang_end if member.runtime_s is not None else end_s
        if stop is None:
            raise ValueError(f"{choice.work_id}: long-running work needs end_s")
        if isinstance(utilisation, Mapping):
            busy = utilisation[member.node_id]
        elif utilisation is not None:
            busy = utilisation
        elif isinstance(work, InferenceDeployment):
            busy = energy.inference_utilisation
        else:
            busy = energy.training_utilisation
        usages.append(
            Usage(
                allocation_id=f"{choice.work_id}/counterfactual-{number}",
                work_id=choice.work_id,
                tenant=choice.tenant,
                node_id=member.node_id,
                accelerator_kind=member.accelerator_kind,
                accelerators=member.accelerators,
                start_s=choice.start_s,
                end_s=max(stop, choice.start_s),
                utilisation=busy,
                accelerator_model=member.accelerator_model,
            )
        )
    return usages
