"""Carbon-aware power capping: which training the pass starts runs its GPUs under a
lower power limit, and how low.

A GPU held below its default power limit trains slower but, down to a point, for
less energy: its draw falls faster than its pace (the published power-limit sweeps
behind ``shared.accelerators.POWER_CAP_THROUGHPUT``). So a cap trades time for
energy, and whether the trade is worth it depends on where the job runs:

* **energy**: for each share ``s`` of the devices' default limit, a member draws
  ``EnergyModel.member_power_w`` with each device capped at ``s · max_power_w`` (host
  share unchanged) for ``run_s / capped_throughput(s)``; priced at its zone's
  forecast mean over that longer window (gCO2eq, or the currency with ``price``);
* **time**: a GPU held longer is a GPU other work cannot use. Holding the *margin*
  longer costs nothing more: displaced work would have gone there anyway. Holding a
  cleaner GPU longer pushes work from it to the margin, so each extra second costs
  the uncapped draw times ``max(0, margin − the node's signal)``. The margin is the
  dirtiest capacity training holds this hour, and at least the capacity-weighted
  mean of the fleet's training GPUs (more work arrives during a run, and on average
  it lands there).

The share with the lowest energy-plus-time cost wins when it saves at least
``min_saving`` of the uncapped cost (of its size, where prices below zero make it
negative). A gang gets one share for all its members (it
runs at its slowest member's pace). A cap is never chosen where the longer run would
miss the job's deadline (less ``safety_margin_s``) or run into a reservation held on
one of its nodes (backfill promised to end before it), nor below a device's lowest
allowed limit (``shared.accelerators.lowest_power_share``), nor on MIG slices (NVML
limits power per physical GPU: a slice's cap would hold its sibling slices, other
tenants' work among them, too; a gang with a member on slices runs uncapped whole);
and nothing is capped in a pass that leaves a job with a deadline or a latest start
waiting for capacity (capped runs hold GPUs longer, and a 14-day evaluation showed
one such job start past its latest start because of it, where the baseline missed
nothing).

So the cleanest capacity, which work competes for, is rarely capped, and the dirty
overflow almost always is. Only new placements are capped: a moved or
resumed job is decided again where it lands.

Pure: snapshot and plan in, the plan with capped placements (``power_limit_w`` set,
``expected_end`` stretched) out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cloud.scheduler import Placement, Plan, Snapshot, TrainingJob
from cloud.scheduler.arrays import FloatArray
from cloud.signals.grid import GridSignals
from shared.accelerators import (
    POWER_CAP_THROUGHPUT,
    capped_throughput,
    lowest_power_share,
)
from shared.mig_profiles import mig_profile_of

from .energy import J_PER_KWH, EnergyModel
from .shifting import Objective
from .window import GridWindows, Quantity, window_means

HOUR_S = 3600.0
# The shares policies choose from. 0.5 saves barely more energy than 0.6 on the
# curve but runs about twice as much slower, which lengthens everyone's waits (a
# 14-day eval on 2023-06-01: 44.3 % CO2 cut at 1.05x the baseline's wait with these,
# 43.4 % at 1.29x with 0.5 too).
DEFAULT_POWER_SHARES: tuple[float, ...] = (0.6, 0.7, 0.8)
# Every capped point of the curve: the offline optimum may use any of them.
ALL_POWER_SHARES: tuple[float, ...] = tuple(
    share for share, _ in POWER_CAP_THROUGHPUT if share < 1.0
)


@dataclass(frozen=True, slots=True)
class _Member:
    placement: Placement
    row: int  # snapshot node index
    column: int  # pool column
    max_power_w: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerCapper:
    signals: GridSignals
    energy: EnergyModel = field(default_factory=EnergyModel)
    objective: Objective = "carbon"
    shares: tuple[float, ...] = DEFAULT_POWER_SHARES
    min_saving: float = 0.03  # of the uncapped cost, or no cap
    safety_margin_s: float = 3600.0  # a capped run still ends this long before the deadline
    currency: str = "USD"
    _grid: GridWindows = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_grid", GridWindows(self.signals))
        if not all(0.0 < share < 1.0 for share in self.shares):
            raise ValueError("power capping shares must be within (0, 1)")
        if not 0.0 <= self.min_saving < 1.0:
            raise ValueError("min_saving must be within [0, 1)")
        if not self.safety_margin_s >= 0:
            raise ValueError("safety_margin_s must be >= 0")

    def cap(self, snapshot: Snapshot, plan: Plan) -> Plan:
        """``plan`` with each new GPU training placement capped where it pays."""
        jobs = {work.work_id: work for work in snapshot.queue if isinstance(work, TrainingJob)}
        gangs: dict[str, list[Placement]] = {}
        for placement in plan.placements:
            if (
                placement.work_kind == "training"
                and placement.accelerator_kind == "gpu"
                and placement.work_id in jobs
                and placement.expected_end is not None
            ):
                gangs.setdefault(placement.work_id, []).append(placement)
        if not gangs or self._deadline_work_waits(plan, jobs):
            return plan
        margin = self._margin(snapshot, plan)
        capped: dict[str, Placement] = {}
        for work_id, placements in gangs.items():
            for placement in self._cap_gang(snapshot, plan, jobs[work_id], placements, margin):
                capped[placement.allocation_id] = placement
        if not capped:
            return plan
        return dataclasses.replace(
            plan,
            placements=tuple(capped.get(p.allocation_id, p) for p in plan.placements),
        )

    @staticmethod
    def _deadline_work_waits(plan: Plan, jobs: dict[str, TrainingJob]) -> bool:
        """A job with a deadline or a latest start waits for capacity in this pass. A
        capped run holds its GPUs longer, and such a job pays for that in missed
        deadlines, which no energy saved is worth: nothing is capped then."""
        for pending in plan.pending:
            if pending.code in ("capacity", "reserved"):
                job = jobs.get(pending.work_id)
                if job is not None and job.flexible:
                    return True
        return False

    # -- the pass's margin ------------------------------------------------------------

    def _margin(self, snapshot: Snapshot, plan: Plan) -> float:
        """The signal of the dirtiest GPU capacity training holds this hour, placements
        of this pass included, and at least the capacity-weighted mean of the fleet's
        training GPUs: over a run more work arrives, and on average it lands there
        (NaN: no signal at all)."""
        index = snapshot.nodes.index
        node_ids = {
            a.node_id
            for a in snapshot.allocations
            if a.work_kind == "training" and a.accelerator_kind == "gpu"
        }
        node_ids.update(
            p.node_id
            for p in plan.placements
            if p.work_kind == "training" and p.accelerator_kind == "gpu"
        )
        held = np.array(sorted(index[n] for n in node_ids if n in index), dtype=np.int64)
        table = snapshot.nodes
        capacity = table.kind_capacity("gpu").astype(np.float64) * table.runs_training
        fleet = np.flatnonzero(capacity > 0)
        levels = []
        held_now = self._hour_means(snapshot, held)
        if np.isfinite(held_now).any():
            levels.append(float(np.nanmax(held_now)))
        fleet_now = self._hour_means(snapshot, fleet)
        known = np.isfinite(fleet_now)
        if known.any():
            levels.append(float(np.average(fleet_now[known], weights=capacity[fleet][known])))
        return max(levels, default=float("nan"))

    def _hour_means(self, snapshot: Snapshot, rows: np.ndarray) -> FloatArray:
        now = np.full(rows.size, snapshot.now)
        return self._means(snapshot, rows, now, now + HOUR_S)

    def _means(
        self, snapshot: Snapshot, rows: np.ndarray, start: FloatArray, end: FloatArray
    ) -> FloatArray:
        quantity: Quantity = "carbon" if self.objective == "carbon" else "price"
        values = window_means(
            self._grid, snapshot, rows, start, end, quantity, currency=self.currency
        ).values
        result: FloatArray = values if self.objective == "carbon" else values / 1000.0
        return result  # per kWh: gCO2eq/kWh, or currency/kWh

    # -- one gang -----------------------------------------------------------------------

    def _cap_gang(
        self,
        snapshot: Snapshot,
        plan: Plan,
        job: TrainingJob,
        placements: Sequence[Placement],
        margin: float,
    ) -> list[Placement]:
        table = snapshot.nodes
        members: list[_Member] = []
        for placement in placements:
            row = table.index.get(placement.node_id)
            if row is None:
                return []
            column = table.column_of(row, "gpu", placement.accelerator_model)
            if mig_profile_of(table.model_at(column, row)) is not None:
                return []  # a slice has no power limit of its own: its GPU's holds them all
            max_power_w = float(table.kinds[column].max_power_w[row])
            if not max_power_w > 0:
                return []  # no power figure: nothing to cap against
            members.append(_Member(placement, row, column, max_power_w))
        start = min(p.start_at for p in placements)
        end = max(p.expected_end for p in placements if p.expected_end is not None)
        run_s = end - start
        if not run_s > 0:
            return []
        lowest = max(lowest_power_share(table.model_at(m.column, m.row)) for m in members)
        latest_end = (
            job.deadline - self.safety_margin_s if job.deadline is not None else float("inf")
        )
        member_nodes = {m.placement.node_id for m in members}
        reserved_from = min(
            (
                r.start_at
                for r in plan.reservations
                if r.work_id != job.work_id and member_nodes.intersection(r.nodes)
            ),
            default=float("inf"),
        )
        rows = np.array([m.row for m in members], dtype=np.int64)
        uncapped_w = self._member_power_w(snapshot, members, 1.0)
        best_share, best_cost, uncapped_cost = 1.0, float("nan"), float("nan")
        for share in (1.0, *sorted(s for s in self.shares if s >= lowest)):
            capped_run_s = run_s / capped_throughput(share)
            if share < 1.0 and start + capped_run_s > min(latest_end, reserved_from):
                continue
            power_w = uncapped_w if share == 1.0 else self._member_power_w(snapshot, members, share)
            signal = self._means(
                snapshot,
                rows,
                np.full(rows.size, start),
                np.full(rows.size, start + capped_run_s),
            )
            if not np.isfinite(signal).all():
                return []  # no basis to trade time for energy
            cost = float(np.sum(power_w * capped_run_s / J_PER_KWH * signal))
            if np.isfinite(margin):
                extra_kwh = uncapped_w * (capped_run_s - run_s) / J_PER_KWH
                cost += float(np.sum(extra_kwh * np.maximum(0.0, margin - signal)))
            if share == 1.0:
                uncapped_cost = best_cost = cost
            elif cost < best_cost:
                best_share, best_cost = share, cost
        # At least ``min_saving`` of the uncapped cost's size less: below zero (paid to
        # draw power) ``(1 − min_saving) · cost`` would lie above the cost itself.
        worth_capping = uncapped_cost - self.min_saving * abs(uncapped_cost)
        if best_share == 1.0 or not best_cost <= worth_capping:
            return []
        capped_end = start + run_s / capped_throughput(best_share)
        return [
            dataclasses.replace(
                m.placement,
                power_limit_w=round(best_share * m.max_power_w, 1),
                expected_end=capped_end,
            )
            for m in members
        ]

    def _member_power_w(
        self, snapshot: Snapshot, members: Sequence[_Member], share: float
    ) -> FloatArray:
        """Each member's draw at training utilisation, its devices held to ``share`` of
        their default limit (1.0: the default itself, uncapped)."""
        power = np.empty(len(members))
        for i, m in enumerate(members):
            power[i] = self.energy.member_power_w(
                snapshot,
                "gpu",
                np.array([m.row]),
                m.placement.accelerators,
                self.energy.training_utilisation,
                column=m.column,
                power_limit_w=None if share >= 1.0 else share * m.max_power_w,
            )[0]
        return power
