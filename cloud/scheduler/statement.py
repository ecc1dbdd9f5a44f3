"""A tentative plan that commits or is discarded as one unit (Volcano's Statement).

Gang members and preemption victims are applied to the working state one by one,
so later members see earlier ones; if any member cannot be placed the statement
is discarded and the state is exactly what it was before. A ``mark`` taken before
one member lets that member alone (its allocation and its victims) be rolled back
while the members before it stay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Held
from .plan import PreemptionReason
from .state import ClusterState


@dataclass(frozen=True, slots=True)
class TentativeEviction:
    allocation: Held
    node: int
    reason: PreemptionReason


@dataclass(slots=True)
class Statement:
    state: ClusterState
    allocated: list[tuple[Held, int]] = field(default_factory=list)
    evicted: list[TentativeEviction] = field(default_factory=list)
    _undo: list[tuple[bool, Held, int]] = field(default_factory=list)

    def allocate(self, alloc: Held, node: int) -> None:
        self.state.allocate(alloc, node)
        self.allocated.append((alloc, node))
        self._undo.append((True, alloc, node))

    def evict(self, allocation_id: str, reason: PreemptionReason) -> None:
        alloc, node = self.state.evict(allocation_id)
        self.evicted.append(TentativeEviction(alloc, node, reason))
        self._undo.append((False, alloc, node))

    def restate(self, alloc: Held, node: int) -> None:
        """Replace this statement's allocation of ``alloc``'s id with ``alloc``: the same
        member on the same node, with other facts (a gang's end, known once every member
        is placed). The state and the undo log are as if it had been allocated so."""
        index = next(
            (
                i
                for i, (was_allocation, held, _) in enumerate(self._undo)
                if was_allocation and held.allocation_id == alloc.allocation_id
            ),
            None,
        )
        if index is None:
            raise KeyError(alloc.allocation_id)
        self.state.evict(alloc.allocation_id)
        self.state.allocate(alloc, node)
        self._undo[index] = (True, alloc, node)
        self.allocated = [
            (alloc, node) if held.allocation_id == alloc.allocation_id else (held, where)
            for held, where in self.allocated
        ]

    def mark(self) -> int:
        """A savepoint: ``rollback_to`` it undoes only what was applied after it."""
        return len(self._undo)

    def rollback_to(self, mark: int) -> None:
        """Undo the changes made since ``mark``, newest first."""
        while len(self._undo) > mark:
            was_allocation, alloc, node = self._undo.pop()
            if was_allocation:
                self.state.evict(alloc.allocation_id)
                self.allocated.pop()
            else:
                self.state.allocate(alloc, node, new=False)
                self.evicted.pop()

    def discard(self) -> None:
        """Undo everything, newest first. Idempotent."""
        self.rollback_to(0)

    def commit(self) -> None:
        """Keep the changes; the statement can no longer undo them. Idempotent."""
        self._undo.clear()
