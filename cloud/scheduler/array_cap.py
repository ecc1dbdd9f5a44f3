"""A job array's throttle inside one pass: at most N of its tasks placed at once.

The scheduling loop keeps an array whose throttle is reached out of the queue
(cloud/work/array_throttle.py). An array with room for some tasks but more of them
ready offers the core every ready task and this cap: the core decides them in queue
order (lowest index first among equals) and places at most ``throttle - len(placed)``
of them. A task that cannot be placed (its start window is closed, no node fits it, its
start is deferred) takes no slot, so it holds back none of its siblings. A task decided
once the cap is used up waits (code ``quota``, as a tenant's ``max_running``) and
nothing is evicted for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ArrayCap:
    """One throttled job array, as the pass starts."""

    array_id: str
    throttle: int  # at most this many of its tasks placed (scheduled or running) at once
    placed: tuple[int, ...]  # the indices of its tasks placed now, ascending
    tasks: Mapping[str, int]  # its queued tasks: work id -> index, by work id

    @property
    def slots(self) -> int:
        """How many more of its tasks this pass may place."""
        return max(0, self.throttle - len(self.placed))


class ArrayCapBook:
    """The tasks of each capped array that this pass has placed so far."""

    def __init__(self, caps: Mapping[str, ArrayCap]) -> None:
        self._cap_of = {work_id: cap for cap in caps.values() for work_id in cap.tasks}
        self._placed_now: dict[str, list[int]] = {}  # array id -> indices placed

    def full(self, work_id: str) -> ArrayCap | None:
        """The cap of `work_id`'s array where this pass may place no more of its tasks;
        None: it is no task of a capped array, or its array has a slot left."""
        cap = self._cap_of.get(work_id)
        if cap is None or len(self._placed_now.get(cap.array_id, ())) < cap.slots:
            return None
        return cap

    def placed(self, cap: ArrayCap) -> tuple[int, ...]:
        """The indices of `cap`'s tasks placed, those placed in this pass included."""
        return tuple(sorted((*cap.placed, *self._placed_now.get(cap.array_id, ()))))

    def note_placed(self, work_id: str) -> None:
        cap = self._cap_of.get(work_id)
        if cap is not None:
            self._placed_now.setdefault(cap.array_id, []).append(cap.tasks[work_id])
