"""Who runs what, for ingestion: which node holds which training attempt and which
deployment replica, as the store last said.

Ingestion is synchronous and must not query the database per message, so it reads
this in-memory index. The scheduling loop replaces it after every committed pass (it
has the allocations in hand: the index is current before any `desired` document that
names new work goes out), and `refresh_forever` reloads it from the store every few
seconds, so that API replicas that do not lead agree.

Ended assignments linger for `linger_s`: an agent still ships the last output of a
worker the cloud has just withdrawn (finished, preempted, moved), and still reports
its outcome until it applies the next document.

`HeldForConfirmation` is where a message that names an assignment the index does not
know (yet) waits a few seconds for the next update: a log chunk or a `reported` entry of
work placed by another replica's pass, say. It is refused only at an update, so never by
an index that has not been reloaded since the message came. Bounded per node and in all.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

import structlog

from cloud.store import AllocationRecord, Store, StoreSnapshot, StoreUnavailableError

AssignmentKind = Literal["training", "replica"]
# (kind, node id, work id, attempt for training | replica number for a deployment)
AssignmentKey = tuple[AssignmentKind, str, str, int]


class Assignment(StrEnum):
    """What the index says of (node, work, attempt or replica)."""

    ASSIGNED = "assigned"
    WRONG_ATTEMPT = "wrong_attempt"  # the work is on that node, but not this attempt/replica
    NOT_ASSIGNED = "not_assigned"  # the work is not on that node (or does not exist)


def assignment_keys(
    attempts: Mapping[str, int], allocations: Iterable[AllocationRecord]
) -> set[AssignmentKey]:
    """Every assignment: a gang's workers by (node, job, attempt), a deployment's
    replicas by (node, deployment, replica number). `attempts`: by work id."""
    keys: set[AssignmentKey] = set()
    for allocation in allocations:
        if allocation.work_kind == "training":
            attempt = attempts.get(allocation.work_id)
            if attempt is not None:
                keys.add(("training", allocation.node_id, allocation.work_id, attempt))
        else:
            keys.add(("replica", allocation.node_id, allocation.work_id, allocation.member_index))
    return keys


# How long an ended assignment still counts (its node may still ship its last output
# and samples): the default of `AssignmentIndex(linger_s=)`.
LINGER_S: Final = 300.0


class AssignmentIndex:
    def __init__(
        self, *, linger_s: float = LINGER_S, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._linger_s = linger_s
        self._monotonic = monotonic
        self._current: set[AssignmentKey] = set()
        self._ended: dict[AssignmentKey, float] = {}  # key -> when it left (monotonic)
        self._work_on_node: set[tuple[AssignmentKind, str, str]] = set()
        self.loaded = False  # replaced at least once
        self.updated_monotonic = float("-inf")
        # Called (with nothing) after every update, changed or not. Must not raise.
        self.listeners: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._current) + len(self._ended)

    @property
    def monotonic(self) -> Callable[[], float]:
        """The clock lingering (and holding, `HeldForConfirmation`) is measured on."""
        return self._monotonic

    @property
    def current(self) -> frozenset[AssignmentKey]:
        """The assignments of the latest update (not those lingering)."""
        return frozenset(self._current)

    def replace_from(self, snapshot: StoreSnapshot) -> None:
        attempts = {record.work_id: record.attempts for record in snapshot.work}
        self.replace(assignment_keys(attempts, snapshot.allocations))

    def replace(self, keys: Iterable[AssignmentKey]) -> None:
        """The store's complete set of assignments now."""
        now = self._monotonic()
        current = set(keys)
        for key in self._current - current:
            self._ended[key] = now
        for key in current:
            self._ended.pop(key, None)
        self._ended = {
            key: ended for key, ended in self._ended.items() if now - ended < self._linger_s
        }
        self._current = current
        self._work_on_node = {
            (kind, node, work) for kind, node, work, _ in (*current, *self._ended)
        }
        self.loaded = True
        self.updated_monotonic = now
        for listener in self.listeners:
            listener()

    def holds(self, kind: AssignmentKind, node_id: str, work_id: str) -> bool:
        """Whether the node has (or had, within `linger_s`) some of the work."""
        return (kind, node_id, work_id) in self._work_on_node

    def assignment(self, key: AssignmentKey) -> Assignment:
        if key in self._current or key in self._ended:
            return Assignment.ASSIGNED
        kind, node_id, work_id, _ = key
        if (kind, node_id, work_id) in self._work_on_node:
            return Assignment.WRONG_ATTEMPT
        return Assignment.NOT_ASSIGNED


