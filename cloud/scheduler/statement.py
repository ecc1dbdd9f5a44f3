"""A tentative plan that commits or is discarded as one unit (Volcano's Statement).

Gang members and preemption victims are applied to the working state one by one,
so later members see earlier ones; if any member cannot be placed the statement
is discarded and the state is exactly what it was before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .model import Held
from .state import ClusterState


@dataclass(frozen=True, slots=True)
class Eviction:
    allocation: Held
    node: int
    reason: Literal["priority", "reclaim", "quota"]


@dataclass(slots=True)
class Statement:
    state: ClusterState
    allocated: list[tuple[Held, int]] = field(default_factory=list)
    evicted: list[Eviction] = field(default_factory=list)
    _undo: list[tuple[bool, Held, int]] = field(default_factory=list)

    def allocate(self, alloc: Held, node: int) -> None:
        self.state.allocate(alloc, node)
        self.allocated.append((alloc, node))
        self._undo.append((True, alloc, node))

    def evict(self, allocation_id: str, reason: Literal["priority", "reclaim", "quota"]) -> None:
        alloc, node = self.state.evict(allocation_id)
        self.evicted.append(Eviction(alloc, node, reason))
        self._undo.append((False, alloc, node))

    def discard(self) -> None:
        """Undo everything, newest first. Idempotent."""
        for was_allocation, alloc, node in reversed(self._undo):
            if was_allocation:
                self.state.evict(alloc.allocation_id)
            else:
                self.state.allocate(alloc, node, new=False)
        self._undo.clear()
        self.allocated.clear()
        self.evicted.clear()

    def commit(self) -> None:
        """Keep the changes; the statement can no longer undo them. Idempotent."""
        self._undo.clear()
