"""The carbon-agnostic counterfactual of work the control plane places (pure).

When a pass places work for the first time, `cloud.green.accounting.counterfactuals`
asks what `fifo-binpack` would have chosen on the same cluster state for the same
work, the way `greenfed eval` does at submission. What is kept is the baseline's
energy per zone for each kWh the work itself uses (both from the energy model, so
that a slower or less efficient baseline node counts), so that the live accounting
can price the counterfactual on the recorded intensities of its zones over the
work's real run, with the work's measured energy.

Deliberately not counted: time. The baseline is evaluated over the same hours as
the real run, so emissions avoided by waiting for a cleaner hour (a deferred start)
show in `greenfed eval`, not here.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloud.green.accounting import Usage, counterfactual_usages, counterfactuals, modelled_kwh
from cloud.green.energy import EnergyModel
from cloud.scheduler import InferenceDeployment, Plan, Policy, Snapshot, Work
from cloud.store import CounterfactualRecord

BASELINE = "fifo-binpack"
_LONG_RUNNING_S = 3600.0  # a replica's energy per hour: the ratio is what matters


def _busy(work: Work, energy: EnergyModel) -> float:
    if isinstance(work, InferenceDeployment):
        return energy.inference_utilisation
    return energy.training_utilisation


def _actual_usages(work: Work, plan: Plan, energy: EnergyModel, now: float) -> list[Usage]:
    usages = []
    for placement in plan.placements_for(work.work_id):
        runtime_s = (
            placement.expected_end - placement.start_at
            if placement.expected_end is not None
            else _LONG_RUNNING_S
        )
        usages.append(
            Usage(
                allocation_id=placement.allocation_id,
                work_id=work.work_id,
                tenant=work.tenant,
                node_id=placement.node_id,
                accelerator_kind=placement.accelerator_kind,
                accelerators=placement.accelerators,
                start_s=now,
                end_s=now + max(0.0, runtime_s),
                utilisation=_busy(work, energy),
                power_limit_w=placement.power_limit_w,  # a capped run: longer, less power
                accelerator_model=placement.accelerator_model,  # a MIG slice's own power
            )
        )
    return usages


def live_counterfactuals(
    snapshot: Snapshot,
    works: Sequence[tuple[Work, str]],
    plan: Plan,
    baseline: Policy,
    energy: EnergyModel,
) -> list[CounterfactualRecord]:
    """The counterfactual of each (work, tenant id) that `plan` placed on `snapshot`."""
    if not works:
        return []
    choices = counterfactuals(snapshot, [work for work, _ in works], baseline)
    records = []
    for work, tenant_id in works:
        actual = _actual_usages(work, plan, energy, snapshot.now)
        choice = choices[work.work_id]
        factors: dict[str, float] | None = None
        actual_kwh = float(modelled_kwh(actual, snapshot, energy).sum()) if actual else 0.0
        if choice is not None and actual_kwh > 0:
            baseline_usages = counterfactual_usages(
                choice, work, energy, end_s=choice.start_s + _LONG_RUNNING_S
            )
            kwh = modelled_kwh(baseline_usages, snapshot, energy)
            zones = snapshot.nodes.zones
            factors = {}
            for usage, usage_kwh in zip(baseline_usages, kwh.tolist(), strict=True):
                zone = zones[int(snapshot.nodes.zone_code[snapshot.nodes.index[usage.node_id]])]
                factors[zone] = factors.get(zone, 0.0) + usage_kwh / actual_kwh
        records.append(
            CounterfactualRecord(
                work_id=work.work_id,
                tenant_id=tenant_id,
                decided_at=snapshot.now,
                baseline=BASELINE,
                zone_factors=factors,
            )
        )
    return records