async def refresh_forever(
    index: AssignmentIndex,
    store: Store,
    *,
    interval_s: float = 2.0,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Reload `index` from the store every `interval_s` (skipped while the scheduling
    loop keeps it fresher). A store that is away is retried at the next tick."""
    log = structlog.get_logger("greenfed.assignments")
    while True:
        if monotonic() - index.updated_monotonic >= interval_s:
            try:
                # The allocations alone: a snapshot would read every queued item too.
                placed, attempts = await store.placed_attempts()
            except StoreUnavailableError as error:
                log.warning("assignments not refreshed: store unavailable", error=str(error))
            else:
                index.replace(assignment_keys(attempts, placed))
        await asyncio.sleep(interval_s)


@dataclass(slots=True)
class _Held:
    key: AssignmentKey
    until: float  # monotonic
    confirmed: Callable[[], None]
    refused: Callable[[Assignment], None]


class HeldForConfirmation:
    """Messages that name an assignment the index does not know yet, waiting for an
    update that confirms it (then `confirmed` runs, in arrival order) or for `hold_s` to
    pass (then `refused` runs at the index's next update, with its verdict: a replica
    that does not lead reloads the index only every few seconds, and until it has, its
    "no" may only mean "not yet"). Full: refused at once."""

    def __init__(
        self,
        index: AssignmentIndex,
        *,
        hold_s: float = 5.0,
        max_per_node: int = 32,
        max_total: int = 2048,
    ) -> None:
        self._index = index
        self._hold_s = hold_s
        self._max_per_node = max_per_node
        self._max_total = max_total
        self._monotonic = index.monotonic
        self._held: dict[str, deque[_Held]] = {}  # by node id, oldest first
        self._total = 0
        index.listeners.append(self.recheck)

    def __len__(self) -> int:
        return self._total

    def offer(
        self,
        key: AssignmentKey,
        confirmed: Callable[[], None],
        refused: Callable[[Assignment], None],
    ) -> None:
        """Run `confirmed` now if the index knows `key`, else hold it. Nothing held is
        settled here: the index changes only by an update, which settles everything held
        (so what waited for the same key has gone first), and a message held too long is
        refused only by an update's verdict."""
        verdict = self._index.assignment(key)
        if verdict is Assignment.ASSIGNED:
            confirmed()
            return
        node_id = key[1]
        queue = self._held.setdefault(node_id, deque())
        if len(queue) >= self._max_per_node or self._total >= self._max_total:
            if not queue:
                del self._held[node_id]
            refused(verdict)
            return
        queue.append(_Held(key, self._monotonic() + self._hold_s, confirmed, refused))
        self._total += 1

    def recheck(self) -> None:
        """The index changed (or was refreshed): settle everything held."""
        for node_id in list(self._held):
            self._settle(node_id)

    def _settle(self, node_id: str) -> None:
        """Release a node's held messages the index now knows, in arrival order (all of
        one key share a verdict, so one stream's chunks keep their order), and refuse
        those held too long."""
        queue = self._held.get(node_id)
        if queue is None:
            return
        now = self._monotonic()
        waiting: deque[_Held] = deque()
        for held in queue:
            verdict = self._index.assignment(held.key)
            if verdict is Assignment.ASSIGNED:
                held.confirmed()
            elif now >= held.until:
                held.refused(verdict)
            else:
                waiting.append(held)
        self._total -= len(queue) - len(waiting)
        if waiting:
            self._held[node_id] = waiting
        else:
            del self._held[node_id]
