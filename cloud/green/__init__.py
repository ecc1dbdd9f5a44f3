"""Green scheduling: energy, carbon, price and latency terms, policies, temporal
shifting and accounting, built on the scheduler core's hooks.

=================  ==========================================================
energy.py          kWh of a job (or kW of a replica) on each candidate node
window.py          mean intensity / price over a run window; unknown-zone fallback
latency.py         ServingLatency: network RTT + compute (+ queueing) per node
terms.py           CarbonTerm, PriceTerm, LatencyTerm (ScoreTerm hook)
shifting.py        best_window and WindowShifter (StartAdvisor hook)
waiting.py         CapacityWaiter: hold a job for clean capacity that frees soon
migration.py       Migrator: running, checkpointing training to cleaner capacity
power_capping.py   PowerCapper: which new training runs under a lower GPU power limit
pass_rule.py       schedule_then_move: schedule, then move unless the pass preempted
policies.py        named policies (green, cost, latency, balanced, baselines)
accounting.py      kWh, gCO2eq, cost per allocation, job, tenant; counterfactual
=================  ==========================================================

Guide: docs/green.md.
"""

from .accounting import (
    Counterfactual,
    Totals,
    Usage,
    UsageAccount,
    account,
    by_tenant,
    by_work,
    counterfactual,
    counterfactual_usages,
    total,
)
from .energy import EnergyModel, linear_power_w
from .latency import ServingLatency, default_latency_estimator
from .migration import JobMove, Migrator, RunningJob
from .policies import (
    POLICIES,
    POLICY_NAMES,
    GreenInputs,
    PolicySpec,
    build_migrator,
    build_policy,
    build_power_capper,
    policy_spec,
)
from .power_capping import PowerCapper
from .shifting import Window, WindowShifter, best_window, candidate_starts
from .terms import CarbonTerm, LatencyTerm, PriceTerm
from .window import WindowMeans, window_means

__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "CarbonTerm",
    "Counterfactual",
    "EnergyModel",
    "GreenInputs",
    "JobMove",
    "LatencyTerm",
    "Migrator",
    "PolicySpec",
    "PowerCapper",
    "PriceTerm",
    "RunningJob",
    "ServingLatency",
    "Totals",
    "Usage",
    "UsageAccount",
    "Window",
    "WindowMeans",
    "WindowShifter",
    "account",
    "best_window",
    "build_migrator",
    "build_policy",
    "build_power_capper",
    "by_tenant",
    "by_work",
    "candidate_starts",
    "counterfactual",
    "counterfactual_usages",
    "default_latency_estimator",
    "linear_power_w",
    "policy_spec",
    "total",
    "window_means",
]
