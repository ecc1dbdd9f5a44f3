"""Disruption budgets: how many of a deployment's replicas preemption may take.

A deployment's `min_available` (a Kubernetes PodDisruptionBudget's minAvailable) is
the number of replicas that must keep serving through voluntary disruptions. The core
evicts only by preemption (tidal sharing included: inference yields GPUs to training
and takes them back through it), so this is where the budget is kept there: a replica
may be chosen as a victim only while its deployment, once every replica already
evicted or chosen beside it is gone, keeps at least `min_available` replicas.
Draining and rollouts keep the same budget in the loop (cloud/loop/drain.py,
cloud/loop/desired.py `canary_members`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .model import Held
from .state import ClusterState

NONE_TAKEN: Mapping[str, int] = {}


class DisruptionBudget:
    """The budgets of the deployments running in one pass's state, read on first use
    (most passes preempt nothing)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._floors: dict[str, int] | None = None

    def _floor(self, work_id: str) -> int:
        if self._floors is None:
            self._floors = {
                alloc.work_id: alloc.min_available
                for alloc in self._state.snapshot.allocations
                if alloc.min_available > 0
            }
        return self._floors.get(work_id, 0)

    def allows(self, alloc: Held, taken: Mapping[str, int] = NONE_TAKEN) -> bool:
        """Whether evicting `alloc` keeps its deployment within its budget, beside
        `taken` (work id -> its replicas already chosen as victims, not yet evicted)."""
        floor = self._floor(alloc.work_id)
        if not floor:
            return True
        held = len(self._state.work_allocs.get(alloc.work_id, {}))
        return held - taken.get(alloc.work_id, 0) - 1 >= floor
